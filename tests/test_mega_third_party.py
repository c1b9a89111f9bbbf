"""A third-party mega_moe plugin written with torch alone: selected, dispatched and passed by the conformance kit,
in a process where importing DeepGEMM is impossible (the op's types name no kernel library)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[1]

PLUGIN = textwrap.dedent(
    '''
    """A pure-torch SM90-FP8-layout MegaMoE plugin, as a third party would write it."""
    import torch

    from sglang_moe_plugins.contract import Plugin, Support
    from sglang_moe_plugins.ops import mega_moe as mm
    from sglang_moe_plugins.ops.mega_moe.reference import mega_moe_reference


    class TorchMegaPlugin(Plugin):
        name = "third_party_torch_mega"
        op = mm.OP
        priority = 50

        def supports(self, shape, config):
            if config.variant != "sm90_fp8":
                return Support.no(f"FP8 block-128 weights only, got {config.variant}")
            if shape.ep_size != 1:
                return Support.no("needs every expert on this rank")
            return Support.yes("pure torch")

        def prepare(self, shape, config):
            def launch(inputs, outputs):
                mega_moe_reference(inputs, outputs, shape, config)
            return launch

        def run(self, inputs, outputs, shape, config):
            self.prepare(shape, config)(inputs, outputs)
    '''
)

DRIVER = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class NoDeepGemm(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "deep_gemm" or name.startswith("deep_gemm."):
                raise ImportError("deep_gemm is blocked in this test")
            return None

    sys.meta_path.insert(0, NoDeepGemm())
    sys.path.insert(0, sys.argv[1])
    import torch
    from third_party_mega import TorchMegaPlugin
    from sglang_moe_plugins.ops import mega_moe as mm
    from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin
    from sglang_moe_plugins.core.registry import Registry
    from sglang_moe_plugins.core.dispatcher import Selector
    from sglang_moe_plugins.testing import SuiteOptions, run_conformance
    from sglang_moe_plugins.testing.ops.mega_moe import compare_with_reference
    from sglang_moe_plugins.testing.ops.mega_moe_cases import make_problem

    problem = make_problem("sm90_fp8", seed=3, tokens=7, experts=4, hidden=256, inter=256, top_k=2)
    selector = Selector(Registry.from_plugins([TorchMegaPlugin(), MegaReferencePlugin()]))
    chosen = selector.select(mm.OP, problem.shape, problem.config).chosen.name
    outputs = mm.allocate_outputs(problem.shape, problem.config, torch.device("cpu"), num_tokens=7)
    outputs.y.fill_(float("nan"))
    result = selector.dispatch(mm.OP, problem.inputs, problem.shape, problem.config, outputs=outputs)
    error = compare_with_reference(problem.inputs, result.y, problem.shape, problem.config)
    report = run_conformance(TorchMegaPlugin, SuiteOptions(seed=0, catalog=False, random_cases=3, device="cpu"))
    ran = sorted({c.config.split()[1] for c in report.cases if c.status == "passed"}) if report.cases else []
    print(json.dumps({
        "chosen": chosen, "error": error, "status": report.status, "summary": report.summary()[-2000:],
        "deep_gemm_loaded": any(m == "deep_gemm" or m.startswith("deep_gemm.") for m in sys.modules),
        "passed_variants": ran,
    }))
    """
)


def test_a_pure_torch_mega_plugin_needs_no_deep_gemm(tmp_path: pathlib.Path) -> None:
    (tmp_path / "third_party_mega.py").write_text(PLUGIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path)], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["chosen"] == "third_party_torch_mega" and result["error"] is None
    assert result["status"] == "passed", result["summary"]
    assert result["passed_variants"] == ["sm90_fp8"]
    assert result["deep_gemm_loaded"] is False
