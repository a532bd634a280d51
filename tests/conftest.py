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
