"""Issue 7.1: bad input. Each row of docs/reliability.md ("Bad input") is one test (or one parametrized case).

Invalid arguments raise InvalidArgumentError naming the argument, the value and what is allowed, before
any plugin runs. Data that cannot be checked without a host sync (masked_m contents, NaN / Inf / huge
values) gives the defined result the op documents, and the reference implements it.
"""

from __future__ import annotations

import math

import pytest
import torch
from numerics import POISON_FP8, check_against_fp64, poison

from sglang_moe_plugins import InvalidArgumentError, Registry, Selector, UserConfig
from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import ReferencePlugin
from sglang_moe_plugins.quant import FP32_MAX

E, N, D, GS = 3, 5, 256, 128
NAN, INF = float("nan"), float("inf")


def _gateup(e=E, n=N, d=D, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(e, n, 2 * d, generator=gen) * 2).to(torch.bfloat16)


def _masked(values):
    return torch.tensor(values, dtype=torch.int32)


def _args(**override):
    args = dict(
        gateup=_gateup(),
        masked_m=_masked([5, 0, 3]),
        group_size=GS,
        topk=2,
        swiglu_limit=None,
        swizzle=False,
        scale_layout="column_major",
        keep_fp32=False,
    )
    args.update(override)
    return args


def _describe(**override):
    args = _args(**override)
    return smq.describe(args.pop("gateup"), args.pop("masked_m"), **args)


def _reference_selector() -> Selector:
    return Selector(Registry.from_plugins([ReferencePlugin()], UserConfig()))


def _run(gateup, masked, *, group=GS, limit=None, layout="row_major", swizzle=False):
    """Reference through a real Selector.dispatch, outputs poisoned first; returns (inputs, outputs, shape, config)."""
    shape, config = smq.describe(
        gateup, masked, group_size=group, topk=1, swiglu_limit=limit, scale_layout=layout, swizzle=swizzle
    )
    inputs = smq.SiluMulQuantInputs(gateup, masked)
    outputs = smq.allocate_outputs(shape, config, gateup.device)
    poison(outputs)
    result = _reference_selector().dispatch(smq.OP, inputs, shape, config, outputs=outputs)
    assert result is outputs
    return inputs, outputs, shape, config


def _strided_view(t: torch.Tensor, step: int) -> torch.Tensor:
    big = torch.zeros(*t.shape[:-1], t.shape[-1] * step, dtype=t.dtype)
    view = big[..., ::step]
    view.copy_(t)
    return view


