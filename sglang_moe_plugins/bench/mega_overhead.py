"""Eager host time of one SM90 MegaMoE call (``benchmarks/mega_call_overhead.py``): DeepGEMM's calls made
directly against the same calls through ``mega_sm90_fp8``'s prepared launch, the bound op and the real hook;
and, on CPU, the hook layer alone with a do-nothing ``mega_moe`` plugin forced."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import torch

from .. import api
from ..core.dispatcher import Selector
from ..core.registry import Registry
from ..integrations.sglang import mega_moe as ma, mega_moe_hook
from ..ops import mega_moe as mm
from ..plugins.deep_gemm.plugin import MegaSm90Fp8Plugin
from ..testing.ops.mega_moe_cases import make_problem
from .dist_info import temporary_site

__all__ = ["NOOP_MODULE", "Experts", "eager_us", "cpu_time", "hook_kwargs", "cpu_hook_layer", "gpu_call_overhead"]


def eager_us(fn: Callable[[], Any], calls: int = 1000, rounds: int = 5) -> float:
    """Median over ``rounds`` of the per-call host time (us) of ``calls`` calls, synchronized once per round."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


NOOP_MODULE = '''
"""A do-nothing mega_moe plugin for benchmarks/mega_call_overhead.py --cpu (installed for the run only)."""
from sglang_moe_plugins import Plugin, Support


def _nothing(inputs, outputs):
    return None


class NoopMega(Plugin):
    name = "noop_mega"
    op = "mega_moe"
    priority = -100
    description = "does nothing (benchmark of the hook layer): prepare returns the launch"

    def supports(self, shape, config):
        return Support.yes("accepts everything, computes nothing")

    def run(self, inputs, outputs, shape, config):
        return None

    def prepare(self, shape, config):
        return _nothing
'''


class Experts(types.SimpleNamespace):
    """SGLang's experts module as the hook sees it: attributes, weakly referenceable like an nn.Module."""


def cpu_time(fn: Callable[[], Any], calls: int = 20000, rounds: int = 5) -> list[float]:
    """Per-call thread CPU time (us) of ``rounds`` runs of ``calls`` calls."""
    for _ in range(200):
        fn()
    runs = []
    for _ in range(rounds):
        start = time.thread_time_ns()  # CPU time of this thread: a shared, loaded host deschedules it
        for _ in range(calls):
            fn()
        runs.append((time.thread_time_ns() - start) / calls / 1e3)
    return runs


def hook_kwargs(shape: mm.MegaMoEShape, config: mm.MegaMoEConfig, tokens: int) -> dict[str, Any]:
    """The keyword arguments of SGLang's ``run_mega_routed_experts`` for one call."""
    return dict(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        top_k=shape.top_k,
        num_tokens=tokens,
        activation_clamp=config.activation_clamp,
        routed_scaling_factor=config.routed_scaling_factor,
        activation="swiglu",
        num_shared_experts=0,
        shared_l1_weights=None,
        shared_l2_weights=None,
        routing_in_buffer=False,
    )


