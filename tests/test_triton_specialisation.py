"""The prepared Triton launches compile exactly the kernel Triton's JIT dispatch would launch, and hand
its launcher exactly the arguments ``JITFunction.run`` would (CPU only: Triton's own argument binder,
built for an sm90 target, no GPU).

``JITFunction.run`` specialises every argument (pointer dtype and 16-byte alignment, integer value:
``== 1`` becomes a constexpr, ``% 16 == 0`` a divisibility hint, unless ``do_not_specialize``) and
launches the kernel compiled for that key with ``bound_args.values()``. A prepared launch compiles
through ``warmup`` with pointers given as dtypes (``MockTensor``: aligned) and calls the compiled
kernel's launcher with a precomputed tuple; both must agree for every shape, including those of the
GPU tests (N % 4 != 0, G % 4 != 0, more experts than one prologue chunk, N = 1, top-k 1, ...).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sglang_moe_plugins.hardware import Platform  # noqa: E402
from sglang_moe_plugins.ops.silu_mul_quant import (  # noqa: E402
    SiluMulQuantConfig,
    SiluMulQuantShape,
    allocate_outputs,
    expected_scale_strides,
)
from sglang_moe_plugins.plugins import triton_common as L  # noqa: E402
from sglang_moe_plugins.plugins.triton_common import ordered_arguments  # noqa: E402
from sglang_moe_plugins.plugins.triton_smq.plugin import TritonPlugin  # noqa: E402
from sglang_moe_plugins.quant import round_to_bf16  # noqa: E402


@pytest.fixture(scope="module")
def specialise():
    """``specialise(jit_fn, args, kwargs) -> (bound argument values, specialisation, options)`` as
    ``JITFunction.run`` computes them (dtypes wrapped as ``warmup`` wraps them)."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import MockTensor, create_function_from_signature
    except ImportError as exc:  # pragma: no cover - depends on the Triton release
        pytest.skip(f"this Triton has no argument binder to compare with ({exc})")
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binders = {}

    def run(jit_fn, args, kwargs):
        binder = binders.get(id(jit_fn))
        if binder is None:
            binder = binders[id(jit_fn)] = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
        bound, specialisation, options = binder(*map(MockTensor.wrap_dtype, args), **kwargs)
        return tuple(bound.values()), [tuple(s) for s in specialisation], options

    return run


class _Compiled:
    """Stands in for the CompiledKernel that ``compile_specialisation`` returns on a GPU."""

    function = 1
    packed_metadata = ()

    def run(self, *args):  # pragma: no cover - never launched here
        raise AssertionError("no launch on the CPU")

    def launch_metadata(self, *args):  # pragma: no cover
        return None


# The GPU tests' prepared cases, the two that failed on the H200 among them, and integer edge values.
SILU_CASES = [
    (32, 64, 2048, 128, "column_major", None, False),
    (32, 1024, 2048, 128, "ue8m0_packed", 10.0, True),
    (128, 16, 768, 128, "row_major", None, False),
    (3, 5, 96, 32, "ue8m0_packed", 7.0, False),  # G % 4 != 0, N % 4 != 0
    (2000, 3, 64, 64, "column_major", None, False),  # E above one prologue chunk
    (1, 1, 128, 128, "column_major", None, False),
    (1, 1, 128, 128, "row_major", None, False),  # every stride and size 1
    (16, 1, 16, 16, "row_major", 1.0, True),  # sizes and strides divisible by 16, limit 1.0
    (17, 33, 4096, 128, "ue8m0_packed", None, False),
]


