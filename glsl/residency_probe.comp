#version 450
// tools/residency_probe.py: do `n` workgroups of this size, each holding SHARED_WORDS words of shared
// memory, all run at once? Each fills its shared array, meets every other at the grid barrier the
// persistent sweeps use (glsl/include/grid_sync.glsl, spin shortened) and writes 1 where the barrier
// held, 0 where it gave up (a workgroup that was not resident could not arrive). Vulkan exposes no
// per-SM shared memory or residency: the host's co-residency check assumes one 48 KB workgroup per
// SM, and this measures what the driver actually places (e.g. four 48 KB workgroups in a Hopper SM's
// 228 KB) before a kernel is designed around it.
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SHARED_WORDS = 1;  // 4-byte words of shared memory per workgroup

layout(set = 0, binding = 0) buffer Stats_ { uint stats[]; };  // stats[ST_SYNC_TIMEOUTS] counts give-ups
#define SYNC_BINDING 1
#define SYNC_SPIN_LIMIT (1u << 18)  // ~0.3 s: a probe that fails should fail fast
#include "grid_sync.glsl"
layout(set = 0, binding = 2) buffer Held_ { uint held[]; };  // [workgroups], zeroed: bit 0 the barrier held

layout(push_constant) uniform Push { uint stride; } pc;  // odd: every word of the array is written

shared uint words[SHARED_WORDS];

void main() {
    uint n = gl_WorkGroupSize.x, me = gl_LocalInvocationIndex;
    for (uint i = me; i < SHARED_WORDS; i += n) words[(i * pc.stride) % SHARED_WORDS] = gl_WorkGroupID.x + i;
    barrier();
    bool ok = grid_sync(1u);
    // each invocation reads back a word it wrote, so the compiler keeps the whole array (its size is
    // what is measured); bit 1 would say the array was not this workgroup's alone
    uint p = (me * pc.stride) % SHARED_WORDS;
    if (me < SHARED_WORDS && words[p] != gl_WorkGroupID.x + me) atomicOr(held[gl_WorkGroupID.x], 2u);
    if (me == 0u && ok) atomicOr(held[gl_WorkGroupID.x], 1u);
}
