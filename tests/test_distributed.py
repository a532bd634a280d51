"""Data parallelism over MPI (catchat/distributed.py, docs/distributed.md) on lavapipe: N ranks under
`mpiexec` against one process on the same global batch, with dropout, label smoothing, two
micro-batches and scheduled sampling on (the ranks draw with global lane indices), one set of run
files written by rank 0, a 2-rank run resumed by one process, and the faults: a rank that hangs, a
rank that dies, Ctrl-C on the launcher.

The MPI runs need mpiexec and mpi4py (`make setup` installs both into .venv: the MPICH wheels);
without them those tests are skipped, saying so."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat import distributed
from catchat.errors import UsageError
from catchat.run import checkpoint as ck

RTOL = 1e-5  # the bound on the relative loss difference, N ranks against one process
# N ranks' weights against one process's after the TOTAL steps of the test config (docs/distributed.md
# "Exactly what holds"): measured 1.2e-7 (2 ranks) and 1.3e-7 (3); float32 rounding, moved by Adam
WEIGHTS_ATOL = 1e-5
FP16_LOSS_RTOL = 1e-4  # distributed.exchange_dtype fp16 against fp32, per step (measured: 8e-7)


def _have_mpi4py() -> bool:
    return subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True).returncode == 0


MPIEXEC = distributed.find_mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None or not _have_mpi4py(),
                               reason="no mpiexec or no mpi4py in this environment (`make setup` installs both)")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
TOTAL = 12


# ------------------------------------------------------------------------------ pure parts
def test_lane_shares_are_contiguous_and_cover_every_lane():
    for B in range(1, 20):
        for N in range(1, B + 1):
            shares = [distributed.lane_share(B, N, r) for r in range(N)]
            assert shares[0][0] == 0 and shares[-1][1] == B
            assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
            sizes = [hi - lo for lo, hi in shares]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    with pytest.raises(UsageError, match="cannot be shared by 3 ranks"):
        distributed.lane_share(2, 3, 0)


def test_launcher_detection_and_device_choice():
    assert distributed.launched_size({}) == 1
    assert distributed.launched_size({"PMI_SIZE": "4"}) == 4
    assert distributed.launched_size({"OMPI_COMM_WORLD_SIZE": "8"}) == 8
    assert distributed.local_rank_env({"MPI_LOCALRANKID": "3"}) == 3
    assert distributed.local_rank_env({}) is None

    class D:
        def __init__(self, index, type):
            self.index, self.type = index, type

    devices = [D(0, "discrete GPU"), D(1, "cpu"), D(2, "discrete GPU")]
    assert [distributed.device_selector(None, r, devices) for r in range(3)] == ["0", "2", "0"]
    assert distributed.device_selector(None, 1, [D(0, "cpu")]) == "0"
    assert distributed.device_selector("3,1", 1, devices) == "1"
    assert distributed.device_selector("H200", 5, devices) == "H200"
    with pytest.raises(UsageError, match="CATCHAT_MPI_TIMEOUT"):
        distributed.timeout_from_env({"CATCHAT_MPI_TIMEOUT": "soon"})


def test_a_single_process_never_imports_mpi():
    """No launcher in the environment: init() is None and mpi4py stays unimported (a plain run needs no MPI)."""
    env = {k: v for k, v in ENV.items() if k not in distributed.SIZE_VARS}
    code = ("import sys; from catchat import distributed, train, cli; assert distributed.init() is None; "
            "assert 'mpi4py' not in sys.modules, 'imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------ runs
@pytest.fixture(scope="module")
def cfg_path(tmp_path_factory):
    from support import build_scene_corpus

    root = tmp_path_factory.mktemp("dp")
    corpus = build_scene_corpus(root)
    body = {  # dropout, smoothing, 2 micro-batches, scheduled sampling: every draw keyed by the global lane
        "model": {"hidden": 12, "layers": 2},
        "data": {"corpus": str(corpus), "batch_lanes": 4, "window": 16, "micro_batches": 2},
        "train": {"lr": 0.01, "total_steps": TOTAL, "dropout_hidden": 0.1, "dropout_embedding": 0.05,
                  "label_smoothing": 0.1, "seed": 3},
        "teacher_forcing": {"start": 0.7},
        "schedule": {"warmup_fraction": 0.25, "cooldown_fraction": 0.25, "lr_min": 0.001},
        "eval": {"eval_every_seqs": 32, "eval_windows": 2, "free_running": True, "sample_chars": 0},
        "checkpoint": {"checkpoint_every_seqs": 24, "keep_last": 2},
    }
    p = root / "dp.toml"
    p.write_text(cfgmod.resolved_toml(cfgmod.from_dict(body)))
    return p


def _train_args(cfg_path, run, *extra):
    return ["train", str(cfg_path), "--run-dir", str(run), *map(str, extra)]


def _train_cmd(cfg_path, run, *extra):
    return [sys.executable, "-m", "catchat", *_train_args(cfg_path, run, *extra)]


def _mpi(n, cmd, *, env=None, timeout=240):
    return subprocess.run([MPIEXEC, "-n", str(n), *cmd], capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **(env or {})})


def _on_rank(rank: int, assignment: str, cmd) -> list[str]:
    """`cmd` with an environment assignment on one rank only (MPICH's PMI_RANK, Open MPI's OMPI_COMM_WORLD_RANK)."""
    script = f'if [ "${{PMI_RANK:-$OMPI_COMM_WORLD_RANK}}" = {rank} ]; then export {assignment}; fi; exec "$@"'
    return ["sh", "-c", script, "sh", *cmd]


def _rows(run) -> list[dict]:
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _evals(run) -> list[dict]:
    return [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["event"] == "eval"]


def _assert_close_rows(rows, straight, first_step=1):
    assert [int(r["global_step"]) for r in rows] == list(range(first_step, first_step + len(rows)))
    ref = {int(r["global_step"]): r for r in straight}
    for r in rows:
        s = ref[int(r["global_step"])]
        assert r["valid_tokens"] == s["valid_tokens"]  # the global count, on every rank
        np.testing.assert_allclose(float(r["loss"]), float(s["loss"]), rtol=RTOL, err_msg=r["global_step"])
        np.testing.assert_allclose(float(r["grad_norm"]), float(s["grad_norm"]), rtol=1e-4, err_msg=r["global_step"])


@pytest.fixture(scope="module")
def rank_run(cfg_path, tmp_path_factory):
    """rank_run(n, *sets, env=...): the run dir of an n-rank run of the test config with `--set`s, run
    once per module (the tests compare the same runs)."""
    made = {}

    def run(ranks: int, *sets: str, env: dict | None = None) -> Path:
        key = (ranks, sets, tuple(sorted((env or {}).items())))
        if key not in made:
            path = tmp_path_factory.mktemp(f"ranks{ranks}") / "run"
            r = _mpi(ranks, _train_cmd(cfg_path, path, *(a for kv in sets for a in ("--set", kv))), env=env)
            assert r.returncode == 0, r.stdout + r.stderr
            made[key] = path
        return made[key]
    return run


def _end(run) -> dict:
    end = json.loads((run / "events.jsonl").read_text().splitlines()[-1])
    assert end["event"] == "end"
    return end


def _same_bits(a, b) -> bool:
    """The two runs' final checkpoints hold the same parameters, optimizer state and carry, bit for bit."""
    x, y = ck.load_checkpoint(a, with_optimizer=True), ck.load_checkpoint(b, with_optimizer=True)
    return all(np.array_equal(x.params[n].view(np.uint32), y.params[n].view(np.uint32)) for n in x.params) and all(
        np.array_equal(x.optimizer[n].view(np.uint32), y.optimizer[n].view(np.uint32)) for n in x.optimizer)


