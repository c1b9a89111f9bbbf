"""Issue 12, item 4: one failure policy, each rule through SGLang's real ``load_plugins()`` and its hooked
function (docs/reliability.md, "Failure policy").

- a forced plugin that cannot run the call: NoPluginAvailableError naming it and its reason, never SGLang's function;
- invalid arguments: InvalidArgumentError from the hook;
- calls the op does not model by design: SGLang's original function, logged once per kind;
- a collective op (mega_moe): a plugin that raises, raises on that rank; no per-rank fallback;
- an invalid configuration (strict or not): hooks installed, every hooked call raises the ConfigError.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("sglang")

from sglang_probe import run_probe
from sglang_session import (  # noqa: F401 - runner, default_selector: the shared fixtures
    MEGA_REFERENCE,
    MEGA_TARGET,
    REFERENCE,
    SMQ_TARGET,
    TRITON,
    default_selector,
    ep,
    hooked_targets,
    require_mega_target,
    runner,
)

from sglang_moe_plugins import InvalidArgumentError, NoPluginAvailableError, UserConfig, Verdict, api
from sglang_moe_plugins.config import parse_config
from sglang_moe_plugins.ops import get_op, silu_mul_quant as smq

pytestmark = pytest.mark.sglang
LOGGER = "sglang_moe_plugins"


def data(e=4, n=8, d=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gateup = (torch.randn(e, n, 2 * d, generator=gen) * 3).to(torch.bfloat16)
    masked = torch.randint(0, n + 1, (e,), generator=gen, dtype=torch.int32)
    return gateup, masked


def raised_in_sglang(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if "sglang/srt/layers/moe/moe_runner/deep_gemm.py" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


# -- a forced plugin that cannot run the call ---------------------------------------------------------
def test_forced_plugin_that_cannot_run_raises_naming_it(runner, caplog):
    """triton forced on this CPU machine: the call raises, naming triton and why; SGLang's function is not run."""
    api.reload(parse_config({"force": {smq.OP: "triton"}}), entry_points=[TRITON, REFERENCE])
    gateup, masked = data()
    with pytest.raises(NoPluginAvailableError) as info:
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    err = info.value
    assert err.forced == "triton" and err.op == smq.OP
    assert str(err).startswith(
        "the forced plugin 'triton' (force.silu_mul_quant in the configuration) cannot run silu_mul_quant E=4 N=8"
    )
    assert "unsupported: needs a CUDA device; this call runs on cpu" in str(err)
    assert not raised_in_sglang(err)  # never handed to SGLang's original function
    # The reference could run it, but the op is forced: it is not tried.
    assert (
        api.get_selector()
        .explain(smq.OP, *smq.describe(gateup, masked, group_size=128, topk=2))
        .candidate("reference")
        .verdict
        == Verdict.NOT_FORCED
    )


def test_no_plugin_at_all_raises_instead_of_delegating(runner):
    api.reload(parse_config({"disable": ["reference"]}), entry_points=[REFERENCE])
    gateup, masked = data()
    with pytest.raises(
        NoPluginAvailableError, match=r"no enabled plugin of op 'silu_mul_quant' supports .*\n  - reference: disabled"
    ) as info:
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    assert not raised_in_sglang(info.value)


def test_forced_plugin_that_raises_at_run_time_is_not_replaced(runner):
    api.reload(
        parse_config({"force": {smq.OP: "policy_smq_raises"}}),
        entry_points=[ep("policy_smq_raises", "policy_plugins:SmqRaises"), REFERENCE],
    )
    gateup, masked = data()
    for _ in range(2):  # not remembered as failed: the next call raises again
        with pytest.raises(RuntimeError, match="silu_mul_quant kernel failed on this rank") as info:
            runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
        assert any(
            "plugin 'policy_smq_raises'" in note and "force.silu_mul_quant" in note for note in info.value.__notes__
        )
    assert api.get_selector().failed_plugins() == {}


