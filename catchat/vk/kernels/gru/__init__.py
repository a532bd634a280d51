"""GRU recurrent sweeps: the kernels and how they are planned, one module per family.

    sweeps.py    GruForward, GruBackward: the sweep kernels (one dispatch per step, or one persistent
                 dispatch), the state-row layout, the shader a sweep runs
    tiled.py     tiles of the tiled shaders (W_hh streamed): defines, extent, shared memory, picker
    resident.py  tiles of the register-resident shaders (W_hh in registers), the tensor-core variant
    stream.py    the streamed sweeps' split (W_hh from memory: a float16 copy on tensor cores, or
                 float32 on the threads' FMAs: v5)
    plan.py      a sweep's plan: tuned or table tiles, persistent or per step (co-residency), coop

Every name is importable from `catchat.vk.kernels.gru`, as the program, parity, tests and tools use it.
"""

from catchat.vk.kernels import ceil_div, device_sms
from catchat.vk.kernels.gru.plan import (
    BIAS_ENV,
    COOP_ENV,
    RESIDENT_SPLIT_ENV,
    STREAM_F32_ENV,
    SweepPlan,
    backward_scratch_words,
    coop_sweeps,
    default_tiles,
    per_step_reason,
    persistent_override,
    plan_sweep,
    program_products,
    resident_split_forward,
    resident_workgroups,
    split_forward,
    stream_f32_sweep,
    stream_sweeps,
    streams_backward,
    streams_forward,
    streams_in_halves,
    sweep_bias_sums,
    sweep_candidates,
    sweep_products,
    sweep_residency,
    sweep_workgroups,
    sync_words,
    table_tiles,
    tile_count,
    tile_row,
    tiled_tiles,
    to_cache,
)
from catchat.vk.kernels.gru.resident import (
    COOP_THREADS,
    COOP_UNITS,
    REGISTER_FILE,
    RESIDENT_BACKWARD_TILES,
    RESIDENT_FORWARD_TILES,
    ResidentTiles,
    coop_shared_bytes,
    coop_tiles_ok,
    next_pow2,
    partial_words,
    pick_resident_tiles,
    resident_backward,
    resident_candidate,
    resident_defines,
    resident_fits,
    resident_registers,
    resident_resources,
    resident_shape,
    shuffle_slices,
)
from catchat.vk.kernels.gru.stream import (
    BLOCKED_ENV,
    DEPTH_ENV,
    FLAGS_ENV,
    FRAG_W_ENV,
    KSPLIT_ENV,
    PROBE_ENV,
    RESIDENT_ENV,
    SHARED_ENV,
    SPLIT_ENV,
    STREAM_MAX_LANES,
    STREAM_UNITS,
    W16_ALIGN,
    StreamTiles,
    block_halves,
    ksplit_ok,
    split_halves,
    stream_flags,
    stream_ok,
    stream_split,
    stream_tiles,
    w16_blocked,
    w_frag_order,
)
from catchat.vk.kernels.gru.sweeps import (
    GruBackward,
    GruForward,
    state_rows,
    sweep_shader,
)
from catchat.vk.kernels.gru.tiled import (
    BACKWARD_TILES,
    FORWARD_TILES,
    PERSISTENT_BACKWARD_TILES,
    PERSISTENT_FORWARD_TILES,
    _check_tiles,
    n_workgroups,
    pick_tiles,
    shader_defines,
    shared_bytes,
    tile_extent,
)

__all__ = [
    "BACKWARD_TILES", "BIAS_ENV", "BLOCKED_ENV", "COOP_ENV", "COOP_THREADS", "COOP_UNITS", "DEPTH_ENV", "FLAGS_ENV",
    "FRAG_W_ENV",
    "FORWARD_TILES", "KSPLIT_ENV", "GruBackward", "GruForward", "PERSISTENT_BACKWARD_TILES", "PERSISTENT_FORWARD_TILES",
    "PROBE_ENV",
    "REGISTER_FILE",
    "RESIDENT_BACKWARD_TILES", "RESIDENT_FORWARD_TILES", "ResidentTiles", "RESIDENT_ENV", "RESIDENT_SPLIT_ENV",
    "SHARED_ENV",
    "SPLIT_ENV", "STREAM_F32_ENV",
    "STREAM_MAX_LANES", "STREAM_UNITS", "StreamTiles", "SweepPlan", "W16_ALIGN", "_check_tiles",
    "backward_scratch_words", "block_halves", "ceil_div", "coop_shared_bytes", "coop_sweeps", "coop_tiles_ok",
    "default_tiles", "device_sms", "ksplit_ok", "n_workgroups", "next_pow2", "partial_words", "per_step_reason",
    "persistent_override", "pick_resident_tiles", "pick_tiles", "plan_sweep", "program_products", "resident_backward",
    "resident_candidate", "resident_defines", "resident_fits", "resident_registers", "resident_resources",
    "resident_shape", "resident_workgroups", "shader_defines", "shared_bytes", "shuffle_slices", "split_forward",
    "resident_split_forward", "split_halves", "state_rows", "sweep_bias_sums",
    "stream_f32_sweep", "stream_flags", "stream_ok", "stream_split", "stream_sweeps",
    "stream_tiles", "streams_backward", "streams_forward", "streams_in_halves",
    "sweep_candidates", "sweep_products",
    "sweep_residency", "sweep_shader", "sweep_workgroups", "sync_words", "table_tiles", "tile_count", "tile_extent",
    "tile_row", "tiled_tiles", "to_cache", "w16_blocked", "w_frag_order",
]
