"""``bench`` output: the side-by-side table, the JSON payload, the plot and the priorities it supports."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..cli.util import table
from .runner import BenchCase, Measurement, geomean

__all__ = [
    "results_table",
    "payload",
    "rank_plugins",
    "shape_rules",
    "priority_toml",
    "plot",
    "smq_table",
    "smq_summary",
    "smq_plot",
]


def _cell(m: Measurement) -> str:
    return f"{m.us:.1f} ({m.frac:.2f})" if m.us is not None and m.frac is not None else m.status


def results_table(cases: list[BenchCase], results: list[Measurement], bandwidth: float) -> str:
    plugins = list(dict.fromkeys(m.plugin for m in results))
    by = {(m.case, m.plugin): m for m in results}
    rows = []
    for case in cases:
        timed = [by[(case.label, p)] for p in plugins if by[(case.label, p)].us is not None]
        best = min(timed, key=lambda m: m.us).plugin if timed else "-"  # type: ignore[arg-type,return-value]  # timed: us set
        rows.append([case.label, case.phase] + [_cell(by[(case.label, p)]) for p in plugins] + [best])
    text = (
        f"silu_mul_quant, us per call (fraction of the copy ceiling, {bandwidth / 1e12:.2f} TB/s measured); "
        "every expert holds N real rows\n" + table(["call", "phase", *plugins, "fastest"], rows)
    )
    reasons = sorted({(m.plugin, m.status, m.reason) for m in results if m.us is None})
    if reasons:
        text += "\n\nnot timed:\n" + "\n".join(f"  {p}: {s}: {r}" for p, s, r in reasons)
    return text


def rank_plugins(results: list[Measurement], all_plugins: dict[str, int]) -> list[tuple[str, int, str]]:
    """``(plugin, priority, why)`` for every plugin of the op, highest first.

    Plugins fastest on at least one call come first (most calls won, then the geometric mean of their time
    over the fastest time); then the plugins this run could not time, in their current order; then the
    timed plugins that were never fastest. Priorities are 10 apart.
    """
    by_case: dict[str, list[Measurement]] = defaultdict(list)
    for m in results:
        if m.us is not None:
            by_case[m.case].append(m)
    wins: dict[str, int] = defaultdict(int)
    ratios: dict[str, list[float]] = defaultdict(list)
    for timed in by_case.values():
        best = min(timed, key=lambda m: m.us)  # type: ignore[arg-type,return-value]  # timed: us set
        wins[best.plugin] += 1
        for m in timed:
            ratios[m.plugin].append(m.us / best.us)  # type: ignore[operator]  # timed: us set
    timed_names = set(ratios)
    winners = sorted((p for p in timed_names if wins[p]), key=lambda p: (-wins[p], geomean(ratios[p])))
    others = sorted((p for p in all_plugins if p not in timed_names), key=lambda p: -all_plugins[p])
    losers = sorted((p for p in timed_names if not wins[p]), key=lambda p: geomean(ratios[p]))
    order = winners + others + losers
    out = []
    for i, name in enumerate(order):
        if name in timed_names:
            why = f"fastest on {wins[name]} of {len(by_case)} calls, {geomean(ratios[name]):.2f}x the fastest (geometric mean over {len(ratios[name])} timed calls)"
        else:
            why = "not timed in this run (unavailable, unsupported or disabled): kept in its current order"
        out.append((name, 10 * (len(order) - i), why))
    return out


def shape_rules(
    cases: list[BenchCase], results: list[Measurement], ranking: list[tuple[str, int, str]]
) -> list[tuple[BenchCase, str, int, str]]:
    """``(case, fastest plugin, priority, why)`` for every call whose fastest plugin is not the one the
    ranking puts first among the plugins that could run it: a rule for that call's exact shape (one per
    shape) giving the fastest plugin a priority above the whole table."""
    order = {name: priority for name, priority, _ in ranking}
    top = max(order.values(), default=0) + 10
    out, seen = [], set()
    for case in cases:
        timed = [m for m in results if m.case == case.label and m.us is not None]
        if not timed or case.shape in seen:
            continue
        best = min(timed, key=lambda m: m.us)  # type: ignore[arg-type,return-value]  # timed: us set
        first = max(timed, key=lambda m: (order.get(m.plugin, m.priority), m.plugin))
        if best.plugin != first.plugin:
            seen.add(case.shape)
            why = (
                f"{case.label}: {best.plugin} {best.us:.2f} us, {first.plugin} (first in [priority]) {first.us:.2f} us"
            )
            out.append((case, best.plugin, top, why))
    return out


def _rule_toml(case: BenchCase, plugin: str, priority: int, why: str) -> list[str]:
    bounds = ", ".join(
        f"{f.name}_min = {getattr(case.shape, f.name)}, {f.name}_max = {getattr(case.shape, f.name)}"
        for f in fields(case.shape)
    )
    return [
        "",
        f"# {why}",
        "[[priority_rules]]",
        'op = "silu_mul_quant"',
        f"when = {{ {bounds} }}",
        f"priority = {{ {plugin} = {priority} }}",
    ]


def priority_toml(
    ranking: list[tuple[str, int, str]], header: dict[str, Any], rules: Sequence[tuple[BenchCase, str, int, str]] = ()
) -> str:
    lines = [
        "# Written by `sglang-moe-plugins bench --write-config`: silu_mul_quant priorities measured on this machine.",
        f"# {header.get('device')} commit {header.get('commit')}; calls: {header.get('calls')}",
        "# Use it as SGLANG_MOE_PLUGINS_CONFIG, or copy the [priority] table (and any [[priority_rules]]) into yours",
        "# (there is no include: a second [priority] table in one file is a TOML error).",
        "",
        "[priority]",
    ]
    for name, priority, why in ranking:
        lines.append(f"{name} = {priority}  # {why}")
    if rules:
        lines += [
            "",
            "# Calls whose fastest plugin is not the first of [priority] above: one rule per measured shape",
            "# (bounds = that shape's fields; docs/configuration.md, 'Priority rules'). Widen the bounds to",
            "# cover the shapes between measured ones only where you measured them too.",
        ]
    for case, plugin, priority, why in rules:
        lines += _rule_toml(case, plugin, priority, why)
    return "\n".join(lines) + "\n"


def payload(
    cases: list[BenchCase],
    results: list[Measurement],
    bandwidth: float,
    info: dict[str, Any],
    ranking: list[tuple[str, int, str]],
    rules: Sequence[tuple[BenchCase, str, int, str]] = (),
) -> dict[str, Any]:
    return {
        "op": "silu_mul_quant",
        "run": info,
        "copy_bandwidth_Bps": bandwidth,
        "method": "median of CUDA-graph replays, inputs rotated past 3x L2; frac = copy-ceiling time of the real bytes / time",
        "calls": [
            {"call": c.label, "model": c.model, "phase": c.phase, "shape": c.shape, "config": c.config} for c in cases
        ],
        "results": results,
        "priorities": [{"plugin": n, "priority": p, "why": w} for n, p, w in ranking],
        "priority_rules": [
            {"call": c.label, "shape": c.shape, "plugin": n, "priority": p, "why": w} for c, n, p, w in rules
        ],
    }


def plot(cases: list[BenchCase], results: list[Measurement], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plugins = list(dict.fromkeys(m.plugin for m in results if m.us is not None))
    by = {(m.case, m.plugin): m for m in results}
    width = 0.8 / max(1, len(plugins))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(cases) * max(1, len(plugins)) * 0.5 + 2), 4.5))
    for j, name in enumerate(plugins):
        xs, ys = [], []
        for i, case in enumerate(cases):
            m = by.get((case.label, name))
            if m is not None and m.frac is not None:
                xs.append(i + (j - (len(plugins) - 1) / 2) * width)
                ys.append(m.frac)
        ax.bar(xs, ys, width=width, label=name)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([c.label for c in cases], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("fraction of the copy ceiling")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------ benchmarks/silu_mul_quant.py
def smq_table(results: list[dict], bw: float, device: str, date: str) -> str:
    """The markdown table of ``benchmarks/silu_mul_quant.py``: one row per case, the paths side by side."""
    lines = [
        f"# silu_mul_quant on {device}, {date}",
        "",
        f"Copy ceiling (device-to-device, read + write): {bw / 1e12:.2f} TB/s. Times: median per call over "
        "CUDA-graph replays, inputs rotated beyond L2, then the median over the timing rounds "
        "(alternating path order; each round's time under rounds_us in the JSON). frac = floor / time. "
        "x_jit = jit_ep time / triton time (triton in jit_ep's layout). same-bytes copy: a plain device copy "
        "moving the case's floor bytes, timed the same way (what a copy reaches at this size).",
        "",
        "triton v7 = the same kernel with kernel v7's launch configuration (the run before), same layout; "
        "v7/now = its time / triton's. copy/triton = same-bytes copy time / triton's; triton - copy = the difference (us).",
        "",
        "| case | E | N | D | rows | scales | limit | floor us | triton us (frac) | triton v7 us | v7/now "
        "| jit_ep us (frac) | x_jit | x_jit v7 | fp8_fallback us (frac) | same-bytes copy us (frac) "
        "| copy/triton | triton - copy us | reference us | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r["case"]
        p = r["paths"]

        def cell(k):
            v = p.get(k)
            if v is None:
                return "-"
            if "error" in v:
                return "ERR"
            return f"{v['us']:.2f} ({v['frac']:.2f})"

        def us(k):
            v = p.get(k, {})
            return f"{v['us']:.2f}" if "us" in v else "-"

        def over(a, b, fmt="{:.2f}"):
            va, vb = p.get(a, {}), p.get(b, {})
            return fmt.format(va["us"] / vb["us"]) if "us" in va and "us" in vb else "-"

        rm = "_rm" if c["layout"] == "column_major" else ""
        ratio = over("jit_ep", "triton" + rm, "{:.3f}")
        ratio_v7 = over("jit_ep", "triton_v7" + rm, "{:.3f}")
        cp, tr = p.get("copy_same_bytes", {}), p.get("triton", {})
        gap = f"{tr['us'] - cp['us']:+.2f}" if "us" in cp and "us" in tr else "-"
        jit_cell = cell("jit_ep") if "jit_ep" in p else ("rejected" if r.get("jit_rejected") else "-")
        checks = r.get("checks", {})
        ok = "ok" if all(v.get("pass") for k, v in checks.items() if k.startswith("triton")) else "FAIL"
        scales = "ue8m0" if c["layout"] == "ue8m0_packed" else "fp32"
        if c["gs"] != 128:
            scales += f" g{c['gs']}"
        if c["swizzle"]:
            scales += " swz"
        ref = f"{p['reference']['us']:.0f}" if "us" in p.get("reference", {}) else "-"
        lines.append(
            f"| {c['name']} | {c['E']} | {c['N']} | {c['D']} | {r['rows']} | {scales} | {c['limit'] or '-'} "
            f"| {r['floor_us']:.2f} | {cell('triton')} | {us('triton_v7')} | {over('triton_v7', 'triton')} "
            f"| {jit_cell} | {ratio} | {ratio_v7} | {cell('fp8_fallback')} | {cell('copy_same_bytes')} "
            f"| {over('copy_same_bytes', 'triton', '{:.3f}')} | {gap} | {ref} | {ok} |"
        )
    return "\n".join(lines)


def smq_summary(results: list[dict]) -> dict:
    """``benchmarks/silu_mul_quant.py``'s summary: the ratios and fractions against their targets."""
    ratios, decode, big, rejected, skew, plugin_ratios = [], [], [], [], {}, []  # type: ignore[var-annotated]
    for r in results:
        c, p = r["case"], r["paths"]
        tri = p.get("triton", {})
        if "jit_ep" in p and "us" in p["jit_ep"]:
            t = p.get("triton_rm" if c["layout"] == "column_major" else "triton", {})
            if "us" in t:
                ratios.append((c["name"], p["jit_ep"]["us"] / t["us"]))
                if "us" in p.get("jit_ep_plugin", {}):
                    plugin_ratios.append((c["name"], p["jit_ep_plugin"]["us"] / t["us"]))
        if "us" not in tri:
            continue
        if r["rows"] <= 512:
            decode.append((c["name"], tri["us"]))
        if r["rows"] >= 8192 and c["D"] >= 2048:
            big.append((c["name"], tri["frac"]))
        if r.get("jit_rejected") and r["rows"] >= 8192:
            rejected.append((c["name"], tri["frac"]))
        base = c["name"].replace(" skew", "")
        skew.setdefault(base, {})["skew" if c["routing"] == "skew" else "uniform"] = tri["us"]
    geo = math.exp(sum(math.log(x) for _, x in ratios) / len(ratios)) if ratios else float("nan")
    edge = _edge_targets(results)
    skews = {k: v["skew"] / v["uniform"] for k, v in skew.items() if "skew" in v and "uniform" in v}
    return {
        "vs_jit": {
            "per_case": ratios,
            "min": min((x for _, x in ratios), default=None),
            "geomean": geo,
            "target": "every >= 1.0, geomean >= 1.2",
        },
        "vs_jit_ep_plugin": {
            "per_case": plugin_ratios,
            "min": min((x for _, x in plugin_ratios), default=None),
            "geomean": math.exp(sum(math.log(x) for _, x in plugin_ratios) / len(plugin_ratios))
            if plugin_ratios
            else float("nan"),
            "use": "default priorities (what selection compares)",
        },
        "decode_us": {"per_case": decode, "max": max((x for _, x in decode), default=None), "target": "<= 6 us"},
        "big_frac": {"per_case": big, "min": min((x for _, x in big), default=None), "target": ">= 0.90"},
        "jit_rejected_frac": {
            "per_case": rejected,
            "min": min((x for _, x in rejected), default=None),
            "target": ">= 0.80",
        },
        "skew_ratio": {"per_case": skews, "max": max(skews.values(), default=None), "target": "<= 1.10"},
        **edge,
    }


