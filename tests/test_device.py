"""Device layer: selection, host views under numpy 1 and 2, push-constant packing, size checks, CLI."""

import gc

import numpy as np
import pytest

from catchat.errors import VulkanUnavailable
from catchat.vk import device as vkdev
from catchat.vk.probe import DeviceInfo, probe_devices

from support import catchat


def _info(i, name, kind):
    return DeviceInfo(i, name, kind, "x", "drv", "1.3", 2**27, 32768, 128, 1024, 32)


DEVICES = [_info(0, "llvmpipe (LLVM 15)", "CPU"), _info(1, "NVIDIA H200", "discrete GPU")]


def test_select_device_default_prefers_discrete():
    assert vkdev.select_device(DEVICES, None).index == 1
    assert vkdev.select_device(DEVICES[:1], "").index == 0


def test_select_device_by_index_and_name():
    assert vkdev.select_device(DEVICES, "0").index == 0
    assert vkdev.select_device(DEVICES, 1).index == 1
    assert vkdev.select_device(DEVICES, "h200").index == 1
    with pytest.raises(VulkanUnavailable, match="no Vulkan device with index 5"):
        vkdev.select_device(DEVICES, "5")
    with pytest.raises(VulkanUnavailable, match="contains 'radeon'"):
        vkdev.select_device(DEVICES, "radeon")
    with pytest.raises(VulkanUnavailable, match="found no device"):
        vkdev.select_device([], None)


def test_host_view_fixes_stride_zero_views():
    """Simulate the kp-under-numpy-2 bug: data() aliasing element 0 with stride 0."""
    backing = np.arange(8, dtype=np.float32)

    class FakeTensor:
        def data(self):
            return np.lib.stride_tricks.as_strided(backing, (8,), (0,), writeable=True)

        def size(self):
            return 8

    view = vkdev.host_view(FakeTensor())
    assert view.strides == (4,)
    assert list(view) == list(range(8))
    view[5] = 50.0
    assert backing[5] == 50.0


def test_host_view_on_real_tensor(dev):
    t = dev.tensor(np.arange(10, dtype=np.uint32), np.uint32)
    v = vkdev.host_view(t)
    assert v.dtype == np.uint32 and list(v) == list(range(10))
    v[3] = 99
    assert int(t.data()[3]) == 99


def test_kp_data_is_a_view_owned_by_the_tensor(dev):
    """tools/kp-patches/0003: Tensor.data() is a writable view of the host memory with the item size
    as stride (numpy 1 and 2), never a copy, and keeps its tensor alive."""
    assert getattr(dev.kp, "catchat_host_view", 0), "kp lacks the host-view patch: run `make setup`"
    t = dev.tensor(np.arange(10, dtype=np.uint32), np.uint32)
    a, b = t.data(), t.data()
    assert a.dtype == np.uint32 and a.shape == (10,) and a.strides == (4,)
    assert a.flags.writeable and not a.flags.owndata
    a[3] = 99
    assert int(b[3]) == 99 and np.shares_memory(a, b)
    view = dev.tensor(np.arange(6, dtype=np.float32)).data()  # the tensor's Python object is gone at once
    gc.collect()
    assert view.tolist() == list(range(6))
    with pytest.raises(RuntimeError, match="storage tensor has no host memory"):
        dev.tensor(4, kind="storage").data()


def test_pack_push_bits():
    words = vkdev.pack_push(5, 1.5, -1, np.float32(0.25))
    assert words.dtype == np.uint32
    assert words[0] == 5 and words[2] == 0xFFFFFFFF
    assert words[1:2].view(np.float32)[0] == 1.5 and words[3:4].view(np.float32)[0] == 0.25


def test_buffer_size_limit_is_checked(dev):
    with pytest.raises(VulkanUnavailable, match="exceeds this device's maximum storage buffer"):
        dev.check_buffer_size(dev.info.max_storage_buffer_bytes + 4, "activations")
    with pytest.raises(TypeError):
        dev.tensor(np.zeros(3, np.float64), np.float64)


