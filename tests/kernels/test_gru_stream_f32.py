"""The streamed sweeps in float32 (the threads' FMAs, W_hh from params) in a program and in its plan, and
the k-split backward (float32 and fp16) against the plain split and the twin; the fp16 streamed sweeps
are test_gru_stream.py's. Lavapipe runs them because the fixtures (conftest.py) force them."""

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from catchat.errors import UsageError
from catchat.model import ParamLayout
from catchat.parity import model as model_parity
from catchat.vk.kernels import gru
from catchat.vk.kernels.gru import plan as gru_plan
from catchat.vk.program import Program, plan

from support import streamed_like_the_twin


def float32_model_parity(dev, label: str):
    """The model parity's first case at H = 32 at fp32 (every check must pass); its spec, T, B and hyper."""
    case_label, base, T, B, hp = model_parity.MODEL_CASES[0]
    spec = replace(base, hidden=32)
    results = model_parity.model_parity(dev, spec, T, B, hp, label=f"{case_label}, {label}")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    return spec, T, B, hp


def test_program_trains_on_float32_streamed_sweeps(dev, float32_streamed):
    """A whole fp32 training step on the float32 streamed sweeps (the threads' FMAs, W_hh from params)
    against the fp32 twin at the model parity's fp32 tolerances; the program's allocations match its
    plan with their float32 shadows."""

    spec, T, B, _ = float32_model_parity(dev, "float32 streamed")
    layout = ParamLayout(spec)
    before = dev.allocated_bytes
    prog = Program(dev, layout, T, B)
    assert all(k.stream_f32 and k.stream for k in prog.fwd.gru + [layer.gru for layer in prog.bwd.layers])
    assert prog.fwd.w16 is None and prog.fwd.gru[0].tiles.f32
    assert dev.allocated_bytes - before == Program.planned_bytes(layout, T, B, True, dev)
    f32_shadows = sum(w for what, w in plan.kernel_scratch(plan.Geometry.of(layout, T, B, dev, True), True, dev)
                      if "float32" in what)
    assert f32_shadows == spec.layers * 2 * 16 * (1 + (B > 16)) * 4 * spec.hidden  # h_prev H + dGh 3H, 2 parities


def test_float32_stream_planning(dev, monkeypatch):
    """Where a program streams W_hh in float32: fp32 on a GPU whose persistent sweeps are shown
    co-resident, H a multiple of 16, B <= 32, no register-resident tiles planned; never on a CPU
    device, at fp16, or with CATCHAT_SWEEP_STREAM32=0. The kernel refuses tiles, coop or a float16
    W_hh beside it, and a W_hh not on a vec4 boundary."""
    from catchat.parity import gru as gru_parity

    monkeypatch.delenv(gru.STREAM_F32_ENV, raising=False)
    if dev.info.type == "CPU":
        assert not gru.stream_f32_sweep(dev, 32, 2048, False, "fp32")
    info = dataclasses.replace(dev.info, subgroup_size=32, type="DiscreteGpu", compute_units=132,
                               max_shared_memory_bytes=48 * 1024, max_workgroup_invocations=1024)
    gpu = dataclasses.replace(dev, info=info)
    monkeypatch.setattr(gru_plan, "resident_workgroups", lambda d: 132)
    monkeypatch.setattr(gru_plan, "plan_sweep", lambda *a, **k: gru.SweepPlan((8, 8, 4, 1, 1, 64), 132, None))
    for backward in (False, True):
        assert gru.stream_f32_sweep(gpu, 32, 2048, backward, "fp32")
        assert not gru.stream_f32_sweep(gpu, 32, 2048, backward, "fp16")
        assert not gru.stream_f32_sweep(gpu, 65, 2048, backward, "fp32")
        assert not gru.stream_f32_sweep(gpu, 32, 2040, backward, "fp32")
    monkeypatch.setenv(gru.STREAM_F32_ENV, "0")
    assert not gru.stream_f32_sweep(gpu, 32, 2048, False, "fp32")
    monkeypatch.delenv(gru.STREAM_F32_ENV)
    monkeypatch.setattr(gru_plan, "plan_sweep", lambda *a, **k: gru.SweepPlan(gru.ResidentTiles(16, 16, 2, 2, 4), 132,
                                                                              None))
    assert not gru.stream_f32_sweep(gpu, 32, 512, False, "fp32")  # W_hh in registers wins (v3)
    monkeypatch.setenv(gru.STREAM_F32_ENV, "1")  # to compare: streamed where the resident tiles fit
    assert gru.stream_f32_sweep(gpu, 32, 512, False, "fp32") and gru.stream_f32_sweep(gpu, 64, 512, True, "fp32")
    assert not gru.stream_f32_sweep(gpu, 32, 512, False, "fp16")
    monkeypatch.setenv(gru.STREAM_F32_ENV, "yes")
    with pytest.raises(UsageError, match="CATCHAT_SWEEP_STREAM32"):
        gru.stream_f32_sweep(gpu, 32, 512, False, "fp32")
    monkeypatch.delenv(gru.STREAM_F32_ENV)
    assert gru.stream_tiles(32, 2048, True, f32=True, ksplit=False) == gru.StreamTiles(2, 24, 3, 0, True)
    assert gru.stream_tiles(32, 2048, True, f32=True) == gru.StreamTiles(2, 24, gru.stream.KSPLIT32_DEPTH, 0, True,
                                                                          flags=True, ksplit=True)
    assert gru.stream_tiles(32, 2048, False, f32=True) == gru.StreamTiles(2, 8, 0, 0, True)

    case = gru_parity.make_case(2, 3, 16)
    t = dev.tensor
    args = (t(2 * 3 * 48), t(case["flat"]), t(2 * 3 * 16), t(np.zeros(6), np.uint32), t(3 * 3 * 16), t(3 * 3 * 16),
            t(2 * 3 * 64), t(2 * 3 * 16))
    kw = dict(T=2, B=3, H=16, b_off=0, hprev_off=0, o_off=3 * 16, stream_f32=True)
    with pytest.raises(ValueError, match="multiple of 4 floats"):
        gru.GruForward(dev, *args, w_off=2, **kw)
    with pytest.raises(ValueError, match="its own split"):
        gru.GruForward(dev, *args, w_off=0, coop=True, **kw)


