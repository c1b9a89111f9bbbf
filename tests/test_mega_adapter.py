"""integrations.sglang.mega_moe: which run_mega_routed_experts calls the op models, and how."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
import torch
from _mega_cases import make_problem

from sglang_moe_plugins.errors import InvalidArgumentError, OutputValidationError
from sglang_moe_plugins.integrations.sglang import mega_moe as ma
from sglang_moe_plugins.ops import mega_moe as mm


@pytest.fixture(autouse=True)
def _fresh_adapter():
    ma.reset()  # settings (the token cap) are read once per process; plans are cached per layer
    yield
    ma.reset()


class Experts(SimpleNamespace):
    """A stand-in for SGLang's experts module: attributes, and weakly referenceable as an nn.Module is
    (the adapter caches plans only for such objects)."""


def _experts(problem, **flags) -> SimpleNamespace:
    base = dict(
        _mega_moe_weights_built=True,
        _mega_moe_nvfp4=False,
        _mega_moe_w4a4=problem.config.variant == "mxf4xmxf4",
        _mega_moe_sm90_fp8_weights=problem.config.variant == "sm90_fp8",
        num_experts=problem.shape.num_experts,
        moe_ep_size=1,
        mega_l1_weights=problem.inputs.l1_weights,
        mega_l2_weights=problem.inputs.l2_weights,
    )
    base.update(flags)
    return Experts(**base)


def _kwargs(problem, **over):
    s, c = problem.shape, problem.config
    kw = dict(
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        top_k=s.top_k,
        num_tokens=problem.inputs.num_tokens,
        activation_clamp=c.activation_clamp,
        routed_scaling_factor=c.routed_scaling_factor,
        activation="swiglu",
        num_shared_experts=s.num_shared_experts,
        shared_l1_weights=problem.inputs.shared_l1_weights,
        shared_l2_weights=problem.inputs.shared_l2_weights,
        routing_in_buffer=False,
    )
    kw.update(over)
    return kw


def _call(problem, experts=None, **over):
    i = problem.inputs
    return ma.build_call(
        experts or _experts(problem), i.hidden_states, i.topk_ids, i.topk_weights, **_kwargs(problem, **over)
    )


def test_known_kwargs_are_the_host_functions_keyword_parameters() -> None:
    host = pytest.importorskip("sglang.srt.layers.moe.mega_moe", reason="sglang==0.5.23 installed")
    params = inspect.signature(host.run_mega_routed_experts).parameters
    positional = [n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keyword = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert positional == ["experts", "hidden_states", "topk_ids", "topk_weights"]
    assert keyword == set(ma.KNOWN_KWARGS)
    assert {n for n in keyword if params[n].default is inspect.Parameter.empty} == set(ma.REQUIRED_KWARGS)
    assert ma.HOST_FUNCTION == f"{host.__name__}.run_mega_routed_experts"


@pytest.mark.parametrize("variant", ["fp8xfp4", "mxf4xmxf4", "sm90_fp8"])
def test_build_call_models_the_variant(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", "1024")
    problem = make_problem(variant, rsf=2.5, shared=variant == "fp8xfp4", seed=41)
    call = _call(problem)
    assert isinstance(call, ma.MegaCall)
    assert call.config.variant == variant and call.config.routed_scaling_factor == 2.5
    assert call.shape == mm.MegaMoEShape(
        problem.shape.num_experts,
        problem.shape.hidden,
        problem.shape.intermediate,
        problem.shape.top_k,
        problem.shape.num_shared_experts,
        1,
        1024,
    )
    assert call.inputs.l1_weights[0] is problem.inputs.l1_weights[0]
    assert call.inputs.ep_group is None  # no SGLang runtime context here
    assert {f.name for f in dataclasses.fields(call.inputs)} == {
        "hidden_states",
        "topk_ids",
        "topk_weights",
        "l1_weights",
        "l2_weights",
        "shared_l1_weights",
        "shared_l2_weights",
        "ep_group",
    }
    outputs = call.allocate_outputs()
    assert outputs.y.shape == (problem.inputs.num_tokens, problem.shape.hidden)
    assert call.result(outputs).data_ptr() == outputs.y.data_ptr()


def test_zero_tokens_allocates_one_row_and_returns_none() -> None:
    problem = make_problem("fp8xfp4", tokens=0, seed=42)
    i = problem.inputs
    call = ma.build_call(_experts(problem), i.hidden_states, None, None, **_kwargs(problem))
    outputs = call.allocate_outputs()
    assert outputs.y.shape == (1, problem.shape.hidden) and call.result(outputs).shape == (0, problem.shape.hidden)


@pytest.mark.parametrize(
    "change",
    [
        {"routing_in_buffer": True},
        {"activation": "swigluoai"},
        {"brand_new_argument": 1},
    ],
)
def test_calls_left_to_the_host(change: dict) -> None:
    problem = make_problem("fp8xfp4", seed=43)
    assert _call(problem, **change) is None


@pytest.mark.parametrize("flags", [{"_mega_moe_nvfp4": True}, {"_mega_moe_weights_built": False}])
def test_experts_left_to_the_host(flags: dict) -> None:
    problem = make_problem("fp8xfp4", seed=44)
    assert _call(problem, experts=_experts(problem, **flags)) is None


def test_experts_whose_weights_disagree_are_an_error() -> None:
    problem = make_problem("fp8xfp4", seed=44)
    with pytest.raises(InvalidArgumentError, match=r"l1_weights\[0\].shape"):
        _call(problem, experts=_experts(problem, num_experts=6))
    experts = _experts(problem)
    del experts.mega_l2_weights
    assert _call(problem, experts=experts) is None  # not the host's experts module as modelled: left to SGLang


def test_missing_required_kwarg_and_token_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = make_problem("fp8xfp4", seed=45)
    i = problem.inputs
    kwargs = _kwargs(problem)
    del kwargs["top_k"]
    assert ma.build_call(_experts(problem), i.hidden_states, i.topk_ids, i.topk_weights, **kwargs) is None
    monkeypatch.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", str(i.num_tokens - 1))
    ma.reset()
    with pytest.raises(InvalidArgumentError, match="max_tokens_per_rank") as err:
        _call(problem)
    assert err.value.argument == "hidden_states.shape[0]"


def test_num_tokens_that_disagrees_with_hidden_states_is_an_error() -> None:
    problem = make_problem("fp8xfp4", seed=43)
    with pytest.raises(InvalidArgumentError) as err:
        _call(problem, num_tokens=3)
    assert err.value.argument == "num_tokens" and err.value.value == 3


def test_a_layer_is_planned_once_and_checked_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second call of a layer runs no describe(); what depends on the batch is still checked."""
    problem = make_problem("fp8xfp4", seed=48, tokens=12)
    experts = _experts(problem)
    first = _call(problem, experts)
    described = []
    real = mm.describe
    monkeypatch.setattr(mm, "describe", lambda *a, **k: described.append(1) or real(*a, **k))
    second = _call(problem, experts)
    assert described == [] and second.plan is first.plan and second.shape is first.shape
    assert second.inputs.hidden_states is problem.inputs.hidden_states
    # another batch of the same layer: same plan
    i = problem.inputs
    short = ma.build_call(
        experts, i.hidden_states[:5], i.topk_ids[:5], i.topk_weights[:5], **_kwargs(problem, num_tokens=5)
    )
    assert (
        described == [] and short.plan is first.plan and short.allocate_outputs().y.shape == (5, problem.shape.hidden)
    )
    # a batch whose routing disagrees: validated again, and refused with the argument's name
    with pytest.raises(InvalidArgumentError, match=r"topk_ids\.shape"):
        ma.build_call(experts, i.hidden_states[:5], i.topk_ids, i.topk_weights[:5], **_kwargs(problem, num_tokens=5))
    assert described == [1]
    # the host rebuilt its weights: planned again
    described.clear()
    experts.mega_l1_weights = tuple(list(experts.mega_l1_weights))  # noqa: C414 - a new tuple object: tuple() of a tuple is that tuple
    again = _call(problem, experts)
    assert again.plan is not first.plan and described == [1]


