"""The example silu_mul_quant_contig plugin: the conformance suite, plus a few tests of its own."""

from __future__ import annotations

import pathlib

import pytest
import torch

from sglang_moe_plugins import Registry, Selector, Support, UserConfig
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import silu_mul_quant_contig as contig
from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import silu_mul_quant_contig_reference
from sglang_moe_plugins.testing import load_plugin, poison, run_conformance
from sglang_moe_plugins.testing.ops.silu_mul_quant_contig import check_contig_against_fp64

# Loaded by path, as `sglang-moe-plugins check path.py:Class` does: the module next to these tests, whichever
# copy of the package is installed (a new entry point is visible only once the package is reinstalled).
CONTIG = pathlib.Path(__file__).resolve().parents[1] / "sglang_moe_example_plugin" / "contig.py"
ExampleTorchContigPlugin = type(load_plugin(f"{CONTIG}:ExampleTorchContigPlugin").plugin)


# The whole suite through the pytest plugin (keywords: SuiteOptions fields; a fixed seed keeps CI reproducible).
@pytest.mark.moe_plugin("example_torch_contig", seed=0, random_cases=8, max_catalog_runs=4)
def test_conformance_suite(moe_plugin_report):
    moe_plugin_report.raise_for_failures()  # fails with the summary table and the first failing shape


def test_conformance_suite_as_a_function():
    report = run_conformance(ExampleTorchContigPlugin, seed=1, random_cases=4, catalog=False)
    assert report.passed, report.summary()
    assert {"M=0", "M=1", "M=4097"} <= {c.masked_m for c in report.cases if c.status == "passed"}
    assert any(c.status == "passed" and "keep_fp32" in c.config for c in report.cases)  # fp32 product: strict calls too
    rejected = {c.reason for c in report.cases if c.status == "rejected"}
    assert rejected and all("gran-8 swizzled" in r for r in rejected)


def test_registered_through_the_entry_point():
    record = Registry.discover().get("example_torch_contig")
    assert record.distribution == "sglang-moe-example-plugin" and record.op == contig.OP
    assert record.priority == 25 and record.enabled


@pytest.mark.parametrize(
    "config, ok",
    [
        (contig.ContigConfig(), True),
        (
            contig.ContigConfig(Platform.cuda(9, 0), swiglu_limit=10.0, scale_layout="ue8m0_packed", keep_fp32=True),
            True,
        ),
        (contig.ContigConfig(swizzle=True), False),
    ],
)
def test_supports_answers_with_a_reason(config, ok):
    answer = ExampleTorchContigPlugin().supports(contig.ContigShape(512, 128), config)
    assert isinstance(answer, Support) and bool(answer) is ok and answer.reason


@pytest.mark.parametrize("layout", contig.SCALE_LAYOUTS)
def test_one_key_serves_calls_of_any_row_count(layout):
    """M is the call's: one bound key, calls of 0, 5 and 130 rows, each checked against the strict policy and
    against contig_reference (fp8 bytes identical but for rare last-bit differences of SiLU)."""
    shape, config = contig.describe(
        torch.empty(0, 2 * 384, dtype=torch.bfloat16),
        group_size=64,
        swiglu_limit=10.0,
        scale_layout=layout,
        keep_fp32=True,
    )
    selector = Selector(Registry.from_plugins([ExampleTorchContigPlugin()], UserConfig()))
    bound = selector.bind(contig.OP, shape, config)
    assert bound.prepared and bound.name == "example_torch_contig"
    for rows in (0, 5, 130):
        gateup = (torch.randn(rows, 2 * 384, generator=torch.Generator().manual_seed(rows)) * 8).to(torch.bfloat16)
        inputs = contig.ContigInputs(gateup)
        outputs = contig.allocate_outputs(shape, config, gateup.device, rows=rows)
        poison(outputs)
        selector.call(bound, inputs, outputs)
        contig.validate_outputs(outputs, shape, config, inputs=inputs)
        check_contig_against_fp64(inputs, outputs, shape, config)
        want = contig.allocate_outputs(shape, config, gateup.device, rows=rows)
        silu_mul_quant_contig_reference(inputs, want, shape, config)
        same = (
            (outputs.out.view(torch.uint8) == want.out.view(torch.uint8)).float().mean() if rows else torch.tensor(1.0)
        )
        assert float(same) >= 0.999
