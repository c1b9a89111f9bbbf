"""Tests that kill the mutants benchmarks/mutation/run_mutants.py found surviving the fast test subsets
(benchmarks/mutation/results-2026-12-03.md): each test names the mutant ids it kills."""

from __future__ import annotations

import pytest

from sglang_moe_plugins.config import load_config, parse_config
from sglang_moe_plugins.errors import ConfigError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


# -- config parsing ------------------------------------------------------------------------------------
def test_strict_and_debug_are_off_unless_asked() -> None:
    """config-strict-default; config-strict-env, config-debug-env (an unset variable turns nothing on)."""
    assert parse_config({}).strict is False and parse_config({}).debug is False
    config = load_config({})
    assert config.strict is False and config.debug is False
    assert load_config({"SGLANG_MOE_PLUGINS_STRICT": "0", "SGLANG_MOE_PLUGINS_DEBUG": "off"}).strict is False
    assert load_config({"SGLANG_MOE_PLUGINS_STRICT": "yes"}).strict is True
    assert load_config({"SGLANG_MOE_PLUGINS_DEBUG": "on"}).debug is True


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_priority_is_refused(value: bool) -> None:
    """config-priority-bool: ``priority = { a = true }`` is not the integer 1."""
    with pytest.raises(ConfigError, match=r"priority\.a must be an integer, got (True|False)"):
        parse_config({"priority": {"a": value}})


def test_priority_accepts_exactly_the_int64_range() -> None:
    """config-int64-low, config-int64-high, config-int64-const."""
    assert dict(parse_config({"priority": {"a": INT64_MAX, "b": INT64_MIN}}).priority) == {
        "a": INT64_MAX,
        "b": INT64_MIN,
    }
    for value in (INT64_MAX + 1, INT64_MIN - 1, 1 << 64):
        with pytest.raises(ConfigError, match="does not fit a 64-bit integer"):
            parse_config({"priority": {"a": value}})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"force": {"silu_mul_quant": 3}},
            r"\[force\] must be a table of op = \"plugin name\", got",
        ),  # config-force-type
        ({"options": ["triton"]}, r"\[options\] must hold one table per plugin"),  # config-options-type
        ({"options": {"triton": 1}}, r"\[options\] must hold one table per plugin"),
        (
            {"disable": [""]},
            r"disable must be a list of plugin names \(strings\), got \[''\]",
        ),  # config-string-list-empty
        ({"stock": ["mega_moe", ""]}, r"stock must be a list of op names"),
        (
            {"masked_layout": "always"},
            r"masked_layout must be one of 'measured', 'sglang', got 'always'",
        ),  # config-masked-check
    ],
)
def test_malformed_values_are_config_errors_naming_the_key(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data)


def test_masked_layout_from_the_environment_is_checked() -> None:
    """config-masked-check (the environment's value goes through the same check)."""
    assert load_config({"SGLANG_MOE_PLUGINS_MASKED_LAYOUT": "SGLang"}).masked_layout == "sglang"
    with pytest.raises(ConfigError, match="SGLANG_MOE_PLUGINS_MASKED_LAYOUT must be one of"):
        load_config({"SGLANG_MOE_PLUGINS_MASKED_LAYOUT": "always"})


def test_allow_from_the_environment_replaces_the_files_list(tmp_path) -> None:
    """config-allow-env: SGLANG_MOE_PLUGINS_ALLOW is read (set and empty: no third-party plugin)."""
    path = tmp_path / "moe.toml"
    path.write_text('allow = ["from_file"]\n')
    env = {"SGLANG_MOE_PLUGINS_CONFIG": str(path)}
    assert load_config(env).allow == frozenset({"from_file"})
    assert load_config({**env, "SGLANG_MOE_PLUGINS_ALLOW": "a, b"}).allow == frozenset({"a", "b"})
    assert load_config({**env, "SGLANG_MOE_PLUGINS_ALLOW": ""}).allow == frozenset()


# -- selection and the failure policy ------------------------------------------------------------------
def _records(*plugins):
    from sglang_moe_plugins import Registry, UserConfig

    return Registry.from_plugins(plugins, UserConfig()).records(plugins[0].op)


