"""SGLang's real compact runner (``DeepGemmRunnerCore._run_contiguous_gemm``) on a CPU, for the tests of op
``silu_mul_quant_contig``.

Only what has no CPU implementation is replaced, and never a hooked function: DeepGEMM's grouped contiguous
GEMM (a torch GEMM on the dequantized operands that records what it was given), SGLang's symmetric-memory
allocation context and its parallel state. The runner, its branches and buffers, and the two hooked
functions are SGLang's own, after its real ``load_plugins()``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from sglang_session import loaded_sglang

__all__ = ["Layer", "GemmRecorder", "compact_runner", "make_layer", "run_layer"]


@dataclass
class GemmRecorder:
    """Stands in for ``deep_gemm_wrapper.grouped_gemm_nt_f8f8bf16_contig`` on a CPU: out = dequant(a) @ dequant(b)^T
    per row's expert (``m_indices``; -1 rows are left untouched), and keeps each call's operands."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(
        self, lhs: Any, rhs: Any, out: torch.Tensor, m_indices: torch.Tensor, recipe_a: Any = None, recipe_b: Any = None
    ) -> None:
        a, a_scale = lhs
        b, b_scale = rhs
        self.calls.append({"a": a, "a_scale": a_scale, "out": out, "m_indices": m_indices.clone()})
        rows, k = a.shape
        if rows == 0:
            return
        groups = a_scale.shape[-1]
        if a_scale.dtype == torch.int32:  # UE8M0 packed
            from sglang_moe_plugins.quant import ue8m0_from_exponent, unpack_ue8m0_bytes

            scales = ue8m0_from_exponent(unpack_ue8m0_bytes(a_scale.contiguous(), k // 128))
        else:
            scales = a_scale.float()
            if groups != k // 128:
                scales = scales[:, : k // 128]
        a32 = (a.float().reshape(rows, -1, 128) * scales.unsqueeze(-1)).reshape(rows, k)
        bs = b_scale.float().repeat_interleave(128, 1).repeat_interleave(128, 2)[:, : b.shape[1], : b.shape[2]]
        b32 = b.float() * bs
        for row in range(rows):
            expert = int(m_indices[row])
            if expert >= 0:
                out[row] = (a32[row] @ b32[expert].T).to(out.dtype)


@dataclass
class Layer:
    runner: Any
    quant_info: Any
    hidden_states: torch.Tensor
    hidden_states_scale: torch.Tensor
    m_indices: torch.Tensor


def make_layer(
    *,
    experts: int = 4,
    hidden: int = 256,
    inter: int = 256,
    rows: int = 16,
    swiglu_limit: float | None = None,
    activation: str = "silu",
    keep_fp32: bool = False,
    seed: int = 0,
) -> Layer:
    """A layer of ``experts`` local experts (fp8 block-128 weights) and ``rows`` compact rows (the last expert's
    rows partly padding: ``m_indices == -1``)."""
    dg = loaded_sglang()
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig

    g = torch.Generator().manual_seed(seed)
    config = MoeRunnerConfig(
        num_experts=experts,
        num_local_experts=experts,
        hidden_size=hidden,
        intermediate_size_per_partition=inter,
        top_k=2,
        activation=activation,
        swiglu_limit=swiglu_limit,
        **({"silu_mul_keep_fp32": keep_fp32} if "silu_mul_keep_fp32" in MoeRunnerConfig.__dataclass_fields__ else {}),
        gemm1_alpha=1.0 if activation == "situ" else None,
        gemm1_clamp_limit=7.0 if activation == "situ" else None,
    )
    runner = dg.DeepGemmRunnerCore(config)

    def fp8(*size: int) -> torch.Tensor:
        return (torch.rand(size, generator=g) * 2 - 1).mul(0.5).to(torch.float8_e4m3fn)

    def scales(*size: int) -> torch.Tensor:
        return torch.rand(size, generator=g) * 0.02 + 0.01

    w13 = fp8(experts, 2 * inter, hidden)
    w2 = fp8(experts, hidden, inter)
    quant_info = dg.DeepGemmMoeQuantInfo(
        w13_weight=w13,
        w2_weight=w2,
        use_fp8=True,
        w13_scale=scales(experts, 2 * inter // 128, hidden // 128),
        w2_scale=scales(experts, hidden // 128, inter // 128),
        block_shape=[128, 128],
    )
    hidden_states = fp8(rows, hidden)
    m_indices = torch.arange(rows, dtype=torch.int32) * experts // rows
    if rows >= 8:
        m_indices[-(rows // 8) :] = -1
    return Layer(runner, quant_info, hidden_states, scales(rows, hidden // 128), m_indices)


def run_layer(layer: Layer) -> torch.Tensor:
    """SGLang's (hooked) ``_run_contiguous_gemm`` on ``layer``."""
    dg = loaded_sglang()
    runner_input = dg.DeepGemmRunnerInput(
        hidden_states=layer.hidden_states.clone(),
        hidden_states_scale=layer.hidden_states_scale.clone(),
        use_masked_gemm=False,
        m_indices=layer.m_indices,
    )
    state = {
        "all_tokens": layer.hidden_states.shape[0],
        "hidden_states_device": torch.device("cpu"),
        "hidden_states_dtype": torch.bfloat16,
        "hidden_states_shape": tuple(layer.hidden_states.shape),
    }
    return layer.runner._run_contiguous_gemm(runner_input, layer.quant_info, state)


@pytest.fixture
def compact_runner(monkeypatch: pytest.MonkeyPatch) -> GemmRecorder:
    """SGLang's runner module with the CPU stand-ins of this module installed; yields the GEMM recorder."""
    dg = loaded_sglang()
    from sglang.srt.layers import deep_gemm_wrapper

    from sglang_moe_plugins.integrations.sglang.silu_mul_quant import refresh_host_state

    recorder = GemmRecorder()
    monkeypatch.setattr(deep_gemm_wrapper, "grouped_gemm_nt_f8f8bf16_contig", recorder)
    monkeypatch.setattr(deep_gemm_wrapper, "DEEPGEMM_NEED_TMA_ALIGNED_SCALES", False)
    monkeypatch.setattr(deep_gemm_wrapper, "DEEPGEMM_SCALE_UE8M0", False)
    monkeypatch.setattr(dg, "use_symmetric_memory", lambda *a, **k: contextlib.nullcontext())
    if hasattr(dg, "get_parallel"):  # 0.5.21+
        monkeypatch.setattr(dg, "get_parallel", lambda: SimpleNamespace(tp_group=None))
    if hasattr(dg, "get_tp_group"):  # 0.5.20
        monkeypatch.setattr(dg, "get_tp_group", lambda: None)
    monkeypatch.setattr(dg, "is_allocation_symmetric", lambda: False)
    from sglang_moe_plugins import UserConfig, api

    api.reload(UserConfig(allow=frozenset()))  # the built-in plugins only (an installed example plugin stays out)
    refresh_host_state()
    yield recorder
    refresh_host_state()
