"""The shapes of ``benchmarks/silu_mul_quant.py``: sizes from the model catalog, routing, layouts, and the
configuration sweeps behind ``choose_config`` (docs/triton-kernel.md)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from ..catalog import get_model

__all__ = [
    "Case",
    "CASES",
    "REFERENCE_TIMED",
    "SWEEP_CASES",
    "masked_counts",
    "floor_us",
    "needed_host_specs",
    "warm_job",
    "sweep_variants",
    "v7_config",
    "input_sets",
    "copy_bytes",
]


@dataclass(frozen=True)
class Case:
    name: str
    E: int
    N: int
    D: int
    rows: int
    routing: str = "uniform"  # uniform | skew (one expert holds half the rows)
    limit: float | None = None
    layout: str = "column_major"  # column_major | ue8m0_packed | row_major
    gs: int = 128
    swizzle: bool = False
    topk: int = 8
    phase: str = "prefill"
    model: str = ""
    ep: int = 1

    @property
    def ue8m0(self) -> bool:
        return self.layout == "ue8m0_packed"

    def jit_reason(self) -> str | None:
        """Why SGLang's DSV4 JIT kernel (or its host-side assert) rejects this case, or None."""
        G = self.D // self.gs
        if self.gs not in (32, 128):
            return f"group_size {self.gs} not in (32, 128)"
        if self.D % 256 or self.D > 8192:
            return f"D={self.D}: needs D % 256 == 0 and D <= 8192 (one thread per 8 columns)"
        if self.D // 8 < self.E:
            return f"D // 8 = {self.D // 8} < E = {self.E}"
        if self.E > 256:
            return f"E = {self.E} > 256"
        if self.N % 4 or G % 4:
            return f"N % 4 = {self.N % 4}, G % 4 = {G % 4} (host assert)"
        if self.N * self.topk < self.rows:
            return "rows > N * topk would be left unwritten"
        if self.layout == "column_major":
            return None  # compared in its native row-major fp32 layout
        return None


