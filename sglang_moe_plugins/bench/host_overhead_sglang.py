"""What the host-overhead benchmark (:mod:`.host_overhead`) takes from SGLang for its GPU section:
SGLang 0.5.23's DSV4 branch of ``_varlen_deep_gemm_silu_mul_quant``, line by line, over its JIT kernel
(:func:`sglang_dsv4_branch`), and that kernel built from the wheel's JIT sources (:func:`_sglang_jit`).
Public through :mod:`.host_overhead`."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["sglang_dsv4_branch"]


def sglang_dsv4_branch(dsv4_wrapper: Callable[..., None], ue8m0: bool):
    """SGLang 0.5.23's ``_varlen_deep_gemm_silu_mul_quant`` for calls that take its DSV4 branch, line by line
    (deep_gemm.py 1550-1645), over ``dsv4_wrapper`` (SGLang's ``silu_and_mul_masked_post_quant`` as
    :mod:`.sglang_kernels` builds it). Also the stand-in ``original`` for our hook."""

    def original(
        gateup_output,
        masked_m,
        group_size,
        topk,
        swiglu_limit=None,
        swizzle=False,
        gemm1_alpha=None,
        gemm1_clamp_limit=None,
        num_real_tokens=None,
        silu_mul_keep_fp32=False,
    ):
        if masked_m is None:  # SGLang's own asserts, kept as raises (an assert vanishes under python -O)
            raise AssertionError("masked_m is required")
        hidden_states_device = gateup_output.device
        E, N, D_2 = gateup_output.shape
        D = D_2 // 2
        del D_2
        G = D // group_size
        if silu_mul_keep_fp32 and gemm1_alpha is not None:
            raise ValueError("silu_mul_keep_fp32 does not support gemm1_alpha")
        if gemm1_alpha is not None:
            raise NotImplementedError("gpt-oss branch not built for the benchmark")
        if swiglu_limit is not None or swizzle or silu_mul_keep_fp32:
            if not (N % 4 == 0 and G % 4 == 0 and D // 8 >= E):
                raise AssertionError(
                    f"DSV4 JIT activation requires N % 4 == 0, G % 4 == 0 and D // 8 >= num_experts, "
                    f"got N={N} G={G} D={D} E={E}"
                )
            packed_ue8m0 = ue8m0
            down_input = torch.empty((E, N, D), device=hidden_states_device, dtype=torch.float8_e4m3fn)
            down_input_scale = torch.empty(
                (E, G // 4, N) if packed_ue8m0 else (E, N, G),
                device=hidden_states_device,
                dtype=torch.int32 if packed_ue8m0 else torch.float32,
            )
            dsv4_wrapper(
                gateup_output,
                down_input,
                down_input_scale,
                group_size,
                masked_m,
                scale_ue8m0=packed_ue8m0,
                topk=topk,
                transposed=packed_ue8m0,
                swiglu_limit=swiglu_limit,
                swizzle=swizzle,
            )
            if packed_ue8m0:
                down_input_scale = down_input_scale.transpose(-1, -2)
            return down_input, down_input_scale
        raise NotImplementedError("the default per_token_group_quant branch is not built for the benchmark")

    return original


def _sglang_jit(jit_root: pathlib.Path, prebuilt: pathlib.Path) -> tuple[Any, str]:
    try:
        import tvm_ffi  # noqa: F401

        from .sglang_kernels import SglangJit
    except ImportError as exc:
        return None, f"apache-tvm-ffi is not importable ({exc})"
    if not (jit_root / "include").is_dir():
        return None, f"no sglang JIT sources under {jit_root}"
    return SglangJit(jit_root, prebuilt_root=prebuilt if prebuilt.is_dir() else None), ""