def test_ksplit_takes_one_lane_group_of_whole_column_groups(monkeypatch):
    """The backward's k-split (the default; CATCHAT_STREAM_KSPLIT=0 turns it off) where B fits one lane
    group and H whole column groups of 8 * lane_frags blocks (v5: 16 k-parts of 24 fragments, 20
    resident); never the forward, nor float32; a value other than 0 or 1 is refused."""
    assert gru.ksplit_ok(32, 2048) and gru.ksplit_ok(32, 512) and gru.ksplit_ok(9, 128)
    assert not gru.ksplit_ok(20, 128) and not gru.ksplit_ok(40, 256) and not gru.ksplit_ok(3, 48)
    assert gru.ksplit_ok(32, 4096) and not gru.ksplit_ok(32, 8192)  # flag words: 16 k-parts + 16 column groups
    monkeypatch.delenv(gru.KSPLIT_ENV, raising=False)
    assert gru.stream_tiles(32, 2048, True).ksplit == gru.stream.KSPLIT_DEFAULT
    monkeypatch.setenv(gru.KSPLIT_ENV, "0")
    assert not gru.stream_tiles(32, 2048, True).ksplit
    monkeypatch.setenv(gru.KSPLIT_ENV, "1")
    t = gru.stream_tiles(32, 2048, True)
    assert (t.ksplit, t.lane_frags, t.k_per_group, t.resident, t.flags) == (True, 2, 24, 20, True)
    assert not gru.stream_tiles(32, 2048, False).ksplit
    assert not gru.stream_tiles(32, 2048 - 16, True).ksplit  # H not whole column groups: the plain split
    monkeypatch.setenv(gru.KSPLIT_ENV, "yes")
    with pytest.raises(UsageError, match="CATCHAT_STREAM_KSPLIT"):
        gru.stream_tiles(32, 2048, True)


def test_float32_ksplit_is_asked_for_and_stages_its_k_part_in_passes(monkeypatch):
    """The float32 k-split (on by default; CATCHAT_STREAM_KSPLIT=0 turns it off): at v5 16 k-parts of 24
    fragments (48 KB of dGh in float32) staged in 2 passes of 24 KB beside 16 subgroups' W_hh chunks
    (8 KB), a ring of 4 chunks; the passes divide the chunks and fit the stage's bytes."""
    monkeypatch.delenv(gru.KSPLIT_ENV, raising=False)
    assert gru.stream_tiles(32, 2048, True, f32=True).ksplit == gru.stream.KSPLIT32_DEFAULT
    monkeypatch.setenv(gru.KSPLIT_ENV, "1")
    t = gru.stream_tiles(32, 2048, True, f32=True)
    assert t == gru.StreamTiles(2, 24, 4, f32=True, flags=True, ksplit=True)
    assert gru.stream.ksplit32_passes(t) == 2 and gru.stream.stream_shared_bytes(t, True) == 32 * 1024
    defines = gru.stream.stream_defines(t, 2048, True, emulate=False, subgroup=32)
    assert defines == {"LF": 2, "KPW": 24, "PD": 4, "F32": 1, "NPASS": 2, "SUBGROUP32": 1}
    small = gru.stream_tiles(9, 256, True, f32=True)  # one lane fragment: 8 k-parts of 6 fragments, 6 KB
    assert (small.lane_frags, small.k_per_group, gru.stream.ksplit32_passes(small)) == (1, 6, 1)
    monkeypatch.setattr(gru.stream, "KSPLIT32_STAGE_BYTES", 1000)  # 6 KB in passes of at most 1000 bytes
    assert gru.stream.ksplit32_passes(small) == 12  # the chunks' divisors skip 7..11: one chunk a pass
    monkeypatch.setattr(gru.stream, "KSPLIT32_STAGE_BYTES", 2048)
    assert gru.stream.ksplit32_passes(small) == 3
    monkeypatch.setenv(gru.stream.DEPTH32_ENV, "2")
    assert gru.stream_tiles(32, 2048, True, f32=True).depth == 2
    monkeypatch.setenv(gru.KSPLIT_ENV, "0")
    assert not gru.stream_tiles(32, 2048, True, f32=True).ksplit


