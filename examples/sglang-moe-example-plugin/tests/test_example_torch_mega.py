"""The example mega_moe plugin: the conformance kit passes it, and it matches the reference row for row."""

from __future__ import annotations

import pathlib

import pytest
import torch

from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.testing import load_plugin, run_conformance
from sglang_moe_plugins.testing.ops.mega_moe import compare_with_reference
from sglang_moe_plugins.testing.ops.mega_moe_cases import make_problem

# Loaded by path, as `sglang-moe-plugins check path.py:Class` does: the module next to these tests, whichever
# copy of the package is installed (a new entry point is visible only once the package is reinstalled).
MEGA = pathlib.Path(__file__).resolve().parents[1] / "sglang_moe_example_plugin" / "mega.py"
ExampleTorchMegaPlugin = type(load_plugin(f"{MEGA}:ExampleTorchMegaPlugin").plugin)


def test_conformance_suite():
    report = run_conformance(ExampleTorchMegaPlugin, seed=0, catalog=False, random_cases=0, device="cpu")
    assert report.passed, report.summary()
    ran = {c.config.split()[1] for c in report.cases if c.status == "passed"}
    assert ran == {"fp8xfp4", "mxf4xmxf4"}
    assert any(c.label.startswith("many tokens") for c in report.cases if c.status == "passed")
    rejected = {c.reason for c in report.cases if c.status == "rejected"}
    assert any("variants fp8xfp4, mxf4xmxf4 only" in r for r in rejected)


@pytest.mark.parametrize("variant, shared", [("fp8xfp4", True), ("mxf4xmxf4", False)])
def test_matches_the_reference_exactly(variant, shared):
    p = make_problem(
        variant,
        seed=4,
        tokens=9,
        experts=4,
        hidden=256,
        inter=512 if variant == "mxf4xmxf4" else 128,
        top_k=3,
        clamp=7.0,
        rsf=1.5,
        shared=shared,
    )
    got = mm.allocate_outputs(p.shape, p.config, torch.device("cpu"), num_tokens=9)
    got.y.fill_(float("nan"))
    ExampleTorchMegaPlugin().run(p.inputs, got, p.shape, p.config)
    assert compare_with_reference(p.inputs, got.y, p.shape, p.config) is None
    from sglang_moe_plugins.ops.mega_moe.reference import mega_moe_reference

    want = mm.allocate_outputs(p.shape, p.config, torch.device("cpu"), num_tokens=9)
    mega_moe_reference(p.inputs, want, p.shape, p.config)
    assert torch.equal(got.y.view(torch.int16), want.y.view(torch.int16))  # the documented numerics, bit for bit
