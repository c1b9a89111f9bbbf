"""Shared by tests/test_fuzz.py (CPU) and tests/gpu/test_fuzz_cuda.py: profiles and case strategies.

Profiles (environment variable ``MOE_FUZZ_PROFILE``): ``ci`` (default; derandomized, a few hundred
cases) and ``long`` (10,000 silu_mul_quant cases per plugin; seed from ``MOE_FUZZ_SEED``).
``MOE_FUZZ_EXAMPLES`` / ``MOE_FUZZ_MEGA_EXAMPLES`` override the counts.
"""

from __future__ import annotations

import os
import random

import torch

from sglang_moe_plugins.ops import silu_mul_quant as smq

try:
    from hypothesis import HealthCheck, seed, settings, strategies as st
except ImportError:  # e.g. the GPU machine's image: tests/gpu/test_fuzz_cuda.py then uses draw_case()
    st = None
HAVE_HYPOTHESIS = st is not None

__all__ = [
    "PROFILE",
    "SEED",
    "SMQ_EXAMPLES",
    "MEGA_EXAMPLES",
    "HAVE_HYPOTHESIS",
    "fuzz_settings",
    "seeded",
    "smq_calls",
    "draw_case",
    "COMPACT_GROUPS",
    "make_masked",
    "make_gateup",
    "independent_real_rows",
    "describe_case",
    "check_smq_case",
]

