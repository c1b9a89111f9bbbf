"""``contig_sglang_fused`` and ``contig_sglang_two_kernel`` on the GPU: SGLang 0.5.23's own kernels of the compact
runner's activation step (built from the sglang wheel's JIT sources through tvm-ffi,
``sglang_moe_plugins/bench/sglang_contig_kernels.py``, installed through the plugins' host indirection
``use_contig_kernels``), run through the plugins' own argument and layout handling.

- fused against ``contig_reference``: fp32 scales within 2.5e-7 relative, UE8M0 scales within one power of two,
  >= 99.9% identical; fp8 values at most one representable step apart, >= 99.99% identical (SGLang builds it
  with ``-use_fast_math``);
- two_kernel against the reference's bf16-product numerics (``contig_values(..., bf16_product=True)`` quantized):
  the same bound, except that a few fp32 scales may be one bf16 ulp off (a fast-math product rounded to the
  other neighbouring bf16);
- both bit for bit against calling SGLang's kernels directly (the two-kernel sequence into SGLang-allocated
  buffers, as ``_run_contiguous_gemm`` runs it);
- outputs poisoned first (NaN fp8 bytes, all-ones scale words); both scale layouts; with and without
  swiglu_limit; groups 32/128 (and 64 for two_kernel); several D and M, including M = 1 and M not a multiple
  of 4, an all-zero row, a 0-row call and a misaligned fp8 output.

Not covered here: ``group == D`` with fp32 scales (SGLang routes it to its whole-row per-token kernel, which
the bench builder does not build). Skipped without CUDA, tvm-ffi or the JIT sources. From the repository
root after ``source tests/gpu/gpu_env.sh``:
``python3 -m pytest -q tests/gpu/test_contig_sglang_gpu.py``.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("tvm_ffi")
from sglang_host import JIT_ROOT, PREBUILT  # noqa: E402

if not (JIT_ROOT / "csrc").is_dir():  # pragma: no cover - depends on the machine
    pytest.skip(f"SGLang's JIT sources are not at {JIT_ROOT}", allow_module_level=True)

from sglang_moe_plugins.bench.sglang_contig_kernels import build_contig_kernels, contig_spec, output_scale  # noqa: E402
from sglang_moe_plugins.bench.sglang_kernels import ptgq_spec  # noqa: E402
from sglang_moe_plugins.ops import silu_mul_quant_contig as contig  # noqa: E402
from sglang_moe_plugins.plugins.contig.sglang_fused import ContigSglangFusedPlugin  # noqa: E402
from sglang_moe_plugins.plugins.contig.sglang_host import use_contig_kernels  # noqa: E402
from sglang_moe_plugins.plugins.contig.sglang_two_kernel import ContigSglangTwoKernelPlugin  # noqa: E402
from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import (  # noqa: E402
    contig_values,
    silu_mul_quant_contig_reference,
)
from sglang_moe_plugins.quant import pack_ue8m0_bytes, quantize_fp8_groups, ue8m0_exponent  # noqa: E402

pytestmark = pytest.mark.gpu

FUSED, TWO = ContigSglangFusedPlugin(), ContigSglangTwoKernelPlugin()
LAYOUTS = ("row_major", "ue8m0_packed")
LIMITS = (None, 10.0)
ROWS = (1, 3, 130, 1037)
#: (D, group): fused needs group 32/128, D % 256 == 0, D <= 8192 (and G % 4 == 0 for UE8M0 scales)
FUSED_SHAPES = ((256, 32), (512, 128), (2048, 128), (7168, 128), (8192, 32))
#: two_kernel also takes group 64, any D % 16 == 0 and G % 4 != 0 with UE8M0 scales (an unaligned pack)
TWO_SHAPES = ((96, 32), (256, 32), (384, 128), (512, 128), (2048, 64), (7168, 128))


def _fused_cases():
    for i, (d, group) in enumerate(FUSED_SHAPES):
        for layout in LAYOUTS:
            for limit in LIMITS:
                rows = ROWS[(i + LAYOUTS.index(layout) + LIMITS.index(limit)) % len(ROWS)]
                yield pytest.param(
                    d, group, layout, limit, False, rows, id=f"D{d}-g{group}-{layout}-lim{limit}-M{rows}"
                )
    for layout in LAYOUTS:  # the runner's swizzled call (gran-8 interleave), group 128 with a limit
        for rows in (1, 130):
            yield pytest.param(2048, 128, layout, 10.0, True, rows, id=f"D2048-g128-{layout}-swizzle-M{rows}")


def _two_cases():
    for i, (d, group) in enumerate(TWO_SHAPES):
        for layout in LAYOUTS:
            for limit in LIMITS:
                rows = ROWS[(i + LAYOUTS.index(layout) + LIMITS.index(limit)) % len(ROWS)]
                yield pytest.param(d, group, layout, limit, rows, id=f"D{d}-g{group}-{layout}-lim{limit}-M{rows}")


def _specs(use_pdl: bool):
    """The fused templates and quantizer templates the cases ask for (built in parallel up front)."""
    fused = {
        contig_spec(g, layout == "ue8m0_packed", sw, lim, use_pdl)
        for d, g, layout, lim, sw, _ in (p.values for p in _fused_cases())
    }
    quant = set()
    for d, g, layout, _, _ in (p.values for p in _two_cases()):
        ue8m0 = layout == "ue8m0_packed"
        q = torch.empty((4, d), dtype=torch.float8_e4m3fn, device="meta")
        s = output_scale((4, d), torch.device("meta"), g, ue8m0, ue8m0, ue8m0)
        quant.add(ptgq_spec(torch.bfloat16, q, s, g, ue8m0, False, False, "legacy", use_pdl))
    return sorted(fused), sorted(quant, key=str)


@pytest.fixture(scope="module")
def jit():
    built = build_contig_kernels(JIT_ROOT, build_root=f"/tmp/sgl_jit_build/pid{os.getpid()}", prebuilt_root=PREBUILT)
    fused, quant = _specs(built.use_pdl)
    built.prebuild_contig(contig=fused, ptgq=quant, two_kernel=True, workers=16)
    with use_contig_kernels(built.contig_host_kernels()):
        yield built
    print("\n".join(built.log))


def _gateup(rows: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, 2 * d, device="cuda", generator=gen)
    x *= torch.exp2(torch.randint(-6, 7, (rows, 1), device="cuda", generator=gen).float())
    if rows >= 3:
        x[rows // 2] = 0.0  # an all-zero row: absmax floored at 1e-10
    return x.to(torch.bfloat16)


def _poisoned(shape, config, rows: int) -> contig.ContigOutputs:
    outputs = contig.allocate_outputs(shape, config, torch.device("cuda"), rows)
    outputs.out.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
    outputs.scale.view(torch.int32).fill_(-1)  # fp32 NaN / UE8M0 exponent 255 in every byte
    return outputs


def _run(plugin, d, group, layout, limit, swizzle, rows, seed, keep_fp32):
    gateup = _gateup(rows, d, seed)
    shape, config = contig.describe(
        gateup, group_size=group, swiglu_limit=limit, swizzle=swizzle, scale_layout=layout, keep_fp32=keep_fp32
    )
    support = plugin.supports(shape, config)
    assert support, support.reason  # the cases are within each plugin's limits
    assert "JIT sources" in plugin.available(config.platform).reason
    inputs = contig.ContigInputs(gateup.clone())
    outputs = _poisoned(shape, config, rows)
    plugin.prepare(shape, config)(inputs, outputs)
    torch.cuda.synchronize()
    contig.validate_outputs(outputs, shape, config, plugin.name, inputs)
    assert torch.equal(inputs.gateup, gateup), "gateup is read only"
    return gateup, outputs, shape, config


def _fp8_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in representable e4m3 values (sign-magnitude codes; +0 and -0 are the same value)."""
    ia, ib = a.view(torch.uint8).to(torch.int32), b.view(torch.uint8).to(torch.int32)
    sa = torch.where(ia >= 128, -(ia - 128), ia)
    sb = torch.where(ib >= 128, -(ib - 128), ib)
    return (sa - sb).abs()


