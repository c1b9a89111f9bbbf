"""The parts of the contract the kit did not check: a host sync in run(), a prepared launch whose bits
change from its second call, references kept to a call's inputs, nonzero packed UE8M0 pad bytes; and the
speed report against the reference (information, not a failure). Runs on CPU, through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sglang_moe_plugins.testing import SuiteOptions, run_conformance
from sglang_moe_plugins.testing.report import PASSED

HERE = os.path.dirname(__file__)
PLUGINS = os.path.join(HERE, "kit_contract_plugins.py")
SHORT = ("--seed", "0", "--cases", "4", "--catalog-runs", "2")

BROKEN = [
    ("HostSyncPlugin", "no_host_sync", "read tensor data on the host: masked_m.tolist()"),
    ("LaunchDriftsPlugin", "prepare", "the launch from prepare() wrote different scale on call 2"),
    ("KeepsInputsPlugin", "inputs_released", "keeps a reference to 1 of the call's"),
    ("NonzeroPadBytesPlugin", "padding_bytes", "the contract requires 0 in the pad bytes"),
]


@pytest.mark.parametrize("cls, check, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_check_fails_each_contract_break_and_names_it(cls, check, message):
    done = subprocess.run(
        [sys.executable, "-m", "sglang_moe_plugins", "check", f"{PLUGINS}:{cls}", "--no-progress", *SHORT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    first = done.stdout.split("first failure: ", 1)[1].splitlines()
    assert first[0].startswith(f"[{check}]"), done.stdout
    assert message in done.stdout.split("first failure: ", 1)[1], done.stdout


def test_a_slow_plugin_gets_a_speed_report_and_passes():
    report = run_conformance(f"{PLUGINS}:SlowRunPlugin", SuiteOptions(seed=0, catalog=False, random_cases=2))
    assert report.status == PASSED, report.summary()
    assert report.speed.startswith("speed: run() took ") and "information, not a check" in report.speed
    assert report.speed in report.summary()


def test_the_example_plugin_passes_the_new_checks():
    report = run_conformance("example_torch", SuiteOptions(seed=0, catalog=False, random_cases=2))
    for name in ("no_host_sync", "padding_bytes", "inputs_released", "prepare"):
        assert report.check(name).status == PASSED, report.summary()


def test_repeats_finds_nondeterminism_that_two_calls_per_case_miss():
    target = f"{PLUGINS}:RarelyNondeterministicPlugin"
    quick = dict(seed=0, catalog=False, random_cases=2)
    assert run_conformance(target, SuiteOptions(**quick)).status == PASSED
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_moe_plugins",
            "check",
            target,
            "--no-progress",
            "--no-catalog",
            *SHORT,
            "--repeats",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    first = done.stdout.split("first failure: ", 1)[1]
    assert first.startswith("[deterministic]") and "(--repeats 4;" in first, done.stdout
