"""The conformance kit draws its cases inside the plugin's support and reports coverage per dimension.

A narrow plugin (group 128 only, D a multiple of 512, no swizzle) declined nearly every blindly drawn
case, so two real bugs passed ``check``: one wrong only for N > 256, one that rounds to bf16 yet accepts
``keep_fp32`` calls. Runs on CPU, through the CLI as a user runs it and through ``run_conformance``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sglang_moe_plugins.testing import SuiteOptions, run_conformance
from sglang_moe_plugins.testing.report import PASSED

HERE = os.path.dirname(__file__)
NARROW = os.path.join(HERE, "kit_narrow_plugins.py")
#: The default draw, fewer catalog runs and random cases (the default options catch the same bugs).
OPTIONS = dict(seed=0, random_cases=8, max_catalog_runs=4)


def _check(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_moe_plugins", "check", target, "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_narrow_plugin_is_exercised_on_every_dimension_it_accepts_and_the_report_says_so():
    report = run_conformance(f"{NARROW}:NarrowPlugin", SuiteOptions(**OPTIONS))
    assert report.status == PASSED, report.summary()
    dims = {d.name: d for d in report.dimensions}
    assert dims["group_size"].ran == ("128",) and dims["group_size"].declined == ("16", "32", "64", "256")
    assert dims["swizzle"].ran == ("off",) and dims["swizzle"].declined == ("on",)
    for name in ("keep_fp32", "gateup_writable", "scale_layout", "swiglu_limit", "masked_m"):
        assert not dims[name].declined and not dims[name].not_run, dims[name]
    assert dims["keep_fp32"].ran == ("off", "on") and dims["gateup_writable"].ran == ("no", "yes")
    assert set(dims["experts"].ran) == {"0", "1", "2+"}
    assert {"0", "257+ (tall expert)", "1024+ (prefill)"} <= set(dims["rows"].ran)
    assert report.coverage == "full", report.summary()
    random_ran = [c for c in report.cases if c.origin == "random" and c.status == PASSED]
    assert len(random_ran) >= OPTIONS["random_cases"] // 2, [c.label for c in report.cases if c.origin == "random"]
    summary = report.summary()
    assert "coverage by dimension:" in summary
    assert "group_size: ran 128; declined 16, 32, 64, 256" in summary


def test_the_reference_covers_every_dimension():
    report = run_conformance("reference", SuiteOptions(**OPTIONS))
    assert report.status == PASSED and report.coverage == "full", report.summary()
    assert all(not d.declined and not d.not_run for d in report.dimensions), report.summary()


@pytest.mark.parametrize(
    "cls, check",
    [("NarrowWrongForTallExperts", "numerics"), ("NarrowRoundsToBf16", "numerics")],
)
def test_bugs_the_blind_draw_let_through_fail_check(cls, check):
    # Caught at the default options too (the search does not depend on --cases or --catalog-runs);
    # fewer catalog runs and random cases keep this test short.
    done = _check(f"{NARROW}:{cls}", "--seed", "0", "--cases", "6", "--catalog-runs", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"first failure: [{check}]" in done.stdout, done.stdout
    first = done.stdout.split("first failure:", 1)[1]
    if cls == "NarrowWrongForTallExperts":
        assert "N=3" in first or "tall" in first or "1024" in first, first
    else:
        assert "keep_fp32" in first, first
