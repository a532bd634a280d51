"""Fixtures of the kernel tests that force a program onto the streamed sweeps (lavapipe runs them with
emulated fragments): test_gru_stream.py (fp16) and test_gru_stream_f32.py (fp32, the k-split backward)."""

import pytest

from catchat.vk.kernels.gru import plan as gru_plan  # where program_products asks
from catchat.vk.program import kernelsets, plan


@pytest.fixture
def streamed(monkeypatch):
    """Programs plan the streamed sweeps at fp16 whatever the device (emulated fragments here): the
    buffer plan's sweep products, which the kernels and the float16 saves follow."""
    monkeypatch.setattr(gru_plan, "sweep_products", lambda dev, B, H, precision: "stream" if precision == "fp16"
                        else None)


@pytest.fixture
def float32_streamed(monkeypatch):
    """Programs plan the float32 streamed sweeps at fp32 whatever the device (a program plans them on a
    GPU only)."""
    monkeypatch.setattr(kernelsets, "stream_f32_sweep", lambda *a: True)
    monkeypatch.setattr(plan, "stream_f32_sweep", lambda *a: True)
