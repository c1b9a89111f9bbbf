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
Usage (one H200, sgl-deep-gemm 0.1.5.post1, from the repository root; ``tests/gpu`` holds the shared SM90
case builders): ``PYTHONPATH=$PWD:$PWD/tests/gpu python benchmarks/mega_moe.py --out $OUT``; writes
``mega_moe_sm90.json`` and ``mega_moe_sm90.md``. Skips (exit 0) without CUDA / SM90 / deep_gemm. The timing
helpers live in :mod:`sglang_moe_plugins.bench.mega_moe`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from sglang_moe_plugins.bench.mega_moe import TOKENS, commit, driver, eager_us, gpu_us, markdown, unfused, versions

ROOT = pathlib.Path(__file__).resolve().parents[1]


def bench_case(group, name: str, tokens: int) -> dict[str, Any]:
    import deep_gemm
    from mega_sm90_common import SHAPES, build_case, direct_buffer, direct_call, poisoned_outputs, sm90_plugin

    label, experts, hidden, inter, top_k = SHAPES[name]
    case = build_case(
        group, experts=experts, hidden=hidden, inter=inter, top_k=top_k, tokens=tokens, seed=tokens + 1, label=label
    )
    row: dict[str, Any] = {"shape": label, "E": experts, "H": hidden, "I": inter, "top_k": top_k, "T": tokens}
    buf = direct_buffer(group, case.shape)
    y = torch.empty((max(tokens, 1), hidden), dtype=torch.bfloat16, device="cuda")
    paths: dict[str, Callable[[], Any]] = {"direct": lambda: direct_call(case, buf, y)}
    for choice in ("host", "triton", "torch"):
        plugin = sm90_plugin(choice)
        out = poisoned_outputs(case)
        paths[f"plugin_{choice}"] = lambda p=plugin, o=out: p.run(case.inputs, o, case.shape, case.config)
    try:
        paths["unfused"] = unfused(case, deep_gemm)
    except Exception as exc:  # noqa: BLE001 - recorded, the rest still runs
        row["unfused_error"] = f"{type(exc).__name__}: {exc}"
    for path, fn in paths.items():
        try:
            issue, wall = eager_us(fn)
            row[path] = {
                "gpu_us": round(gpu_us(fn), 2) if path != "plugin_torch" else None,
                "eager_issue_us": round(issue, 1),
                "eager_wall_us": round(wall, 1),
            }
        except Exception as exc:  # noqa: BLE001
            row[path] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
    return row


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
    meta = {
        "device": torch.cuda.get_device_name(),
        "driver": driver(),
        "commit": commit(ROOT),
        "versions": versions(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
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