@pytest.fixture(scope="module")
def straight(cfg_path, tmp_path_factory):
    """The one-process run every multi-rank run is compared with."""
    run = tmp_path_factory.mktemp("straight") / "run"
    r = subprocess.run(_train_cmd(cfg_path, run), capture_output=True, text=True, env=ENV, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return run


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_reproduce_one_process(straight, rank_run, ranks):
    """2 ranks (even shares) and 3 (4 lanes as 2+1+1) against one process on the same global batch:
    the loss of every step within 1e-5, the evals too, the weights within WEIGHTS_ATOL; rank 0 alone
    wrote the run's files."""
    run = rank_run(ranks)
    rows = _rows(run)
    assert len(rows) == TOTAL
    _assert_close_rows(rows, _rows(straight))
    ev, ev1 = _evals(run), _evals(straight)
    assert [e["global_step"] for e in ev] == [e["global_step"] for e in ev1] and ev
    for a, b in zip(ev, ev1):
        assert a["n_valid"] == b["n_valid"]
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=RTOL)
        np.testing.assert_allclose(a["free_running"]["loss"], b["free_running"]["loss"], rtol=RTOL)
    # one set of files: the same names as one process writes, one header, one row per step
    names = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != ".lock")  # noqa: E731
    assert names(run) == names(straight)
    assert (run / "metrics.csv").read_text().count("global_step") == 1
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("start") == 1
    assert events[0]["distributed"]["ranks"] == ranks
    end = _end(run)["distributed"]
    assert end["exchange_ms_per_step"] > 0 and end["step_ms_per_step"] > 0 and end["overlap"] is True
    assert 0 < end["exposed_ms_per_step"] < end["step_ms_per_step"] and 0 < end["exchange_share"] < 1
    # the checkpoint holds every lane's state, equal to the one process's
    a, b = ck.load_checkpoint(straight, with_optimizer=True), ck.load_checkpoint(run, with_optimizer=True)
    assert b.optimizer["carry.h0"].shape == a.optimizer["carry.h0"].shape
    np.testing.assert_allclose(b.optimizer["carry.h0"], a.optimizer["carry.h0"], atol=1e-4)
    assert a.state["cursor"] == b.state["cursor"]
    for name in a.params:
        np.testing.assert_allclose(b.params[name], a.params[name], rtol=0, atol=WEIGHTS_ATOL, err_msg=name)


