"""tests/gpu/run_long_fuzz.py on CPU: shards run in parallel with their own MOE_FUZZ_SHARD, one CPU
thread each, their tallies are merged, a failing shard fails the run and is named, SIGTERM stops the
shards and the summary says so. (The real shards need CUDA; a stand-in test file plays them here.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "gpu" / "run_long_fuzz.py"

_SHARD = """
import json, os, time
import pytest

@pytest.fixture(scope="module", autouse=True)
def _summary():
    yield
    k, w = (int(p) for p in os.environ["MOE_FUZZ_SHARD"].split("/"))
    with open(os.environ["MOE_FUZZ_SUMMARY"], "w") as f:
        json.dump({"seconds": 0.1, "device": "stand-in", "counts": {"triton: checked": 10 + k,
                   "threads " + os.environ["OMP_NUM_THREADS"]: 1}, "worst": {"triton": 0.5 + k / 10}}, f)

def test_fuzz_silu_mul_quant_stand_in():
    k, w = (int(p) for p in os.environ["MOE_FUZZ_SHARD"].split("/"))
    assert os.environ["MOE_FUZZ_PROFILE"] == "long" and os.environ["MOE_FUZZ_SEED"] == "7"
    if os.environ.get("STAND_IN_SLEEP"):
        open(os.environ["MOE_FUZZ_SUMMARY"] + ".started", "w").close()
        time.sleep(float(os.environ["STAND_IN_SLEEP"]))
    assert k != int(os.environ.get("STAND_IN_FAIL", "-1")), f"shard {k} fails on purpose"
"""


def _run(tmp_path: Path, env_extra: dict, shards: int = 3, stop_when_started: bool = False):
    test_file = tmp_path / "stand_in_shard.py"
    test_file.write_text(textwrap.dedent(_SHARD))
    out = tmp_path / "fuzz" / "summary.json"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(env_extra, PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    cmd = [
        sys.executable,
        str(RUNNER),
        "--seed",
        "7",
        "--shards",
        str(shards),
        "--examples",
        "30",
        "--out",
        str(out),
        "--no-prewarm",
        "--test-file",
        str(test_file),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    if stop_when_started:  # every shard is inside its test: stop the run as `timeout` would
        deadline = time.time() + 120
        while len(list(out.parent.glob("*.started"))) < shards and time.time() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=240)
    return proc.returncode, json.loads(out.read_text()), stdout


def test_shards_are_merged(tmp_path):
    rc, summary, stdout = _run(tmp_path, {})
    assert rc == 0, stdout
    assert summary["complete"] is True and summary["failed_shards"] == [] and summary["interrupted"] is False
    assert summary["counts"]["triton: checked"] == 10 + 11 + 12
    assert summary["counts"]["threads 1"] == 3  # one CPU thread per shard
    assert summary["worst"]["triton"] == 0.7
    assert [s["shard"] for s in summary["shards"]] == [0, 1, 2] and all(s["rc"] == 0 for s in summary["shards"])


def test_a_failing_shard_fails_the_run(tmp_path):
    rc, summary, stdout = _run(tmp_path, {"STAND_IN_FAIL": "1"})
    assert rc == 1
    assert summary["failed_shards"] == [1] and summary["complete"] is False
    assert "shard 1 failed" in stdout and "fails on purpose" in stdout


def test_sigterm_stops_the_shards_and_keeps_their_tallies(tmp_path):
    rc, summary, stdout = _run(tmp_path, {"STAND_IN_SLEEP": "120"}, shards=2, stop_when_started=True)
    assert rc == 1, stdout
    assert summary["interrupted"] is True and summary["complete"] is False and summary["failed_shards"] == []
    assert summary["counts"]["triton: checked"] == 10 + 11  # written by each shard's teardown
