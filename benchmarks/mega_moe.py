"""SM90 MegaMoE on one GPU: the ``mega_sm90_fp8`` plugin vs DeepGEMM called directly, our
pre-dispatch vs DeepGEMM's, and the fused kernel vs the unfused grouped-GEMM path.

Shapes: the catalog shapes of ``tests/gpu/mega_sm90_common.SHAPES`` (experts scaled down) at a
decode and a prefill token count. Per shape and T:

- ``direct``: SGLang 0.5.23's SM90 sequence called directly (``mega_moe_pre_dispatch_sm90`` +
  ``fp8_mega_moe``, one buffer);
- ``plugin_host`` / ``plugin_triton`` / ``plugin_torch``: the plugin's ``run`` with option
  ``pre_dispatch`` = host (DeepGEMM's ``mega_moe_pre_dispatch_sm90``), triton (ours), torch;
- ``unfused``: what runs without MegaMoE, minus dispatch and combine: DeepGEMM's
  ``m_grouped_fp8_gemm_nt_masked`` (L1, bf16 out), this project's Triton ``silu_mul_quant``
  (clamp, per-128 FP8), ``m_grouped_fp8_gemm_nt_masked`` (L2). Tokens are laid out per expert
  (masked layout, rows per expert rounded up to 128) outside the timed region. The fused kernel
  also dispatches, applies the top-k weights and combines, so the unfused figure is a lower bound
  of that path.

Times: ``gpu_us`` = CUDA-graph replays of 10 back-to-back calls, median over 20 replays, per call
(inputs stay L2-warm, as in decode); ``eager_issue_us`` = host time to issue one eager call (50
calls, no sync inside); ``eager_wall_us`` = wall time per call of those 50 calls including the final sync.

Usage (one H200, sgl-deep-gemm 0.1.5.post1): ``python benchmarks/mega_moe.py --out $OUT``; writes
``mega_moe_sm90.json`` and ``mega_moe_sm90.md``. Skips (exit 0) without CUDA / SM90 / deep_gemm.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

TOKENS = (1, 64, 512)


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("triton", "deep_gemm", "tvm_ffi"):
        try:
            out[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception as exc:  # noqa: BLE001
            out[mod] = f"absent ({type(exc).__name__})"
    return out


def _commit() -> str:
    """``$SGLANG_MOE_PLUGINS_COMMIT``, else ``$GIT_COMMIT``, else the tree's git HEAD: a copied tree's
    ``.git`` may be an older base than the files (the 2026-12-01 run recorded its base commit)."""
    from sglang_moe_plugins.bench.provenance import COMMIT_ENV, source_commit

    given = os.environ.get(COMMIT_ENV, "").strip() or os.environ.get("GIT_COMMIT", "").strip()
    return given or source_commit(ROOT)


def _driver() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        return "unknown"


def gpu_us(fn: Callable[[], Any], reps: int = 10, replays: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(times)


def eager_us(fn: Callable[[], Any], calls: int = 50) -> tuple[float, float]:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - t0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return issued * 1e6 / calls, wall * 1e6 / calls


def _unfused(case, deep_gemm) -> Callable[[], Any]:
    """L1 grouped GEMM -> Triton silu_mul_quant -> L2 grouped GEMM on the masked layout."""
    from sglang_moe_plugins.ops import mega_moe_numerics as nm
    from sglang_moe_plugins.ops import silu_mul_quant as smq
    from sglang_moe_plugins.plugins.triton import TritonPlugin

    shape, inputs = case.shape, case.inputs
    e, h, inter = shape.num_experts, shape.hidden, shape.intermediate
    ids = inputs.topk_ids
    counts = torch.bincount(ids[ids >= 0].flatten(), minlength=e)[:e]
    m = max(128, -(-int(counts.max()) // 128) * 128)
    xq, xs = nm.quantize_activations(inputs.hidden_states, "sm90_fp8")
    a = torch.zeros((e, m, h), dtype=torch.float8_e4m3fn, device=ids.device)
    a_sf = torch.ones((e, m, h // 128), dtype=torch.float32, device=ids.device)
    for expert in range(e):
        tok = (ids == expert).nonzero(as_tuple=True)[0]
        a[expert, : tok.numel()] = xq[tok]
        a_sf[expert, : tok.numel()] = xs[tok]
    a_sf = torch.empty_strided((e, m, h // 128), (h // 128 * m, 1, m), dtype=torch.float32, device=ids.device).copy_(a_sf)
    masked_m = counts.to(torch.int32).contiguous()
    expected_m = max(1, int(counts.float().mean().ceil()))
    w1 = nm.deinterleave_gate_up(inputs.l1_weights[0].view(torch.uint8), "gran8").view(torch.float8_e4m3fn).contiguous()
    l1 = (w1, inputs.l1_weights[1])
    l2 = inputs.l2_weights
    d1 = torch.empty((e, m, 2 * inter), dtype=torch.bfloat16, device=ids.device)
    d2 = torch.empty((e, m, h), dtype=torch.bfloat16, device=ids.device)
    sshape, sconfig = smq.describe(d1, masked_m, group_size=128, topk=shape.top_k, swiglu_limit=case.config.activation_clamp)
    souts = smq.allocate_outputs(sshape, sconfig, d1.device)
    sinputs = smq.SiluMulQuantInputs(d1, masked_m)
    act = TritonPlugin()
    gemm = getattr(deep_gemm, "m_grouped_fp8_gemm_nt_masked", None) or deep_gemm.fp8_m_grouped_gemm_nt_masked

    def run() -> None:
        gemm((a, a_sf), l1, d1, masked_m, expected_m)
        act.run(sinputs, souts, sshape, sconfig)
        gemm((souts.out, souts.scale), l2, d2, masked_m, expected_m)

    return run


def bench_case(group, name: str, tokens: int) -> dict[str, Any]:
    import deep_gemm
    from mega_sm90_common import SHAPES, build_case, direct_buffer, direct_call, poisoned_outputs, sm90_plugin

    label, experts, hidden, inter, top_k = SHAPES[name]
    case = build_case(group, experts=experts, hidden=hidden, inter=inter, top_k=top_k, tokens=tokens, seed=tokens + 1, label=label)
    row: dict[str, Any] = {"shape": label, "E": experts, "H": hidden, "I": inter, "top_k": top_k, "T": tokens}
    buf = direct_buffer(group, case.shape)
    y = torch.empty((max(tokens, 1), hidden), dtype=torch.bfloat16, device="cuda")
    paths: dict[str, Callable[[], Any]] = {"direct": lambda: direct_call(case, buf, y)}
    for choice in ("host", "triton", "torch"):
        plugin = sm90_plugin(choice)
        out = poisoned_outputs(case)
        paths[f"plugin_{choice}"] = (lambda p=plugin, o=out: p.run(case.inputs, o, case.shape, case.config))
    try:
        paths["unfused"] = _unfused(case, deep_gemm)
    except Exception as exc:  # noqa: BLE001 - recorded, the rest still runs
        row["unfused_error"] = f"{type(exc).__name__}: {exc}"
    for path, fn in paths.items():
        try:
            issue, wall = eager_us(fn)
            row[path] = {"gpu_us": round(gpu_us(fn), 2) if path != "plugin_torch" else None,
                         "eager_issue_us": round(issue, 1), "eager_wall_us": round(wall, 1)}
        except Exception as exc:  # noqa: BLE001
            row[path] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
    return row


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    paths = ["direct", "plugin_host", "plugin_triton", "plugin_torch", "unfused"]
    lines = [f"# SM90 MegaMoE on {meta['device']} ({meta['date']})", "",
             f"commit {meta['commit']}, driver {meta['driver']}, " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), "",
             "GPU time per call under CUDA graphs (us) / eager host issue time per call (us):", "",
             "| shape | T | " + " | ".join(paths) + " |", "|---|---|" + "---|" * len(paths)]
    for r in rows:
        cells = []
        for p in paths:
            v = r.get(p, {})
            cells.append("error" if "error" in v or not v else f"{v['gpu_us'] if v['gpu_us'] is not None else '-'} / {v['eager_issue_us']}")
        lines.append(f"| {r['shape']} | {r['T']} | " + " | ".join(cells) + " |")
    lines += ["", "`plugin_torch` is timed eagerly only (the torch pre-dispatch is the reference, not a fast path).",
              "`unfused` = L1 grouped GEMM + Triton silu_mul_quant + L2 grouped GEMM, no dispatch / weights / combine."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("."))
    parser.add_argument("--shapes", default="qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args()
    from mega_sm90_common import env_ok, single_rank_group

    why = env_ok()
    if why:
        print(f"SKIP: {why}")
        return 0
    group = single_rank_group()
    meta = {"device": torch.cuda.get_device_name(), "driver": _driver(), "commit": _commit(), "versions": _versions(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.shapes.split(","):
        for tokens in map(int, args.tokens.split(",")):
            t0 = time.time()
            try:
                rows.append(bench_case(group, name, tokens))
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                rows.append({"shape": name, "T": tokens, "error": f"{type(exc).__name__}: {exc}"})
            print(json.dumps(rows[-1]), f"({time.time() - t0:.0f} s)", flush=True)
            (args.out / "mega_moe_sm90.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "mega_moe_sm90.md").write_text(markdown(meta, [r for r in rows if "error" not in r]))
    print(markdown(meta, [r for r in rows if "error" not in r]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