# -- invalid arguments --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, argument, value_text",
    [
        pytest.param(
            lambda g, m: ((g, torch.empty_like(m, device="meta"), 128, 2), {}),
            "masked_m.device",
            "device(type='meta')",
            id="masked_m-other-device",
        ),
        pytest.param(
            lambda g, m: ((g, m, 128, 2), {"swiglu_limit": float("nan")}), "swiglu_limit", "nan", id="swiglu_limit-nan"
        ),
        pytest.param(lambda g, m: ((g.float(), m, 128, 2), {}), "gateup.dtype", "torch.float32", id="gateup-fp32"),
        pytest.param(lambda g, m: ((g, m.long(), 128, 2), {}), "masked_m.dtype", "torch.int64", id="masked_m-int64"),
        pytest.param(lambda g, m: ((g, m), {"group_size": 100, "topk": 2}), "group_size", "100", id="group_size-100"),
        pytest.param(lambda g, m: ((g.transpose(0, 1), m, 128, 2), {}), "gateup.stride()", "(", id="gateup-transposed"),
    ],
)
def test_invalid_arguments_raise_from_the_hook(runner, call, argument, value_text):
    gateup, masked = data(e=4, n=4)
    args, kwargs = call(gateup, masked)
    for _ in range(2):  # a second time too: an invalid call is never cached as a known key
        with pytest.raises(InvalidArgumentError) as info:
            runner._varlen_deep_gemm_silu_mul_quant(*args, **kwargs)
        assert info.value.argument == argument and value_text in str(info.value) and "; allowed: " in str(info.value)
        assert not raised_in_sglang(info.value)


def test_a_valid_key_does_not_let_an_equal_looking_invalid_call_through(runner):
    """True == 1 and 128.0 == 128: the cached key carries the argument types, so these are still rejected."""
    gateup, masked = data(e=4, n=4)
    runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 1)
    with pytest.raises(InvalidArgumentError, match=r"group_size=128.0"):
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128.0, 1)
    with pytest.raises(InvalidArgumentError, match="topk=True"):
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, True)


