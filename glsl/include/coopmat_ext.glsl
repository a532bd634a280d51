// The cooperative-matrix extension of a shader on include/sweep_frag.glsl's fragments, included where
// its #extension lines are: VK_KHR_cooperative_matrix with KHR (compiled by the newer glslc,
// catchat.vk.shaders), else VK_NV_cooperative_matrix (Debian 12's glslc).
#ifdef KHR
#extension GL_KHR_cooperative_matrix : require
#else
#extension GL_NV_cooperative_matrix : require
#endif