def _fill_plans(monkeypatch: pytest.MonkeyPatch, cap: int) -> tuple[list, list]:
    """Four layers' plans (four live experts objects, kept by the caller) with the cache capped at ``cap``."""
    from sglang_moe_plugins.integrations.sglang import mega_plan

    monkeypatch.setattr(mega_plan, "MAX_PLANS", cap)
    problem = make_problem("fp8xfp4", seed=49)
    layers = [_experts(problem) for _ in range(4)]
    calls = [_call(problem, experts, routed_scaling_factor=rsf) for experts, rsf in zip(layers, (1.0, 2.0, 3.0, 4.0))]
    assert all(c is not None for c in calls)
    return layers, calls


def _assert_capped_at_two(calls: list) -> None:
    """Cap 2, four live layers: the third plan cleared the cache, so the newest two remain."""
    assert len(ma.PLANS) == 2, len(ma.PLANS)
    assert {id(p) for p in ma.PLANS.values()} == {id(calls[2].plan), id(calls[3].plan)}


def test_the_plan_cache_is_bounded(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    layers, calls = _fill_plans(monkeypatch, 2)
    _assert_capped_at_two(calls)
    assert [r.levelname for r in caplog.records if "cache cleared" in r.getMessage()] == ["WARNING"]
    del layers[3]  # a freed layer still takes its plan with it
    assert list(ma.PLANS.values()) == [calls[2].plan]


def test_the_bound_check_fails_when_the_cap_is_not_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Injected fault: no effective cap. The same check fails (all four live plans stay)."""
    layers, calls = _fill_plans(monkeypatch, 10**9)
    assert len(ma.PLANS) == 4 and len(layers) == 4
    with pytest.raises(AssertionError):
        _assert_capped_at_two(calls)


def test_variant_of() -> None:
    assert ma.variant_of(SimpleNamespace()) == "fp8xfp4"
    assert ma.variant_of(SimpleNamespace(_mega_moe_w4a4=True)) == "mxf4xmxf4"
    assert ma.variant_of(SimpleNamespace(_mega_moe_sm90_fp8_weights=True, _mega_moe_w4a4=False)) == "sm90_fp8"
    assert ma.variant_of(SimpleNamespace(_mega_moe_nvfp4=True)) is None


def test_describe_errors_name_argument_and_allowed() -> None:
    problem = make_problem("fp8xfp4", seed=46)
    i = problem.inputs
    common = dict(
        l1_weights=i.l1_weights,
        l2_weights=i.l2_weights,
        num_experts=problem.shape.num_experts,
        hidden_size=problem.shape.hidden,
        intermediate_size=problem.shape.intermediate,
        top_k=problem.shape.top_k,
    )
    with pytest.raises(InvalidArgumentError, match=r"variant='nvfp4xnvfp4'.*one of \('fp8xfp4'"):
        mm.describe(i.hidden_states, i.topk_ids, i.topk_weights, variant="nvfp4xnvfp4", **common)
    with pytest.raises(InvalidArgumentError, match=r"hidden_states.dtype=torch.float16; allowed: torch.bfloat16"):
        mm.describe(i.hidden_states.half(), i.topk_ids, i.topk_weights, variant="fp8xfp4", **common)
    with pytest.raises(InvalidArgumentError, match=r"topk_ids.shape=\(12, 2\)"):
        mm.describe(i.hidden_states, i.topk_ids[:, :2], i.topk_weights, variant="fp8xfp4", **common)
    with pytest.raises(InvalidArgumentError, match=r"activation_clamp=-1.0"):
        mm.describe(i.hidden_states, i.topk_ids, i.topk_weights, variant="fp8xfp4", activation_clamp=-1.0, **common)
    with pytest.raises(
        InvalidArgumentError, match=r"l1_weights\[0\].shape=.*for fp4_e2m1_ue8m0_g32 weights of 2 local experts"
    ):
        mm.describe(
            i.hidden_states, i.topk_ids, i.topk_weights, variant="fp8xfp4", ep_size=2, **dict(common, num_experts=4)
        )
    with pytest.raises(InvalidArgumentError, match="num_tokens"):
        mm.allocate_outputs(problem.shape, problem.config, torch.device("cpu"))


def test_validate_outputs() -> None:
    problem = make_problem("fp8xfp4", seed=47)
    good = mm.allocate_outputs(problem.shape, problem.config, torch.device("cpu"), num_tokens=5)
    mm.validate_outputs(good, problem.shape, problem.config, "x")
    for bad in (mm.MegaMoEOutputs(good.y.float()), mm.MegaMoEOutputs(good.y[:, :-1]), mm.MegaMoEOutputs(good.y.t())):
        with pytest.raises(OutputValidationError, match="plugin 'x'"):
            mm.validate_outputs(bad, problem.shape, problem.config, "x")


@pytest.mark.sglang
@pytest.mark.parametrize("variant", ["fp8xfp4", "sm90_fp8"])
def test_sglangs_hooked_function_runs_the_op(variant: str) -> None:
    """SGLang's real load_plugins() and its hooked run_mega_routed_experts, on CPU: mega_reference's rows,
    the same on the second call of the layer (planned once), and an invalid call raises our error."""
    pytest.importorskip("sglang")
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from sglang_session import loaded_sglang, require_mega_target

    require_mega_target()

    loaded_sglang()
    from sglang.srt.layers.moe import mega_moe as host

    from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin

    problem = make_problem(variant, rsf=1.5, seed=50, tokens=6)
    experts = _experts(problem)
    i = problem.inputs
    want = mm.allocate_outputs(problem.shape, problem.config, torch.device("cpu"), num_tokens=6)
    MegaReferencePlugin().run(i, want, problem.shape, problem.config)
    for _ in range(2):
        y = host.run_mega_routed_experts(experts, i.hidden_states, i.topk_ids, i.topk_weights, **_kwargs(problem))
        assert y.shape == (6, problem.shape.hidden) and torch.equal(y, want.y[:6])
    with pytest.raises(InvalidArgumentError) as err:
        host.run_mega_routed_experts(experts, i.hidden_states, i.topk_ids[:, :1], i.topk_weights, **_kwargs(problem))
    assert err.value.argument == "topk_ids.shape"


def test_experts_that_cannot_be_weakly_referenced_are_planned_every_call() -> None:
    """A plan never holds its experts object strongly; one it cannot reference weakly is not cached."""
    problem = make_problem("fp8xfp4", seed=50)
    experts = SimpleNamespace(**vars(_experts(problem)))  # SimpleNamespace: no weak references
    first, second = _call(problem, experts), _call(problem, experts)
    assert first is not None and second is not None and second.plan is not first.plan
    assert ma.PLANS == {}
