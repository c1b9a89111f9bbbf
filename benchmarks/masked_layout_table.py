"""Write ``sglang_moe_plugins/data/masked_layout.json`` from the end-to-end benchmark's result.

For each configuration SGLang's guard sends to the compact layout (``stock_layout == "compact"`` with a guard
reason) and whose masked layout was timed: the token counts at which the masked layout with the package's
activation was at least ``--margin`` faster than stock compact, as the longest run of consecutive measured token
counts ``[tokens_min, tokens_max]``; with several runs, each token count counts with its slowest run. The masked-layout hook (``integrations/sglang/layout.py``) lifts SGLang's guard
only inside that range; outside it, and for configurations not listed or never faster, SGLang's reason stands.

Usage: ``python benchmarks/masked_layout_table.py [--result benchmarks/results/contig_e2e_NVIDIA-H200.json]
[--margin 1.05] [--out sglang_moe_plugins/data/masked_layout.json]``
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections import defaultdict
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]


def table(results: list[dict[str, Any]], margin: float, source: str) -> dict[str, Any]:
    """One entry per guard-refused configuration; with several runs, each token count's slowest masked speedup."""
    result = results[0]
    cases = {c["model"] + f" TP{c['tp']}" + (f" EP{c['ep']}" if c["ep"] > 1 else ""): c for c in result["cases"]}
    runs: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for one in results:
        for row in one["results"]:
            layer = row["layer_us"]
            if row.get("stock_layout") != "compact" or not row.get("guard_reason") or "masked_package" not in layer:
                continue
            runs[(row["case"], row["tokens"])].append((layer["stock_compact"], layer["masked_package"]))
    points: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for (case, tokens), pairs in runs.items():
        if len(pairs) == len(results):  # measured in every run
            stock, masked = min(pairs, key=lambda p: p[0] / p[1])
            points[case].append((tokens, stock, masked))
    configs = []
    for name, rows in sorted(points.items()):
        case = cases[name]
        rows.sort()
        best: tuple[int, int] | None = None
        start = None
        for i, (_, stock, masked) in enumerate([*rows, (0, 0.0, 1.0)]):
            fast = i < len(rows) and stock / masked >= margin
            if fast and start is None:
                start = i
            if not fast and start is not None:
                if best is None or i - start > best[1] - best[0]:
                    best = (start, i)
                start = None
        entry: dict[str, Any] = {
            "config": name,
            "experts": case["local_experts"],
            "hidden": case["inter"],
            "group_size": 128,
            "clamped": case["swiglu_limit"] is not None,
            "masked_faster": best is not None,
            "measured": {
                str(t): {"stock_compact_us": round(s, 1), "masked_package_us": round(m, 1), "speedup": round(s / m, 3)}
                for t, s, m in rows
            },
        }
        if best is not None:
            lo, hi = rows[best[0]][0], rows[best[1] - 1][0]
            gains = [s / m for _, s, m in rows[best[0] : best[1]]]
            entry.update(
                tokens_min=lo, tokens_max=hi, summary=f"{min(gains):.2f}-{max(gains):.2f}x at {lo}-{hi} tokens"
            )
        else:
            entry["summary"] = f"never at least {margin:.2f}x faster"
        configs.append(entry)
    info = result["run_info"]
    commits = ", ".join(r["run_info"]["commit"] for r in results)
    return {
        "about": "Configs SGLang's guard sends to the compact layout, with the token counts at which the masked layout "
        "and the package's activation measured at least `margin` faster (integrations/sglang/layout.py). "
        "Written by benchmarks/masked_layout_table.py.",
        "source": source,
        "commit": commits,
        "device": info["device"],
        "date": result["date"],
        "margin": margin,
        "configs": configs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--result",
        nargs="+",
        default=[
            "benchmarks/results/contig_e2e_NVIDIA-H200.json",
            "benchmarks/results/archive/2026-12-03-c63b2ca/contig_e2e_NVIDIA-H200.json",
        ],
        help="one or more runs of benchmarks/contig_e2e.py (each token count: its slowest run)",
    )
    parser.add_argument("--margin", type=float, default=1.05)
    parser.add_argument("--out", default="sglang_moe_plugins/data/masked_layout.json")
    args = parser.parse_args()
    results = [json.loads((ROOT / path).read_text()) for path in args.result]
    data = table(results, args.margin, ", ".join(args.result))
    (ROOT / args.out).write_text(json.dumps(data, indent=1) + "\n")
    for c in data["configs"]:
        print(f"{c['config']}: {c['summary']}")


if __name__ == "__main__":
    main()
