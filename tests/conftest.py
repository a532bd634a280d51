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
