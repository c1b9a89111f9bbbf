"""The first line of a failure names its cause, not a symptom or a side effect: a plugin whose prepared
launch keeps its first call's inputs leads with the stale output (not a supports() timeout), a
nondeterministic plugin with prepare() leads with ``deterministic`` (not a prepare mismatch), and the
"masked_m changed" message is short and shows the new value. Runs on CPU, through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
BROKEN = os.path.join(HERE, "broken_plugins.py")
PLUGINS = os.path.join(HERE, "kit_contract_plugins.py")
SHORT = ("--seed", "0", "--cases", "4", "--catalog-runs", "2", "--no-progress")

FIRST_LINES = [
    (f"{BROKEN}:PrepareKeepsInputsPlugin", "[second_call]", "stale output on the second call of a key"),
    (f"{BROKEN}:NondeterministicPlugin", "[deterministic]", "two run() calls on identical inputs"),
    (f"{PLUGINS}:JitterInTheKernelPlugin", "[deterministic]", "two run() calls on identical inputs"),
    (f"{PLUGINS}:ZeroesMaskedMPlugin", "[inputs_unchanged]", "masked_m changed at expert"),
]


@pytest.mark.parametrize("target, check, cause", FIRST_LINES, ids=[t[0].rsplit(":", 1)[1] for t in FIRST_LINES])
def test_the_first_failure_names_the_cause(target, check, cause):
    done = subprocess.run(
        [sys.executable, "-m", "sglang_moe_plugins", "check", target, *SHORT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    block = done.stdout.split("first failure: ", 1)[1].splitlines()
    assert block[0].startswith(check), done.stdout
    error = next(line for line in block if line.strip().startswith("error:"))
    assert cause in error, error
    if "masked_m" in cause:
        assert len(error) < 240 and "now 0" in error, error
