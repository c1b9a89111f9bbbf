"""Issue 3: supports() of jit_ep and fp8_fallback against each of their real limits, and their run()
argument handling through the documented host-kernel indirection (the GPU run uses SGLang's kernels)."""

from __future__ import annotations

import pytest
import torch

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops.silu_mul_quant import (
    SiluMulQuantConfig,
    SiluMulQuantInputs,
    SiluMulQuantShape,
    allocate_outputs,
)
from sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback import Fp8FallbackPlugin
from sglang_moe_plugins.plugins.sglang_kernels.host import (
    HostKernels,
    get_host_kernels,
    sglang_mega_pre_dispatch,
    use_host_kernels,
)
from sglang_moe_plugins.plugins.sglang_kernels.jit_ep import JitEpPlugin

SM90 = Platform.cuda(9, 0)


def shape(e=32, n=128, d=2048, group=128, topk=6):
    return SiluMulQuantShape(e, n, d, group, topk)


def config(platform=SM90, limit=10.0, swizzle=False, layout="row_major", keep_fp32=False):
    return SiluMulQuantConfig(platform, limit, swizzle, layout, keep_fp32)


@pytest.fixture
def fake_kernels():
    calls = []

    def dsv4(*args, **kwargs):
        calls.append(("dsv4", args, kwargs))

    def ptgq(*args, **kwargs):
        calls.append(("ptgq", args, kwargs))
        return args[1], args[2]

    with use_host_kernels(HostKernels(dsv4, ptgq, source="test")):
        yield calls


JIT_CASES = [
    (shape(), config(), True, "within the DSV4 JIT kernel's limits"),
    (shape(), config(platform=Platform.cpu()), False, "requires a CUDA device, the call is on cpu"),
    (shape(), config(platform=Platform.cuda(8, 0)), False, "requires CUDA sm90+, the device is sm80"),
    (shape(d=640, e=32), config(), False, "D (640) must be a multiple of 256"),
    (shape(d=8448, e=32), config(), False, "D (8448) must be <= 8192"),
    (shape(e=384, d=4096), config(), False, "E (384) must be <= 256"),
    (shape(e=128, d=512), config(), False, "D // 8 (64) must be >= E (128)"),
    (shape(group=64), config(), False, "group_size (64) must be 32 or 128"),
    (shape(group=32), config(), True, "within"),
    (shape(), config(layout="column_major", limit=None), False, "needs column-major fp32 scales"),
    (shape(n=6), config(layout="ue8m0_packed"), False, "packed UE8M0 scales need N % 4 == 0 (N=6)"),
    (shape(d=768, e=32), config(layout="ue8m0_packed"), False, "packed UE8M0 scales need G % 4 == 0 (G=6)"),
    (shape(n=6), config(), True, "within"),  # row-major fp32 scales need no N % 4
    (shape(e=0), config(), False, "needs E >= 1 and N >= 1"),
    (shape(), config(swizzle=True, keep_fp32=True), True, "within"),
]


@pytest.mark.parametrize("shp, cfg, ok, reason", JIT_CASES)
def test_jit_ep_supports_each_limit(fake_kernels, shp, cfg, ok, reason):
    answer = JitEpPlugin().supports(shp, cfg)
    assert bool(answer) is ok and reason in answer.reason


FALLBACK_CASES = [
    (shape(), config(), True, "swiglu_limit 10 clamped by the plugin"),
    (shape(e=512, d=512), config(limit=None, layout="column_major"), True, "fused per_token_group_quant"),
    (shape(), config(platform=Platform.cpu()), False, "requires a CUDA device"),
    (shape(), config(swizzle=True), False, "cannot read gran-8 swizzled"),
    (shape(), config(keep_fp32=True), False, "rounds SiLU to bf16"),
    (shape(n=0), config(), False, "needs E >= 1 and N >= 1"),
]


@pytest.mark.parametrize("shp, cfg, ok, reason", FALLBACK_CASES)
def test_fp8_fallback_supports(fake_kernels, shp, cfg, ok, reason):
    answer = Fp8FallbackPlugin().supports(shp, cfg)
    assert bool(answer) is ok and reason in answer.reason


def test_supports_is_pure_and_repeatable(fake_kernels):
    for plugin in (JitEpPlugin(), Fp8FallbackPlugin()):
        for shp, cfg, _, _ in JIT_CASES:
            assert plugin.supports(shp, cfg) == plugin.supports(
                SiluMulQuantShape(**shp.__dict__), SiluMulQuantConfig(**cfg.__dict__)
            )


def _inputs(e=4, n=8, d=256):
    gateup = torch.randn(e, n, 2 * d).bfloat16()
    return SiluMulQuantInputs(gateup, torch.tensor([8, 0, 3, 5], dtype=torch.int32)[:e], num_real_tokens=10)


