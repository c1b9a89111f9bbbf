#!/usr/bin/env python3
"""``host_overhead.py --section cpu`` on two commits, side by side in one run.

Each commit is checked out into a temporary git worktree and measured by its own
``benchmarks/host_overhead.py`` (so each side runs its own package and hook), alternating
before/after ``--rounds`` times so that a change of machine load hits both sides alike. Each cell is
the median over the rounds of that side's per-round medians (5 x 1000 calls each). Nothing is asserted.

Run (from the repository root, SGLang installed)::

    python benchmarks/host_overhead_compare.py --before 79eb61a --after HEAD

Each side also runs its own ``benchmarks/mega_call_overhead.py --cpu`` (SGLang's hooked
``run_mega_routed_experts``, a do-nothing plugin forced), whose rows close the table.
    # writes benchmarks/results/host_overhead_cpu_compare.{json,md}
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def _measure(tree: pathlib.Path, out: pathlib.Path, name: str, commit: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), SGLANG_MOE_PLUGINS_COMMIT=commit)
    subprocess.run(
        [
            sys.executable,
            str(tree / "benchmarks" / "host_overhead.py"),
            "--section",
            "cpu",
            "--out",
            str(out),
            "--name",
            name,
        ],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads((out / f"{name}.json").read_text())
    # The MegaMoE hook's layer on CPU, by that commit's own script (a do-nothing mega_moe plugin forced).
    mega = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / "mega_call_overhead.py"), "--cpu"],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    cpu = json.loads(mega.stdout)
    rows = result["sections"][next(iter(result["sections"]))]["rows"]
    for key, label in MEGA_ROWS.items():
        rows.append({"path": label, "shape": MEGA_SHAPE, "us": cpu.get(key)})
    return result


#: The rows taken from ``mega_call_overhead.py --cpu`` (thread CPU time, its minimum of 5 x 20000 calls).
MEGA_ROWS = {
    "hooked_us": "SGLang's hooked `run_mega_routed_experts`, a do-nothing `mega_moe` plugin forced (thread CPU, min)",
    "hook_layer_us": "MegaMoE hook layer (hooked - output allocation; target <= 8 us)",
}
MEGA_SHAPE = "mega_call_overhead.py --cpu default (32 tokens, E=8, topk 2)"


def _cells(result: dict) -> dict[tuple[str, str], float | None]:
    (section,) = result["sections"].values()
    return {(r["path"], r["shape"]): r["us"] for r in section["rows"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--name", default="host_overhead_cpu_compare")
    args = parser.parse_args()
    commits = {
        side: _git("rev-parse", "--short", ref) for side, ref in (("before", args.before), ("after", args.after))
    }
    work = pathlib.Path(tempfile.mkdtemp(prefix="host_overhead_compare_"))
    trees = {}
    for side, commit in commits.items():
        trees[side] = work / side
        _git("worktree", "add", "--detach", str(trees[side]), commit)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    try:
        for i in range(args.rounds):
            for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                runs[side].append(_measure(trees[side], work, f"{side}{i}", commits[side]))
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    merged = {side: {} for side in runs}
    for side, results in runs.items():
        for result in results:
            for key, us in _cells(result).items():
                merged[side].setdefault(key, []).append(us)
    keys = list(dict.fromkeys(list(_cells(runs["before"][0])) + list(_cells(runs["after"][0]))))
    rows = []
    for path, shape in keys:
        cell = {side: [v for v in merged[side].get((path, shape), []) if v is not None] for side in runs}
        rows.append(
            {
                "path": path,
                "shape": shape,
                **{f"{side}_us": (statistics.median(v) if v else None) for side, v in cell.items()},
                **{f"{side}_rounds_us": [round(x, 3) for x in v] for side, v in cell.items()},
            }
        )
    meta = runs["after"][0]["meta"]
    result = {
        "meta": {
            "before": commits["before"],
            "after": commits["after"],
            "rounds": args.rounds,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "device": meta["device"],
            "cpu_count": meta["cpu_count"],
            "versions": meta["versions"],
            "load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()],
        },
        "rows": rows,
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# Host time per hooked call, before and after ({meta['device']}, {result['meta']['date']})",
        "",
        f"`benchmarks/host_overhead.py --section cpu` at {commits['before']} (before) and {commits['after']} (after), "
        f"alternating, {args.rounds} rounds each; each cell the median of the rounds' medians (5 x 1000 calls), in us "
        "(the last rows: each commit's `mega_call_overhead.py --cpu`, the median of the rounds' minima); "
        f"{meta['cpu_count']} CPUs, load average {result['meta']['load_average_1_5_15_min']} when written; versions: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v),
        "",
        "| path | shape | before | after |",
        "|---|---|---|---|",
    ]
    for r in rows:
        fmt = [("-" if r[f"{s}_us"] is None else f"{r[f'{s}_us']:.1f}") for s in ("before", "after")]
        lines.append(f"| {r['path']} | {r['shape']} | {fmt[0]} | {fmt[1]} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
