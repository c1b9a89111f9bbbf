"""The main job: a demonstration through SGLang's real entry points (``python -m sglang_moe_plugins.demo``).

1. Runs SGLang's own ``load_plugins()``, which loads this package's ``sglang.srt.plugins`` entry point
   and hooks SGLang's ``_varlen_deep_gemm_silu_mul_quant``.
2. For the shapes behind the crashes the package prevents (docs/host-notes.md), calls the stock function
   (``__wrapped__``) and the hooked one with the same random inputs: before (what stock SGLang does with
   the call on a GPU, and the exception its own Python raises here) and after (plugin chosen, why, and the
   numerical check against an independent fp64 computation). Synthetic cases are labelled as such.
3. For every model of the embedded catalog: the hooked call at EP 1 and EP 8 on this machine, and
   which plugin an H200 (sm90) would choose and why.

The cases follow the installed release as the release table (``integrations/sglang/version_table.py``) records
it: its function's keywords (a case passing one it lacks, ``silu_mul_keep_fp32`` before 0.5.21, is not run, and
says why) and its scale layouts. Each case is announced, then its outcome printed; one that fails is named with
its error, and the demo goes on, then exits 1.

Runs on a CPU-only machine (there the ``reference`` plugin does the work; on a GPU the kernels do).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .integrations.sglang.versions import SmqHost
    from .ops.silu_mul_quant import ScaleLayout

__all__ = ["main", "run_demo", "CRASH_CASES", "DemoCase"]


@dataclass(frozen=True)
class DemoCase:
    label: str
    #: Local experts E, padded rows per expert N, per-expert size D (gate|up is 2D wide), top-k.
    sizes: tuple[int, int, int, int]
    swiglu_limit: float | None
    keep_fp32: bool = False
    #: What stock SGLang does with this call on a GPU (read from its source; docs/host-notes.md).
    on_gpu: str = ""
    #: Where it differs: what a release with SGLang's masked-layout activation guard (0.5.20+) does instead.
    on_gpu_guarded: str = ""

    def keywords(self) -> dict[str, Any]:
        """The host call's keyword arguments: only those the case sets (a release lacking one is not passed it)."""
        return {"swiglu_limit": self.swiglu_limit} | ({"silu_mul_keep_fp32": True} if self.keep_fp32 else {})


_PLAIN = (
    "runs: plain SiLU takes SGLang's per_token_group_quant branch, which has no shape limit here; it rounds SiLU to "
    "bf16 before the product, where the plugins keep it in fp32 (docs/host-notes.md)"
)

#: Calls of the DeepGEMM masked runner (local experts E, padded rows N, per-expert size D per rank) behind the
#: crashes the package prevents, and two that stock SGLang runs. Synthetic ones are labelled.
CRASH_CASES = (
    DemoCase(
        "DeepSeek-V4-Flash --tp 4 (E=256, D=2048/4=512, swiglu_limit=10: D // 8 < E)",
        (256, 128, 512, 6),
        10.0,
        on_gpu="crashes on this release with --moe-runner-backend deep_gemm when the runner takes its masked layout "
        "(the clamped SwiGLU goes to the DSV4 JIT branch and its assert)",
        on_gpu_guarded="not made: this release checks the DSV4 JIT limits first (_masked_activation_unsupported_reason) "
        "and runs the layer in its compact layout instead; SGLang 0.5.19 crashes here (the DSV4 JIT branch's assert)",
    ),
    DemoCase("Qwen3.5-35B-A3B EP2 (E=128, D=512: D // 8 < E)", (128, 64, 512, 8), None, on_gpu=_PLAIN),
    DemoCase("Qwen3-30B-A3B-FP8 EP4 (E=32, D=768: G=6, G % 4 != 0)", (32, 64, 768, 8), None, on_gpu=_PLAIN),
    DemoCase(
        "synthetic: Qwen3-30B-A3B-FP8 EP4 shape with silu_mul_keep_fp32 (G % 4 != 0)",
        (32, 64, 768, 8),
        None,
        True,
        on_gpu="crashes: the DSV4 JIT branch's AssertionError; SGLang sets silu_mul_keep_fp32 only under DeepEP v2 with "
        "MXFP8 for an architecture registered with register_deepep_v2_model(..., silu_mul_keep_fp32=True), "
        "which no built-in model is",
    ),
    DemoCase(
        "synthetic: Qwen3.5-35B-A3B EP2 shape with swiglu_limit=10 (the model is plain SiLU)",
        (128, 64, 512, 8),
        10.0,
        on_gpu="crashes: the DSV4 JIT branch's AssertionError (any clamped model with D // 8 < E)",
    ),
    DemoCase(
        "synthetic: DeepSeek-V4-Flash EP8 with N=6 rows per expert (N % 4 != 0)",
        (32, 6, 2048, 6),
        10.0,
        on_gpu="crashes: the DSV4 JIT branch's AssertionError; SGLang's DeepEP low-latency dispatch sizes N as a "
        "multiple of the ranks, so this N is synthetic",
    ),
)


