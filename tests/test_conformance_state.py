"""The conformance kit catches stateful, nondeterministic, tile-size, padding, naming and EP > 1 bugs, each named.

Each broken plugin (tests/broken_plugins.py) is loaded by path, as an author would check it; the
controls (the example plugin, which computes padding rows too, and correct plugins) still pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from sglang_moe_plugins.cli.check import EXIT_INCOMPLETE
from sglang_moe_plugins.testing import SuiteOptions, run_conformance
from sglang_moe_plugins.testing.report import FAILED, INCOMPLETE, PASSED

HERE = os.path.dirname(__file__)
BROKEN = os.path.join(HERE, "broken_plugins.py")
REPO = os.path.dirname(HERE)
#: silu_mul_quant: edge cases (the tall experts among them) and a few catalog and random cases.
SMQ = dict(seed=0, models=("Qwen3-30B-A3B",), eps=(1,), max_catalog_runs=2, random_cases=6, device="cpu")
#: mega_moe: edge and random cases of the W4A8-only broken plugins.
MEGA = dict(seed=0, catalog=False, random_cases=2, device="cpu")

CAUGHT = [
    ("FirstTilePlugin", SMQ, "rows_written", "of real row 64 of expert"),
    ("PrepareReplaysPlugin", SMQ, "second_call", "stale output on the second call of a key through prepare()'s launch"),
    (
        "PrepareKeepsInputsPlugin",
        SMQ,
        "second_call",
        "stale output on the second call of a key through prepare()'s launch",
    ),
    ("RunCachesPerKeyPlugin", SMQ, "second_call", "stale output on the second call of a key through run()"),
    ("NondeterministicPlugin", SMQ, "deterministic", "two run() calls on identical inputs wrote different scale"),
    ("ReadsPastMaskedMPlugin", SMQ, "padding_ignored", "reads rows past masked_m"),
    ("BuiltinNamedReferencePlugin", SMQ, "name", "is the name of the built-in plugin"),
    ("BuiltinNamedTritonPlugin", SMQ, "name", "'triton' is the name of the built-in plugin"),
    ("MegaFirstTilePlugin", MEGA, "rows_written", "y row 64 (token 64 of 272)"),
    ("MegaDecodesOncePerKeyPlugin", MEGA, "second_call", "stale output on the second call of a key through run()"),
    ("MegaClaimsEpPlugin", MEGA, "expert_parallel", "accepts ep_size=2, but over 2 gloo ranks on CPU rank"),
]


@pytest.mark.parametrize("cls, options, check, message", CAUGHT, ids=[c[0] for c in CAUGHT])
def test_each_broken_plugin_is_caught_with_the_right_message(cls, options, check, message):
    report = run_conformance(f"{BROKEN}:{cls}", SuiteOptions(**options))
    assert report.status == FAILED, report.summary()
    result = report.check(check)
    assert result.status == FAILED, report.summary()
    assert message in result.first_failure.error, result.first_failure.error
    if check == "padding_ignored":  # the misattribution of before: reported as an unwritten row
        assert report.check("rows_written").status == PASSED, report.summary()
        assert "not written" not in result.first_failure.error
    if check == "deterministic":
        assert report.check("padding_ignored").status == PASSED, report.summary()


@pytest.mark.parametrize(
    "cls, options",
    [
        ("ExampleTorchPlugin", SMQ),  # computes (and writes) padding rows too: legal
        ("DeclaredNondeterministicPlugin", SMQ),
        ("MegaAllGatherEpPlugin", MEGA),
    ],
    ids=["padded-rows-example", "declared-nondeterministic", "mega-ep-allgather"],
)
def test_legal_controls_pass(cls, options):
    target = "sglang_moe_example_plugin:ExampleTorchPlugin" if cls == "ExampleTorchPlugin" else f"{BROKEN}:{cls}"
    report = run_conformance(target, SuiteOptions(**options))
    assert report.status == PASSED, report.summary()
    assert report.check("second_call").checked >= report.cases_run > 0
    assert report.check("deterministic").checked == report.cases_run
    if cls == "DeclaredNondeterministicPlugin":
        assert "deterministic = False" in report.check("deterministic").note
    if cls == "MegaAllGatherEpPlugin":
        assert report.check("expert_parallel").checked >= 1 and "gloo ranks" in report.check("expert_parallel").note
    else:
        assert report.check("padding_ignored").checked > 0


def test_default_cases_have_more_real_rows_than_any_common_tile():
    from sglang_moe_plugins.hardware import Platform
    from sglang_moe_plugins.testing import conformance_for
    from sglang_moe_plugins.testing.ops.mega_moe_cases import parse_batch

    options = SuiteOptions(seed=0)
    smq = [
        c
        for c in conformance_for("silu_mul_quant").cases(options, Platform.cpu(), 0)
        if c.execute and c.origin == "edge"
    ]
    assert any(c.shape.max_rows >= 257 and c.masked_m in ("ragged", "full") for c in smq)
    mega = [
        c for c in conformance_for("mega_moe").cases(options, Platform.cpu(), 0) if c.execute and c.origin == "edge"
    ]
    assert any(parse_batch(c.masked_m)[0] >= 257 for c in mega)


def test_an_ep_claim_the_kit_cannot_run_is_incomplete_not_passed():
    from broken_plugins import MegaAllGatherEpPlugin

    class Local(MegaAllGatherEpPlugin):  # defined in a function: the ranks' processes cannot import it
        name = "local_ep_claim"

    report = run_conformance(Local(), SuiteOptions(**dict(MEGA, random_cases=0)))
    assert report.status == INCOMPLETE and not report.passed, report.summary()
    assert "claims EP > 1; not exercised" in report.check("expert_parallel").note
    assert "claims EP > 1; not exercised" in report.summary() and "result: INCOMPLETE" in report.summary()


def test_check_exits_with_the_incomplete_status(tmp_path):
    (tmp_path / "declines_cpu_ep.py").write_text(
        textwrap.dedent('''
        from sglang_moe_plugins import Support
        from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin

        class DeclinesSmallEp(MegaReferencePlugin):
            """Claims EP > 1 for real model sizes only: the kit's small EP problem is declined."""
            name = "declines_small_ep"

            def supports(self, shape, config):
                if config.variant != "fp8xfp4":
                    return Support.no("fp8xfp4 only")
                if shape.ep_size > 1 and shape.hidden < 1024:
                    return Support.no("EP > 1 at hidden >= 1024 only")
                return Support.yes("EP > 1 at real sizes")
    ''')
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["PYTHONPATH"] = REPO
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_moe_plugins.cli",
            "check",
            str(tmp_path / "declines_cpu_ep.py"),
            "--seed",
            "0",
            "--model",
            "Qwen3-30B-A3B",
            "--catalog-runs",
            "0",
            "--cases",
            "0",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == EXIT_INCOMPLETE == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "claims EP > 1; not exercised" in proc.stdout and "declines the kit's CPU problem" in proc.stdout


def test_an_entry_point_named_unlike_its_plugin_fails_the_name_check(tmp_path):
    dist = tmp_path / "renamed_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: renamed-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[sglang_moe_plugins.kernels]\nsome_other_name = sglang_moe_example_plugin:ExampleTorchPlugin\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["PYTHONPATH"] = os.pathsep.join([REPO, str(tmp_path)])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_moe_plugins.cli",
            "check",
            "some_other_name",
            "--seed",
            "0",
            "--no-catalog",
            "--cases",
            "0",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        "[name]" in proc.stdout
        and "the entry point is named 'some_other_name' but the plugin's name is 'example_torch'" in proc.stdout
    )


def test_a_long_run_prints_its_estimate_first():
    seen = []
    run_conformance(
        f"{BROKEN}:DeclaredNondeterministicPlugin",
        SuiteOptions(**SMQ),
        estimate=lambda seconds, cases: seen.append((seconds, cases)),
    )
    assert seen == []  # a short run: no estimate
    from sglang_moe_plugins.testing import suite

    old = suite.ESTIMATE_THRESHOLD_S
    suite.ESTIMATE_THRESHOLD_S = 0.0
    try:
        report = run_conformance(
            f"{BROKEN}:DeclaredNondeterministicPlugin",
            SuiteOptions(**SMQ),
            estimate=lambda seconds, cases: seen.append((seconds, cases)),
        )
    finally:
        suite.ESTIMATE_THRESHOLD_S = old
    assert len(seen) == 1 and seen[0][1] == report.cases_run and seen[0][0] > 0
