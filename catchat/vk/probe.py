"""Ask the Vulkan loader directly (ctypes) what kp does not tell: device type, driver, limits.

kp 0.9.0 reports a device's name and workgroup limits only. Tile sizes and buffer checks need
maxComputeSharedMemorySize, maxStorageBufferRange and the subgroup size, and `catchat devices`
shows the driver; this module reads them with vkGetPhysicalDeviceProperties2. Devices come in
vkEnumeratePhysicalDevices order, the same order kp's Manager(index) uses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
from contextlib import contextmanager
from dataclasses import dataclass

from catchat.errors import VulkanUnavailable

_DEVICE_TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}
_VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x10005: "Mesa", 0x13B5: "ARM", 0x5143: "Qualcomm"}

# Byte offsets inside VkPhysicalDeviceProperties (checked against vulkaninfo on lavapipe and NVIDIA).
_PROPS_SIZE = 1024  # the real struct is 824 bytes; leave room
_OFF_API, _OFF_DRIVER_VERSION, _OFF_VENDOR, _OFF_TYPE, _OFF_NAME = 0, 4, 8, 16, 20
_LIMITS = 296
_OFF_STORAGE_RANGE = _LIMITS + 7 * 4
_OFF_PUSH_SIZE = _LIMITS + 8 * 4
_OFF_SHARED_MEM = _LIMITS + 216
_OFF_WG_INVOCATIONS = _LIMITS + 232
_OFF_TIMESTAMP_PERIOD = _LIMITS + 424  # float: nanoseconds per timestamp tick

_STYPE_APP_INFO, _STYPE_INSTANCE_INFO = 0, 1
_STYPE_PROPS2, _STYPE_SUBGROUP, _STYPE_DRIVER = 1000059001, 1000094000, 1000196000
_STYPE_SM_BUILTINS = 1000154001  # VkPhysicalDeviceShaderSMBuiltinsPropertiesNV
_EXT_PROPS_SIZE = 260  # VkExtensionProperties: char[256] name + uint32 specVersion


@dataclass(frozen=True)
class DeviceInfo:
    """What catchat needs to know about one Vulkan physical device."""

    index: int
    name: str
    type: str
    vendor: str
    driver: str
    api_version: str
    max_storage_buffer_bytes: int
    max_shared_memory_bytes: int
    max_push_constant_bytes: int
    max_workgroup_invocations: int
    subgroup_size: int
    device_memory_bytes: int = 0  # the largest DEVICE_LOCAL memory heap (0: unknown)
    compute_units: int = 0  # streaming multiprocessors (VK_NV_shader_sm_builtins; 0: unknown)
    warps_per_cu: int = 0  # resident warps an SM can hold (the same extension; 0: unknown)
    timestamp_period_ns: float = 1.0  # nanoseconds per GPU timestamp tick


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


class _SubgroupProps(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("subgroupSize", ctypes.c_uint32),
                ("stages", ctypes.c_uint32), ("ops", ctypes.c_uint32), ("quad", ctypes.c_uint32)]


class _DriverProps(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("driverID", ctypes.c_uint32),
                ("driverName", ctypes.c_char * 256), ("driverInfo", ctypes.c_char * 256),
                ("conformance", ctypes.c_uint8 * 4)]


_MEMORY_PROPS_SIZE = 1024  # VkPhysicalDeviceMemoryProperties is 520 bytes
_OFF_HEAP_COUNT, _OFF_HEAPS, _HEAP_STRIDE = 260, 264, 16  # VkMemoryHeap: uint64 size, uint32 flags (+4)
_HEAP_DEVICE_LOCAL = 0x1


class _SmProps(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("smCount", ctypes.c_uint32),
                ("warpsPerSm", ctypes.c_uint32)]


class _Props2(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("props", ctypes.c_uint8 * _PROPS_SIZE)]


def load_vulkan() -> ctypes.CDLL:
    """The Vulkan loader library, or VulkanUnavailable naming the package to install."""
    name = ctypes.util.find_library("vulkan") or "libvulkan.so.1"
    try:
        return ctypes.CDLL(name)
    except OSError:
        raise VulkanUnavailable("no Vulkan loader (libvulkan.so.1) on this machine",
                                hint="apt-get install libvulkan1 mesa-vulkan-drivers   (or run `make setup`)") from None


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


@contextmanager
def physical_devices():
    """(loader, [physical device handles]) of a Vulkan 1.2 instance that lives for the `with`;
    the handles come in kp's Manager(index) order."""
    vk = load_vulkan()
    app = _AppInfo(_STYPE_APP_INFO, None, b"catchat", 1, b"catchat", 1, (1 << 22) | (2 << 12))
    info = _InstanceInfo(_STYPE_INSTANCE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        raise VulkanUnavailable("the Vulkan loader found no working driver (vkCreateInstance failed)",
                                hint="apt-get install mesa-vulkan-drivers   (CPU fallback: lavapipe)")
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        yield vk, list(handles)
    finally:
        vk.vkDestroyInstance(instance, None)


def probe_devices() -> list[DeviceInfo]:
    """Every Vulkan physical device with its type, driver and the limits catchat sizes kernels by."""
    with physical_devices() as (vk, handles):
        return [_describe(vk, i, h) for i, h in enumerate(handles)]


def _describe(vk: ctypes.CDLL, index: int, handle) -> DeviceInfo:
    driver = _DriverProps(_STYPE_DRIVER, None)
    subgroup = _SubgroupProps(_STYPE_SUBGROUP, ctypes.cast(ctypes.pointer(driver), ctypes.c_void_p))
    props2 = _Props2(_STYPE_PROPS2, ctypes.cast(ctypes.pointer(subgroup), ctypes.c_void_p))
    vk.vkGetPhysicalDeviceProperties2(ctypes.c_void_p(handle), ctypes.byref(props2))
    raw = bytes(props2.props)
    u32 = lambda off: int.from_bytes(raw[off:off + 4], "little")  # noqa: E731
    vendor_id = u32(_OFF_VENDOR)
    sms, warps = _sm_builtins(vk, handle)
    return DeviceInfo(
        index=index,
        name=raw[_OFF_NAME:_OFF_NAME + 256].split(b"\0", 1)[0].decode(errors="replace"),
        type=_DEVICE_TYPES.get(u32(_OFF_TYPE), "unknown"),
        vendor=_VENDORS.get(vendor_id, f"0x{vendor_id:04x}"),
        driver=f"{driver.driverName.decode(errors='replace')} {driver.driverInfo.decode(errors='replace')}".strip(),
        api_version=_version(u32(_OFF_API)),
        max_storage_buffer_bytes=u32(_OFF_STORAGE_RANGE),
        max_shared_memory_bytes=u32(_OFF_SHARED_MEM),
        max_push_constant_bytes=u32(_OFF_PUSH_SIZE),
        max_workgroup_invocations=u32(_OFF_WG_INVOCATIONS),
        subgroup_size=subgroup.subgroupSize,
        device_memory_bytes=_device_memory(vk, handle),
        compute_units=sms,
        warps_per_cu=warps,
        timestamp_period_ns=struct.unpack_from("<f", raw, _OFF_TIMESTAMP_PERIOD)[0],
    )


def device_extensions(vk: ctypes.CDLL, handle) -> set[str]:
    """The device's extension names (vkEnumerateDeviceExtensionProperties)."""
    count = ctypes.c_uint32(0)
    if vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(handle), None, ctypes.byref(count), None) != 0:
        return set()
    buf = (ctypes.c_uint8 * (_EXT_PROPS_SIZE * count.value))()
    if vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(handle), None, ctypes.byref(count), buf) not in (0, 5):
        return set()  # 5 = VK_INCOMPLETE: take what came
    raw = bytes(buf)
    return {raw[i * _EXT_PROPS_SIZE:i * _EXT_PROPS_SIZE + 256].split(b"\0", 1)[0].decode(errors="replace")
            for i in range(count.value)}


