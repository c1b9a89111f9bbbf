"""Eager host time per launch of this project's two Triton kernels: Triton's JIT dispatch against the
prepared low-level launch (issue 12, item 2), with the per-call pieces around them timed alone.

Two sections, on one GPU:

- ``silu_mul_quant`` (DSV4-Flash EP8 decode E=32 N=128 D=2048; Qwen3-30B EP1 decode E=128 N=64 D=768):
  ``launch`` (JIT dispatch, every decision made again), the JIT dispatch alone with precomputed
  arguments, the prepared launch (``prepare``'s closure, tensor level and bound-op level),
  ``TritonPlugin.run``, the bare ``LowLevelLaunch`` with pointer integers (the floor of this design),
  and ``torch.empty_like`` for scale.
- MegaMoE pre-dispatch (``sm90_fp8``, E=8 H=1024 T=32 top-k 8, P=8192: the shape where an eager
  ``mega_sm90_fp8`` call took 200 us with ``pre_dispatch="triton"`` and 62 us with ``"host"``):
  ``pre_dispatch`` (JIT path) and its pieces (``choose_tiling``, the PDL probe, the capability query
  it used to make on every call), the JIT dispatch alone, the prepared launcher, the bare low-level
  launch, the dtype conversions ``mega_deep_gemm.run`` makes per call (``topk_ids.to(int32)`` on
  int64 ids is a copy kernel), and sgl-deep-gemm's ``mega_moe_pre_dispatch_sm90`` when importable.

Each row: the median over ``--repeats`` of ``--iters`` back-to-back calls timed on the host
(``perf_counter``, synchronised before and after each batch), in microseconds per call; GPU time is
small at these sizes (2-4 us), so the figures are host-bound. Without CUDA (or Triton) the script
writes a JSON with ``skipped`` and exits 0. The measurements live in :mod:`sglang_moe_plugins.bench.kernel_overhead`.

Usage (GPU machine, repository root):
``PYTHONPATH=$PWD python benchmarks/host_overhead_kernels.py --out $OUT/host_overhead_kernels.json``
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
from typing import Any

from sglang_moe_plugins.bench.kernel_overhead import pre_dispatch_section, silu_section, versions
from sglang_moe_plugins.bench.provenance import source_commit

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=None, help="JSON output path")
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    meta: dict[str, Any] = {
        "benchmark": "host_overhead_kernels",
        "commit": source_commit(ROOT),
        "versions": versions(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "iters": args.iters,
        "repeats": args.repeats,
    }
    skipped = None
    try:
        import torch

        if not torch.cuda.is_available():
            skipped = "no CUDA device"
        else:
            import triton  # noqa: F401

            meta["device"] = torch.cuda.get_device_name()
    except ImportError as exc:
        skipped = f"missing dependency: {exc}"
    if skipped:
        payload = dict(meta, skipped=skipped, rows=[])
    else:
        rows = silu_section(args.iters, args.repeats) + pre_dispatch_section(args.iters, args.repeats)
        payload = dict(meta, rows=rows)
    text = json.dumps(payload, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    for row in payload["rows"]:
        value = "" if row["us_per_call"] is None else f"{row['us_per_call']:8.2f} us"
        note = row.get("note")
        if isinstance(note, list):
            print(f"{row['section']:18s} {row['path']}:")
            for line in note:
                print("    " + line)
            continue
        print(f"{row['section']:18s} {row['shape'][:40]:40s} {row['path'][:62]:62s} {value} {note or ''}")
    if skipped:
        print(f"skipped: {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