# -- invalid arguments: InvalidArgumentError naming the argument ------------------------------------
INVALID = [
    # (id, override builder, argument named in the error)
    ("gateup-not-a-tensor", lambda: {"gateup": _gateup().float().numpy()}, "gateup"),
    ("gateup-list", lambda: {"gateup": [[1.0]]}, "gateup"),
    ("gateup-dtype-fp16", lambda: {"gateup": _gateup().half()}, "gateup.dtype"),
    ("gateup-dtype-fp32", lambda: {"gateup": _gateup().float()}, "gateup.dtype"),
    ("gateup-dtype-fp8", lambda: {"gateup": _gateup().to(torch.float8_e4m3fn)}, "gateup.dtype"),
    ("gateup-rank-2", lambda: {"gateup": _gateup()[0]}, "gateup.shape"),
    ("gateup-rank-4", lambda: {"gateup": _gateup().unsqueeze(0)}, "gateup.shape"),
    ("gateup-odd-last-dim", lambda: {"gateup": _gateup()[..., :-1].contiguous()}, "gateup.shape[2]"),
    ("gateup-empty-last-dim", lambda: {"gateup": torch.empty(E, N, 0, dtype=torch.bfloat16)}, "gateup.shape[2]"),
    ("gateup-transposed", lambda: {"gateup": _gateup(e=N, n=E).transpose(0, 1)}, "gateup.stride()"),
    ("gateup-column-strided", lambda: {"gateup": _strided_view(_gateup(), 2)}, "gateup.stride()"),
    (
        "gateup-row-padded",
        lambda: {"gateup": torch.zeros(E, N, 4 * D, dtype=torch.bfloat16)[..., : 2 * D]},
        "gateup.stride()",
    ),
    ("gateup-expanded", lambda: {"gateup": _gateup(e=1).expand(E, N, 2 * D)}, "gateup.stride()"),
    ("D-not-multiple-of-group", lambda: {"gateup": _gateup(d=192)}, "gateup.shape[2] // 2 (D)"),
    ("group-size-8", lambda: {"group_size": 8}, "group_size"),
    ("group-size-100", lambda: {"group_size": 100}, "group_size"),
    ("group-size-512", lambda: {"group_size": 512, "gateup": _gateup(d=512)}, "group_size"),
    ("group-size-float", lambda: {"group_size": 128.0}, "group_size"),
    ("group-size-bool", lambda: {"group_size": True}, "group_size"),
    ("group-size-str", lambda: {"group_size": "128"}, "group_size"),
    ("topk-0", lambda: {"topk": 0}, "topk"),
    ("topk-negative", lambda: {"topk": -2}, "topk"),
    ("topk-float", lambda: {"topk": 2.0}, "topk"),
    ("topk-bool", lambda: {"topk": True}, "topk"),
    ("masked-m-list", lambda: {"masked_m": [5, 0, 3]}, "masked_m"),
    ("masked-m-int64", lambda: {"masked_m": _masked([5, 0, 3]).long()}, "masked_m.dtype"),
    ("masked-m-float", lambda: {"masked_m": _masked([5, 0, 3]).float()}, "masked_m.dtype"),
    ("masked-m-bool", lambda: {"masked_m": _masked([1, 0, 1]).bool()}, "masked_m.dtype"),
    ("masked-m-too-long", lambda: {"masked_m": _masked([5, 0, 3, 1])}, "masked_m.shape"),
    ("masked-m-too-short", lambda: {"masked_m": _masked([5, 0])}, "masked_m.shape"),
    ("masked-m-rank-2", lambda: {"masked_m": _masked([[5], [0], [3]])}, "masked_m.shape"),
    ("masked-m-scalar", lambda: {"masked_m": torch.tensor(5, dtype=torch.int32)}, "masked_m.shape"),
    ("masked-m-strided", lambda: {"masked_m": _masked([5, 9, 0, 9, 3, 9])[::2]}, "masked_m.stride()"),
    (
        "masked-m-other-device",
        lambda: {"masked_m": torch.empty(E, dtype=torch.int32, device="meta")},
        "masked_m.device",
    ),
    ("swiglu-limit-zero", lambda: {"swiglu_limit": 0.0}, "swiglu_limit"),
    ("swiglu-limit-negative", lambda: {"swiglu_limit": -10.0}, "swiglu_limit"),
    ("swiglu-limit-nan", lambda: {"swiglu_limit": NAN}, "swiglu_limit"),
    ("swiglu-limit-inf", lambda: {"swiglu_limit": INF}, "swiglu_limit"),
    ("swiglu-limit-bool", lambda: {"swiglu_limit": True}, "swiglu_limit"),
    ("swiglu-limit-str", lambda: {"swiglu_limit": "10"}, "swiglu_limit"),
    ("swiglu-limit-int-overflows-float", lambda: {"swiglu_limit": 10**400}, "swiglu_limit"),
    ("swiglu-limit-below-bf16-normal", lambda: {"swiglu_limit": 2.0**-127}, "swiglu_limit"),
    ("swiglu-limit-bf16-subnormal-min", lambda: {"swiglu_limit": 2.0**-133}, "swiglu_limit"),
    ("scale-layout-unknown", lambda: {"scale_layout": "col_major"}, "scale_layout"),
    ("swizzle-str", lambda: {"swizzle": "no"}, "swizzle"),
    ("swizzle-none", lambda: {"swizzle": None}, "swizzle"),
    ("swizzle-2", lambda: {"swizzle": 2}, "swizzle"),
    ("keep-fp32-str", lambda: {"keep_fp32": "yes"}, "keep_fp32"),
]


@pytest.mark.parametrize("override, argument", [pytest.param(o, a, id=i) for i, o, a in INVALID])
def test_invalid_argument_names_it(override, argument):
    with pytest.raises(InvalidArgumentError) as info:
        _describe(**override())
    err = info.value
    assert err.op == smq.OP and err.argument == argument
    assert f"invalid argument {argument}=" in str(err) and "; allowed: " in str(err)


