// Reductions over a workgroup: each subgroup reduces its values, one partial per subgroup goes
// through shared memory, every thread gets the same result. Call in uniform control flow (they
// hold barriers); the second barrier lets the next call reuse the partials. The includer enables
// GL_KHR_shader_subgroup_arithmetic.
#ifndef CATCHAT_WG_REDUCE_GLSL
#define CATCHAT_WG_REDUCE_GLSL

shared float wg_red[gl_WorkGroupSize.x];   // one float partial per subgroup (at most WG subgroups)
shared uint wg_ured[gl_WorkGroupSize.x];   // one uint partial per subgroup

float wg_sum(float v) {
    float s = subgroupAdd(v);
    if (subgroupElect()) wg_red[gl_SubgroupID] = s;
    barrier();
    float total = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) total += wg_red[i];
    barrier();
    return total;
}

float wg_max(float v) {
    float s = subgroupMax(v);
    if (subgroupElect()) wg_red[gl_SubgroupID] = s;
    barrier();
    float m = wg_red[0];
    for (uint i = 1u; i < gl_NumSubgroups; ++i) m = max(m, wg_red[i]);
    barrier();
    return m;
}

uint wg_min_u(uint v) {
    uint s = subgroupMin(v);
    if (subgroupElect()) wg_ured[gl_SubgroupID] = s;
    barrier();
    uint m = wg_ured[0];
    for (uint i = 1u; i < gl_NumSubgroups; ++i) m = min(m, wg_ured[i]);
    barrier();
    return m;
}
#endif
