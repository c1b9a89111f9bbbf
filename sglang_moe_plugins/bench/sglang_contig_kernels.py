"""SGLang 0.5.23's kernels of the contiguous (compact) activation step, built from the wheel's JIT sources.

For a GPU machine without SGLang installed (the benchmark machine). Reuses
:class:`sglang_moe_plugins.bench.sglang_kernels.SglangJit` (same compiler flags, PDL setting, build and
prebuilt directories) and adds the kernels ``DeepGemmRunnerCore._run_contiguous_gemm`` calls:

- ``SiluAndMulContigPostQuantKernel<group, ue8m0, swizzle, pdl, limit>::run``
  (``deepseek_v4/silu_and_mul_masked_post_quant.cuh``): the fused branch;
- ``SiluAndMulClampKernel<bf16, pdl>::run`` (same file): the two-kernel branch with ``swiglu_limit``;
- ``ActivationKernel<bf16, pdl>::run_activation`` (``elementwise/activation.cuh``, ``"silu"``): the
  two-kernel branch without it (``_legacy_silu_and_mul``);
- the flat ``PerTokenGroupQuantFlatKernel`` (through ``SglangJit.per_token_group_quant``): the quantizer
  of the two-kernel branch.

:class:`SglangContigJit` exposes them with the signatures of SGLang's Python wrappers
(``silu_and_mul_contig_post_quant``, ``silu_and_mul_clamp``, ``silu_and_mul`` and
``sglang_per_token_group_quant_fp8``, the last producing the same output layouts as SGLang's
``create_per_token_group_quant_fp8_output_scale``). :meth:`SglangContigJit.contig_host_kernels` bundles
them as the ``ContigHostKernels`` of ``sglang_moe_plugins.plugins.contig.sglang_host``.

API (kept stable; other modules build on it): :class:`SglangContigJit`, :func:`build_contig_kernels`,
:func:`contig_spec`, :data:`ContigSpec`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from sglang_moe_plugins.bench.sglang_kernels import SglangJit, _cpp

__all__ = ["ContigSpec", "SglangContigJit", "build_contig_kernels", "contig_spec", "output_scale", "FUSED_GROUPS"]

#: (group_size, scale_ue8m0, swizzle, use_pdl, apply_swiglu_limit) -- SGLang's make_cpp_args order
ContigSpec = tuple[int, bool, bool, bool, bool]
#: ``SiluAndMulContigPostQuantKernel``'s group sizes in 0.5.23 (``static_assert(kGroupSize == 32 || == 128)``).
FUSED_GROUPS = (32, 128)
_FUSED_CUH = "deepseek_v4/silu_and_mul_masked_post_quant.cuh"


def contig_spec(
    quant_group_size: int, scale_ue8m0: bool, swizzle: bool, swiglu_limit: float | None, use_pdl: bool = True
) -> ContigSpec:
    """The fused contig kernel's template arguments for one call of SGLang's wrapper."""
    return (int(quant_group_size), bool(scale_ue8m0), bool(swizzle), bool(use_pdl), swiglu_limit is not None)


class SglangContigJit(SglangJit):
    """:class:`SglangJit` plus the contiguous step's kernels (lazily built per template, thread-safe)."""

    # ---- sources (tag, cuh, export, kernel)
    def contig_source(self, spec: ContigSpec) -> tuple[str, str, str, str]:
        args = ", ".join(_cpp(a) for a in spec)
        return (
            "contig_" + "_".join(_cpp(a) for a in spec),
            _FUSED_CUH,
            "run",
            f"SiluAndMulContigPostQuantKernel<{args}>::run",
        )

    def clamp_source(self, dtype: torch.dtype = torch.bfloat16) -> tuple[str, str, str, str]:
        args = f"{_cpp(dtype)}, {_cpp(self.use_pdl)}"
        return ("clamp_" + args.replace(", ", "_"), _FUSED_CUH, "run", f"SiluAndMulClampKernel<{args}>::run")

    def activation_source(self, dtype: torch.dtype = torch.bfloat16) -> tuple[str, str, str, str]:
        args = f"{_cpp(dtype)}, {_cpp(self.use_pdl)}"
        return (
            "activation_" + args.replace(", ", "_"),
            "elementwise/activation.cuh",
            "run_activation",
            f"ActivationKernel<{args}>::run_activation",
        )

    # ---- modules
    def contig_module(self, spec: ContigSpec):
        return self._get(("contig", spec), *self.contig_source(spec))

    def clamp_module(self, dtype: torch.dtype = torch.bfloat16):
        return self._get(("clamp", dtype), *self.clamp_source(dtype))

    def activation_module(self, dtype: torch.dtype = torch.bfloat16):
        return self._get(("activation", dtype), *self.activation_source(dtype))

    def contig_sources(
        self, contig: Iterable[ContigSpec] = (), two_kernel: bool = True
    ) -> list[tuple[str, str, str, str]]:
        """Sources of the given fused specs, plus the clamp and activation kernels when ``two_kernel``."""
        sources = [self.contig_source(s) for s in contig]
        if two_kernel:
            sources += [self.clamp_source(), self.activation_source()]
        return sources

    def prebuild_contig(
        self, contig: Iterable[ContigSpec] = (), ptgq: Iterable[Any] = (), two_kernel: bool = True, workers: int = 16
    ) -> None:
        """Build the fused specs, the clamp/activation kernels and the given quantizer specs in parallel."""
        import concurrent.futures

        jobs: list[tuple[Any, Any]] = [(self.contig_module, s) for s in contig]
        if two_kernel:
            jobs += [(self.clamp_module, torch.bfloat16), (self.activation_module, torch.bfloat16)]
        jobs += [(self.ptgq_module, s) for s in ptgq]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for future in [pool.submit(fn, arg) for fn, arg in jobs]:
                future.result()

    # ---- SGLang's Python wrappers, same signatures
    def silu_and_mul_contig_post_quant(
        self,
        input: torch.Tensor,
        output: torch.Tensor,
        output_scale: torch.Tensor,
        quant_group_size: int,
        scale_ue8m0: bool = False,
        transposed: bool = False,
        swiglu_limit: float | None = None,
        swizzle: bool = False,
    ) -> None:
        import tvm_ffi

        apply_limit = swiglu_limit is not None
        module = self.contig_module(contig_spec(quant_group_size, scale_ue8m0, swizzle, swiglu_limit, self.use_pdl))
        with tvm_ffi.use_torch_stream():
            module.run(input, output, output_scale, bool(transposed), float(swiglu_limit) if apply_limit else 0.0)  # type: ignore[arg-type]  # apply_limit: not None

    def silu_and_mul_clamp(self, input: torch.Tensor, output: torch.Tensor, swiglu_limit: float) -> None:
        import tvm_ffi

        module = self.clamp_module(input.dtype)
        with tvm_ffi.use_torch_stream():
            module.run(input, output, float(swiglu_limit))

    def silu_and_mul(self, input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        import tvm_ffi

        hidden = input.shape[-1] // 2
        if out is None:
            out = input.new_empty(*input.shape[:-1], hidden)
        module = self.activation_module(input.dtype)
        with tvm_ffi.use_torch_stream():
            module.run_activation(input.view(-1, hidden * 2), out.view(-1, hidden), "silu")
        return out

    def per_token_group_quant_fp8(
        self,
        x: torch.Tensor,
        group_size: int,
        eps: float = 1e-10,
        column_major_scales: bool = False,
        scale_tma_aligned: bool = False,
        scale_ue8m0: bool = False,
        fuse_silu_and_mul: bool = False,
        masked_m: torch.Tensor | None = None,
        *,
        output_q: torch.Tensor | None = None,
        output_s: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``sglang_per_token_group_quant_fp8`` over the JIT ``per_token_group_quant`` kernel (the CUDA
        path of 0.5.23). Not built: the whole-row per-token branch and the fp32 row-major UE8M0 flavour
        (SGLang routes both to other kernels); they raise NotImplementedError."""
        if x.shape[-1] % group_size != 0:
            raise ValueError(f"x.shape[-1]={x.shape[-1]} is not a multiple of group_size={group_size}")
        if not x.is_contiguous():
            raise ValueError("`x` is not contiguous")
        if eps != 1e-10:
            raise ValueError(f"per_token_group_quant bakes the absmax floor in at 1e-10, got eps={eps}")
        if group_size == x.shape[-1] and x.dim() == 2 and not (column_major_scales or scale_ue8m0 or fuse_silu_and_mul):
            raise NotImplementedError("the whole-row (per-token) branch is not built here")
        out_shape = (*x.shape[:-1], x.shape[-1] // (2 if fuse_silu_and_mul else 1))
        x_q = output_q if output_q is not None else torch.empty(out_shape, device=x.device, dtype=torch.float8_e4m3fn)
        x_s = (
            output_s
            if output_s is not None
            else output_scale(out_shape, x.device, group_size, column_major_scales, scale_tma_aligned, scale_ue8m0)
        )
        if scale_ue8m0 and x_s.dtype == torch.float32:
            raise NotImplementedError(
                "the fp32 row-major UE8M0 flavour (per_token_group_quant_8bit_v2) is not built here"
            )
        if x.shape[0] > 0:
            self.per_token_group_quant(
                x, x_q, x_s, group_size, scale_ue8m0=scale_ue8m0, fuse_silu_and_mul=fuse_silu_and_mul, masked_m=masked_m
            )
        return x_q, x_s

    def contig_host_kernels(self) -> Any:
        """The four callables as ``sglang_moe_plugins.plugins.contig.sglang_host.ContigHostKernels``."""
        from sglang_moe_plugins.plugins.contig.sglang_host import ContigHostKernels

        return ContigHostKernels(
            self.silu_and_mul_contig_post_quant,
            self.silu_and_mul_clamp,
            self.silu_and_mul,
            self.per_token_group_quant_fp8,
            source=f"sglang 0.5.23 JIT sources built with tvm-ffi ({self.root})",
            fused_groups=FUSED_GROUPS,
        )


def output_scale(
    x_shape: tuple[int, ...],
    device: torch.device,
    group_size: int,
    column_major_scales: bool,
    scale_tma_aligned: bool,
    scale_ue8m0: bool,
) -> torch.Tensor:
    """SGLang 0.5.23's ``create_per_token_group_quant_fp8_output_scale`` (same shapes, strides, dtypes)."""
    groups = x_shape[-1] // group_size
    if scale_ue8m0:
        if column_major_scales and scale_tma_aligned:
            *batch, rows, _ = x_shape
            aligned_mn, aligned_k = (rows + 3) // 4 * 4, (groups + 3) // 4 * 4
            return torch.empty((*batch, aligned_k // 4, aligned_mn), device=device, dtype=torch.int32).transpose(
                -1, -2
            )[..., :rows, :]
        if column_major_scales:
            raise ValueError("column_major_scales requires scale_tma_aligned=True when scale_ue8m0 is enabled")
        return torch.empty((*x_shape[:-1], groups), device=device, dtype=torch.float32)
    if column_major_scales:
        if scale_tma_aligned:
            aligned = (x_shape[-2] + 3) // 4 * 4
            return torch.empty((*x_shape[:-2], groups, aligned), device=device, dtype=torch.float32).transpose(-1, -2)[
                ..., : x_shape[-2], :
            ]
        return torch.empty((groups, *x_shape[:-1]), device=device, dtype=torch.float32).permute(-1, -2)
    return torch.empty((*x_shape[:-1], groups), device=device, dtype=torch.float32)


def build_contig_kernels(jit_root: str | os.PathLike, **kwargs: Any) -> SglangContigJit:
    """A :class:`SglangContigJit` over the wheel's JIT sources under ``jit_root`` (kwargs as SglangJit's)."""
    return SglangContigJit(jit_root, **kwargs)
