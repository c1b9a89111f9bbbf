"""hardware.local_platform without torch (NVML, what ``sglang-moe-plugins list`` reports) equals its answer with
torch imported (what ``doctor`` and hooked calls see), for the CUDA_VISIBLE_DEVICES forms CUDA takes.
Skipped without CUDA. Run: ``PYTHONPATH=$PWD python -m pytest -q tests/gpu/test_platform_probe_gpu.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA device", allow_module_level=True)

pytestmark = pytest.mark.gpu

_PROBE = """
import sys
{torch}
from sglang_moe_plugins.hardware import local_platform
print(local_platform(), "torch" in sys.modules)
"""


def _probe(visible: str | None, with_torch: bool) -> tuple[str, bool]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    code = _PROBE.format(torch="import torch" if with_torch else "")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    platform, *rest, imported = result.stdout.split()
    return " ".join([platform, *rest]), imported == "True"


def _visible_forms() -> list[str | None]:
    """CUDA_VISIBLE_DEVICES values for the probes (each replaces this process's own, if any)."""
    uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    forms = [None, "0", uuid, uuid[:12], "0,1", "-1", ""]
    if torch.cuda.device_count() > 1:
        forms += [str(torch.cuda.device_count() - 1), "1,0"]
    return forms


def test_the_nvml_probe_equals_torchs_answer():
    for visible in _visible_forms():
        without, imported = _probe(visible, with_torch=False)
        assert not imported, f"CUDA_VISIBLE_DEVICES={visible!r}: the probe imported torch"
        with_torch, _ = _probe(visible, with_torch=True)
        assert without == with_torch, f"CUDA_VISIBLE_DEVICES={visible!r}: NVML says {without}, torch {with_torch}"
        if visible in ("-1", ""):
            assert without == "cpu"
        else:
            assert without.startswith("cuda sm"), (visible, without)


def test_list_reports_the_gpu_without_torch():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")} | {"SGLANG_MOE_PLUGINS_ALLOW": ""}
    code = (
        "import json, sys, io, contextlib\n"
        "from sglang_moe_plugins.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    main(['list', '--json'])\n"
        "print(json.loads(out.getvalue())['platform'], 'torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    *platform, imported = result.stdout.split()
    major, minor = torch.cuda.get_device_capability(0)
    assert " ".join(platform) == f"cuda sm{major * 10 + minor}" and imported == "False", result.stdout