def _assert_close_to(outputs, want_q, want_scale, shape, config, bf16_product: bool = False) -> None:
    """Every element written; fp8 values within one step, at most max(4, 0.2%) of them off by that step; scales within
    one power of two (UE8M0) or 5e-7 relative (fp32), >= 99% within 2.5e-7 (measured >= 99.66%). With ``bf16_product`` an fp32 scale may
    also be one bf16 ulp off (at most 2^-7 relative): SGLang's fast-math SiLU can round a group's largest product to
    the other neighbouring bf16 than the reference does.

    Why these bounds (H200, 2026-12-03, tests/gpu/results/2026-12-03_h200_contig_sglang_tests_run{1,2,3}.txt): SGLang's kernels
    are built with ``-use_fast_math`` (``ex2.approx``/``rcp.approx`` SiLU, the scale as absmax times an approximate
    reciprocal of 448), the reference in IEEE fp32. A scale is then up to two fp32 ulps off (measured up to 3.8e-7
    relative, 2 ulps < 4.8e-7) and a value near a rounding boundary of fp8 lands on the other neighbour (measured up
    to 0.2% of the values of a 3-row call, 0.05% of larger ones). Against SGLang's own kernels called directly both
    plugins are held bit for bit (below)."""
    assert not torch.isnan(outputs.out.float()).any(), "an fp8 output was left unwritten (NaN poison)"
    got_s = contig.scale_to_float(outputs.scale, shape, config)
    assert torch.isfinite(got_s).all() and (got_s > 0).all(), "a scale was left unwritten"
    if config.scale_ue8m0:
        ratio = got_s / want_scale
        assert ((ratio == 1) | (ratio == 2) | (ratio == 0.5)).all()
        assert (ratio == 1).float().mean().item() >= 0.999, f"{int((ratio != 1).sum())} UE8M0 scales differ"
    else:
        rel = (got_s.double() - want_scale.double()).abs() / want_scale.double()
        assert rel.max().item() <= (2.0**-7 if bf16_product else 5e-7), f"scale relative error {rel.max().item():.3e}"
        assert (rel <= 2.5e-7).float().mean().item() >= 0.99, f"{int((rel > 2.5e-7).sum())} fp32 scales differ"
    steps = _fp8_steps(outputs.out, want_q)
    assert steps.max().item() <= 1
    differ = int((steps != 0).sum())
    assert differ <= max(4, 0.002 * steps.numel()), f"{differ} of {steps.numel()} fp8 values differ"


