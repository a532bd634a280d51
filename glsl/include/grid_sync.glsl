// A grid barrier for persistent sweeps: one dispatch runs many dependent steps, its workgroups
// meeting here between steps. Vulkan promises no forward progress across workgroups, so the
// host launches only workgroups that are co-resident (one per SM, or one on a CPU device), the
// spin is bounded, and a workgroup that gives up raises an abort flag that releases every other
// one and counts stats[ST_SYNC_TIMEOUTS] (the host turns that into an error).
// Words of the `sync` buffer (zero between dispatches: the last workgroup out resets them):
//   0 abort flag, 1 workgroups finished, 2 + g * GROUP_STRIDE arrivals of group g. A grid_sync waits
//   for every workgroup; a group_sync only for the n workgroups of one group (those whose data it reads).
// The includer declares the uint buffer `stats` and defines SYNC_BINDING (the sync words).
#ifndef CATCHAT_GRID_SYNC_GLSL
#define CATCHAT_GRID_SYNC_GLSL
#include "slots.glsl"

// volatile: every poll is a fresh (L2) load, not an atomic: 100+ pollers would queue on the atomic unit
layout(set = 0, binding = SYNC_BINDING) coherent volatile buffer Sync { uint sync_words[]; };  // [2 + groups]

#ifndef GROUP_STRIDE
#define GROUP_STRIDE 1u  // words between two groups' counts (the includer may spread them over cache lines)
#endif
uint group_word(uint g) { return 2u + g * GROUP_STRIDE; }

#ifndef SYNC_SPIN_LIMIT
#define SYNC_SPIN_LIMIT (1u << 22)  // polls (~1 us each) before a workgroup gives up
#endif

uint n_workgroups() { return gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumWorkGroups.z; }

#ifndef KFLAGS  // the group barrier (block flags below replace it)
shared bool sync_ok;

// A group barrier in two halves, so a workgroup can do work nobody waits for in between:
// group_arrive publishes this workgroup's buffer writes and counts its arrival; group_wait(k, ...)
// returns once the n workgroups of `group` have each arrived k times in this dispatch, false when
// aborted. Both uniform per workgroup. Writes before the arrive are visible to the group after
// the wait.
void group_arrive(uint group) {
    memoryBarrierBuffer();  // this invocation's writes reach device scope before the arrival
    barrier();
    if (gl_LocalInvocationIndex == 0u) atomicAdd(sync_words[group_word(group)], 1u);
}

bool group_wait(uint k, uint group, uint n) {
    if (gl_LocalInvocationIndex == 0u) {
        uint word = group_word(group), target = k * n;
        bool ok = true;
        for (uint spins = 0u; sync_words[word] < target; ++spins) {
            if (spins >= SYNC_SPIN_LIMIT || sync_words[0] != 0u) {
                ok = false;
                break;
            }
        }
        if (!ok && atomicExchange(sync_words[0], 1u) == 0u) atomicAdd(stats[ST_SYNC_TIMEOUTS], 1u);
        sync_ok = ok;
        memoryBarrierBuffer();
    }
    barrier();
    return sync_ok;
}

bool group_sync(uint k, uint group, uint n) {
    group_arrive(group);
    return group_wait(k, group, n);
}

// Every workgroup of the dispatch, k-th time.
bool grid_sync(uint k) { return group_sync(k, 0u, n_workgroups()); }

// grid_sync in its two halves (work nobody waits for goes in between). A workgroup must wait for
// crossing k before it arrives for k + 1: the count would otherwise reach k * n early.
void grid_arrive() { group_arrive(0u); }
bool grid_wait(uint k) { return group_wait(k, 0u, n_workgroups()); }
#endif

// Block flags instead of the grid barrier (KFLAGS; the streamed sweeps, glsl/gru_*_stream.comp): a
// step's product reads its A operand (the float16 shadow of h_prev or dGh) by k-groups, one per
// subgroup, each a run of 16-column blocks that few workgroups write. So a producer counts every
// block it has written into the word of the k-group that reads it (blocks_arrive: group_word of the
// k-group), and each subgroup waits for its own k-group's blocks alone (kgroup_wait), not for every
// workgroup: a subgroup whose blocks are ready multiplies while others still wait. No
// workgroup can write a step's blocks before every block of the step before was counted (its
// product needed all of them), so a count of k times the k-group's blocks means each was written
// k times. A wait that gives up raises the abort flag and counts the timeout, and every later wait
// returns at once: the sweep runs out with wrong numbers the host never uses (it reads the count
// and stops). No shared memory: the forward's `red` and its W_hh fragments fill 48 KB to the byte.
#ifdef KFLAGS
// This workgroup's buffer writes reach device scope, then invocation i < n counts one block into
// k-group groups[i]'s word. Uniform per workgroup.
void blocks_arrive(uvec3 groups, uint n) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex < n) atomicAdd(sync_words[group_word(groups[gl_LocalInvocationIndex])], 1u);
}

// Returns once k-group `group`'s word reaches `target`, or at once after an abort. Every invocation
// polls its own volatile reads (a subgroup's are one load of one address; no subgroup or workgroup
// barrier: any subgroup size works). Writes counted before the target are visible after. Spread the
// k-groups' words over cache lines (GROUP_STRIDE): a word's pollers are then one subgroup of every
// workgroup, as many as the grid barrier's word has. (On lavapipe, whose workgroups are not shown
// co-resident, plain volatile loads are hoisted out of the loop, as they are for the grid barrier.)
void kgroup_wait(uint target, uint group) {
    bool ok = true;
    for (uint spins = 0u; sync_words[group_word(group)] < target; ++spins) {
        if (spins >= SYNC_SPIN_LIMIT || sync_words[0] != 0u) {
            ok = false;
            break;
        }
    }
    if (!ok && atomicExchange(sync_words[0], 1u) == 0u) atomicAdd(stats[ST_SYNC_TIMEOUTS], 1u);
    memoryBarrierBuffer();
}
#endif

// A streamed sweep's wait for its step's A operand (crossing wait_k; 0: none) in subgroup kg's
// product: the grid barrier, or with KFLAGS the k-group's own blocks (k-fragments kg * kpg .., fewer
// in the last k-group, none past n_kf), counted in word group_base + kg (the lane group's k-groups
// follow each other). false: the grid barrier was aborted (with KFLAGS never: an aborted sweep runs
// out). Nothing to wait for without PERSISTENT.
bool operand_wait(uint wait_k, uint kg, uint n_kf, uint kpg, uint group_base) {
#if defined(PERSISTENT) && defined(KFLAGS)
    uint blocks = kg * kpg < n_kf ? min(kpg, n_kf - kg * kpg) : 0u;
    if (wait_k > 0u) kgroup_wait(wait_k * blocks, group_base + kg);
#elif defined(PERSISTENT)
    if (wait_k > 0u) return grid_wait(wait_k);
#endif
    return true;
}

// Call once at the end of a persistent dispatch that used groups 0..n_groups-1: the last
// workgroup out zeroes the sync words.
void grid_sync_done(uint n_groups) {
    barrier();
    if (gl_LocalInvocationIndex == 0u && atomicAdd(sync_words[1], 1u) + 1u == n_workgroups()) {
        atomicExchange(sync_words[0], 0u);
        atomicExchange(sync_words[1], 0u);
        for (uint g = 0u; g < n_groups; ++g) atomicExchange(sync_words[group_word(g)], 0u);
    }
}
#endif
