"""Issue #31, item 5: ``explain`` answers the operator, run as a user runs it (``python -m sglang_moe_plugins.cli
explain ...`` in a subprocess, SGLang installed next to it): what stock SGLang (the installed release) does with each
call (its kernel, or that it crashes, with SGLang's own assertion message), models the DeepGEMM runner does not
serve (bf16, dense) named as such, a model directory read as SGLang's ``--model-path`` is, a non-zero exit when a
call would raise, this machine's warnings apart from ``--platform``, a one-line-per-call summary, and one list
syntax (comma-separated, spaces kept for ``--ep``/``--tp``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

EXE = [sys.executable, "-m", "sglang_moe_plugins.cli"]

#: Mixtral-8x22B's published config.json (bf16: no quantization_config).
MIXTRAL_8X22B = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 6144,
    "intermediate_size": 16384,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "torch_dtype": "bfloat16",
}
#: A dense model's config.json (Llama-3-8B's keys): no routed experts.
DENSE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
}


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full.update(env)
    return subprocess.run([*EXE, *args], capture_output=True, text=True, env=full, timeout=300)


def explain_json(*args: str, **env: str) -> dict:
    result = cli("explain", *args, "--json", **env)
    assert result.returncode == 0, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    return json.loads(result.stdout)


def _sglang_release() -> str:
    from sglang_moe_plugins.integrations.sglang.versions import sglang_version

    release = sglang_version()
    if release is None:
        pytest.skip("SGLang is not installed")
    return release


def _stock_assertion(experts: int, rows: int, hidden: int, limit: float) -> str:
    """What the installed SGLang's own masked activation raises for that call (its asserts run before any kernel).

    An earlier test in this process may have hooked the function (load_plugins): its hook answers the call, so
    SGLang's own function is taken from behind the wrapper (HookRegistry's and the package's both set __wrapped__).
    """
    import inspect

    import torch
    from sglang.srt.layers.moe.moe_runner import deep_gemm

    stock = inspect.unwrap(deep_gemm._varlen_deep_gemm_silu_mul_quant)
    assert stock.__module__ == deep_gemm.__name__, stock

    gateup = torch.zeros(experts, rows, 2 * hidden, dtype=torch.bfloat16)
    masked_m = torch.full((experts,), rows, dtype=torch.int32)
    with pytest.raises(AssertionError) as info:
        stock(gateup, masked_m, 128, 6, swiglu_limit=limit)
    return f"AssertionError: {info.value}"


@pytest.mark.sglang
def test_each_call_says_what_stock_sglang_does():
    from sglang_moe_plugins.integrations.sglang.versions import _release_key

    release = _sglang_release()
    data = explain_json("--model", "DeepSeek-V4-Flash", "--tp", "4", "--rows", "128", "--platform", "sm90")
    masked = next(c for c in data["calls"] if c["op"] == "silu_mul_quant")
    assert masked["stock"]["release"] == release and masked["stock"]["raises"] is True, masked["stock"]
    assert masked["stock"]["runs"] == "crashes: " + _stock_assertion(256, 128, 512, 10.0), masked["stock"]
    assert masked["chosen"] and masked["raises"] is False
    compact = next(c for c in data["calls"] if c["op"] == "silu_mul_quant_contig")
    assert "into bf16, then sglang_per_token_group_quant_fp8" in compact["stock"]["runs"]
    assert compact["stock"]["raises"] is False
    if _release_key(release) >= _release_key("0.5.20"):  # the package hooks the compact runner from 0.5.20
        assert "silu_and_mul_clamp" in compact["stock"]["runs"] and compact["chosen"], compact
    else:
        assert compact["chosen"] is None and compact["outcome"].startswith("stock SGLang runs it"), compact

    fits = explain_json("--model", "DeepSeek-V4-Flash", "--ep", "8", "--rows", "128", "--platform", "sm90")
    masked = next(c for c in fits["calls"] if c["op"] == "silu_mul_quant")
    assert masked["stock"]["runs"] == "the DSV4 JIT kernel silu_and_mul_masked_post_quant", masked["stock"]
    plain = explain_json(
        "--model", "Qwen3-30B-A3B-FP8", "--rows", "128", "--platform", "sm90", "--op", "silu_mul_quant"
    )
    assert plain["calls"][0]["stock"]["runs"].startswith("per_token_group_quant"), plain["calls"][0]["stock"]

    text = cli("explain", "--model", "DeepSeek-V4-Flash", "--tp", "4", "--rows", "128", "--platform", "sm90")
    assert text.returncode == 0, text.stderr
    assert f"stock SGLang {release}: crashes: AssertionError: DSV4 JIT activation requires" in text.stdout


def test_bf16_model_is_named_as_not_served(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL_8X22B))
    data = explain_json("--model", str(path), "--platform", "sm90", "--op", "silu_mul_quant")
    (call,) = data["calls"]
    assert call["chosen"] is None and call["outcome"] == "not called", call
    assert "bf16" in call["note"] and "DeepGEMM" in call["note"] and "--quantization fp8" in call["note"], call
    text = cli("explain", "--model", str(path), "--platform", "sm90")
    assert text.returncode == 0 and "runs triton" not in text.stdout, text.stdout
    online = explain_json("--model", str(path), "--platform", "sm90", "--quantization", "fp8", "--op", "silu_mul_quant")
    assert online["calls"] and all(c["chosen"] for c in online["calls"]), online["calls"]


def test_dense_model_is_named_as_such(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DENSE))
    result = cli("explain", "--model", str(path), "--platform", "sm90")
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "dense" in result.stdout and "no MoE layer" in result.stdout and "None" not in result.stdout
    data = explain_json("--model", str(path), "--platform", "sm90")
    assert data["calls"] and all(c["outcome"] == "not called" and "dense" in c["note"] for c in data["calls"])


def test_model_directory_is_read_as_sglang_reads_it(tmp_path):
    model = tmp_path / "Mixtral-8x22B-FP8"
    model.mkdir()
    cfg = {**MIXTRAL_8X22B, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (model / "config.json").write_text(json.dumps(cfg))
    args = ("--platform", "sm90", "--ep", "2", "--rows", "128")
    from_dir = explain_json("--model", str(model), *args)
    from_file = explain_json("--model", str(model / "config.json"), *args)
    assert from_dir["calls"] == from_file["calls"] and from_dir["calls"][0]["chosen"], from_dir["calls"][0]
    assert from_dir["calls"][0]["call"].startswith("Mixtral-8x22B-FP8 EP2")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("explain", "--model", str(empty))
    assert result.returncode == 2 and "config.json" in result.stderr and len(result.stderr.splitlines()) == 1


def test_exit_status_is_non_zero_when_a_call_would_raise():
    args = ("explain", "--experts", "8", "--hidden", "512", "--topk", "2", "--rows", "4", "--platform", "cpu")
    raising = cli(*args, "--op", "silu_mul_quant", SGLANG_MOE_PLUGINS_DISABLE="reference,example_torch")
    if "unknown plugin 'example_torch'" in raising.stderr:  # the example plugin is not installed here
        raising = cli(*args, "--op", "silu_mul_quant", SGLANG_MOE_PLUGINS_DISABLE="reference")
    assert raising.returncode == 1, (raising.stdout, raising.stderr)
    assert "-> raises NoPluginAvailableError" in raising.stdout and "would raise" in raising.stdout
    assert cli(*args).returncode == 0


def test_machine_warnings_are_apart_from_the_platform(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the forced Triton plugin is available here")
    config = tmp_path / "moe.toml"
    config.write_text('[force]\nsilu_mul_quant = "triton"\n')
    args = ("--model", "Qwen3-30B-A3B-FP8", "--rows", "64", "--platform", "sm90", "--op", "silu_mul_quant")
    result = cli("explain", *args, SGLANG_MOE_PLUGINS_CONFIG=str(config))
    assert result.returncode == 0, result.stderr
    head = result.stdout.partition("\n\n")[0]
    assert "WARNING" not in head and "-> runs triton [force]" in result.stdout
    machine = result.stdout[result.stdout.index("this machine (cpu)") :]
    assert "WARNING: force.silu_mul_quant = 'triton' is not available on this machine (cpu)" in machine
    data = explain_json(*args, SGLANG_MOE_PLUGINS_CONFIG=str(config))
    assert data["warnings"] == [] and any("not available on this machine" in w for w in data["this_machine"])
    # Explaining this machine itself, they are its warnings (and the forced plugin cannot run here: exit 1).
    local = cli(
        "explain", "--model", "Qwen3-30B-A3B-FP8", "--rows", "64", "--json", SGLANG_MOE_PLUGINS_CONFIG=str(config)
    )
    assert local.returncode == 1, local.stderr
    assert any("not available on this machine" in w for w in json.loads(local.stdout)["warnings"])


def test_summary_is_one_line_per_call():
    args = ("--model", "DeepSeek-V4-Flash", "--ep", "1,8", "--tp", "4", "--rows", "128", "--platform", "sm90")
    data = explain_json(*args)
    result = cli("explain", *args, "--summary")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("call "))
    rows = lines[header + 2 :]
    assert len(rows) == len(data["calls"]), rows
    for row, call in zip(rows, data["calls"]):
        assert row.startswith(call["call"].split(" [")[0]) and call["op"] in row, (row, call["call"])
        assert call["stock"]["runs"] in row and (call["chosen"] or "") in row, row
    assert "op" in lines[header] and "stock SGLang" in lines[header] and "package" in lines[header]


def test_lists_are_comma_separated_everywhere_and_spaces_still_work():
    base = ("--model", "Qwen3-30B-A3B-FP8", "--rows", "64,128", "--platform", "sm90")
    commas = explain_json(*base, "--ep", "1,2,8", "--tp", "2,3")
    spaces = explain_json(*base, "--ep", "1", "2", "8", "--tp", "2", "3")
    assert commas["calls"] == spaces["calls"]
    labels = {c["call"].split(" [")[0].rsplit(" N=", 1)[0] for c in commas["calls"] if c["op"] == "silu_mul_quant"}
    assert labels == {f"Qwen3-30B-A3B-FP8 EP{ep} TP{tp}" for ep in (1, 2, 8) for tp in (2, 3)}, labels
    bad = cli("explain", *base, "--ep", "1,x")
    assert bad.returncode == 2 and "--ep" in bad.stderr and "comma-separated" in bad.stderr
