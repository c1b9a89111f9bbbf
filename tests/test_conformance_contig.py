"""The conformance suite on op ``silu_mul_quant_contig``: cases, tolerance policy, ``contig_reference``, broken
plugins (tests/contig_broken_plugins.py, checked by path), the CLI's ``check`` and the pytest plugin.

Runs on CPU. Every suite run here uses a fixed seed and a reduced case budget to stay fast.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from sglang_moe_plugins.catalog import get_model, load_catalog
from sglang_moe_plugins.cli import check as cli_check
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import OPS, silu_mul_quant_contig as contig
from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import contig_values, silu_mul_quant_contig_reference
from sglang_moe_plugins.quant import pack_ue8m0_bytes, quantize_fp8_groups, ue8m0_exponent
from sglang_moe_plugins.testing import CHECKS, SuiteOptions, ToleranceError, conformance_for, poison, run_conformance
from sglang_moe_plugins.testing.ops import silu_mul_quant as masked_policy
from sglang_moe_plugins.testing.ops.silu_mul_quant_contig import (
    BF16_ON_KEEP_FP32,
    ContigConformance,
    check_contig_against_fp64,
    compare_contig_with_fp64,
)
from sglang_moe_plugins.testing.ops.silu_mul_quant_contig_cases import (
    EDGE_ROWS,
    FRESH_EXTRA_ROWS,
    TPS,
    case_rows,
    compact_rows,
    make_gateup_rows,
)
from sglang_moe_plugins.testing.report import FAILED, PASSED

HERE = os.path.dirname(__file__)
BROKEN = os.path.join(HERE, "contig_broken_plugins.py")
BIN = os.path.dirname(sys.executable)
#: One catalog model (clamped SwiGLU), every edge case, a few random cases.
SMALL = dict(seed=0, models=("DeepSeek-V4-Flash",), max_catalog_runs=2, random_cases=3)
#: The broken plugins fail on the edge cases already.
EDGES = dict(seed=0, catalog=False, random_cases=2)


def _call(rows=37, hidden=384, group=128, *, seed=0, **config):
    shape = contig.ContigShape(hidden, group)
    cfg = contig.ContigConfig(Platform.cpu(), **config)
    gateup = make_gateup_rows(shape, rows, torch.Generator().manual_seed(seed))
    inputs = contig.ContigInputs(gateup)
    outputs = contig.allocate_outputs(shape, cfg, torch.device("cpu"), rows=rows)
    poison(outputs)
    return inputs, outputs, shape, cfg


def _bf16_product(inputs, outputs, shape, config):
    q, scale = quantize_fp8_groups(
        contig_values(inputs.gateup, config, bf16_product=True), shape.group_size, ue8m0=config.scale_ue8m0
    )
    outputs.out.copy_(q)
    outputs.scale.copy_(pack_ue8m0_bytes(ue8m0_exponent(scale)) if config.scale_ue8m0 else scale)


# -- the op's spec names the adapter; the adapter reuses the masked op's policy ----------------------


def test_the_spec_names_the_adapter_and_it_covers_the_op_fully():
    adapter = conformance_for(contig.OP)
    assert OPS[contig.OP].conformance == "sglang_moe_plugins.testing.ops.silu_mul_quant_contig:ContigConformance"
    assert isinstance(adapter, ContigConformance) and adapter.op == contig.OP and adapter.coverage == "full"
    module = sys.modules["sglang_moe_plugins.testing.ops.silu_mul_quant_contig"]
    for name in ("tolerance_for", "compare_with_fp64", "BF16_INTERMEDIATES", "Tolerance", "ToleranceError"):
        assert getattr(module, name) is getattr(masked_policy, name)  # imported, not copied


# -- tolerance policy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", contig.SCALE_LAYOUTS)
@pytest.mark.parametrize("keep_fp32", [False, True])
def test_policy_accepts_the_reference_and_names_a_wrong_value(layout, keep_fp32):
    inputs, outputs, shape, config = _call(scale_layout=layout, keep_fp32=keep_fp32, swiglu_limit=10.0)
    silu_mul_quant_contig_reference(inputs, outputs, shape, config)
    check_contig_against_fp64(inputs, outputs, shape, config)
    assert compare_contig_with_fp64(inputs, outputs, shape, config, masked_policy.EXACT).ok
    bits = outputs.out.view(torch.uint8)
    bits[20, 5] ^= 0x08  # one fp8 value off by a binade (sign and mantissa kept)
    with pytest.raises(ToleranceError, match=r"^fp8 value of row 20 column 5 dequantizes to"):
        check_contig_against_fp64(inputs, outputs, shape, config)


def test_policy_names_an_unwritten_row_and_counts_them():
    inputs, outputs, shape, config = _call(rows=9, scale_layout="ue8m0_packed")
    silu_mul_quant_contig_reference(inputs, outputs, shape, config)
    outputs.scale[8].fill_(-1)
    with pytest.raises(ToleranceError, match=r"^scale of row 8 \(the last row\) of M=9 still holds the poison"):
        check_contig_against_fp64(inputs, outputs, shape, config)
    outputs.out[3:5].view(torch.uint8).fill_(0x7F)
    with pytest.raises(ToleranceError, match=r"^out of row 3 of M=9 still holds the poison .*: 2 row\(s\) not written"):
        check_contig_against_fp64(inputs, outputs, shape, config)


@pytest.mark.parametrize("layout", contig.SCALE_LAYOUTS)
def test_a_bf16_product_passes_without_keep_fp32_and_fails_with_it_naming_why(layout):
    for keep_fp32, ok in ((False, True), (True, False)):
        inputs, outputs, shape, config = _call(rows=64, hidden=512, scale_layout=layout, keep_fp32=keep_fp32, seed=3)
        _bf16_product(inputs, outputs, shape, config)
        result = compare_contig_with_fp64(inputs, outputs, shape, config)
        assert result.ok is ok, result.message
        if not ok:
            assert result.message.startswith(BF16_ON_KEEP_FP32)
            # The loose policy passes it: the cause is the rounding, not a wrong kernel.
            assert compare_contig_with_fp64(inputs, outputs, shape, config, masked_policy.BF16_INTERMEDIATES).ok


def test_a_doubled_scale_is_not_taken_for_a_bf16_product():
    inputs, outputs, shape, config = _call(keep_fp32=True)
    silu_mul_quant_contig_reference(inputs, outputs, shape, config)
    outputs.scale[4, 2].mul_(2.0)
    result = compare_contig_with_fp64(inputs, outputs, shape, config)
    assert not result.ok and result.message.startswith("fp32 scale of row 4 group 2 is"), result.message


# -- cases ---------------------------------------------------------------------------------------------


def test_compact_rows_follow_the_host_formula():
    # DeepSeek-V4-Flash at TP4 (256 experts, top-k 6), block 128 / 32: HOST-FACTS, "At decode the compact layout's padding dominates".
    assert [compact_rows(t, 6, 256) for t in (1, 16, 64, 256)] == [768, 12288, 32896, 34048]
    assert [compact_rows(t, 6, 256, block=32) for t in (1, 16, 64, 256)] == [192, 3072, 8320, 9472]
    assert compact_rows(0, 6, 256) == 0


def test_cases_cover_rows_catalog_hiddens_groups_and_flags():
    adapter = ContigConformance()
    options = SuiteOptions(seed=7)
    cases = adapter.cases(options, Platform.cpu(), 7)
    rows = {case_rows(c) for c in cases}
    assert set(EDGE_ROWS) <= rows
    catalog = [c for c in cases if c.origin == "catalog"]
    # (D, layout, limit, M at real size) of every catalog case; models of equal sizes share their cases.
    drawn = {
        (c.shape.hidden, c.config.scale_layout, c.config.swiglu_limit, int(re.search(r"\(M=(\d+)\)", c.label).group(1)))
        for c in catalog
    }
    for model in load_catalog():
        if model.gpt_oss_activation:
            assert not any(c.group == model.short_name for c in catalog)
            continue
        for tp in TPS:
            d = model.inter // tp
            if model.inter % tp == 0 and d % 128 == 0:
                for layout in contig.SCALE_LAYOUTS:
                    for tokens in options.rows:
                        rows = compact_rows(tokens, model.topk, model.experts)
                        assert (d, layout, model.swiglu_limit, rows) in drawn, (model.short_name, tp, layout, tokens)
    flash = get_model("DeepSeek-V4-Flash")
    assert any(
        c.label.startswith(f"DeepSeek-V4-Flash TP4 T=128 (M={compact_rows(128, flash.topk, flash.experts)})")
        for c in catalog
    )
    assert {32, 64, 128} <= {c.shape.group_size for c in cases}
    configs = [c.config for c in cases]
    assert any(c.swizzle for c in configs) and any(c.swiglu_limit is not None for c in configs)
    assert any(c.keep_fp32 and c.scale_ue8m0 for c in configs) and any(
        c.keep_fp32 and not c.scale_ue8m0 for c in configs
    )
    assert any(c.inputs_writable for c in cases) and {c.origin for c in cases} == {"catalog", "edge", "random"}
    budget = options.resolved_max_elements(Platform.cpu())
    assert all(case_rows(c) * 2 * c.shape.hidden <= budget for c in cases if c.execute)
    assert any(not c.execute and "size budget" in c.note for c in catalog)
    again = adapter.cases(options, Platform.cpu(), 7)
    assert [(c.shape, c.config, c.masked_m, c.seed) for c in again] == [
        (c.shape, c.config, c.masked_m, c.seed) for c in cases
    ]
    other = adapter.cases(options, Platform.cpu(), 8)
    assert [(c.shape, c.masked_m) for c in other if c.origin == "random"] != [
        (c.shape, c.masked_m) for c in cases if c.origin == "random"
    ]


def test_inputs_are_contiguous_nonzero_and_the_second_call_has_other_rows():
    adapter = ContigConformance()
    case = next(
        c
        for c in adapter.cases(SuiteOptions(seed=1, catalog=False, random_cases=0), Platform.cpu(), 1)
        if c.label == "M=127 UE8M0 swiglu_limit=10"
    )
    inputs = adapter.make_inputs(case, torch.device("cpu"))
    assert (
        inputs.gateup.shape == (127, 1024)
        and inputs.gateup.is_contiguous()
        and int((inputs.gateup != 0).any(-1).sum()) >= 126
    )
    assert torch.equal(adapter.make_inputs(case, torch.device("cpu")).gateup, inputs.gateup)
    fresh = adapter.make_fresh_inputs(case, case, torch.device("cpu"))
    assert fresh.rows == 127 + FRESH_EXTRA_ROWS
    outputs = adapter.allocate_outputs(case, inputs, torch.device("cpu"))
    assert outputs.scale.shape == (127, 1) and outputs.scale.stride() == (1, 128)


# -- the suite ------------------------------------------------------------------------------------------


def test_contig_reference_passes_every_check():
    report = run_conformance("contig_reference", SuiteOptions(**SMALL))
    assert report.passed and report.status == PASSED and report.coverage == "full", report.summary()
    assert [c.name for c in report.checks] == list(CHECKS)
    assert all(c.status == PASSED for c in report.checks), report.summary()
    ran = {c.masked_m for c in report.cases if c.status == PASSED}
    assert {f"M={m}" for m in EDGE_ROWS} <= ran
    assert sum(c.origin == "catalog" and c.status == PASSED for c in report.cases) == 2
    assert report.cases_failed == 0 and report.cases_run >= 30
    assert "no padding rows" in report.check("padding_ignored").note


@pytest.mark.parametrize(
    "cls, check, first_line",
    [
        ("WrongGroupScalePlugin", "numerics", r"^(fp32|UE8M0) scale of row \d+ group \d+ is "),
        (
            "LastRowUnwrittenPlugin",
            "rows_written",
            r"^out of row (\d+) \(the last row\) of M=(\d+) still holds the poison",
        ),
        ("Bf16ProductPlugin", "numerics", "^" + re.escape(BF16_ON_KEEP_FP32)),
        (
            "WritesGateupPlugin",
            "inputs_unchanged",
            r"^gateup changed at row 0 column 0, though the caller did not mark it writable",
        ),
        (
            "RowMajorPackedScalePlugin",
            "rows_written",
            r"^ue8m0_packed scales written through row-major strides \(\d+, 1\): "
            r"the host's scale tensor \[M, ceil\(G/4\)\] has strides \(1, \d+\)",
        ),
        (
            "ReturnsContiguousScalePlugin",
            "output_layout",
            r"^plugin 'broken_contig_returns_scale' returned its own scale tensor, not the host's: .* write into them",
        ),
        (
            "FirstRowCountPlugin",
            "second_call",
            r"^stale output on the second call of a key through prepare\(\)'s launch: "
            r"out of row \d+ of M=\d+ still holds the poison",
        ),
    ],
)
def test_suite_fails_each_broken_contig_plugin_with_the_cause_on_the_first_line(cls, check, first_line):
    report = run_conformance(f"{BROKEN}:{cls}", SuiteOptions(**EDGES))
    assert report.status == FAILED, report.summary()
    first = report.first_failure
    assert first is not None and first.check == check, report.summary()
    assert re.search(first_line, first.error.splitlines()[0]), first.error
    assert f"first failure: [{check}]" in report.summary()
    failures = [f for case in report.cases for f in case.failures]
    if cls == "LastRowUnwrittenPlugin":
        row, rows = (int(x) for x in re.search(first_line, first.error).groups())
        assert row == rows - 1
    if cls == "Bf16ProductPlugin":  # fails exactly the keep_fp32 calls, each naming the cause
        failed = {c.label for c in report.cases if c.status == FAILED}
        ran = [c for c in report.cases if c.status in (PASSED, FAILED)]
        assert failed == {c.label for c in ran if "keep_fp32" in c.config} and failed
        assert all(f.error.startswith(BF16_ON_KEEP_FP32) for f in failures)
    if cls == "RowMajorPackedScalePlugin":  # only packed calls fail, each naming the strides
        assert all(
            "ue8m0_packed" in f.config and f.error.startswith("ue8m0_packed scales written through row-major")
            for f in failures
        )
    if cls in ("WrongGroupScalePlugin", "Bf16ProductPlugin"):
        assert "the reference plugin contig_reference passes this case" in first.error


def test_a_bf16_product_plugin_that_declines_keep_fp32_passes():
    report = run_conformance(f"{BROKEN}:Bf16ProductDecliningPlugin", SuiteOptions(**EDGES))
    assert report.passed, report.summary()
    rejected = [c for c in report.cases if c.status == "rejected"]
    assert rejected and all("keep_fp32" in c.config and "keep_fp32" in c.reason for c in rejected)


# -- the CLI and the pytest plugin ---------------------------------------------------------------------


def test_cli_check_passes_contig_reference_and_fails_a_broken_plugin(capsys):
    args = [
        "contig_reference",
        "--seed",
        "0",
        "--cases",
        "2",
        "--model",
        "DeepSeek-V4-Flash",
        "--catalog-runs",
        "1",
        "--json",
        "--no-progress",
    ]
    result = subprocess.run(
        [os.path.join(BIN, "sglang-moe-plugins"), "check", *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["status"] == "passed" and report["op"] == contig.OP and report["cases_run"] >= 25
    code = cli_check.main(
        [f"{BROKEN}:LastRowUnwrittenPlugin", "--seed", "0", "--cases", "1", "--no-catalog", "--no-progress"]
    )
    out = capsys.readouterr().out
    assert code == cli_check.EXIT_FAILED
    assert "first failure: [rows_written] M=1" in out and "result: FAILED" in out
    assert re.search(r"error:  out of row 0 \(the last row\) of M=1 still holds the poison", out), out


def test_pytest_plugin_runs_the_suite_on_contig_plugins(tmp_path):
    test_file = tmp_path / "test_mine.py"
    test_file.write_text(
        "import pytest\n"
        "@pytest.mark.moe_plugin('contig_reference', seed=0, catalog=False, random_cases=1)\n"
        "def test_marker(moe_plugin_report):\n"
        "    assert moe_plugin_report.passed and moe_plugin_report.op == 'silu_mul_quant_contig'\n"
    )
    target = f"{BROKEN}:LastRowUnwrittenPlugin"
    args = [
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        str(test_file),
        "--moe-plugin",
        target,
        "--moe-plugin-seed",
        "0",
        "--moe-plugin-cases",
        "1",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *args], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 1, result.stdout[-3000:]
    assert re.search(rf"FAILED .*moe-plugin-conformance\[{re.escape(target)}\]", result.stdout), result.stdout[-3000:]
    assert "1 failed, 1 passed" in result.stdout and "first failure: [rows_written]" in result.stdout
