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
