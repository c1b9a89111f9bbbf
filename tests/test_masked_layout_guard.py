"""The masked layout back where it wins: SGLang's real ``_masked_activation_unsupported_reason``, hooked through its
real ``load_plugins()`` (0.5.20+), returns None only where the package serves the masked call and the masked layout
was measured faster; SGLang's own reason everywhere else."""

from __future__ import annotations

import pytest
from sglang_session import default_selector, ep, hooked_targets, loaded_sglang  # noqa: F401 - default_selector: fixture

pytestmark = pytest.mark.sglang
GUARD = "sglang.srt.layers.moe.moe_runner.deep_gemm._masked_activation_unsupported_reason"


@pytest.fixture(autouse=True)
def _require_guard() -> None:
    if GUARD not in hooked_targets():
        pytest.skip("this SGLang release has no masked-layout guard (0.5.20 and later)")


def _configs(experts: int = 256, hidden: int = 512, limit: float | None = 10.0):
    from types import SimpleNamespace

    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig

    runner_config = MoeRunnerConfig(
        num_local_experts=experts, intermediate_size_per_partition=hidden, top_k=6, swiglu_limit=limit
    )
    return runner_config, SimpleNamespace(block_shape=[128, 128])


def _original(dg):
    import inspect

    original = inspect.unwrap(dg._masked_activation_unsupported_reason)  # HookRegistry's wrapper keeps __wrapped__
    assert original is not dg._masked_activation_unsupported_reason, "the guard is hooked"
    return original


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch):
    """DSV4-Flash at TP4 (E=256, D=512, clamped) measured faster masked, and a CPU plugin that serves the masked call."""
    from sglang_moe_plugins import UserConfig, api
    from sglang_moe_plugins.integrations.sglang import layout

    table = {
        (256, 512, 128, True): {"masked_faster": True, "summary": "test", "tokens_min": 16, "tokens_max": 2048},
        (64, 256, 128, True): {"masked_faster": False, "summary": "test"},
    }
    monkeypatch.setattr(layout, "measured_configs", lambda: table)
    monkeypatch.setattr(layout, "_decisions", {})
    entry_points = [
        ep("reference", "sglang_moe_plugins.plugins.reference.silu_mul_quant:ReferencePlugin"),
        ep("good_test_plugin", "plugins_for_tests:GoodPlugin"),
    ]

    def reload(**settings):
        return api.reload(UserConfig(**settings), entry_points=entry_points)

    reload()
    return reload


def test_sglang_reason_stands_without_a_measurement() -> None:
    dg = loaded_sglang()
    from sglang_moe_plugins.integrations.sglang import layout

    layout._decisions.clear()
    runner_config, quant_info = _configs()
    want = _original(dg)(runner_config, quant_info)
    assert want == "D // 8 (64) < num_local_experts (256)"
    assert dg._masked_activation_unsupported_reason(runner_config, quant_info) == want


def _policy(dg, runner_config, quant_info, tokens: int) -> bool:
    import torch

    return dg._should_use_masked_standard_layout(runner_config, quant_info, torch.empty(tokens, 64))


@pytest.fixture
def masked_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's policy after the guard: SGLANG_DEEPGEMM_STANDARD_LAYOUT=masked (no memory budget on a CPU)."""
    monkeypatch.setenv("SGLANG_DEEPGEMM_STANDARD_LAYOUT", "masked")


