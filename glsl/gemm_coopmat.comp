#version 450
// glsl/include/gemm_coopmat.glsl on VK_NV_cooperative_matrix (Debian 12's glslc compiles it)
#include "gemm_coopmat.glsl"
