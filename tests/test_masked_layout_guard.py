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

    runner_config = MoeRunnerConfig(num_local_experts=experts, intermediate_size_per_partition=hidden, top_k=6,
                                    swiglu_limit=limit)
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

    table = {(256, 512, 128, True): {"masked_faster": True, "summary": "test"},
             (64, 256, 128, True): {"masked_faster": False, "summary": "test"}}
    monkeypatch.setattr(layout, "measured_configs", lambda: table)
    monkeypatch.setattr(layout, "_decisions", {})
    entry_points = [ep("reference", "sglang_moe_plugins.plugins.reference.silu_mul_quant:ReferencePlugin"),
                    ep("good_test_plugin", "plugins_for_tests:GoodPlugin")]

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


def test_lifted_where_served_and_measured_faster(measured) -> None:
    dg = loaded_sglang()
    runner_config, quant_info = _configs()
    assert dg._masked_activation_unsupported_reason(runner_config, quant_info) is None
    # SGLang's own policy decides after the guard: _should_use_masked_standard_layout reads it again
    runner_config.swiglu_limit = None  # no clamp: SGLang's guard has nothing to refuse
    assert dg._masked_activation_unsupported_reason(runner_config, quant_info) is None


def test_kept_where_compact_measured_faster(measured) -> None:
    dg = loaded_sglang()
    from sglang_moe_plugins.integrations.sglang import layout

    runner_config, quant_info = _configs(experts=64, hidden=256)
    reason = dg._masked_activation_unsupported_reason(runner_config, quant_info)
    assert reason == _original(dg)(runner_config, quant_info) == "D // 8 (32) < num_local_experts (64)"
    (decision,) = layout._decisions.values()
    assert not decision.lift and "compact layout measured faster" in decision.reason


def test_kept_when_only_the_reference_serves(measured) -> None:
    from sglang_moe_plugins import UserConfig, api

    dg = loaded_sglang()
    measured(disable=frozenset({"good_test_plugin"}))
    runner_config, quant_info = _configs()
    assert dg._masked_activation_unsupported_reason(runner_config, quant_info) == "D // 8 (64) < num_local_experts (256)"
    assert api.current_selector().registry.config == UserConfig(disable=frozenset({"good_test_plugin"}))


def test_the_switch_gives_the_decision_back(measured) -> None:
    dg = loaded_sglang()
    measured(masked_layout="sglang")
    runner_config, quant_info = _configs()
    assert dg._masked_activation_unsupported_reason(runner_config, quant_info) == "D // 8 (64) < num_local_experts (256)"


def test_decide_layout_is_pure_and_names_each_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_moe_plugins.integrations.sglang import layout

    monkeypatch.setattr(layout, "measured_configs", lambda: {(256, 512, 128, True): {"masked_faster": True}})
    key = layout.LayoutKey(256, 512, 128, 10.0, False, 6)
    ok = layout.decide_layout(key, masked_layout="measured", smq_hooked=True, serving=lambda rows: "triton")
    assert ok.lift and "triton" in ok.reason
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
    assert "not measured" in layout.decide_layout(other, masked_layout="measured", smq_hooked=True,
                                                  serving=lambda rows: "triton").reason


def test_the_shipped_table_is_readable() -> None:
    from sglang_moe_plugins.integrations.sglang import layout

    layout.measured_configs.cache_clear()
    table = layout.measured_configs()
    assert isinstance(table, dict)
    for (experts, hidden, group, clamped), entry in table.items():
        assert experts > 0 and hidden > 0 and group in (32, 64, 128) and isinstance(clamped, bool)
        assert isinstance(entry["masked_faster"], bool)