@dataclass(frozen=True)
class _Release:
    """The installed SGLang as the release table records it (the entry its hooks were registered with)."""

    version: str
    table_release: str
    parameters: tuple[str, ...]  # of its _varlen_deep_gemm_silu_mul_quant; host: what that does with a call
    host: SmqHost
    guarded: bool  # it checks the masked layout's activation limits before taking that layout (0.5.20+)
    ue8m0: bool  # DeepGEMM's UE8M0 scale mode (packed int32 scales on every branch)

    def not_a_call(self, case: DemoCase) -> str | None:
        """Why ``case`` is no call of this release (its function lacks a keyword the case passes), or None."""
        from .integrations.sglang.versions import KNOWN_TARGETS, SMQ_TARGET

        missing = [name for name in case.keywords() if name not in self.parameters]
        if not missing:
            return None
        has = lambda ts: any(t.path == SMQ_TARGET and missing[0] in t.parameters for t in ts)  # noqa: E731
        since = next((r for r, ts in KNOWN_TARGETS.items() if has(ts)), "no release")
        return (
            f"not run on sglang {self.version}: its _varlen_deep_gemm_silu_mul_quant has no {', '.join(missing)} "
            f"parameter (the release table: from {since}), so SGLang makes no such call on this release"
        )

    def layout(self, swiglu_limit: float | None, keep_fp32: bool = False) -> ScaleLayout:
        from .integrations.sglang.silu_mul_quant import release_scale_layout

        call = {"swiglu_limit": swiglu_limit, "swizzle": False, "silu_mul_keep_fp32": keep_fp32}
        return release_scale_layout(self.host, call, self.ue8m0)


def _installed_release() -> _Release:
    from sglang.srt.layers import deep_gemm_wrapper

    from .integrations.sglang.versions import GUARD_TARGET, SMQ_TARGET, version_case

    case = version_case()
    target = next((t for t in case.targets if t.path == SMQ_TARGET), None)
    if not case.hooks or target is None or case.version is None or case.table_release is None:
        raise SystemExit(f"sglang-moe-plugins demo: {case.message}; nothing is hooked (`sglang-moe-plugins doctor`)")
    guarded = any(t.path == GUARD_TARGET for t in case.targets)
    ue8m0 = bool(getattr(deep_gemm_wrapper, "DEEPGEMM_SCALE_UE8M0", False))
    return _Release(case.version, case.table_release, target.parameters, target.host, guarded, ue8m0)  # type: ignore[arg-type]  # the silu_mul_quant target's record is an SmqHost