@pytest.mark.parametrize("stage_bytes,passes", [(3072, 2), (1024, 6)])
def test_float32_ksplit_in_passes_matches_the_twin(dev, monkeypatch, stage_bytes, passes):
    """The float32 k-split with its k-part staged in several passes (as v5's is in 2; here a smaller
    stage forces them at a shape lavapipe runs): the float32 twin's results, hit counts, no timeout."""
    monkeypatch.setenv(gru.KSPLIT_ENV, "1")
    monkeypatch.setattr(gru.stream, "KSPLIT32_STAGE_BYTES", stage_bytes)
    got = streamed_like_the_twin(dev, 3, 20, 256, 1, f32=True)
    assert got["tiles"][1].ksplit and got["tiles"][1].f32 and gru.stream.ksplit32_passes(got["tiles"][1]) == passes


def test_float32_ksplit_is_deterministic_and_not_the_plain_splits_order(dev, monkeypatch):
    """Two runs of the float32 k-split give the same bits (its partials summed in k-part order); the
    plain float32 split sums in another order, so its dh0 differs in the last bits somewhere."""
    from catchat.parity import gru as gru_parity

    case = gru_parity.make_case(3, 20, 256)
    runs = {}
    for ksplit in ("1", "1", "0"):
        monkeypatch.setenv(gru.KSPLIT_ENV, ksplit)
        got = gru_parity.run_gru_gpu(dev, case, 0.02, persistent=(1, 1), stream_f32=True)
        assert got["tiles"][1].ksplit == (ksplit == "1")
        runs.setdefault(ksplit, []).append(got)
    a, b = runs["1"]
    for k in ("dgi", "dgh", "dh0"):
        np.testing.assert_array_equal(a[k].view(np.uint32), b[k].view(np.uint32), err_msg=k)
    assert not np.array_equal(a["dh0"], runs["0"][0]["dh0"])


@pytest.mark.parametrize("n_wg,ksplit", [(0, False), (1, True)])
def test_ksplit_backward_runs_persistent_only(dev, monkeypatch, n_wg, ksplit):
    """The k-split's items meet inside a step, so a sweep of a dispatch per step falls back to the plain
    split; persistent over one workgroup (every item on it, W_hh not resident): the twin's results
    either way, the same hit counts, no barrier timeout. (Several workgroups at once: the GPU parity's
    KSPLIT_GPU_CASES; a CPU device may run one workgroup at a time.)"""
    monkeypatch.setenv(gru.KSPLIT_ENV, "1")
    got = streamed_like_the_twin(dev, 3, 20, 256, n_wg)
    assert got["tiles"][1].ksplit == ksplit and not got["tiles"][0].ksplit
    if n_wg:  # 16 items on one workgroup: nothing stays resident
        assert got["tiles"][1].resident == 0


@pytest.mark.parametrize("B,H,exact", [(3, 128, True), (20, 256, False)])
def test_ksplit_program_step_matches_the_plain_split(dev, streamed, monkeypatch, B, H, exact):
    """A whole fp16 training step on persistent streamed sweeps with the k-split backward against the
    same step on the plain split: one lane fragment's k-parts are the plain split's k-groups, summed in
    the same order, so every gradient is bitwise equal; two lane fragments sum 16 k-parts in order
    where the plain split folds its k-groups in pairs: equal up to the order of float32 sums."""
    label, base, T, _, hp = model_parity.MODEL_CASES[0]
    spec = replace(base, hidden=H)
    layout = ParamLayout(spec)
    flat, tokens, targets, resets, _ = model_parity.model_inputs(spec, T, B)
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")  # a CPU device runs one workgroup: every item on it
    grads = {}
    for ksplit in ("0", "1"):
        monkeypatch.setenv(gru.KSPLIT_ENV, ksplit)
        prog = Program(dev, layout, T, B, precision="fp16")
        assert all(k.gru.tiles.ksplit == (ksplit == "1") for k in prog.bwd.layers)
        prog.set_params(flat)
        prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
        prog.set_carry(None)
        prog.train_step([(tokens, targets, resets)], replace(hp, loss_scale=model_parity.FP16_SCALE), global_step=0)
        (grads[ksplit],) = prog.read("grads")
    if exact:
        np.testing.assert_array_equal(grads["1"], grads["0"])
    else:
        np.testing.assert_allclose(grads["1"], grads["0"], rtol=0, atol=1e-5 * np.abs(grads["0"]).max())
        assert not np.array_equal(grads["1"], grads["0"])  # the k-split ran: another order of sums
