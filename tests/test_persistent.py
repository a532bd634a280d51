"""Persistent recurrent sweeps: the whole sweep in one dispatch, workgroups meeting at a grid barrier
(glsl/include/grid_sync.glsl). The kernel-level parity cases are in catchat/parity/gru.py; here the
whole model under CATCHAT_PERSISTENT, the barrier's reuse across dispatches, and its failure mode."""

import numpy as np
import pytest

from catchat.errors import DeviceLost, UsageError
from catchat.model import ModelSpec, ParamLayout
from catchat.parity import gru as gru_parity
from catchat.parity import model as model_parity
from catchat.vk import slots
from catchat.vk.kernels import gru
from catchat.vk.program import Program

from support import assert_clean_error, catchat, make_tiny_run


@pytest.mark.parametrize("case", model_parity.MODEL_CASES, ids=[c[0] for c in model_parity.MODEL_CASES])
def test_model_matches_reference_with_persistent_sweeps(dev, case, monkeypatch):
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    label, spec, T, B, hp = case
    results = model_parity.model_parity(dev, spec, T, B, hp, label=label)
    assert results and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def test_stepwise_path_with_persistent_backward(dev, monkeypatch):
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    spec, T, B, hp, tf = model_parity.STEPWISE_CASES[0]
    results = model_parity.stepwise_parity(dev, spec, T, B, hp, tf)
    assert results and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def test_programs_pick_persistent_sweeps_from_the_environment(dev, monkeypatch):
    spec = ModelSpec(vocab_size=101, hidden=8, layers=2)
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    prog = Program(dev, ParamLayout(spec), 5, 2, training=True)
    sweeps = lambda p: p.fwd.gru + [lay.gru for lay in p.bwd.layers]  # noqa: E731
    assert all(len(k.sweep_ops()) == 1 for k in sweeps(prog))
    # one tile fits one workgroup at H=8: W_hh stays in registers (so the whole-model tests with
    # CATCHAT_PERSISTENT=1 run the resident kernels)
    assert all(k.shader.endswith("_resident") for k in sweeps(prog))
    monkeypatch.setenv("CATCHAT_PERSISTENT", "0")
    prog = Program(dev, ParamLayout(spec), 5, 2, training=True)
    assert [len(k.sweep_ops()) for k in sweeps(prog)] == [5, 5, 6, 6]
    monkeypatch.setenv("CATCHAT_PERSISTENT", "lots")
    with pytest.raises(UsageError, match="CATCHAT_PERSISTENT"):
        Program(dev, ParamLayout(spec), 5, 2, training=False)


def test_persistent_geometry():
    """About one tile per resident workgroup, balanced when there are more tiles than workgroups."""
    assert gru.sweep_workgroups(0, 256) == 0
    assert gru.sweep_workgroups(132, 256) == 128  # 2 tiles each, not 124 x 2 + 8 x 1
    assert gru.sweep_workgroups(132, 100) == 100
    assert gru.sweep_workgroups(1, 7) == 1
    for B, H, backward in ((64, 512, False), (64, 512, True), (32, 2048, False), (32, 2048, True)):
        tiles = gru.pick_tiles(B, H, backward, resident=132)
        assert gru.n_workgroups(tiles, B, H, backward) == 128
        assert gru.shared_bytes(tiles, backward) <= 48 * 1024
    # no persistent candidate fits in 1 workgroup at v3: the per-step choice
    assert gru.pick_tiles(64, 512, resident=1) == gru.pick_tiles(64, 512)


def test_sweeps_recorded_twice_reuse_the_barrier(dev):
    """The last workgroup out zeroes the barrier's words, so a second sweep in the same sequence
    (the next micro-batch) computes the same thing."""
    case = gru_parity.make_case(7, 3, 20)
    tiles = ((2, 2, 2, 1, 1, 8), (1, 2, 2, 2, 1, 8))
    once = gru_parity.run_gru_gpu(dev, case, 0.02, tiles, persistent=(1, 1))
    twice = gru_parity.run_gru_gpu(dev, case, 0.02, tiles, persistent=(1, 1), repeat=2)
    for k in ("o", "hprev", "save", "hT", "dgi", "dgh", "dh0"):
        np.testing.assert_array_equal(twice[k], once[k], err_msg=k)
    assert twice["hits"] == 2 * once["hits"] > 0  # hits accumulate: both sweeps ran
    assert not twice["sync"].any() and twice["sync_timeouts"] == 0


def test_a_barrier_that_cannot_hold_gives_up_and_says_so(dev):
    """1024 workgroups of 8 threads: all co-resident on a GPU (the sweep is right), but not on a CPU
    device, where the barrier must give up rather than hang and count a timeout."""
    T, B, H = 3, 64, 64
    case = gru_parity.make_case(T, B, H)
    tiles = ((2, 2, 2, 1, 1, 4), (1, 2, 4, 1, 1, 4))  # 32 x 32 and 16 x 32 tiles
    got = gru_parity.run_gru_gpu(dev, case, 0.0, tiles, persistent=(1024, 512))
    if dev.info.type == "CPU":
        assert got["sync_timeouts"] >= 1
    else:
        exp, _ = gru_parity.expected_gru(case)
        assert got["sync_timeouts"] == 0
        np.testing.assert_allclose(got["dgi"], exp["dgi"], atol=1e-5, rtol=1e-4)


def test_a_lost_barrier_is_an_error_not_a_result(dev):
    prog = Program(dev, ParamLayout(ModelSpec(vocab_size=101, hidden=8, layers=1)), 4, 2, training=False)
    from catchat.vk.device import host_view

    host_view(prog.buffers.stats)[:] = 0
    host_view(prog.buffers.stats)[slots.ST_SYNC_TIMEOUTS] = 1
    with pytest.raises(DeviceLost, match="CATCHAT_PERSISTENT=0"):
        prog._stats(1)


