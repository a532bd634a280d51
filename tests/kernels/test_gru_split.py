"""The float32 forward on tensor cores from float16 splits (CATCHAT_STREAM32_SPLIT; gru_forward_stream.comp's
SPLIT, ToHalf's LO): x = hi + 2^-11 lo, three products into two sets of accumulators. Lavapipe runs it with
emulated fragments (sums to nearest: float32's error), so a program is forced onto it here; on a GPU
`catchat parity`'s "split32" rows compare it with the fp32 twin. The register-resident forward's split
(CATCHAT_RESIDENT_SPLIT, gru_forward_resident.comp's COOP with SPLIT) likewise: its "rsplit32" rows."""

import dataclasses

import numpy as np
import pytest

from catchat.errors import UsageError
from catchat.model import ParamLayout
from catchat.parity import gru as gru_parity
from catchat.parity import model as model_parity
from catchat.vk.kernels import ToHalf, gru, run_ops, unpack_half
from catchat.vk.program import Program, kernelsets, plan


def test_split_halves_hold_float32s_bits_to_22():
    """hi + 2^-11 lo gives back x to ~2^-22 of it (float16's 11 bits twice), lo in float16's normal
    range for x of weights' and states' sizes."""
    x = np.random.default_rng(0).uniform(-2, 2, 4096).astype(np.float32)
    hi, lo = gru.split_halves(x)
    assert hi.dtype == lo.dtype == np.float16
    back = hi.astype(np.float64) + lo.astype(np.float64) / 2048
    assert np.abs(back - x).max() <= 2.0 ** -22 * np.abs(x).max()
    assert np.array_equal(hi, x.astype(np.float16))


