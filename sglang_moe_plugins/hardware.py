"""The platform a call runs on: device type and CUDA capability, read without touching tensor data.

Nothing here imports torch at import time. :func:`platform_of` takes a tensor or a ``torch.device`` (so
torch is already loaded); :func:`local_platform` asks torch when the process has imported it, and
otherwise the NVIDIA driver through NVML, so that ``sglang-moe-plugins list`` starts without torch.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["Platform", "platform_of", "local_platform", "first_visible_device", "triton_available"]

#: The NVML library of the NVIDIA driver (what ``nvidia-smi`` reads).
NVML_LIBRARY = "libnvidia-ml.so.1"
_NVML_UUID_BUFFER = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
_LEADING_NUMBER = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True, order=True)
class Platform:
    """Where a call runs. ``capability`` is ``(major, minor)`` for CUDA devices, ``None`` otherwise."""

    device_type: str = "cpu"
    capability: tuple[int, int] | None = None

    @classmethod
    def cpu(cls) -> Platform:
        return cls("cpu", None)

    @classmethod
    def cuda(cls, major: int, minor: int = 0) -> Platform:
        return cls("cuda", (int(major), int(minor)))

    @property
    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    @property
    def sm(self) -> int | None:
        """The SM number (90 for Hopper, 100 for Blackwell), or ``None`` off CUDA."""
        return None if self.capability is None else self.capability[0] * 10 + self.capability[1]

    def describe(self) -> str:
        return f"cuda sm{self.sm}" if self.is_cuda and self.capability else self.device_type

    def __str__(self) -> str:
        return self.describe()


@functools.cache
def _cuda_platform(index: int) -> Platform:
    import torch  # once per device index (cached); the caller holds a CUDA tensor or device

    major, minor = torch.cuda.get_device_capability(index)
    return Platform.cuda(major, minor)


def _current_cuda_device() -> int:
    import torch  # a torch.device("cuda") without an index only; tensors always have one

    return torch.cuda.current_device()


def platform_of(device: torch.device | torch.Tensor) -> Platform:
    """The platform of a tensor's device. Reads device properties only (cached), never tensor data."""
    device = getattr(device, "device", device)  # a tensor's device; a torch.device has no ``device``
    if device.type == "cuda":
        return _cuda_platform(device.index if device.index is not None else _current_cuda_device())
    return Platform(device.type, None)  # type: ignore[arg-type]  # a torch.device's type


def local_platform() -> Platform:
    """The platform of this process's current accelerator, or CPU when there is none.

    When the process has imported torch (``doctor``, hooked calls, benchmarks): ``torch.cuda.is_available()``
    and the capability of torch's current device. Otherwise (``list``, ``explain``): the first GPU that
    ``CUDA_VISIBLE_DEVICES`` leaves visible (:func:`first_visible_device`), read from the NVIDIA driver
    through NVML (``libnvidia-ml.so.1`` with ctypes), without importing torch: CPU when there is no NVML
    library, no visible GPU or any NVML error. NVML numbers GPUs in PCI bus order, CUDA (and so
    ``CUDA_VISIBLE_DEVICES``'s indices) fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: an index is
    read through NVML only under that order or where every GPU has the same compute capability (then
    any index names the same platform); on a machine that mixes GPU models without it, the probe does
    not guess and answers CPU (``doctor`` asks torch). NVML also reports a GPU that torch's CUDA build
    cannot use (a driver older than torch's CUDA runtime).
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available():
            return platform_of(torch.device("cuda", torch.cuda.current_device()))
        return Platform.cpu()
    return _driver_platform(os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"))


def first_visible_device(visible: str | None) -> int | str | None:
    """The first device a ``CUDA_VISIBLE_DEVICES`` value leaves visible, read as CUDA (and torch's
    ``torch.cuda._parse_visible_devices``) reads it: ``0`` when unset; for a value starting with ``GPU-`` or
    ``MIG-``, its first comma-separated entry (str: a UUID prefix, or a MIG identifier); otherwise the
    number its first entry starts with, as ``strtoul`` reads it (``"1"``, ``" 1 "``, ``"1gpu"``: 1).
    ``None`` (no GPU) for an empty value or a first entry that is no such number (``""``, ``"-1"``,
    ``"none"``): CUDA stops at the first invalid entry; and for a device named twice before that
    (``"0,0"``), which leaves no device visible."""
    if visible is None:
        return 0
    entries: list[int | str] = []
    prefix = "GPU-" if visible.startswith("GPU-") else "MIG-" if visible.startswith("MIG-") else None
    for entry in visible.split(","):
        if prefix is not None:
            value: int | str | None = entry if entry.startswith(prefix) else None
        else:
            number = _LEADING_NUMBER.match(entry.strip())
            value = None if number is None or int(number.group()) < 0 else int(number.group())
        if value is None:
            break
        if value in entries:
            return None
        entries.append(value)
    return entries[0] if entries else None


@functools.lru_cache(maxsize=8)
def _driver_platform(visible: str | None, order: str | None = None) -> Platform:
    target = first_visible_device(visible)
    if target is None:
        return Platform.cpu()
    try:
        capability = _nvml_capability(target, pci_order=order == "PCI_BUS_ID")
    except Exception:  # noqa: BLE001 - any NVML failure (library, symbol, call): this machine counts as CPU
        capability = None
    return Platform.cpu() if capability is None else Platform.cuda(*capability)


def _nvml_library() -> Any:
    """The driver's NVML library, or None where it is not installed (no NVIDIA driver)."""
    try:
        return ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return None


