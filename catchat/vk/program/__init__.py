"""The GPU program: every buffer of a model at one (T, B) shape, the kernels bound to them, and the
recorded sequences, driven from the host.

    plan.py        the buffer plan: each buffer once (dtype, shape, programs that need it), from
                   which both the allocation and `planned_bytes` are derived
    kernelsets.py  the kernels bound to the buffers, as typed sets (forward, backward, per-timestep)
    sequences.py   the op lists and recorded sequences (train step, eval, logits, per-timestep;
                   decode for issue 20)
    driver.py      `Program`: parameters, optimizer state and carry in and out, train_step,
                   eval_window / evaluate_windows, the hyper words of a step
"""

from catchat.vk.program.driver import Program, StepHyper, StepStats
from catchat.vk.program.plan import Buffers, Geometry, planned_bytes

__all__ = ["Buffers", "Geometry", "Program", "StepHyper", "StepStats", "planned_bytes"]
