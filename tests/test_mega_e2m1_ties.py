"""E2M1 midpoints round as the installed sgl-deep-gemm release does: toward zero up to 0.1.7, to the even
code from 0.2.0. Checked against each release's own ``deep_gemm/utils/math.py`` (pure torch, loaded alone
from the downloaded wheel, see tests/test_deep_gemm_releases.py), on CPU:

- detection (:attr:`DeepGemmApi.e2m1_ties`) reads the rule from that file;
- this project's Triton pre-dispatch, under Triton's interpreter, writes the codes and scales
  ``per_token_cast_to_fp4`` of that release writes, given the detected rule;
- ``mega_w4a4`` declines the torch pre-dispatch (ties to even) on a release that rounds toward zero.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from _mega_cases import API_MMA_TYPE, model_key
from test_deep_gemm_releases import RELEASES, _sources

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.plugins.deep_gemm import api as dga, plugin as mdg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Releases whose MegaMoE takes mma_type='mxf4xmxf4' (the W4A4 plugin's), and the rule their sources use.
MXF4_RELEASES = [v for v, e in RELEASES.items() if e.flavour == "mma_type"]
TOWARD_ZERO = {"0.1.7"}


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in version.replace(".post", ".").split("."))


@pytest.mark.parametrize("version", list(RELEASES))
def test_detection_reads_the_tie_rule(version: str) -> None:
    api = dga.api_from_source_dir(_sources(version), environ={})
    want = "toward_zero" if _version_key(version) < (0, 2, 0) else "even"
    assert api.e2m1_ties == want


_SCRIPT = r"""
import importlib.util, json, sys, torch
from sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_triton import PreDispatchTiling, pre_dispatch

spec = importlib.util.spec_from_file_location("release_math", sys.argv[1])
math = importlib.util.module_from_spec(spec)
spec.loader.exec_module(math)
ties = sys.argv[2]
tokens, hidden = 6, 256
# every E2M1 midpoint, both signs, in groups of 32 with absmax 6 (scale 1: exact midpoints), and random rows
mid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
row = torch.cat([mid, -mid, mid * 0.5, -mid * 0.5]).repeat(hidden // 32)
row[::32] = 6.0
gen = torch.Generator().manual_seed(7)
x = torch.cat([row[None].repeat(2, 1) * torch.tensor([[1.0], [2.0 ** -5]]),
               torch.randn(tokens - 2, hidden, generator=gen) * 3.0]).to(torch.bfloat16)
ids = torch.zeros(tokens, 2, dtype=torch.int32)
w = torch.ones(tokens, 2)
bx = torch.zeros(16, hidden // 2, dtype=torch.int8)
bsf = torch.zeros(16, hidden // 128, dtype=torch.int32)
pre_dispatch(x, ids, w, bx, bsf, torch.zeros(16, 2, dtype=torch.int64), torch.zeros(16, 2), variant="mxf4xmxf4",
             tiling=PreDispatchTiling(2, 256, 4), e2m1_ties=ties)
packed, sf = math.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
exponents = (sf.view(torch.int32) >> 23) & 0xFF  # UE8M0 byte of a power-of-two fp32 scale
got_sf = bsf[:tokens].contiguous().view(torch.uint8)[:, : hidden // 32].to(torch.int32)
print("RESULT " + json.dumps({
    "codes_equal": torch.equal(bx[:tokens], packed.view(torch.int8)),
    "scales_equal": torch.equal(got_sf, exponents.to(torch.int32)),
    "mismatched_bytes": int((bx[:tokens] != packed.view(torch.int8)).sum()),
}))
"""


@pytest.mark.parametrize("version", MXF4_RELEASES)
def test_triton_pre_dispatch_rounds_as_the_release(version: str) -> None:
    pytest.importorskip("triton")
    package = _sources(version)
    math_file = package / "utils" / "math.py"
    if not math_file.exists():
        pytest.skip(f"sgl-deep-gemm {version} has no deep_gemm/utils/math.py")
    ties = dga.api_from_source_dir(package, environ={}).e2m1_ties
    assert ties == ("toward_zero" if version in TOWARD_ZERO else "even")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(math_file), ties],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    result = json.loads(line[len("RESULT ") :])
    assert result["scales_equal"] and result["codes_equal"], result


def test_release_helpers_disagree_on_ties() -> None:
    """The two rules differ on midpoints (so the test above can fail): 0.1.7 and 0.2.0 give other codes."""
    import torch

    def load(version: str):
        spec = importlib.util.spec_from_file_location(f"dg_math_{version}", _sources(version) / "utils" / "math.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    x = torch.tensor([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 4], dtype=torch.bfloat16)
    old, _ = load("0.1.7").per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    new, _ = load("0.2.0").per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    assert not torch.equal(old, new)


def test_w4a4_torch_pre_dispatch_declines_a_toward_zero_release() -> None:
    shape, config = model_key("Qwen/Qwen3-30B-A3B", "mxf4xmxf4", Platform.cuda(10, 0))
    shape = type(shape)(**{**shape.__dict__, "intermediate": 1024})
    old = dga.api_from_source_dir(_sources("0.1.7"), environ={})
    plugin = mdg.MegaW4A4Plugin(old)
    plugin.options = {"pre_dispatch": "torch"}
    support = plugin.supports(shape, config)
    assert not support and "rounds E2M1 ties to even" in support.reason and "0.1.7" in support.reason
    plugin.options = {"pre_dispatch": "triton"}
    support = plugin.supports(shape, config)
    assert support and "E2M1 ties toward zero" in support.reason
    unknown = mdg.MegaW4A4Plugin(type(API_MMA_TYPE)(**{**API_MMA_TYPE.__dict__, "e2m1_ties": None}))
    unknown.options = {"pre_dispatch": "triton"}
    assert "cannot tell how" in unknown.supports(shape, config).reason