def _inputs(e: int, n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-6, 5, (e, n, 1), generator=gen).float())
    gateup = (torch.randn(e, n, 2 * d, generator=gen) * mag).to(torch.bfloat16)
    masked = torch.randint(0, n + 1, (e,), generator=gen, dtype=torch.int32)
    masked[0] = n
    if e > 1:
        masked[1] = 0
    return gateup, masked


def _check(gateup, masked, out, scale, shape: Any, config: Any) -> dict[str, Any]:
    """The tolerance policy of the conformance kit (an independent fp64 computation), over real rows."""
    from .ops import silu_mul_quant as smq
    from .testing.ops.silu_mul_quant import compare_with_fp64, tolerance_for

    outputs = smq.SiluMulQuantOutputs(out, scale)
    smq.validate_outputs(outputs, shape, config)
    inputs = smq.SiluMulQuantInputs(gateup, masked)
    written = not torch.isnan(out[smq.real_rows(masked, shape.max_rows)].float()).any().item()
    result = compare_with_fp64(inputs, outputs, shape, config, tolerance_for(config))
    return {
        "all_real_rows_written": written,
        "within_tolerance": result.ok,
        "worst_vs_bound": result.worst_value_ratio,
        "detail": result.message,
        "ok": written and result.ok,
    }


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:140]}"


def _not_chosen(selection: Any) -> dict[str, str]:
    chosen = selection.chosen.name if selection.chosen else None
    return {c.name: f"{c.verdict}: {c.reason}" for c in selection.candidates if c.name != chosen}


def _crash_case(case: DemoCase, seed: int, release: _Release, hooked: Callable, stock: Callable) -> dict[str, Any]:
    from . import api
    from .hardware import Platform
    from .ops import silu_mul_quant as smq

    e, n, d, topk = case.sizes
    gateup, masked = _inputs(e, n, d, seed=seed)
    try:
        stock(gateup.clone(), masked, 128, topk, **case.keywords())
        here_stock = "ran"
    except NotImplementedError as exc:  # the GPU-only kernel of the plain branch: not the shape bug
        here_stock = f"no CPU kernel ({_short(exc)[:80]}...): not the shape bug; see the GPU line"
    except Exception as exc:  # noqa: BLE001 - the point is to show it
        here_stock = _short(exc)
    on_gpu = case.on_gpu_guarded if release.guarded and case.on_gpu_guarded else case.on_gpu
    out, scale = hooked(gateup.clone(), masked, 128, topk, **case.keywords())
    limit, keep, layout = case.swiglu_limit, case.keep_fp32, release.layout(case.swiglu_limit, case.keep_fp32)
    shape, config = smq.describe(
        gateup, masked, group_size=128, topk=topk, swiglu_limit=limit, scale_layout=layout, keep_fp32=keep
    )
    selector = api.get_selector()
    here = selector.explain(smq.OP, shape, config)
    h200 = selector.explain(smq.OP, shape, dataclasses.replace(config, platform=Platform.cuda(9, 0)))
    chosen = here.chosen.name  # type: ignore[union-attr]  # the hooked call above ran: a plugin was chosen
    return {
        "case": case.label,
        "stock_sglang": {"on_gpu": on_gpu, "here": here_stock},
        "hooked": {
            "plugin": chosen,
            "why": here.candidate(chosen).reason,
            "not_chosen": _not_chosen(here),
            "check": _check(gateup, masked, out, scale, shape, config),
        },
        "on_h200": {"plugin": h200.chosen.name if h200.chosen else None, "not_chosen": _not_chosen(h200)},
    }


