"""The conformance suite on op mega_moe: mega_reference passes (API and CLI), broken mega plugins fail, named.

Runs on CPU with fixed seeds and a reduced draw (one catalog model, one catalog run, few random cases).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.testing import SuiteOptions, conformance_for, run_conformance
from sglang_moe_plugins.testing.ops.mega_moe import MEGA_TOLERANCE, compare_with_reference
from sglang_moe_plugins.testing.ops.mega_moe_cases import ROUTINGS, make_problem
from sglang_moe_plugins.testing.report import FAILED, PASSED

HERE = os.path.dirname(__file__)
BROKEN = os.path.join(HERE, "broken_plugins.py")
EXE = shutil.which("sglang-moe-plugins", path=os.path.dirname(sys.executable)) or "sglang-moe-plugins"
#: The API run: one catalog model (EP 1 and 8, one catalog case run) and random cases; the CLI run below
#: covers the edge cases (each suite run on CPU costs ~0.5 s per case run).
SMALL = dict(
    seed=0, models=("Qwen3-30B-A3B",), eps=(1, 8), max_catalog_runs=1, random_cases=4, edge_cases=False, device="cpu"
)
#: Broken plugins accept fp8xfp4 only; edge and random cases suffice to catch each.
BROKEN_OPTIONS = dict(seed=0, catalog=False, random_cases=3, device="cpu")


@pytest.fixture(scope="module")
def reference_report():
    return run_conformance("mega_reference", SuiteOptions(**SMALL))


def test_cases_cover_catalog_variants_tokens_routings_and_seeded_random():
    adapter = conformance_for("mega_moe")
    assert adapter is not None and adapter.coverage == "full"
    options = SuiteOptions(seed=3, random_cases=6)
    cases = adapter.cases(options, Platform.cpu(), 3)
    labels = [c.label for c in cases]
    assert {c.origin for c in cases} == {"catalog", "edge", "random"}
    assert {c.config.variant for c in cases} == set(mm.VARIANTS)
    assert all(c.config.platform == Platform.cpu() for c in cases)
    assert not any("gpt-oss" in label for label in labels)
    for ep in (1, 2, 4, 8):
        assert any(f" EP{ep}" in label and not c.execute for label, c in zip(labels, cases))
    assert any("decode T=" in label for label in labels) and any("prefill T=" in label for label in labels)
    tokens = {int(c.masked_m.split()[0][2:]) for c in cases if c.execute}
    assert 0 in tokens and 1 in tokens
    assert {c.masked_m.split()[1] for c in cases if c.execute} == set(ROUTINGS)
    assert all(c.shape.ep_size == 1 for c in cases if c.execute)
    assert sum(c.origin == "random" for c in cases) == 6
    again = adapter.cases(options, Platform.cpu(), 3)
    assert [(c.shape, c.config, c.masked_m, c.seed) for c in again] == [
        (c.shape, c.config, c.masked_m, c.seed) for c in cases
    ]


def test_mega_reference_passes_through_the_api(reference_report):
    report = reference_report
    assert report.passed and report.status == PASSED, report.summary()
    assert report.coverage == "full" and report.op == "mega_moe"
    assert all(c.status == PASSED for c in report.checks), report.summary()
    ran = [c for c in report.cases if c.status == PASSED]
    assert {c.origin for c in ran} == {"catalog", "random"}
    # EP 8 is declined with the reason, not crashed.
    ep8 = [c for c in report.cases if " EP8" in c.label]
    assert ep8 and all(c.status == "rejected" and "ep_size=1" in c.reason for c in ep8)
    assert report.check("supports_answer").checked == len(report.cases)


def test_tolerance_rejects_a_small_perturbation_and_names_the_row():
    p = make_problem("fp8xfp4", seed=5, tokens=6)
    out = mm.allocate_outputs(p.shape, p.config, torch.device("cpu"), num_tokens=6)
    from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin

    MegaReferencePlugin().run(p.inputs, out, p.shape, p.config)
    assert compare_with_reference(p.inputs, out.y, p.shape, p.config) is None
    out.y[4] *= 1.2
    message = compare_with_reference(p.inputs, out.y, p.shape, p.config)
    assert message and message.startswith("y row 4") and MEGA_TOLERANCE.describe() in message


def test_check_mega_reference_through_the_cli():
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    proc = subprocess.run(
        [
            EXE,
            "check",
            "mega_reference",
            "--seed",
            "1",
            "--cases",
            "0",
            "--no-catalog",
            "--device",
            "cpu",
            "--no-progress",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["status"] == "passed" and data["coverage"] == "full" and data["op"] == "mega_moe"
    assert data["cases_run"] > 0 and data["seed"] == 1
    assert all(check["status"] == "passed" for check in data["checks"]), data["checks"]
    ran = [c for c in data["cases"] if c["status"] == "passed"]
    assert {c["origin"] for c in ran} == {"edge"}
    assert {c["config"].split()[1] for c in ran} == set(mm.VARIANTS)
    assert any(c["label"].startswith("zero tokens") for c in ran)
    assert any(c["label"].startswith("every slot masked") for c in ran)


@pytest.mark.parametrize(
    "cls,check,message",
    [
        ("MegaUnwrittenRowPlugin", "rows_written", "still holds the NaN poison"),
        ("MegaWrongDtypePlugin", "output_layout", "the host requires torch.bfloat16"),
        ("MegaWrongNumericsPlugin", "numerics", "from the reference"),
        ("MegaCrashesOnZeroTokensPlugin", "run_no_crash", "then run() raised IndexError"),
    ],
)
def test_suite_fails_each_broken_mega_plugin_and_names_the_check(cls, check, message):
    report = run_conformance(f"{BROKEN}:{cls}", SuiteOptions(**BROKEN_OPTIONS))
    assert report.status == FAILED and not report.passed
    result = report.check(check)
    assert result.status == FAILED, report.summary()
    assert message in result.first_failure.error, result.first_failure.error
    assert f"[{check}]" in report.summary()
