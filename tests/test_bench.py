"""`catchat bench` (catchat/analysis/) runs on lavapipe at a small config, its profile covers the whole
micro-batch, --tune caches the fastest tiles the pickers then use; and the benchmark tools in tools/."""

import json
import math
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from catchat import config as cfgmod  # noqa: E402
from catchat.analysis import bench, bench_command, torch_twin, tuner  # noqa: E402
from catchat.model import ParamLayout  # noqa: E402
from catchat.vk.program import Program, decoder, sequences  # noqa: E402

from support import shared_spirv_cache  # noqa: E402


def small(layers: int = 2):
    return cfgmod.load(ROOT / "configs" / "tiny.toml",
                       ["model.hidden=12", f"model.layers={layers}", "data.window=6", "data.batch_lanes=3"])


def test_bench_measures_train_eval_memory_and_profile(dev):
    """A 1-step run gives every figure `catchat bench` prints. Its timings are not checked beyond being
    numbers (a token count over a measured interval is positive whatever the code does); the memory
    figure and the profile's groups are."""
    cfg = small()
    res = bench.bench_catchat(cfg, dev, steps=1, warmup=1, want_profile=True)
    timings = ("train_tokens_per_s", "step_ms", "forward_ms", "backward_ms", "optimizer_ms", "eval_tokens_per_s",
               "build_s")
    assert set(res) == {*timings, "device_bytes", "profile", "sweeps", "gemm_flop", "recording"}
    assert res["recording"] == dict(wavefront_forward=1, wavefront_backward=1, dw_hh_beside=False)  # the defaults
    assert bench_command.recording_line(dict(wavefront_forward=1, wavefront_backward=4, dw_hh_beside=True)) == (
        "recorded: forward layer by layer, backward a wavefront of 4 chunks over the layers; each layer's dW_hh "
        "beside the backward sweep below (CATCHAT_WAVEFRONT)")
    assert [k for k in timings if not math.isfinite(res[k])] == []
    # the footprint holds at least the four model-sized float32 buffers: params, grads, AdamW's m and v
    spec = cfgmod.model_spec(cfg)
    assert res["device_bytes"] >= 4 * 4 * ParamLayout(spec).total
    # every group of the recorded micro-batch, then of the optimizer's submit, timed once, in order, the
    # baseline submit taken off
    prog = Program(dev, ParamLayout(spec), cfg.data.window, cfg.data.batch_lanes)
    groups = bench.profile_groups(prog)
    opt = bench.optimizer_groups(prog)
    assert [(kind, name) for kind, name, _ in res["profile"]] == [(kind, name) for kind, name, _ in groups + opt]
    assert sum(len(ops) for _, _, ops in opt) == len(sequences.optimizer_ops(prog.fwd, prog.bwd))
    assert [name for _, name, _ in opt] == ["grad norm", "optimizer update", "spectral projection",
                                            "table0 and W_hh copies"]  # fp32: no unscale
    # each group is timed less an empty submit's time: the sweeps (dozens of dispatches) still cost more
    assert sum(ms for kind, _, ms in res["profile"] if kind == "sweep") > 0
    # the GEMM groups' operations (their TFLOP/s in the table): each product's 2 M N K
    assert set(res["gemm_flop"]) == {name for kind, name, _ in groups if kind == "gemm"}
    R, H, V = cfg.data.window * cfg.data.batch_lanes, cfg.model.hidden, spec.vocab_size
    assert res["gemm_flop"]["head"] == 2.0 * R * H * V and res["gemm_flop"]["head backward"] == 4.0 * R * H * V


def test_bench_tokens_have_a_texts_skew():
    """The bench's windows draw tokens and targets as a text's characters occur (Zipf over the
    vocabulary: the commonest ~19% of the rows, as a space ~16%), never the padding token 0; resets
    are kept."""
    import numpy as np

    rng = np.random.default_rng(1)
    shape = (1024, 64)
    resets = np.ones(shape, np.uint32)
    tokens, targets, kept = bench.text_like(rng, 101, np.zeros(shape, np.uint32), np.zeros(shape, np.uint32), resets)
    assert kept is resets and tokens.dtype == targets.dtype == np.uint32 and tokens.shape == targets.shape == shape
    for t in (tokens, targets):
        share = np.bincount(t.ravel(), minlength=101) / t.size
        assert share[0] == 0.0 and 0.17 < share[1] < 0.22 and 0.08 < share[2] < 0.11 and share[100] < 0.005