@pytest.mark.parametrize("cols", [0, 32])
def test_to_half_and_its_lo_are_the_split(dev, cols):
    """ToHalf and ToHalf(lo=True) write split_halves' hi and lo (row-major, or in 16 x 16 blocks) at their
    offsets, bitwise: ties to even, float16's subnormals and the edge of its normal range included."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(16 * 32) * np.exp2(rng.integers(-20, 2, 16 * 32))).astype(np.float32)
    x[:5] = [1 + 2.0**-11, 1 + 3 * 2.0**-11, -1 - 2.0**-11, 2.0**-14 - 2.0**-26, 2.0**-14]  # ties to even; the edge
    assert np.any(np.abs(x) < 2.0**-14) and np.any(np.abs(x) > 1)
    tx, ty = dev.tensor(np.concatenate([np.zeros(3, np.float32), x])), dev.tensor(np.zeros(4 + 256, np.uint32),
                                                                                   np.uint32)
    for lo, want in zip((False, True), gru.split_halves(x)):
        k = ToHalf(dev, tx, ty, x.size, x_off=3, y_off=8, block_cols=cols, lo=lo)
        (y,) = run_ops(dev, [tx, ty], k.ops(), [ty])
        want = gru.block_halves(want.reshape(16, 32)) if cols else want
        np.testing.assert_array_equal(unpack_half(y, 8 + x.size)[8:], want)


@pytest.mark.parametrize("T,B,H,n_wg", [
    (3, 5, 64, 0),  # a dispatch per step, one lane fragment
    (3, 9, 160, 1),  # persistent, k-groups 2 fragments deep, partly empty
    (2, 20, 48, 1),  # two lane fragments a workgroup (each thread two gate outputs)
    (3, 32, 32, 0),  # two lane fragments, a dispatch per step
    (2, 40, 32, 1),  # two lane groups of 32, the second partly empty (lavapipe runs one workgroup at a time)
])
def test_split_forward_like_the_float32_twin(dev, T, B, H, n_wg):
    """The split forward (lane fragments of 16 lanes, two a workgroup), then the float32 streamed backward,
    against the fp32 twin with the GPU's h_prev and dGh forced (each step's arithmetic compared) at
    float32's tolerances; clamp hits exact, no barrier timeouts."""
    case = gru_parity.make_case(T, B, H)
    got = gru_parity.run_gru_gpu(dev, case, 0.02, persistent=(n_wg, n_wg), split=True)
    lane_frags = -(-min(B, 32) // 16)
    tiles = got["tiles"][0]
    assert tiles.split and tiles.lane_frags == lane_frags and tiles.lane_groups == -(-B // (16 * lane_frags))
    exp, _ = gru_parity.expected_gru(case, 0.02, forced=(got["hprev"], got["dgh"]))
    for k in ("o", "hprev", "save", "hT", "dgi", "dgh", "dh0"):
        np.testing.assert_allclose(got[k], exp[k], atol=gru_parity.FWD_ATOL, rtol=gru_parity.FWD_RTOL, err_msg=k)
    assert got["hits"] == exp["hits"] and got["sync_timeouts"] == 0


def test_split_needs_its_lo_parts(dev):
    """The lo parts carry what float16 drops: with them zeroed the same run is float16's (~1e-4 off)."""
    case = gru_parity.make_case(3, 5, 64)
    got = gru_parity.run_gru_gpu(dev, case, 0.0, split=True)
    exp, _ = gru_parity.expected_gru(case, 0.0, forced=(got["hprev"], got["dgh"]))
    assert np.abs(got["o"] - exp["o"]).max() < 1e-6
    case["p"]["weight_hh"] = case["p"]["weight_hh"].astype(np.float16).astype(np.float32)  # lo = 0
    half = gru_parity.run_gru_gpu(dev, case, 0.0, split=True)
    assert np.abs(half["o"] - exp["o"]).max() > 1e-5


def test_split_settings_and_refusals(dev, monkeypatch):
    """CATCHAT_STREAM32_SPLIT: on unless 0, a clear error otherwise; the split is a forward on tensor
    cores with a float16 W_hh copy and float32 saves; its tiles two lane fragments a workgroup."""
    monkeypatch.delenv(gru.SPLIT_ENV, raising=False)
    assert gru.stream_split()
    monkeypatch.setenv(gru.SPLIT_ENV, "0")
    assert not gru.stream_split()
    monkeypatch.setenv(gru.SPLIT_ENV, "1")
    assert gru.stream_split()
    monkeypatch.setenv(gru.SPLIT_ENV, "yes")
    with pytest.raises(UsageError, match=gru.SPLIT_ENV):
        gru.stream_split()
    assert gru.stream_tiles(32, 2048, False, split=True) == gru.StreamTiles(2, 16, gru.stream.SPLIT_DEPTH,
                                                                             flags=True, lane_groups=1, split=True)
    assert gru.stream_tiles(16, 2048, False, split=True).lane_frags == 1  # 16 lanes: one lane fragment
    monkeypatch.setenv(gru.stream.DEPTH_ENV, "6,4")  # the forward's depth set: the split's too
    assert gru.stream_tiles(32, 2048, False, split=True).depth == 6
    monkeypatch.delenv(gru.stream.DEPTH_ENV)
    with pytest.raises(ValueError, match="forward"):
        gru.stream_tiles(32, 2048, True, split=True)
    case = gru_parity.make_case(2, 3, 16)
    t = dev.tensor
    args = (dev, t(2 * 3 * 48), t(case["flat"]), t(2 * 3 * 16), t(6, np.uint32), t(4 * 3 * 16), t(4 * 3 * 16),
            t(2 * 3 * 64), t(2 * 3 * 16))
    with pytest.raises(ValueError, match="split writes float32 saves"):
        gru.GruForward(*args, T=2, B=3, H=16, w_off=0, b_off=0, coop=True, split=True, save_half=True,
                       w_half=t(2 * 3 * 16 * 16), hprev_off=0, o_off=3 * 16)
    # without a float16 copy: the register-resident split, which takes 16 x 16 resident tiles alone
    with pytest.raises(ValueError, match="resident tiles of 16 units x 16 lanes"):
        gru.GruForward(*args, T=2, B=3, H=16, w_off=0, b_off=0, split=True, hprev_off=0, o_off=3 * 16,
                       tiles=gru.ResidentTiles(8, 4, 1, 1, 4))
    with pytest.raises(ValueError, match="tensor-core forward"):
        gru.resident_defines(gru.ResidentTiles(16, 16, 2, 2, 4), 16, 64, 32, split=True)  # not coop


def test_resident_split_is_asked_for(dev, monkeypatch):
    """CATCHAT_RESIDENT_SPLIT: off unless 1, a clear error otherwise; where asked, a float32 program on
    cooperative matrices whose tensor-core forward plans 16 x 16 resident tiles takes it, within the shared
    memory its hi and lo h_prev need."""
    from catchat.vk.kernels.gru import plan as gru_plan

    tiles = gru.ResidentTiles(16, 16, 2, 2, 4)
    monkeypatch.setattr(gru_plan, "coopmat_runs", lambda d: True)
    monkeypatch.setattr(gru_plan, "plan_sweep", lambda d, B, H, backward, coop=False: gru.SweepPlan(tiles, 132, None))
    big = dataclasses.replace(dev, info=dataclasses.replace(dev.info, max_shared_memory_bytes=48 * 1024))
    monkeypatch.delenv(gru.RESIDENT_SPLIT_ENV, raising=False)  # unset: the default (off until measured)
    assert gru.resident_split_forward(big, 64, 512, "fp32") == gru_plan.RESIDENT_SPLIT_DEFAULT
    monkeypatch.setenv(gru.RESIDENT_SPLIT_ENV, "0")
    assert not gru.resident_split_forward(big, 64, 512, "fp32")
    monkeypatch.setenv(gru.RESIDENT_SPLIT_ENV, "1")
    assert gru.resident_split_forward(big, 64, 512, "fp32") and not gru.resident_split_forward(big, 64, 512, "fp16")
    assert gru.coop_shared_bytes(512, split=True) <= 48 * 1024 < gru.coop_shared_bytes(640, split=True)
    assert not gru.resident_split_forward(big, 64, 640, "fp32")  # its shared memory would not fit
    monkeypatch.setattr(gru_plan, "plan_sweep", lambda *a, **k: gru.SweepPlan((8, 8, 4, 1, 1, 64), 0, None))
    assert not gru.resident_split_forward(big, 64, 512, "fp32")  # tiled sweeps: no tensor-core kernel for them
    monkeypatch.setenv(gru.RESIDENT_SPLIT_ENV, "yes")
    with pytest.raises(UsageError, match=gru.RESIDENT_SPLIT_ENV):
        gru.resident_split_forward(big, 64, 512, "fp32")


@pytest.fixture
def split_program(monkeypatch):
    """Programs at fp32 plan the split forward whatever the device (a program plans it on a GPU with
    cooperative matrices unless CATCHAT_STREAM32_SPLIT=0), and the float32 streamed backward."""
    from catchat.vk.kernels.gru import plan as gru_plan

    monkeypatch.setattr(kernelsets, "stream_f32_sweep", lambda *a: True)
    monkeypatch.setattr(plan, "stream_f32_sweep", lambda *a: True)
    monkeypatch.setattr(gru_plan, "stream_f32_sweep", lambda *a: True)
    monkeypatch.setattr(gru_plan, "coopmat_runs", lambda dev: True)
    monkeypatch.setattr(gru_plan, "sweep_residency", lambda *a, **k: dataclasses.make_dataclass("R", ["ok"])(True))
    monkeypatch.setenv(gru.SPLIT_ENV, "1")


def test_program_trains_with_the_split_forward(dev, split_program):
    """A whole fp32 training step with the split forward and the float32 streamed backward against the
    fp32 twin at the model parity's fp32 tolerances (every check passes); the program's allocations
    match its plan; the split copy follows the parameters (hi and lo of each layer's W_hh)."""
    case_label, base, T, B, hp = model_parity.MODEL_CASES[0]
    spec = dataclasses.replace(base, hidden=32)
    results = model_parity.model_parity(dev, spec, T, B, hp, label=f"{case_label}, split forward")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    layout = ParamLayout(spec)
    before = dev.allocated_bytes
    prog = Program(dev, layout, T, B)
    assert all(k.split and k.coop and k.stream for k in prog.fwd.gru)
    assert all(layer.gru.stream_f32 for layer in prog.bwd.layers) and prog.fwd.w16 is None
    assert prog.sweep_products == "fp32 (the forward's from float16 splits on tensor cores)"
    assert dev.allocated_bytes - before == Program.planned_bytes(layout, T, B, True, dev)
    flat = np.random.default_rng(2).standard_normal(layout.total).astype(np.float32) * 0.1
    prog.set_params(flat)
    (w,) = run_ops(dev, [], [], [prog.fwd.w16_split])
    halves, n = unpack_half(w, 2 * w.size), 3 * spec.hidden ** 2
    for l in range(spec.layers):
        whh = flat[layout.offsets[f"layers.{l}.gru.weight_hh"]:][:n].reshape(3 * spec.hidden, spec.hidden)
        for part, want in enumerate(gru.split_halves(whh)):
            np.testing.assert_array_equal(halves[(2 * l + part) * n:][:n], gru.block_halves(want).ravel())


def test_shader_stats_builds_the_split_forwards(capsys, monkeypatch):
    """tools/shader_stats.py --split: the split forward's pipeline at a config's B and H (its registers where
    the driver reports statistics: a GPU run says whether two workgroups an SM fit); --resident-split the
    register-resident one's on the tensor-core forward's tiles (one workgroup here: CATCHAT_PERSISTENT=1)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("shader_stats", root / "tools" / "shader_stats.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(root / "configs" / "tiny.toml"), "--split", "--set", "model.hidden=64"]) == 0
    out = capsys.readouterr().out
    assert "gru_forward_stream (split)" in out and "lane_frags=2" in out and "256 threads" in out
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    assert mod.main([str(root / "configs" / "tiny.toml"), "--resident-split", "--set", "model.hidden=16",
                     "--set", "data.batch_lanes=16"]) == 0
    out = capsys.readouterr().out
    assert "gru_forward_resident (resident split) ResidentTiles(cols=16, lanes=16" in out and "512 threads" in out


def test_program_trains_with_the_resident_split_forward(dev, monkeypatch):
    """A whole fp32 training step with the register-resident forward from float16 splits (COOP with SPLIT,
    CATCHAT_RESIDENT_SPLIT=1; emulated fragments here) and the FMAs' resident backward against the fp32 twin
    at the model parity's fp32 tolerances. One workgroup a sweep (CATCHAT_PERSISTENT=1: lavapipe runs one at a
    time) at 16 lanes and 16 units, so both plan resident 16 x 16 tiles, as v3's do on a GPU."""
    from catchat.vk.kernels.gru import plan as gru_plan

    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    monkeypatch.setenv(gru.RESIDENT_SPLIT_ENV, "1")
    monkeypatch.setattr(gru_plan, "coopmat_runs", lambda d: True)  # where the split is asked for: a GPU's
    case_label, base, T, _, hp = model_parity.MODEL_CASES[0]
    spec, B = dataclasses.replace(base, hidden=16), 16
    results = model_parity.model_parity(dev, spec, T, B, hp, label=f"{case_label}, resident split forward")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    prog = Program(dev, ParamLayout(spec), T, B)
    assert all(k.split and k.coop and not k.stream and k.defines.get("SPLIT") and k.defines.get("EMU")
               for k in prog.fwd.gru)
    assert all(not layer.gru.coop and isinstance(layer.gru.tiles, gru.ResidentTiles) for layer in prog.bwd.layers)
    assert prog.sweep_products == "fp32 (the forward's from float16 splits on tensor cores)"