@pytest.mark.parametrize("E, N, D, gs, layout, limit, swizzle", SILU_CASES)
def test_silu_prepared_launch_compiles_and_passes_what_the_jit_launch_would(
    monkeypatch, specialise, E, N, D, gs, layout, limit, swizzle
):
    from sglang_moe_plugins.plugins.triton_smq import launch as K
    from sglang_moe_plugins.plugins.triton_smq.tuning import choose_config

    # An sm90 device without a GPU: PDL on, 132 SMs, occupancy 8; compile and stream recorded, not run.
    monkeypatch.setattr(K, "pdl_supported", lambda index: True)
    monkeypatch.setattr(K, "sm_count", lambda index: 132)
    monkeypatch.setattr(K, "_resident", lambda index, args, constexprs, num_warps: 8)
    compiled = []
    monkeypatch.setattr(
        K,
        "compile_specialisation",
        lambda jit_fn, args, kwargs, index: compiled.append((jit_fn, args, kwargs, index)) or _Compiled(),
    )
    monkeypatch.setattr(L, "_stream_getter", lambda: lambda index: 0)

    shape = SiluMulQuantShape(E, N, D, gs, 8)
    config = SiluMulQuantConfig(Platform.cuda(9, 0), scale_layout=layout, swiglu_limit=limit, swizzle=swizzle)
    plugin = TritonPlugin()
    bound = plugin._prepare(shape, config, 0, K)
    low = bound.launch.low_level
    ((jit_fn, args, kwargs, index),) = compiled
    assert jit_fn is K.silu_mul_quant_kernel and index == 0

    # What ``launch`` (the JIT path) passes for real tensors of this shape key: the scale strides of
    # the tensor itself, not the layout's.
    gateup = torch.empty(E, N, 2 * D, dtype=torch.bfloat16)
    masked_m = torch.empty(E, dtype=torch.int32)
    outputs = allocate_outputs(shape, config, torch.device("cpu"))
    assert tuple(outputs.scale.stride()) == expected_scale_strides(shape, config)[1]
    plan = K.plan_launch(
        E,
        N,
        D,
        group_size=gs,
        scale_strides=outputs.scale.stride(),
        swiglu_limit=None if limit is None else round_to_bf16(limit),
        swizzle=swizzle,
        ue8m0=config.scale_ue8m0,
        config=choose_config(E, N, D, gs, 8),
        device_index=0,
        pointers=(gateup, masked_m, outputs.out, outputs.scale),
    )
    tensors = (gateup, masked_m, outputs.out, outputs.scale)
    assert all(t.data_ptr() % 16 == 0 for t in tensors)
    jit_values, jit_spec, jit_options = specialise(K.silu_mul_quant_kernel, tensors + plan.runtime, plan.kwargs_dict)
    _, prepared_spec, prepared_options = specialise(K.silu_mul_quant_kernel, args, kwargs)

    assert prepared_spec == jit_spec  # the compiled-kernel key: the same kernel
    assert prepared_options == jit_options
    assert [s[0] for s in jit_spec[:4]] == ["*bf16", "*i32", "*fp8e4nv", "*i32" if config.scale_ue8m0 else "*fp32"]
    assert all(s[1] == "D" for s in jit_spec[:4])  # the aligned specialisation, as the prepared call checks
    assert all(s[1] is None for s in jit_spec[4:10])  # N, E and the strides: never specialised by value
    # The launcher gets the pointers (per call), then exactly the JIT launch's remaining arguments.
    assert low.tail == jit_values[4:]
    assert (
        low.tail == ordered_arguments(K.silu_mul_quant_kernel.arg_names, tensors + plan.runtime, plan.kwargs_dict)[4:]
    )
    assert low.grid == (plan.grid[0], 1, 1)


PRE_DISPATCH_CASES = [
    ("fp8xfp4", 1, 128, 1),  # T = 1, one column block, top-k 1 (stride 1: a constexpr when specialised)
    ("fp8xfp4", 64, 4096, 8),
    ("mxf4xmxf4", 33, 7168, 9),
    ("sm90_fp8", 300, 4096, 6),
    ("sm90_fp8", 1024, 7168, 8),
    ("fp8xfp4", 17, 2880, 4),
]


@pytest.mark.parametrize("variant, T, H, K", PRE_DISPATCH_CASES)
@pytest.mark.parametrize("shared", [False, True])
def test_pre_dispatch_prepared_arguments_compile_what_the_jit_launch_would(specialise, variant, T, H, K, shared):
    """``PreDispatchLauncher`` plans with the inputs as dtypes (every integer argument of this kernel is
    specialised by value, and all of them are fixed by the plan's key: T, H, strides, dtypes, buffers)."""
    from sglang_moe_plugins.plugins.deep_gemm import pre_dispatch_triton as P

    if shared and variant != "fp8xfp4":
        pytest.skip("the shared expert's scale copy exists for fp8xfp4 only")
    fmt, group_size, _ = P.FORMAT_CODES[variant]
    P_rows = T + 5
    groups = H // group_size
    buf_x = torch.empty(P_rows * H, dtype=torch.uint8)
    if fmt == 2:
        buf_x_sf = torch.empty(P_rows, groups, dtype=torch.float32)
    else:
        buf_x_sf = torch.empty(P_rows, -(-groups // 4), dtype=torch.int32)
    buf_idx = torch.empty(P_rows, K, dtype=torch.int64)
    buf_w = torch.empty(P_rows, K, dtype=torch.float32)
    shared_sf = torch.empty(256, -(-groups // 4), dtype=torch.int32).t() if shared else None
    x = torch.empty(T, H, dtype=torch.bfloat16)
    ids = torch.empty(T, K, dtype=torch.int32)
    w = torch.empty(T, K, dtype=torch.float32)
    options = dict(
        variant=variant,
        routed_scaling_factor=2.5,
        shared_x_sf=shared_sf,
        shared_block_m=96 if shared else 0,
        tiling=None,
        use_pdl=True,
    )
    buffers = (buf_x, buf_x_sf, buf_idx, buf_w)
    strides = (x.stride(0), ids.stride(0), w.stride(0))
    grid, jit_args, jit_kwargs = P._arguments(x, ids, w, strides, T, H, *buffers, **options)
    grid_p, prepared_args, prepared_kwargs = P._arguments(
        x.dtype, ids.dtype, w.dtype, strides, T, H, *buffers, **options
    )
    kernel = P.pre_dispatch_kernel()
    assert all(a.data_ptr() % 16 == 0 for a in jit_args if isinstance(a, torch.Tensor))
    jit_values, jit_spec, jit_options = specialise(kernel, jit_args, jit_kwargs)
    _, prepared_spec, prepared_options = specialise(kernel, prepared_args, prepared_kwargs)
    assert grid_p == grid
    assert prepared_spec == jit_spec and prepared_options == jit_options
    tail = ordered_arguments(kernel.arg_names, tuple(P._pointer(a) for a in prepared_args), prepared_kwargs)[6:]
    assert tail == tuple(P._pointer(v) for v in jit_values[6:])
    if K == 1:
        assert jit_spec[3] == ("constexpr", 1)  # stride_it == 1: specialised, the same in both
