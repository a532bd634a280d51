"""`catchat doctor`: is everything catchat needs here, and does a shader compute the right thing?"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

import numpy as np

from catchat.errors import CatchatError
from catchat.vk.device import coop2_dimension_name


@dataclass
class Check:
    what: str
    ok: bool
    detail: str
    fix: str = ""


def run_smoke_kernel(dev, n: int = 1000, seed: int = 0, half: bool = False) -> float:
    """Run glsl/axpby.comp once on `dev` (its float16 variant with half) and return its max abs
    error against numpy."""
    from catchat.model.reference import axpby_reference
    from catchat.vk.kernels import Axpby, half_tensor, run_ops, unpack_half

    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    if half:
        x, y = x.astype(np.float16), y.astype(np.float16)
        tx, ty = half_tensor(dev, x), half_tensor(dev, y)
    else:
        tx, ty = dev.tensor(x), dev.tensor(y)
    (got,) = run_ops(dev, [tx, ty], [Axpby(dev, tx, ty, n, half=half)(1.5, -0.5, 0.25)], [ty])
    if half:
        got = unpack_half(got, n)
    want = axpby_reference(x, y, 1.5, -0.5, 0.25, dtype=x.dtype)
    return float(np.abs(got.astype(np.float64) - want).max())


def half_precision_check(dev, label: str) -> Check:
    """Which half-precision features the device was created with, and the float16 axpby against numpy
    where it has float16 arithmetic and storage."""
    names = {"shaderFloat16": "float16 arithmetic", "storageBuffer16BitAccess": "16-bit storage",
             "shaderInt8": "int8 arithmetic", "cooperativeMatrixNV": "cooperative matrices (NV)",
             "cooperativeMatrixKHR": "cooperative matrices (KHR)"}
    have = [v for k, v in names.items() if k in dev.features] or ["none"]
    if dev.coop_shapes:
        have.append(f"cooperative-matrix shapes {', '.join(dev.coop_shapes)}")
    from catchat.vk.kernels.gemm_tiles import tensor_core_extensions

    used = tensor_core_extensions(dev)
    if used:
        have.append(used)
    if "cooperativeMatrixWorkgroupScope" in dev.features:
        dims = ", ".join(coop2_dimension_name(d) for d in dev.coop2_dimensions) or "no dimensions"
        have.append(f"workgroup-scope cooperative matrices (NV 2: {dims})")
    if not getattr(dev.kp, "catchat_device_features", 0):
        return Check(f"{label} half precision", True, "not known: kp lacks patch 0005 (run `make setup`)")
    if not dev.runs_float16:
        return Check(f"{label} half precision", True, f"offers {', '.join(have)}: no float16 kernels here")
    from catchat.vk.kernels import Axpby

    err = run_smoke_kernel(dev, half=True)
    return Check(f"{label} half precision", err <= Axpby.HALF_ATOL,
                 f"{', '.join(have)}; float16 axpby max abs error {err:.1e}",
                 "this device's float16 arithmetic is wrong: update its driver")


def host_views_work(dev, n: int = 257) -> bool:
    """Round-trip data through a kp tensor's host view (some kp builds under numpy 2 return stride-0
    views; catchat.vk.device.host_view must fix them)."""
    from catchat.vk.device import host_view

    t = dev.tensor(n)
    want = np.arange(n, dtype=np.float32)
    host_view(t)[:] = want
    dev.upload([t])
    host_view(t)[:] = 0
    dev.sequence().eval(dev.kp.OpTensorSyncLocal([t]))
    return bool(np.array_equal(host_view(t), want))


def sweep_check(dev, label: str) -> Check:
    """How recurrent sweeps will run on `dev` (CATCHAT_PERSISTENT, the SM count, co-residency)."""
    from catchat.vk.kernels.gru import per_step_reason, persistent_override, resident_workgroups

    try:
        n = resident_workgroups(dev)
    except CatchatError as e:
        return Check(f"{label} sweeps", False, e.message, e.hint or "")
    info = dev.info
    if persistent_override() is not None:
        how = (f"one persistent dispatch per sweep, up to {n} workgroups (forced by CATCHAT_PERSISTENT: "
               "co-residency not checked; the barrier's timeout guard reports a failure)") if n else \
            "one dispatch per timestep (CATCHAT_PERSISTENT=0)"
        return Check(f"{label} sweeps", True, how)
    if not n:
        return Check(f"{label} sweeps", True, f"one dispatch per timestep: {per_step_reason(dev)}")
    warps = f"{info.warps_per_cu} warps per SM" if info.warps_per_cu else "warps per SM unknown"
    return Check(f"{label} sweeps", True,
                 f"one persistent dispatch per sweep, up to {n} workgroups (one per SM) where each sweep's dispatch "
                 f"is shown co-resident from the device's limits ({warps}, {info.max_shared_memory_bytes // 1024} KiB "
                 "shared memory, 64K registers per SM assumed), else one dispatch per timestep")


def environment_check() -> Check:
    """The CATCHAT_ variables set here: switches that make this process differ from the default, and
    names catchat never reads (a typo: the check fails, naming the nearest real one)."""
    from catchat import environment

    bad = environment.unknown_lines()
    if bad:
        return Check("environment", False, "; ".join(bad), "unset it, or spell it as docs/environment.md does")
    settings = environment.settings_text()
    return Check("environment", True, f"set: {settings} (unset them for the defaults)" if settings
                 else "no catchat variables set (the defaults)")


def checks() -> list[Check]:
    """Every check in order; later ones are skipped when what they need is missing."""
    from catchat.vk import device as vkdev
    from catchat.vk import probe, shaders

    out = []
    try:
        devices = probe.probe_devices()
        out.append(Check("vulkan devices", bool(devices), f"{len(devices)} found",
                         "apt-get install mesa-vulkan-drivers"))
    except CatchatError as e:
        return out + [Check("vulkan loader", False, e.message, e.hint or "")]
    try:
        kp = vkdev.import_kp()
        patched = all(getattr(kp, m, 0) for m in vkdev.KP_PATCH_MARKERS)
        out.append(Check("kp", patched, f"{importlib.metadata.version('kp')}"
                         + (" (catchat's patches applied)" if patched else " (UNPATCHED)"),
                         "run `make setup`: it builds kp with tools/kp-patches/ applied"))
    except CatchatError as e:
        return out + [Check("kp", False, e.message, e.hint or "")]
    try:
        out.append(Check("glslc", True, shaders.glslc_version()))
    except CatchatError as e:
        if not shaders.prebuilt_count():  # a wheel carries its SPIR-V: glslc is needed only for new variants
            return out + [Check("glslc", False, e.message, e.hint or "")]
        out.append(Check("glslc", True, f"not found; {shaders.prebuilt_count()} prebuilt shader variants installed"))
    out.append(environment_check())
    for info in devices:
        label = f"device {info.index}: {info.name}"
        try:
            dev = vkdev.open_device(info.index)
            if info.index == devices[0].index:
                out.append(Check("numpy + kp host views", host_views_work(dev), f"numpy {np.__version__}",
                                 "run `make setup`: its kp patch makes Tensor.data() a view under numpy 1 and 2"))
            err = run_smoke_kernel(dev)
            out.append(Check(label, err < 1e-5, f"{info.type}, {info.driver}; axpby max abs error {err:.1e}",
                             "this device computes wrong results: update its driver"))
            out.append(sweep_check(dev, label))
            out.append(half_precision_check(dev, label))
        except CatchatError as e:
            out.append(Check(label, False, e.message, e.hint or ""))
    return out
