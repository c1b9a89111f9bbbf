"""``explain``'s DeepGEMM layouts: the model of SGLang's guard against the installed release's own function, and
what ``explain`` says for a config SGLang 0.5.20+ sends to the compact layout."""

from __future__ import annotations

import json

import pytest
from test_cli import cli

from sglang_moe_plugins.catalog import load_catalog
from sglang_moe_plugins.cli.layout_view import sglang_guard_reason


def _layers():
    for model in load_catalog():
        if model.gpt_oss_activation:
            continue
        for ep in (1, 2, 4, 8, 16):
            for tp in (1, 2, 4, 8):
                if model.experts % ep == 0 and model.inter % tp == 0:
                    yield model, model.experts // ep, model.inter // tp


@pytest.mark.sglang
def test_the_guard_model_is_the_installed_releases_guard() -> None:
    import inspect
    from types import SimpleNamespace

    from sglang_moe_plugins.integrations.sglang.versions import GUARD_TARGET, version_case

    if GUARD_TARGET not in {t.path for t in version_case().targets}:
        pytest.skip("this SGLang release has no masked-layout guard (0.5.20 and later)")
    import sglang.srt.layers.moe.moe_runner.deep_gemm as dg
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig

    guard = inspect.unwrap(dg._masked_activation_unsupported_reason)
    checked = refused = 0
    for model, experts, hidden in _layers():
        for group in (32, 128):
            for limit in (None, model.swiglu_limit or 10.0):
                config = MoeRunnerConfig(
                    num_local_experts=experts, intermediate_size_per_partition=hidden, swiglu_limit=limit
                )
                want = guard(config, SimpleNamespace(block_shape=[128, group]))
                got = sglang_guard_reason(experts=experts, hidden=hidden, group_size=group, swiglu_limit=limit)
                assert got == want, (model.short_name, experts, hidden, group, limit)
                checked += 1
                refused += want is not None
    assert checked > 200 and refused > 20


def test_explain_says_which_layout_sglang_takes_and_what_runs() -> None:
    from sglang_moe_plugins.integrations.sglang.versions import _release_key, sglang_version

    release = sglang_version()
    result = cli("explain", "--model", "DeepSeek-V4-Flash", "--tp", "4", "--platform", "sm90", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    (view,) = payload["layouts"]
    assert view["call"] == "DeepSeek-V4-Flash EP1 TP4"
    if release is not None and _release_key(release) >= _release_key("0.5.20"):
        assert view["stock_layout"].startswith("compact (SGLang's guard: D // 8 (64) < num_local_experts (256))")
        assert "silu_and_mul_clamp into bf16, then sglang_per_token_group_quant_fp8" in view["stock_runs"]
        assert "op silu_mul_quant_contig runs" in view["package_runs"] or "masked" in view["package_layout"]
        masked = [c for c in payload["calls"] if c["op"] == "silu_mul_quant"]
        assert masked and all("guard sends standard dispatch to the compact layout" in c["call"] for c in masked)
    else:
        assert view["stock_layout"].startswith("masked") and "AssertionError" in view["stock_runs"]
    assert view["deepep_low_latency"].startswith("masked always")


def test_explain_text_has_the_layout_block() -> None:
    result = cli("explain", "--model", "Qwen3-30B-A3B", "--platform", "sm90", "--op", "silu_mul_quant_contig")
    assert result.returncode == 0, result.stderr
    assert "DeepGEMM layouts" in result.stdout and "DeepEP normal dispatch: compact always" in result.stdout