def test_forward_passes_check_the_barrier_too(dev, monkeypatch):
    """forward_logits (generation) reports a lost barrier like a training step: 64 workgroups cannot
    all be resident on a CPU device (lavapipe runs at most 16 threads); on a GPU they are and the
    logits come back."""
    monkeypatch.setenv("CATCHAT_PERSISTENT", "64")
    prog = Program(dev, ParamLayout(ModelSpec(vocab_size=101, hidden=256, layers=1)), 3, 64, training=False)
    assert prog.fwd.gru[0].sweep_workgroups == 64
    prog.set_params(np.full(prog.layout.total, 0.01, np.float32))
    prog.set_carry(None)
    zeros = np.zeros((3, 64), np.uint32)
    if dev.info.type == "CPU":
        with pytest.raises(DeviceLost, match="CATCHAT_PERSISTENT=0"):
            prog.forward_logits(zeros + 5, zeros)
    else:
        assert np.all(np.isfinite(prog.forward_logits(zeros + 5, zeros)))


def test_a_bad_CATCHAT_PERSISTENT_is_a_clean_error(tmp_path, dev):
    run = make_tiny_run(tmp_path, dev)
    assert_clean_error(catchat("eval", run, env={"CATCHAT_PERSISTENT": "lots"}), 2, "CATCHAT_PERSISTENT")
    r = catchat("doctor", env={"CATCHAT_PERSISTENT": "lots"})
    assert r.returncode == 1 and "FAIL" in r.stdout and "CATCHAT_PERSISTENT" in r.stdout
    r = catchat("doctor")
    assert "sweeps: one dispatch per timestep" in r.stdout or "sweeps: one persistent dispatch" in r.stdout


def test_resident_geometry():
    """Register-resident sweeps at v3 on an H200 (132 SMs): a workgroup per tile, 128 of them,
    within the threads, shared memory and register budget; none where W_hh cannot fit (v5, or
    too few workgroups)."""
    for backward in (False, True):
        tiles = gru.pick_resident_tiles(64, 512, 132, 1024, 48 * 1024, backward)
        ks, n_tiles, threads, nbytes = gru.resident_shape(tiles, 64, 512, backward)
        assert n_tiles == 128 and nbytes <= 48 * 1024
        assert threads * gru.resident_registers(tiles, backward) <= gru.REGISTER_FILE
        if backward:  # the threads' columns cover dh, once per row slice
            assert threads * tiles.per_thread >= 512 * ks and ks == tiles.sl and tiles.batch % 4 == 0
        else:  # the slices cover the reduction
            assert ks * tiles.kv * 4 >= 512
        assert gru.pick_resident_tiles(32, 2048, 132, 1024, 48 * 1024, backward) is None
        assert gru.pick_resident_tiles(64, 512, 1, 1024, 48 * 1024, backward) is None
        # a subgroup smaller than the tiles' shuffle width leaves more slice groups to sum
        # through shared memory (forward) or fewer row slices (backward)
        small = gru.resident_shape(tiles, 64, 512, backward, subgroup=8)
        if backward:
            assert gru.resident_shape(tiles, 64, 512, True, subgroup=1)[0] == 1 < ks
        else:
            assert small[3] > nbytes if tiles.sl > 8 else small[3] == nbytes
    with pytest.raises(ValueError, match="batch divide lanes"):
        gru.resident_defines(gru.ResidentTiles(16, 16, 2, 6, 5, 8), 64, 512, 32)
    with pytest.raises(ValueError, match="multiple of 4"):
        gru.resident_defines(gru.resident_backward(16, 16, 4, 4, 6), 64, 512, 32, backward=True)
    with pytest.raises(ValueError, match="power of two"):
        gru.resident_defines(gru.resident_backward(16, 16, 4, 3, 8), 64, 512, 32, backward=True)


def test_resident_backward_partials_are_counted():
    """The resident backward sweep's partial products are scratch the memory plan includes."""
    tiles = gru.resident_backward(16, 16, 4, 4, 8)
    assert gru.partial_words(64, 512, tiles) == 2 * 32 * 64 * 512
    assert gru.partial_words(64, 512, (4, 16, 8, 1, 1, 128)) == 0  # tiled sweeps have none


def test_a_persistent_sweep_never_makes_its_per_step_pipeline(dev):
    """Pipelines are made on first use (kernels.LazyAlgorithm): a persistent sweep's ops make only
    its PERSISTENT pipeline, so the per-step variant (compiled, in case) costs the driver nothing."""
    T, B, H = 3, 2, 8
    f32 = lambda n: dev.tensor(np.zeros(n, np.float32))  # noqa: E731
    u32 = lambda n: dev.tensor(np.zeros(n, np.uint32), np.uint32)  # noqa: E731
    layout = gru_parity.make_case(T, B, H)["layout"]
    params, seq = f32(layout.total), f32((T + 1) * B * H)
    fwd = gru.GruForward(dev, f32(T * B * 3 * H), params, f32(B * H), u32(T * B), seq, seq, f32(T * B * 4 * H),
                         f32(B * H), T=T, B=B, H=H, w_off=layout.offsets["layers.0.gru.weight_hh"],
                         b_off=layout.offsets["layers.0.gru.bias_hh"], o_off=B * H, persistent=1)
    assert fwd.sweep_workgroups and fwd._algo._algo is None and fwd._sweep_algo._algo is None
    fwd.sweep_ops()
    assert fwd._sweep_algo._algo is not None and fwd._algo._algo is None
    fwd.step(0)  # asked for, the per-step pipeline is made then
    assert fwd._algo._algo is not None