def test_profile_groups_are_the_micro_batch(dev):
    """Every dispatch of the recorded micro-batch (forward, loss, backward) is in exactly one group."""
    cfg = small(layers=3)
    prog = Program(dev, ParamLayout(cfgmod.model_spec(cfg)), cfg.data.window, cfg.data.batch_lanes)
    grouped = sum(len(ops) for _, _, ops in bench.profile_groups(prog))
    micro = len(sequences.forward_ops(prog.fwd)) + 2 + len(sequences.backward_ops(prog.bwd))  # + loss, reduction
    assert grouped == micro


SMALL = [str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=12", "--set", "data.window=6",
         "--set", "data.batch_lanes=3", "--steps", "1", "--warmup", "1"]


def test_catchat_bench_prints_every_figure_and_writes_json(cli, tmp_path, monkeypatch):
    """The command: the catchat row, the step split, how each sweep runs (and why), the profile,
    the JSON file; --compare-torch without torch (or without CUDA) says so in one line."""
    import json

    monkeypatch.setattr(torch_twin, "torch_status", lambda: (False, "torch is not importable (test)"))
    out = tmp_path / "b.json"
    code, text, err = cli("bench", *SMALL, "--profile", "--compare-torch", "--json", out)
    assert code == 0, err
    assert "catchat" in text and "train tok/s" in text and "step: forward" in text
    assert text.count("sweep L") == 4 and "a dispatch per step" in text
    assert "sum of groups" in text and "torch comparison skipped: torch is not importable (test)" in text
    assert "recorded: forward layer by layer, backward layer by layer (CATCHAT_WAVEFRONT)" in text
    res = json.loads(out.read_text())
    assert res["catchat"]["profile"] and len(res["catchat"]["sweeps"]) == 4
    assert res["torch_status"] == "torch is not importable (test)" and "torch" not in res
    assert res["env"]["CATCHAT_TUNE"] == "0"  # the switches the run was made under (conftest sets this one)
    set_here = next(line for line in text.splitlines() if line.startswith("set here: "))
    assert "CATCHAT_TUNE=0" in set_here  # with any switch the caller's shell sets beside it
    assert res["gemm_products"] == "fp32" and "precision=fp32 on " in text  # lavapipe: no tensor cores


def test_catchat_bench_precision(cli):
    """--precision fp16 benches the fp16 program (said in the header line); bf16 and unknown values are
    the config's one-line refusals."""
    code, text, err = cli("bench", *SMALL, "--steps", "1", "--warmup", "0", "--precision", "fp16")
    assert code == 0, err
    assert "precision=fp16" in text and "train tok/s" in text
    code, _, err = cli("bench", *SMALL, "--precision", "bf16")
    assert code == 2 and "bfloat16 cooperative matrices" in err and "use fp16" in err
    code, _, err = cli("bench", *SMALL, "--precision", "fp8")
    assert code == 2 and 'train.precision must be one of "fp32", "fp16", got "fp8"' in err


def test_catchat_bench_torch_rows(cli, monkeypatch):
    """With a usable torch: a row per mode (FP32, TF32, AMP fp16, AMP bf16) and its ratio; a mode
    that fails is a row that says why, and the others still run."""
    monkeypatch.setattr(torch_twin, "torch_status", lambda: (True, "torch 9 on a GPU"))
    calls = []

    def fake(cfg, steps, warmup, mode):
        calls.append(mode)
        if mode == "amp_bf16":
            raise RuntimeError("bf16 GRU not supported here")
        spread = dict(step_ms_min=35.0, step_ms_max=38.5) if mode == "tf32" else {}  # rows record their spread
        return dict(train_tokens_per_s=500.0, step_ms=36.0, eval_tokens_per_s=1000.0, device_bytes=2**30, **spread)

    monkeypatch.setattr(torch_twin, "bench_torch", fake)
    code, text, err = cli("bench", *SMALL, "--compare-torch")
    assert code == 0, err
    assert calls == ["fp32", "tf32", "amp_fp16", "amp_bf16"]
    for label in ("FP32 (TF32 off)", "TF32", "AMP fp16", "AMP bf16"):
        assert f"torch {label}" in text
    assert "RuntimeError: bf16 GRU not supported here" in text and "500" in text
    assert "36.0 (35.0-38.5)" in text