# -- calls the op does not model: the original, logged once per kind ---------------------------------
def test_unmodelled_calls_go_to_the_original_logged_once_per_kind(runner, caplog, monkeypatch):
    gateup, masked = data(e=2, n=4)
    before = api.get_selector().cache_info()["decisions"]
    from sglang_moe_plugins.integrations.sglang import entry
    from sglang_moe_plugins.log import LogOnce

    logged = LogOnce()
    monkeypatch.setattr(entry, "_delegations_logged", logged)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for alpha in (1.702, 1.5, 2.0, 3.0):  # different values: one line for the kind
            with pytest.raises(Exception) as info:  # noqa: PT011 - SGLang's own function has no CPU kernel
                runner._varlen_deep_gemm_silu_mul_quant(
                    gateup, masked, 128, 2, gemm1_alpha=alpha, gemm1_clamp_limit=7.0
                )
            assert raised_in_sglang(info.value)
        for _ in range(3):
            with pytest.raises(AssertionError) as info:  # SGLang's `assert masked_m is not None`
                runner._varlen_deep_gemm_silu_mul_quant(gateup, None, 128, 2)
            assert raised_in_sglang(info.value)
    lines = [r.getMessage() for r in caplog.records if "handed to SGLang's original function" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "gemm1_alpha / gemm1_clamp_limit" in lines[0] and "masked_m=None" in lines[1]
    assert (
        len(logged) == 2 and not logged.first("gemm1_alpha") and not logged.first("masked_m=None")
    )  # kinds, never values
    assert api.get_selector().cache_info()["decisions"] == before  # nothing was selected


# -- collective ops: no per-rank fallback -------------------------------------------------------------
class _Experts:
    """SGLang's experts module as the hook sees it: attributes, weakly referenceable like an nn.Module."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


_LAYERS: dict[int, tuple] = {}  # id(problem) -> (problem, its experts object): one layer per problem


def _mega_call(runner_module, problem):
    s, c, i = problem.shape, problem.config, problem.inputs
    layer = _LAYERS.get(id(problem))
    if layer is None or layer[0] is not problem:
        layer = _LAYERS[id(problem)] = (
            problem,
            _Experts(
                _mega_moe_weights_built=True,
                _mega_moe_nvfp4=False,
                _mega_moe_w4a4=False,
                _mega_moe_sm90_fp8_weights=False,
                num_experts=s.num_experts,
                moe_ep_size=1,
                mega_l1_weights=i.l1_weights,
                mega_l2_weights=i.l2_weights,
            ),
        )
    experts = layer[1]
    return runner_module.run_mega_routed_experts(
        experts,
        i.hidden_states,
        i.topk_ids,
        i.topk_weights,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        top_k=s.top_k,
        num_tokens=i.num_tokens,
        activation_clamp=c.activation_clamp,
        routed_scaling_factor=c.routed_scaling_factor,
        activation="swiglu",
        num_shared_experts=0,
        shared_l1_weights=None,
        shared_l2_weights=None,
        routing_in_buffer=False,
    )


def test_collective_op_never_falls_back_per_rank(runner, caplog):
    require_mega_target()
    import sglang.srt.layers.moe.mega_moe as host
    from _mega_cases import make_problem

    assert get_op("mega_moe").collective and not get_op(smq.OP).collective
    assert getattr(host.run_mega_routed_experts, "__wrapped__", None) is not None, f"{MEGA_TARGET} is not hooked"
    api.reload(UserConfig(), entry_points=[ep("policy_mega_raises", "policy_plugins:MegaRaises"), MEGA_REFERENCE])
    problem = make_problem("fp8xfp4", seed=3)
    for _ in range(2):  # the plugin raises on this rank every time; mega_reference is never run in its place
        with pytest.raises(RuntimeError, match="mega kernel failed on this rank") as info:
            _mega_call(host, problem)
        assert any(
            "op 'mega_moe' is collective" in note and "policy_mega_raises" in note for note in info.value.__notes__
        )
    assert api.get_selector().failed_plugins() == {}
    # Without the failing plugin the same hooked call runs mega_reference: the call itself is modelled.
    api.reload(UserConfig(), entry_points=[MEGA_REFERENCE])
    y = _mega_call(host, problem)
    assert y.shape == (problem.inputs.num_tokens, problem.shape.hidden) and torch.isfinite(y.float()).all()


def test_collective_op_never_falls_back_when_supports_raises(runner):
    """A supports() that raises on one rank must not send that rank to another kernel: the call raises."""
    require_mega_target()
    import sglang.srt.layers.moe.mega_moe as host
    from _mega_cases import make_problem

    api.reload(
        UserConfig(),
        entry_points=[ep("policy_mega_supports_raises", "policy_plugins:MegaSupportsRaises"), MEGA_REFERENCE],
    )
    problem = make_problem("fp8xfp4", seed=4)
    with pytest.raises(RuntimeError, match="probe failed on this rank") as info:
        _mega_call(host, problem)
    assert any("collective" in note and "policy_mega_supports_raises" in note for note in info.value.__notes__)
    api.reload(UserConfig(), entry_points=[MEGA_REFERENCE])


def test_non_collective_op_still_falls_back(runner, caplog):
    api.reload(UserConfig(), entry_points=[ep("policy_smq_raises", "policy_plugins:SmqRaises"), REFERENCE])
    gateup, masked = data()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        out, _scale = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "policy_smq_raises" in errors[0].getMessage()
    shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
    assert api.get_selector().explain(smq.OP, shape, config).chosen.name == "reference"
    assert out.shape == (4, 8, 256)


def test_a_run_time_failure_that_leaves_only_the_withheld_reference_goes_to_sglang(runner, monkeypatch, caplog):
    """On a CUDA call (the platform read as sm90), the only kernel fails at run time and the only plugin left is the
    pure-torch reference, withheld on CUDA: the call goes to SGLang's own function, as the first call of a key
    whose kernel is unsupported does, instead of raising a NoPluginAvailableError that says SGLang runs it."""
    import inspect

    from sglang_moe_plugins.counters import totals
    from sglang_moe_plugins.hardware import Platform
    from sglang_moe_plugins.ops import silu_mul_quant as smq_module

    monkeypatch.setattr(smq_module, "platform_of", lambda tensor: Platform.cuda(9, 0))
    api.reload(UserConfig(), entry_points=[ep("policy_smq_raises", "policy_plugins:SmqRaises"), REFERENCE])
    gateup, masked = data()
    stock = inspect.unwrap(runner._varlen_deep_gemm_silu_mul_quant)
    try:
        want = stock(gateup, masked, 128, 2)
    except Exception as exc:  # noqa: BLE001 - SGLang's function on this CPU machine: whatever it does, the hook does
        want = exc
    before = totals()
    for _ in range(2):  # the failing key's first call, then the next call of the same key
        with caplog.at_level(logging.INFO, logger=LOGGER):
            try:
                got = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
            except Exception as exc:  # noqa: BLE001
                got = exc
        assert not isinstance(got, NoPluginAvailableError), got
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want) and raised_in_sglang(got)
        else:
            assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])
    delta = {k: v - before.get(k, 0) for k, v in totals().items() if v != before.get(k, 0)}
    assert delta.get(("delegations", smq.OP, "withheld"), 0) >= 1, delta
    _shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
    assert config.platform == Platform.cuda(9, 0)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR and "policy_smq_raises" in r.getMessage()]


# -- configuration errors fail closed (strict or not); tests/test_config_fail_closed.py has the rest ------
@pytest.mark.parametrize("strict_from", ["env", "file"])
def test_strict_config_error_installs_hooks_that_raise_it(tmp_path, strict_from):
    bad = tmp_path / "moe.toml"
    bad.write_text(("strict = true\n" if strict_from == "file" else "") + 'enable = ["jit_epp"]\n')
    env = {"SGLANG_MOE_PLUGINS_CONFIG": str(bad)}
    if strict_from == "env":
        env["SGLANG_MOE_PLUGINS_STRICT"] = "1"
    result, stderr = run_probe(**env)
    # each op's main target fails closed; the compact runner's too. SGLang's kernel wrapper and layout guard stay
    # SGLang's own (entry.register: their op's main hook raises first)
    from sglang_moe_plugins.integrations.sglang.versions import CONTIG_RUNNER_TARGET

    assert result["patched"] == sorted(
        t for t in (SMQ_TARGET, MEGA_TARGET, CONTIG_RUNNER_TARGET) if t in hooked_targets()
    )
    want = "ConfigError: unknown plugin 'jit_epp' (enabled by 'enable' in"
    assert len(result["calls"]) == 2 and all(c.startswith(want) for c in result["calls"]), result["calls"]
    assert "failing closed: the hooks are installed and every hooked call raises this ConfigError" in stderr


def test_strict_env_with_a_toml_syntax_error_fails_closed(tmp_path):
    bad = tmp_path / "moe.toml"
    bad.write_text("[priority\nreference = 5\n")
    result, _ = run_probe(SGLANG_MOE_PLUGINS_CONFIG=str(bad), SGLANG_MOE_PLUGINS_STRICT="1")
    assert result["patched"] and all("ConfigError" in c and "TOML syntax error" in c for c in result["calls"])


@pytest.mark.parametrize("kind", ["directory", "not-utf8"])
def test_unreadable_config_path_is_a_config_error_at_load_plugins(tmp_path, kind):
    if kind == "directory":
        path, text = tmp_path, "is a directory; it must name a TOML file"
    else:
        path = tmp_path / "moe.toml"
        path.write_bytes(b'disable = ["jit_ep"]\n# caf\xe9\n')
        text = "not UTF-8 text"
    result, stderr = run_probe(SGLANG_MOE_PLUGINS_CONFIG=str(path), SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR="stock")
    assert result["patched"] == []  # on_config_error = stock: the package stays off, SGLang runs unhooked
    assert (
        "sglang-moe-plugins is NOT active (on_config_error = stock): invalid configuration: SGLANG_MOE_PLUGINS_CONFIG="
    ) in stderr and text in stderr
    assert "IsADirectoryError" not in stderr and "UnicodeDecodeError" not in stderr  # no raw traceback
    assert "Traceback" not in stderr and "Failed to execute general plugin" not in stderr  # not re-raised
    closed, _ = run_probe(SGLANG_MOE_PLUGINS_CONFIG=str(path))  # the default fails closed
    assert closed["patched"] and all(c.startswith("ConfigError") and text in c for c in closed["calls"])
    strict, _ = run_probe(SGLANG_MOE_PLUGINS_CONFIG=str(path), SGLANG_MOE_PLUGINS_STRICT="1")
    assert strict["patched"] and all(c.startswith("ConfigError") and text in c for c in strict["calls"])


def test_mega_hook_binds_once_per_plan(runner, monkeypatch):
    """The hooked MegaMoE call binds its op once per shape key and selector, and the selector keeps it; a
    repeated call runs that bound op (no selection, no new bound op); a new selector (reload) is bound afresh."""
    require_mega_target()
    import sglang.srt.layers.moe.mega_moe as host
    from _mega_cases import make_problem

    from sglang_moe_plugins.integrations.sglang import mega_moe as ma

    monkeypatch.setattr(ma, "_ep_group", lambda: None)
    ma.reset()
    api.reload(UserConfig(), entry_points=[MEGA_REFERENCE])
    problem = make_problem("fp8xfp4", seed=5)
    first = _mega_call(host, problem).clone()
    selector = api.get_selector()
    (plan,) = ma.PLANS.values()
    bound = selector.bind("mega_moe", plan.shape, plan.config)  # the one the Selector keeps (a dict hit)
    assert bound.name == "mega_reference" and bound.checked

    def no_new_bound_op(*a, **k):
        raise AssertionError("a repeated call bound the op again")

    selector._make_bound = no_new_bound_op  # an instance attribute, deleted below
    try:
        for _ in range(2):
            assert torch.equal(_mega_call(host, problem), first)
    finally:
        del selector._make_bound
    assert selector.cache_info()["decisions"] == 1
    api.reload(UserConfig(), entry_points=[MEGA_REFERENCE])
    assert torch.equal(_mega_call(host, problem), first)
    fresh = api.get_selector()
    assert fresh is not selector and fresh.cache_info()["bound"] == 1
    # Nothing is cached by plan (a dropped plan would stay in the Selector's raw-key cache for ever).
    assert not any(p in fresh.call_cache for p in ma.PLANS.values())
    ma.reset()
