"""Issue #30, finding 12: the platform probe ``sglang-moe-plugins list`` runs without torch (hardware.py).

* A blocked NVIDIA driver (an NVML call that never returns) must not hang ``list``: the probe waits
  ``hardware.NVML_TIMEOUT_S`` seconds, logs a WARNING and treats the machine as CPU.
* ``CUDA_VISIBLE_DEVICES`` is read as CUDA reads it. The table below is CUDA's behaviour as PyTorch models it
  (``torch.cuda._parse_visible_devices``, then ``torch.cuda._device_count_nvml``'s cut at the first index past
  the device count), which says "CUDA_VISIBLE_DEVICES uses something like strtoul", and the CUDA
  documentation ("only the devices whose index precedes the invalid index are visible"). Where torch's Python
  model is not C's ``strtoul`` (Python's ``str.strip``/``str.isdigit`` know Unicode; C's ``isspace`` and digits,
  in the C locale, are ASCII), the row says how torch differs, and the test checks that it does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_moe_plugins import hardware
from sglang_moe_plugins.hardware import Platform, first_visible_device

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)

from test_hardware import B200, H200, FakeNvml  # noqa: E402 - tests/ is on the path above

#: The machine of the table: two GPUs, NVML's (and, with CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA's) 0 and 1.
GPUS = [H200, B200]
SAME = "same"  # torch's model gives the same first device
RAISES = "raises"  # torch's model raises ValueError (int() of a sign without digits, or of a non-ASCII digit)

#: (CUDA_VISIBLE_DEVICES, the first device CUDA uses on GPUS: an index, a UUID prefix, or None for none,
#: what torch's model says: SAME, RAISES, or the first device it gives instead)
CUDA_TABLE: list[tuple[str | None, int | str | None, object]] = [
    (None, 0, SAME),  # unset: every GPU
    ("0", 0, SAME),
    ("1", 1, SAME),
    ("1,0", 1, SAME),
    (" 1", 1, SAME),  # strtoul skips leading isspace
    ("\t\n\v\f\r 1", 1, SAME),  # C's six isspace characters
    ("1 ", 1, SAME),  # strtoul stops at the space
    ("+1", 1, SAME),  # strtoul takes a sign
    ("-0", 0, SAME),
    ("1gpu2,2ampere", 1, SAME),  # torch's example: the number an entry starts with
    ("\xa01", None, 1),  # a no-break space is not C's isspace (the byte 0xC2 stops strtoul); Python strips it
    ("\u20031", None, 1),  # an em space: the same
    ("\u0661", None, 1),  # ARABIC-INDIC DIGIT ONE is no C digit; Python's isdigit and int read it as 1
    ("\u00b2", None, RAISES),  # SUPERSCRIPT TWO: isdigit, but int() refuses it
    ("+", None, RAISES),  # a sign and no digits: strtoul converts nothing
    ("4294967297", None, SAME),  # 2**32 + 1: no such device (1 modulo 2**32 must not name GPU 1)
    ("18446744073709551617", None, SAME),  # 2**64 + 1: past unsigned long, strtoul's ERANGE
    ("2", None, SAME),  # one past the last GPU: invalid, nothing precedes it
    ("1,2", 1, SAME),  # GPU 1, then an invalid index: GPU 1 only
    ("-1", None, SAME),
    ("-1,0", None, SAME),
    ("0,-1,1", 0, SAME),  # CUDA's documented example: parsing stops at -1
    ("0,-1,0", 0, SAME),  # the repeat comes after the end
    ("0,0", None, SAME),  # a device named twice: none
    ("1,0,1", None, SAME),
    ("", None, SAME),
    (",1", None, SAME),  # an empty first entry is invalid
    ("none", None, SAME),
    ("cuda:1", None, SAME),
    ("GPU-abc", "GPU-abc", SAME),  # a UUID prefix (no GPU here has it)
    ("GPU-89aa,GPU-8932", "GPU-89aa", SAME),
    ("GPU-89aa,1", "GPU-89aa", SAME),  # a list of UUIDs ends at the first entry that is not one
    ("GPU-89aa,GPU-89aa", None, SAME),
    (" GPU-89aa", None, SAME),  # no prefix: read as a number, and it is none
    ("gpu-89aa", None, SAME),  # the prefix is upper case
    ("MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/2", "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/2", SAME),
]


def _platform_of_entry(first: int | str | None) -> Platform:
    """What the NVML probe should report on GPUS for CUDA's first device."""
    if first is None:
        return Platform.cpu()
    if isinstance(first, int):
        return Platform.cuda(*GPUS[first][1])
    uuid = first.removeprefix("MIG-").split("/", 1)[0]
    matches = [cap for gpu_uuid, cap in GPUS if gpu_uuid.startswith(uuid)]
    return Platform.cuda(*matches[0]) if len(matches) == 1 else Platform.cpu()