def test_a_raising_supports_is_reraised_for_a_collective_op() -> None:
    """decide-collective-raise: a collective op never falls back per rank, also when supports() raises."""
    from conftest import RecordingPlugin

    from sglang_moe_plugins.core.decide import Verdict, decide

    class Raising(RecordingPlugin):
        def supports(self, shape, config):
            raise RuntimeError("probe failed")

    records = _records(Raising("raising", 20), RecordingPlugin("fine", 10))
    errors: list[str] = []
    args = ("silu_mul_quant", records, (), None, {}, "shape", "config")
    with pytest.raises(RuntimeError, match="probe failed") as info:
        decide(*args, strict=False, collective=True, on_error=lambda name, exc: errors.append(name))
    assert "is collective: no per-rank fallback" in str(info.value.__notes__) and errors == []
    selection = decide(*args, strict=False, collective=False, on_error=lambda name, exc: errors.append(name))
    assert selection.chosen.name == "fine" and selection.candidate("raising").verdict == Verdict.ERROR
    assert errors == ["raising"]


def test_priority_rules_reorder_and_show_the_ruled_priority(make_selector) -> None:
    """decide-rule-order, decide-rule-prio: a matching rule outranks and the candidate carries its priority."""
    from conftest import RecordingPlugin, random_call

    config = parse_config({"priority_rules": [{"op": "silu_mul_quant", "priority": {"low": 500, "mid": 300}}]})
    selector = make_selector(
        RecordingPlugin("high", 100), RecordingPlugin("mid", 50), RecordingPlugin("low", 10), config=config
    )
    _, shape, smq_config = random_call()
    selection = selector.explain("silu_mul_quant", shape, smq_config)
    assert selection.chosen.name == "low"
    assert [(c.name, c.priority, c.verdict) for c in selection.candidates] == [
        ("low", 500, "chosen"),
        ("mid", 300, "outranked"),
        ("high", 100, "outranked"),
    ]
    assert "priority 500 from" in selection.candidate("low").reason


@pytest.mark.parametrize("why", ["collective", "capturing", "written"])
def test_run_failures_that_must_not_fall_back_raise(make_selector, why: str) -> None:
    """disp-collective, disp-capturing, disp-written: the failure re-raises with a note naming the plugin
    (a plugin that may have written an input is still excluded for the key's later calls)."""
    from conftest import RecordingPlugin

    selector = make_selector(RecordingPlugin("a", 10))
    key = ("silu_mul_quant", "shape", "config")
    kwargs = {
        "capturing": why == "capturing",
        "collective": why == "collective",
        "stage": "run",
        "written": ("gateup",) if why == "written" else (),
    }
    with pytest.raises(RuntimeError, match="boom") as info:
        selector._on_failure(key, "a", RuntimeError("boom"), **kwargs)
    assert "raised by plugin 'a' (run)" in " ".join(info.value.__notes__)
    assert ("a" in selector.failed_plugins().get(key, {})) == (why == "written")
    selector._on_failure(key, "a", RuntimeError("boom"), capturing=False, collective=False, stage="run")
    assert "a" in selector.failed_plugins()[key]  # the ordinary case: marked failed, no raise


def test_inputs_maybe_written_keeps_only_the_declared_writes() -> None:
    """bound-filter: of the inputs the host marked writable, only those the plugin declares it writes."""
    from types import SimpleNamespace

    from sglang_moe_plugins.core.bound import inputs_maybe_written

    writable = (("gateup", "gateup_writable"), ("masked_m", "masked_writable"))
    inputs = SimpleNamespace(gateup_writable=True, masked_writable=True)
    declares = SimpleNamespace(writes_inputs=("gateup",))
    assert inputs_maybe_written(declares, writable, inputs, None, None) == ("gateup",)
    assert inputs_maybe_written(SimpleNamespace(writes_inputs="masked_m"), writable, inputs, None, None) == (
        "masked_m",
    )
    assert inputs_maybe_written(SimpleNamespace(writes_inputs=()), writable, inputs, None, None) == ()
    assert inputs_maybe_written(SimpleNamespace(), writable, inputs, None, None) == ("gateup", "masked_m")


# -- registry ------------------------------------------------------------------------------------------
def test_a_user_priority_is_named_in_the_status(tmp_path) -> None:
    """reg-priority: the record's status (``list``, ``explain``) says where a user priority came from."""
    from conftest import RecordingPlugin

    from sglang_moe_plugins import Registry

    path = tmp_path / "moe.toml"
    path.write_text("priority = { a = 77 }\n")
    config = load_config({"SGLANG_MOE_PLUGINS_CONFIG": str(path)})
    registry = Registry.from_plugins([RecordingPlugin("a", 10), RecordingPlugin("b", 20)], config)
    a, b = registry.get("a"), registry.get("b")
    assert a.priority == 77 and "priority 77 set by [priority] in" in a.status
    assert b.priority == 20 and "priority" not in b.status