def test_invalid_argument_through_public_api_runs_nothing(caplog):
    """api.silu_mul_quant validates before selecting: no plugin runs, no selection is cached."""
    from sglang_moe_plugins import api

    selector = api.get_selector()
    before = selector.cache_info()
    with pytest.raises(InvalidArgumentError, match=r"gateup.dtype=torch.float16"):
        api.silu_mul_quant(_gateup().half(), _masked([5, 0, 3]))
    assert api.get_selector().cache_info() == before


def test_valid_flags_still_accepted():
    """The new checks of swizzle/keep_fp32 accept bools and 0/1, as before."""
    for flag in (True, False, 0, 1):
        _describe(swizzle=flag, keep_fp32=flag)


def test_wrong_outputs_given_to_dispatch_are_the_callers_error():
    """Outputs passed by the caller are checked before any plugin runs; no plugin is marked failed."""
    shape, config = _describe(scale_layout="column_major")
    inputs = smq.SiluMulQuantInputs(_gateup(), _masked([5, 0, 3]))
    good = smq.allocate_outputs(shape, config, torch.device("cpu"))
    selector = _reference_selector()
    for wrong in (
        smq.SiluMulQuantOutputs(good.out[:, :-1], good.scale),  # out.shape
        smq.SiluMulQuantOutputs(good.out, good.scale.contiguous()),  # scale strides (row-major given)
        smq.SiluMulQuantOutputs(good.out.view(torch.uint8), good.scale),  # out.dtype
    ):
        with pytest.raises(InvalidArgumentError) as info:
            selector.dispatch(smq.OP, inputs, shape, config, outputs=wrong)
        assert info.value.argument == "outputs"
    assert selector.failed_plugins() == {}
    assert selector.explain(smq.OP, shape, config).chosen.name == "reference"