def _nvml_capability(target: int | str, pci_order: bool = True) -> tuple[int, int] | None:
    """The compute capability of the device ``target`` names (:func:`first_visible_device`), from NVML.
    An index in CUDA's default order (``pci_order`` false) counts only where every GPU has one capability."""
    lib = _nvml_library()
    if lib is None or lib.nvmlInit_v2() != 0:
        return None
    try:
        handle = _nvml_handle(lib, target)
        if handle is None:
            return None
        capability = _handle_capability(lib, handle)
        if isinstance(target, int) and not pci_order and capability is not None:
            handles = _nvml_handles(lib)
            if handles is None or any(_handle_capability(lib, other) != capability for other in handles):
                return None  # mixed models: CUDA's fastest-first index may name another GPU
        return capability
    finally:
        lib.nvmlShutdown()


def _handle_capability(lib: Any, handle: ctypes.c_void_p) -> tuple[int, int] | None:
    major, minor = ctypes.c_int(), ctypes.c_int()
    if lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0:
        return None
    return major.value, minor.value


def _nvml_handle(lib: Any, target: int | str) -> ctypes.c_void_p | None:
    """NVML's handle of the GPU ``target`` names: by index, by a GPU UUID prefix that names one GPU, or the
    GPU of a MIG device (``MIG-GPU-<uuid>/<gi>/<ci>``, or a MIG device UUID ``MIG-<uuid>``)."""
    handle = ctypes.c_void_p()
    if isinstance(target, int):
        return handle if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(target), ctypes.byref(handle)) == 0 else None
    if target.startswith("MIG-GPU-"):
        target = target[len("MIG-") :].split("/", 1)[0]
    elif target.startswith("MIG-"):
        mig = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByUUID(target.encode(), ctypes.byref(mig)) != 0:
            return None
        return handle if lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, ctypes.byref(handle)) == 0 else None
    handles = _nvml_handles(lib)
    if handles is None:
        return None
    matches = []
    uuid = ctypes.create_string_buffer(_NVML_UUID_BUFFER)
    for device in handles:
        if lib.nvmlDeviceGetUUID(device, uuid, ctypes.c_uint(_NVML_UUID_BUFFER)) != 0:
            return None
        if uuid.value.decode("ascii", "replace").startswith(target):
            matches.append(device)
    return matches[0] if len(matches) == 1 else None  # CUDA takes "enough digits to uniquely identify" it


def _nvml_handles(lib: Any) -> list[ctypes.c_void_p] | None:
    """Every GPU's NVML handle, in NVML's (PCI) order; None when NVML fails on any of them."""
    count = ctypes.c_uint()
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return None
    handles = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
            return None
        handles.append(handle)
    return handles


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported here (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None
