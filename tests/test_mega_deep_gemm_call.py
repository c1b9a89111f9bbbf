"""The DeepGEMM plugins make exactly the calls sgl-deep-gemm's API documents (as SGLang 0.5.23 does).

Only deep_gemm's functions are replaced, by recording fakes that check every call binds to the real
function's signature; SGLang is never faked. CPU tensors; the pre-dispatch runs as the torch reference
(option ``pre_dispatch="torch"``) or, for ``"host"``, as the recorded deep_gemm kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _mega_cases import API_MMA_TYPE, make_problem

from sglang_moe_plugins.errors import InvalidArgumentError, KernelNotAvailableError
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.ops.mega_moe import formats as nm
from sglang_moe_plugins.plugins.deep_gemm import launch as launch_mod, plugin as mdg

deep_gemm = pytest.importorskip("deep_gemm", reason="the real sgl-deep-gemm API (signatures) is needed")


class FakeGroup:
    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def _fake_buffer(
    num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden, mma_type="fp8xfp4", sm90=False
):
    """Views shaped like sgl-deep-gemm 0.2.3's slice_symm_buffer_for_mega_moe returns them."""
    rows, groups = num_max_tokens_per_rank, hidden // 32
    if sm90:
        x = torch.zeros((rows, hidden), dtype=torch.float8_e4m3fn)
        x_sf = torch.zeros((rows, hidden // 128), dtype=torch.float32)
    else:
        x = (
            torch.zeros((rows, hidden // 2), dtype=torch.int8)
            if mma_type == "mxf4xmxf4"
            else torch.zeros((rows, hidden), dtype=torch.float8_e4m3fn)
        )
        x_sf = torch.zeros((rows, groups // 4), dtype=torch.int32)
    shared_rows = 256
    shared_sf = torch.as_strided(
        torch.zeros(shared_rows * groups // 4, dtype=torch.int32), (shared_rows, groups // 4), (1, shared_rows)
    )
    buf = SimpleNamespace(
        x=x,
        x_sf=x_sf,
        topk_idx=torch.full((rows, num_topk), 12345, dtype=torch.int64),
        topk_weights=torch.full((rows, num_topk), 7.0),
        shared_l1_acts_sf=shared_sf,
        group=None,
        num_experts=num_experts,
        num_max_tokens_per_rank=rows,
        num_topk=num_topk,
    )
    if not sm90:
        buf.mma_type = mma_type
    return buf


class Recorder:
    """Replaces deep_gemm functions; every call is checked against the real signature."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, sm90: bool = False, host_buffer=None, host_context=None):
        self.calls: list[tuple[str, inspect.BoundArguments]] = []
        self.snapshots: dict[str, Any] = {}
        self.sm90 = sm90
        self.num_sms = 148
        for name in (
            "get_symm_buffer_for_mega_moe",
            "fp8_fp4_mega_moe",
            "fp8_mega_moe",
            "mega_moe_pre_dispatch",
            "mega_moe_pre_dispatch_sm90",
            "get_block_m_for_mega_moe",
        ):
            monkeypatch.setattr(deep_gemm, name, self._wrap(name, getattr(deep_gemm, name)))
        monkeypatch.setattr(deep_gemm, "get_num_sms", lambda: self.num_sms)
        monkeypatch.setattr(deep_gemm, "set_num_sms", lambda n: setattr(self, "num_sms", n))
        # SGLang's helpers only when a test passes them (another test may have loaded SGLang's module)
        monkeypatch.setattr(launch_mod, "host_helpers", lambda api: (host_buffer, host_context))
        monkeypatch.setattr(launch_mod, "_buffers", {})

    def _wrap(self, name: str, real: Any) -> Any:
        signature = inspect.signature(real)

        def fake(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)  # TypeError if the call does not fit the real API
            self.calls.append((name, bound))
            return getattr(self, f"_{name}", lambda b: None)(bound)

        return fake

    def _get_symm_buffer_for_mega_moe(self, bound: inspect.BoundArguments) -> Any:
        a = bound.arguments
        buf = _fake_buffer(
            a["num_experts"],
            a["num_max_tokens_per_rank"],
            a["num_topk"],
            a["hidden"],
            a["intermediate_hidden"],
            a.get("mma_type", "fp8xfp4"),
            sm90=self.sm90,
        )
        buf.group = a["group"]
        return buf

    def _get_block_m_for_mega_moe(self, bound: inspect.BoundArguments) -> int:
        return 64

    def _kernel(self, bound: inspect.BoundArguments) -> None:
        buf = bound.arguments["sym_buffer"]
        self.snapshots["buffer"] = {
            k: getattr(buf, k).clone() for k in ("x", "x_sf", "topk_idx", "topk_weights", "shared_l1_acts_sf")
        }
        bound.arguments["y"].fill_(1.0)

    _fp8_fp4_mega_moe = _kernel
    _fp8_mega_moe = _kernel

    def named(self, name: str) -> list[inspect.BoundArguments]:
        return [b for n, b in self.calls if n == name]


def _run(plugin: mdg.MegaDeepGemmPlugin, problem, platform: Platform, pre_dispatch: str = "torch"):
    plugin.options = {"pre_dispatch": pre_dispatch}
    config = dataclasses.replace(problem.config, platform=platform)
    inputs = dataclasses.replace(problem.inputs, ep_group=FakeGroup())
    assert plugin.supports(problem.shape, config), plugin.supports(problem.shape, config).reason
    outputs = mm.allocate_outputs(problem.shape, config, inputs.device, num_tokens=inputs.num_tokens)
    env_before = {k: v for k, v in os.environ.items() if k.startswith("DG_")}
    plugin.run(inputs, outputs, problem.shape, config)
    assert {k: v for k, v in os.environ.items() if k.startswith("DG_")} == env_before  # never sets DG_* variables
    return inputs, outputs, config


def _expected_buffer(problem, variant: str, rsf: float, shared_block_m: int = 0) -> SimpleNamespace:
    s = problem.shape
    buf = _fake_buffer(
        s.num_experts,
        s.max_tokens_per_rank,
        s.top_k,
        s.hidden,
        s.intermediate,
        "mxf4xmxf4" if variant == "mxf4xmxf4" else "fp8xfp4",
        sm90=variant == "sm90_fp8",
    )
    nm.pre_dispatch_reference(
        problem.inputs.hidden_states,
        problem.inputs.topk_ids,
        problem.inputs.topk_weights,
        buf.x,
        buf.x_sf,
        buf.topk_idx,
        buf.topk_weights,
        variant=variant,
        routed_scaling_factor=rsf,
        shared_x_sf=buf.shared_l1_acts_sf if shared_block_m else None,
        shared_block_m=shared_block_m,
    )
    return buf


def _assert_buffer(snapshot: dict, expected: SimpleNamespace) -> None:
    for key in ("x", "x_sf", "topk_idx", "topk_weights", "shared_l1_acts_sf"):
        got, want = snapshot[key], getattr(expected, key)
        assert torch.equal(
            got.view(torch.uint8) if got.dtype.itemsize == 1 else got,
            want.view(torch.uint8) if want.dtype.itemsize == 1 else want,
        ), key


@pytest.mark.parametrize("shared", [False, True])
def test_w4a8_calls_fp8_fp4_mega_moe_like_sglang(monkeypatch: pytest.MonkeyPatch, shared: bool) -> None:
    sms = []

    @contextlib.contextmanager
    def num_sms_context(dg):
        assert dg is deep_gemm
        sms.append("enter")
        yield

    rec = Recorder(monkeypatch, host_context=num_sms_context)
    problem = make_problem("fp8xfp4", rsf=2.5, shared=shared, seed=21)
    inputs, outputs, _config = _run(mdg.MegaW4A8Plugin(API_MMA_TYPE), problem, Platform.cuda(10, 0))
    (buffer_call,) = rec.named("get_symm_buffer_for_mega_moe")
    s = problem.shape
    assert buffer_call.arguments == {
        "group": inputs.ep_group,
        "num_experts": s.num_experts,
        "num_max_tokens_per_rank": s.max_tokens_per_rank,
        "num_topk": s.top_k,
        "hidden": s.hidden,
        "intermediate_hidden": s.intermediate,
        "num_shared_experts": 1 if shared else 0,
        "mma_type": "fp8xfp4",
        "activation": "swiglu",
    }
    (kernel,) = rec.named("fp8_fp4_mega_moe")
    a = kernel.arguments
    assert a["y"] is outputs.y and a["l1_weights"] is inputs.l1_weights and a["l2_weights"] is inputs.l2_weights
    assert a["sym_buffer"].mma_type == "fp8xfp4"
    shared_kwargs = (
        {"shared_l1_weights": inputs.shared_l1_weights, "shared_l2_weights": inputs.shared_l2_weights} if shared else {}
    )
    assert {k: v for k, v in a.items() if k not in ("y", "l1_weights", "l2_weights", "sym_buffer")} == {
        **shared_kwargs,
        "activation": "swiglu",
        "activation_clamp": 10.0,
        "fast_math": True,
        "recipe": (1, 1, 32),
    }
    assert sms == ["enter"]  # buffer, pre-dispatch and kernel inside one SM reservation
    block_m = rec.named("get_block_m_for_mega_moe")
    if shared:
        (bm,) = block_m
        assert bm.arguments == {
            "num_ranks": 1,
            "num_experts": s.num_experts,
            "num_max_tokens_per_rank": s.max_tokens_per_rank,
            "num_tokens": inputs.num_tokens,
            "num_topk": s.top_k,
            "mma_type": "fp8xfp4",
        }
    else:
        assert block_m == []
    _assert_buffer(rec.snapshots["buffer"], _expected_buffer(problem, "fp8xfp4", 2.5, 64 if shared else 0))
    assert (rec.snapshots["buffer"]["topk_weights"][: inputs.num_tokens] == problem.inputs.topk_weights * 2.5).all()


def test_w4a4_uses_mxf4_buffer_and_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    problem = make_problem("mxf4xmxf4", rsf=1.5, seed=22)
    _inputs, _outputs, _ = _run(mdg.MegaW4A4Plugin(API_MMA_TYPE), problem, Platform.cuda(10, 0))
    (buffer_call,) = rec.named("get_symm_buffer_for_mega_moe")
    assert buffer_call.arguments["mma_type"] == "mxf4xmxf4" and buffer_call.arguments["num_shared_experts"] == 0
    (kernel,) = rec.named("fp8_fp4_mega_moe")
    assert kernel.arguments["recipe"] == (1, 1, 32) and kernel.arguments["sym_buffer"].mma_type == "mxf4xmxf4"
    assert "shared_l1_weights" not in kernel.arguments
    _assert_buffer(rec.snapshots["buffer"], _expected_buffer(problem, "mxf4xmxf4", 1.5))


def test_w4a4_host_pre_dispatch_is_deep_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    problem = make_problem("mxf4xmxf4", rsf=1.5, seed=23)
    inputs, _, _ = _run(mdg.MegaW4A4Plugin(API_MMA_TYPE), problem, Platform.cuda(10, 0), pre_dispatch="host")
    (pd,) = rec.named("mega_moe_pre_dispatch")
    buf = rec.named("fp8_fp4_mega_moe")[0].arguments["sym_buffer"]
    a = pd.arguments
    x, ids, w = a["x"], a["topk_idx"], a["topk_weights"]
    bx, bsf, bidx, bw = a["buf_x"], a["buf_x_sf"], a["buf_topk_idx"], a["buf_topk_weights"]
    assert x is inputs.hidden_states and (bx, bsf, bidx, bw) == (buf.x, buf.x_sf, buf.topk_idx, buf.topk_weights)
    assert ids.dtype == torch.int32 and torch.equal(ids, inputs.topk_ids.int())
    assert w.dtype == torch.float32 and torch.equal(w, inputs.topk_weights.float() * 1.5)  # the host scales first
    assert {k: a[k] for k in ("num_tokens", "group_size", "mma_type")} == {
        "num_tokens": inputs.num_tokens,
        "group_size": 32,
        "mma_type": "mxf4xmxf4",
    }
    assert set(a) == {
        "x",
        "topk_idx",
        "topk_weights",
        "buf_x",
        "buf_x_sf",
        "buf_topk_idx",
        "buf_topk_weights",
        "num_tokens",
        "group_size",
        "mma_type",
    }


@pytest.mark.parametrize("pre_dispatch", ["torch", "host"])
def test_sm90_calls_fp8_mega_moe(monkeypatch: pytest.MonkeyPatch, pre_dispatch: str) -> None:
    rec = Recorder(monkeypatch, sm90=True)
    problem = make_problem("sm90_fp8", rsf=2.5, seed=24)
    inputs, outputs, _ = _run(
        mdg.MegaSm90Fp8Plugin(API_MMA_TYPE), problem, Platform.cuda(9, 0), pre_dispatch=pre_dispatch
    )
    (buffer_call,) = rec.named("get_symm_buffer_for_mega_moe")
    # SGLang passes _mega_moe_mma_type(experts) == 'fp8xfp4'; DeepGEMM routes to its SM90 buffer on sm90
    assert {k: buffer_call.arguments[k] for k in ("num_shared_experts", "mma_type", "activation")} == {
        "num_shared_experts": 0,
        "mma_type": "fp8xfp4",
        "activation": "swiglu",
    }
    (kernel,) = rec.named("fp8_mega_moe")
    a = kernel.arguments
    assert a["y"] is outputs.y and a["l1_weights"] is inputs.l1_weights and a["l2_weights"] is inputs.l2_weights
    assert {k: v for k, v in a.items() if k not in ("y", "l1_weights", "l2_weights", "sym_buffer")} == {
        "recipe": (128, 128, 128),
        "activation": "swiglu",
        "activation_clamp": 10.0,
        "fast_math": True,
    }
    assert rec.named("fp8_fp4_mega_moe") == []
    if pre_dispatch == "host":
        (pd,) = rec.named("mega_moe_pre_dispatch_sm90")
        a = pd.arguments
        assert a["topk_weights"].dtype == torch.float32 and torch.equal(
            a["topk_weights"], inputs.topk_weights.float()
        )  # scaled inside
        assert {k: a[k] for k in ("num_tokens", "group_size", "routed_scaling_factor")} == {
            "num_tokens": inputs.num_tokens,
            "group_size": 128,
            "routed_scaling_factor": 2.5,
        }
    else:
        _assert_buffer(rec.snapshots["buffer"], _expected_buffer(problem, "sm90_fp8", 2.5))


def test_zero_tokens_still_runs_the_collective_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    problem = make_problem("fp8xfp4", tokens=0, seed=25)
    problem = dataclasses.replace(problem, inputs=dataclasses.replace(problem.inputs, topk_ids=None, topk_weights=None))
    _, outputs, _ = _run(mdg.MegaW4A8Plugin(API_MMA_TYPE), problem, Platform.cuda(10, 0))
    assert outputs.y.shape == (1, problem.shape.hidden)
    (_kernel,) = rec.named("fp8_fp4_mega_moe")
    assert (rec.snapshots["buffer"]["topk_idx"] == -1).all() and (rec.snapshots["buffer"]["topk_weights"] == 0).all()


def test_host_buffer_hook_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def host_buffer(group, *args, **kwargs):
        seen.append((group, args, kwargs))
        buf = _fake_buffer(*args, mma_type=kwargs["mma_type"])
        buf.group = group
        return buf

    rec = Recorder(monkeypatch, host_buffer=host_buffer, host_context=lambda dg: contextlib.nullcontext())
    problem = make_problem("fp8xfp4", seed=26)
    _run(mdg.MegaW4A8Plugin(API_MMA_TYPE), problem, Platform.cuda(10, 0))
    assert rec.named("get_symm_buffer_for_mega_moe") == []
    (_group, args, kwargs) = seen[0]
    s = problem.shape
    assert args == (s.num_experts, s.max_tokens_per_rank, s.top_k, s.hidden, s.intermediate)
    assert kwargs == {"num_shared_experts": 0, "mma_type": "fp8xfp4", "activation": "swiglu"}


def test_buffers_are_cached_per_layer_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    plugin = mdg.MegaW4A8Plugin(API_MMA_TYPE)
    group = FakeGroup()
    for seed in (27, 28):
        problem = make_problem("fp8xfp4", seed=seed)
        problem = dataclasses.replace(problem, inputs=dataclasses.replace(problem.inputs, ep_group=group))
        plugin.options = {"pre_dispatch": "torch"}
        config = dataclasses.replace(problem.config, platform=Platform.cuda(10, 0))
        inputs = problem.inputs
        plugin.run(
            inputs,
            mm.allocate_outputs(problem.shape, config, inputs.device, num_tokens=inputs.num_tokens),
            problem.shape,
            config,
        )
    assert len(rec.named("get_symm_buffer_for_mega_moe")) == 1 and len(rec.named("fp8_fp4_mega_moe")) == 2


def test_a_release_without_shared_experts_gets_no_shared_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """sgl-deep-gemm 0.1.5.post1 (API_LEGACY): no num_shared_experts, no shared weights (its signatures lack them)."""
    from _mega_cases import API_LEGACY

    rec = Recorder(monkeypatch)
    problem = make_problem("fp8xfp4", seed=29)
    _run(mdg.MegaW4A8Plugin(API_LEGACY), problem, Platform.cuda(10, 0))
    (buffer_call,) = rec.named("get_symm_buffer_for_mega_moe")
    assert {k: v for k, v in buffer_call.arguments.items() if k not in ("group",)} == {
        "num_experts": problem.shape.num_experts,
        "num_max_tokens_per_rank": problem.shape.max_tokens_per_rank,
        "num_topk": problem.shape.top_k,
        "hidden": problem.shape.hidden,
        "intermediate_hidden": problem.shape.intermediate,
        "mma_type": "fp8xfp4",
        "activation": "swiglu",
    }
    (kernel,) = rec.named("fp8_fp4_mega_moe")
    assert set(kernel.arguments) == set(API_LEGACY.params("fp8_fp4_mega_moe")) - {"cumulative_local_expert_recv_stats"}


def test_the_launch_is_prepared_once_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    plugin = mdg.MegaSm90Fp8Plugin(API_MMA_TYPE)
    plugin.options = {"pre_dispatch": "torch"}
    prepared = []
    from sglang_moe_plugins.plugins.deep_gemm import launch as launch_module

    real = launch_module.build_launch
    monkeypatch.setattr(launch_module, "build_launch", lambda *a: prepared.append(a[3]) or real(*a))
    group = FakeGroup()
    for seed, tokens in ((31, 5), (32, 9), (33, 0)):
        problem = make_problem("sm90_fp8", seed=seed, tokens=tokens)
        config = dataclasses.replace(problem.config, platform=Platform.cuda(9, 0))
        inputs = dataclasses.replace(problem.inputs, ep_group=group)
        plugin.run(
            inputs, mm.allocate_outputs(problem.shape, config, inputs.device, num_tokens=tokens), problem.shape, config
        )
    assert len(prepared) == 1  # the token count is not part of the key
    assert len(rec.named("get_symm_buffer_for_mega_moe")) == 1 and len(rec.named("fp8_mega_moe")) == 3
    # run, a bound op and any caller of prepare share the one closure of the key
    assert plugin.prepare(problem.shape, config) is plugin.prepare(problem.shape, config)
    assert len(prepared) == 1
    plugin.options = {"pre_dispatch": "host"}
    assert plugin.prepare(problem.shape, config) is not plugin._prepared[(problem.shape, config, "torch")]
    assert len(prepared) == 2


def test_run_errors_name_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    Recorder(monkeypatch)
    problem = make_problem("fp8xfp4", seed=30)
    plugin = mdg.MegaW4A8Plugin(API_MMA_TYPE)
    plugin.options = {"pre_dispatch": "torch"}
    config = dataclasses.replace(problem.config, platform=Platform.cuda(10, 0))
    outputs = mm.allocate_outputs(problem.shape, config, torch.device("cpu"), num_tokens=problem.inputs.num_tokens)
    with pytest.raises(KernelNotAvailableError, match="expert-parallel process group"):
        plugin.run(problem.inputs, outputs, problem.shape, config)
    small = dataclasses.replace(problem.shape, max_tokens_per_rank=4)
    with pytest.raises(InvalidArgumentError, match="max_tokens_per_rank=4") as err:
        plugin.run(dataclasses.replace(problem.inputs, ep_group=FakeGroup()), outputs, small, config)
    assert err.value.plugin == "mega_w4a8" and err.value.argument == "hidden_states.shape[0]"


@pytest.mark.parametrize("cls,variant", [(mdg.MegaW4A4Plugin, "mxf4xmxf4"), (mdg.MegaW4A8Plugin, "fp8xfp4")])
def test_auto_pre_dispatch_on_sm100_is_the_hosts(monkeypatch: pytest.MonkeyPatch, cls, variant: str) -> None:
    """Our Triton pre-dispatch has no recorded SM100 run: there ``auto`` runs the host's own, even with triton importable."""
    monkeypatch.setattr(mdg, "triton_available", lambda: True)
    rec = Recorder(monkeypatch)
    jit = []
    if variant == "fp8xfp4":  # SGLang's JIT kernel: recorded, not run (no CUDA here)
        import sglang.kernels.ops.moe.dsv4 as dsv4

        monkeypatch.setattr(dsv4, "mega_moe_pre_dispatch", lambda *a, **k: jit.append(k))
    problem = make_problem(variant, seed=24)
    _run(cls(API_MMA_TYPE), problem, Platform.cuda(10, 0), pre_dispatch="auto")
    assert len(rec.named("mega_moe_pre_dispatch")) + len(jit) == 1
