"""GRU forward/backward sweeps (one dispatch per step) against catchat.model.reference."""

import dataclasses
from collections import Counter

import numpy as np
import pytest

from catchat.parity import gru as gru_parity
from catchat.vk.kernels import gru
from catchat.vk.kernels.gru import plan as gru_plan  # where coop_sweeps plans


def test_parity(dev):
    from catchat.vk.kernels.gemm import coopmat_runs

    results = gru_parity.parity_checks(dev)
    assert results and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    # the cases counted per variant: a variant whose rows went missing would pass all() alone
    stream = (len(gru_parity.STREAM_CASES) + (len(gru_parity.STREAM_GPU_CASES) if coopmat_runs(dev) else 0)
              if dev.runs_float16 else 0)
    ksplit = (len(gru_parity.KSPLIT_CASES) + (len(gru_parity.KSPLIT_GPU_CASES) if coopmat_runs(dev) else 0)
              if dev.runs_float16 else 0)
    runs = {"": len(gru_parity.CASES) + len(gru_parity.PERSISTENT_CASES) * len(gru_parity.persistent_counts(dev)),
            "_f16w": len(gru_parity.HALF_W_CASES) if dev.runs_float16 else 0,
            "_coop": (len(gru_parity.COOP_CASES) + (len(gru_parity.COOP_GPU_CASES) if coopmat_runs(dev) else 0)
                      if coopmat_runs(dev) or dev.runs_float16 else 0),
            "_stream": stream, "_stream16": stream, "_stream16f": max(0, stream - 2), "_ksplit": ksplit,
            "_ksplit16": ksplit,
            "_stream32": len(gru_parity.STREAM_F32_CASES) + (len(gru_parity.STREAM_F32_GPU_CASES)
                                                             if dev.info.type != "CPU" else 0),
            "_ksplit32": len(gru_parity.KSPLIT_CASES) + (len(gru_parity.KSPLIT_GPU_CASES)
                                                             if dev.info.type != "CPU" else 0),
            "_split32": stream,
            "_rsplit32": (len(gru_parity.RSPLIT_CASES) + (len(gru_parity.RSPLIT_GPU_CASES) if coopmat_runs(dev) else 0)
                          if coopmat_runs(dev) or dev.runs_float16 else 0)}
    assert Counter(r.kernel for r in results if r.kernel.endswith(".o")) == {
        f"gru_forward{v}.o": n for v, n in runs.items() if n}
    # every streamed and register-resident backward sums the bias gradients itself (BIAS_SUMS), checked
    # against the reference's: all the streamed cases, and at least those given resident backward tiles
    sums = Counter(r.kernel for r in results if r.kernel.endswith("(sweep sums)"))
    streamed = ("_stream", "_stream16", "_stream16f", "_ksplit", "_ksplit16", "_stream32", "_ksplit32", "_split32")
    assert {k: n for k, n in sums.items() if not k.startswith(("gru_backward.", "gru_backward_coop.",
                                                                               "gru_backward_rsplit32."))} == {
        f"gru_backward{v}.{b} (sweep sums)": runs[v] for v in streamed if runs[v] for b in ("db_ih", "db_hh")}
    resident = sum(isinstance(t[1], gru.ResidentTiles) for _, _, _, t, _ in gru_parity.CASES) \
        + sum(isinstance(t[1], gru.ResidentTiles) for _, _, _, t, _ in gru_parity.PERSISTENT_CASES) \
        * len(gru_parity.persistent_counts(dev))
    assert resident and sums["gru_backward.db_ih (sweep sums)"] >= resident
    # the variants whose own kernel could be silently replaced say they ran: one row per case
    ran = Counter(r.kernel for r in results if ".ran_" in r.kernel)
    assert ran == {k: n for k, n in {"gru_forward_split32.ran_split": runs["_split32"],
                                     "gru_forward_rsplit32.ran_split": runs["_rsplit32"],
                                     "gru_backward_ksplit.ran_ksplit": runs["_ksplit"],
                                     "gru_backward_ksplit16.ran_ksplit": runs["_ksplit16"],
                                     "gru_backward_ksplit32.ran_ksplit": runs["_ksplit32"]}.items() if n}
    to_half = len(gru_parity.TO_HALF_CASES) + (len(gru_parity.TO_HALF_GPU_CASES) if dev.info.type != "CPU" else 0)
    assert sum(r.kernel.startswith("to_half.lo") for r in results) == (to_half if dev.runs_float16 else 0)


