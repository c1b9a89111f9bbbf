"""MegaMoE pre-dispatch on one GPU: this project's Triton kernels vs SGLang's JIT kernel vs torch.

Checks bit-exactness (Triton and SGLang's JIT ``mega_moe_pre_dispatch`` against the torch reference
``pre_dispatch_reference``) on fresh random inputs, then times every variant and shape against the
device-to-device copy ceiling. SGLang's kernel is built from the sglang wheel's JIT sources through
tvm-ffi (as SGLang builds it: no fast-math, PDL on, sm_90a) when ``--jit-root`` points at
``sglang/kernels/jit`` and ``tvm_ffi`` is importable; otherwise its columns are skipped.

Bytes counted per call (the floor is bytes / copy bandwidth): read x (2 B/elem) and the real top-k
rows (8 B/slot); write the quantized rows (1 or 0.5 B/elem), their scales (1 B per 32-group or
4 B per 128-group), the real top-k rows (12 B/slot) and the padding rows [T, P) (12 B/slot).
Every kernel is timed as CUDA-graph replays of back-to-back launches (median over replays): small
batches (T <= 256) reuse one input set (L2 warm, as in decode); larger ones rotate over 4 input and
buffer sets (several times the 50 MB L2) so that each launch streams from memory. (``do_bench``'s
L2 flush leaves up to an L2 of dirty lines that the next kernel writes back; on a 100 MB kernel that
distorts the figure, so it is used for the copy ceiling only.) Our kernel launches with programmatic
dependent launch (PDL) where Triton supports it, as SGLang's kernel does; ``triton_nopdl`` without.

The kernels, checks and timings live in :mod:`sglang_moe_plugins.bench.mega_pre_dispatch`.

Usage (GPU machine, repository root): ``PYTHONPATH=$PWD python benchmarks/mega_pre_dispatch.py --jit-root .device/sgl_jit/sglang/kernels/jit --out $OUT``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import time
from typing import Any

import torch

from sglang_moe_plugins.bench.mega_pre_dispatch import (
    ROWS,
    SWEEP_SETS,
    TOP_K,
    build_sglang_jit,
    copy_bandwidth,
    interleave,
    print_summary,
    run_checks,
    run_sweep,
    run_timing,
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jit-root", type=pathlib.Path, default=None)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--sweep-set", default="2", choices=sorted(SWEEP_SETS))
    parser.add_argument(
        "--budget-s", type=float, default=1e9, help="skip the remaining sections after this many seconds"
    )
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only time FP8 at T = 512 and 64 (H = 4096): SGLang's kernel and our tilings in turn, "
        "ROUNDS times, each from a fresh graph (run-to-run spread of the close cases)",
    )
    args = parser.parse_args()
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (args.out / "mega_pre_dispatch.json").write_text(json.dumps(report, indent=1))

    torch.manual_seed(0)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "rows_P": ROWS,
        "top_k": TOP_K,
    }
    from sglang_moe_plugins.bench.provenance import run_info

    report["run"] = run_info()  # commit (or $SGLANG_MOE_PLUGINS_COMMIT), device, driver, versions
    import triton

    report["triton"] = triton.__version__
    jit = tvm = None
    if args.jit_root is not None:
        t0 = time.time()
        try:
            jit, tvm = build_sglang_jit(args.jit_root.resolve())
            report["sglang_jit_build_s"] = round(time.time() - t0, 1)
        except Exception as exc:  # noqa: BLE001
            report["sglang_jit_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    print("build:", {k: v for k, v in report.items() if "jit" in k}, flush=True)
    copy = copy_bandwidth()
    report["copy_TBps"] = round(copy / 1e12, 3)
    print(f"copy ceiling {copy / 1e12:.3f} TB/s", flush=True)

    if args.interleave:
        report["interleaved"] = interleave(jit, tvm, args.interleave, copy)
        save()
        return 0

    checks = run_checks(jit)
    report["checks"] = checks
    save()
    rows = run_timing(jit, tvm, copy)
    report["timing"] = rows
    save()
    report["sweep"] = [] if args.no_sweep else run_sweep(jit, tvm, copy, args.sweep_set, started, args.budget_s, report)
    save()
    print_summary(report, checks, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
