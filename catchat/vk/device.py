"""The Vulkan device: one kp.Manager for the whole run, device choice, tensors and host views.

Rules from shared/notes/kompute.md that live here so no other module has to remember them:
- the Manager must outlive every tensor, algorithm and sequence it made (else: segfault);
- kp.Manager() aborts the process when there is no driver, so the loader is probed first;
- host views of tensors go through `host_view`, which is right under numpy 1 and 2;
- tensors are 32-bit sized and must fit maxStorageBufferRange: checked here, with the size asked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from catchat.errors import DeviceLost, UsageError, VulkanUnavailable
from catchat.vk.probe import DeviceInfo, probe_devices

ENV_DEVICE = "CATCHAT_DEVICE"
MEMORY_HINT = ("lower model.hidden, data.batch_lanes or data.window in the config "
               "(for `catchat sample`: --num)")
# lavapipe ends a shader invocation's loops once they have run this many iterations in all (gallivm's
# LP_MAX_TGSI_LOOP_ITERATIONS, every loop of the shader counted together), and a loop past it exits as if
# done, without an error: measured there, the bias gradients' column sums over 262,144 rows, a GEMM over
# K = 1,048,576 and a one-dispatch decode chunk of 256 steps at 2 streams came out wrong (Device.loop_limit).
LAVAPIPE_LOOP_LIMIT = 65535
# So a CPU device takes at most this many tokens a window (lanes x window): twice the shipped configs'
# 65,536 and half the smallest failure seen.
CPU_MAX_WINDOW_TOKENS = 131_072
_KP_DTYPES = (np.float32, np.uint32, np.int32)
# module attributes of the kp that `make setup` builds, one per patch in tools/kp-patches/
KP_PATCH_MARKERS = ("catchat_dispatch_barrier", "catchat_host_view", "catchat_eval_async", "catchat_device_features",
                    "catchat_coopmat2", "catchat_dispatch_concurrent")
FLOAT16_FEATURES = frozenset({"shaderFloat16", "storageBuffer16BitAccess"})
# VkComponentTypeNV values, as kp patch 0005 reports cooperative-matrix shapes
COMPONENT_TYPES = ("f16", "f32", "f64", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64")


def coop_shape_name(shape) -> str:
    """'16x16x16 f16*f16+f32->f32' for a [M, N, K, A, B, C, D] shape of kp patch 0005."""
    m, n, k, *types = shape
    a, b, c, d = (COMPONENT_TYPES[t] if t < len(COMPONENT_TYPES) else f"type{t}" for t in types)
    return f"{m}x{n}x{k} {a}*{b}+{c}->{d}"


SCOPES = {1: "device", 2: "workgroup", 3: "subgroup", 5: "queue family"}  # VkScopeKHR values


def coop2_dimension_name(dim) -> str:
    """'16x16x16 f16*f16+f32->f32 workgroup 256' for a flexible dimension of kp patch 0006: M, N, K
    granularity, A, B, C, result types, saturating, scope, workgroup invocations."""
    m, n, k, a, b, c, d, _saturating, scope, invocations = dim
    name = coop_shape_name([m, n, k, a, b, c, d])
    return f"{name} {SCOPES.get(scope, f'scope{scope}')} {invocations}"


def import_kp():
    """The kp module, or a one-line error naming what to install."""
    try:
        import kp
    except ImportError as exc:
        if "vulkan" in str(exc).lower():
            raise VulkanUnavailable("no Vulkan loader (libvulkan.so.1) on this machine",
                                    hint="apt-get install libvulkan1 mesa-vulkan-drivers   (or run `make setup`)"
                                    ) from None
        raise VulkanUnavailable(f"the Kompute Python package `kp` is not importable ({exc})",
                                hint="run `make setup` (builds kp 0.9.0 from source against Debian's headers)"
                                ) from None
    return kp


def host_view(tensor) -> np.ndarray:
    """A writable, properly strided 1-D view of a kp tensor's host (staging) memory.

    The kp that `make setup` builds (tools/kp-patches/0003) returns exactly that from `data()`
    under numpy 1 and 2. An unpatched kp 0.9.0 under numpy 2 returns stride 0 (every element
    aliases element 0); re-striding from the item size is right for it and a no-op otherwise.
    """
    d = tensor.data()
    return np.lib.stride_tricks.as_strided(d, (tensor.size(),), (d.itemsize,), writeable=True)


def select_device(devices: list[DeviceInfo], selector: str | int | None) -> DeviceInfo:
    """Pick a device by index or case-insensitive name substring; default: the first discrete GPU,
    else the first device."""
    if not devices:
        raise VulkanUnavailable("Vulkan found no device",
                                hint="apt-get install mesa-vulkan-drivers   (CPU fallback: lavapipe)")
    if selector is None or str(selector).strip() == "":
        return next((d for d in devices if d.type == "discrete GPU"), devices[0])
    sel = str(selector).strip()
    names = ", ".join(f"{d.index}: {d.name}" for d in devices)
    if sel.isdigit():
        i = int(sel)
        if i >= len(devices):
            raise VulkanUnavailable(f"no Vulkan device with index {i} (have {names})",
                                    hint="pick one from `catchat devices`")
        return devices[i]
    hits = [d for d in devices if sel.lower() in d.name.lower()]
    if not hits:
        raise VulkanUnavailable(f"no Vulkan device whose name contains {sel!r} (have {names})",
                                hint="pick one from `catchat devices`")
    return hits[0]


@dataclass
class Device:
    """An open Vulkan device. Keep this object alive as long as anything made from it is used."""

    info: DeviceInfo
    manager: object
    kp: object
    allocated_bytes: int = 0  # every tensor made through `tensor` (a run's device-memory footprint)
    # optional Vulkan features and extensions the device was created with (kp patch 0005; none
    # with an unpatched kp): 16/8-bit storage, float16/int8 arithmetic, cooperativeMatrixNV, ...
    features: frozenset[str] = frozenset()
    coop_shapes: tuple[str, ...] = ()  # cooperative-matrix shapes offered, as coop_shape_name gives them
    # VK_NV_cooperative_matrix2 (kp patch 0006): (max workgroup size, max flexible dimension, shared
    # bytes the driver reserves) and the flexible dimensions as the patch reports them (M, N, K
    # granularity, A, B, C, result types, saturating, scope, invocations; coop2_dimension_name names one)
    coop2_limits: tuple[int, ...] = ()
    coop2_dimensions: tuple[tuple[int, ...], ...] = ()

    @property
    def evals_async(self) -> bool:
        """kp patch 0004: Sequence.eval_async() submits without waiting (eval_await() waits, GIL released)."""
        return bool(getattr(self.kp, "catchat_eval_async", 0))

    @property
    def dispatches_concurrent(self) -> bool:
        """kp patch 0007: a dispatch can be recorded without the barrier before it (`beside`)."""
        return bool(getattr(self.kp, "catchat_dispatch_concurrent", 0))

    def beside(self, op):
        """The dispatch `op` recorded without the barrier that orders it after everything before it,
        so it may run beside the work recorded just before (which it must neither read the results of
        nor write what that work touches). The next dispatch with its barrier waits for both. Where kp
        lacks patch 0007, `op` unchanged (ordered: the same results)."""
        if self.dispatches_concurrent:
            op.barrier = False
        return op

    @property
    def runs_float16(self) -> bool:
        """float16 arithmetic and float16 storage buffers are enabled (the half-precision kernels)."""
        return FLOAT16_FEATURES <= self.features

    def tensor(self, data_or_size, dtype=np.float32, kind: str = "device"):
        """A kp tensor holding `data_or_size` (an array, or a size to zero-fill) of float32/uint32/int32.

        The device side holds garbage until an OpTensorSyncDevice runs (kp semantics).
        """
        dtype = np.dtype(dtype)
        if dtype.type not in _KP_DTYPES:
            raise TypeError(f"kp tensors hold float32, uint32 or int32, not {dtype}")
        arr = (np.zeros(int(data_or_size), dtype) if np.isscalar(data_or_size)
               else np.ascontiguousarray(data_or_size, dtype=dtype).ravel())
        if arr.size == 0:
            arr = np.zeros(1, dtype)  # Vulkan buffers cannot be empty
        self.check_buffer_size(arr.nbytes)
        kinds = {"device": self.kp.TensorTypes.device, "host": self.kp.TensorTypes.host,
                 "storage": self.kp.TensorTypes.storage}
        try:
            t = self.manager.tensor_t(arr, kinds[kind])
        except RuntimeError as exc:  # vk::OutOfDeviceMemoryError / OutOfHostMemoryError, through pybind11
            raise VulkanUnavailable(
                f"could not allocate a buffer of {format_bytes(arr.nbytes)} on {self.info.name} "
                f"({format_bytes(self.allocated_bytes)} already allocated): {exc}",
                hint=MEMORY_HINT) from None
        self.allocated_bytes += arr.nbytes
        return t

    def check_buffer_size(self, nbytes: int, what: str = "a buffer") -> None:
        """Refuse a buffer larger than the device's maxStorageBufferRange (kp would wrap silently)."""
        limit = min(self.info.max_storage_buffer_bytes, 2**32 - 1)
        if nbytes > limit:
            raise VulkanUnavailable(
                f"{what} of {nbytes / 2**20:.1f} MiB exceeds this device's maximum storage buffer "
                f"({limit / 2**20:.0f} MiB on {self.info.name})",
                hint=MEMORY_HINT)

    def check_device_memory(self, nbytes: int, what: str = "this program") -> None:
        """Refuse a planned allocation larger than the device's largest device-local memory heap,
        before anything is allocated (an allocation that fails half way leaves nothing usable)."""
        heap = self.info.device_memory_bytes
        if heap and nbytes > heap:
            raise VulkanUnavailable(
                f"{what} needs {format_bytes(nbytes)} of device memory; {self.info.name} has "
                f"{format_bytes(heap)}", hint=MEMORY_HINT)

    @property
    def loop_limit(self) -> int | None:
        """Loop iterations a shader invocation may run in all before its loops end early: lavapipe's
        (LAVAPIPE_LOOP_LIMIT) on a CPU device, None (no such limit) on a GPU."""
        return LAVAPIPE_LOOP_LIMIT if self.info.type == "CPU" else None

    def check_loop_limit(self, window_tokens: int, what: str = "this program") -> None:
        """Refuse a window of more than CPU_MAX_WINDOW_TOKENS tokens where the device has a loop limit."""
        if self.loop_limit is not None and window_tokens > CPU_MAX_WINDOW_TOKENS:
            raise UsageError(f"{what} has {window_tokens:,} tokens a window (lanes x window); on a CPU device "
                             f"(lavapipe, which ends a shader's loops after {self.loop_limit:,} iterations) at "
                             f"most {CPU_MAX_WINDOW_TOKENS:,}", "lower data.batch_lanes or data.window "
                             "(data.micro_batches keeps the tokens a step), or train on a GPU")

    def upload(self, tensors) -> None:
        """Copy tensors' host data to the device now (new tensors hold garbage there until then)."""
        self.sequence().eval(self.kp.OpTensorSyncDevice(list(tensors)))

    def sequence(self, timestamps: int = 0):
        """A kp sequence; `timestamps` > 0 reserves that many timestamp slots (ops + 1)."""
        return self.manager.sequence(0, timestamps) if timestamps else self.manager.sequence()

    def recorded(self, ops, upload=(), download=()):
        """A sequence with, in order: an upload of `upload`, `ops`, a download of `download`
        (recorded once, run with .eval() as often as needed)."""
        seq = self.sequence()
        if upload:
            seq.record(self.kp.OpTensorSyncDevice(list(upload)))
        for op in ops:
            seq.record(op)
        if download:
            seq.record(self.kp.OpTensorSyncLocal(list(download)))
        return seq

    def op_times_us(self, ops, runs: int = 1) -> np.ndarray:
        """Device microseconds of each op of one recorded sequence, from GPU timestamps between them (each
        includes its wait for the op before), on the last of `runs` runs (the ones before warm the pipelines)."""
        seq = self.sequence(timestamps=len(ops) + 1)
        for op in ops:
            seq.record(op)
        for _ in range(max(1, runs)):
            seq.eval()
        ticks = np.diff(np.asarray(seq.get_timestamps(), np.float64))[: len(ops)]
        return ticks * (self.info.timestamp_period_ns / 1e3)

    def run(self, call, what: str) -> None:
        """call(): a submit, wait or eval of recorded work, with kp's RuntimeError (a failed submit or
        wait: VK_ERROR_DEVICE_LOST...) turned into DeviceLost naming `what` was running."""
        try:
            call()
        except RuntimeError as exc:
            raise DeviceLost(f"the Vulkan device ({self.info.name}) failed while running {what}: {exc}",
                             hint="check the driver and the GPU (`catchat doctor`), then start again") from None

    def algorithm(self, tensors, spirv: bytes, workgroups, spec_consts=(), push_consts=()):
        """A kp algorithm with uint32 specialization and push constants (the dtype recipe that
        kp 0.9.0 needs: push constants take the dtype of spec_consts)."""
        wg = check_dispatch(tensors, workgroups)
        return self.manager.algorithm(list(tensors), spirv, wg,
                                      np.asarray(spec_consts, dtype=np.uint32),
                                      np.asarray(push_consts, dtype=np.uint32))


