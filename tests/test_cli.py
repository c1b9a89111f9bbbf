"""The sglang-moe-plugins command, run as a user runs it (the installed console script)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

_SCRIPT = shutil.which("sglang-moe-plugins", path=os.path.dirname(sys.executable))
#: The installed console script, or the module where this interpreter's environment has none (the second,
#: older-SGLang environment of dev.sh sees this package through the first one's site-packages).
EXE = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "sglang_moe_plugins.cli"]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full.update(env)
    return subprocess.run([*EXE, *args], capture_output=True, text=True, env=full, timeout=300)


def test_list_table_and_json():
    text = cli("list")
    assert text.returncode == 0, text.stderr
    for name in (
        "jit_ep",
        "fp8_fallback",
        "triton",
        "reference",
        "mega_w4a8",
        "mega_w4a4",
        "mega_sm90_fp8",
        "mega_reference",
    ):
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
    # A name in DISABLE that is not installed is a warning now (issue 18); an unknown stock op is an error.
    result = cli("list", SGLANG_MOE_PLUGINS_STOCK="megamoe")
    assert result.returncode == 2
    assert (
        "sglang-moe-plugins list: error: unknown op 'megamoe' (left to SGLang by SGLANG_MOE_PLUGINS_STOCK); valid ops:"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


@pytest.mark.sglang
def test_explain_model_at_ep_sizes():
    pytest.importorskip("sglang")  # jit_ep's verdicts need SGLang's kernel sources
    from sglang_moe_plugins.plugins.sglang_kernels.host import host_kernels_source

    if host_kernels_source() is None:  # SGLang releases before the DSV4 JIT kernel (0.5.19)
        pytest.skip("this SGLang release has no DSV4 JIT kernel: jit_ep is unavailable, not limited by shape")
    result = cli("explain", "--model", "Qwen3.5-35B-A3B", "--ep", "1", "2", "--rows", "64", "--platform", "sm90")
    assert result.returncode == 0, result.stderr
    assert "Qwen3.5-35B-A3B EP2 TP1 N=64: silu_mul_quant E=128 N=64 D=512" in result.stdout
    assert "D // 8 (64) must be >= E (128)" in result.stdout
    data = json.loads(
        cli(
            "explain", "--model", "DeepSeek-V4-Flash", "--ep", "8", "--rows", "128", "--platform", "sm90", "--json"
        ).stdout
    )
    smq = [c for c in data["calls"] if c["op"] == "silu_mul_quant"]
    assert smq and smq[0]["shape"] == {"num_experts": 32, "max_rows": 128, "hidden": 2048, "group_size": 128, "topk": 6}
    verdicts = {c["name"]: c["verdict"] for c in smq[0]["candidates"]}
    assert verdicts["jit_ep"] in ("chosen", "outranked") and smq[0]["chosen"] is not None


def test_explain_explicit_shape_and_platforms():
    result = cli(
        "explain", "--experts", "512", "--hidden", "512", "--topk", "10", "--limit", "10", "--platform", "cpu", "--json"
    )
    data = json.loads(result.stdout)["calls"]
    assert data[0]["chosen"] in {"reference", "example_torch"}  # the example plugin is installed in CI
    reasons = {c["name"]: c["reason"] for c in data[0]["candidates"]}
    assert "requires a CUDA device, the call is on cpu" in reasons["jit_ep"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ("explain", "--model", "NoSuchModel"),
            "invalid argument model='NoSuchModel'; allowed: a model of the embedded catalog",
        ),
        (("explain", "--experts", "8"), "missing --hidden, --topk"),
        (
            ("explain", "--model", "Qwen3-30B-A3B", "--platform", "sm9x"),
            "argument --platform: 'sm9x' is not a platform; allowed: local",
        ),
    ],
)
def test_explain_errors(args, needle):
    result = cli(*args)
    assert result.returncode == 2
    assert needle in result.stderr and result.stdout == ""


@pytest.mark.sglang
def test_doctor_reports_versions_hooks_and_problems():
    pytest.importorskip("sglang")
    from sglang_session import hooked_targets

    from sglang_moe_plugins.integrations.sglang.versions import sglang_version

    data = json.loads(cli("doctor", "--json").stdout)
    assert data["versions"]["sglang"] == sglang_version()
    assert data["sglang entry point"] == "registered"
    states = {h["target"]: h["state"] for h in data["hooks"]}
    assert states == dict.fromkeys(hooked_targets(), "would hook")  # 0.5.19: no MegaMoE target
    blocked = json.loads(cli("doctor", "--json", "--no-hooks", SGLANG_PLUGINS="other").stdout)
    assert any("does not include 'moe_plugins'" in p for p in blocked["problems"])
    bad = cli("doctor", "--no-hooks", "--strict-exit", SGLANG_MOE_PLUGINS_STOCK="megamoe")
    assert bad.returncode == 1 and "configuration error: unknown op 'megamoe'" in bad.stdout


# -- every argument rule of explain and bench: one line naming the argument and what is allowed, exit 2 --
@pytest.mark.parametrize(
    "args, needle",
    [
        (("explain", "--model", "Qwen3-30B-A3B", "--ep", "0"), "argument --ep: 0 is not allowed; allowed: an int >= 1"),
        (
            ("explain", "--model", "Qwen3-30B-A3B", "--ep", "1", "3", "8"),
            "--ep: EP3 does not divide Qwen3-30B-A3B's 128 experts; allowed: 1, 2, 4, 8",
        ),
        (
            ("explain", "--model", "Qwen3-30B-A3B", "--platform", "sm8"),
            "argument --platform: 'sm8' is not a platform; allowed: local (this machine), cpu, or smNN",
        ),
        (
            ("explain", "--model", "Qwen3-30B-A3B", "--rows", "0,-1"),
            "argument --rows: '0,-1': 0 is not allowed; allowed: comma-separated ints >= 1",
        ),
        (("explain", "--model", "Qwen3-30B-A3B", "--rows", "64,x"), "argument --rows: '64,x': 'x' is not an integer"),
        (("explain", "--model", "Qwen3-30B-A3B", "--limit", "7"), "--limit: not allowed with --model"),
        (("explain", "--model", "Qwen3-30B-A3B", "--experts", "8"), "--experts: not allowed with --model"),
        (
            ("explain", "--model", "Qwen3-30B-A3B", "--tp", "7"),
            "--tp: TP7 leaves Qwen3-30B-A3B's intermediate size 768 not split",
        ),
        (("explain", "--model", "Qwen3-30B-A3B", "--tp", "0"), "argument --tp: 0 is not allowed; allowed: an int >= 1"),
        (("explain", "--model", "Qwen3-30B-A3B", "--group-size", "100"), "argument --group-size: invalid choice: 100"),
        (("explain", "--experts", "0", "--hidden", "512", "--topk", "2"), "argument --experts: 0 is not allowed"),
        (("bench", "--model", "Qwen3-30B-A3B", "--ep", "3"), "--ep: EP3 does not divide Qwen3-30B-A3B's 128 experts"),
        (("bench", "--model", "Qwen3-30B-A3B", "--limit", "7"), "--limit: not allowed with --model"),
        (("bench", "--model", "gpt-oss-20b"), "gpt-oss activation goes to SGLang's own path"),
        (("bench", "--experts", "8"), "missing --hidden, --topk"),
        (("bench", "--model", "Qwen3-30B-A3B", "--rows", "-1"), "argument --rows: '-1': -1 is not allowed"),
    ],
)
def test_every_bad_argument_is_one_line_exit_2(args, needle):
    result = cli(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"sglang-moe-plugins {args[0]}: error: ")


def test_errors_are_json_under_json():
    result = cli("explain", "--model", "Qwen3-30B-A3B", "--ep", "3", "--json")
    assert result.returncode == 2 and result.stderr == ""
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "usage" and error["message"].startswith("--ep: EP3 does not divide")
    parse = json.loads(cli("explain", "--model", "Qwen3-30B-A3B", "--platform", "sm8", "--json").stdout)
    assert "argument --platform" in parse["error"]["message"]
    unknown = json.loads(cli("explain", "--model", "NoSuchModel", "--json").stdout)
    assert unknown["error"]["kind"] == "InvalidArgumentError" and "Qwen3-30B-A3B" in unknown["error"]["message"]


def test_explain_json_is_typed_and_covers_mega_moe():
    result = cli(
        "explain", "--model", "DeepSeek-V4-Flash", "--ep", "8", "--rows", "128", "--platform", "sm100", "--json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["platform"] == "cuda sm100" and data["ue8m0"] is True and data["strict"] is False
    smq = next(c for c in data["calls"] if c["op"] == "silu_mul_quant")
    assert smq["config"]["swizzle"] is False and smq["config"]["swiglu_limit"] == 10.0
    assert smq["config"]["scale_layout"] == "ue8m0_packed"  # sm100 implies UE8M0
    assert smq["config"]["keep_fp32"] is False and smq["shape"]["num_experts"] == 32
    mega = {c["call"]: c for c in data["calls"] if c["op"] == "mega_moe"}
    assert set(mega) == {"DeepSeek-V4-Flash EP8 mega_moe W4A8", "DeepSeek-V4-Flash EP8 mega_moe W4A4"}
    w4a8 = mega["DeepSeek-V4-Flash EP8 mega_moe W4A8"]
    assert w4a8["config"]["variant"] == "fp8xfp4" and w4a8["config"]["activation_clamp"] == 10.0
    assert w4a8["shape"]["ep_size"] == 8 and w4a8["shape"]["num_experts"] == 256
    verdicts = {c["name"]: c["verdict"] for c in w4a8["candidates"]}
    assert verdicts["mega_sm90_fp8"] == "unsupported" and verdicts["mega_reference"] == "unsupported"
    sm90 = json.loads(
        cli("explain", "--model", "DeepSeek-V3", "--platform", "sm90", "--op", "mega_moe", "--json").stdout
    )
    assert [c["config"]["variant"] for c in sm90["calls"]] == ["sm90_fp8"]
    assert sm90["calls"][0]["config"]["weight_format"] == "fp8_e4m3_block128" and sm90["ue8m0"] is False


def test_explain_local_platform_is_shown_and_mega_needs_a_gpu():
    result = cli("explain", "--model", "Qwen3-30B-A3B", "--rows", "64")
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    import torch

    if torch.cuda.is_available():
        assert first.startswith("platform: cuda sm") and "(this machine)" in first
    else:
        assert first == (
            "platform: cpu (this machine has no CUDA device, so cpu is assumed: "
            "pass --platform sm90 or sm100 to explain a GPU server)"
        )
        assert "mega_moe: SGLang runs MegaMoE on sm90 and sm100 only, not on cpu" in result.stdout


def test_explain_no_plugin_is_printed_once_and_raises():
    result = cli(
        "explain",
        "--experts",
        "8",
        "--hidden",
        "512",
        "--topk",
        "2",
        "--rows",
        "4",
        "--platform",
        "cpu",
        "--op",
        "silu_mul_quant",
        SGLANG_MOE_PLUGINS_DISABLE="reference,example_torch",
    )
    if "unknown plugin 'example_torch'" in result.stderr:  # the example plugin is not installed here
        result = cli(
            "explain",
            "--experts",
            "8",
            "--hidden",
            "512",
            "--topk",
            "2",
            "--rows",
            "4",
            "--platform",
            "cpu",
            "--op",
            "silu_mul_quant",
            SGLANG_MOE_PLUGINS_DISABLE="reference",
        )
    assert result.returncode == 1, result.stderr  # a call that would raise: explain exits 1
    assert result.stdout.count("-> raises NoPluginAvailableError (no enabled plugin supports it)") == 1
    assert "SGLang original" not in result.stdout and result.stderr == ""


def test_explain_gpt_oss_is_handed_to_sglang():
    data = json.loads(cli("explain", "--model", "gpt-oss-20b", "--platform", "sm90", "--json").stdout)
    assert data["calls"][0]["outcome"] == "not modelled" and data["calls"][0]["chosen"] is None


def test_explain_model_all_says_which_ep_it_skips():
    result = cli("explain", "--experts", "8", "--hidden", "512", "--topk", "2", "--ep", "3")
    assert (
        result.returncode == 2 and "--ep: EP3 does not divide custom's 8 experts; allowed: 1, 2, 4, 8" in result.stderr
    )
    result = cli(
        "explain",
        "--model",
        "all",
        "--ep",
        "1",
        "16",
        "--platform",
        "sm90",
        "--op",
        "silu_mul_quant",
        "--rows",
        "64",
        "--json",
    )
    notes = json.loads(result.stdout)["notes"]
    assert (
        "Mixtral-8x7B-v0.1: EP16 skipped: EP16 does not divide Mixtral-8x7B-v0.1's 8 experts; allowed: 1, 2, 4, 8"
        in notes
    )


def test_force_is_shown_and_flagged_when_not_available_here(tmp_path):
    import torch

    config = tmp_path / "moe.toml"
    config.write_text('[force]\nsilu_mul_quant = "triton"\n')
    listed = cli("list", SGLANG_MOE_PLUGINS_CONFIG=str(config))
    assert listed.returncode == 0, listed.stderr
    triton_row = next(line for line in listed.stdout.splitlines() if line.startswith("triton "))
    assert "[force]" in triton_row
    data = json.loads(cli("list", "--json", SGLANG_MOE_PLUGINS_CONFIG=str(config)).stdout)
    assert next(p for p in data["plugins"] if p["name"] == "triton")["forced"] is True
    assert next(p for p in data["plugins"] if p["name"] == "reference")["forced"] is False
    explained = cli(
        "explain",
        "--model",
        "Qwen3-30B-A3B",
        "--rows",
        "64",
        "--platform",
        "sm90",
        "--op",
        "silu_mul_quant",
        SGLANG_MOE_PLUGINS_CONFIG=str(config),
    )
    assert "-> runs triton [force]" in explained.stdout and "triton [force]" in explained.stdout
    doctor = json.loads(
        cli("doctor", "--json", "--no-hooks", "--no-self-check", SGLANG_MOE_PLUGINS_CONFIG=str(config)).stdout
    )
    assert doctor["plugins"]["triton"].endswith("[force]")
    if not torch.cuda.is_available():
        flag = "force.silu_mul_quant = 'triton' is not available on this machine (cpu)"
        assert any(flag in w for w in data["warnings"]) and flag in listed.stdout
        assert any(flag in p for p in doctor["problems"])
        assert "WARNING: " + flag in explained.stdout


def test_explain_forced_plugin_that_cannot_run_the_call(tmp_path):
    config = tmp_path / "moe.toml"
    config.write_text('[force]\nsilu_mul_quant = "jit_ep"\n')
    data = json.loads(
        cli(
            "explain",
            "--model",
            "Qwen3.5-35B-A3B",
            "--ep",
            "2",
            "--rows",
            "64",
            "--platform",
            "sm90",
            "--op",
            "silu_mul_quant",
            "--json",
            SGLANG_MOE_PLUGINS_CONFIG=str(config),
        ).stdout
    )
    call = data["calls"][0]
    assert call["chosen"] is None and call["forced"] is True
    assert call["outcome"] == "raises NoPluginAvailableError (force.silu_mul_quant = 'jit_ep' cannot run it)"


def test_explain_under_strict_says_failures_raise():
    result = cli(
        "explain", "--model", "Qwen3-30B-A3B", "--rows", "64", "--platform", "sm90", SGLANG_MOE_PLUGINS_STRICT="1"
    )
    assert "failure policy: strict: a plugin that fails at run time raises" in result.stdout
    data = json.loads(
        cli(
            "explain",
            "--model",
            "Qwen3-30B-A3B",
            "--rows",
            "64",
            "--platform",
            "sm90",
            "--json",
            SGLANG_MOE_PLUGINS_STRICT="1",
        ).stdout
    )
    assert data["strict"] is True


def test_doctor_exits_1_on_a_config_error_and_says_so_in_help():
    bad = cli("doctor", "--no-hooks", "--no-self-check", SGLANG_MOE_PLUGINS_STOCK="megamoe")
    assert bad.returncode == 1 and "configuration error: unknown op 'megamoe'" in bad.stdout
    good = cli("doctor", "--no-hooks", "--no-self-check", "--json")
    assert good.returncode == 0, good.stdout
    # Issue 20: any listed problem exits 1, not only a configuration error.
    assert "1 when it lists a problem (among them: the configuration cannot be loaded" in " ".join(
        cli("doctor", "--help").stdout.split()
    )
    blocked = cli("doctor", "--no-hooks", "--no-self-check", SGLANG_PLUGINS="other")
    assert blocked.returncode == 1 and "does not include 'moe_plugins'" in blocked.stdout


def test_bench_without_cuda_is_one_clear_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = cli("bench", "--model", "Qwen3-30B-A3B")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"sglang-moe-plugins bench: error: bench: needs a CUDA GPU, and torch {torch.__version__} sees none here "
        "(use `explain` to see the selection without one)"
    ]
