"""The contiguous (compact) runner's activation step alone, side by side in one run on one GPU:

- ``contig_triton``: this project's Triton kernel (the plugin's prepared launch; default options, ``fast_exp``);
- ``contig_triton_exact``: the same with ``fast_exp=False`` (the reference's expf and IEEE division);
  ``contig_triton_waves4``: the default with the grid capped at 4 waves (each program walks several tiles),
  on the cases of 16384 rows and more without a limit;
- ``sglang_two_kernel``: SGLang's two-kernel branch of ``_run_contiguous_gemm`` (``silu_and_mul_clamp`` with a
  limit, else ``silu_and_mul``, into a bf16 ``[M, D]`` buffer, then the flat ``per_token_group_quant`` fp8
  kernel through ``sglang_per_token_group_quant_fp8`` with SGLang's flags);
- ``sglang_fused``: SGLang's fused ``silu_and_mul_contig_post_quant`` (``SiluAndMulContigPostQuantKernel``);
- ``copy``: a device copy moving the same bytes (read + write) as the fused step: the ceiling.

SGLang's kernels are built from the sglang 0.5.23 wheel's JIT sources (``bench/sglang_contig_kernels.py``).
Times: medians over CUDA-graph replays of back-to-back calls rotated over input/output sets larger than 3x
L2, in ``--rounds`` rounds of alternating path order, the median of the rounds (``bench/timing.py``).
Each case also records the numerics: ``contig_triton`` against ``contig_reference`` and SGLang's fused kernel,
``contig_triton_exact`` against the reference (fp8 bytes identical, scales identical / max relative difference).

Writes ``contig_activation_<device>.json`` and ``.md`` into ``--out`` (commit, device, versions, date).
Run on the GPU machine after ``source tests/gpu/gpu_env.sh``: ``python3 benchmarks/contig_activation.py --out $OUT``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_moe_plugins.bench.provenance import run_info  # noqa: E402
from sglang_moe_plugins.bench.sglang_contig_kernels import build_contig_kernels, contig_spec, output_scale  # noqa: E402
from sglang_moe_plugins.bench.sglang_kernels import ptgq_spec  # noqa: E402
from sglang_moe_plugins.bench.timing import copy_bandwidth, graph_time_us, l2_bytes, round_orders  # noqa: E402
from sglang_moe_plugins.ops import silu_mul_quant_contig as contig  # noqa: E402
from sglang_moe_plugins.plugins.contig.triton_plugin import ContigTritonPlugin  # noqa: E402
from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import silu_mul_quant_contig_reference  # noqa: E402

JIT_ROOT = ROOT / ".device/sgl_jit/sglang/kernels/jit"
PREBUILT = ROOT / ".device/sgl_prebuilt"
#: D of the catalogue at typical parallelism (data/moe_models.json): Qwen3-Next / Qwen3.5 / Laguna 512 (EP),
#: DSV3 / DSV4-Flash / Kimi-K2 2048 (EP), DSV4-Pro / Hunyuan 3072 (EP), Mixtral 14336 / TP2 = 7168, and a
#: small width (Qwen3-30B 768 / TP3 ~ 256).
HIDDEN = (256, 512, 2048, 3072, 7168)
ROWS = (128, 2048, 16384, 65536)
GROUP = 128


def plugin(**options) -> ContigTritonPlugin:
    p = ContigTritonPlugin()
    p.options = {**ContigTritonPlugin.options, **options}  # type: ignore[misc]
    return p


def gateup(M: int, D: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(M, 2 * D, device="cuda", generator=gen)
    x *= torch.exp2(torch.randint(-6, 7, (M, 2 * D), device="cuda", generator=gen).float())
    return x.to(torch.bfloat16)


def agreement(a: contig.ContigOutputs, b: contig.ContigOutputs) -> dict:
    qa, qb = a.out.view(torch.uint8), b.out.view(torch.uint8)
    res = {"fp8_same": float((qa == qb).float().mean())}
    sa, sb = a.scale, b.scale
    if sa.dtype == torch.int32:
        res["scale_same"] = float((sa == sb).float().mean())
    else:
        res["scale_same"] = float((sa == sb).float().mean())
        res["scale_max_rel"] = float(((sa - sb).abs() / sa.abs()).max())
    return res


def run_case(M: int, D: int, limit: float | None, ue8m0: bool, jit, rounds: int, gen: torch.Generator) -> dict:
    layout = "ue8m0_packed" if ue8m0 else "row_major"
    probe = torch.empty(1, 2 * D, device="cuda", dtype=torch.bfloat16)
    shape, config = contig.describe(probe, group_size=GROUP, swiglu_limit=limit, scale_layout=layout)
    moved = M * 2 * D * 2 + M * D + M * shape.num_groups * (1 if ue8m0 else 4)  # read + write of the fused step
    sets = max(1, min(64, -(-3 * l2_bytes() // moved)))
    fused_ok = not (ue8m0 and shape.num_groups % 4)  # SGLang's transposed layout requires G % 4 == 0
    xs = [gateup(M, D, gen) for _ in range(sets)]
    alloc = contig.output_allocator(shape, config)
    outs = [alloc(torch.device("cuda"), rows=M) for _ in range(sets)]
    tmp = [torch.empty(M, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    two_s = [output_scale((M, D), "cuda", GROUP, ue8m0, ue8m0, ue8m0) for _ in range(sets)]
    half = moved // 2
    src = [torch.empty(half, device="cuda", dtype=torch.uint8) for _ in range(sets)]
    dst = [torch.empty(half, device="cuda", dtype=torch.uint8) for _ in range(sets)]

    paths: dict[str, list] = {}
    default = plugin().prepare(shape, config).launch
    paths["contig_triton"] = [lambda i=i: default(xs[i], outs[i].out, outs[i].scale) for i in range(sets)]
    exact = plugin(fast_exp=False).prepare(shape, config).launch
    paths["contig_triton_exact"] = [lambda i=i: exact(xs[i], outs[i].out, outs[i].scale) for i in range(sets)]
    if limit is None:
        if M >= 16384:
            waves = plugin(waves=4).prepare(shape, config).launch
            paths["contig_triton_waves4"] = [lambda i=i: waves(xs[i], outs[i].out, outs[i].scale) for i in range(sets)]

    def two(i: int) -> None:
        if limit is not None:
            jit.silu_and_mul_clamp(xs[i], tmp[i], limit)
        else:
            jit.silu_and_mul(xs[i], tmp[i])
        jit.per_token_group_quant_fp8(
            tmp[i],
            GROUP,
            column_major_scales=ue8m0,
            scale_tma_aligned=ue8m0,
            scale_ue8m0=ue8m0,
            output_q=outs[i].out,
            output_s=two_s[i],
        )

    def fused(i: int) -> None:
        jit.silu_and_mul_contig_post_quant(
            xs[i], outs[i].out, outs[i].scale, GROUP, scale_ue8m0=ue8m0, transposed=ue8m0, swiglu_limit=limit
        )

    paths["sglang_two_kernel"] = [lambda i=i: two(i) for i in range(sets)]
    if fused_ok:
        paths["sglang_fused"] = [lambda i=i: fused(i) for i in range(sets)]
    paths["copy"] = [lambda i=i: dst[i].copy_(src[i]) for i in range(sets)]

    # numerics on set 0 (fresh outputs for each path)
    def outputs_of(fn) -> contig.ContigOutputs:
        o = alloc(torch.device("cuda"), rows=M)
        o.out.view(torch.uint8).fill_(0x7F)
        o.scale.fill_(-1) if ue8m0 else o.scale.fill_(float("nan"))
        fn(o)
        return o

    numerics = {}
    if M <= 16384 or D <= 2048:
        ref = outputs_of(lambda o: silu_mul_quant_contig_reference(contig.ContigInputs(xs[0]), o, shape, config))
        tri = outputs_of(lambda o: default(xs[0], o.out, o.scale))
        numerics["triton_vs_reference"] = agreement(ref, tri)
        numerics["exact_vs_reference"] = agreement(ref, outputs_of(lambda o: exact(xs[0], o.out, o.scale)))
        if fused_ok:
            sgl = outputs_of(
                lambda o: jit.silu_and_mul_contig_post_quant(
                    xs[0], o.out, o.scale, GROUP, scale_ue8m0=ue8m0, transposed=ue8m0, swiglu_limit=limit
                )
            )
            numerics["triton_vs_sglang_fused"] = agreement(sgl, tri)
            numerics["sglang_fused_vs_reference"] = agreement(ref, sgl)
        torch.cuda.empty_cache()

    names = list(paths)
    per_round: dict[str, list[float]] = {n: [] for n in names}
    for order in round_orders(names, rounds):
        for name in order:
            per_round[name].append(graph_time_us(paths[name]))
    times = {n: statistics.median(v) for n, v in per_round.items()}
    for buffers in (xs, outs, tmp, two_s, src, dst):
        buffers.clear()
    torch.cuda.empty_cache()
    return {
        "M": M,
        "D": D,
        "group": GROUP,
        "swiglu_limit": limit,
        "scales": layout,
        "bytes": moved,
        "sets": sets,
        "us": times,
        "rounds_us": per_round,
        "numerics": numerics,
    }


def markdown(payload: dict) -> str:
    run = payload["run"]
    lines = [
        f"# contig activation step on {payload['device']} ({payload['date']})",
        "",
        f"commit `{run.get('commit')}`, torch {run.get('torch')}, triton {run.get('triton')}, CUDA {run.get('cuda')}, "
        f"driver {run.get('driver')}; SGLang kernels: {payload['sglang_source']}; copy bandwidth "
        f"{payload['copy_TBps']:.2f} TB/s; group {GROUP}; medians of {payload['rounds']} rounds of CUDA-graph replays.",
        "",
        "Times in us. `contig_triton`: default options (`fast_exp`); `exact`: `fast_exp=False` (the reference's expf "
        "and IEEE division); `waves4`: the default with the grid capped at 4 waves. `x2k` = sglang_two_kernel / "
        "contig_triton (speed-up), `xfused` = sglang_fused / contig_triton, `/copy` = time / same-bytes copy (1.00 = "
        "copy speed). fp8: share of fp8 bytes identical (default / exact to the reference; default to SGLang's fused "
        "kernel); `-`: not measured (reference skipped above 16384 rows at D > 2048; SGLang's fused kernel takes no "
        "UE8M0 scales with G % 4 != 0).",
        "",
        "| D | M | limit | scales | contig_triton | exact | waves4 | sglang_two_kernel | sglang_fused | copy "
        "| x2k | xfused | /copy | exact /copy | fp8 = ref (default / exact) | fp8 = sglang_fused |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"| {r['D']} | {r['M']} | {r['swiglu_limit']} | {r['scales']} | error: {r['error'][:80]} |")
            continue
        t = r["us"]
        tri = t["contig_triton"]
        n = r["numerics"]

        def f(key: str) -> str:
            return f"{t[key]:.2f}" if key in t else "-"

        def same(key: str) -> str:
            return f"{n[key]['fp8_same']:.6f}" if key in n else "-"

        xfused = f"{t['sglang_fused'] / tri:.2f}" if "sglang_fused" in t else "-"
        lines.append(
            f"| {r['D']} | {r['M']} | {r['swiglu_limit'] or '-'} | {r['scales']} | {tri:.2f} | {f('contig_triton_exact')} "
            f"| {f('contig_triton_waves4')} | {f('sglang_two_kernel')} | {f('sglang_fused')} | {f('copy')} "
            f"| {t['sglang_two_kernel'] / tri:.2f} | {xfused} | {tri / t['copy']:.3f} "
            f"| {t['contig_triton_exact'] / t['copy']:.3f} "
            f"| {same('triton_vs_reference')} / {same('exact_vs_reference')} | {same('triton_vs_sglang_fused')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, nargs="*", default=list(HIDDEN))
    parser.add_argument("--rows", type=int, nargs="*", default=list(ROWS))
    parser.add_argument("--prebuild-only", action="store_true", help="build SGLang's modules (not prebuilt) and exit")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.cuda.init()
    jit = build_contig_kernels(JIT_ROOT, build_root="/tmp/sgl_jit_build/contig_bench", prebuilt_root=PREBUILT)
    t0 = time.time()
    q = torch.empty((8, 512), dtype=torch.float8_e4m3fn, device="meta")
    specs = [
        ptgq_spec(torch.bfloat16, q[:, :d], output_scale((8, d), "meta", GROUP, u, u, u), GROUP, u, False, False)
        for u in (False, True)
        for d in (256, 512)
    ]
    specs = list(dict.fromkeys(specs))  # fp32 scales: one spec for both widths
    jit.prebuild_contig([contig_spec(GROUP, u, False, lim) for u in (False, True) for lim in (None, 10.0)], specs)
    print(f"SGLang kernels ready in {time.time() - t0:.1f} s: {jit.log}", flush=True)
    if args.prebuild_only:
        return
    bw = copy_bandwidth()
    gen = torch.Generator(device="cuda").manual_seed(20261203)
    results = []
    for D in args.hidden:
        for M in args.rows:
            for limit in (None, 10.0):
                for ue8m0 in (False, True):
                    t = time.time()
                    try:
                        r = run_case(M, D, limit, ue8m0, jit, args.rounds, gen)
                    except Exception as exc:  # keep the other cases
                        r = {
                            "M": M,
                            "D": D,
                            "swiglu_limit": limit,
                            "scales": "ue8m0_packed" if ue8m0 else "row_major",
                            "error": f"{type(exc).__name__}: {exc}",
                        }
                    results.append(r)
                    (out / "partial.json").write_text(json.dumps(results, default=str))
                    print(
                        f"D={D} M={M} limit={limit} ue8m0={ue8m0}: {r.get('us', r.get('error'))} "
                        f"({time.time() - t:.1f} s)",
                        flush=True,
                    )
    device = torch.cuda.get_device_properties(0).name
    payload = {
        "device": device,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "run": run_info(),
        "copy_TBps": bw / 1e12,
        "rounds": args.rounds,
        "sglang_source": "sglang 0.5.23 wheel's JIT sources, compiled with SGLang's flags (sm_90a, -O3, --use_fast_math, PDL)",
        "sglang_build_log": jit.log,
        "results": results,
    }
    stem = f"contig_activation_{device.replace(' ', '-')}"
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1, default=str))
    (out / f"{stem}.md").write_text(markdown(payload))
    print(markdown(payload))


if __name__ == "__main__":
    main()
