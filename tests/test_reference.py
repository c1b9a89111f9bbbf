"""The reference silu_mul_quant against an independent fp64 computation and sgl-deep-gemm's torch refs."""

from __future__ import annotations

import pytest
import torch
from conftest import random_call
from numerics import check_against_fp64, poison

from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference
from sglang_moe_plugins.quant import pack_ue8m0_bytes, quantize_fp8_groups, ue8m0_exponent, unpack_ue8m0_bytes


def run_reference(inputs, shape, config):
    outputs = smq.allocate_outputs(shape, config, inputs.gateup.device)
    poison(outputs)
    silu_mul_quant_reference(inputs, outputs, shape, config)
    smq.validate_outputs(outputs, shape, config)
    return outputs


CASES = [
    dict(e=4, n=8, d=256, group=128),
    dict(e=3, n=6, d=512, group=128, limit=10.0),
    dict(e=5, n=7, d=384, group=128, limit=7.0, swizzle=True),
    dict(e=2, n=5, d=192, group=64),
    dict(e=2, n=9, d=96, group=32, swizzle=True),
    dict(e=3, n=4, d=1536, group=128, limit=10.0),  # G = 12: packed UE8M0 with 3 int32
    dict(e=2, n=3, d=640, group=128),  # G = 5: a partial last int32
]


@pytest.mark.parametrize("layout", smq.SCALE_LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_reference_matches_fp64(case, layout):
    case = dict(case)
    d = case.pop("d")
    for seed in range(2):
        inputs, shape, config = random_call(d=d, layout=layout, seed=seed, **case)
        outputs = run_reference(inputs, shape, config)
        real = smq.real_rows(inputs.masked_m, shape.max_rows)
        check_against_fp64(inputs, outputs, shape, config)
        assert torch.isnan(outputs.out[~real].float()).all(), "padding rows untouched"
        if config.scale_ue8m0:
            raw = unpack_ue8m0_bytes(outputs.scale, 4 * shape.packed_groups)[real]
            assert (raw[:, shape.num_groups :] == 0).all(), "pad bytes of the last int32 are 0"


def test_padding_rows_and_empty_experts_only():
    inputs, shape, config = random_call(e=3, n=4)
    inputs.masked_m.zero_()
    outputs = run_reference(inputs, shape, config)
    assert torch.isnan(outputs.out.float()).all()


def test_zero_sized_calls_are_defined():
    gateup = torch.randn(0, 4, 256).bfloat16()
    shape, config = smq.describe(gateup, torch.zeros(0, dtype=torch.int32), group_size=128, topk=1)
    outputs = smq.allocate_outputs(shape, config, gateup.device)
    silu_mul_quant_reference(smq.SiluMulQuantInputs(gateup, torch.zeros(0, dtype=torch.int32)), outputs, shape, config)
    assert outputs.out.shape == (0, 4, 128) and outputs.scale.shape == (0, 4, 1)


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("gran", [32, 128])
def test_fp8_quantizer_bit_exact_with_deep_gemm(ue8m0, gran):
    dg_math = pytest.importorskip("deep_gemm.utils.math")
    gen = torch.Generator().manual_seed(gran + ue8m0)
    x = (
        torch.randn(64, 512, generator=gen) * torch.exp2(torch.randint(-6, 8, (64, 1), generator=gen).float())
    ).bfloat16()
    ref_q, ref_s = dg_math.per_token_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=gran)
    q, s = quantize_fp8_groups(x.float(), gran, ue8m0=ue8m0, absmax_floor=1e-4)
    assert torch.equal(s, ref_s)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


def test_ue8m0_packing_matches_deep_gemm():
    dg_math = pytest.importorskip("deep_gemm.utils.math")
    scales = torch.exp2(torch.randint(-30, 10, (16, 8)).float())
    ref = dg_math.pack_ue8m0_to_int(scales)
    ours = pack_ue8m0_bytes(ue8m0_exponent(scales))
    assert torch.equal(ours, ref)
    assert torch.equal(unpack_ue8m0_bytes(ours, 8), ue8m0_exponent(scales))
    assert torch.equal(dg_math.ceil_to_ue8m0(scales * 1.1), torch.exp2(torch.ceil(torch.log2(scales * 1.1))))


def test_swizzle_split_roundtrip():
    x = torch.arange(2 * 64).reshape(2, 64)
    gate, up = smq.split_gate_up(x, swizzle=True)
    assert gate[0, :8].tolist() == list(range(8)) and up[0, :8].tolist() == list(range(8, 16))
    assert gate[0, 8:16].tolist() == list(range(16, 24))
