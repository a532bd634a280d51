#version 450
// glsl/include/gemm_coopmat.glsl on VK_KHR_cooperative_matrix (the newer glslc: catchat.vk.shaders.NEWER_SHADERS)
#define KHR 1
#include "gemm_coopmat.glsl"
