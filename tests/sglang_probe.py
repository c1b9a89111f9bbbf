"""A fresh Python process that imports real SGLang, runs its own ``load_plugins()`` and calls the hooked
``_varlen_deep_gemm_silu_mul_quant`` twice: what start-up does with a given environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

__all__ = ["PROBE", "run_probe"]

PROBE = """
    import json, logging, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    load_plugins()
    from sglang_moe_plugins.integrations.sglang import hook_status
    result = {"patched": sorted(t for t in HookRegistry._patched if "moe" in t), "calls": [],
              "stock": hook_status().get("stock")}
    gateup = torch.randn(2, 4, 512).to(torch.bfloat16)
    masked = torch.tensor([4, 1], dtype=torch.int32)
    for _ in range(2):
        try:
            runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
            result["calls"].append("ok")
        except Exception as exc:
            result["calls"].append(f"{type(exc).__name__}: {exc}")
    print("RESULT " + json.dumps(result))
"""


def run_probe(timeout: float = 300, **env: str) -> tuple[dict, str]:
    """Run :data:`PROBE` with ``env`` over this environment less its ``SGLANG_*`` variables; returns the
    probe's result (``patched`` targets, each call's outcome, ``stock`` ops) and its stderr."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE)], capture_output=True, text=True, env=full, timeout=timeout
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[len("RESULT ") :]), proc.stderr
