#!/usr/bin/env python3
"""Eager host time per call of the ``silu_mul_quant`` paths, side by side in one run.

Each number is the median over 5 repeats of 1000 back-to-back calls (per-call time of each repeat);
the five per-repeat values are kept in the JSON. Nothing is asserted: the targets of issue 12 are
compared in the markdown table.

Sections (the measurements live in :mod:`sglang_moe_plugins.bench.host_overhead`):

- ``cpu`` (needs SGLang installed; runs on any machine): the plugin layer's cost through SGLang's own
  hooked ``_varlen_deep_gemm_silu_mul_quant`` (after SGLang's real ``load_plugins()``), with a
  do-nothing third-party plugin forced (installed for the run as a real distribution with an entry
  point), next to the bare call of that plugin. Two such plugins: one with ``run`` only, one with
  ``prepare``. Target: at most 8 us per hooked call on top of the bare plugin call.
- ``gpu`` (needs CUDA; skipped without it; runs without SGLang): ``torch.empty`` baselines, our Triton
  kernel's launch, ``TritonPlugin`` through its prepared launch, a ``Selector`` bound call, our hook
  function ``silu_mul_quant_hook(original, ...)`` called as SGLang calls it (with a stand-in for the
  original), and SGLang's own Python path of its DSV4 branch over its JIT kernel built from the
  sglang wheel's sources through tvm-ffi (``sglang_moe_plugins/bench/sglang_kernels.py``; needs
  ``apache-tvm-ffi`` and the wheel's ``sglang/kernels/jit`` under ``--jit-root``; skipped with the reason
  otherwise).

Run (from the repository root)::

    PYTHONPATH=$PWD python benchmarks/host_overhead.py --section cpu   # writes benchmarks/results/host_overhead_cpu.{json,md}
    PYTHONPATH=.:/tmp/site python3 benchmarks/host_overhead.py --section gpu --out $OUT
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform as _platform

from sglang_moe_plugins.bench.host_overhead import (
    CALLS,
    REPEATS,
    cpu_section,
    device_name,
    gpu_section,
    markdown,
    versions,
)
from sglang_moe_plugins.bench.provenance import source_commit

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--section", choices=("cpu", "gpu", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--jit-root", default=str(ROOT / ".device/sgl_jit/sglang/kernels/jit"))
    parser.add_argument("--prebuilt", default=str(ROOT / ".device/sgl_prebuilt"))
    parser.add_argument("--name", default=None, help="file stem (default host_overhead_<device>)")
    args = parser.parse_args()
    sections = {}
    if args.section in ("cpu", "all"):
        sections["cpu: plugin layer through SGLang's hooked function, do-nothing plugin forced"] = cpu_section(
            args.repeats, args.calls
        )
    if args.section in ("gpu", "all"):
        sections["gpu: triton path vs SGLang's DSV4 JIT call"] = gpu_section(
            args.repeats, args.calls, pathlib.Path(args.jit_root), pathlib.Path(args.prebuilt), ROOT
        )
    result = {
        # the measured commit: $SGLANG_MOE_PLUGINS_COMMIT (a copied tree's .git may be older), else git
        "meta": {
            "commit": source_commit(ROOT),
            "device": device_name(),
            "cpu": _platform.processor() or _platform.machine(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "repeats": args.repeats,
            "calls": args.calls,
            "versions": versions(),
            "load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()],
            "cpu_count": os.cpu_count(),
        },
        "sections": sections,
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"host_overhead_{device_name()}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(result) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
