"""The tolerance policy for silu_mul_quant, checked against an independent fp64 computation."""

from __future__ import annotations

import torch

from sglang_moe_plugins.ops import silu_mul_quant as smq

__all__ = ["fp64_expected", "check_against_fp64", "poison", "POISON_FP8"]

POISON_FP8 = 0x7F  # NaN in float8_e4m3fn


def fp64_expected(gateup: torch.Tensor, swizzle: bool, limit: float | None, group: int, ue8m0: bool):
    """Values ``[..., D]`` and scales ``[..., G]`` in fp64, computed independently of the package."""
    x = gateup.double()
    d = x.shape[-1] // 2
    if swizzle:
        chunks = x.reshape(*x.shape[:-1], d // 8, 2, 8)
        gate, up = chunks[..., 0, :].reshape(*x.shape[:-1], d), chunks[..., 1, :].reshape(*x.shape[:-1], d)
    else:
        gate, up = x[..., :d], x[..., d:]
    if limit is not None:  # bf16 inputs and a bf16-exact limit: clamping in fp64 is the same
        gate = torch.minimum(gate, torch.tensor(limit, dtype=torch.float64))
        up = up.clamp(-limit, limit)
    v = gate * torch.sigmoid(gate) * up
    grouped = v.reshape(*v.shape[:-1], d // group, group)
    scale = grouped.abs().amax(-1).clamp_min(1e-10) / 448.0
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return v, scale


def poison(outputs: smq.SiluMulQuantOutputs) -> None:
    outputs.out.view(torch.uint8).fill_(POISON_FP8)
    if outputs.scale.dtype == torch.int32:
        outputs.scale.fill_(-1)
    else:
        outputs.scale.fill_(float("nan"))


def check_against_fp64(inputs, outputs, shape, config, *, scale_rtol: float = 1e-6, value_slack: float = 1.0) -> None:
    """Every real row written; scales exact (UE8M0) or within ``scale_rtol``; each fp8 value within half
    an fp8 step (times ``value_slack``) of the fp64 value."""
    real = smq.real_rows(inputs.masked_m.cpu(), shape.max_rows)
    out = smq.SiluMulQuantOutputs(outputs.out.cpu(), outputs.scale.cpu())
    v, scale64 = fp64_expected(inputs.gateup.cpu(), config.swizzle, config.swiglu_limit, shape.group_size, config.scale_ue8m0)
    got_scale = smq.scale_to_float(out.scale, shape, config)
    assert not torch.isnan(out.out[real].float()).any(), "a real row was not written"
    assert not torch.isnan(got_scale[real]).any(), "a real row's scale was not written"
    if config.scale_ue8m0:
        assert torch.equal(got_scale[real].double(), scale64[real]), "UE8M0 scales differ"
    else:
        torch.testing.assert_close(got_scale[real].double(), scale64[real], rtol=scale_rtol, atol=0)
    deq = smq.dequantize(out, shape, config)[real].double()
    s = got_scale[real].double().repeat_interleave(shape.group_size, dim=-1)
    err = (deq - v[real]).abs()
    bound = (torch.maximum(v[real].abs() * 2.0**-4, s * 2.0**-10) * (1 + 1e-5) + 1e-30) * value_slack
    assert (err <= bound).all(), f"fp8 value off by {(err / bound).max().item():.3f} x the bound"