def _case(name: str, mid: str, ep: int, N: int, rows: int, **kw) -> Case:
    m = get_model(mid)
    return Case(name=name, E=m.experts // ep, N=N, D=m.inter, rows=rows, topk=m.topk, model=mid, ep=ep, **kw)


L10 = 10.0
CASES: list[Case] = [
    # prefill, D >= 2048
    _case("DSV4-Flash EP8 prefill", "deepseek-ai/DeepSeek-V4-Flash", 8, 2048, 8192, limit=L10),
    _case("DSV4-Flash EP8 prefill skew", "deepseek-ai/DeepSeek-V4-Flash", 8, 2048, 8192, limit=L10, routing="skew"),
    _case(
        "DSV4-Flash EP8 prefill ue8m0", "deepseek-ai/DeepSeek-V4-Flash", 8, 2048, 8192, limit=L10, layout="ue8m0_packed"
    ),
    _case(
        "DSV4-Flash EP8 prefill ue8m0 swz",
        "deepseek-ai/DeepSeek-V4-Flash",
        8,
        2048,
        8192,
        limit=L10,
        layout="ue8m0_packed",
        swizzle=True,
    ),
    _case(
        "DSV4-Flash EP8 prefill g32 ue8m0",
        "deepseek-ai/DeepSeek-V4-Flash",
        8,
        2048,
        8192,
        limit=L10,
        layout="ue8m0_packed",
        gs=32,
    ),
    _case("DSV4-Flash EP8 prefill 6k", "deepseek-ai/DeepSeek-V4-Flash", 8, 1024, 6144),
    Case("issue E=64 D=4096 limit", E=64, N=2048, D=4096, rows=16384, limit=L10, topk=8, model="(issue 4)", ep=0),
    _case("DSV3 EP8 prefill", "deepseek-ai/DeepSeek-V3", 8, 2048, 16384),
    _case("DSV3 EP8 prefill skew", "deepseek-ai/DeepSeek-V3", 8, 2048, 16384, routing="skew"),
    _case(
        "DSV4-Pro EP8 prefill ue8m0", "deepseek-ai/DeepSeek-V4-Pro", 8, 2048, 12288, limit=L10, layout="ue8m0_packed"
    ),
    _case("Kimi-K2 EP8 prefill", "moonshotai/Kimi-K2-Instruct", 8, 2048, 16384),
    _case("Mixtral EP1 prefill", "mistralai/Mixtral-8x7B-v0.1", 1, 4096, 8192),
    # prefill, D < 2048
    _case("Qwen3-235B EP4 prefill", "Qwen/Qwen3-235B-A22B", 4, 2048, 16384),
    _case("GLM-4.5 EP8 prefill", "zai-org/GLM-4.5", 8, 2048, 16384),
    _case("Qwen3.5-122B EP4 prefill", "Qwen/Qwen3.5-122B-A10B-FP8", 4, 2048, 16384),
    _case("OLMoE EP1 prefill", "allenai/OLMoE-1B-7B-0924", 1, 1024, 8192),
    _case("Qwen3-30B EP1 prefill", "Qwen/Qwen3-30B-A3B", 1, 1024, 8192),
    _case("Qwen3-30B EP1 prefill skew", "Qwen/Qwen3-30B-A3B", 1, 1024, 8192, routing="skew"),
    _case("Qwen3-30B EP1 prefill ue8m0", "Qwen/Qwen3-30B-A3B", 1, 1024, 8192, layout="ue8m0_packed"),
    _case("Qwen3.5-35B EP2 prefill", "Qwen/Qwen3.5-35B-A3B", 2, 1024, 8192),
    _case("Qwen3-Next EP1 prefill", "Qwen/Qwen3-Next-80B-A3B", 1, 1024, 8192),
    _case("Qwen3-Next EP1 prefill 16k", "Qwen/Qwen3-Next-80B-A3B", 1, 2048, 16384),
    # decode
    _case("DSV4-Flash EP8 decode", "deepseek-ai/DeepSeek-V4-Flash", 8, 128, 384, limit=L10, phase="decode"),
    _case(
        "DSV4-Flash EP8 decode ue8m0",
        "deepseek-ai/DeepSeek-V4-Flash",
        8,
        128,
        512,
        limit=L10,
        layout="ue8m0_packed",
        phase="decode",
    ),
    _case("DSV4-Flash EP8 decode 768", "deepseek-ai/DeepSeek-V4-Flash", 8, 128, 768, phase="decode"),
    _case("DSV3 EP8 decode", "deepseek-ai/DeepSeek-V3", 8, 128, 512, phase="decode"),
    _case(
        "DSV4-Pro EP8 decode ue8m0",
        "deepseek-ai/DeepSeek-V4-Pro",
        8,
        64,
        256,
        limit=L10,
        layout="ue8m0_packed",
        phase="decode",
    ),
    _case("Qwen3-235B EP4 decode", "Qwen/Qwen3-235B-A22B", 4, 128, 512, phase="decode"),
    _case("Qwen3-30B EP1 decode", "Qwen/Qwen3-30B-A3B", 1, 64, 512, phase="decode"),
    _case("Qwen3-30B EP1 decode 16", "Qwen/Qwen3-30B-A3B", 1, 16, 128, phase="decode"),
    _case("Qwen3-Next EP1 decode", "Qwen/Qwen3-Next-80B-A3B", 1, 32, 320, phase="decode"),
]
REFERENCE_TIMED = {"DSV4-Flash EP8 prefill", "DSV3 EP8 prefill", "Qwen3-30B EP1 prefill", "DSV4-Flash EP8 decode"}


def masked_counts(case: Case) -> torch.Tensor:
    E, N, R = case.E, case.N, case.rows
    m = torch.zeros(E, dtype=torch.int64)
    if case.routing == "skew":
        hot = min(N, R // 2)
        m[0] = hot
        rest = R - hot
        m[1:] = rest // (E - 1)
        m[1 : 1 + rest % (E - 1)] += 1
    else:
        m[:] = R // E
        m[: R % E] += 1
    if int(m.max()) > N:
        raise ValueError(f"{case.name}: {R} rows do not fit E={E} x N={N}")
    return m.to(torch.int32)


def needed_host_specs(cases: list[Case]) -> tuple[list, list]:
    from ..ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape
    from .sglang_kernels import plugin_specs

    dsv4, ptgq = set(), set()
    for c in cases:
        want_dsv4, want_ptgq = plugin_specs(
            SiluMulQuantShape(c.E, c.N, c.D, c.gs, c.topk),
            SiluMulQuantConfig(swiglu_limit=c.limit, swizzle=c.swizzle, scale_layout=c.layout),  # type: ignore[arg-type]  # a layout name
        )
        if c.jit_reason() is None:
            dsv4.add(want_dsv4)
        if not c.swizzle:
            ptgq.add(want_ptgq)
    return sorted(dsv4), sorted(ptgq, key=str)


def floor_us(case: Case, rows: int, bw: float) -> float:
    G = case.D // case.gs
    scale_bytes = G if case.ue8m0 else 4 * G
    return rows * (4 * case.D + case.D + scale_bytes) / bw * 1e6


def input_sets(case: Case, floor: float, bw: float, l2_bytes: int) -> int:
    """How many input sets a timing rotates over: their real bytes (``floor`` us at ``bw``) exceed the L2
    three times, at most 32 sets and 24 GiB of padded inputs."""
    real_bytes = max(1.0, floor * 1e-6 * bw)
    padded = case.E * case.N * case.D * 5
    return int(min(32, max(1, math.ceil(3 * l2_bytes / real_bytes)), max(1, (24 << 30) // max(1, padded))))


def copy_bytes(case: Case, rows: int) -> int:
    """Bytes each side of the same-bytes copy moves: half the case's exact real-row bytes, rounded down to
    4 KiB (a copy of an odd byte count ran at 0.55-0.62 of the ceiling on the H200, aligned ones at
    0.71-1.00), at least 4 KiB."""
    G = case.D // case.gs
    exact = rows * (5 * case.D + (G if case.ue8m0 else 4 * G))
    return max(4096, exact // 2 // 4096 * 4096)


def v7_config(case: Case) -> dict:
    """The launch configuration of kernel v7 (the ``choose_config`` of 2026-11-30 to 2026-12-01): the benchmark's
    "before" column. 2048-element items on 4 warps for every N; 4 programs per SM at decode sizes, two
    waves of up to 16 for E <= 64, one wave of up to 8 beyond."""
    from ..plugins.triton_smq.tuning import KernelConfig, choose_block_c, row_bound

    block_c = choose_block_c(case.D, case.gs)
    ctas, waves = (4, 1) if row_bound(case.E, case.N, case.topk) <= 2048 else (16, 2) if case.E <= 64 else (8, 1)
    return asdict(
        KernelConfig(block_m=max(1, 2048 // block_c), block_c=block_c, num_warps=4, ctas_per_sm=ctas, waves=waves)
    )


def warm_job(case: Case, kcfg: dict | None = None, pdl: bool = True) -> tuple:
    from ..plugins.triton_smq.tuning import choose_config
    from ..quant import round_to_bf16

    limit = None if case.limit is None else round_to_bf16(case.limit)
    if kcfg is None:  # the configuration the plugin will pick for this case (it depends on N)
        kcfg = asdict(choose_config(case.E, case.N, case.D, case.gs, case.topk))
    return (case.E, case.D, case.gs, limit, case.swizzle, case.ue8m0, tuple(sorted(kcfg.items())), pdl)


#: Shapes of the configuration sweeps behind choose_config (docs/triton-kernel.md): the v2 sweep used
#: the first seven, the v3 sweep the last four.
SWEEP_CASES = [
    "DSV3 EP8 prefill",
    "DSV4-Pro EP8 prefill ue8m0",
    "Qwen3-235B EP4 prefill",
    "Qwen3-30B EP1 prefill",
    "Qwen3-Next EP1 prefill",
    "DSV4-Flash EP8 decode",
    "Qwen3.5-35B EP2 prefill",
    "Qwen3-Next EP1 decode",
    "Qwen3-30B EP1 decode",
    "issue E=64 D=4096 limit",
    "Kimi-K2 EP8 prefill",
    "Mixtral EP1 prefill",
    "DSV4-Flash EP8 decode 768",
]


def sweep_variants(case: Case, sweep_set: str = "1") -> list[dict]:
    from ..plugins.triton_smq.tuning import choose_config

    base = choose_config(case.E, case.N, case.D, case.gs, case.topk)
    out = []
    if sweep_set == "3":  # session 3: the shapes where triton trailed SGLang's kernel; prefetch, tiles, waves
        cfgs = [asdict(base), dict(asdict(base), prefetch=True)]
        for bc in sorted({base.block_c, max(case.gs, base.block_c // 2), min(1024, base.block_c * 2)}):
            for elems, warps in ((2048, 4), (4096, 8)):
                for prefetch in (False, True):
                    for waves in (1, 2):
                        cfg = dict(
                            block_m=max(1, elems // bc),
                            block_c=bc,
                            num_warps=warps,
                            ctas_per_sm=16,
                            prefetch=prefetch,
                            max_registers=None,
                            waves=waves,
                        )
                        if cfg not in cfgs:
                            cfgs.append(cfg)
        return cfgs
    if sweep_set == "2":  # register caps and waves (session 2, after the occupancy-capped grid)
        bc = base.block_c
        for elems, warps in ((2048, 4), (4096, 8)):
            bm = max(1, elems // bc)
            for prefetch in (False, True):
                for regs in (None, 32, 40):
                    for waves in (1, 2):
                        if prefetch and waves == 2:
                            continue
                        out.append(
                            dict(
                                block_m=bm,
                                block_c=bc,
                                num_warps=warps,
                                ctas_per_sm=16,
                                prefetch=prefetch,
                                max_registers=regs,
                                waves=waves,
                            )
                        )
        return out
    for elems, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8)):
        for prefetch in (False, True):
            bc = base.block_c
            bm = max(1, min(elems // bc, 1 << max(0, case.N - 1).bit_length()))
            for ctas in (2, 4, 8, 16):
                out.append(dict(block_m=bm, block_c=bc, num_warps=warps, ctas_per_sm=ctas, prefetch=prefetch))
    return out
