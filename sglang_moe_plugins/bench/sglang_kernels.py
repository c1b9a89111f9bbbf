"""SGLang 0.5.23's own silu_mul_quant kernels, built from the sglang wheel's JIT sources through tvm-ffi.

For a GPU machine without SGLang installed (the benchmark machine): compiles

- the DSV4 JIT kernel ``SiluAndMulMaskedPostQuantKernel`` (``deepseek_v4/silu_and_mul_masked_post_quant.cuh``)
- the masked / flat fused ``PerTokenGroupQuant*Kernel`` (``gemm/per_token_group_quant.cuh``)

with the template arguments, compiler flags (``-DSGL_CUDA_ARCH=900``, ``sm_90a``, ``-O3``,
``-std=c++20``, ``--expt-relaxed-constexpr``, ``--use_fast_math``) and PDL setting that SGLang's
``load_jit`` uses on an H200, and exposes them as a :class:`sglang_moe_plugins.plugins.sglang_kernels.host.HostKernels`
whose two callables have the Python signatures of SGLang's wrappers
``sglang.kernels.ops.moe.dsv4.silu_and_mul_masked_post_quant`` and
``sglang.kernels.ops.quantization.per_token_group_quant.per_token_group_quant``. Install it with
``sglang_moe_plugins.plugins.sglang_kernels.host.use_host_kernels`` so that the ``jit_ep`` and ``fp8_fallback``
plugins run their own code over these kernels.

Needs ``apache-tvm-ffi`` (0.1.11, the version sglang 0.5.23 pins) and the wheel's
``sglang/kernels/jit/{include,csrc}`` unpacked under ``jit_root``. Modules build lazily, on first
use of a template combination, or ahead of time in parallel with :func:`prebuild`.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import threading
from collections.abc import Iterable

import torch

from sglang_moe_plugins.plugins.sglang_kernels.host import HostKernels

__all__ = ["SglangJit", "build_host_kernels", "DSV4Spec", "PTGQSpec", "dsv4_spec", "ptgq_spec", "plugin_specs"]

_FFI_HEADERS = (
    "#include <tvm/ffi/container/tensor.h>",
    "#include <tvm/ffi/dtype.h>",
    "#include <tvm/ffi/error.h>",
    "#include <tvm/ffi/extra/c_env_api.h>",
    "#include <tvm/ffi/function.h>",
)
_CPP_DTYPE = {
    torch.bfloat16: "bf16_t",
    torch.float16: "fp16_t",
    torch.float32: "fp32_t",
    torch.float8_e4m3fn: "fp8_e4m3_t",
    torch.int8: "int8_t",
}

#: (group_size, scale_ue8m0, swizzle, use_pdl, apply_swiglu_limit) -- SGLang's make_cpp_args order
DSV4Spec = tuple[int, bool, bool, bool, bool]
#: (in_dtype, out_dtype, group_size, ue8m0, row_major, aligned, fuse_silu_and_mul, use_pdl, layout, dense)
PTGQSpec = tuple[torch.dtype, torch.dtype, int, bool, bool, bool, bool, bool, str, bool]


def _cpp(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, torch.dtype):
        return _CPP_DTYPE[value]
    return str(value)


class SglangJit:
    """Lazily built SGLang JIT modules (one per template combination), thread-safe."""

    def __init__(
        self,
        jit_root: str | os.PathLike,
        build_root: str | os.PathLike = "/tmp/sgl_jit_build",
        *,
        arch: str = "9.0a",
        use_pdl: bool = True,
        prebuilt_root: str | os.PathLike | None = None,
    ) -> None:
        self.root = pathlib.Path(jit_root).resolve()
        if not (self.root / "include").is_dir() or not (self.root / "csrc").is_dir():
            raise FileNotFoundError(f"{self.root} must hold the sglang wheel's kernels/jit/include and csrc")
        self.build_root = pathlib.Path(build_root)
        #: Modules built ahead (same layout as build_root: <tag>/sgl_<tag>.so), tried before building.
        self.prebuilt_root = pathlib.Path(prebuilt_root) if prebuilt_root else None
        self.log: list[str] = []
        self.arch = arch
        self.use_pdl = use_pdl
        major, minor = arch.rstrip("af").split(".")
        self.sgl_arch = int(major) * 100 + int(minor) * 10
        self._modules: dict[tuple, object] = {}
        self._lock = threading.Lock()

    # ---- building
    def _build(self, tag: str, cuh: str, export: str, kernel: str):
        import tvm_ffi
        import tvm_ffi.cpp

        if self.prebuilt_root is not None:
            prebuilt = self.prebuilt_root / tag / f"sgl_{tag}.so"
            if prebuilt.is_file():
                try:
                    module = tvm_ffi.load_module(str(prebuilt))
                    self.log.append(f"{tag}: loaded prebuilt {prebuilt}")
                    return module
                except Exception as exc:  # fall back to building here
                    self.log.append(f"{tag}: prebuilt failed to load ({exc}); building")
        lib = self._compile(tag, cuh, export, kernel)
        self.log.append(f"{tag}: built {lib}")
        return tvm_ffi.load_module(lib)

    def _compile(self, tag: str, cuh: str, export: str, kernel: str) -> str:
        """Compile one wrapper into ``build_root/<tag>/sgl_<tag>.so`` (no GPU needed) and return its path."""
        import tvm_ffi.cpp

        os.environ.setdefault("TVM_FFI_CUDA_ARCH_LIST", self.arch)
        out_dir = self.build_root / tag
        out_dir.mkdir(parents=True, exist_ok=True)
        source = out_dir / "wrapper.cu"
        source.write_text(
            "\n".join(
                [
                    *list(_FFI_HEADERS),
                    f'#include "{self.root}/csrc/{cuh}"',
                    "namespace sglang {",
                    f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({export}, ({kernel}));",
                    "}",
                ]
            )
        )
        flags = [f"-DSGL_CUDA_ARCH={self.sgl_arch}", "-std=c++20", "-O3", "--expt-relaxed-constexpr", "--use_fast_math"]
        lib = tvm_ffi.cpp.build(
            f"sgl_{tag}",
            cuda_files=[str(source)],
            extra_cuda_cflags=flags,
            extra_cflags=["-std=c++20", "-O3", f"-DSGL_CUDA_ARCH={self.sgl_arch}"],
            extra_include_paths=[str(self.root / "include")],
            build_directory=str(out_dir),
        )
        return lib

    def _get(self, key: tuple, tag: str, cuh: str, export: str, kernel: str):
        with self._lock:
            module = self._modules.get(key)
        if module is None:
            module = self._build(tag, cuh, export, kernel)
            with self._lock:
                module = self._modules.setdefault(key, module)
        return module

    def dsv4_module(self, spec: DSV4Spec):
        return self._get(("dsv4", spec), *self.dsv4_source(spec))

    def ptgq_module(self, spec: PTGQSpec):
        return self._get(("ptgq", spec), *self.ptgq_source(spec))

    def dsv4_source(self, spec: DSV4Spec) -> tuple[str, str, str, str]:
        args = ", ".join(_cpp(a) for a in spec)
        return (
            "dsv4_" + "_".join(_cpp(a) for a in spec),
            "deepseek_v4/silu_and_mul_masked_post_quant.cuh",
            "run",
            f"SiluAndMulMaskedPostQuantKernel<{args}>::run",
        )

    def ptgq_source(self, spec: PTGQSpec) -> tuple[str, str, str, str]:
        in_dtype, out_dtype, gs, ue8m0, row_major, aligned, fuse, pdl, layout, dense = spec
        trait = [in_dtype, out_dtype, gs, ue8m0, row_major, aligned, fuse, pdl] + ([True] if dense else [])
        args = ", ".join(_cpp(a) for a in trait)
        return (
            "ptgq_" + layout + "_" + "_".join(_cpp(a) for a in trait),
            "gemm/per_token_group_quant.cuh",
            "per_token_group_quant",
            f"PerTokenGroupQuant{layout.capitalize()}Kernel<{args}>::run",
        )

    def compile_only(self, dsv4: Iterable[DSV4Spec] = (), ptgq: Iterable[PTGQSpec] = (), workers: int = 2) -> list[str]:
        """Compile modules without loading them (e.g. on a CPU machine, to carry them to the GPU one)."""
        sources = [self.dsv4_source(s) for s in dsv4] + [self.ptgq_source(s) for s in ptgq]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return [f.result() for f in [pool.submit(self._compile, *src) for src in sources]]

    def prebuild(self, dsv4: Iterable[DSV4Spec] = (), ptgq: Iterable[PTGQSpec] = (), workers: int = 16) -> None:
        """Build several modules in parallel (nvcc runs in subprocesses)."""
        jobs = [(self.dsv4_module, s) for s in dsv4] + [(self.ptgq_module, s) for s in ptgq]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for future in [pool.submit(fn, spec) for fn, spec in jobs]:  # type: ignore[arg-type]  # each fn with its own spec
                future.result()

    # ---- SGLang's Python wrappers, same signatures
    def silu_and_mul_masked_post_quant(
        self,
        input: torch.Tensor,
        output: torch.Tensor,
        output_scale: torch.Tensor,
        quant_group_size: int,
        masked_m: torch.Tensor,
        scale_ue8m0: bool = False,
        topk: int = 8,
        transposed: bool = False,
        swiglu_limit: float | None = None,
        swizzle: bool = False,
    ) -> None:
        import tvm_ffi

        apply_limit = swiglu_limit is not None
        module = self.dsv4_module(dsv4_spec(quant_group_size, scale_ue8m0, swizzle, swiglu_limit, self.use_pdl))
        with tvm_ffi.use_torch_stream():
            module.run(
                input,
                output,
                output_scale,
                masked_m,
                topk,
                transposed,
                float(swiglu_limit) if apply_limit else 0.0,  # type: ignore[arg-type]  # set when apply_limit
            )

    def per_token_group_quant(
        self,
        input: torch.Tensor,
        output_q: torch.Tensor | None = None,
        output_s: torch.Tensor | None = None,
        group_size: int = 128,
        scale_ue8m0: bool = False,
        fuse_silu_and_mul: bool = False,
        masked_m: torch.Tensor | None = None,
        expected_m: int | None = None,
        *,
        out_dtype: torch.dtype | None = None,
        column_major_scales: bool = False,
        sorted_token_ids: torch.Tensor | None = None,
        num_tokens_post_padded: torch.Tensor | None = None,
        num_valid_tokens: int = 0,
        silu_and_mul_mode: str = "legacy",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import tvm_ffi

        if sorted_token_ids is not None:
            raise NotImplementedError("the sorted layout is not built by sglang_moe_plugins.bench.sglang_kernels")
        if silu_and_mul_mode not in ("legacy", "dense"):
            raise ValueError(f"Unknown silu_and_mul_mode: {silu_and_mul_mode}")
        if output_q is None:
            if output_s is not None:
                raise ValueError("output_s given without output_q")
            output_q, output_s = _allocate_outputs(
                input, group_size, out_dtype or torch.float8_e4m3fn, scale_ue8m0, column_major_scales, fuse_silu_and_mul
            )
        elif output_s is None:
            raise ValueError("output_q given without output_s")
        spec = ptgq_spec(
            input.dtype,
            output_q,
            output_s,
            group_size,
            scale_ue8m0,
            fuse_silu_and_mul,
            masked_m is not None,
            silu_and_mul_mode,
            self.use_pdl,
        )
        module = self.ptgq_module(spec)
        with tvm_ffi.use_torch_stream():
            if masked_m is not None:
                module.per_token_group_quant(input, output_q, output_s, masked_m, int(expected_m or -1))
            else:
                module.per_token_group_quant(input, output_q, output_s)
        return output_q, output_s

    def host_kernels(self) -> HostKernels:
        return HostKernels(
            self.silu_and_mul_masked_post_quant,
            self.per_token_group_quant,
            source=f"sglang 0.5.23 JIT sources built with tvm-ffi ({self.root})",
        )


def dsv4_spec(
    quant_group_size: int, scale_ue8m0: bool, swizzle: bool, swiglu_limit: float | None, use_pdl: bool = True
) -> DSV4Spec:
    """The DSV4 kernel's template arguments for one call of SGLang's wrapper."""
    return (int(quant_group_size), bool(scale_ue8m0), bool(swizzle), bool(use_pdl), swiglu_limit is not None)


def ptgq_spec(
    in_dtype: torch.dtype,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    group_size: int,
    scale_ue8m0: bool,
    fuse_silu_and_mul: bool,
    masked: bool,
    silu_and_mul_mode: str = "legacy",
    use_pdl: bool = True,
) -> PTGQSpec:
    """The per_token_group_quant kernel's template arguments for one call of SGLang's wrapper (the scale
    layout is read off ``output_s`` as SGLang does; the tensors may be on any device)."""
    num_groups = output_q.shape[-1] // group_size
    row_major, aligned = _infer_scale_layout(output_s, scale_ue8m0, num_groups)
    return (
        in_dtype,
        output_q.dtype,
        int(group_size),
        bool(scale_ue8m0),
        row_major,
        aligned,
        bool(fuse_silu_and_mul),
        bool(use_pdl),
        "masked" if masked else "flat",
        silu_and_mul_mode == "dense",
    )


def plugin_specs(shape, config, use_pdl: bool = True) -> tuple[DSV4Spec, PTGQSpec]:
    """The template combinations that the ``jit_ep`` and ``fp8_fallback`` plugins ask SGLang's wrappers
    for on a ``silu_mul_quant`` call (whether the plugin accepts the call is its ``supports``'s business):
    jit_ep passes the call's group size, UE8M0 flag, swizzle and limit; fp8_fallback the fused, masked
    legacy mode with the call's scale tensor."""
    from sglang_moe_plugins.ops.silu_mul_quant import allocate_outputs

    outputs = allocate_outputs(shape, config, torch.device("meta"))  # metadata only: no memory
    return (
        dsv4_spec(shape.group_size, config.scale_ue8m0, config.swizzle, config.swiglu_limit, use_pdl),
        ptgq_spec(
            torch.bfloat16,
            outputs.out,
            outputs.scale,
            shape.group_size,
            config.scale_ue8m0,
            True,
            True,
            "legacy",
            use_pdl,
        ),
    )


def _infer_scale_layout(output_s: torch.Tensor, scale_ue8m0: bool, num_groups: int) -> tuple[bool, bool]:
    # Same rule as SGLang's per_token_group_quant._infer_scale_layout.
    row_major = output_s.stride(-2) >= output_s.stride(-1)
    if output_s.dtype == torch.int32:
        if not scale_ue8m0:
            raise ValueError("int32-packed scale buffers require scale_ue8m0=True")
        return row_major, num_groups % 4 == 0
    if output_s.dtype == torch.float32:
        if scale_ue8m0:
            raise ValueError("scale_ue8m0=True requires an int32-packed output_s")
        return row_major, True
    raise ValueError(f"Unsupported output_s dtype {output_s.dtype}")


def _allocate_outputs(
    input: torch.Tensor,
    group_size: int,
    out_dtype: torch.dtype,
    scale_ue8m0: bool,
    column_major_scales: bool,
    fuse_silu_and_mul: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Same layouts as SGLang's _allocate_outputs / create_per_token_group_quant_fp8_output_scale.
    hidden = input.shape[-1] // (2 if fuse_silu_and_mul else 1)
    out_shape = (*input.shape[:-1], hidden)
    output_q = torch.empty(out_shape, device=input.device, dtype=out_dtype)
    groups = hidden // group_size
    tokens = out_shape[-2]
    if scale_ue8m0 and not column_major_scales:
        output_s = torch.empty((*out_shape[:-1], (groups + 3) // 4), device=input.device, dtype=torch.int32)
    elif scale_ue8m0:
        aligned_k = (groups + 3) // 4 * 4
        output_s = torch.empty(
            (*out_shape[:-2], aligned_k // 4, (tokens + 3) // 4 * 4), device=input.device, dtype=torch.int32
        ).transpose(-1, -2)[..., :tokens, :]
    elif column_major_scales:
        output_s = torch.empty(
            (*out_shape[:-2], groups, (tokens + 3) // 4 * 4), device=input.device, dtype=torch.float32
        ).transpose(-1, -2)[..., :tokens, :]
    else:
        output_s = torch.empty((*out_shape[:-1], groups), device=input.device, dtype=torch.float32)
    return output_q, output_s


def build_host_kernels(jit_root: str | os.PathLike, **kwargs) -> HostKernels:
    """A :class:`HostKernels` over SGLang's kernels built from ``jit_root`` (lazily, per template)."""
    return SglangJit(jit_root, **kwargs).host_kernels()