def _tiny_cfg():
    return cfgmod.load(ROOT / "configs" / "tiny.toml",
                       ["model.hidden=12", "data.window=6", "data.batch_lanes=3"])


def test_tune_caches_the_fastest_candidate_and_the_pickers_use_it(dev, tmp_path, monkeypatch):
    """Deterministic: a fake timer makes the 64x64 GEMM tile and the last per-step sweep candidate the
    fastest; the cache is written, read back, and a program built afterwards uses those tiles. A
    candidate within the noise margin of the tables' choice does not replace it."""
    import json

    from catchat.vk import tune as tunecache
    from catchat.vk.kernels import gemm, gru

    monkeypatch.setenv("CATCHAT_CACHE", str(shared_spirv_cache(tmp_path / "cache")))  # own tuning cache
    monkeypatch.delenv("CATCHAT_TUNE", raising=False)  # conftest's no_tuned_tiles: this test tunes
    monkeypatch.delenv("CATCHAT_PERSISTENT", raising=False)
    cfg = _tiny_cfg()
    spec = cfgmod.model_spec(cfg)
    before = Program(dev, ParamLayout(spec), 6, 3)
    assert before.fwd.rows.head.tiles == gemm.CPU_TILE
    fast_gemm, seen = gemm.GemmTiles(64, 64, 8, 4, 4), []

    def measure(kind, shape, tiles):
        seen.append((kind, shape))
        if kind == "gemm":
            return 1.0 if tiles == fast_gemm else 2.0
        cands = gru.sweep_candidates(dev, shape["B"], shape["H"], shape["backward"], shape["resident"])
        return 1.0 if tiles == cands[-1] else (1.01 if tiles == cands[0] else 3.0)

    rows, path = tuner.tune(cfg, dev, measure=measure)
    assert path.parent == tmp_path / "cache" / "tune" and path.exists()
    data = json.loads(path.read_text())
    assert data["device"] == dev.info.name and data["driver"] == dev.info.driver
    gemm_keys = [r.key for r in rows if r.kind == "gemm"]
    assert gemm_keys and all(data["gemm"][k] == list(fast_gemm) for k in gemm_keys)
    sweeps = [r for r in rows if r.kind == "gru"]
    assert {r.key for r in sweeps} == {"fwd/B3/H12/wg0", "bwd/B3/H12/wg0"}
    for r in sweeps:  # the last candidate is 1% faster than the tables' choice: within the margin
        assert r.winner == r.table and data["gru"][r.key] == gru.to_cache(r.table)
    # read back: the program's GEMMs take the cached tiles
    after = Program(dev, ParamLayout(spec), 6, 3)
    assert after.fwd.rows.head.tiles == fast_gemm and after.bwd.layers[1].dw_hh.tiles == fast_gemm
    assert tunecache.lookup(dev.info, "gemm", gemm_keys[0]) == list(fast_gemm)
    # a clear winner replaces the tables' choice
    measure2 = lambda kind, shape, tiles: (  # noqa: E731
        2.0 if kind == "gemm" else (1.0 if tiles == gru.sweep_candidates(dev, 3, 12, shape["backward"], 0)[-1]
                                    else 3.0))
    tuner.tune(cfg, dev, measure=measure2)
    last = gru.sweep_candidates(dev, 3, 12, False, 0)[-1]
    assert Program(dev, ParamLayout(spec), 6, 3).fwd.gru[0].tiles == last
    assert {k for k, _ in seen} == {"gemm", "gru"}