def test_probe_reports_limits():
    infos = probe_devices()
    assert infos, "no Vulkan device: install mesa-vulkan-drivers"
    for d in infos:
        assert d.max_shared_memory_bytes >= 16384  # Vulkan's guaranteed minimum
        assert d.max_workgroup_invocations >= 128
        assert d.max_push_constant_bytes >= 128
        assert d.subgroup_size >= 1 and d.name
        # SMs come only from VK_NV_shader_sm_builtins; a CPU device has none (no persistent sweeps)
        assert d.compute_units >= 0 and (d.type != "CPU" or d.compute_units == 0)


def test_algorithm_guards(dev):
    t = dev.tensor(4)
    from catchat.vk.shaders import compile_shader

    with pytest.raises(ValueError, match="more than 32"):
        dev.algorithm([t] * 33, compile_shader("axpby"), [1])
    with pytest.raises(ValueError, match=">= 1"):
        dev.algorithm([t, t], compile_shader("axpby"), [0])


def test_cli_version_and_help():
    r = catchat("--version")
    assert r.returncode == 0 and "catchat" in r.stdout
    r = catchat("--help")
    assert r.returncode == 0 and "doctor" in r.stdout and "devices" in r.stdout


def test_cli_unknown_flag_is_an_error():
    r = catchat("doctor", "--temperature", "0.5")
    assert r.returncode == 2 and "No such option" in r.stderr


def test_cli_no_vulkan_driver_is_one_line_exit_2():
    bogus = {"VK_ICD_FILENAMES": "/nonexistent/icd.json", "VK_DRIVER_FILES": "/nonexistent/icd.json"}
    r = catchat("devices", env=bogus)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "mesa-vulkan-drivers" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2


def test_cli_doctor_passes_here():
    r = catchat("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "axpby max abs error" in r.stdout and "all checks passed" in r.stdout
    assert "float16 axpby max abs error" in r.stdout  # lavapipe offers float16 arithmetic and storage


def test_device_is_created_with_the_half_precision_features_it_offers(dev):
    """kp patch 0005: lavapipe (like the H200) offers float16/int8 arithmetic and 16/8-bit storage, so the device is
    created with them (and their extensions: the instance asks for Vulkan 1.1), and only with features
    it offers: the float16 axpby matches numpy's float16 arithmetic."""
    from catchat.cli.doctor import run_smoke_kernel
    from catchat.vk.kernels import Axpby

    assert getattr(dev.kp, "catchat_device_features", 0) == 1, "run `make setup` to build the patched kp"
    assert dev.runs_float16 and {"shaderInt8", "storageBuffer8BitAccess", "VK_KHR_shader_float16_int8"} <= dev.features
    assert run_smoke_kernel(dev, half=True) <= Axpby.HALF_ATOL
    if dev.info.type == "CPU":  # lavapipe (Mesa 22) has no cooperative matrices
        assert "cooperativeMatrixNV" not in dev.features and dev.coop_shapes == ()
    else:  # a GPU that has them reports their shapes
        assert ("cooperativeMatrixNV" in dev.features) == bool(dev.coop_shapes)


def test_cooperative_matrix_shapes_are_named_from_their_component_types():
    """kp patch 0005 reports [M, N, K, A, B, C, D] with VkComponentTypeNV values; the GEMM asks for
    its fragments by name."""
    from catchat.vk.device import coop_shape_name
    from catchat.vk.kernels.gemm import COOP_SHAPE

    assert coop_shape_name([16, 16, 16, 0, 0, 1, 1]) == COOP_SHAPE
    assert coop_shape_name([16, 8, 32, 3, 3, 5, 5]) == "16x8x32 s8*s8+s32->s32"
    assert coop_shape_name([8, 8, 8, 0, 0, 0, 42]) == "8x8x8 f16*f16+f16->type42"
