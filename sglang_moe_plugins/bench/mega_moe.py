"""SM90 MegaMoE timing helpers of ``benchmarks/mega_moe.py``: GPU time under CUDA graphs, eager host time,
the unfused path (two masked grouped GEMMs around this project's ``silu_mul_quant``), the markdown table."""

from __future__ import annotations

import os
import pathlib
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["TOKENS", "versions", "commit", "driver", "gpu_us", "eager_us", "unfused", "markdown"]

TOKENS = (1, 64, 512)


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("triton", "deep_gemm", "tvm_ffi"):
        try:
            out[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception as exc:  # noqa: BLE001
            out[mod] = f"absent ({type(exc).__name__})"
    return out


def commit(root: str | os.PathLike[str]) -> str:
    """``$SGLANG_MOE_PLUGINS_COMMIT``, else ``$GIT_COMMIT``, else the tree's git HEAD: a copied tree's
    ``.git`` may be an older base than the files (the 2026-12-01 run recorded its base commit)."""
    from .provenance import COMMIT_ENV, source_commit

    given = os.environ.get(COMMIT_ENV, "").strip() or os.environ.get("GIT_COMMIT", "").strip()
    return given or source_commit(pathlib.Path(root))


def driver() -> str:
    try:
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[0]
        )
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


def unfused(case: Any, deep_gemm: Any) -> Callable[[], Any]:
    """L1 grouped GEMM -> Triton silu_mul_quant -> L2 grouped GEMM on the masked layout."""
    from ..ops import silu_mul_quant as smq
    from ..ops.mega_moe import formats as nm
    from ..plugins.triton_smq.plugin import TritonPlugin

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
    a_sf = torch.empty_strided((e, m, h // 128), (h // 128 * m, 1, m), dtype=torch.float32, device=ids.device).copy_(
        a_sf
    )
    masked_m = counts.to(torch.int32).contiguous()
    expected_m = max(1, int(counts.float().mean().ceil()))
    w1 = nm.deinterleave_gate_up(inputs.l1_weights[0].view(torch.uint8), "gran8").view(torch.float8_e4m3fn).contiguous()
    l1 = (w1, inputs.l1_weights[1])
    l2 = inputs.l2_weights
    d1 = torch.empty((e, m, 2 * inter), dtype=torch.bfloat16, device=ids.device)
    d2 = torch.empty((e, m, h), dtype=torch.bfloat16, device=ids.device)
    sshape, sconfig = smq.describe(
        d1, masked_m, group_size=128, topk=shape.top_k, swiglu_limit=case.config.activation_clamp
    )
    souts = smq.allocate_outputs(sshape, sconfig, d1.device)
    sinputs = smq.SiluMulQuantInputs(d1, masked_m)
    act = TritonPlugin()
    gemm = getattr(deep_gemm, "m_grouped_fp8_gemm_nt_masked", None) or deep_gemm.fp8_m_grouped_gemm_nt_masked

    def run() -> None:
        gemm((a, a_sf), l1, d1, masked_m, expected_m)
        act.run(sinputs, souts, sshape, sconfig)
        gemm((souts.out, souts.scale), l2, d2, masked_m, expected_m)

    return run


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    paths = ["direct", "plugin_host", "plugin_triton", "plugin_torch", "unfused"]
    lines = [
        f"# SM90 MegaMoE on {meta['device']} ({meta['date']})",
        "",
        f"commit {meta['commit']}, driver {meta['driver']}, "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "",
        "GPU time per call under CUDA graphs (us) / eager host issue time per call (us):",
        "",
        "| shape | T | " + " | ".join(paths) + " |",
        "|---|---|" + "---|" * len(paths),
    ]
    for r in rows:
        cells = []
        for p in paths:
            v = r.get(p, {})
            cells.append(
                "error"
                if "error" in v or not v
                else f"{v['gpu_us'] if v['gpu_us'] is not None else '-'} / {v['eager_issue_us']}"
            )
        lines.append(f"| {r['shape']} | {r['T']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "`plugin_torch` is timed eagerly only (the torch pre-dispatch is the reference, not a fast path).",
        "`unfused` = L1 grouped GEMM + Triton silu_mul_quant + L2 grouped GEMM, no dispatch / weights / combine.",
    ]
    return "\n".join(lines) + "\n"
