"""What the driver's compiler made of a compute shader: registers, spills, sizes (ctypes).

kp does not expose VK_KHR_pipeline_executable_properties, so this module creates its own device
and a compute pipeline for given SPIR-V (storage buffers at bindings 0..n-1, a push-constant block,
uint32 specialization constants 0..k-1) with VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR and
reads the statistics of each executable (the register count is what tools/shader_stats.py is
for; NVIDIA's driver reports Register Count, Binary Size, Stack Size, Local Memory Size (a
meaningless 2^36 on the H200) and Shared Memory Size). lavapipe has no such extension: the
pipeline is still created (the shader is checked) and no statistics come back.
"""

from __future__ import annotations

import ctypes

from catchat.errors import VulkanUnavailable
from catchat.vk.probe import device_extensions, physical_devices

EXTENSION = b"VK_KHR_pipeline_executable_properties"
_CAPTURE_STATISTICS = 0x40  # VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR
_COMPUTE_STAGE = 0x20  # VK_SHADER_STAGE_COMPUTE_BIT
_STORAGE_BUFFER = 7  # VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
_ST_QUEUE, _ST_DEVICE, _ST_MODULE, _ST_STAGE, _ST_COMPUTE, _ST_LAYOUT, _ST_SET_LAYOUT = 2, 3, 16, 18, 29, 30, 32
_ST_FEATURES, _ST_PIPELINE_INFO, _ST_EXEC_PROPS, _ST_EXEC_INFO, _ST_STAT = (1000269000, 1000269001, 1000269002,
                                                                          1000269003, 1000269004)
_P = ctypes.c_void_p


class _QueueInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("flags", ctypes.c_uint32), ("family", ctypes.c_uint32),
                ("count", ctypes.c_uint32), ("priorities", ctypes.POINTER(ctypes.c_float))]


class _DeviceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("flags", ctypes.c_uint32),
                ("queueCount", ctypes.c_uint32), ("pQueues", ctypes.POINTER(_QueueInfo)),
                ("layerCount", ctypes.c_uint32), ("ppLayers", _P), ("extensionCount", ctypes.c_uint32),
                ("ppExtensions", ctypes.POINTER(ctypes.c_char_p)), ("pFeatures", _P)]


class _Features(ctypes.Structure):  # VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("pipelineExecutableInfo", ctypes.c_uint32)]


class _ModuleInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("flags", ctypes.c_uint32), ("codeSize", ctypes.c_size_t),
                ("pCode", _P)]


class _Binding(ctypes.Structure):
    _fields_ = [("binding", ctypes.c_uint32), ("type", ctypes.c_uint32), ("count", ctypes.c_uint32),
                ("stages", ctypes.c_uint32), ("pSamplers", _P)]


class _SetLayoutInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("flags", ctypes.c_uint32),
                ("bindingCount", ctypes.c_uint32), ("pBindings", ctypes.POINTER(_Binding))]


class _PushRange(ctypes.Structure):
    _fields_ = [("stages", ctypes.c_uint32), ("offset", ctypes.c_uint32), ("size", ctypes.c_uint32)]


class _LayoutInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("flags", ctypes.c_uint32),
                ("setLayoutCount", ctypes.c_uint32), ("pSetLayouts", ctypes.POINTER(_P)),
                ("pushRangeCount", ctypes.c_uint32), ("pPushRanges", ctypes.POINTER(_PushRange))]


class _MapEntry(ctypes.Structure):
    _fields_ = [("constantID", ctypes.c_uint32), ("offset", ctypes.c_uint32), ("size", ctypes.c_size_t)]


class _SpecInfo(ctypes.Structure):
    _fields_ = [("entryCount", ctypes.c_uint32), ("pEntries", ctypes.POINTER(_MapEntry)),
                ("dataSize", ctypes.c_size_t), ("pData", _P)]


class _StageInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("flags", ctypes.c_uint32), ("stage", ctypes.c_uint32),
                ("module", _P), ("pName", ctypes.c_char_p), ("pSpec", ctypes.POINTER(_SpecInfo))]


