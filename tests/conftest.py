"""Shared fixtures. Tests run the real shaders on the default Vulkan device (lavapipe in CI).

A missing device fails the suite rather than skipping it: a skipped parity check is a defect.
"""

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def dev():
    """One open Vulkan device for the whole session (kp's Manager must outlive its objects)."""
    from catchat.vk.device import open_device

    return open_device()


@pytest.fixture(autouse=True)
def no_tuned_tiles(monkeypatch):
    """Tiles from the tables, never from a tuning cache the user may have written on this machine
    (`catchat bench --tune`); the tuning tests opt in with their own empty cache."""
    monkeypatch.setenv("CATCHAT_TUNE", "0")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def cli(dev, monkeypatch, capsys):
    """Run `catchat ARGS...` in this process on the session's device (optionally with text on stdin):
    returns (exit code, stdout, stderr)."""
    import io

    from catchat.cli import main

    monkeypatch.setattr("catchat.vk.device.open_device", lambda device=None: dev)

    def run(*args, stdin=None):
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err
    return run


# --------------------------------------------------------------- the exact run (test_faults, test_run_integrity,
# test_kill_anywhere): a 30-step run every stopped-and-resumed run must equal bitwise
@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    from support import build_scene_corpus

    return build_scene_corpus(tmp_path_factory.mktemp("scenes"))


@pytest.fixture(scope="session")
def cfg_path(corpus_dir, tmp_path_factory):
    from support import config_text

    p = tmp_path_factory.mktemp("cfg") / "exact.toml"
    p.write_text(config_text(corpus_dir))
    return p


@pytest.fixture(scope="session")
def straight(dev, cfg_path, tmp_path_factory):
    """The uninterrupted run (read only: tests copy nothing into it)."""
    from catchat import config as cfgmod
    from catchat.train import Trainer

    run = tmp_path_factory.mktemp("straight") / "run"
    with Trainer(cfgmod.load(cfg_path), run, dev) as t:
        assert t.run() == "done"
    return run


@pytest.fixture(scope="session")
def exact_run_at(dev, cfg_path, tmp_path_factory):
    """exact_run_at(steps, run): `run` becomes what `Trainer(exact config, run).run(stop_after_steps=steps)`
    leaves there (files already in `run` stay). The run is trained once a session and copied: the same
    files, the checkpoint events' paths made `run`'s (test_run_integrity, test_kill_anywhere)."""
    import shutil

    from catchat import config as cfgmod
    from catchat.train import Trainer

    made = {}

    def at(steps: int, run):
        if steps not in made:
            src = tmp_path_factory.mktemp(f"exact-at-{steps}-") / "run"
            with Trainer(cfgmod.load(cfg_path), src, dev) as t:
                t.run(stop_after_steps=steps)
            made[steps] = src
        src = made[steps]
        shutil.copytree(src, run, symlinks=True, dirs_exist_ok=True)
        events = run / "events.jsonl"
        events.write_text(events.read_text().replace(f'"{src}/', f'"{run}/').replace(f'"{src}"', f'"{run}"'))
        return run
    return at


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty tuning cache of this test's own, read (CATCHAT_TUNE unset), notes printed afresh; compiled
    SPIR-V from the suite's cache (support.shared_spirv_cache)."""
    from catchat.vk import tune as tunecache
    from catchat.vk.kernels import gemm

    from support import shared_spirv_cache

    monkeypatch.setenv("CATCHAT_CACHE", str(shared_spirv_cache(tmp_path / "cache")))
    monkeypatch.delenv(tunecache.ENV_TUNE, raising=False)
    monkeypatch.delenv(gemm.ENV_COOPMAT2, raising=False)
    monkeypatch.delenv(gemm.ENV_COOP_API, raising=False)
    tunecache._said.clear()
    return tmp_path / "cache" / "tune"


@pytest.fixture
def coop_dev(dev, monkeypatch, tmp_path):
    """lavapipe described as a GPU with cooperative matrices (the NV extension: no newer glslc), and
    programs built on it without recording their sequences (the kernels' pipelines are never made):
    the tuning tests'."""
    import dataclasses
    from types import SimpleNamespace

    from catchat.vk import shaders
    from catchat.vk.kernels import gemm
    from catchat.vk.program import driver

    monkeypatch.setenv(shaders.ENV_NEWER_GLSLC, str(tmp_path / "missing-glslc"))
    shaders.glslc_path.cache_clear()
    monkeypatch.setattr(driver, "sq", SimpleNamespace(
        record_forward=lambda *a: (None, None, None), record_train=lambda *a: (None, None),
        record_apply=lambda *a: None))
    monkeypatch.setattr(driver, "batched_ops", lambda *a: ([], None))
    fake = dataclasses.replace(dev, info=dataclasses.replace(dev.info, subgroup_size=32, max_shared_memory_bytes=49152),
                               features=dev.features | {"cooperativeMatrixNV"}, coop_shapes=(gemm.COOP_SHAPE,))
    assert gemm.coopmat_runs(fake) and gemm.coop_api(fake) == "nv" and not gemm.coopmat2_runs(fake)
    yield fake
    shaders.glslc_path.cache_clear()