@pytest.mark.parametrize("d, group, layout, limit, swizzle, rows", list(_fused_cases()))
def test_fused_matches_the_reference(jit, d, group, layout, limit, swizzle, rows):
    gateup, outputs, shape, config = _run(FUSED, d, group, layout, limit, swizzle, rows, seed=d + rows, keep_fp32=True)
    ref = contig.allocate_outputs(shape, config, gateup.device, rows)
    silu_mul_quant_contig_reference(contig.ContigInputs(gateup), ref, shape, config)
    _assert_close_to(outputs, ref.out, contig.scale_to_float(ref.scale, shape, config), shape, config)


@pytest.mark.parametrize("d, group, layout, limit, swizzle, rows", list(_fused_cases()))
def test_fused_is_sglangs_kernel_bit_for_bit(jit, d, group, layout, limit, swizzle, rows):
    gateup, outputs, _shape, config = _run(
        FUSED, d, group, layout, limit, swizzle, rows, seed=d + rows + 1, keep_fp32=True
    )
    ue8m0 = config.scale_ue8m0
    out = torch.empty((rows, d), dtype=torch.float8_e4m3fn, device="cuda")
    scale = output_scale((rows, d), gateup.device, group, ue8m0, ue8m0, ue8m0)  # as _run_contiguous_gemm allocates
    jit.silu_and_mul_contig_post_quant(
        gateup, out, scale, group, scale_ue8m0=ue8m0, transposed=ue8m0, swiglu_limit=limit, swizzle=swizzle
    )
    torch.cuda.synchronize()
    assert torch.equal(outputs.out.view(torch.uint8), out.view(torch.uint8))
    assert torch.equal(outputs.scale.view(torch.int32), scale.view(torch.int32))


def _bf16_reference(gateup, shape, config):
    q, scale = quantize_fp8_groups(
        contig_values(gateup, config, bf16_product=True), shape.group_size, ue8m0=config.scale_ue8m0
    )
    return q, scale