class _ComputeInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("flags", ctypes.c_uint32), ("stage", _StageInfo),
                ("layout", _P), ("basePipeline", _P), ("basePipelineIndex", ctypes.c_int32)]


class _PipelineInfo(ctypes.Structure):  # VkPipelineInfoKHR
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("pipeline", _P)]


class _ExecProps(ctypes.Structure):  # VkPipelineExecutablePropertiesKHR
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("stages", ctypes.c_uint32), ("name", ctypes.c_char * 256),
                ("description", ctypes.c_char * 256), ("subgroupSize", ctypes.c_uint32)]


class _ExecInfo(ctypes.Structure):  # VkPipelineExecutableInfoKHR
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("pipeline", _P), ("executableIndex", ctypes.c_uint32)]


class _StatValue(ctypes.Union):
    _fields_ = [("b32", ctypes.c_uint32), ("i64", ctypes.c_int64), ("u64", ctypes.c_uint64), ("f64", ctypes.c_double)]


class _Stat(ctypes.Structure):  # VkPipelineExecutableStatisticKHR
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", _P), ("name", ctypes.c_char * 256),
                ("description", ctypes.c_char * 256), ("format", ctypes.c_uint32), ("value", _StatValue)]


def _check(result: int, what: str) -> None:
    if result != 0:
        raise VulkanUnavailable(f"{what} failed (VkResult {result})")


def _stat_value(s: _Stat):
    return (bool(s.value.b32), s.value.i64, s.value.u64, s.value.f64)[s.format] if s.format < 4 else None


def compute_pipeline_statistics(spirv: bytes, bindings: int, push_bytes: int, spec=(), device_index: int = 0):
    """Create a compute pipeline for `spirv` on Vulkan device `device_index` and return
    (supported, [(executable name, {statistic: value})]); supported is False (and the list empty)
    where the driver lacks VK_KHR_pipeline_executable_properties. Raises VulkanUnavailable when the
    pipeline cannot be created."""
    with physical_devices() as (vk, handles):
        if device_index >= len(handles):
            raise VulkanUnavailable(f"no Vulkan device {device_index} ({len(handles)} found)")
        supported = EXTENSION.decode() in device_extensions(vk, handles[device_index])
        return supported, _with_device(vk, _P(handles[device_index]), supported, spirv, bindings, push_bytes, spec)


