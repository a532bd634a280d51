// A grid barrier for persistent sweeps: one dispatch runs many dependent steps, its workgroups
// meeting here between steps. Vulkan promises no forward progress across workgroups, so the
// host launches only workgroups that are co-resident (one per SM, or one on a CPU device), the
// spin is bounded, and a workgroup that gives up raises an abort flag that releases every other
// one and counts stats[ST_SYNC_TIMEOUTS] (the host turns that into an error).
// Words of the `sync` buffer (zero between dispatches: the last workgroup out resets them):
//   0 arrivals, 1 abort flag, 2 workgroups finished.
// The includer declares the uint buffer `stats` and defines SYNC_BINDING (the sync words).
#ifndef CATCHAT_GRID_SYNC_GLSL
#define CATCHAT_GRID_SYNC_GLSL
#include "slots.glsl"

// volatile: every poll is a fresh (L2) load, not an atomic: 100+ pollers would queue on the atomic unit
layout(set = 0, binding = SYNC_BINDING) coherent volatile buffer Sync { uint sync_words[]; };  // [3]

#ifndef SYNC_SPIN_LIMIT
#define SYNC_SPIN_LIMIT (1u << 22)  // polls (~1 us each) before a workgroup gives up
#endif

shared bool sync_ok;

// Wait until every workgroup has arrived here k times in this dispatch; false when aborted.
// Uniform per workgroup. Buffer writes before it are visible to every workgroup after it.
bool grid_sync(uint k) {
    memoryBarrierBuffer();  // this invocation's writes reach device scope before the arrival
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        uint target = k * gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumWorkGroups.z;
        uint arrived = atomicAdd(sync_words[0], 1u) + 1u;
        bool ok = true;
        for (uint spins = 0u; arrived < target; ++spins) {
            if (spins >= SYNC_SPIN_LIMIT || sync_words[1] != 0u) {
                ok = false;
                break;
            }
            arrived = sync_words[0];
        }
        if (!ok && atomicExchange(sync_words[1], 1u) == 0u) atomicAdd(stats[ST_SYNC_TIMEOUTS], 1u);
        sync_ok = ok;
        memoryBarrierBuffer();
    }
    barrier();
    return sync_ok;
}

// Call once at the end of a persistent dispatch: the last workgroup out zeroes the sync words.
void grid_sync_done() {
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        uint n = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumWorkGroups.z;
        if (atomicAdd(sync_words[2], 1u) + 1u == n) {
            atomicExchange(sync_words[0], 0u);
            atomicExchange(sync_words[1], 0u);
            atomicExchange(sync_words[2], 0u);
        }
    }
}
#endif
