// The lane split of generation's decode kernels (decode_layer.comp, decode_head.comp with
// UNIT_PER_LANE; catchat/vk/kernels/decode.py `lane_shape`): a lane owns one row (a unit, or a
// vocabulary row), and a workgroup is KS x TS subgroups of SUB lanes: TS stream tiles, each summed
// over k by KS subgroups (subgroup ks takes every KS-th k step). The includer defines LANE_SUMS, the
// floats a lane sums per stream tile; the splits past the first leave theirs in shared memory, and
// the first adds them to its own in split order (`split_put`, barrier(), `split_total`).
#ifndef CATCHAT_LANE_SPLIT_GLSL
#define CATCHAT_LANE_SPLIT_GLSL

layout(constant_id = 4) const uint KS = 1;   // subgroups over k per stream tile
layout(constant_id = 5) const uint TS = 1;   // stream tiles per workgroup
layout(constant_id = 6) const uint SUB = 32; // lanes per subgroup (the device's subgroup size)

// quantity q of the splits past the first, one slot per lane of those subgroups: part[q * NP + slot]
const uint NP = (KS > 1u ? KS - 1u : 1u) * TS * SUB;
shared float part[LANE_SUMS * NP];

uint split_k() { return gl_SubgroupID % KS; }       // this subgroup's k split
uint split_tile() { return gl_SubgroupID / KS; }    // and its stream tile in the workgroup

uint split_slot(uint r) { return (split_tile() * (KS - 1u) + r - 1u) * SUB + gl_SubgroupInvocationID; }

// a split past the first leaves its quantity q
void split_put(uint q, float v) { part[q * NP + split_slot(split_k())] = v; }

// the first split: v plus the other splits' quantity q, in split order (after barrier())
float split_total(uint q, float v) {
    for (uint r = 1u; r < KS; ++r) v += part[q * NP + split_slot(r)];
    return v;
}
#endif