def test_deterministic(dev):
    """Two runs of both sweeps are bitwise equal (clamp on: hit counts too)."""
    case = gru_parity.make_case(7, 3, 40)
    tiles = ((4, 4, 2, 2, 2, 16), (2, 4, 2, 2, 2, 16))
    a = gru_parity.run_gru_gpu(dev, case, 0.05, tiles)
    b = gru_parity.run_gru_gpu(dev, case, 0.05, tiles)
    for k in a:
        # db: None where the tiled sweep leaves it
        if k in ("hits", "sync_timeouts", "tiles", "ran_split") or a[k] is None:
            assert a[k] == b[k]
        else:
            assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k


def test_saturated_gates_stay_finite(dev):
    """Pre-activations of order 1e4 (tanh of large arguments must not give NaN)."""
    case = gru_parity.make_case(3, 2, 9, xscale=3e4)
    assert np.abs(case["gi"]).max() > 1e4
    got = gru_parity.run_gru_gpu(dev, case)
    exp, _ = gru_parity.expected_gru(case)
    for k in ("o", "save", "dgi", "dgh", "dh0"):
        assert np.all(np.isfinite(got[k])), k
        assert np.allclose(got[k], exp[k], atol=1e-5, rtol=1e-5), k


def test_sweep_ops_and_bounds(dev):
    T, B, H = 4, 2, 5
    case = gru_parity.make_case(T, B, H)
    f32 = dev.tensor
    params, resets = dev.tensor(case["flat"]), dev.tensor(case["resets"], np.uint32)

    def forward(save_floats, persistent=0):
        return gru.GruForward(dev, f32(T * B * 3 * H), params, f32(B * H), resets, f32(T * B * H),
                              f32(T * B * H), f32(save_floats), f32(B * H), T=T, B=B, H=H, w_off=0, b_off=0,
                              persistent=persistent)

    fwd = forward(T * B * 4 * H)
    assert len(fwd.sweep_ops()) == T  # one dispatch per step
    assert len(forward(T * B * 4 * H, persistent=1).sweep_ops()) == 1  # the whole sweep in one
    with pytest.raises(ValueError):
        fwd.step(T)
    with pytest.raises(ValueError):  # save too small: caught before any out-of-bounds write
        forward(T * B * 3 * H)


def test_hT_must_not_overwrite_h0_when_T_is_1(dev):
    state = dev.tensor(8)
    with pytest.raises(ValueError):
        gru.GruForward(dev, dev.tensor(6), dev.tensor(16), state, dev.tensor(np.zeros(2), np.uint32),
                       dev.tensor(4), dev.tensor(4), dev.tensor(16), state, T=1, B=2, H=1, w_off=0, b_off=8)


def test_pick_tiles_scales(dev):
    """Big shapes get the big-GPU tiles with >= 128 workgroups, tiny ones the fallback; every
    candidate fits the shared-memory and thread limits."""
    for backward, cands in ((False, gru.FORWARD_TILES), (True, gru.BACKWARD_TILES)):
        for B, H in ((64, 512), (64, 1024), (64, 2048)):
            assert gru.n_workgroups(gru.pick_tiles(B, H, backward), B, H, backward) >= 128
        assert gru.pick_tiles(3, 7, backward) == cands[-1][0]
        for tiles, _ in cands:
            gru._check_tiles(dev, tiles, backward)