def _torch_first(monkeypatch: pytest.MonkeyPatch, visible: str | None) -> int | str | None:
    """torch's model of CUDA: ``_parse_visible_devices``, cut at the first index >= the device count (as
    ``torch.cuda._device_count_nvml`` cuts it)."""
    torch = pytest.importorskip("torch")
    assert not torch.version.hip, "the CUDA model, not HIP's"
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    devices = list(torch.cuda._parse_visible_devices())
    for index, device in enumerate(devices):
        if isinstance(device, int) and device >= len(GPUS):
            devices = devices[:index]
            break
    return devices[0] if devices else None


@pytest.mark.parametrize("visible, first, torch_says", CUDA_TABLE, ids=[ascii(row[0]) for row in CUDA_TABLE])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(monkeypatch, visible, first, torch_says):
    assert first_visible_device(visible, len(GPUS)) == first
    if torch_says == RAISES:
        with pytest.raises(ValueError):
            _torch_first(monkeypatch, visible)
    else:
        assert _torch_first(monkeypatch, visible) == (first if torch_says == SAME else torch_says)


@pytest.mark.parametrize("visible, first, _torch", CUDA_TABLE, ids=[ascii(row[0]) for row in CUDA_TABLE])
def test_the_nvml_probe_reports_cudas_first_device(monkeypatch, visible, first, _torch):
    """The probe itself (NVML through a fake with GPUS), in PCI order, where NVML's index is CUDA's."""
    fake = FakeNvml(GPUS)
    monkeypatch.setattr(hardware, "_nvml_library", lambda: fake)
    hardware._driver_platform.cache_clear()
    try:
        assert hardware._driver_platform(visible, "PCI_BUS_ID") == _platform_of_entry(first)
    finally:
        hardware._driver_platform.cache_clear()


#: ``sglang-moe-plugins list --json`` as ``python -m sglang_moe_plugins.cli`` runs it, with NVML replaced by a
#: fake: argv[1] names it ("gpus": FakeNvml with GPUS; "blocked": every call sleeps 600 s).
_LIST_WITH_FAKE_NVML = """
import runpy, sys, time
sys.path.insert(0, sys.argv[1])
from sglang_moe_plugins import hardware
from test_hardware import B200, H200, FakeNvml

class BlockedNvml:
    def __getattr__(self, name):
        def blocked(*args):
            time.sleep(600)
            return 0
        return blocked

fake = FakeNvml([H200, B200]) if sys.argv[2] == "gpus" else BlockedNvml()
hardware._nvml_library = lambda: fake
sys.argv = ["sglang-moe-plugins", "list", "--json"]
runpy.run_module("sglang_moe_plugins.cli", run_name="__main__", alter_sys=True)
"""


def _list_with_fake_nvml(kind: str, timeout: float, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CUDA_"))}
    full.update(SGLANG_MOE_PLUGINS_ALLOW="", **env)  # built-in plugins only: list imports no third party
    return subprocess.run(
        [sys.executable, "-c", _LIST_WITH_FAKE_NVML, TESTS, kind],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
    )


def test_list_answers_when_the_nvml_driver_blocks():
    """A driver whose NVML calls never return (600 s here): ``list`` answers within the test's bound (60 s, not
    a performance figure: the probe waits NVML_TIMEOUT_S), says ``cpu`` and warns that NVML did not answer."""
    result = _list_with_fake_nvml("blocked", timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["platform"] == "cpu"
    assert "WARNING" not in result.stdout  # the warning is a log line on stderr; stdout stays JSON
    assert "NVML" in result.stderr and "did not answer" in result.stderr, result.stderr[-3000:]
    assert "treated as CPU" in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize(
    "visible, platform",
    [("1", "cuda sm100"), ("4294967297", "cpu"), ("\xa01", "cpu"), ("18446744073709551617", "cpu"), ("0,0", "cpu")],
    ids=ascii,
)
def test_list_reads_cuda_visible_devices_as_cuda_does(visible, platform):
    """Two GPUs (sm90, sm100) in PCI order: GPU 1 is the sm100 one; 2**32 + 1 and a 1 after a no-break space
    name no GPU (CUDA sees none)."""
    result = _list_with_fake_nvml("gpus", timeout=300, CUDA_VISIBLE_DEVICES=visible, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["platform"] == platform
