"""hardware.py: the platform probe ``list`` uses without torch (NVML, CUDA_VISIBLE_DEVICES as CUDA reads it),
torch's answer once torch is imported, and ``platform_of`` on tensors and devices."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from sglang_moe_plugins import hardware
from sglang_moe_plugins.hardware import Platform, first_visible_device, local_platform, platform_of


@pytest.mark.parametrize(
    "visible, first",
    [
        (None, 0),  # unset: every GPU, the first one
        ("0", 0),
        ("3", 3),
        ("2,0", 2),
        (" 1 , 0", 1),
        ("0,-1", 0),
        ("+2", 2),
        ("1gpu2,2ampere", 1),  # "something like strtoul" (torch.cuda._parse_visible_devices)
        ("", None),
        ("-1", None),
        ("-1,0", None),
        ("none", None),
        ("cuda:0", None),
        ("\u00b2", None),
        (",0", None),  # an empty first entry is invalid: CUDA stops there
        ("0,0", None),
        ("1,2,1", None),
        ("GPU-89,GPU-89", None),  # a device named twice: none visible (as torch)
        ("0,-1,0", 0),  # the repeat comes after the invalid entry, where CUDA stopped
        ("GPU-8932f937", "GPU-8932f937"),
        ("GPU-8932f937-d72c,1", "GPU-8932f937-d72c"),
        (" GPU-8932f937", None),
        ("MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/2", "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/2"),
        ("MIG-5d3e2b1a", "MIG-5d3e2b1a"),
    ],
)
def test_first_visible_device_reads_cuda_visible_devices_as_cuda_does(visible, first):
    assert first_visible_device(visible) == first


class FakeNvml:
    """NVML's calls used by the probe, over a table of (uuid, capability) in NVML's index order."""

    def __init__(self, gpus, init_status=0):
        self.gpus, self.init_status, self.shutdowns = gpus, init_status, 0

    def nvmlInit_v2(self):
        return self.init_status

    def nvmlShutdown(self):
        self.shutdowns += 1
        return 0

    def nvmlDeviceGetCount_v2(self, count):
        count._obj.value = len(self.gpus)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        if index.value >= len(self.gpus):
            return 2  # NVML_ERROR_INVALID_ARGUMENT
        handle._obj.value = 1000 + index.value
        return 0

    def nvmlDeviceGetUUID(self, handle, buffer, length):
        buffer.value = self.gpus[handle.value - 1000][0].encode()
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid, handle):
        return 13  # NVML_ERROR_NOT_FOUND: no MIG device here

    def nvmlDeviceGetCudaComputeCapability(self, handle, major, minor):
        major._obj.value, minor._obj.value = self.gpus[handle.value - 1000][1]
        return 0


H200 = ("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", (9, 0))
B200 = ("GPU-89aa0000-0000-0000-0000-000000000000", (10, 0))


@pytest.mark.parametrize(
    "visible, want",
    [
        (None, Platform.cuda(9, 0)),
        ("1", Platform.cuda(10, 0)),
        ("1,0", Platform.cuda(10, 0)),
        ("0,0", Platform.cpu()),
        ("2", Platform.cpu()),  # no third GPU: an invalid index, no GPU
        ("GPU-89aa", Platform.cuda(10, 0)),
        ("gpu-8932", Platform.cpu()),  # "gpu-" is not CUDA's prefix
        ("GPU-89", Platform.cpu()),  # names both GPUs: not one GPU
        ("MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/2", Platform.cuda(9, 0)),
        ("MIG-5d3e2b1a", Platform.cpu()),  # NVML does not know the MIG device
        ("", Platform.cpu()),
        ("-1", Platform.cpu()),
    ],
)
def test_the_nvml_probe_picks_the_first_visible_gpu(monkeypatch, visible, want):
    fake = FakeNvml([H200, B200])
    monkeypatch.setattr(hardware, "_nvml_library", lambda: fake)
    hardware._driver_platform.cache_clear()
    try:
        assert hardware._driver_platform(visible, "PCI_BUS_ID") == want
    finally:
        hardware._driver_platform.cache_clear()
    assert fake.shutdowns == (0 if first_visible_device(visible) is None else 1)


@pytest.mark.parametrize(
    "gpus, visible, want",
    [
        (
            [H200, B200],
            "1",
            Platform.cpu(),
        ),  # mixed models, CUDA's fastest-first order: NVML's index 1 may not be CUDA's
        ([H200, B200], None, Platform.cpu()),
        ([H200, B200], "GPU-89aa", Platform.cuda(10, 0)),  # a UUID names one GPU in any order
        ([H200, ("GPU-1111", (9, 0))], "1", Platform.cuda(9, 0)),  # one model: every index is the same platform
    ],
)
def test_an_index_in_cudas_default_order_is_read_only_where_it_cannot_name_another_model(
    monkeypatch, gpus, visible, want
):
    fake = FakeNvml(gpus)
    monkeypatch.setattr(hardware, "_nvml_library", lambda: fake)
    hardware._driver_platform.cache_clear()
    try:
        assert hardware._driver_platform(visible, None) == want
        assert hardware._driver_platform(visible, "FASTEST_FIRST") == want
    finally:
        hardware._driver_platform.cache_clear()
    assert fake.shutdowns == 2


@pytest.mark.parametrize("broken", ["no library", "init fails", "raises"])
def test_any_nvml_failure_is_cpu(monkeypatch, broken):
    fake = FakeNvml([H200], init_status=0 if broken == "raises" else 1)
    if broken == "raises":
        fake.nvmlDeviceGetCudaComputeCapability = None  # calling it raises TypeError
    monkeypatch.setattr(hardware, "_nvml_library", lambda: None if broken == "no library" else fake)
    hardware._driver_platform.cache_clear()
    try:
        assert hardware._driver_platform("0") == Platform.cpu()
    finally:
        hardware._driver_platform.cache_clear()
    if broken == "raises":
        assert fake.shutdowns == 1


def test_with_torch_imported_local_platform_asks_torch_not_nvml(monkeypatch):
    torch = pytest.importorskip("torch")

    def no_nvml():
        raise AssertionError("NVML asked although torch is imported")

    monkeypatch.setattr(hardware, "_nvml_library", no_nvml)
    hardware._driver_platform.cache_clear()
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: calls.append("is_available") or False)
    assert local_platform() == Platform.cpu()
    assert calls == ["is_available"]


def test_without_torch_local_platform_is_cpu_here_and_imports_no_torch():
    """This machine has no NVIDIA driver (no libnvidia-ml.so.1): the probe answers CPU, torch stays out."""
    try:
        ctypes.CDLL(hardware.NVML_LIBRARY)
    except OSError:
        pass
    else:  # pragma: no cover - depends on the machine
        pytest.skip("an NVIDIA driver is installed here (tests/gpu/test_platform_probe_gpu.py compares it with torch)")
    code = (
        "import sys; from sglang_moe_plugins.hardware import local_platform; p = local_platform(); "
        "print(p, 'torch' in sys.modules)"
    )
    for visible in (None, "0", ""):
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split() == ["cpu", "False"], (visible, result.stdout)


def test_platform_of_a_tensor_and_a_device():
    torch = pytest.importorskip("torch")
    assert platform_of(torch.empty(2)) == Platform.cpu()
    assert platform_of(torch.device("cpu")) == Platform.cpu()
    assert platform_of(torch.empty(2, device="meta")) == Platform("meta", None)
    assert platform_of(torch.device("meta")) == Platform("meta", None)
    with pytest.raises(AttributeError):
        platform_of("cpu")  # a string is neither