def test_lifted_in_the_measured_token_range(measured, masked_mode) -> None:
    dg = loaded_sglang()
    runner_config, quant_info = _configs()
    # through SGLang's own policy function, which calls the guard: masked inside the measured range only
    assert [_policy(dg, runner_config, quant_info, t) for t in (1, 15, 16, 256, 2048, 2049, 16384)] == [
        False,
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    # the guard called on its own (no batch known) keeps SGLang's reason
    assert (
        dg._masked_activation_unsupported_reason(runner_config, quant_info) == "D // 8 (64) < num_local_experts (256)"
    )
    runner_config.swiglu_limit = None  # no clamp: SGLang's guard has nothing to refuse
    assert dg._masked_activation_unsupported_reason(runner_config, quant_info) is None


def test_sglang_mode_still_decides_after_the_guard(measured, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_DEEPGEMM_STANDARD_LAYOUT", "compact")
    dg = loaded_sglang()
    runner_config, quant_info = _configs()
    assert _policy(dg, runner_config, quant_info, 256) is False


def test_kept_where_compact_measured_faster(measured, masked_mode) -> None:
    dg = loaded_sglang()
    from sglang_moe_plugins.integrations.sglang import layout

    runner_config, quant_info = _configs(experts=64, hidden=256)
    assert _policy(dg, runner_config, quant_info, 256) is False
    assert _original(dg)(runner_config, quant_info) == "D // 8 (32) < num_local_experts (64)"
    (decision,) = layout._decisions.values()
    assert not decision.lift and "compact layout measured faster" in decision.reason


def test_kept_when_only_the_reference_serves(measured) -> None:
    from sglang_moe_plugins import UserConfig, api

    dg = loaded_sglang()
    measured(disable=frozenset({"good_test_plugin"}))
    runner_config, quant_info = _configs()
    assert (
        dg._masked_activation_unsupported_reason(runner_config, quant_info) == "D // 8 (64) < num_local_experts (256)"
    )
    assert api.current_selector().registry.config == UserConfig(disable=frozenset({"good_test_plugin"}))


def test_the_switch_gives_the_decision_back(measured) -> None:
    dg = loaded_sglang()
    measured(masked_layout="sglang")
    runner_config, quant_info = _configs()
    assert (
        dg._masked_activation_unsupported_reason(runner_config, quant_info) == "D // 8 (64) < num_local_experts (256)"
    )


def test_decide_layout_is_pure_and_names_each_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_moe_plugins.integrations.sglang import layout

    monkeypatch.setattr(
        layout,
        "measured_configs",
        lambda: {(256, 512, 128, True): {"masked_faster": True, "tokens_min": 16, "tokens_max": 2048}},
    )
    key = layout.LayoutKey(256, 512, 128, 10.0, False, 6)
    ok = layout.decide_layout(key, masked_layout="measured", smq_hooked=True, serving=lambda rows: "triton")
    assert ok.lift and "triton" in ok.reason and (ok.tokens_min, ok.tokens_max) == (16, 2048)
    assert [ok.lifts(t) for t in (None, 15, 16, 2048, 2049)] == [False, False, True, True, False]
    for kwargs, words in (
        ({"masked_layout": "sglang"}, "SGLang's guard decides"),
        ({"smq_hooked": False}, "not hooked"),
        ({"serving": lambda rows: "reference"}, "reference"),
        ({"serving": lambda rows: None if rows > 8 else "triton"}, "N=256"),
    ):
        args = {"masked_layout": "measured", "smq_hooked": True, "serving": lambda rows: "triton", **kwargs}
        decision = layout.decide_layout(key, **args)
        assert not decision.lift and words in decision.reason, (kwargs, decision)
    other = layout.LayoutKey(128, 512, 128, 10.0, False, 6)
    assert (
        "not measured"
        in layout.decide_layout(other, masked_layout="measured", smq_hooked=True, serving=lambda rows: "triton").reason
    )


def test_the_shipped_table_is_readable() -> None:
    from sglang_moe_plugins.integrations.sglang import layout

    layout.measured_configs.cache_clear()
    table = layout.measured_configs()
    assert isinstance(table, dict)
    for (experts, hidden, group, clamped), entry in table.items():
        assert experts > 0 and hidden > 0 and group in (32, 64, 128) and isinstance(clamped, bool)
        assert isinstance(entry["masked_faster"], bool)
        if entry["masked_faster"]:
            assert 1 <= entry["tokens_min"] <= entry["tokens_max"]
            for tokens, point in entry["measured"].items():
                if entry["tokens_min"] <= int(tokens) <= entry["tokens_max"]:
                    assert point["masked_package_us"] * 1.05 <= point["stock_compact_us"], (experts, hidden, tokens)
