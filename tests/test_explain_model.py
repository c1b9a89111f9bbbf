"""``sglang-moe-plugins explain --model path/to/config.json``: a HuggingFace config read for models the catalog
lacks, giving the same decisions as the catalog's entry; bad flags blamed by name; platforms SGLang's DeepGEMM
runner does not run on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

_SCRIPT = shutil.which("sglang-moe-plugins", path=os.path.dirname(sys.executable))
EXE = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "sglang_moe_plugins.cli"]

#: config.json of three catalog models, as published (the keys the reader uses, plus some it must ignore).
CONFIGS = {
    "Qwen3-30B-A3B-FP8": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        },
    },
    "DeepSeek-V4-Flash": {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "hidden_size": 4096,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "swiglu_limit": 10.0,
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "weight_block_size": [128, 128],
        },
    },
    "Qwen3.5-35B-A3B": {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {
            "hidden_size": 2048,
            "moe_intermediate_size": 512,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "shared_expert_intermediate_size": 512,
        },
        "vision_config": {"hidden_size": 1152},
    },
}


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    return subprocess.run([*EXE, *args], capture_output=True, text=True, env=env, timeout=300)


def _decisions(payload: dict) -> list:
    """Everything explain decided, without the labels (which name the model by its source)."""
    return [
        (
            c["op"],
            c["shape"],
            c["config"],
            c["chosen"],
            c["outcome"],
            [(k["name"], k["priority"], k["verdict"], k["reason"]) for k in c["candidates"]],
        )
        for c in payload["calls"]
    ]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_json_gives_the_catalog_decisions(tmp_path, name):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIGS[name]))
    common = ("--ep", "1", "8", "--rows", "64,128", "--platform", "sm100", "--json")
    # catalog models are explained as FP8 deployments; a config.json without quantization_config says bf16
    quantization = () if "quantization_config" in json.dumps(CONFIGS[name]) else ("--quantization", "fp8")
    from_file = cli("explain", "--model", str(path), *common, *quantization)
    from_catalog = cli("explain", "--model", name, *common)
    # exit 1: some call would raise (Qwen3-30B's EP8 W4A4 MegaMoE call on sm100 has no plugin: 768 % 512)
    assert from_file.returncode == from_catalog.returncode in (0, 1), from_file.stdout + from_file.stderr

    # a call raises where no plugin runs it, or where SGLang's function runs it and crashes there (read from the
    # outcome and the stock model, not from the record's own "raises")
    def raising(c):
        stock_crashes = bool(c["stock"] and c["stock"]["raises"])
        return c["outcome"].startswith("raises") or (not c["outcome"].startswith("runs") and stock_crashes)

    calls = json.loads(from_catalog.stdout)["calls"]
    assert [raising(c) for c in calls] == [c["raises"] for c in calls]
    assert from_catalog.returncode == (1 if any(raising(c) for c in calls) else 0)
    a, b = json.loads(from_file.stdout), json.loads(from_catalog.stdout)
    assert len(a["calls"]) >= 3
    assert _decisions(a) == _decisions(b)
    assert all(c["call"].startswith(name) for c in a["calls"]), [c["call"] for c in a["calls"]]


def test_config_json_group_size_and_errors(tmp_path):
    from sglang_moe_plugins.catalog import get_model, model_from_hf_config
    from sglang_moe_plugins.errors import InvalidArgumentError

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS["Qwen3-30B-A3B-FP8"]))
    spec, catalog = model_from_hf_config(path), get_model("Qwen3-30B-A3B-FP8")
    assert (spec.experts, spec.inter, spec.topk, spec.hidden, spec.swiglu_limit, spec.group_size) == (
        catalog.experts,
        catalog.inter,
        catalog.topk,
        catalog.hidden,
        None,
        128,
    )
    assert model_from_hf_config(_write(tmp_path, "dsv4", CONFIGS["DeepSeek-V4-Flash"])).swiglu_limit == 10.0

    no_experts = {k: v for k, v in CONFIGS["Qwen3-30B-A3B-FP8"].items() if k != "num_experts"}
    with pytest.raises(InvalidArgumentError, match="num_experts/n_routed_experts"):
        model_from_hf_config(_write(tmp_path, "dense", no_experts))
    result = cli("explain", "--model", str(_write(tmp_path, "dense2", no_experts)))
    # a config.json without expert keys is a dense model: named as such, nothing to explain, exit 0
    assert result.returncode == 0 and "dense" in result.stdout + result.stderr, result.stdout + result.stderr
    assert "Traceback" not in result.stderr

    odd_group = json.loads(json.dumps(CONFIGS["Qwen3-30B-A3B-FP8"]))
    odd_group["quantization_config"]["weight_block_size"] = [128, 96]
    result = cli("explain", "--model", str(_write(tmp_path, "odd", odd_group)))
    assert (
        result.returncode == 2
        and "weight_block_size gives group size 96; allowed: 16, 32, 64, 128, 256" in result.stderr
    ), result.stderr
    assert cli("explain", "--model", str(tmp_path / "missing" / "config.json")).returncode == 2


def _write(tmp_path, name: str, cfg: dict):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return path


def test_bad_flag_is_blamed_by_its_own_name():
    result = cli("explain", "--experts", "64", "--hidden", "1000", "--topk", "4")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "sglang-moe-plugins explain: error: --hidden: 1000 is not a multiple of the group size 128; "
        "allowed: a multiple of 128"
    )
    result = cli("explain", "--experts", "64", "--hidden", "1024", "--topk", "4", "--tp", "3")
    assert result.returncode == 2 and "error: --tp: TP3 leaves custom's intermediate size 1024" in result.stderr
    assert "allowed: 1, 2, 4, 8" in result.stderr


def test_platform_without_the_deep_gemm_runner_says_so():
    result = cli("explain", "--model", "Qwen3-30B-A3B", "--platform", "sm80", "--json")
    assert result.returncode == 0, result.stderr
    calls = json.loads(result.stdout)["calls"]
    smq = [c for c in calls if c["op"] == "silu_mul_quant"]
    assert smq and all(c["chosen"] is None and c["outcome"] == "not called" for c in smq), smq
    assert "DeepGEMM MoE runner" in smq[0]["note"] and "sm90 or newer" in smq[0]["note"]
    assert not any(c["chosen"] for c in calls)
