"""The platform a call runs on: device type and CUDA capability, read without touching tensor data.

Nothing here imports torch at import time. :func:`platform_of` takes a tensor or a ``torch.device`` (so
torch is already loaded); :func:`local_platform` asks torch when the process has imported it, and
otherwise the NVIDIA driver through NVML, so that ``sglang-moe-plugins list`` starts without torch. The
NVML probe runs in a daemon thread and is given :data:`NVML_TIMEOUT_S` seconds: a driver that does not
answer (a hung GPU, a blocked driver) leaves the platform CPU, with a WARNING, instead of hanging ``list``.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .log import PREFIX, get_logger

if TYPE_CHECKING:
    import torch

__all__ = ["Platform", "platform_of", "local_platform", "first_visible_device", "triton_available"]

#: The NVML library of the NVIDIA driver (what ``nvidia-smi`` reads).
NVML_LIBRARY = "libnvidia-ml.so.1"
#: Seconds the platform probe waits for NVML's answer before it treats this machine as CPU (with a WARNING).
NVML_TIMEOUT_S = 2.0
_NVML_UUID_BUFFER = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
#: What ``strtoul`` reads after the white space it skips: a sign and ASCII digits (``[0-9]``, not ``\d``,
#: which would take any Unicode digit).
_LEADING_NUMBER = re.compile(r"[+-]?[0-9]+")
#: C's ``isspace`` in the C locale, what ``strtoul`` skips (not Python's ``str.strip``, which also strips
#: Unicode spaces such as U+00A0: CUDA reads ``"\xa01"`` as no device).
_C_SPACE = " \t\n\v\f\r"

_log = get_logger(__name__)


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
    library, no visible GPU, any NVML error or no answer within :data:`NVML_TIMEOUT_S` (a WARNING). NVML
    numbers GPUs in PCI bus order, CUDA (and so ``CUDA_VISIBLE_DEVICES``'s indices) fastest first unless
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: an index is read through NVML only under that order or where every GPU
    has the same compute capability (then any index names the same platform); on a machine that mixes GPU
    models without it, the probe does not guess and answers CPU (``doctor`` asks torch). NVML also reports a
    GPU that torch's CUDA build cannot use (a driver older than torch's CUDA runtime).
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available():
            return platform_of(torch.device("cuda", torch.cuda.current_device()))
        return Platform.cpu()
    return _driver_platform(os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"))


def first_visible_device(visible: str | None, device_count: int | None = None) -> int | str | None:
    """The first device a ``CUDA_VISIBLE_DEVICES`` value leaves visible, read as CUDA reads it.

    ``0`` when unset; for a value starting with ``GPU-`` or ``MIG-``, its first comma-separated entry (str: a
    UUID prefix, or a MIG identifier); otherwise the number its first entry starts with, as C's ``strtoul``
    reads it (``"1"``, ``" 1 "``, ``"+1"``, ``"1gpu"``: 1; leading C white space only, ASCII digits only).
    ``None`` (no GPU) for an empty value or a first entry that is no such number (``""``, ``"-1"``, ``"none"``,
    ``"\\xa01"``): CUDA stops at the first invalid entry; for a device named twice before that (``"0,0"``),
    which leaves no device visible; and, given ``device_count`` (the GPUs there are, as the NVML probe
    knows them), for a first index at or past it (``"2"`` on two GPUs; ``"4294967297"``, which is not GPU 1).

    This is PyTorch's model of CUDA's parser, ``torch.cuda._parse_visible_devices`` ("CUDA_VISIBLE_DEVICES
    uses something like strtoul") with the device-count cut of ``torch.cuda._device_count_nvml``, except
    that torch's Python ``str.strip`` and ``str.isdigit`` accept Unicode spaces and digits that C's do not
    (tests/test_redteam2_platform.py holds the table and checks both against it)."""
    if visible is None:
        return 0 if device_count is None or device_count > 0 else None
    entries: list[int | str] = []
    prefix = "GPU-" if visible.startswith("GPU-") else "MIG-" if visible.startswith("MIG-") else None
    for entry in visible.split(","):
        if prefix is not None:
            value: int | str | None = entry if entry.startswith(prefix) else None
        else:
            number = _LEADING_NUMBER.match(entry.lstrip(_C_SPACE))
            value = None if number is None or int(number.group()) < 0 else int(number.group())
        if value is None:
            break
        if value in entries:
            return None
        entries.append(value)
    if not entries:
        return None
    first = entries[0]
    if isinstance(first, int) and device_count is not None and first >= device_count:
        return None  # CUDA: an invalid index, and no device precedes it
    return first


@functools.lru_cache(maxsize=8)
def _driver_platform(visible: str | None, order: str | None = None) -> Platform:
    target = first_visible_device(visible)
    if target is None:
        return Platform.cpu()
    capability = _nvml_capability_within(target, order == "PCI_BUS_ID", NVML_TIMEOUT_S)
    return Platform.cpu() if capability is None else Platform.cuda(*capability)


def _nvml_capability_within(target: int | str, pci_order: bool, timeout: float) -> tuple[int, int] | None:
    """:func:`_nvml_capability` in a daemon thread, waited for ``timeout`` seconds: None (CPU) on any NVML
    failure, and, with a WARNING, when NVML does not answer in time (the thread is left blocked in the driver;
    a daemon thread does not keep the process from exiting)."""
    answer: list[tuple[int, int] | None] = []

    def probe() -> None:
        try:
            answer.append(_nvml_capability(target, pci_order))
        except Exception:  # noqa: BLE001 - any NVML failure (library, symbol, call): this machine counts as CPU
            answer.append(None)

    thread = threading.Thread(target=probe, name="sglang-moe-plugins-nvml-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        _log.warning(
            "%s: the NVIDIA driver (NVML, %s) did not answer within %.0f s; the platform here is treated as CPU",
            PREFIX,
            NVML_LIBRARY,
            timeout,
        )
        return None
    return answer[0] if answer else None


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
        count = _nvml_count(lib)
        if count is None or target >= count:  # CUDA: no such device (and c_uint would wrap 2**32 + 1 to 1)
            return None
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
    count = _nvml_count(lib)
    if count is None:
        return None
    handles = []
    for index in range(count):
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
            return None
        handles.append(handle)
    return handles


def _nvml_count(lib: Any) -> int | None:
    """How many GPUs NVML sees, or None when it cannot say."""
    count = ctypes.c_uint()
    return count.value if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else None


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported here (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None