def cpu_hook_layer(
    experts: int, hidden: int, inter: int, tokens: int, topk: int
) -> tuple[dict[str, Any], Callable[[], torch.Tensor]]:
    """The hook layer on CPU, through SGLang's real load_plugins() and hooked run_mega_routed_experts:
    ``(results, the hooked call)``."""
    for name in list(os.environ):
        if name.startswith("SGLANG_MOE_PLUGINS") or name == "SGLANG_PLUGINS":
            del os.environ[name]
    temporary_site(
        "mega_call_overhead_site_",
        "bench-noop-mega",
        {"bench_noop_mega": NOOP_MODULE},
        {"noop_mega": "bench_noop_mega:NoopMega"},
    )
    from sglang.srt.layers.moe import mega_moe as host
    from sglang.srt.plugins import load_plugins

    from ..config import parse_config

    load_plugins()
    hooked = host.run_mega_routed_experts
    if getattr(hooked, "__wrapped__", None) is None:
        raise SystemExit("run_mega_routed_experts is not hooked after load_plugins()")
    api.reload(parse_config({"force": {mm.OP: "noop_mega"}}))
    ma.reset()
    p = make_problem(
        "sm90_fp8",
        experts=experts,
        hidden=hidden,
        inter=inter,
        tokens=tokens,
        top_k=topk,
        device="cpu",
        seed=1,
        max_tokens_per_rank=max(tokens, 64),
    )
    i, shape, config, t = p.inputs, p.shape, p.config, tokens
    layer = Experts(
        _mega_moe_weights_built=True,
        _mega_moe_nvfp4=False,
        _mega_moe_w4a4=False,
        _mega_moe_sm90_fp8_weights=True,
        num_experts=shape.num_experts,
        moe_ep_size=1,
        mega_l1_weights=i.l1_weights,
        mega_l2_weights=i.l2_weights,
    )
    kwargs = hook_kwargs(shape, config, t)
    ma._settings = ma._Settings(shape.max_tokens_per_rank, False)

    def through() -> torch.Tensor:
        return hooked(layer, i.hidden_states, i.topk_ids, i.topk_weights, **kwargs)

    y = through()
    if len(ma.PLANS) != 1:
        raise SystemExit(f"the layer's MegaMoE plan was not cached ({len(ma.PLANS)} plans)")
    chosen = api.get_selector().explain(mm.OP, shape, config).chosen
    if chosen is None or chosen.name != "noop_mega" or tuple(y.shape) != (t, shape.hidden):
        raise SystemExit(f"the hooked call did not run noop_mega: {chosen}, {tuple(y.shape)}")

    def alloc() -> torch.Tensor:
        return torch.empty((max(t, 1), shape.hidden), dtype=torch.bfloat16)

    rows = {"alloc_us": alloc, "hooked_us": through}
    results: dict[str, Any] = {
        "shape": shape.describe(),
        "tokens": t,
        "device": "cpu",
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    for name, fn in rows.items():
        runs = cpu_time(fn)
        results[name] = round(min(runs), 3)
        results[name.replace("_us", "_runs_us")] = [round(r, 3) for r in runs]
    results["hook_layer_us"] = round(results["hooked_us"] - results["alloc_us"], 3)
    return results, through


def gpu_call_overhead(
    experts: int, hidden: int, inter: int, tokens: int, topk: int, pre_dispatch: str
) -> dict[str, Any]:
    """The GPU comparison on ``cuda:0`` in a process group of one rank (DeepGEMM needed)."""
    torch.cuda.set_device(0)
    torch.distributed.init_process_group(
        "nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1, device_id=torch.device("cuda:0")
    )
    group = torch.distributed.group.WORLD
    import deep_gemm

    p = make_problem(
        "sm90_fp8",
        experts=experts,
        hidden=hidden,
        inter=inter,
        tokens=tokens,
        top_k=topk,
        device="cuda",
        seed=1,
        max_tokens_per_rank=max(tokens, 64),
    )
    inputs = dataclasses.replace(p.inputs, ep_group=group)
    shape, config, t = p.shape, p.config, tokens

    # (a) DeepGEMM directly, as SGLang's run_sm90_mega_routed makes the calls (buffer cached once)
    buf = deep_gemm.get_symm_buffer_for_mega_moe(
        group,
        shape.num_experts,
        shape.max_tokens_per_rank,
        shape.top_k,
        shape.hidden,
        shape.intermediate,
        mma_type="fp8xfp4",
        activation="swiglu",
    )

    def direct() -> torch.Tensor:
        out = torch.empty((max(t, 1), shape.hidden), dtype=torch.bfloat16, device="cuda")
        ids, w = inputs.topk_ids.to(torch.int32), inputs.topk_weights.to(torch.float32)  # type: ignore[union-attr]  # tensors: t > 0
        deep_gemm.mega_moe_pre_dispatch_sm90(
            inputs.hidden_states,
            ids,
            w,
            buf.x,
            buf.x_sf,
            buf.topk_idx,
            buf.topk_weights,
            num_tokens=t,
            group_size=128,
            routed_scaling_factor=config.routed_scaling_factor,
        )
        deep_gemm.fp8_mega_moe(
            out,
            inputs.l1_weights,
            inputs.l2_weights,
            buf,
            recipe=(128, 128, 128),
            activation="swiglu",
            activation_clamp=config.activation_clamp,
            fast_math=True,
        )
        return out

    # (b) the plugin's prepared launch
    plugin = MegaSm90Fp8Plugin()
    plugin.options = {"pre_dispatch": pre_dispatch}  # type: ignore[assignment]  # the plugin's options table
    support = plugin.supports(shape, config)
    if not support:
        raise RuntimeError(f"mega_sm90_fp8 does not take the benchmark's call: {support.reason}")
    launch = plugin.prepare(shape, config)

    def prepared() -> torch.Tensor:
        out = mm.MegaMoEOutputs(torch.empty((max(t, 1), shape.hidden), dtype=torch.bfloat16, device="cuda"))
        launch(inputs, out)
        return out.y

    # (c) the real hook: build_call (planned once per layer), the op bound once per plan, Selector.call
    layer = Experts(
        _mega_moe_weights_built=True,
        _mega_moe_nvfp4=False,
        _mega_moe_w4a4=False,
        _mega_moe_sm90_fp8_weights=True,
        num_experts=shape.num_experts,
        moe_ep_size=1,
        mega_l1_weights=inputs.l1_weights,
        mega_l2_weights=inputs.l2_weights,
    )
    kwargs = hook_kwargs(shape, config, t)
    ma._ep_group = lambda: group  # SGLang's runtime context is absent here
    ma._settings = ma._Settings(shape.max_tokens_per_rank, False)
    api._selector = Selector(Registry.from_plugins([plugin]))  # the hook's api.current_selector()

    def original(*a, **k):  # SGLang's run_mega_routed_experts: must not be reached
        raise RuntimeError("the hook handed a modelled call to SGLang")

    def hooked() -> torch.Tensor:
        return mega_moe_hook(original, layer, inputs.hidden_states, inputs.topk_ids, inputs.topk_weights, **kwargs)

    # (d) the op bound as the hook binds it, called through Selector.call (no adapter)
    bound = api._selector.bind(mm.OP, shape, config)

    def bound_call() -> torch.Tensor:
        return api._selector.call(  # type: ignore[union-attr]  # created by the hooked call above
            bound,
            inputs,
            mm.MegaMoEOutputs(torch.empty((max(t, 1), shape.hidden), dtype=torch.bfloat16, device="cuda")),
        ).y

    want = direct()[:t].clone()
    # the same DeepGEMM calls: y equal to the direct one (up to the kernel's own run-to-run order, if any)
    same = {
        name: (fn()[:t].float() - want.float()).abs().max().item() if t else 0.0
        for name, fn in (("prepared", prepared), ("hooked", hooked))
    }
    torch.cuda.synchronize()
    results: dict[str, Any] = {
        "shape": shape.describe(),
        "tokens": t,
        "pre_dispatch": pre_dispatch,
        "deep_gemm": getattr(deep_gemm, "__version__", "?"),
        "max_abs_diff_to_direct": same,
        "rows_finite": bool(torch.isfinite(want).all()),
        # the hook's bound op must launch the very closure timed as "prepared" (one launcher per buffer)
        "bound_launch_is_prepared_launch": bound.launch is launch,
        "bound_prepared": bound.prepared,
    }
    for name, fn in (("direct", direct), ("prepared", prepared), ("bound", bound_call), ("hooked", hooked)):
        results[f"{name}_us"] = round(eager_us(fn), 2)
    results["prepared_minus_direct_us"] = round(results["prepared_us"] - results["direct_us"], 2)
    results["hooked_minus_direct_us"] = round(results["hooked_us"] - results["direct_us"], 2)
    torch.distributed.destroy_process_group()
    return results
