#!/usr/bin/env python3
"""What the package costs an SGLang process at start-up: SGLang's own ``load_plugins()`` with and without it.

SGLang calls ``load_plugins()`` in every process it starts (engine, scheduler, detokenizer, DP controller);
only some of them ever import its MoE runner. Each scenario runs ``--runs`` fresh interpreters per side,
alternating sides so that machine load hits both alike:

- ``no-moe``: ``import sglang.srt.plugins``, then ``load_plugins()`` (a detokenizer or DP controller:
  it never imports the MoE runner);
- ``moe``: the same, then ``import sglang.srt.layers.moe.moe_runner.deep_gemm`` (a scheduler that builds a
  MoE model), so that the package's hooks are in place (its deferred start-up included, where it defers).

"without" sets ``SGLANG_PLUGINS``, SGLang's own allow-list, to every other installed general plugin, so that only the
package's ``sglang.srt.plugins`` entry point is left out; "with" leaves it unset. Both sides import
``sglang.srt.server_args`` first: every SGLang process has it (it receives its ServerArgs), and the package's server
arguments hook its parser. Each child reports, for the part
after ``import sglang.srt.plugins``: seconds, modules added to ``sys.modules`` and resident memory added
(``/proc/self/statm``). The table gives medians and the with-minus-without deltas. A second table times
``pytest --version --version`` with and without this package's pytest plugin (``-p no:sglang_moe_plugins``),
which every pytest run of an environment with the package loads. Nothing is asserted.

Run (from the repository root, SGLang installed)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/load_plugins_cost.py [--runs 7] [--out benchmarks/results]
    # writes load_plugins_cost_cpu.{json,md}

Before and after a change, in one result: run the earlier commit's package first (a worktree of it), then this one::

    git worktree add /tmp/before <commit>
    PYTHONPATH=$PWD .venv/bin/python benchmarks/load_plugins_cost.py --package-root /tmp/before --out /tmp/before
    PYTHONPATH=$PWD .venv/bin/python benchmarks/load_plugins_cost.py --before /tmp/before/load_plugins_cost_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_moe_plugins.bench.provenance import run_info  # noqa: E402

#: The child: import SGLang's plugin loader, then time what follows it.
_CHILD = """
import json, os, sys, time
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
import sglang.srt.server_args  # every SGLang process has it (its ServerArgs): the baseline, on both sides
from sglang.srt.plugins import load_plugins
modules, memory, start = len(sys.modules), rss(), time.perf_counter()
load_plugins()
if sys.argv[2] == "moe":
    import sglang.srt.layers.moe.moe_runner.deep_gemm
seconds = time.perf_counter() - start
hooked = False
if "sglang_moe_plugins.integrations.sglang.entry" in sys.modules:
    hooked = bool(sys.modules["sglang_moe_plugins.integrations.sglang.entry"].hooked_ops())
with open(sys.argv[1], "w") as f:
    json.dump({"seconds": seconds, "modules": len(sys.modules) - modules, "rss_mb": (rss() - memory) / 2**20,
               "runner_imported": "sglang.srt.layers.moe.moe_runner.deep_gemm" in sys.modules,
               "package_imported": "sglang_moe_plugins" in sys.modules, "hooked": hooked}, f)