@pytest.mark.parametrize("d, group, layout, limit, rows", list(_two_cases()))
def test_two_kernel_matches_the_bf16_product_reference(jit, d, group, layout, limit, rows):
    gateup, outputs, shape, config = _run(TWO, d, group, layout, limit, False, rows, seed=d + rows + 2, keep_fp32=False)
    want_q, want_scale = _bf16_reference(gateup, shape, config)
    if config.scale_ue8m0:
        want_scale = contig.scale_to_float(pack_ue8m0_bytes(ue8m0_exponent(want_scale)), shape, config)
    _assert_close_to(outputs, want_q, want_scale, shape, config, bf16_product=True)


@pytest.mark.parametrize("d, group, layout, limit, rows", list(_two_cases()))
def test_two_kernel_is_sglangs_sequence_bit_for_bit(jit, d, group, layout, limit, rows):
    """What ``_run_contiguous_gemm``'s two-kernel branch computes, called directly, into its own buffers."""
    gateup, outputs, shape, config = _run(TWO, d, group, layout, limit, False, rows, seed=d + rows + 3, keep_fp32=False)
    ue8m0 = config.scale_ue8m0
    down_input = torch.empty((rows, d), device="cuda", dtype=torch.bfloat16)
    if limit is not None:
        jit.silu_and_mul_clamp(gateup.view(-1, 2 * d), down_input, limit)
    else:
        jit.silu_and_mul(gateup.view(-1, 2 * d), down_input)
    q, s = jit.per_token_group_quant_fp8(
        down_input, group, column_major_scales=ue8m0, scale_tma_aligned=ue8m0, scale_ue8m0=ue8m0
    )
    torch.cuda.synchronize()
    assert torch.equal(outputs.out.view(torch.uint8), q.view(torch.uint8))
    assert s.shape == outputs.scale.shape and s.stride() == outputs.scale.stride()
    got = contig.scale_to_float(outputs.scale, shape, config)
    want = contig.scale_to_float(s, shape, config)  # the real groups (an unaligned pack's pad bytes aside)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    if not ue8m0 or shape.num_groups % 4 == 0:
        assert torch.equal(outputs.scale.view(torch.int32), s.view(torch.int32))


@pytest.mark.parametrize("plugin", [FUSED, TWO], ids=lambda p: p.name)
def test_zero_rows_write_nothing_and_launch_nothing(jit, plugin):
    gateup = torch.empty((0, 1024), device="cuda", dtype=torch.bfloat16)
    shape, config = contig.describe(gateup, group_size=128, keep_fp32=plugin is FUSED)
    outputs = contig.allocate_outputs(shape, config, gateup.device, 0)
    plugin.run(contig.ContigInputs(gateup), outputs, shape, config)
    torch.cuda.synchronize()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("plugin", [FUSED, TWO], ids=lambda p: p.name)
def test_a_misaligned_output_is_written(jit, plugin, layout):
    """An fp8 output view 1 byte into its storage: staged in an aligned buffer, then copied."""
    rows, d = 5, 512
    gateup = _gateup(rows, d, seed=7)
    shape, config = contig.describe(gateup, group_size=128, scale_layout=layout, keep_fp32=plugin is FUSED)
    outputs = _poisoned(shape, config, rows)
    storage = torch.empty(rows * d + 1, dtype=torch.float8_e4m3fn, device="cuda")
    storage.view(torch.uint8).fill_(0x7F)
    outputs = contig.ContigOutputs(storage[1:].view(rows, d), outputs.scale)
    plugin.run(contig.ContigInputs(gateup), outputs, shape, config)
    torch.cuda.synchronize()
    if plugin is FUSED:
        ref = contig.allocate_outputs(shape, config, gateup.device, rows)
        silu_mul_quant_contig_reference(contig.ContigInputs(gateup), ref, shape, config)
        want_q, want_scale = ref.out, contig.scale_to_float(ref.scale, shape, config)
    else:
        want_q, want_scale = _bf16_reference(gateup, shape, config)
        if config.scale_ue8m0:
            want_scale = contig.scale_to_float(pack_ue8m0_bytes(ue8m0_exponent(want_scale)), shape, config)
    _assert_close_to(outputs, want_q, want_scale, shape, config, bf16_product=plugin is TWO)
    assert storage.view(torch.uint8)[0].item() == 0x7F, "nothing written before the view"