# --------------------------------------------------------------- which worker takes which test, and when
# With `-n auto` on CI's 2 cores the suite's wall time is about half the sum of its tests' times, plus
# however long the last test a worker takes runs past the other's end (a 90 s test taken last adds up to
# 90 s). So under xdist the slow tests go first, longest first (seconds measured on lavapipe with both
# workers busy, 2026-12), and a worker takes the tests one at a time, in that order, so the many short
# ones fill in behind them. The tests of a group go to one worker together: they share a fixture too
# costly to make on both (the wheel, ~80 s; the MPI rank runs; a kill variant's straight run). An order
# only: every test runs, and a plain `pytest` keeps the files' order.
SLOW_TESTS = {
    "test_package.py": 180,  # the group: the wheel's build, then the whole parity from it
    "test_distributed.py": 95,
    "kernels/test_decode.py::test_parity": 59,
    "test_kill_anywhere.py::test_kill_anywhere_variants": 35,  # fp16 group, regularised group
    "test_kill_anywhere.py::test_fp16_loss_scale_moved_before_the_kill_is_restored": 30,
    "test_kill_anywhere.py::test_a_resume_that_lost_the_loss_scale_would_show": 30,
    "kernels/test_gru.py::test_parity": 19,
    "test_cli_output.py::test_parity_rows_whole_through_a_pipe": 18,
    "kernels/test_gemm.py::test_parity": 15,
    "test_time_budget.py::test_speedrun_tool_prints_a_row_per_variant_each_run_in_its_budget": 15,
    "test_checkpoint.py::test_inspect_in_a_loop_during_training_with_keep_last_1": 14,
    "test_train.py::test_training_learns": 14,
    "kernels/test_gemm_split.py::test_program_trains_with_split_gemms": 13,
    "test_coop_tune.py::test_catchat_bench_tune_with_precision_fp16": 13,
    "test_bench.py::test_tune_measures_for_real_and_a_corrupt_cache_is_only_a_warning": 12,
    "kernels/test_decode.py::test_coop_step_with_16_subgroups": 10,
    "test_bad_input.py::test_huge_text_file_streams_with_bounded_memory": 10,
    "test_time_budget.py::test_budgeted_resume_keeps_the_clock_and_a_finished_run_stays_finished": 9,
    "test_resume_plan.py::test_resume_keeps_the_recorded_plan_and_a_change_is_shown_logged_and_scanned": 8,
    "test_faults.py::test_sigint_at_a_random_moment_then_resume_is_bitwise_identical": 7,
    "test_signals_output.py::test_ctrl_c_at_any_moment_through_the_launcher": 7,
    "test_kill_anywhere.py::test_kill_anywhere": 6,
    "kernels/test_gru_stream_f32.py::test_ksplit_program_step_matches_the_plain_split": 6,
}
# Last, when the other worker has little or nothing left: a test whose cost grows with the machine's
# load. The tiny.toml budget run takes ~30 s where its first 4 steps take under half its 30 s budget,
# and ~90-120 s where they do not (on 2 busy cores: it runs again with 4x the budget).
LAST_TESTS = {"test_time_budget.py::test_tiny_with_a_time_budget_stops_in_time_and_resumes_with_what_is_left"}
GROUPS = {  # nodeid prefix -> group
    "tests/test_package.py::": "package",
    "tests/test_distributed.py::": "distributed",
    "tests/test_kill_anywhere.py::test_kill_anywhere_variants[fp16-": "kill-fp16",
    "tests/test_kill_anywhere.py::test_kill_anywhere_variants[regularised-": "kill-regularised",
    "tests/test_kill_anywhere.py::test_fp16_loss_scale_moved_before_the_kill_is_restored[": "kill-moved-scale",
    "tests/test_kill_anywhere.py::test_a_resume_that_lost_the_loss_scale_would_show": "kill-moved-scale",
}
TESTS_DIR = Path(__file__).resolve().parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """A worker's collection (every worker's the same): the slow tests first, longest first; LAST_TESTS last."""
    if not hasattr(config, "workerinput"):
        return

    def place(item) -> float:
        rel = item.path.resolve().relative_to(TESTS_DIR).as_posix()
        name = f"{rel}::{item.originalname}"
        return float("inf") if name in LAST_TESTS else -SLOW_TESTS.get(name, SLOW_TESTS.get(rel, 0))

    items.sort(key=place)  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """-n's default distribution (load) as one test at a time in the collection's order, a group's tests
    (GROUPS) as one unit: xdist's loadscope with those units. (--dist loadgroup would do it with
    xdist_group marks, but xdist 3.8 cannot rename pytest 9's node ids, so its marks are ignored.)"""
    if config.getvalue("dist") != "load":
        return None
    try:  # an xdist without this scheduler's hook: its own (the same tests, in its order)
        from xdist.scheduler import LoadScopeScheduling
    except ImportError:
        return None
    if not hasattr(LoadScopeScheduling, "_split_scope"):
        return None

    class OneAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((group for prefix, group in GROUPS.items() if nodeid.startswith(prefix)), nodeid)

    config.option.loadscopereorder = False  # units in the collection's order, not by their size
    return OneAtATime(config, log)
