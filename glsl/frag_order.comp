#version 450
// A blocked float16 copy (ToHalf's 16 x 16 blocks, 512 contiguous bytes each) rewritten in its
// fragments' own order: block b's 256 halves become the 32 invocations' elements of the B operand
// fragment that loading b (column-major with COL, else row-major) gives, invocation i's 8 elements
// at 8 i .. 8 i + 7 of the block (element e as the driver numbers it). So a consumer gets a fragment
// with one 16-byte load an invocation, one coalesced run of 512 bytes a subgroup
// (include/sweep_frag.glsl's LOAD_B_FRAG), where loading a blocked fragment takes an invocation
// several narrower loads of scattered pairs. Which invocation holds which element is the driver's
// (VK_KHR_cooperative_matrix leaves it open): this shader asks the driver itself, by loading each
// block as that fragment type, so the copy and its consumer agree by construction wherever both
// run the same fragment type on subgroups of 32 (tools/coopmat_layout.py shows the mapping).
// EMU (emulated fragments, include/sweep_frag.glsl): invocation i of a virtual subgroup holds row
// i / 2, columns (i % 2) * 8 .. + 7 of the operand, so fragment order is the operand row-major:
// a row-major load's block as it was, a column-major load's block transposed.
// In place (src_off == dst_off) or into a region that does not overlap the source: each block is
// read whole by its subgroup before any of it is written. Offsets in halves, multiples of 256.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#ifndef EMU
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#include "coopmat_ext.glsl"
#endif

#ifndef COL
#define COL false
#endif

layout(local_size_x_id = 0) in;  // a multiple of 32
layout(set = 0, binding = 0) buffer W { float16_t w[]; };
#ifndef EMU
layout(set = 0, binding = 0) buffer WQ { uvec4 wq[]; };  // the same bytes, 8 halves a word
#endif
layout(push_constant) uniform Push { uint n_blocks, src_off, dst_off; } pc;

void main() {
    uint lane = gl_LocalInvocationIndex % 32u;
    uint sub = gl_WorkGroupID.x * (gl_WorkGroupSize.x / 32u) + gl_LocalInvocationIndex / 32u;
    uint subs = gl_NumWorkGroups.x * (gl_WorkGroupSize.x / 32u);
#ifdef EMU
    // every virtual subgroup walks the same number of rounds: the workgroup barrier between a round's
    // reads and its writes is in uniform control flow
    uint rounds = (pc.n_blocks + subs - 1u) / subs;
    for (uint round = 0u; round < rounds; ++round) {
        uint b = round * subs + sub;
        float16_t v[8];
        uint r = lane / 2u, c0 = (lane % 2u) * 8u;
        for (uint e = 0u; e < 8u; ++e) {
            uint c = c0 + e;
            v[e] = b < pc.n_blocks ? w[pc.src_off + b * 256u + (COL ? c * 16u + r : r * 16u + c)] : float16_t(0.0);
        }
        barrier();
        if (b < pc.n_blocks)
            for (uint e = 0u; e < 8u; ++e) w[pc.dst_off + b * 256u + lane * 8u + e] = v[e];
        barrier();
    }
#else
    for (uint b = sub; b < pc.n_blocks; b += subs) {
        CM_B m;
        CM_LOAD(m, w, pc.src_off + b * 256u, 16u, COL);
        subgroupMemoryBarrierBuffer();  // every invocation's reads of the block before any write to it
        subgroupBarrier();
        wq[pc.dst_off / 8u + b * 32u + lane] = CM_TO_WORDS(m);
    }
#endif
}