def _edge_targets(results: list[dict]) -> dict:
    """Issue 22's targets: against the same-bytes copy (prefill >= 0.97 of it, decode within 0.5 us) and
    against kernel v7 (no shape slower)."""
    prefill, decode, v7 = [], [], []
    for r in results:
        c, p = r["case"], r["paths"]
        tri, cp, old = p.get("triton", {}), p.get("copy_same_bytes", {}), p.get("triton_v7", {})
        if "us" in tri and "us" in cp:
            if c["phase"] == "decode":
                decode.append((c["name"], tri["us"] - cp["us"]))
            else:
                prefill.append((c["name"], cp["us"] / tri["us"]))
        if "us" in tri and "us" in old:
            v7.append((c["name"], old["us"] / tri["us"]))
    return {
        "prefill_vs_same_bytes_copy": {
            "per_case": prefill,
            "min": min((x for _, x in prefill), default=None),
            "target": ">= 0.97",
        },
        "decode_minus_same_bytes_copy_us": {
            "per_case": decode,
            "max": max((x for _, x in decode), default=None),
            "target": "<= 0.5",
        },
        "v7_over_now": {
            "per_case": v7,
            "min": min((x for _, x in v7), default=None),
            "target": ">= 1.0 (no shape slower than kernel v7)",
        },
    }


def smq_plot(results: list[dict], path: str | os.PathLike[str], title: str) -> None:
    """Fraction of the copy ceiling per case of ``triton``, ``jit_ep`` and ``fp8_fallback`` (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["case"]["name"] for r in results]
    fig, ax = plt.subplots(figsize=(max(10, len(names) * 0.55), 6))
    width = 0.27
    for i, (key, label) in enumerate(
        (
            ("triton", "triton"),
            ("jit_ep", "jit_ep (SGLang DSV4 JIT)"),
            ("fp8_fallback", "fp8_fallback (SGLang per_token_group_quant)"),
        )
    ):
        vals = [r["paths"].get(key, {}).get("frac", 0.0) for r in results]
        ax.bar([j + (i - 1) * width for j in range(len(names))], vals, width, label=label)
    ax.axhline(0.9, color="k", ls="--", lw=0.8)
    ax.axhline(0.8, color="gray", ls=":", lw=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("fraction of copy ceiling (real-row bytes)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
