"""Issue 7.5 on the 2-GPU machine: the same plugin on every rank, NCCL (skipped without 2 CUDA devices).

The same worker as the gloo test (tests/rank_worker.py), one process per GPU, ``--backend nccl``,
NCCL_NVLS_ENABLE=0 (no NVLink multicast). Without SGLang on the machine the calls go through
``sglang_moe_plugins.silu_mul_quant`` (the selector SGLang's hook uses); with SGLang, through the hook.
The built-in plugins are discovered from the installed entry points, or from pyproject.toml when the
package is used from the checkout (``PYTHONPATH=.``).

Run on the 2-GPU machine from the repository root (the lead runs it):

    NCCL_NVLS_ENABLE=0 PYTHONPATH=.:tests python -m pytest -q tests/gpu/test_ranks_nccl.py
"""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:  # pragma: no cover - depends on the machine
    pytest.skip("needs 2 CUDA devices", allow_module_level=True)

from test_ranks import check_hazard, check_same_choice, launch_ranks  # noqa: E402

pytestmark = pytest.mark.gpu


def test_same_plugin_on_every_rank_nccl(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([repo, os.path.join(repo, "tests"), os.environ.get("PYTHONPATH", "")])
    )
    no_sglang = importlib.util.find_spec("sglang") is None
    results = launch_ranks(2, tmp_path, backend="nccl", no_sglang=no_sglang, timeout=600)
    assert all(r["device"] == f"cuda:{r['rank']}" for r in results)
    check_same_choice(results)
    check_hazard(results)
    print({r["rank"]: [c["chosen"] for c in r["choices"]] for r in results})
