"""Vulkan layer: device, shader build, kernels and the recorded GPU program."""