def _catalog_row(model: Any, ep: int, release: _Release, hooked: Callable) -> dict[str, Any]:
    from . import api
    from .catalog import silu_mul_quant_cases
    from .hardware import Platform

    selector = api.get_selector()
    (cpu_case,) = silu_mul_quant_cases(model, ep=ep, rows=(6,), platform=Platform.cpu())
    e, n, d = cpu_case.shape.num_experts, cpu_case.shape.max_rows, cpu_case.shape.hidden
    gateup, masked = _inputs(e, n, d, seed=ep)
    out, scale = hooked(gateup, masked, 128, model.topk, swiglu_limit=model.swiglu_limit)
    config = dataclasses.replace(cpu_case.config, scale_layout=release.layout(model.swiglu_limit))
    check = _check(gateup, masked, out, scale, cpu_case.shape, config)
    here = selector.explain("silu_mul_quant", cpu_case.shape, config)
    (h200_case,) = silu_mul_quant_cases(model, ep=ep, rows=(128,), platform=Platform.cuda(9, 0))
    h200 = selector.explain("silu_mul_quant", h200_case.shape, h200_case.config)
    jit = h200.candidate("jit_ep") if "jit_ep" in {c.name for c in h200.candidates} else None
    return {
        "model": model.short_name,
        "ep": ep,
        "E": e,
        "D": d,
        "swiglu_limit": model.swiglu_limit,
        "here": here.chosen.name if here.chosen else None,
        "check": check,
        "h200": h200.chosen.name if h200.chosen else None,
        "jit_ep_on_h200": f"{jit.verdict}: {jit.reason}" if jit else "not registered",
    }


def _case_lines(item: dict[str, Any]) -> list[str]:
    h = item["hooked"]
    lines = [
        f"  before, stock SGLang on a GPU: {item['stock_sglang']['on_gpu']}",
        f"  before, stock SGLang here:     {item['stock_sglang']['here']}",
        f"  after (hooked):                plugin {h['plugin']!r} ({h['why']}); vs fp64: {h['check']['detail']}, "
        f"all real rows written: {h['check']['all_real_rows_written']} -> {'OK' if h['check']['ok'] else 'FAILED'}",
    ]
    lines += [f"      not {name}: {why}" for name, why in h["not_chosen"].items()]
    lines.append(f"  on an H200 (sm90) it would run: {item['on_h200']['plugin']}")
    lines += [f"      not {name}: {why}" for name, why in item["on_h200"]["not_chosen"].items()]
    return lines


_CATALOG_HEADER = (
    f"{'model':<24} {'EP':>2} {'E':>4} {'D':>6} {'limit':>6}  {'here':<13} {'worst/bound':>11} {'ok':<3} "
    f"{'H200':<13} jit_ep on H200"
)


def _catalog_line(row: dict[str, Any]) -> str:
    if "note" in row:
        return f"{row['model']:<24} {row['note']}"
    limit = "-" if row["swiglu_limit"] is None else f"{row['swiglu_limit']:g}"
    return (
        f"{row['model']:<24} {row['ep']:>2} {row['E']:>4} {row['D']:>6} {limit:>6}  {row['here']!s:<13} "
        f"{row['check']['worst_vs_bound']:>11.3f} {'yes' if row['check']['ok'] else 'NO':<3} {row['h200']!s:<13} "
        f"{row['jit_ep_on_h200']}"
    )


def _attempt(
    name: str, label: str, release: _Release, say: Callable[[str], None], report: dict, run: Callable
) -> tuple[Any, str | None]:
    """``run()``; when it raises or its check fails, one line naming the case and its error (the traceback on
    stderr), and the case in ``report["failures"]``; the demo goes on. Returns the result (None if it raised)
    and the error."""
    try:
        result = run()
        check = result["hooked"]["check"] if "hooked" in result else result["check"]
        error = None if check["ok"] else f"not within the fp64 check: {check['detail']}"
    except Exception as exc:  # noqa: BLE001 - named and reported; the other cases still run
        traceback.print_exc(file=sys.stderr)
        result, error = None, _short(exc)
    if error is not None:
        say(f"{name} FAILED ({label}) on sglang {release.version}: {error}")
        report["failures"].append(f"{name} ({label})")
    return result, error