def test_jit_ep_passes_the_host_layouts(fake_kernels):
    inputs = _inputs()
    shp = SiluMulQuantShape(4, 8, 512, 128, 2)
    inputs = SiluMulQuantInputs(torch.randn(4, 8, 1024).bfloat16(), inputs.masked_m)
    for layout in ("row_major", "ue8m0_packed"):
        cfg = config(platform=Platform.cpu(), layout=layout, swizzle=True)
        outputs = allocate_outputs(shp, cfg, torch.device("cpu"))
        JitEpPlugin().run(inputs, outputs, shp, cfg)
        _, args, kwargs = fake_kernels[-1]
        assert args[0] is inputs.gateup and args[1] is outputs.out and args[3] == 128
        assert torch.equal(args[4], inputs.masked_m.clamp(0, 8)) and args[4].dtype == torch.int32
        # topk = max(topk, E): SGLang's kernel caps the rows it writes at N * topk (found by the GPU fuzz)
        assert kwargs == {
            "scale_ue8m0": layout == "ue8m0_packed",
            "topk": 4,
            "transposed": layout == "ue8m0_packed",
            "swiglu_limit": 10.0,
            "swizzle": True,
        }
        if layout == "ue8m0_packed":
            # SGLang's kernel takes the [E, G//4, N] int32 buffer: a contiguous transpose of our [E, N, G//4] view
            assert (
                args[2].shape == (4, 1, 8)
                and args[2].is_contiguous()
                and args[2].data_ptr() == outputs.scale.data_ptr()
            )
        else:
            assert args[2] is outputs.scale


def test_jit_ep_passes_topk_of_at_least_e(fake_kernels):
    """SGLang's kernel writes at most N * topk rows: the plugin passes max(topk, E) (here topk > E and < E)."""
    masked = torch.tensor([3, 0], dtype=torch.int32)
    for topk, want in ((8, 8), (1, 2)):
        shp = SiluMulQuantShape(2, 4, 256, 128, topk)
        cfg = config(platform=Platform.cpu(), layout="row_major")
        JitEpPlugin().run(
            SiluMulQuantInputs(torch.randn(2, 4, 512).bfloat16(), masked),
            allocate_outputs(shp, cfg, torch.device("cpu")),
            shp,
            cfg,
        )
        assert fake_kernels[-1][2]["topk"] == want


@pytest.mark.parametrize("writable", [False, True])
def test_fp8_fallback_clamps_in_bf16_and_respects_writability(fake_kernels, writable):
    gateup = (torch.randn(4, 8, 512) * 30).bfloat16()
    original = gateup.clone()
    inputs = SiluMulQuantInputs(
        gateup, torch.tensor([8, 0, 3, 5], dtype=torch.int32), num_real_tokens=10, gateup_writable=writable
    )
    shp = SiluMulQuantShape(4, 8, 256, 128, 2)
    cfg = config(platform=Platform.cpu(), layout="column_major", limit=7.0)
    outputs = allocate_outputs(shp, cfg, torch.device("cpu"))
    Fp8FallbackPlugin().run(inputs, outputs, shp, cfg)
    _, args, kwargs = fake_kernels[-1]
    passed = args[0]
    assert (passed[..., :256] <= 7.0).all() and passed[..., 256:].abs().max() <= 7.0
    assert torch.equal(
        passed, torch.cat([original[..., :256].clamp(max=7.0), original[..., 256:].clamp(-7.0, 7.0)], -1)
    )
    assert (passed is gateup) is writable
    assert torch.equal(gateup, original) is not writable
    assert args[1] is outputs.out and args[2] is outputs.scale
    masked = kwargs.pop("masked_m")
    assert torch.equal(masked, inputs.masked_m) and masked.dtype == torch.int32
    assert kwargs == {"group_size": 128, "scale_ue8m0": False, "fuse_silu_and_mul": True, "expected_m": 5}


def test_host_kernel_plugins_clamp_masked_m_to_0_N(fake_kernels):
    """The op defines counts outside [0, N] as clamped; SGLang's kernels would read/write past row N."""
    shp = SiluMulQuantShape(4, 8, 256, 128, 2)
    inputs = SiluMulQuantInputs(
        torch.randn(4, 8, 512).bfloat16(), torch.tensor([9, -3, 8, 2**31 - 1], dtype=torch.int32)
    )
    for plugin, layout in ((JitEpPlugin(), "row_major"), (Fp8FallbackPlugin(), "column_major")):
        cfg = config(platform=Platform.cpu(), layout=layout)
        plugin.run(inputs, allocate_outputs(shp, cfg, torch.device("cpu")), shp, cfg)
        name, args, kwargs = fake_kernels[-1]
        passed = args[4] if name == "dsv4" else kwargs["masked_m"]
        assert passed.tolist() == [8, 0, 8, 8]


def test_default_host_kernels_are_sglangs():
    pytest.importorskip("sglang")
    kernels = get_host_kernels()
    assert kernels.source == "sglang"
    assert kernels.silu_and_mul_masked_post_quant.__module__ == "sglang.kernels.ops.moe.dsv4"


def test_sglang_mega_pre_dispatch_is_sglangs_jit_kernel():
    """The lookup the MegaMoE launch uses for ``host_pre_dispatch == "sglang"``: SGLang's own function."""
    pytest.importorskip("sglang")
    from sglang.kernels.ops.moe import dsv4

    assert sglang_mega_pre_dispatch() is dsv4.mega_moe_pre_dispatch