def check_dispatch(tensors, workgroups) -> list[int]:
    """The three workgroup counts of an algorithm over these bindings; ValueError where kp would
    misbehave (more than 32 bindings give wrong results silently) or a count is below 1."""
    if len(tensors) > 32:
        raise ValueError(f"{len(tensors)} bindings: more than 32 give wrong results silently")
    wg = [int(w) for w in workgroups] + [1] * (3 - len(workgroups))
    if any(w < 1 for w in wg):
        raise ValueError(f"workgroup counts must be >= 1, got {wg}")
    return wg


def open_device(selector: str | int | None = None) -> Device:
    """Open the chosen device (argument, else $CATCHAT_DEVICE, else the first discrete GPU)."""
    if selector is None:
        selector = os.environ.get(ENV_DEVICE)
    info = select_device(probe_devices(), selector)  # probe first: kp aborts without a driver
    kp = import_kp()
    try:
        manager = kp.Manager(info.index)
    except RuntimeError as exc:
        raise VulkanUnavailable(f"could not open Vulkan device {info.index} ({info.name}): {exc}",
                                hint="check the driver with `vulkaninfo --summary`") from None
    features = getattr(manager, "catchat_enabled_features", lambda: [])()
    shapes = getattr(manager, "catchat_cooperative_matrix_shapes", lambda: [])()
    limits2 = getattr(manager, "catchat_cooperative_matrix2_limits", lambda: [])()
    dims2 = getattr(manager, "catchat_cooperative_matrix2_dimensions", lambda: [])()
    return Device(info=info, manager=manager, kp=kp, features=frozenset(features),
                  coop_shapes=tuple(coop_shape_name(s) for s in shapes),
                  coop2_limits=tuple(int(v) for v in limits2),
                  coop2_dimensions=tuple(tuple(int(v) for v in d) for d in dims2))


def format_bytes(n: int) -> str:
    """'1.5 GiB', '12.0 MiB', '3 KiB' (for messages)."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{max(n, 0) / 2**10:.0f} KiB"


def pack_push(*values) -> np.ndarray:
    """Push-constant block as uint32 words: ints as uint32, floats as their float32 bits."""
    out = np.empty(len(values), dtype=np.uint32)
    for i, v in enumerate(values):
        if isinstance(v, (float, np.floating)):
            out[i] = np.float32(v).view(np.uint32)
        else:
            out[i] = np.uint32(int(v) & 0xFFFFFFFF)
    return out
