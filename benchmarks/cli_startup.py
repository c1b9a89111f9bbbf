#!/usr/bin/env python3
"""Start-up of the ``sglang-moe-plugins`` command: wall time of fresh processes and the modules they import.

For each command line (``--help``, ``list --json``), ``--runs`` fresh interpreters run
``python -m sglang_moe_plugins.cli ARGS`` in an empty directory (the package comes from ``PYTHONPATH``, else
the installed one; ``SGLANG_*`` variables removed from the environment); each reports its ``sys.modules``
at exit. Prints the median wall time, the module count and whether torch was imported, as a Markdown
table. ``--builtins-only`` adds ``SGLANG_MOE_PLUGINS_ALLOW=`` (no third-party plugin loads: their modules
import what they import). Nothing is asserted.

Run (from the repository root)::

    PYTHONPATH=$PWD python benchmarks/cli_startup.py [--runs 5] [--builtins-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

#: Runs the command as ``python -m sglang_moe_plugins.cli`` does, then writes the names in ``sys.modules``.
_RUN = """
import json, runpy, sys
out, sys.argv = sys.argv[1], ["sglang-moe-plugins", *sys.argv[2:]]
try:
    runpy.run_module("sglang_moe_plugins.cli", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
with open(out, "w") as f:
    json.dump(sorted(sys.modules), f)
"""

COMMANDS = (("--help",), ("list", "--json"))


def measure(args: tuple[str, ...], runs: int, env: dict[str, str]) -> dict:
    """Median wall seconds of ``runs`` fresh processes running ``args``, and the modules of the last one."""
    times, modules = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "modules.json")
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", _RUN, out, *args], env=env, cwd=tmp, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
            with open(out) as f:
                modules = json.load(f)
    return {
        "args": " ".join(args),
        "median_s": statistics.median(times),
        "runs_s": times,
        "modules": len(modules),
        "torch": "torch" in modules,
        "sglang": "sglang" in modules,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--builtins-only", action="store_true", help="SGLANG_MOE_PLUGINS_ALLOW= (no third-party plugin)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    if args.builtins_only:
        env["SGLANG_MOE_PLUGINS_ALLOW"] = ""
    rows = [measure(command, args.runs, env) for command in COMMANDS]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"| command | median of {args.runs} (s) | modules | torch imported |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| `{row['args']}` | {row['median_s']:.2f} | {row['modules']} | {'yes' if row['torch'] else 'no'} |")


if __name__ == "__main__":
    main()