"""

SCENARIOS = ("no-moe", "moe")
#: The checkout whose package the "with" side imports (``--package-root``).
PACKAGE_ROOT = ROOT
#: The other general SGLang plugins installed here (entry point group ``sglang.srt.plugins``): loaded on both sides.
_OTHER_PLUGINS = tuple(
    sorted(e.name for e in importlib.metadata.entry_points(group="sglang.srt.plugins") if e.name != "moe_plugins")
)


def _env(with_package: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_MOE_PLUGINS_")}
    env.pop("SGLANG_PLUGINS", None)
    if not with_package:  # SGLang's allow-list: every other installed general plugin loads, this package's does not
        env["SGLANG_PLUGINS"] = ",".join(_OTHER_PLUGINS) or "no_such_plugin_name"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _child(scenario: str, with_package: bool, tmp: str) -> dict:
    out = os.path.join(tmp, "child.json")
    subprocess.run(
        [sys.executable, "-c", _CHILD, out, scenario], env=_env(with_package), cwd=tmp, check=True, capture_output=True
    )
    with open(out) as f:
        return json.load(f)


def _pytest_seconds(with_plugin: bool, tmp: str) -> float:
    args = ["-p", "no:cacheprovider", "--version", "--version"]
    if not with_plugin:
        args[:0] = ["-p", "no:sglang_moe_plugins"]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", *args], env=_env(True), cwd=tmp, check=True, capture_output=True)
    return time.perf_counter() - start


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument(
        "--package-root",
        default=str(ROOT),
        help="the checkout whose package the 'with' side imports (another commit's worktree: the 'before' run)",
    )
    parser.add_argument(
        "--before", help="the JSON of a run with --package-root at an earlier commit: shown first, as 'before'"
    )
    args = parser.parse_args()
    global PACKAGE_ROOT
    PACKAGE_ROOT = pathlib.Path(args.package_root).resolve()
    results: dict[str, dict[str, list[dict]]] = {s: {"with": [], "without": []} for s in SCENARIOS}
    pytest_times: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for scenario in SCENARIOS:
                for side in ("without", "with"):
                    results[scenario][side].append(_child(scenario, side == "with", tmp))
            for side in ("without", "with"):
                pytest_times[side].append(_pytest_seconds(side == "with", tmp))
    summary = {}
    lines = [
        "| scenario | side | seconds | modules | RSS MB | runner imported | hooked |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIOS:
        cells = {}
        for side in ("without", "with"):
            rows = results[scenario][side]
            cells[side] = {k: _median(rows, k) for k in ("seconds", "modules", "rss_mb")}
            cells[side]["runner_imported"] = rows[-1]["runner_imported"]
            cells[side]["hooked"] = rows[-1]["hooked"]
            c = cells[side]
            lines.append(
                f"| {scenario} | {side} | {c['seconds']:.3f} | {c['modules']:.0f} | {c['rss_mb']:.1f} | "
                f"{c['runner_imported']} | {c['hooked']} |"
            )
        delta = {k: cells["with"][k] - cells["without"][k] for k in ("seconds", "modules", "rss_mb")}
        cells["delta"] = delta
        lines.append(
            f"| {scenario} | **with - without** | **{delta['seconds']:+.3f}** | **{delta['modules']:+.0f}** | "
            f"**{delta['rss_mb']:+.1f}** | | |"
        )
        summary[scenario] = cells
    pytest_median = {side: statistics.median(v) for side, v in pytest_times.items()}
    lines += [
        "",
        "| `pytest --version --version` | seconds |",
        "|---|---|",
        f"| without this package's pytest plugin | {pytest_median['without']:.3f} |",
        f"| with it | {pytest_median['with']:.3f} |",
        f"| **with - without** | **{pytest_median['with'] - pytest_median['without']:+.3f}** |",
    ]
    commit = subprocess.run(
        ["git", "-C", str(PACKAGE_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    payload = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "package_commit": commit or None,
        "table": lines,
        "device": f"cpu (this machine: {os.cpu_count() or 0} cores)",
        "run": run_info(),
        "runs": args.runs,
        "summary": summary,
        "pytest_plugin_seconds": pytest_median,
        "raw": results,
        "pytest_raw": pytest_times,
    }
    md = "# SGLang `load_plugins()` with and without sglang-moe-plugins (CPU, fresh processes)\n\n"
    md += f"{payload['date']}, {payload['device']}, sglang {payload['run'].get('sglang')}, "
    md += f"torch {payload['run'].get('torch')}. Medians of {args.runs} runs per side; see benchmarks/load_plugins_cost.py.\n\n"
    if args.before:
        before = json.loads(pathlib.Path(args.before).read_text())
        payload["before"] = before
        md += f"## Before: the package at commit {before.get('package_commit')} ({before['date']})\n\n"
        md += "\n".join(before["table"]) + "\n\n## After\n\n"
    md += f"The package at commit {commit}.\n\n" + "\n".join(lines) + "\n"
    out = pathlib.Path(args.out)
    (out / "load_plugins_cost_cpu.json").write_text(json.dumps(payload, indent=1) + "\n")
    (out / "load_plugins_cost_cpu.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
