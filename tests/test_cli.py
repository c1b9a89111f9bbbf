"""The sglang-moe-plugins command, run as a user runs it (the installed console script)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

EXE = shutil.which("sglang-moe-plugins", path=os.path.dirname(sys.executable)) or "sglang-moe-plugins"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full.update(env)
    return subprocess.run([EXE, *args], capture_output=True, text=True, env=full, timeout=300)


def test_list_table_and_json():
    text = cli("list")
    assert text.returncode == 0, text.stderr
    for name in ("jit_ep", "fp8_fallback", "triton", "reference", "mega_w4a8", "mega_w4a4", "mega_sm90_fp8", "mega_reference"):
        assert name in text.stdout
    assert "enabled (default)" in text.stdout and "sglang-moe-plugins" in text.stdout
    data = json.loads(cli("list", "--json").stdout)
    by_name = {p["name"]: p for p in data["plugins"]}
    assert by_name["reference"]["available_here"] == "yes"
    assert by_name["jit_ep"]["available_here"].startswith("no: requires a CUDA device")
    assert by_name["jit_ep"]["distribution"] == "sglang-moe-plugins"


def test_list_shows_disabled_by_what():
    data = json.loads(cli("list", "--json", SGLANG_OPT_USE_JIT_EP_ACTIVATION="0").stdout)
    jit = next(p for p in data["plugins"] if p["name"] == "jit_ep")
    assert not jit["enabled"] and "legacy SGLANG_OPT_USE_JIT_EP_ACTIVATION=0" in jit["status"]
    assert any("translated to: disable jit_ep" in n for n in data["config_notes"])


def test_list_reports_config_errors_cleanly():
    result = cli("list", SGLANG_MOE_PLUGINS_DISABLE="nope")
    assert result.returncode == 2
    assert "sglang-moe-plugins list: error: unknown plugin 'nope' (disabled by SGLANG_MOE_PLUGINS_DISABLE); valid plugins:" in result.stderr
    assert "Traceback" not in result.stderr


def test_explain_model_at_ep_sizes():
    result = cli("explain", "--model", "Qwen3.5-35B-A3B", "--ep", "1", "2", "--rows", "64", "--platform", "sm90")
    assert result.returncode == 0, result.stderr
    assert "Qwen3.5-35B-A3B EP2 TP1 N=64: silu_mul_quant E=128 N=64 D=512" in result.stdout
    assert "D // 8 (64) must be >= E (128)" in result.stdout
    data = json.loads(cli("explain", "--model", "DeepSeek-V4-Flash", "--ep", "8", "--rows", "128", "--json").stdout)
    smq = [c for c in data if c["op"] == "silu_mul_quant"]
    assert smq and smq[0]["shape"] == {"num_experts": 32, "max_rows": 128, "hidden": 2048, "group_size": 128, "topk": 6}
    verdicts = {c["name"]: c["verdict"] for c in smq[0]["candidates"]}
    assert verdicts["jit_ep"] in ("chosen", "outranked") and smq[0]["chosen"] is not None


def test_explain_explicit_shape_and_platforms():
    result = cli("explain", "--experts", "512", "--hidden", "512", "--topk", "10", "--limit", "10", "--platform", "cpu", "--json")
    data = json.loads(result.stdout)
    assert data[0]["chosen"] in {"reference", "example_torch"}  # the example plugin is installed in CI
    reasons = {c["name"]: c["reason"] for c in data[0]["candidates"]}
    assert "requires a CUDA device, the call is on cpu" in reasons["jit_ep"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (("explain", "--model", "NoSuchModel"), "invalid argument model='NoSuchModel'; allowed: a model of the embedded catalog"),
        (("explain", "--experts", "8"), "missing --hidden, --topk"),
        (("explain", "--model", "Qwen3-30B-A3B", "--platform", "sm9x"), "--platform 'sm9x': use cpu, local, or smNN"),
    ],
)
def test_explain_errors(args, needle):
    result = cli(*args)
    assert result.returncode != 0
    assert needle in result.stderr + result.stdout


def test_doctor_reports_versions_hooks_and_problems():
    data = json.loads(cli("doctor", "--json").stdout)
    assert data["versions"]["sglang"] == "0.5.23"
    assert data["sglang entry point"] == "registered"
    states = {h["target"].rsplit(".", 1)[-1]: h["state"] for h in data["hooks"]}
    assert states == {"_varlen_deep_gemm_silu_mul_quant": "would hook", "run_mega_routed_experts": "would hook"}
    blocked = json.loads(cli("doctor", "--json", "--no-hooks", SGLANG_PLUGINS="other").stdout)
    assert any("does not include 'moe_plugins'" in p for p in blocked["problems"])
    bad = cli("doctor", "--no-hooks", "--strict-exit", SGLANG_MOE_PLUGINS_DISABLE="nope")
    assert bad.returncode == 1 and "configuration error: unknown plugin 'nope'" in bad.stdout
