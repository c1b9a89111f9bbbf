"""MegaMoE quantizers and layouts against sgl-deep-gemm's own torch references (bit-exact, CPU)."""

from __future__ import annotations

import pytest
import torch

from sglang_moe_plugins.ops.mega_moe import formats as nm
from sglang_moe_plugins.quant import quantize_e2m1, unpack_ue8m0_bytes

dgm = pytest.importorskip("deep_gemm.utils.math", reason="sgl-deep-gemm's torch references (deep_gemm.utils.math)")
dg_mega = pytest.importorskip("deep_gemm.mega")


def _activations(seed: int, tokens: int = 33, hidden: int = 1024) -> torch.Tensor:
    """Fresh random rows with magnitudes over many binades (every group's absmax >= 1e-4)."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-12, 12, (tokens, 1), generator=gen).float())
    x = torch.randn(tokens, hidden, generator=gen) * scale
    x[0, :64] = 448.0 * 2.0**-3  # absmax exactly 448 * 2^k: the power-of-two edge of ceil_to_ue8m0
    x[1, 32:96] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 8)  # E2M1 midpoints
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fp8_per32_ue8m0_matches_per_token_cast_to_fp8(seed: int) -> None:
    x = _activations(seed)
    q, exponent = nm.quantize_activations(x, "fp8xfp4")
    ref_q, ref_sf = dgm.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(exponent, unpack_ue8m0_bytes(ref_sf, x.shape[1] // 32))
    back = dgm.cast_back_from_fp8(ref_q, ref_sf, gran_k=32, use_packed_ue8m0=True)
    assert torch.equal(nm.dequantize_activations(q, exponent, "fp8xfp4"), back)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mxfp4_matches_per_token_cast_to_fp4(seed: int) -> None:
    x = _activations(seed)
    x[2, :32] = 3e-6  # below the 1e-4 floor: both floor it the same way
    packed, exponent = nm.quantize_activations(x, "mxf4xmxf4")
    ref_packed, ref_sf = dgm.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
    assert torch.equal(exponent, unpack_ue8m0_bytes(ref_sf, x.shape[1] // 32))
    back = dgm.cast_back_from_fp4(ref_packed, ref_sf, gran_k=32, use_packed_ue8m0=True)
    assert torch.equal(nm.dequantize_activations(packed, exponent, "mxf4xmxf4"), back)


def test_e2m1_ties_as_bucketize() -> None:
    """Midpoints 0.25, 1.25, 2.5, 5 go down, 0.75, 1.75, 3.5 go up (ties to the even code)."""
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    values = torch.cat(
        [
            mids,
            -mids,
            mids.nextafter(torch.tensor(9.0)),
            mids.nextafter(torch.tensor(0.0)),
            torch.tensor([0.0, -0.0, 6.0, 7.5, -100.0, 1e-9]),
        ]
    )
    ours = quantize_e2m1(values)
    ref = dgm._quantize_to_fp4_e2m1(values).view(torch.uint8)
    assert torch.equal(ours, ref)
    assert ours[:7].tolist() == [0, 2, 2, 4, 4, 6, 6]


@pytest.mark.parametrize("seed", [0, 1])
def test_fp8_per128_matches_per_token_cast_to_fp8(seed: int) -> None:
    x = _activations(seed)
    q, scale = nm.quantize_activations(x, "sm90_fp8")
    ref_q, ref_sf = dgm.per_token_cast_to_fp8(x, use_ue8m0=False, gran_k=128)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(scale, ref_sf)
    assert torch.equal(
        nm.dequantize_activations(q, scale, "sm90_fp8"), dgm.cast_back_from_fp8(ref_q, ref_sf, gran_k=128)
    )


def test_absmax_floor_follows_the_kernel_not_the_torch_helper() -> None:
    """SGLang's JIT FP8 pre-dispatch and DeepGEMM's SM90 one floor absmax at 1e-10, deep_gemm's torch
    helper at 1e-4: they differ only for groups with absmax < 1e-4, and we follow the kernels."""
    x = torch.full((1, 128), 2e-6).to(torch.bfloat16)
    _, exponent = nm.quantize_activations(x, "fp8xfp4")
    _, ref_sf = dgm.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    ours = int(exponent[0, 0])
    helper = int(unpack_ue8m0_bytes(ref_sf, 4)[0, 0])
    assert ours == int(nm.ue8m0_exponent(torch.tensor([x.float().abs().max().item() / 448.0]))[0])
    assert helper == int(nm.ue8m0_exponent(torch.tensor([1e-4 / 448.0]))[0])
    assert ours < helper


def test_pre_dispatch_reference_buffer_layout() -> None:
    gen = torch.Generator().manual_seed(5)
    tokens, hidden, top_k, rows = 7, 512, 6, 16
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    ids = torch.randint(-1, 32, (tokens, top_k), generator=gen, dtype=torch.int32)
    weights = torch.rand(tokens, top_k, generator=gen)
    # x_sf with a row stride padded past its logical width (DeepGEMM may pad to 16 bytes)
    sf_storage = torch.full((rows, 8), 0x7B7B7B7B, dtype=torch.int32)
    buf_x_sf = sf_storage[:, : hidden // 128]
    buf_x = torch.zeros((rows, hidden), dtype=torch.float8_e4m3fn)
    buf_idx = torch.full((rows, top_k), 99, dtype=torch.int64)
    buf_w = torch.full((rows, top_k), 9.0)
    nm.pre_dispatch_reference(
        x, ids, weights, buf_x, buf_x_sf, buf_idx, buf_w, variant="fp8xfp4", routed_scaling_factor=2.5
    )
    q, exponent = nm.quantize_activations(x, "fp8xfp4")
    assert torch.equal(buf_x[:tokens].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(unpack_ue8m0_bytes(buf_x_sf[:tokens], hidden // 32), exponent)
    assert (sf_storage[:, hidden // 128 :] == 0x7B7B7B7B).all()  # the padding bytes are untouched
    assert torch.equal(buf_idx[:tokens], ids.long()) and (buf_idx[tokens:] == -1).all()
    assert torch.equal(buf_w[:tokens], weights * 2.5) and (buf_w[tokens:] == 0).all()


def test_shared_sf_rows_follow_the_jit_kernel_formula() -> None:
    block_m = 48
    tokens = torch.arange(200)
    rows = nm.shared_sf_row(tokens, block_m)
    # mega_moe_pre_dispatch.cuh: token / bm * align(bm, 128) + m / 128 * 128 + m % 32 * 4 + m % 128 / 32
    expected = [
        t // block_m * 128 + (t % block_m) // 128 * 128 + (t % block_m) % 32 * 4 + (t % block_m) % 128 // 32
        for t in range(200)
    ]
    assert rows.tolist() == expected
    assert len(set(rows.tolist())) == 200


@pytest.mark.parametrize(
    "mode,ref", [("gran8", "_interleave_weights"), ("gran16_packed", "_interleave_weights_packed_fp4")]
)
def test_interleave_matches_deep_gemm(mode: str, ref: str) -> None:
    t = torch.randint(-128, 127, (3, 256, 40), dtype=torch.int8)
    out = nm.interleave_gate_up(t, mode)
    assert torch.equal(out, getattr(dg_mega, ref)(t))
    assert torch.equal(nm.deinterleave_gate_up(out, mode), t)


def test_utccp_matches_deep_gemm() -> None:
    sf = torch.randint(0, 2**31 - 1, (2, 384, 5), dtype=torch.int32)
    assert torch.equal(nm.utccp_transpose(sf), dg_mega._transpose_sf_for_utccp(sf))
    assert torch.equal(nm.utccp_untranspose(nm.utccp_transpose(sf)), sf)


@pytest.mark.parametrize("mode", ["gran8", "gran16_packed", None])
def test_fp4_weights_round_trip_and_match_deep_gemm(mode) -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(2, 256, 512, generator=gen) * 0.05
    data, sf, deq = nm.encode_fp4_weights(w, mode)
    # values and scales as per_token_cast_to_fp4 makes them, laid out as transform_weights_for_mega_moe
    ref_data, ref_sf = zip(*(dgm.per_token_cast_to_fp4(w[e], use_ue8m0=True, gran_k=32) for e in range(2)))
    ref_data = torch.stack(ref_data)
    assert torch.equal(data.view(torch.uint8), nm.interleave_gate_up(ref_data, mode).view(torch.uint8))
    back = torch.stack([dgm.cast_back_from_fp4(ref_data[e], ref_sf[e], gran_k=32) for e in range(2)])
    assert torch.equal(deq, back)
    assert torch.equal(nm.decode_fp4_weights(data, sf, mode), deq)
    # scales: MN-major, TMA-aligned, four UE8M0 bytes per int32 along K, as transform_sf_into_required_layout
    assert sf.dtype == torch.int32 and sf.shape == (2, 256, 512 // 128) and sf.stride() == (4 * 256, 1, 256)
    if mode is not None:
        l1, _ = dg_mega.transform_weights_for_mega_moe(
            (ref_data, nm.pack_ue8m0_mn_major(nm.ue8m0_exponent(torch.stack(ref_sf)))),
            (ref_data, nm.pack_ue8m0_mn_major(nm.ue8m0_exponent(torch.stack(ref_sf)))),
            mma_type="mxf4xmxf4" if mode == "gran16_packed" else "fp8xfp4",
        )
        assert torch.equal(l1[0].view(torch.uint8), data.view(torch.uint8))
        assert torch.equal(l1[1], sf)


def test_fp8_block_weights_match_per_block_cast() -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(2, 384, 256, generator=gen)
    data, sf, deq = nm.encode_fp8_block_weights(w, "gran8")
    for e in range(2):
        ref_q, ref_sf = dgm.per_block_cast_to_fp8(w[e], use_ue8m0=False, gran_k=128)
        assert torch.equal(nm.deinterleave_gate_up(data, "gran8")[e].view(torch.uint8), ref_q.view(torch.uint8))
        assert torch.equal(sf[e], ref_sf)
    assert torch.equal(nm.decode_fp8_block_weights(data, sf, "gran8"), deq)