# -- sizes at the edge: defined results ------------------------------------------------------------
def test_zero_experts_gives_empty_outputs():
    from sglang_moe_plugins import api

    out, scale = api.silu_mul_quant(torch.empty(0, N, 2 * D, dtype=torch.bfloat16), torch.empty(0, dtype=torch.int32))
    assert out.shape == (0, N, D) and out.dtype == torch.float8_e4m3fn
    assert scale.shape == (0, N, D // GS) and scale.dtype == torch.float32


def test_zero_rows_gives_empty_outputs():
    _, outputs, _shape, _ = _run(torch.empty(E, 0, 2 * D, dtype=torch.bfloat16), _masked([0, 0, 0]))
    assert outputs.out.shape == (E, 0, D) and outputs.scale.shape == (E, 0, D // GS)
    # masked_m > N = 0 is clamped to 0 rows: still nothing to write, nothing out of bounds.
    _, outputs, _, _ = _run(torch.empty(E, 0, 2 * D, dtype=torch.bfloat16), _masked([4, 0, 7]), layout="ue8m0_packed")
    assert outputs.out.numel() == 0


def test_all_experts_empty_writes_nothing():
    _, outputs, _, _ = _run(_gateup(), _masked([0, 0, 0]))
    assert (outputs.out.view(torch.uint8) == POISON_FP8).all()
    assert torch.isnan(outputs.scale).all()


# -- masked_m contents: clamped to [0, N] --------------------------------------------------------------
@pytest.mark.parametrize(
    "given, clamped",
    [
        pytest.param([N + 1, 2, 0], [N, 2, 0], id="above-N"),
        pytest.param([2**31 - 1, 1, 3], [N, 1, 3], id="int32-max"),
        pytest.param([-1, 2, 3], [0, 2, 3], id="negative"),
        pytest.param([-(2**31), N, -7], [0, N, 0], id="int32-min"),
    ],
)
@pytest.mark.parametrize("layout", smq.SCALE_LAYOUTS)
def test_masked_m_is_clamped_to_0_N(given, clamped, layout):
    gateup = _gateup()
    _, got, _, _ = _run(gateup, _masked(given), layout=layout)
    inputs, want, shape, config = _run(gateup, _masked(clamped), layout=layout)
    assert torch.equal(got.out.view(torch.uint8), want.out.view(torch.uint8))
    assert torch.equal(got.scale.view(torch.int32), want.scale.view(torch.int32))
    check_against_fp64(inputs, got, shape, config)


# -- non-finite and huge values ----------------------------------------------------------------------
def _one_group(gate_values, up_values, limit=None, layout="row_major"):
    """A single row of one 16-wide group; returns (fp32 values dequantized per element, scale, fp8 raw)."""
    g = torch.ones(16)
    u = torch.ones(16)
    for i, v in gate_values.items():
        g[i] = v
    for i, v in up_values.items():
        u[i] = v
    gateup = torch.cat([g, u]).reshape(1, 1, 32).to(torch.bfloat16)
    _, outputs, shape, config = _run(gateup, _masked([1]), group=16, limit=limit, layout=layout)
    scale = smq.scale_to_float(outputs.scale, shape, config)[0, 0, 0].item()
    return outputs.out.float()[0, 0], scale


SILU1 = 1.0 / (1.0 + math.exp(-1.0))  # silu(1) * 1: the value of an untouched element


@pytest.mark.parametrize("layout", ["row_major", "ue8m0_packed"])
def test_nan_stays_in_its_element(layout):
    q, scale = _one_group({0: NAN}, {1: NAN}, layout=layout)
    assert torch.isnan(q[:2]).all()
    assert not torch.isnan(q[2:]).any()
    assert math.isfinite(scale) and scale > 0
    expected = SILU1 / 448 if layout == "row_major" else 2.0 ** math.ceil(math.log2(SILU1 / 448))
    assert scale == pytest.approx(expected, rel=1e-6)  # the group's scale comes from the finite values


def test_nan_with_swiglu_limit_is_not_clamped_away():
    q, _ = _one_group({0: NAN}, {1: NAN}, limit=10.0)
    assert torch.isnan(q[:2]).all() and not torch.isnan(q[2:]).any()


def test_inf_saturates_and_gives_nan_only_where_ieee_does():
    # gate=+Inf, up=1 -> +Inf -> +448; up=-Inf with gate=1 -> -Inf -> -448;
    # gate=-Inf -> -Inf * sigmoid(-Inf) = NaN; gate=0, up=+Inf -> 0 * Inf = NaN.
    q, scale = _one_group({0: INF, 2: -INF, 3: 0.0}, {1: -INF, 3: INF})
    assert q[0].item() == 448.0 and q[1].item() == -448.0
    assert torch.isnan(q[2]) and torch.isnan(q[3])
    assert scale == pytest.approx(FP32_MAX / 448, rel=1e-6)
    assert (q[4:] == 0).all()  # finite values are negligible next to FLT_MAX


def test_inf_with_swiglu_limit_is_clamped_to_finite():
    q, scale = _one_group({0: INF}, {1: INF, 2: -INF}, limit=10.0)
    assert not torch.isnan(q).any()
    assert q.abs().max().item() == 448.0
    assert math.isfinite(scale)


@pytest.mark.parametrize("layout", smq.SCALE_LAYOUTS)
def test_huge_finite_input_saturates_never_nan(layout):
    """bf16's largest values: products overflow fp32, the result saturates, no NaN, finite scales."""
    big = torch.finfo(torch.bfloat16).max
    gen = torch.Generator().manual_seed(1)
    sign = torch.where(torch.rand(E, N, 2 * D, generator=gen) < 0.5, -1.0, 1.0)
    gateup = (sign * big * torch.rand(E, N, 2 * D, generator=gen).clamp_min(0.5)).to(torch.bfloat16)
    assert torch.isfinite(gateup.float()).all()
    _, outputs, shape, config = _run(gateup, _masked([N, 2, 1]), layout=layout)
    real = smq.real_rows(_masked([N, 2, 1]), N)
    q = outputs.out.float()[real]
    scales = smq.scale_to_float(outputs.scale, shape, config)[real]
    assert not torch.isnan(q).any() and q.abs().max().item() <= 448.0
    assert torch.isfinite(scales).all() and (scales > 0).all()
    assert (q.abs() == 448.0).any()  # overflowed products saturate


def test_overflow_of_one_product_saturates_that_element():
    q, scale = _one_group({0: 3e38}, {0: 3e38})
    assert q[0].item() == 448.0 and not torch.isnan(q).any()
    assert scale == pytest.approx(FP32_MAX / 448, rel=1e-6)


def test_all_zero_group_uses_the_absmax_floor():
    q, scale = _one_group(dict.fromkeys(range(16), 0.0), {})
    assert (q == 0).all() and scale == pytest.approx(1e-10 / 448, rel=1e-6)


def test_nan_in_padding_rows_is_never_read():
    gateup = _gateup()
    dirty = gateup.clone()
    dirty[0, 4:] = NAN
    dirty[1] = INF
    dirty[2, 3:] = NAN
    masked = _masked([4, 0, 3])
    _, clean_out, _, _ = _run(gateup, masked)
    inputs, dirty_out, shape, config = _run(dirty, masked)
    real = smq.real_rows(masked, N)
    assert torch.equal(clean_out.out.view(torch.uint8)[real], dirty_out.out.view(torch.uint8)[real])
    check_against_fp64(inputs, dirty_out, shape, config)


def test_misaligned_gateup_is_accepted():
    """A contiguous view at an odd storage offset (not 16-byte aligned) is valid input."""
    gateup = _gateup()
    flat = torch.empty(gateup.numel() + 1, dtype=torch.bfloat16)
    view = flat[1:].view(gateup.shape)
    view.copy_(gateup)
    assert view.data_ptr() % 16 != 0
    inputs, outputs, shape, config = _run(view, _masked([5, 1, 3]))
    check_against_fp64(inputs, outputs, shape, config)


# -- op mega_moe: its describe() (owned by the mega_moe author) -------------------------------------
mm = pytest.importorskip("sglang_moe_plugins.ops.mega_moe")


def _mega(variant="fp8xfp4", **kw):
    from _mega_cases import make_problem

    kw.setdefault("tokens", 6)
    return make_problem(variant, seed=3, top_k=2, **kw)


def _mega_args(p, **override):
    x = p.inputs
    args = dict(
        hidden_states=x.hidden_states,
        topk_ids=x.topk_ids,
        topk_weights=x.topk_weights,
        l1_weights=x.l1_weights,
        l2_weights=x.l2_weights,
        variant=p.config.variant,
        num_experts=p.shape.num_experts,
        hidden_size=p.shape.hidden,
        intermediate_size=p.shape.intermediate,
        top_k=p.shape.top_k,
        max_tokens_per_rank=64,
    )
    args.update(override)
    return args


def _mega_describe(p, **override):
    args = _mega_args(p, **override)
    return mm.describe(args.pop("hidden_states"), args.pop("topk_ids"), args.pop("topk_weights"), **args)


MEGA_INVALID = [
    ("hidden-dtype-fp16", lambda p: {"hidden_states": p.inputs.hidden_states.half()}, "hidden_states.dtype"),
    ("hidden-rank-3", lambda p: {"hidden_states": p.inputs.hidden_states.unsqueeze(0)}, "hidden_states.shape"),
    ("hidden-width", lambda p: {"hidden_states": p.inputs.hidden_states[:, :256].contiguous()}, "hidden_states.shape"),
    (
        "hidden-column-strided",
        lambda p: {"hidden_states": _strided_view(p.inputs.hidden_states, 2)},
        "hidden_states.stride()",
    ),
    ("tokens-over-cap", lambda p: {"max_tokens_per_rank": 4}, "hidden_states.shape[0]"),
    ("topk-ids-float", lambda p: {"topk_ids": p.inputs.topk_ids.float()}, "topk_ids.dtype"),
    ("topk-ids-shape", lambda p: {"topk_ids": p.inputs.topk_ids[:, :1]}, "topk_ids.shape"),
    ("topk-ids-none", lambda p: {"topk_ids": None}, "topk_ids"),
    ("topk-ids-device", lambda p: {"topk_ids": p.inputs.topk_ids.to("meta")}, "topk_ids.device"),
    ("topk-weights-int", lambda p: {"topk_weights": p.inputs.topk_ids}, "topk_weights.dtype"),
    ("topk-weights-shape", lambda p: {"topk_weights": p.inputs.topk_weights[:-1]}, "topk_weights.shape"),
    (
        "l1-dtype",
        lambda p: {"l1_weights": (p.inputs.l1_weights[0].float(), p.inputs.l1_weights[1])},
        "l1_weights dtypes",
    ),
    (
        "l1-shape",
        lambda p: {"l1_weights": (p.inputs.l1_weights[0][:-1], p.inputs.l1_weights[1])},
        "l1_weights[0].shape",
    ),
    (
        "l2-format-mismatch",
        lambda p: {"l2_weights": (p.inputs.l2_weights[0].view(torch.float8_e4m3fn), p.inputs.l2_weights[1].float())},
        "l2_weights dtypes",
    ),
    ("weights-not-a-pair", lambda p: {"l1_weights": p.inputs.l1_weights[0]}, "l1_weights"),
    ("zero-experts", lambda p: {"num_experts": 0}, "num_experts"),
    ("experts-not-multiple-of-ep", lambda p: {"ep_size": 3}, "num_experts"),
    (
        "hidden-not-multiple-of-32",
        lambda p: {"hidden_size": 496, "hidden_states": torch.zeros(6, 496, dtype=torch.bfloat16)},
        "hidden_size/intermediate_size",
    ),
    ("top-k-0", lambda p: {"top_k": 0}, "top_k"),
    ("variant-unknown", lambda p: {"variant": "nvfp4xnvfp4"}, "variant"),
    ("activation-unknown", lambda p: {"activation": "gelu"}, "activation"),
    ("clamp-nan", lambda p: {"activation_clamp": NAN}, "activation_clamp"),
    ("clamp-negative", lambda p: {"activation_clamp": -1.0}, "activation_clamp"),
    ("rsf-inf", lambda p: {"routed_scaling_factor": INF}, "routed_scaling_factor"),
    ("clamp-int-overflows-float", lambda p: {"activation_clamp": 10**400}, "activation_clamp"),
    ("clamp-below-bf16-normal", lambda p: {"activation_clamp": 2.0**-127}, "activation_clamp"),
    ("rsf-int-overflows-float", lambda p: {"routed_scaling_factor": 10**400}, "routed_scaling_factor"),
]


@pytest.mark.parametrize("override, argument", [pytest.param(o, a, id=i) for i, o, a in MEGA_INVALID])
def test_mega_invalid_argument_names_it(override, argument):
    p = _mega()
    with pytest.raises(InvalidArgumentError) as info:
        _mega_describe(p, **override(p))
    assert info.value.op == "mega_moe" and info.value.argument == argument


def _mega_run(p):
    from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin

    out = mm.allocate_outputs(p.shape, p.config, p.inputs.device, num_tokens=p.inputs.num_tokens)
    out.y.fill_(NAN)
    MegaReferencePlugin().run(p.inputs, out, p.shape, p.config)
    mm.validate_outputs(out, p.shape, p.config)
    return out.y


def test_mega_zero_tokens_and_all_slots_empty():
    empty = _mega(tokens=0)
    assert _mega_run(empty).shape == (1, empty.shape.hidden)
    p = _mega()
    p.inputs.topk_ids.fill_(-1)
    assert torch.equal(_mega_run(p)[:6], torch.zeros(6, p.shape.hidden, dtype=torch.bfloat16))


def test_mega_out_of_range_expert_ids_are_ignored():
    """Data the op cannot check without a sync: ids outside [0, E) count as 'no expert' (like -1)."""
    p = _mega()
    want_ids = p.inputs.topk_ids.clone()
    p.inputs.topk_ids[0, 0] = p.shape.num_experts  # one past the end
    p.inputs.topk_ids[1, 1] = -5
    p.inputs.topk_ids[2, 0] = 2**40
    got = _mega_run(p).clone()
    want_ids[0, 0] = want_ids[1, 1] = want_ids[2, 0] = -1
    p.inputs.topk_ids.copy_(want_ids)
    assert torch.equal(got, _mega_run(p))


@pytest.mark.parametrize("variant", ["fp8xfp4", "mxf4xmxf4", "sm90_fp8"])
@pytest.mark.parametrize("value", [NAN, INF, 3e38], ids=["nan", "inf", "huge"])
def test_mega_non_finite_token_stays_in_its_row(variant, value):
    """A non-finite or huge activation changes only its own token's output row."""
    clean = _mega_run(_mega(variant, clamp=None)).clone()
    p = _mega(variant, clamp=None)
    p.inputs.hidden_states[2, 5] = value
    y = _mega_run(p)
    others = [t for t in range(6) if t != 2]
    assert torch.equal(y[others], clean[others])
    if variant != "mxf4xmxf4":
        assert torch.isnan(y[2]).all()  # FP8 variants: the row is NaN (see docs/reliability.md)
