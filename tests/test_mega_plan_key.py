"""The MegaMoE layer plans, through SGLang's real ``load_plugins()`` and its hooked ``run_mega_routed_experts``:

- every flag that decides delegation is in the plan key: on a layer whose plan is cached, a call with
  ``routing_in_buffer=True``, NVFP4 experts or weights not built goes to SGLang's own function;
- a plan holds no strong reference to its experts object or weights: dropped layers are freed, and an
  experts object that reuses a freed one's ``id()`` is planned afresh.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

pytest.importorskip("sglang")

from importlib.metadata import EntryPoint

from _mega_cases import make_problem
from sglang_session import loaded_sglang, require_mega_target

from sglang_moe_plugins import InvalidArgumentError, UserConfig, api
from sglang_moe_plugins.core.registry import ENTRY_POINT_GROUP
from sglang_moe_plugins.integrations.sglang import mega_moe as ma

pytestmark = pytest.mark.sglang
MEGA_REFERENCE = EntryPoint(
    "mega_reference", "sglang_moe_plugins.plugins.reference.mega_moe:MegaReferencePlugin", ENTRY_POINT_GROUP
)


class Experts:
    """SGLang's experts module as the hook reads it: plain attributes, weakly referenceable (an nn.Module is)."""

    def __init__(self, problem, **flags):
        s, i = problem.shape, problem.inputs
        self.__dict__.update(
            _mega_moe_weights_built=True,
            _mega_moe_nvfp4=False,
            _mega_moe_w4a4=False,
            _mega_moe_sm90_fp8_weights=False,
            num_experts=s.num_experts,
            moe_ep_size=1,
            mega_l1_weights=i.l1_weights,
            mega_l2_weights=i.l2_weights,
        )
        self.__dict__.update(flags)


@pytest.fixture()
def host(monkeypatch):
    loaded_sglang()
    require_mega_target()
    import sglang.srt.layers.moe.mega_moe as host_module

    assert getattr(host_module.run_mega_routed_experts, "__wrapped__", None) is not None, (
        "run_mega_routed_experts is not hooked"
    )
    monkeypatch.setattr(ma, "_ep_group", lambda: None)
    ma.reset()
    api.reload(UserConfig(), entry_points=[MEGA_REFERENCE])
    yield host_module
    ma.reset()
    api.reload(UserConfig())


def call(host, experts, problem, **over):
    s, c, i = problem.shape, problem.config, problem.inputs
    kwargs = dict(
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
    kwargs.update(over)
    return host.run_mega_routed_experts(experts, i.hidden_states, i.topk_ids, i.topk_weights, **kwargs)


def raised_in_host_function(exc: BaseException) -> bool:
    """The exception came from SGLang's own run_mega_routed_experts body (no DeepGEMM on CPU)."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "run_mega_routed_experts" and "sglang/srt/layers/moe/mega_moe.py" in code.co_filename:
            return True
        tb = tb.tb_next
    return False


@pytest.mark.parametrize("flag", ["routing_in_buffer", "nvfp4", "weights_not_built"])
def test_a_cached_plan_never_runs_a_call_that_goes_to_sglang(host, flag):
    problem = make_problem("fp8xfp4", seed=61)
    experts = Experts(problem)
    y = call(host, experts, problem)  # planned and cached: the plugin runs it
    assert y.shape == (problem.inputs.num_tokens, problem.shape.hidden) and len(ma.PLANS) == 1
    over = {}
    if flag == "routing_in_buffer":
        over["routing_in_buffer"] = True
    elif flag == "nvfp4":
        experts._mega_moe_nvfp4 = True
    else:
        experts._mega_moe_weights_built = False
    with pytest.raises(Exception) as info:  # noqa: PT011 - SGLang's own function has no CPU kernel
        call(host, experts, problem, **over)
    assert raised_in_host_function(info.value), f"{flag}: the call did not reach SGLang's function: {info.value!r}"
    # the layer's own calls still use its plan
    experts.__dict__.update(_mega_moe_nvfp4=False, _mega_moe_weights_built=True)
    assert torch.equal(call(host, experts, problem), y)


def test_dropped_layers_are_freed(host):
    refs, alive = [], []
    for seed in range(4):
        problem = make_problem("fp8xfp4", seed=70 + seed)
        experts = Experts(problem)
        call(host, experts, problem)
        refs += [weakref.ref(t) for t in (*problem.inputs.l1_weights, *problem.inputs.l2_weights)]
        alive.append(weakref.ref(experts))
        del problem, experts
    assert len(ma.PLANS) == 4 or all(r() is None for r in alive)
    gc.collect()
    assert [r() is None for r in alive] == [True] * 4
    assert sum(r() is not None for r in refs) == 0, "a dropped layer's weights are still referenced"
    assert ma.PLANS == {}  # the freed experts' plans left the cache


def test_an_experts_object_reusing_a_freed_id_is_planned_afresh(host):
    problem = make_problem("fp8xfp4", seed=62)
    first = Experts(problem)
    call(host, first, problem)
    old_id = id(first)
    del first
    gc.collect()
    misses, reused = [], None
    for _ in range(10000):  # CPython hands a freed object's memory to the next object of its size
        candidate = Experts(problem, moe_ep_size=2)  # same weights, another layer's parallel layout
        if id(candidate) == old_id:
            reused = candidate
            break
        misses.append(candidate)
    if reused is None:
        pytest.skip("no new object reused the freed experts object's id")
    # Planned afresh: describe() sees moe_ep_size=2 and refuses the 1-rank routing (the old plan was EP1).
    with pytest.raises(InvalidArgumentError):
        call(host, reused, problem)