@pytest.mark.parametrize(
    ("name", "priority", "message"),
    [
        ("Bad Name!", 1, r"name='Bad Name!' must be a string matching"),  # reg-name-re
        ("fine", True, r"priority=True must be an int"),  # reg-prio-int
    ],
)
def test_plugin_attributes_are_validated(name: str, priority, message: str) -> None:
    from conftest import RecordingPlugin

    from sglang_moe_plugins.core.registry import validate_plugin
    from sglang_moe_plugins.errors import PluginValidationError

    with pytest.raises(PluginValidationError, match=message):
        validate_plugin(RecordingPlugin(name, priority), "test")


def test_strict_refuses_an_entry_point_that_cannot_be_loaded() -> None:
    """reg-strict2: under strict a plugin that cannot be registered is an error; without, a reported problem."""
    from importlib.metadata import EntryPoint

    from sglang_moe_plugins import Registry, UserConfig
    from sglang_moe_plugins.core.registry import ENTRY_POINT_GROUP
    from sglang_moe_plugins.errors import PluginValidationError

    eps = [EntryPoint("gone_kernels", "no_such_module_for_mutants:Plugin", ENTRY_POINT_GROUP)]
    with pytest.raises(PluginValidationError, match=r"strict = true and 1 plugin\(s\) could not be registered"):
        Registry.discover(UserConfig(strict=True), eps=eps)
    assert [p.entry_point for p in Registry.discover(UserConfig(), eps=eps).problems] == ["gone_kernels"]


# -- MegaMoE plans -------------------------------------------------------------------------------------
@pytest.fixture
def adapter():
    from sglang_moe_plugins.integrations.sglang import mega_moe as ma

    ma.reset()
    yield ma
    ma.reset()


def test_the_plan_cap_holds_a_large_models_layers() -> None:
    """plan-max: a 61-layer model with a few call-flag sets never reaches the cap (no clearing, no warning)."""
    from sglang_moe_plugins.integrations.sglang import mega_plan

    assert mega_plan.MAX_PLANS >= 61 * 8


def test_a_planned_layer_still_refuses_a_batch_past_the_token_cap(adapter, monkeypatch) -> None:
    """mega-hit-tokens: the plan's hit checks the batch against max_tokens_per_rank."""
    from _mega_cases import make_problem
    from test_mega_adapter import _experts, _kwargs

    from sglang_moe_plugins.errors import InvalidArgumentError

    problem = make_problem("fp8xfp4", seed=48, tokens=12)
    monkeypatch.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", "8")
    adapter.reset()
    i, experts = problem.inputs, _experts(problem)
    assert (
        adapter.build_call(
            experts, i.hidden_states[:5], i.topk_ids[:5], i.topk_weights[:5], **_kwargs(problem, num_tokens=5)
        )
        is not None
    )
    with pytest.raises(InvalidArgumentError, match="max_tokens_per_rank"):
        adapter.build_call(experts, i.hidden_states, i.topk_ids, i.topk_weights, **_kwargs(problem))


def test_a_weight_replaced_in_place_is_planned_again(adapter) -> None:
    """mega-hit-weights: the host's weight list keeps its identity, one tensor in it is new."""
    from _mega_cases import make_problem
    from test_mega_adapter import _experts, _kwargs

    problem = make_problem("fp8xfp4", seed=48, tokens=12)
    i = problem.inputs
    experts = _experts(problem, mega_l1_weights=list(i.l1_weights))
    first = adapter.build_call(experts, i.hidden_states, i.topk_ids, i.topk_weights, **_kwargs(problem))
    fresh = i.l1_weights[0].clone()
    experts.mega_l1_weights[0] = fresh
    again = adapter.build_call(experts, i.hidden_states, i.topk_ids, i.topk_weights, **_kwargs(problem))
    assert again.plan is not first.plan and again.inputs.l1_weights[0] is fresh


def test_a_new_routed_scaling_factor_is_a_new_plan(adapter) -> None:
    """mega-rsf-key: the same layer called with another routed_scaling_factor does not reuse the plan."""
    from _mega_cases import make_problem
    from test_mega_adapter import _experts, _kwargs

    problem = make_problem("fp8xfp4", seed=49)
    i, experts = problem.inputs, _experts(problem)
    calls = [
        adapter.build_call(
            experts, i.hidden_states, i.topk_ids, i.topk_weights, **_kwargs(problem, routed_scaling_factor=rsf)
        )
        for rsf in (1.0, 2.5)
    ]
    assert calls[0].plan is not calls[1].plan
    assert [c.config.routed_scaling_factor for c in calls] == [1.0, 2.5]