def _with_device(vk, physical, supported: bool, spirv: bytes, bindings: int, push_bytes: int, spec):
    priority = ctypes.c_float(1.0)
    queue = _QueueInfo(_ST_QUEUE, None, 0, 0, 1, ctypes.pointer(priority))
    features = _Features(_ST_FEATURES, None, 1)
    names = (ctypes.c_char_p * 1)(EXTENSION)
    dev_info = _DeviceInfo(_ST_DEVICE, ctypes.cast(ctypes.pointer(features), _P) if supported else None, 0, 1,
                           ctypes.pointer(queue), 0, None, 1 if supported else 0, names, None)
    device = _P()
    _check(vk.vkCreateDevice(physical, ctypes.byref(dev_info), None, ctypes.byref(device)), "vkCreateDevice")
    made = []  # (destroy function, handle), destroyed in reverse
    try:
        code = ctypes.create_string_buffer(spirv, len(spirv))
        module = _P()
        _check(vk.vkCreateShaderModule(device, ctypes.byref(_ModuleInfo(_ST_MODULE, None, 0, len(spirv),
                                                                        ctypes.cast(code, _P))),
                                       None, ctypes.byref(module)), "vkCreateShaderModule")
        made.append((vk.vkDestroyShaderModule, module))
        binds = (_Binding * max(bindings, 1))(*[_Binding(i, _STORAGE_BUFFER, 1, _COMPUTE_STAGE, None)
                                                for i in range(bindings)])
        set_layout = _P()
        _check(vk.vkCreateDescriptorSetLayout(device, ctypes.byref(_SetLayoutInfo(_ST_SET_LAYOUT, None, 0, bindings,
                                                                                  binds)),
                                              None, ctypes.byref(set_layout)), "vkCreateDescriptorSetLayout")
        made.append((vk.vkDestroyDescriptorSetLayout, set_layout))
        push = _PushRange(_COMPUTE_STAGE, 0, push_bytes)
        layout = _P()
        _check(vk.vkCreatePipelineLayout(device, ctypes.byref(_LayoutInfo(
            _ST_LAYOUT, None, 0, 1, ctypes.pointer(set_layout), 1 if push_bytes else 0, ctypes.pointer(push))),
            None, ctypes.byref(layout)), "vkCreatePipelineLayout")
        made.append((vk.vkDestroyPipelineLayout, layout))
        values = (ctypes.c_uint32 * max(len(spec), 1))(*[int(v) for v in spec])
        entries = (_MapEntry * max(len(spec), 1))(*[_MapEntry(i, 4 * i, 4) for i in range(len(spec))])
        spec_info = _SpecInfo(len(spec), entries, 4 * len(spec), ctypes.cast(values, _P))
        stage = _StageInfo(_ST_STAGE, None, 0, _COMPUTE_STAGE, module, b"main", ctypes.pointer(spec_info))
        info = _ComputeInfo(_ST_COMPUTE, None, _CAPTURE_STATISTICS if supported else 0, stage, layout, None, -1)
        pipeline = _P()
        _check(vk.vkCreateComputePipelines(device, None, 1, ctypes.byref(info), None, ctypes.byref(pipeline)),
               "vkCreateComputePipelines")
        made.append((vk.vkDestroyPipeline, pipeline))
        return _statistics(vk, device, pipeline) if supported else []
    finally:
        for destroy, handle in reversed(made):
            destroy(device, handle, None)
        vk.vkDestroyDevice(device, None)


def _device_function(vk, device, name: bytes, *argtypes):
    vk.vkGetDeviceProcAddr.restype = _P
    vk.vkGetDeviceProcAddr.argtypes = [_P, ctypes.c_char_p]
    address = vk.vkGetDeviceProcAddr(device, name)
    if not address:
        raise VulkanUnavailable(f"the driver has no {name.decode()}")
    return ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(address)


def _statistics(vk, device, pipeline) -> list:
    get_props = _device_function(vk, device, b"vkGetPipelineExecutablePropertiesKHR", _P, ctypes.POINTER(_PipelineInfo),
                                 ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(_ExecProps))
    get_stats = _device_function(vk, device, b"vkGetPipelineExecutableStatisticsKHR", _P, ctypes.POINTER(_ExecInfo),
                                 ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(_Stat))
    pinfo = _PipelineInfo(_ST_PIPELINE_INFO, None, pipeline)
    n = ctypes.c_uint32(0)
    _check(get_props(device, ctypes.byref(pinfo), ctypes.byref(n), None), "vkGetPipelineExecutablePropertiesKHR")
    props = (_ExecProps * n.value)(*[_ExecProps(_ST_EXEC_PROPS) for _ in range(n.value)])
    _check(get_props(device, ctypes.byref(pinfo), ctypes.byref(n), props), "vkGetPipelineExecutablePropertiesKHR")
    out = []
    for i in range(n.value):
        einfo = _ExecInfo(_ST_EXEC_INFO, None, pipeline, i)
        m = ctypes.c_uint32(0)
        _check(get_stats(device, ctypes.byref(einfo), ctypes.byref(m), None), "vkGetPipelineExecutableStatisticsKHR")
        stats = (_Stat * m.value)(*[_Stat(_ST_STAT) for _ in range(m.value)])
        _check(get_stats(device, ctypes.byref(einfo), ctypes.byref(m), stats), "vkGetPipelineExecutableStatisticsKHR")
        out.append((props[i].name.decode(errors="replace"),
                    {s.name.decode(errors="replace"): _stat_value(s) for s in stats}))
    return out