def test_tensor_core_sweeps_compile_and_are_refused_where_they_cannot_run(dev, monkeypatch):
    """Both sweeps' products on tensor cores (COOP): the shaders compile at v3's tiles and at partial
    fragments (H = 72); a device without cooperative matrices or float16 (to emulate them) refuses coop=True
    with the reason, and
    a program uses them at fp16 where the device has them, unless turned off (CATCHAT_SWEEP_COOP=0)."""
    from catchat.vk.device import FLOAT16_FEATURES
    from catchat.vk.kernels.gemm import COOP_SHAPE, coopmat_runs
    from catchat.vk.shaders import compile_shader

    tiles = (gru.ResidentTiles(16, 16, 2, 2, 4), gru.resident_backward(16, 16, 2, 2, 8))
    for B, H, kf, nf in ((64, 512, 8, 2), (20, 72, 2, 1)):  # fragments per subgroup
        fwd = gru.resident_defines(tiles[0], B, H, 32, coop=True)
        bwd = gru.resident_defines(tiles[1], B, H, 32, backward=True, coop=True)
        assert (fwd["COOP_KF"], bwd["COOP_NF"]) == (kf, nf)
        for name, defines in (("gru_forward_resident", fwd), ("gru_backward_resident", bwd)):
            assert compile_shader(name, {**defines, "PERSISTENT": 1})[:4] == b"\x03\x02\x23\x07"
    with pytest.raises(ValueError, match="tiles of 16 x 16"):
        gru.resident_defines(gru.ResidentTiles(8, 16, 2, 2, 4), 64, 512, 32, coop=True)
    assert max(gru.coop_shared_bytes(512), gru.coop_shared_bytes(512, backward=True)) <= 48 * 1024
    case = gru_parity.make_case(3, 16, 64)
    if not coopmat_runs(dev):  # emulated fragments need float16; without either the sweep is refused
        bare = dataclasses.replace(dev, features=dev.features - FLOAT16_FEATURES)
        with pytest.raises(ValueError, match="tensor-core sweep needs cooperative matrices"):
            gru_parity.run_gru_gpu(bare, case, tiles=tiles, coop=True)
    monkeypatch.delenv(gru.COOP_ENV, raising=False)
    planned = all(gru.coop_tiles_ok(gru.plan_sweep(dev, 16, 64, bw, coop=True).tiles) for bw in (False, True))
    assert gru.coop_sweeps(dev, 16, 64, "fp16") == (coopmat_runs(dev) and planned)
    # the rule itself, on a device described as having tensor cores and planning 16 x 16 resident tiles
    # (judged with the tensor-core kernels' resources: coop=True)
    tc = dataclasses.replace(dev, info=dataclasses.replace(dev.info, subgroup_size=32), coop_shapes=(COOP_SHAPE,),
                             features=dev.features | {"cooperativeMatrixNV"})
    asked = []
    monkeypatch.setattr(gru_plan, "plan_sweep", lambda d, B, H, backward, coop=False: asked.append(coop) or
                        gru.SweepPlan(tiles[backward], 132, None))
    assert gru.coop_sweeps(tc, 64, 512, "fp16") and asked == [True, True]
    assert not gru.coop_sweeps(tc, 64, 512, "fp32") and not gru.coop_sweeps(dev, 64, 512, "fp16")
    monkeypatch.setenv(gru.COOP_ENV, "0")
    assert not gru.coop_sweeps(tc, 64, 512, "fp16")  # turned off: the threads' FMAs
    monkeypatch.setattr(gru_plan, "plan_sweep", lambda *a, **k: gru.SweepPlan((8, 8, 4, 1, 1, 64), 0, None))
    monkeypatch.delenv(gru.COOP_ENV)
    assert not gru.coop_sweeps(tc, 64, 512, "fp16")  # tiled sweeps: no tensor-core kernel for them
