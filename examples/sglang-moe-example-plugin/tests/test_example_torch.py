"""The example plugin's own tests: the sglang-moe-plugins conformance suite, plus a few of its own."""

from __future__ import annotations

import pytest
import torch
from sglang_moe_example_plugin import ExampleTorchPlugin

from sglang_moe_plugins import Registry, Support
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.testing import check_against_fp64, poison, run_conformance


# The whole suite, through the pytest plugin that ships with sglang-moe-plugins. The marker's keyword
# arguments are SuiteOptions fields; a fixed seed keeps CI reproducible (drop it to draw a new one per run).
@pytest.mark.moe_plugin("example_torch", seed=0, random_cases=16, max_catalog_runs=12)
def test_conformance_suite(moe_plugin_report):
    moe_plugin_report.raise_for_failures()  # fails with the summary table and the first failing shape


def test_conformance_suite_as_a_function():
    report = run_conformance(ExampleTorchPlugin, seed=1, random_cases=4, catalog=False)
    assert report.passed, report.summary()
    rejected = {c.reason for c in report.cases if c.status == "rejected"}
    assert any("only group_size 128" in r for r in rejected)
    assert any("gran-8 swizzled" in r for r in rejected)


def test_registered_through_the_entry_point():
    record = Registry.discover().get("example_torch")
    assert record.distribution == "sglang-moe-example-plugin"
    assert record.priority == 25 and record.enabled


@pytest.mark.parametrize(
    "shape, config, ok",
    [
        (smq.SiluMulQuantShape(4, 8, 512, 128, 2), smq.SiluMulQuantConfig(), True),
        (smq.SiluMulQuantShape(4, 8, 512, 64, 2), smq.SiluMulQuantConfig(), False),
        (smq.SiluMulQuantShape(4, 8, 512, 128, 2), smq.SiluMulQuantConfig(swizzle=True), False),
        (
            smq.SiluMulQuantShape(4, 8, 512, 128, 2),
            smq.SiluMulQuantConfig(Platform.cuda(9, 0), swiglu_limit=10.0),
            True,
        ),
    ],
)
def test_supports_answers_with_a_reason(shape, config, ok):
    answer = ExampleTorchPlugin().supports(shape, config)
    assert isinstance(answer, Support) and bool(answer) is ok and answer.reason


@pytest.mark.parametrize("layout", smq.SCALE_LAYOUTS)
def test_chunked_run_matches_the_policy(layout):
    gen = torch.Generator().manual_seed(0)
    gateup = (torch.randn(5, 6, 2 * 384, generator=gen) * 8).to(torch.bfloat16)
    masked = torch.tensor([6, 0, 2, 5, 1], dtype=torch.int32)
    shape, config = smq.describe(gateup, masked, group_size=128, topk=4, swiglu_limit=10.0, scale_layout=layout)
    plugin = ExampleTorchPlugin()
    plugin.options = {"chunk_experts": 2}
    outputs = smq.allocate_outputs(shape, config, gateup.device)
    poison(outputs)
    plugin.run(smq.SiluMulQuantInputs(gateup, masked), outputs, shape, config)
    smq.validate_outputs(outputs, shape, config)
    check_against_fp64(smq.SiluMulQuantInputs(gateup, masked), outputs, shape, config)


def test_prepare_gives_the_launch_of_a_key():
    """The conformance suite checks prepare() (its 'prepare' check); here: the launch is what run() does,
    and a selector binds the plugin through it (run is not called per call)."""
    from sglang_moe_plugins import Selector, UserConfig

    gen = torch.Generator().manual_seed(3)
    gateup = (torch.randn(3, 4, 2 * 256, generator=gen) * 4).to(torch.bfloat16)
    masked = torch.tensor([4, 0, 3], dtype=torch.int32)
    shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
    inputs = smq.SiluMulQuantInputs(gateup, masked)
    plugin = ExampleTorchPlugin()
    selector = Selector(Registry.from_plugins([plugin], UserConfig()))
    bound = selector.bind(smq.OP, shape, config)
    assert bound.prepared and bound.name == "example_torch"
    got = selector.call(bound, inputs)
    want = smq.allocate_outputs(shape, config, gateup.device)
    plugin.run(inputs, want, shape, config)
    real = smq.real_rows(masked, 4)
    assert torch.equal(got.out.view(torch.uint8)[real], want.out.view(torch.uint8)[real])
    assert torch.equal(got.scale[real], want.scale[real])
    report = run_conformance(ExampleTorchPlugin, seed=2, random_cases=2, catalog=False)
    assert next(c for c in report.checks if c.name == "prepare").status == "passed", report.summary()