def _sm_builtins(vk: ctypes.CDLL, handle) -> tuple[int, int]:
    """(streaming multiprocessors, warps per SM) where the driver offers VK_NV_shader_sm_builtins
    (else (0, 0): other vendors do not tell Vulkan either number)."""
    if "VK_NV_shader_sm_builtins" not in device_extensions(vk, handle):
        return 0, 0
    sm = _SmProps(_STYPE_SM_BUILTINS, None)
    props2 = _Props2(_STYPE_PROPS2, ctypes.cast(ctypes.pointer(sm), ctypes.c_void_p))
    vk.vkGetPhysicalDeviceProperties2(ctypes.c_void_p(handle), ctypes.byref(props2))
    return int(sm.smCount), int(sm.warpsPerSm)


def _device_memory(vk: ctypes.CDLL, handle) -> int:
    """The size of the largest DEVICE_LOCAL heap (vkGetPhysicalDeviceMemoryProperties), 0 if none."""
    buf = (ctypes.c_uint8 * _MEMORY_PROPS_SIZE)()
    vk.vkGetPhysicalDeviceMemoryProperties(ctypes.c_void_p(handle), ctypes.byref(buf))
    raw = bytes(buf)
    count = min(int.from_bytes(raw[_OFF_HEAP_COUNT:_OFF_HEAP_COUNT + 4], "little"), 16)
    sizes = []
    for i in range(count):
        off = _OFF_HEAPS + i * _HEAP_STRIDE
        size = int.from_bytes(raw[off:off + 8], "little")
        flags = int.from_bytes(raw[off + 8:off + 12], "little")
        if flags & _HEAP_DEVICE_LOCAL:
            sizes.append(size)
    return max(sizes, default=0)
