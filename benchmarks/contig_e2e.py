"""The whole MoE expert computation as SGLang 0.5.23's ``DeepGemmRunnerCore`` runs it, compact against masked, on one
GPU without SGLang: SGLang's own permute kernels (Triton, from the wheel's sources: ``sglang_moe_host``), its
activation/quant kernels (JIT CUDA, built from the wheel's sources: ``sglang_kernels`` / ``sglang_contig_kernels``),
DeepGEMM's grouped FP8 GEMMs (sgl-deep-gemm), and this package's plugins through the selector.

Per configuration (``sglang_moe_plugins.bench.contig_e2e_cases.derive_cases``) and token count, the time per MoE layer
of each path (``contig_e2e_run``): stock compact, package compact (``contig_triton``), masked with the package's
``triton`` (with the masked layout's extra memory as SGLang estimates it), and stock masked where 0.5.23 runs
masked; the activation step's own time; and each path's relative L2 error against an fp32 MoE on the dequantized
weights (fresh inputs, outputs' memory poisoned with NaN first).

Usage (from the repository root, after ``source tests/gpu/gpu_env.sh``)::

    python3 benchmarks/contig_e2e.py --out DIR [--only "V4-Flash TP4,V3"] [--quick]

Writes ``DIR/contig_e2e_<device>.json`` and ``.md``. ``benchmarks/run_contig_e2e_h200.sh`` is the device call.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import time
import traceback
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_moe_plugins.bench.contig_e2e_cases import derive_cases, filter_cases  # noqa: E402

CONTIG_PLUGIN = "contig_triton"


def _log(msg: str) -> None:
    print(msg, flush=True)


def build_env(jit_root: str, py_root: str, prebuilt: str | None) -> Any:
    import deep_gemm
    import torch

    from sglang_moe_plugins import api
    from sglang_moe_plugins.bench import sglang_moe_host
    from sglang_moe_plugins.bench.contig_e2e_run import Env
    from sglang_moe_plugins.bench.sglang_contig_kernels import build_contig_kernels
    from sglang_moe_plugins.config import parse_config

    contig = build_contig_kernels(jit_root, prebuilt_root=prebuilt)  # also SglangJit: the masked kernels

    def sglang_per_token_group_quant_fp8(x: torch.Tensor, group_size: int, eps: float = 1e-10, **flags: Any) -> Any:
        # The flat call SGLang's permute code makes on Hopper (moe_ep_deepgemm_preprocess): row-major fp32 scales.
        if any(flags.get(f) for f in ("column_major_scales", "scale_tma_aligned", "scale_ue8m0", "fuse_silu_and_mul")):
            raise NotImplementedError(f"sglang_per_token_group_quant_fp8 shim: flags {flags}")
        q = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
        s = torch.empty((*x.shape[:-1], x.shape[-1] // group_size), device=x.device, dtype=torch.float32)
        contig.per_token_group_quant_fp8(x, group_size, eps, output_q=q, output_s=s)
        return q, s

    kernels = sglang_moe_host.load(py_root, sglang_per_token_group_quant_fp8)
    force = {"silu_mul_quant": "triton", "silu_mul_quant_contig": CONTIG_PLUGIN}
    plugin: str | None = CONTIG_PLUGIN
    try:
        selector = api.reload(parse_config({"strict": True, "force": force}))
    except Exception as exc:
        _log(f"package compact unavailable ({type(exc).__name__}: {exc})")
        force.pop("silu_mul_quant_contig")
        selector, plugin = api.reload(parse_config({"strict": True, "force": force})), None
    return Env(deep_gemm, kernels, contig, contig, selector, plugin)


def compile_host(jit_root: str, out: str, workers: int = 2) -> int:
    """Compile the SGLang JIT modules the benchmark loads (no GPU needed), to carry them as ``--prebuilt``: the
    flat quantizer (Hopper's row-major fp32 scales), the DSV4 masked kernel (group 128, fp32 scales, limit), and the
    two-kernel branch's clamp and ``silu_and_mul`` kernels."""
    import concurrent.futures

    import torch

    from sglang_moe_plugins.bench.sglang_contig_kernels import SglangContigJit
    from sglang_moe_plugins.bench.sglang_kernels import dsv4_spec, ptgq_spec

    meta = torch.device("meta")
    q = torch.empty((8, 512), dtype=torch.float8_e4m3fn, device=meta)
    s = torch.empty((8, 4), dtype=torch.float32, device=meta)
    jit = SglangContigJit(jit_root, out)
    sources = [
        jit.dsv4_source(dsv4_spec(128, False, False, 10.0)),
        jit.ptgq_source(ptgq_spec(torch.bfloat16, q, s, 128, False, False, False)),
    ]
    sources += jit.contig_sources((), two_kernel=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for lib in [f.result() for f in [pool.submit(jit._compile, *src) for src in sources]]:
            _log(lib)
    return 0


def _fmt(v: Any, digits: int = 1) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else "-"


def _err(v: Any) -> str:
    return f"{v:.2e}" if isinstance(v, float) else ("-" if v is None else "fail")


def markdown(doc: dict) -> str:
    info = doc["run_info"]
    lines = [
        "# MoE layer end to end: SGLang 0.5.23 compact vs masked, stock vs package activation",
        "",
        f"Device {info.get('device')}, driver {info.get('driver')}, date {doc['date']}, commit {info.get('commit')}; "
        f"torch {info.get('torch')}, triton {info.get('triton')}, deep_gemm {doc.get('deep_gemm')}. "
        "Times in us per MoE layer (decode <= 256 tokens: CUDA-graph replays over 8 routed input sets; prefill: "
        "events around eager calls over 2 sets; medians). Speedups are stock compact / path. `act%`: the activation "
        "step's share of that layer's time. Masked mem: the masked layout's peak bytes as SGLang estimates them "
        "(E_local x padded tokens x row bytes). Errors: relative L2 against an fp32 MoE on the dequantized weights "
        f"({doc['numerics_tokens']} fresh tokens per config).",
        "",
        "| config | tokens | stock layout | compact rows | stock us (act%) | pkg compact us (act%) | x | masked+pkg us (act%)"
        " | x | masked stock us | masked mem GiB | err stock | err pkg compact | err masked pkg | err masked stock |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        lay, act = r.get("layer_us", {}), r.get("act_us", {})
        base = lay.get("stock_compact")

        def cell(name: str) -> str:
            if name not in lay:
                return "-"
            share = act.get(name, 0) / lay[name] * 100 if lay[name] else 0
            return f"{lay[name]:.1f} ({share:.0f}%)"

        def speed(name: str) -> str:
            return f"{base / lay[name]:.2f}" if base and lay.get(name) else "-"

        e = r.get("rel_l2", {})
        mem = r.get("masked_extra_bytes")
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['stock_layout']} | {r.get('compact_rows', '-')} | {cell('stock_compact')}"
            f" | {cell('package_compact')} | {speed('package_compact')} | {cell('masked_package')}"
            f" | {speed('masked_package')} | {_fmt(lay.get('masked_stock'))} | {_fmt(mem / 2**30 if mem else None)}"
            f" | {_err(e.get('stock_compact'))} | {_err(e.get('package_compact'))} | {_err(e.get('masked_package'))}"
            f" | {_err(e.get('masked_stock'))} |"
        )
    notes = sorted({f"{r['case']} T={r['tokens']}: {k}: {v}" for r in doc["results"] for k, v in r["notes"].items()})
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    if doc.get("failures"):
        lines += ["", "Failures:", ""] + [f"- {f}" for f in doc["failures"]]
    return "\n".join(lines) + "\n"


def warm(cases: list, args: argparse.Namespace, argv: list[str] | None) -> float:
    """Run ``--warm-only`` workers (shard i of N of the (config, tokens) pairs each) and wait."""
    import subprocess

    t0 = time.time()
    given, base = list(sys.argv[1:] if argv is None else argv), []
    while given:
        a = given.pop(0)
        if a == "--warm-workers":
            given.pop(0)
        elif not a.startswith("--warm-workers="):
            base.append(a)
    procs = []
    for i in range(args.warm_workers):
        cmd = [sys.executable, __file__, *base, "--warm-only", f"--warm-shard={i}/{args.warm_workers}"]
        log = open(pathlib.Path(args.out) / f"warm_{i}.log", "w")
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    for proc, log in procs:
        proc.wait()
        log.close()
    _log(f"warm-up: {len(procs)} workers, {time.time() - t0:.1f} s, rc {[p.returncode for p, _ in procs]}")
    return time.time() - t0


def shard(cases: list, spec: str) -> list:
    """Shard ``i/N`` of the (config, tokens) pairs, ordered token index first so that the N workers start on N
    different configurations (their weights are not all resident at once); one single-token case per pair."""
    import dataclasses

    i, n = (int(v) for v in spec.split("/"))
    pairs = sorted(((j, k, c, t) for k, c in enumerate(cases) for j, t in enumerate(c.tokens)), key=lambda p: p[:2])
    return [dataclasses.replace(c, tokens=(t,)) for _, _, c, t in pairs[i::n]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--only", default=None, help="comma-separated substrings of config labels")
    p.add_argument("--quick", action="store_true", help="token counts 16 and 2048 only")
    p.add_argument("--seed", type=int, default=20261203)
    p.add_argument("--numerics-tokens", type=int, default=128)
    p.add_argument("--jit-root", default=str(ROOT / ".device/sgl_jit/sglang/kernels/jit"))
    p.add_argument("--py-root", default=str(ROOT / ".device/sgl_py"))
    p.add_argument("--prebuilt", default=str(ROOT / ".device/sgl_prebuilt"))
    p.add_argument("--list", action="store_true", help="print the configurations and exit (CPU)")
    p.add_argument("--warm-workers", type=int, default=0, help="compile every kernel first in N parallel processes")
    p.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)  # a warm-up worker
    p.add_argument("--warm-shard", default="0/1", help=argparse.SUPPRESS)
    p.add_argument("--compile-host", default="", help="only compile SGLang's JIT modules (no GPU) into this directory")
    args = p.parse_args(argv)
    if args.compile_host:
        return compile_host(args.jit_root, args.compile_host)
    cases = filter_cases(derive_cases(), args.only, args.quick)
    if args.list:
        for c in cases:
            _log(
                f"{c.label}: E_local={c.local_experts} D={c.inter} K={c.hidden} topk={c.topk} "
                f"limit={c.swiglu_limit} stock={c.stock_layout} guard={c.guard_reason} tokens={c.tokens}"
            )
        return 0
    import torch

    from sglang_moe_plugins.bench.contig_e2e_run import run_case
    from sglang_moe_plugins.bench.provenance import run_info

    if not torch.cuda.is_available():
        _log("no CUDA device: nothing to time (use --list on a CPU machine)")
        return 0
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    warm_s = warm(cases, args, argv) if args.warm_workers > 0 and not args.warm_only else None
    env = build_env(args.jit_root, args.py_root, args.prebuilt if os.path.isdir(args.prebuilt) else None)
    _log(f"setup {time.time() - t0:.1f} s")
    if args.warm_only:
        import dataclasses

        from sglang_moe_plugins.bench.contig_e2e_run import warm_case

        with_numerics = [dataclasses.replace(c, tokens=(*c.tokens, args.numerics_tokens)) for c in cases]
        for i, case in enumerate(shard(with_numerics, args.warm_shard)):
            try:
                warm_case(env, case, args.seed + i, _log)
            except Exception as exc:  # the timing process compiles what a worker could not
                _log(f"warm {case.label} T={case.tokens}: {type(exc).__name__}: {exc}")
                torch.cuda.empty_cache()
        return 0
    import deep_gemm

    doc: dict[str, Any] = {
        "run_info": run_info(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(),
        "deep_gemm": getattr(deep_gemm, "__version__", None),
        "contig_plugin": env.contig_plugin,
        "numerics_tokens": args.numerics_tokens,
        "cases": [c.__dict__ for c in cases],
        "results": [],
        "failures": [],
        "seed": args.seed,
        "warm_s": warm_s,
    }
    name = str(doc["run_info"].get("device") or "gpu").split(" (")[0].replace(" ", "-")
    for i, case in enumerate(cases):
        try:
            records = run_case(env, case, args.seed + 1000 * i, _log, args.numerics_tokens)
        except Exception as exc:
            doc["failures"].append(f"{case.label}: {type(exc).__name__}: {exc}")
            _log(traceback.format_exc())
            torch.cuda.empty_cache()
            continue
        for r in records:
            r["stock_layout"] = case.stock_layout
            r["guard_reason"] = case.guard_reason
        doc["results"] += records
        (out / f"contig_e2e_{name}.json").write_text(json.dumps(doc, indent=1, default=str))
        (out / f"contig_e2e_{name}.md").write_text(markdown(doc))
    doc["wall_s"] = time.time() - t0
    (out / f"contig_e2e_{name}.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / f"contig_e2e_{name}.md").write_text(markdown(doc))
    _log(markdown(doc))
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
