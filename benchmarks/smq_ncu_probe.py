#!/usr/bin/env python3
"""The kernels of a few ``benchmarks/silu_mul_quant.py`` shapes, each launched a few times, for Nsight Compute.

Launches, per case: the ``triton`` kernel (default configuration; with ``--v7`` also kernel v7's configuration,
the benchmark's "before" column), SGLang's DSV4 JIT kernel where it takes the shape, and a device copy of the same
bytes; each after a warm-up, on inputs larger than the L2. Run under
``ncu`` on the GPU machine (repository root, SGLang's JIT sources as for ``silu_mul_quant.py``)::

    ncu --clock-control none --metrics <list> --csv python3 benchmarks/smq_ncu_probe.py --only NAME,...

Nothing is timed here; ncu reports each kernel's duration, DRAM throughput, occupancy and instruction counts.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib

import torch

from sglang_moe_plugins.bench.smq_cases import CASES, copy_bytes, masked_counts, v7_config
from sglang_moe_plugins.bench.smq_paths import Paths
from sglang_moe_plugins.bench.smq_run import load_host_kernels
from sglang_moe_plugins.ops.silu_mul_quant import allocate_outputs
from sglang_moe_plugins.plugins.triton_smq.tuning import KernelConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
JIT_ROOT = ROOT / ".device/sgl_jit/sglang/kernels/jit"
PREBUILT = ROOT / ".device/sgl_prebuilt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", required=True, help="comma-separated case names")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--v7", action="store_true", help="also launch kernel v7's configuration after the default")
    args = ap.parse_args()
    cases = [c for c in CASES if c.name in args.only.split(",")]
    host, _ = load_host_kernels(JIT_ROOT, PREBUILT, cases, lambda msg: None) if JIT_ROOT.is_dir() else (None, None)
    paths = Paths(host)
    from sglang_moe_plugins.plugins.sglang_kernels.host import use_host_kernels

    with use_host_kernels(host) if host is not None else contextlib.nullcontext():
        for case in cases:
            m = masked_counts(case).cuda()
            sets = [torch.randn(case.E, case.N, 2 * case.D, device="cuda").to(torch.bfloat16) for _ in range(3)]
            layout = paths.jit_layout(case) if paths.jit_via(case) == "raw" else case.layout
            shape, config = paths.shape_config(sets[0], m, case, layout)
            outs = [allocate_outputs(shape, config, sets[0].device) for _ in sets]
            half = copy_bytes(case, int(m.sum()))
            src, dst = (
                torch.empty(half, dtype=torch.uint8, device="cuda"),
                torch.empty(half, dtype=torch.uint8, device="cuda"),
            )
            for i in range(args.repeats + 1):
                xs, o = sets[i % 3], outs[i % 3]
                paths.run_triton(xs, m, o, case, layout)
                if args.v7:
                    paths.run_triton(xs, m, o, case, layout, kcfg=KernelConfig(**v7_config(case)))
                if paths.jit_via(case) == "raw":
                    paths.run_jit(xs, m, o, case, "raw")
                dst.copy_(src)
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
