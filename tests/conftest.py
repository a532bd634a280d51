"""Shared fixtures. Tests run the real shaders on the default Vulkan device (lavapipe in CI).

A missing device fails the suite rather than skipping it: a skipped parity check is a defect.
"""

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


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty tuning cache of this test's own, read (CATCHAT_TUNE unset), notes printed afresh."""
    from catchat.vk import tune as tunecache
    from catchat.vk.kernels import gemm

    monkeypatch.setenv("CATCHAT_CACHE", str(tmp_path / "cache"))
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
