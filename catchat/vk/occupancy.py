"""Co-residency: can every workgroup of a persistent dispatch be resident on the device at once?

A persistent sweep's workgroups meet at a software grid barrier between steps
(glsl/include/grid_sync.glsl). Vulkan promises no forward progress across workgroups: a workgroup
that is not yet running cannot arrive, so a barrier over more workgroups than fit the device at
once waits forever. Before a persistent dispatch is recorded, `co_residency` shows from the
device's limits that they all fit; where it cannot show it, the sweep runs one dispatch per step.

What is known and what is assumed (Vulkan exposes no per-SM limits at all):
- SMs and warps per SM: VK_NV_shader_sm_builtins (`DeviceInfo.compute_units`, `warps_per_cu`),
  NVIDIA only. No SM count: not shown (other vendors' drivers do not tell it to Vulkan).
- Threads per SM: at least warps per SM x subgroup size, and at least maxComputeWorkGroupInvocations
  (a workgroup of that size must run, on one SM).
- Shared memory per SM: not exposed. At least maxComputeSharedMemorySize (a workgroup using all
  of it must run on one SM), so floor(that / the kernel's bytes) workgroups fit by shared memory.
- Registers: not exposed. The register file is taken as 64K 32-bit registers per SM (every
  NVIDIA GPU since Kepler: the only vendor whose SM count is known), a thread's use as the
  kernel's estimate where it has one (the register-resident sweeps) or else NVIDIA's maximum of
  255, and one workgroup always fits (the compiler caps registers so that a workgroup of the
  declared size can launch, spilling if it must). So a count above one per SM is shown only for
  kernels with an estimate or small workgroups.
The runtime guard stays: the barrier's spin is bounded, a workgroup that gives up sets an abort
flag and counts stats[ST_SYNC_TIMEOUTS], and the host turns that into an error.
"""

from __future__ import annotations

from dataclasses import dataclass

REGISTER_FILE = 65536  # 32-bit registers per SM, NVIDIA since Kepler (assumed: Vulkan does not expose it)
MAX_REGISTERS_PER_THREAD = 255  # NVIDIA's per-thread maximum: the worst case for a kernel without an estimate


@dataclass(frozen=True)
class Residency:
    """Whether `workgroups` of one kernel are shown to be resident at once: `per_cu` of them fit
    an SM by threads, shared memory and registers, `capacity` = SMs x per_cu (0: unknown)."""

    workgroups: int
    per_cu: int
    capacity: int
    reason: str

    @property
    def ok(self) -> bool:
        return self.workgroups <= 1 or self.workgroups <= self.capacity


def co_residency(info, workgroups: int, threads: int, shared_bytes: int, registers: int = 0,
                 register_file: int = REGISTER_FILE) -> Residency:
    """Whether `workgroups` workgroups of `threads` threads, `shared_bytes` of shared memory and
    about `registers` registers per thread (0: unknown) all fit `info`'s device at once."""
    workgroups, threads = int(workgroups), max(1, int(threads))
    if workgroups <= 1:
        return Residency(workgroups, 1, 0, "a single workgroup needs no other to make progress")
    if info.type == "CPU":
        return Residency(workgroups, 0, 0, f"{info.type} device: its workgroups are not shown to run concurrently "
                                           "(lavapipe's could not hold a grid barrier)")
    cus = int(info.compute_units)
    if cus <= 0:
        return Residency(workgroups, 0, 0, "the driver does not report the SM count (VK_NV_shader_sm_builtins), "
                                           "so co-residency cannot be shown")
    sub = max(1, int(info.subgroup_size) or 32)
    per_cu_threads = max(int(info.warps_per_cu) * sub, int(info.max_workgroup_invocations))
    by_threads = per_cu_threads // (-(-threads // sub) * sub)
    by_shared = int(info.max_shared_memory_bytes) // shared_bytes if shared_bytes > 0 else by_threads
    by_registers = max(1, register_file // (threads * (registers or MAX_REGISTERS_PER_THREAD)))
    per_cu = max(0, min(by_threads, by_shared, by_registers))
    capacity = cus * per_cu
    limits = (f"{cus} SMs x {per_cu} per SM (threads {by_threads}, shared memory {by_shared}, "
              f"registers {by_registers}{'' if registers else ' assuming 255 per thread'})")
    if workgroups <= capacity:
        return Residency(workgroups, per_cu, capacity, f"{workgroups} workgroups co-resident: {limits}")
    return Residency(workgroups, per_cu, capacity, f"{workgroups} workgroups exceed the {capacity} shown "
                                                   f"co-resident: {limits}")
