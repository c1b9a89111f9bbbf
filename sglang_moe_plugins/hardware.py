"""The platform a call runs on: device type and CUDA capability, read without touching tensor data."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

import torch

__all__ = ["Platform", "platform_of", "local_platform", "triton_available"]


@dataclass(frozen=True, order=True)
class Platform:
    """Where a call runs. ``capability`` is ``(major, minor)`` for CUDA devices, ``None`` otherwise."""

    device_type: str = "cpu"
    capability: tuple[int, int] | None = None

    @classmethod
    def cpu(cls) -> "Platform":
        return cls("cpu", None)

    @classmethod
    def cuda(cls, major: int, minor: int = 0) -> "Platform":
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


@functools.lru_cache(maxsize=None)
def _cuda_platform(index: int) -> Platform:
    major, minor = torch.cuda.get_device_capability(index)
    return Platform.cuda(major, minor)


def platform_of(device: torch.device | torch.Tensor) -> Platform:
    """The platform of a tensor's device. Reads device properties only (cached), never tensor data."""
    if isinstance(device, torch.Tensor):
        device = device.device
    if device.type == "cuda":
        return _cuda_platform(device.index if device.index is not None else torch.cuda.current_device())
    return Platform(device.type, None)


def local_platform() -> Platform:
    """The platform of this process's current accelerator, or CPU when there is none."""
    if torch.cuda.is_available():
        return platform_of(torch.device("cuda", torch.cuda.current_device()))
    return Platform.cpu()


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported here (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None