@needs_mpi
def test_overlap_fp16_and_by_host_exchanges(rank_run):
    """2 ranks: the exchange overlapping the backward (the default) and after it give the same bits,
    at fp32 and at fp16 on the wire; fp16's losses stay within FP16_LOSS_RTOL of fp32's; by host with
    two pretend hosts of one rank each makes the flat exchange's additions: the same bits."""
    on, off = rank_run(2), rank_run(2, "distributed.overlap=false")
    assert _same_bits(on, off)
    assert _end(off)["distributed"]["overlap"] is False
    half = rank_run(2, 'distributed.exchange_dtype="fp16"')
    assert _same_bits(half, rank_run(2, 'distributed.exchange_dtype="fp16"', "distributed.overlap=false"))
    assert _end(half)["distributed"]["exchange_dtype"] == "fp16" and not _same_bits(half, on)
    for a, b in zip(_rows(half), _rows(on)):
        np.testing.assert_allclose(float(a["loss"]), float(b["loss"]), rtol=FP16_LOSS_RTOL, err_msg=a["global_step"])
    hosts = rank_run(2, "distributed.hierarchical=true", env={"CATCHAT_MPI_FAKE_HOSTS": "2"})
    assert _end(hosts)["distributed"]["hierarchical"] is True and _same_bits(hosts, on)


