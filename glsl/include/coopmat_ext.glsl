// The cooperative-matrix extension of a shader on 16 x 16 float16 fragments with float32 sums, included
// where its #extension lines are: VK_KHR_cooperative_matrix with KHR (compiled by the newer glslc,
// catchat.vk.shaders.needs_newer), else VK_NV_cooperative_matrix (Debian 12's glslc). Its types and
// operations on either extension: CM_A, CM_B (the product's A and B operands; one type on NV, which does
// not type a fragment's use), CM_ACC (float32 accumulators), CM_LOAD / CM_STORE (col: column-major) and
// CM_MULADD. include/sweep_frag.glsl builds the sweeps' fragments on them, include/gemm_coopmat.glsl the
// tensor-core GEMM's. CM_TO_WORDS / CM_FROM_WORDS: an invocation's 8 halves of a float16 fragment as one
// uvec4, in the order the driver numbers them (fragment order: glsl/frag_order.comp).
#ifndef CATCHAT_COOPMAT_EXT_GLSL
#define CATCHAT_COOPMAT_EXT_GLSL
#ifdef KHR
#extension GL_KHR_cooperative_matrix : require
#define CM_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define CM_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define CM_ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define CM_LAYOUT(col) ((col) ? gl_CooperativeMatrixLayoutColumnMajor : gl_CooperativeMatrixLayoutRowMajor)
#define CM_LOAD(m, arr, off, stride, col) coopMatLoad(m, arr, off, stride, CM_LAYOUT(col))
#define CM_STORE(m, arr, off, stride, col) coopMatStore(m, arr, off, stride, CM_LAYOUT(col))
#define CM_MULADD(a, b, c) coopMatMulAdd(a, b, c)
#else
#extension GL_NV_cooperative_matrix : require
#define CM_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define CM_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define CM_ACC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define CM_LOAD(m, arr, off, stride, col) coopMatLoadNV(m, arr, off, stride, col)
#define CM_STORE(m, arr, off, stride, col) coopMatStoreNV(m, arr, off, stride, col)
#define CM_MULADD(a, b, c) coopMatMulAddNV(a, b, c)
#endif
#define CM_TO_WORDS(m) uvec4(packFloat2x16(f16vec2(m[0], m[1])), packFloat2x16(f16vec2(m[2], m[3])), \
                             packFloat2x16(f16vec2(m[4], m[5])), packFloat2x16(f16vec2(m[6], m[7])))
#define CM_FROM_WORDS(m, words) { uvec4 q_ = (words); f16vec2 p_; \
    p_ = unpackFloat2x16(q_.x); m[0] = p_.x; m[1] = p_.y; p_ = unpackFloat2x16(q_.y); m[2] = p_.x; m[3] = p_.y; \
    p_ = unpackFloat2x16(q_.z); m[4] = p_.x; m[5] = p_.y; p_ = unpackFloat2x16(q_.w); m[6] = p_.x; m[7] = p_.y; }
#endif