def test_tune_measures_for_real_and_a_corrupt_cache_is_only_a_warning(cli, tmp_path, monkeypatch):
    """`catchat bench --tune` on lavapipe measures every candidate (timings not checked), caches a
    choice per shape that is one of the candidates; a corrupt cache file afterwards is a warning
    and the tables' choice, never a traceback."""
    import json

    from catchat.analysis import bench_command
    from catchat.vk import tune as tunecache

    monkeypatch.setenv("CATCHAT_CACHE", str(shared_spirv_cache(tmp_path / "cache")))  # own tuning cache
    monkeypatch.delenv("CATCHAT_TUNE", raising=False)  # conftest's no_tuned_tiles: this test tunes
    # whatever the two steps' times on a loaded machine, the tuned tiles stay (the check has its own test)
    monkeypatch.setattr(bench_command, "STEP_MARGIN", float("inf"))
    tunecache._said.clear()
    code, text, err = cli("bench", *SMALL, "--tune")
    assert code == 0, err
    assert "tuned on" in text and "cached" in text
    path = next((tmp_path / "cache" / "tune").glob("*.json"))
    data = json.loads(path.read_text())
    assert data["gemm"] and data["gru"] and set(data["measured"]) == {f"{k}/{key}" for k in ("gemm", "gru")
                                                                      for key in data[k]}
    path.write_text("{ this is not json")
    code, text, err = cli("bench", *SMALL)
    assert code == 0 and "ignoring the tuning cache" in err and "Traceback" not in err + text