@needs_mpi
@pytest.mark.parametrize("ranks,hosts", [(4, 2), (3, 1)])
def test_the_exchange_adds_in_its_documented_order(ranks, hosts):
    """Comm.sum_grads on vectors of known values (tests/exchange_ranks.py): flat and by host, float32
    bit for bit against numpy in the documented order, float16 within its rounding, an inf arriving
    as such, every rank holding the same bits; 4 ranks on 2 pretend hosts, and 3 on this one."""
    script = Path(__file__).resolve().parent / "exchange_ranks.py"
    r = _mpi(ranks, [sys.executable, str(script)], env={"CATCHAT_MPI_FAKE_HOSTS": str(hosts)}, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


@needs_mpi
def test_scaling_tool_runs_each_count_with_its_lanes(cfg_path, tmp_path):
    """tools/bench_scaling.py (docs/distributed.md "Measuring the scaling") on lavapipe: one plain process,
    then 2 ranks sharing the device, each with the config's 4 lanes (the run's batch 8); a row each, the
    first the baseline, the steps after the first counted, the exchange's share with several ranks only."""
    out = tmp_path / "scaling.json"
    tool = Path(__file__).resolve().parents[1] / "tools" / "bench_scaling.py"
    r = subprocess.run([sys.executable, str(tool), str(cfg_path), "--gpus", "1,2", "--steps", "3", "--share-device",
                        "--json", str(out)], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())
    assert [(row["gpus"], row["lanes_per_gpu"], row["steps"]) for row in rows] == [(1, 4, 2), (2, 4, 2)]
    assert rows[0]["efficiency"] == 1.0 and all(row["tokens_per_s"] > 0 for row in rows)
    assert rows[1]["tokens_per_s_per_gpu"] == pytest.approx(rows[1]["tokens_per_s"] / 2, rel=1e-3)
    assert rows[0]["exchange_share"] is None and rows[1]["exchange_share"] is not None
    assert "efficiency" in r.stdout.splitlines()[0]


@needs_mpi
def test_two_ranks_at_fp16_reproduce_one_process(cfg_path, tmp_path):
    """train.precision fp16 on 2 ranks against one process: the same losses, and the same loss scale
    (every rank unscales by the same S, and an overflow skips the step on all of them)."""
    runs = {n: tmp_path / f"run{n}" for n in (1, 2)}
    one = subprocess.run(_train_cmd(cfg_path, runs[1], "--precision", "fp16"), capture_output=True, text=True,
                         env=ENV, timeout=240)
    assert one.returncode == 0, one.stdout + one.stderr
    r = _mpi(2, _train_cmd(cfg_path, runs[2], "--precision", "fp16"))
    assert r.returncode == 0, r.stdout + r.stderr
    rows, straight = _rows(runs[2]), _rows(runs[1])
    assert len(rows) == TOTAL
    _assert_close_rows(rows, straight)
    assert [row["loss_scale"] for row in rows] == [row["loss_scale"] for row in straight] == ["65536"] * TOTAL
    assert ck.load_checkpoint(runs[2]).state["loss_scale"] == ck.load_checkpoint(runs[1]).state["loss_scale"]


@needs_mpi
def test_two_rank_run_resumed_by_one_process(cfg_path, straight, tmp_path):
    """A 2-rank run stopped after 7 steps continues in one process (and the other way round: one process
    stopped after 4, then 2 ranks to 7): the checkpoint holds every lane, so any rank count resumes it."""
    run = tmp_path / "run"
    r = subprocess.run(_train_cmd(cfg_path, run, "--stop-after-steps", 4), capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    r = _mpi(2, _train_cmd(cfg_path, run, "--resume", "--stop-after-steps", 3))
    assert r.returncode == 0, r.stdout + r.stderr
    assert ck.load_checkpoint(run).global_step == 7
    r = subprocess.run(_train_cmd(cfg_path, run, "--resume"), capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    _assert_close_rows(_rows(run), _rows(straight))


@needs_mpi
def test_a_rank_that_hangs_stops_the_others_with_one_line(cfg_path, tmp_path):
    """Rank 1 stops (SIGSTOP) before its 4th step: rank 0 waits CATCHAT_MPI_TIMEOUT seconds in the
    gradient exchange, says so in one line and exits 1; the last checkpoint stays loadable."""
    run = tmp_path / "run"
    started = time.monotonic()
    r = _mpi(2, _on_rank(1, "CATCHAT_CRASH_AT=train.step#4:STOP", _train_cmd(cfg_path, run)),
             env={"CATCHAT_MPI_TIMEOUT": "4"}, timeout=120)
    took = time.monotonic() - started
    assert r.returncode != 0, r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no answer from the other ranks for 4 s" in errors[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert took < 60
    ckpt = ck.load_checkpoint(run, with_optimizer=True)
    assert ckpt.global_step == 3  # checkpoint_every_seqs = 24: every 3 steps of 8 seqs
    end = json.loads((run / "events.jsonl").read_text().splitlines()[-1])
    assert end["event"] == "end" and end["reason"].startswith("failed: rank 0")


@needs_mpi
@pytest.mark.parametrize("how", ["error", "killed"])
def test_a_rank_that_dies_ends_the_run(cfg_path, tmp_path, how):
    """Rank 1 fails at its 5th step: with an error (the device lost) it says why in one line, tells
    rank 0 (which records the failure and stops with a "stopped:" line) and ends, even though its own
    process would linger at exit (an atexit sleep stands for a slow wind-down: threads, the driver);
    killed outright (SIGKILL), the launcher ends rank 0 at once. Either way the run ends well inside
    the timeout and its last checkpoint (step 3) stays loadable.
    Step 5, not 4: rank 1 starts step 5 only after step 4's gradient exchange, which rank 0 joins after
    writing step 3's checkpoint; at step 4 rank 0 could be ended in the middle of that write."""
    run = tmp_path / "run"
    if how == "error":
        fault = "CATCHAT_FAULT=device_lost@step=5"
        lingering = "import atexit, time; atexit.register(time.sleep, 300); from catchat.cli import main; main()"
        cmd = [sys.executable, "-c", lingering, *_train_args(cfg_path, run)]
    else:
        fault, cmd = "CATCHAT_CRASH_AT=train.step#5", _train_cmd(cfg_path, run)
    r = _mpi(2, _on_rank(1, fault, cmd), env={"CATCHAT_MPI_TIMEOUT": "300"}, timeout=240)
    assert r.returncode != 0, r.stdout  # ended by the fault, not by rank 0's 300 s deadline (timeout 240)
    assert "Traceback" not in r.stdout + r.stderr
    if how == "error":
        _assert_failure_reported(r, run)
    assert ck.load_checkpoint(run, with_optimizer=True).global_step == 3


def _assert_failure_reported(r, run) -> None:
    """Rank 1's device-lost line arrived once, rank 0 said it stopped for it, and the run's events
    end with it."""
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "device" in errors[0], r.stderr
    stopped = [line for line in r.stderr.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and stopped[0].startswith("stopped: rank 1 failed: ") and "device" in stopped[0], r.stderr
    end = json.loads((run / "events.jsonl").read_text().splitlines()[-1])
    assert end["event"] == "end" and end["reason"].startswith("failed: rank 1 failed: ") and "device" in end["reason"]


@needs_mpi
def test_a_failing_ranks_line_always_arrives(cfg_path, tmp_path):
    """The teardown as fast as it goes (no lingering exit, failure at the first step): the failing
    rank's one line reaches the launcher's output and the run's events every time (MPI_Abort lost it
    once in 40 runs: the launcher tore the job down before forwarding it)."""
    for attempt in range(4):
        run = tmp_path / f"run{attempt}"
        r = _mpi(2, _on_rank(1, "CATCHAT_FAULT=device_lost@step=1", _train_cmd(cfg_path, run)),
                 env={"CATCHAT_MPI_TIMEOUT": "300"}, timeout=240)
        assert r.returncode != 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
        _assert_failure_reported(r, run)


@needs_mpi
def test_ctrl_c_on_the_launcher_stops_every_rank_after_one_checkpoint(cfg_path, tmp_path):
    """SIGINT to mpiexec (it passes Ctrl-C to every rank): the ranks agree to stop after the same step,
    rank 0 writes one checkpoint, every rank exits 130; a 2-rank resume goes on from it."""
    run = tmp_path / "run"
    proc = subprocess.Popen([MPIEXEC, "-n", "2", *_train_cmd(cfg_path, run, "--set", "train.total_steps=400")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    deadline = time.time() + 120
    while not ((run / "metrics.csv").exists() and len((run / "metrics.csv").read_text().splitlines()) > 4):
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "training never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    interrupted = [e for e in events if e["event"] == "checkpoint" and e["reason"].startswith("interrupted")]
    assert len(interrupted) == 1
    step = ck.load_checkpoint(run, with_optimizer=True).global_step
    assert step == interrupted[0]["global_step"] == len(_rows(run))
    r = _mpi(2, _train_cmd(cfg_path, run, "--resume", "--stop-after-steps", 1))
    assert r.returncode == 0, r.stdout + r.stderr
    assert ck.load_checkpoint(run).global_step == step + 1