def run_demo(log_level: str = "WARNING", say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the demonstration; ``say`` gets each line of the text report as it is known (a case is announced
    before it runs). Returns the report (``failures``: the cases that failed, by name)."""
    logging.basicConfig(level=getattr(logging, log_level), format="%(levelname)s %(name)s: %(message)s")
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    from sglang.srt.plugins import load_plugins  # SGLang's own plugin loader

    load_plugins()
    from .catalog import load_catalog
    from .integrations.sglang import hook_status

    hooked = runner._varlen_deep_gemm_silu_mul_quant
    stock = getattr(hooked, "__wrapped__", None)
    report: dict[str, Any] = {"hooks": hook_status(), "crash_cases": [], "catalog": [], "failures": []}
    if stock is None:
        raise SystemExit("sglang-moe-plugins hooks were not applied by load_plugins(); run `sglang-moe-plugins doctor`")
    release = _installed_release()
    report["sglang"] = {"version": release.version, "table_release": release.table_release}
    say(f"sglang-moe-plugins demo on installed sglang {release.version} (release table entry {release.table_release})")
    say("SGLang's load_plugins() applied hooks to:")
    for target in report["hooks"]["targets"]:
        say(f"  {'hooked' if target['ok'] else 'NOT hooked'}: {target['path']} ({target['reason']})")
    say("\nThe DeepGEMM masked runner's calls behind the crashes (stock SGLang's own function vs the hooked one)")
    total = len(CRASH_CASES)
    for i, case in enumerate(CRASH_CASES):
        name = f"case {i + 1}/{total}"
        say(f"\n{name}: {case.label}")
        why = release.not_a_call(case)
        if why:
            report["crash_cases"].append({"case": case.label, "not_run": why})
            say(f"{name}: {why}")
            continue
        item, error = _attempt(
            name, case.label, release, say, report, partial(_crash_case, case, i, release, hooked, stock)
        )
        report["crash_cases"].append(item or {"case": case.label, "error": error})
        if item is not None:
            for line in _case_lines(item):
                say(line)
            if item["hooked"]["check"]["ok"]:
                say(f"{name}: OK (plugin {item['hooked']['plugin']!r} here, {item['on_h200']['plugin']!r} on an H200)")
    say("\nEmbedded model catalog (hooked call here, N=6 rows; and the choice on an H200 at N=128)")
    say(_CATALOG_HEADER)
    say("-" * len(_CATALOG_HEADER))
    for model in load_catalog():
        if model.gpt_oss_activation:
            row = {"model": model.short_name, "note": "gpt-oss activation: handed to SGLang's own path (not modelled)"}
            report["catalog"].append(row)
            say(_catalog_line(row))
            continue
        for ep in (1, 8):
            if model.experts % ep:
                continue
            run = partial(_catalog_row, model, ep, release, hooked)
            row, error = _attempt("catalog", f"{model.short_name} EP{ep}", release, say, report, run)
            report["catalog"].append(row or {"model": model.short_name, "ep": ep, "error": error})
            if row is not None:
                say(_catalog_line(row))
    report["hook_calls"] = hook_status()["calls"]
    say(f"\nhooked calls served: {report['hook_calls']}")
    if report["failures"]:
        say(f"demo FAILED on sglang {release.version}: {'; '.join(report['failures'])}")
    else:
        skipped = sum("not_run" in c for c in report["crash_cases"])
        rows = sum("note" not in r for r in report["catalog"])
        say(
            f"demo OK on sglang {release.version}: {total - skipped} cases checked"
            + (f" ({skipped} not run: not in this release)" if skipped else "")
            + f", {rows} catalog calls checked"
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_moe_plugins.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON (progress lines on stderr)")
    parser.add_argument("--log-level", default="WARNING", help="logging level (INFO shows every selection)")
    args = parser.parse_args(argv)
    stream = sys.stderr if args.json else sys.stdout
    report = run_demo(args.log_level, say=lambda line: print(line, file=stream, flush=True))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