def test_sweep_phases_stamps_every_phase_of_the_resident_sweeps(dev, monkeypatch, capsys):
    """tools/sweep_phases.py: one workgroup holds a whole H=12 layer (register-resident on
    lavapipe with CATCHAT_PERSISTENT=1); every phase of both sweeps gets a clock reading, and the
    clocked forward twin computes what the program's own forward sweep does from the same buffers."""
    import sweep_phases

    from catchat.vk.kernels import run_ops

    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    cfg = cfgmod.load(ROOT / "configs" / "tiny.toml", ["model.hidden=12", "data.window=24", "data.batch_lanes=3"])
    prog, train_step, _ = bench.ready_program(cfg, dev)
    train_step()
    fwd, bwd, clocks = sweep_phases.clocked_twins(prog, 1, 24)
    before = run_ops(prog.dev, [], prog.fwd.gru[1].sweep_ops(), [prog.buffers.o[1], prog.buffers.save[1]])
    after = run_ops(prog.dev, [], fwd.sweep_ops(), [prog.buffers.o[1], prog.buffers.save[1], clocks[0]])
    for a, b in zip(before, after[:2]):
        assert (a == b).all()
    phases, step = sweep_phases.phase_cycles(after[2].reshape(24, 8), len(sweep_phases.FORWARD_PHASES))
    assert step > 0 and all(p > 0 for p in phases)
    assert sweep_phases.main([str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=12", "--steps", "16"]) == 0
    out = capsys.readouterr().out
    assert all(label in out for label in sweep_phases.FORWARD_PHASES + sweep_phases.BACKWARD_PHASES)


def test_bench_concurrency_times_each_group_alone_in_order_and_beside(dev, tmp_path, capsys):
    """tools/bench_concurrency.py: every pair of the step's groups timed alone, in order and side by
    side (kp patch 0007), a row each in the table and the JSON."""
    import bench_concurrency

    out_json = tmp_path / "c.json"
    assert bench_concurrency.main([str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=16", "--set",
                                   "data.window=8", "--set", "model.layers=3", "--reps", "1",
                                   "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["groups"] for r in rows] == ["backward sweeps, layers 2 and 1", "forward sweeps, layers 1 and 2",
                                           "layer 2's dW_hh beside layer 1's backward sweep",
                                           "forward sweeps of all 3 layers"]
    assert all(len(r["alone_ms"]) == len(r["workgroups"]) and r["ordered_ms"] > 0 and r["beside_ms"] > 0
               for r in rows) and rows[2]["workgroups"][1] > 0
    assert all(r["groups"] in out for r in rows) and "yes (kp patch 0007)" in out


def test_bench_gemm_times_every_shape_and_checks_each_candidate(capsys):
    """tools/bench_gemm.py: the program's tiles and a candidate at each of the step's GEMM shapes,
    every candidate computing what the program's tiles compute."""
    import bench_gemm

    assert bench_gemm.main([str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=12", "--set", "data.window=6",
                            "--set", "data.batch_lanes=3", "--tiles", "16,16,8,4,4", "--split-k", "2",
                            "--reps", "1"]) == 0
    out = capsys.readouterr().out
    for name in ("input projection", "input gradient", "weight gradient", "head"):
        assert f"{name}: [" in out
    assert out.count("(program's choice)") == 4 and "DIFFERS" not in out
    assert "split-K 2" in out and "skipped" not in out
    assert sum("GemmTiles(bm=16, bn=16" in line and "TFLOP/s" in line for line in out.splitlines()) >= 8


def test_bench_gemm_times_the_split_gemm_beside_gemm_comp(capsys):
    """--operands f32+split: gemm.comp's program tile and the split GEMM's (emulated fragments on lavapipe:
    one 64 x 64 tile, as --coop names) at each shape, each split row matching gemm.comp's product."""
    import bench_gemm

    assert bench_gemm.main([str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=16", "--set", "data.window=4",
                            "--set", "data.batch_lanes=4", "--operands", "f32+split", "--loads", "vec4",
                            "--tiles", "16,16,8,4,4", "--coop", "2,2,2,2,16,1", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "TFLOP/s" in line]
    assert out.count("(program's choice)") == 4 and "DIFFERS" not in out
    assert sum(" split vec4 loads" in line and "CoopTiles(wm=2, wn=2, fm=2, fn=2, bk=16" in line for line in rows) == 4


def test_shader_stats_creates_the_resident_pipelines(monkeypatch, capsys):
    """tools/shader_stats.py builds the resident sweeps' pipelines outside kp (with statistics
    capture where the driver has it; lavapipe does not); a broken shader is a clean error."""
    import pytest
    import shader_stats
    from pipeline_stats import compute_pipeline_statistics

    from catchat.errors import VulkanUnavailable

    monkeypatch.setenv("CATCHAT_PERSISTENT", "1")
    args = [str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=12", "--set", "data.batch_lanes=3",
            "--backward", "16,4,1,0,4,1", "--gemm"]
    assert shader_stats.main(args) == 0
    out = capsys.readouterr().out
    assert out.count("gru_backward_resident ResidentTiles") == 2 and "gru_forward_resident ResidentTiles" in out
    # the four GEMM shapes, each with vec4 loads (H = 12 keeps every operand aligned) and floats
    for name in ("input projection", "input gradient", "weight gradient", "head"):
        assert f"gemm, {name}: " in out
    assert out.count(" vec4 loads") == 4 and out.count(" float loads") == 4
    # each pipeline: an indented line per executable's statistics, or the note that there are none
    assert sum(line.startswith("  ") for line in out.splitlines()) >= 11
    with pytest.raises(VulkanUnavailable, match="vkCreate"):
        compute_pipeline_statistics(b"\x03\x02\x23\x07" + bytes(20), 1, 0)


def test_shader_stats_builds_the_decode_kernels_at_each_stream_tile(monkeypatch, capsys):
    """--decode: generation's layer pipelines at 8, 16 and 32 streams per tile (at 20 streams the 32 tile
    is the batch's power of two) and the head's (k parts: H = 12 is 3 vec4, a part each; 16 streams a
    workgroup); the user's CATCHAT_DECODE_TILE is left as it was."""
    import shader_stats

    monkeypatch.setenv("CATCHAT_DECODE_TILE", "4")
    args = [str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=12", "--decode", "--decode-batch", "20"]
    assert shader_stats.main(args) == 0
    out = capsys.readouterr().out
    for tile in (8, 16, 32):
        assert f"decode_layer, 20 streams: tile {tile}, " in out
    assert "decode_head, 20 streams: 3 k parts of 1, 16 streams a workgroup" in out
    assert os.environ["CATCHAT_DECODE_TILE"] == "4"


def test_shader_stats_builds_the_tensor_core_decode_layer_per_subgroup_count(monkeypatch, capsys):
    """--decode-coop SG,...: the tensor-core decode layer at at most 8 or 16 subgroups a workgroup; the user's
    variable is left as it was; a malformed list is refused by argparse (exit 2)."""
    import pytest
    import shader_stats

    monkeypatch.setenv("CATCHAT_DECODE_COOP_SUBGROUPS", "8")
    args = [str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=128", "--decode-batch", "40"]
    assert shader_stats.main([*args, "--decode-coop", "8,16"]) == 0
    out = capsys.readouterr().out
    layers = [line for line in out.splitlines() if line.startswith("decode_layer_coop, 40 streams: ")]
    # H = 128: 8 k fragments, 2 stream fragments a workgroup: 4 parts at 8 subgroups, 8 at 16
    assert [line.split(": ", 1)[1] for line in layers] == [
        "256 threads (8 subgroups at most), 4 k parts", "512 threads (16 subgroups at most), 8 k parts"], out
    assert os.environ["CATCHAT_DECODE_COOP_SUBGROUPS"] == "8"
    for bad in ("8:0", "12", "", "x"):
        with pytest.raises(SystemExit) as e:
            shader_stats.main([*args, "--decode-coop", bad])
        assert e.value.code == 2


# ------------------------------------------------------------------------- tools/bench_generate.py
def _bench_generate_args(*extra):
    return [str(ROOT / "configs" / "tiny.toml"), "--set", "model.hidden=16", "--set", "model.layers=2",
            "--warmup", "1", "--repeats", "1", *extra]


def test_bench_generate_streams_never_stop_early(dev, monkeypatch, tmp_path, capsys):
    """catchat generates through Generator.generate with random weights where <eos> can never win
    (bench_params), so every stream yields all its characters and chars/s counts B * steps; the
    first character's time is measured (and is within the whole generation's)."""
    import json

    import bench_generate

    monkeypatch.setattr(bench_generate, "open_device", lambda device=None: dev)
    out = tmp_path / "r.json"
    for tied in ("false", "true"):
        res = bench_generate.main(_bench_generate_args("--set", f"model.tie_embeddings={tied}", "--batches", "1,5",
                                                       "--steps", "40", "--json", str(out)))
        assert json.loads(out.read_text())["catchat"] == res["catchat"]
        for r in res["catchat"]:
            assert r["chars"] == 40 * r["batch"] and r["short_streams"] == 0
            lk = r["layer_kernel"]  # the fused step: batch 1 a stream tile of 1, batch 5 one tile of 8
            assert lk["tile"] == (1 if r["batch"] == 1 else 8) and lk["workgroups"] == lk["row_wgs"] >= 1
            assert 0 < r["first_char_ms"] <= r["step_ms"] * 40 and sum(r["device_us"].values()) > 0
    text = capsys.readouterr().out
    assert "batch 5, 40 per stream" in text and "chars/s" in text and "first char ms" in text
    assert "vs graph" not in text  # no torch asked for


def _fake_vulkan(monkeypatch, mod):
    from types import SimpleNamespace

    info = SimpleNamespace(name="fake", type="CPU", subgroup_size=8, compute_units=0)  # what the decode rule reads
    monkeypatch.setattr(mod, "open_device", lambda device=None: SimpleNamespace(info=info, runs_float16=False))


class _FakeGenerator:
    """Generator's public API as bench_generate uses it; records how it was made and called."""

    made: list = []
    decode: list = []  # CATCHAT_DECODE as each was made

    def __init__(self, dev, layout, flat, streams=1, prefill=64, chunk=None, precision="fp32"):
        import os

        self.streams, self.chunk = streams, chunk
        _FakeGenerator.made.append({"streams": streams, "chunk": chunk, **({"precision": precision}
                                                                          if precision != "fp32" else {})})
        _FakeGenerator.decode.append(os.environ.get("CATCHAT_DECODE"))

    def feed(self, ids):
        return None

    def reset(self):
        pass

    def profile(self):
        return {"layer 0": 1.0, "head + choice": 2.0}

    def layer_shape(self):
        return None

    def generate(self, prompt, length, sampling, seed=0, *, stop_at=(2,), on_tokens=None):
        import time

        import numpy as np

        assert list(prompt) == [1] and stop_at == () and sampling.temperature == 0.8
        time.sleep(0.02)  # the first character takes 20 ms, the rest nothing
        for k in range(0, length, 3):  # tokens come 3 steps at a time
            on_tokens(np.full((min(3, length - k), self.streams), 7))
        return [[7] * (length - b) for b in range(self.streams)]  # stream b stopped b early


def test_bench_generate_chunk_option_first_char_and_short_streams(monkeypatch, capsys):
    """--chunk reaches the Generator only when given; the first character is the first on_tokens
    call; chars/s counts the characters produced, and early stops are reported."""
    import bench_generate

    _fake_vulkan(monkeypatch, bench_generate)
    monkeypatch.setattr(bench_generate, "Generator", _FakeGenerator)
    monkeypatch.setattr(bench_generate, "bench_talk_reply", lambda *a, **k: {"first_char_ms": 1.0, "turns": 1})
    _FakeGenerator.made.clear()
    res = bench_generate.main(_bench_generate_args("--batches", "3", "--steps", "10"))
    assert _FakeGenerator.made == [{"streams": 3, "chunk": None}]
    c = res["catchat"][0]
    assert c["chars"] == 10 + 9 + 8 and c["short_streams"] == 2
    assert 20 <= c["first_char_ms"] < 20 + 0.5 * 1e3 and abs(c["chars_per_s"] * c["step_ms"] * 10 / 1e3 - 27) < 1e-6
    assert "2 streams stopped early" in capsys.readouterr().out
    _FakeGenerator.made.clear()
    bench_generate.main(_bench_generate_args("--batches", "2", "--steps", "4", "--chunk", "6"))
    assert _FakeGenerator.made == [{"streams": 2, "chunk": 6}]


def test_bench_generate_times_each_decode_step_asked_for(monkeypatch, capsys):
    """--decode fused,batched: a catchat row per decode step and batch, each Generator made with
    CATCHAT_DECODE set to its step (and the variable as it was afterwards); an unknown step is a
    usage error."""
    import os

    import bench_generate

    _fake_vulkan(monkeypatch, bench_generate)
    monkeypatch.setattr(bench_generate, "Generator", _FakeGenerator)
    monkeypatch.setattr(bench_generate, "bench_talk_reply", lambda *a, **k: {"first_char_ms": 1.0, "turns": 1})
    monkeypatch.delenv("CATCHAT_DECODE", raising=False)
    _FakeGenerator.decode.clear()
    res = bench_generate.main(_bench_generate_args("--batches", "2,4", "--steps", "3", "--decode", "fused,batched"))
    assert _FakeGenerator.decode == ["fused", "batched", "fused", "batched"] and "CATCHAT_DECODE" not in os.environ
    assert [(c["batch"], c["decode"]) for c in res["catchat"]] == [(2, "fused"), (2, "batched"), (4, "fused"),
                                                                  (4, "batched")]
    assert [r["variant"] for r in res["tables"][1]["rows"]] == ["catchat (fused)", "catchat (batched)"]
    assert "catchat (batched step)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_generate.main(_bench_generate_args("--batches", "2", "--decode", "fused,quick"))
    assert "--decode takes" in capsys.readouterr().err


def test_bench_generate_torch_rows_and_ratios_against_the_graph(monkeypatch, capsys):
    """The table: catchat, torch eager, eager + host copy and the CUDA graph, each row's chars/s and
    first-char time over the graph's; with --precision fp16 the Generator at fp16 and torch's model in
    float16, its rows named so; no graph off CUDA (a clear line says so); no torch at all: a clear
    line and catchat alone."""
    import bench_generate

    _fake_vulkan(monkeypatch, bench_generate)
    monkeypatch.setattr(bench_generate, "Generator", _FakeGenerator)
    monkeypatch.setattr(bench_generate, "bench_talk_reply", lambda *a, **k: {"first_char_ms": 1.0, "turns": 1})
    eager = dict(batch=2, steps=4, chars_per_s=400.0, step_ms=5.0, first_char_ms=6.0, chars_per_s_host_copy=200.0,
                 step_ms_host_copy=10.0, first_char_ms_host_copy=7.0)
    graph = dict(batch=2, steps=64, chunk=64, chars_per_s=800.0, step_ms=2.5, first_char_ms=60.0)
    calls = []
    monkeypatch.setattr(bench_generate, "bench_torch", lambda spec, B, *a: calls.append(("eager", B, a)) or eager)
    monkeypatch.setattr(bench_generate, "bench_torch_graph", lambda spec, B, *a: calls.append(("graph", B, a)) or graph)

    monkeypatch.setattr(bench_generate, "_torch_device", lambda want: ("cuda", "torch 9 on a GPU"))
    res = bench_generate.main(_bench_generate_args("--batches", "2", "--steps", "4", "--compare-torch",
                                                   "--graph-chunk", "64"))
    assert calls == [("eager", 2, (4, 1, "cuda", 1, False)), ("graph", 2, (4, 1, "cuda", 64, 1, False))]
    rows = {r["variant"]: r for r in res["tables"][0]["rows"]}
    assert list(rows) == ["catchat", "torch eager", "torch eager + host copy", "torch CUDA graph (64/replay)"]
    assert rows["torch eager"]["chars_per_s_vs_graph"] == 0.5
    assert rows["torch eager + host copy"]["first_char_vs_graph"] == 7 / 60
    assert rows["catchat"]["chars_per_s_vs_graph"] == res["catchat"][0]["chars_per_s"] / 800
    out = capsys.readouterr().out
    assert "chars/s vs graph" in out and "the graph ran 64 steps (whole chunks)" in out

    # --precision fp16: the Generator at fp16, PyTorch's model in float16 (half=True), rows named so
    calls.clear()
    _FakeGenerator.made.clear()
    monkeypatch.setattr(decoder, "coopmat_runs", lambda dev: False)
    res = bench_generate.main(_bench_generate_args("--batches", "2", "--steps", "4", "--compare-torch",
                                                   "--precision", "fp16"))
    assert calls[1][2][-1] is True and _FakeGenerator.made == [{"streams": 2, "chunk": None, "precision": "fp16"}]
    assert res["precision"] == "fp16"
    assert [r["variant"] for r in res["tables"][0]["rows"]][1:] == [
        "torch eager fp16", "torch eager + host copy fp16", "torch CUDA graph (64/replay) fp16"]
    capsys.readouterr()

    calls.clear()
    monkeypatch.setattr(bench_generate, "_torch_device", lambda want: ("cpu", "torch 9 on cpu"))
    res = bench_generate.main(_bench_generate_args("--batches", "2", "--steps", "4", "--compare-torch"))
    assert [c[:2] for c in calls] == [("eager", 2)] and "torch_graph" not in res
    assert "CUDA" in res["torch_graph_skipped"]
    out = capsys.readouterr().out
    assert "torch CUDA graph skipped" in out and "torch eager + host copy" in out and "vs graph" not in out

    monkeypatch.setattr(bench_generate, "_torch_device", lambda want: (None, "torch is not importable (x)"))
    res = bench_generate.main(_bench_generate_args("--batches", "2", "--steps", "4", "--compare-torch"))
    assert "torch" not in res and res["torch_skipped"] == "torch is not importable (x)"
    assert "torch comparison skipped: torch is not importable (x)" in capsys.readouterr().out


def test_results_table_puts_variants_side_by_side(tmp_path, capsys):
    """tools/results_table.py: a row per bench file in a folder (other JSON skipped), the ratio to a base
    file and to PyTorch's AMP bf16 row where present; an empty folder is an error (exit 2)."""
    import results_table

    def bench(name: str, tok: float, torch: dict | None = None) -> None:
        c = dict(train_tokens_per_s=tok, step_ms=65536 / tok * 1e3, forward_ms=10.0, backward_ms=20.0,
                 eval_tokens_per_s=2 * tok, device_bytes=2**30,
                 profile=[["sweep", "L0 forward sweep", 5.0], ["gemm", "head", 1.5], ["sweep", "L0 backward", 6.0]])
        c["recording"] = dict(wavefront_forward=1, wavefront_backward=8, dw_hh_beside=name == "overlap")
        (tmp_path / f"{name}.json").write_text(json.dumps(dict(catchat=c, torch=torch or {})))

    bench("nooverlap", 1_000_000.0)
    bench("overlap", 1_100_000.0, {"AMP bf16": {"train_tokens_per_s": 500_000.0}})
    (tmp_path / "other.json").write_text("[1, 2]")
    assert results_table.main([str(tmp_path), "--base", "nooverlap"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| nooverlap | wavefront 1/8 | 1,000,000 | 1.000 |  |")
    assert "| overlap | wavefront 1/8, dW_hh beside | 1,100,000 | 1.100 | 2.20 |" in lines[3]
    assert "| 11.0 | 1.5 | 2,200,000 | 1.00 |" in lines[3]
    assert results_table.main([str(tmp_path / "empty")]) == 2
