// The float32 shadows of the streamed sweeps on the threads' FMAs (F32: glsl/gru_*_stream.comp
// with a float32 W_hh, for users who train at fp32): [2 parities][cols / 4][BP lanes] vec4s, a
// lane's 4 consecutive columns per vec4 and the lanes of a column quad side by side, so a
// subgroup's load of one quad for consecutive lanes reads whole 32-byte sectors (the shadows are
// coherent: their loads bypass L1, which would otherwise keep a sector's other half for the next
// quad). Element (lane b, column c) of parity p is component c % 4 of vec4 shadow_q(p, b, c, cols).
// BP (lanes, padded), the float32 W_hh `w4` (vec4s) and the push constants pc (w_off, H) are the
// includer's.
#ifndef CATCHAT_SWEEP_SIMT_GLSL
#define CATCHAT_SWEEP_SIMT_GLSL

uint shadow_q(uint p, uint b, uint c, uint cols) { return (p * (cols / 4u) + c / 4u) * BP + b; }

// Vec4 e (< 32) of the backward's chunk of W_hh from row quad q at columns k0 .. k0+15 (8 rows x 4
// vec4s): row 4 q + e / 4, columns k0 + 4 (e % 4) .. +3.
vec4 w_chunk_vec(uint e, uint q, uint k0) {
    return w4[pc.w_off / 4u + (4u * q + e / 4u) * (pc.H / 4u) + k0 / 4u + e % 4u];
}

// A k-group's stage (the backward's staged product) is its own subgroup's. SUBGROUP32 (subgroups of
// 32 consecutive invocations) syncs it with a subgroup barrier ordering shared memory alone (GLSL's
// subgroupBarrier, ordering every memory, measured the same on the H200 at v5: 64.5 against 64.4 us
// per backward step); else the workgroup's barrier (78.7). The includer enables
// GL_KHR_memory_scope_semantics.
#ifdef SUBGROUP32
#define KG_BARRIER() controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared, \
                                    gl_SemanticsAcquireRelease)
#else
#define KG_BARRIER() barrier()
#endif

// acc + x.x * w0 + x.y * w1 + x.z * w2 + x.w * w3, in that order (fused): four rows of W against
// one lane's four k.
vec4 fma4(vec4 x, vec4 w0, vec4 w1, vec4 w2, vec4 w3, vec4 acc) {
    return fma(vec4(x.w), w3, fma(vec4(x.z), w2, fma(vec4(x.y), w1, fma(vec4(x.x), w0, acc))));
}

// acc + dot(x, w) in k order (fused).
float fdot(vec4 x, vec4 w, float acc) { return fma(x.w, w.w, fma(x.z, w.z, fma(x.y, w.y, fma(x.x, w.x, acc)))); }

#endif