PROFILE = os.environ.get("MOE_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"MOE_FUZZ_PROFILE={PROFILE!r}: use 'ci' or 'long'")
SMQ_EXAMPLES = int(os.environ.get("MOE_FUZZ_EXAMPLES", 200 if PROFILE == "ci" else 10_000))
MEGA_EXAMPLES = int(os.environ.get("MOE_FUZZ_MEGA_EXAMPLES", 10 if PROFILE == "ci" else 1000))
SEED = os.environ.get("MOE_FUZZ_SEED")


if HAVE_HYPOTHESIS:

    def fuzz_settings(examples: int):
        return settings(
            max_examples=examples,
            deadline=None,
            derandomize=PROFILE == "ci" and SEED is None,
            database=None,
            print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )

    def seeded(fn):
        return seed(int(SEED))(fn) if SEED is not None else fn

    @st.composite
    def smq_calls(draw):
        group = draw(st.sampled_from(smq.GROUP_SIZES))
        groups = draw(st.integers(1, max(1, 1536 // group)))
        e = draw(st.integers(0, 10))
        n = draw(st.integers(0, 20))
        limit = draw(
            st.one_of(
                st.none(),
                st.sampled_from([10.0, 7.0, 1.0, 0.5]),
                st.floats(1e-3, 1e4, allow_nan=False, allow_infinity=False),  # mostly not exact in bf16
            )
        )
        # Routing: counts per expert, sometimes outside [0, N] (the op clamps them).
        routing = draw(st.sampled_from(["random", "full", "empty", "one_hot", "out_of_range"]))
        values = draw(st.sampled_from(["row_binades", "element_binades", "tiny", "sparse", "wide"]))
        return dict(
            e=e,
            n=n,
            d=groups * group,
            group=group,
            topk=draw(st.integers(1, 8)),
            limit=limit,
            swizzle=draw(st.booleans()),
            layout=draw(st.sampled_from(smq.SCALE_LAYOUTS)),
            keep_fp32=draw(st.booleans()),
            routing=routing,
            values=values,
            seed=draw(st.integers(0, 2**31 - 1)),
        )


#: Group counts of the GPU machine's long run: every hidden size compiles its own Triton kernel (2-3 s
#: each), so that run draws D = groups * group_size from these (up to 40 hidden sizes, 1 to 12 groups,
#: odd and even counts, D from 16 to 3072) instead of every multiple of the group size up to 1536.
COMPACT_GROUPS = (1, 2, 3, 4, 5, 7, 8, 12)


def draw_case(rng: random.Random, compact: bool = False) -> dict:
    """One case like :func:`smq_calls` draws, from a plain ``random.Random`` (no hypothesis needed);
    ``compact`` draws the group count from :data:`COMPACT_GROUPS`."""
    group = rng.choice(smq.GROUP_SIZES)
    groups = rng.choice(COMPACT_GROUPS) if compact else rng.randint(1, max(1, 1536 // group))
    kind = rng.randrange(3)
    limit = None if kind == 0 else (rng.choice([10.0, 7.0, 1.0, 0.5]) if kind == 1 else rng.uniform(1e-3, 1e4))
    return dict(
        e=rng.randint(0, 10),
        n=rng.randint(0, 20),
        d=groups * group,
        group=group,
        topk=rng.randint(1, 8),
        limit=limit,
        swizzle=rng.random() < 0.5,
        layout=rng.choice(smq.SCALE_LAYOUTS),
        keep_fp32=rng.random() < 0.5,
        routing=rng.choice(["random", "full", "empty", "one_hot", "out_of_range"]),
        values=rng.choice(["row_binades", "element_binades", "tiny", "sparse", "wide"]),
        seed=rng.randrange(2**31),
    )


def make_masked(case, gen) -> torch.Tensor:
    e, n = case["e"], case["n"]
    kind = case["routing"]
    if kind == "full":
        return torch.full((e,), n, dtype=torch.int32)
    if kind == "empty":
        return torch.zeros(e, dtype=torch.int32)
    if kind == "one_hot":
        m = torch.zeros(e, dtype=torch.int32)
        if e:
            m[int(torch.randint(0, e, (1,), generator=gen))] = n
        return m
    if kind == "out_of_range":
        return torch.randint(-5, n + 6, (e,), generator=gen, dtype=torch.int32)
    return torch.randint(0, n + 1, (e,), generator=gen, dtype=torch.int32)


def make_gateup(case, gen) -> torch.Tensor:
    e, n, two_d = case["e"], case["n"], 2 * case["d"]
    x = torch.randn(e, n, two_d, generator=gen, dtype=torch.float64)
    kind = case["values"]
    if kind == "row_binades":  # the conformance suite's distribution
        x *= torch.exp2(torch.randint(-8, 6, (e, n, 1), generator=gen).double())
    elif kind == "element_binades":
        x *= torch.exp2(torch.randint(-40, 41, (e, n, two_d), generator=gen).double())
    elif kind == "tiny":  # absmax below the 1e-10 floor
        x *= 2.0**-45
    elif kind == "sparse":  # mostly zeros: whole zero groups, lone values
        x *= (torch.rand(e, n, two_d, generator=gen, dtype=torch.float64) < 0.05).double() * 4
    else:  # wide: |x| up to 2**62, so products stay below FLT_MAX (overflow is a bad-input row)
        x *= torch.exp2(torch.randint(-60, 61, (e, n, 1), generator=gen).double())
        x = x.clamp(-(2.0**62), 2.0**62)
    return x.to(torch.bfloat16)


def independent_real_rows(masked: torch.Tensor, n: int) -> torch.Tensor:
    counts = [min(max(int(c), 0), n) for c in masked.tolist()]
    return torch.tensor([[r < c for r in range(n)] for c in counts], dtype=torch.bool).reshape(len(counts), n)


def describe_case(
    case: dict, gateup: torch.Tensor, masked: torch.Tensor
) -> tuple[smq.SiluMulQuantShape, smq.SiluMulQuantConfig]:
    """The ``(shape, config)`` of a case's call on these inputs."""
    return smq.describe(
        gateup,
        masked,
        group_size=case["group"],
        topk=case["topk"],
        swiglu_limit=case["limit"],
        swizzle=case["swizzle"],
        scale_layout=case["layout"],
        keep_fp32=case["keep_fp32"],
    )


def check_smq_case(plugin, case: dict, device: torch.device, stats, worst: dict, note=lambda message: None) -> None:
    """One fuzz case through ``plugin`` (forced: no fallback hides a failure) on ``device``: inputs with
    NaN padding rows, outputs poisoned first, layout validated, every real row written, values within the
    tolerance policy of an fp64 computation. Tallies go to ``stats`` (a Counter) and ``worst``."""
    from sglang_moe_plugins import Registry, Selector
    from sglang_moe_plugins.config import parse_config
    from sglang_moe_plugins.testing.case import poison
    from sglang_moe_plugins.testing.ops.silu_mul_quant import EXACT, compare_with_fp64, tolerance_for

    gen = torch.Generator().manual_seed(case["seed"])
    gateup = make_gateup(case, gen)
    masked = make_masked(case, gen)
    real = independent_real_rows(masked, case["n"])
    if gateup.numel():
        gateup[~real] = float("nan")  # padding rows hold garbage; it must never reach a real row
    gateup, masked = gateup.to(device), masked.to(device)
    shape, config = describe_case(case, gateup, masked)
    support = plugin.supports(shape, config)
    if not support:
        stats[f"{plugin.name}: unsupported"] += 1
        note(f"unsupported: {support.reason}")
        return
    inputs = smq.SiluMulQuantInputs(gateup, masked)
    outputs = smq.allocate_outputs(shape, config, gateup.device)
    poison(outputs)
    selector = Selector(Registry.from_plugins([plugin], parse_config({"force": {smq.OP: plugin.name}})))
    result = selector.dispatch(smq.OP, inputs, shape, config, outputs=outputs)  # forced: any failure raises
    if gateup.device.type == "cuda":
        torch.cuda.synchronize()
    smq.validate_outputs(result, shape, config, plugin.name)
    if real.any():
        assert not torch.isnan(result.out.float().cpu()[real]).any(), "a real row was not written"
    # the reference is IEEE: no fast-exp allowance; the others get the op's policy for this config
    tolerance = EXACT if plugin.name == "reference" else tolerance_for(config)
    verdict = compare_with_fp64(inputs, result, shape, config, tolerance)
    assert verdict.ok, verdict.message
    stats[f"{plugin.name}: checked"] += 1
    stats[f"{plugin.name}: real rows"] += int(real.sum())
    worst[plugin.name] = max(worst.get(plugin.name, 0.0), verdict.worst_value_ratio)
    if verdict.worst_scale_error and not config.scale_ue8m0:
        key = f"{plugin.name} fp32 scale rel err"
        worst[key] = max(worst.get(key, 0.0), verdict.worst_scale_error)
