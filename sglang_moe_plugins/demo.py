"""The main job: a demonstration through SGLang's real entry points (``python -m sglang_moe_plugins.demo``).

1. Runs SGLang's own ``load_plugins()``, which loads this package's ``sglang.srt.plugins`` entry point
   and hooks SGLang's ``_varlen_deep_gemm_silu_mul_quant``.
2. For the shapes behind the crashes the package prevents (docs/host-notes.md), calls the stock function
   (``__wrapped__``) and the hooked one with the same random inputs: before (what stock SGLang does with
   the call on a GPU, and the exception its own Python raises here) and after (plugin chosen, why, and the
   numerical check against an independent fp64 computation). Synthetic cases are labelled as such.
3. For every model of the embedded catalog: the hooked call at EP 1 and EP 8 on this machine, and
   which plugin an H200 (sm90) would choose and why.

Runs on a CPU-only machine (there the ``reference`` plugin does the work; on a GPU the kernels do).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .ops.silu_mul_quant import ScaleLayout

__all__ = ["main", "CRASH_CASES"]


@dataclass(frozen=True)
class DemoCase:
    label: str
    experts: int
    rows: int
    hidden: int
    topk: int
    swiglu_limit: float | None
    keep_fp32: bool = False
    #: What stock SGLang does with this call on a GPU (read from its source; docs/host-notes.md).
    on_gpu: str = ""


_PLAIN = (
    "runs: plain SiLU takes SGLang's per_token_group_quant branch, which has no shape limit here; it rounds SiLU to "
    "bf16 before the product, where the plugins keep it in fp32 (docs/host-notes.md)"
)

#: Calls of the DeepGEMM masked runner (local experts E, padded rows N, per-expert size D per rank) behind the
#: crashes the package prevents, and two that stock SGLang runs. Synthetic ones are labelled.
CRASH_CASES = (
    DemoCase(
        "DeepSeek-V4-Flash --tp 4 (E=256, D=2048/4=512, swiglu_limit=10: D // 8 < E)",
        256,
        128,
        512,
        6,
        10.0,
        on_gpu="crashes on SGLang 0.5.19 with --moe-runner-backend deep_gemm when the runner takes its masked layout "
        "(the clamped SwiGLU goes to the DSV4 JIT branch and its assert); SGLang 0.5.20 and later switch this "
        "shape to the compact layout instead (_masked_activation_unsupported_reason), so the call is not made",
    ),
    DemoCase("Qwen3.5-35B-A3B EP2 (E=128, D=512: D // 8 < E)", 128, 64, 512, 8, None, on_gpu=_PLAIN),
    DemoCase("Qwen3-30B-A3B-FP8 EP4 (E=32, D=768: G=6, G % 4 != 0)", 32, 64, 768, 8, None, on_gpu=_PLAIN),
    DemoCase(
        "synthetic: Qwen3-30B-A3B-FP8 EP4 shape with silu_mul_keep_fp32 (G % 4 != 0)",
        32,
        64,
        768,
        8,
        None,
        True,
        on_gpu="crashes: the DSV4 JIT branch's AssertionError; SGLang sets silu_mul_keep_fp32 only under DeepEP v2 with "
        "MXFP8 for an architecture registered with register_deepep_v2_model(..., silu_mul_keep_fp32=True), "
        "which no built-in model is",
    ),
    DemoCase(
        "synthetic: Qwen3.5-35B-A3B EP2 shape with swiglu_limit=10 (the model is plain SiLU)",
        128,
        64,
        512,
        8,
        10.0,
        on_gpu="crashes: the DSV4 JIT branch's AssertionError (any clamped model with D // 8 < E)",
    ),
    DemoCase(
        "synthetic: DeepSeek-V4-Flash EP8 with N=6 rows per expert (N % 4 != 0)",
        32,
        6,
        2048,
        6,
        10.0,
        on_gpu="crashes: the DSV4 JIT branch's AssertionError; SGLang's DeepEP low-latency dispatch sizes N as a "
        "multiple of the ranks, so this N is synthetic",
    ),
)


def _inputs(e: int, n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-6, 5, (e, n, 1), generator=gen).float())
    gateup = (torch.randn(e, n, 2 * d, generator=gen) * mag).to(torch.bfloat16)
    masked = torch.randint(0, n + 1, (e,), generator=gen, dtype=torch.int32)
    masked[0] = n
    if e > 1:
        masked[1] = 0
    return gateup, masked


def _check(
    gateup, masked, out, scale, group: int, limit: float | None, layout: ScaleLayout, keep_fp32: bool = False
) -> dict[str, Any]:
    """The tolerance policy of the conformance kit (an independent fp64 computation), over real rows."""
    from .ops import silu_mul_quant as smq
    from .testing.ops.silu_mul_quant import compare_with_fp64, tolerance_for

    shape, config = smq.describe(
        gateup, masked, group_size=group, topk=1, swiglu_limit=limit, scale_layout=layout, keep_fp32=keep_fp32
    )
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


def run_demo(log_level: str = "WARNING") -> dict[str, Any]:
    logging.basicConfig(level=getattr(logging, log_level), format="%(levelname)s %(name)s: %(message)s")
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    from sglang.srt.plugins import load_plugins  # SGLang's own plugin loader

    load_plugins()
    from . import api
    from .catalog import load_catalog, silu_mul_quant_cases
    from .hardware import Platform
    from .integrations.sglang import hook_status

    hooked = runner._varlen_deep_gemm_silu_mul_quant
    stock = getattr(hooked, "__wrapped__", None)
    report: dict[str, Any] = {"hooks": hook_status(), "crash_cases": [], "catalog": []}
    if stock is None:
        raise SystemExit("sglang-moe-plugins hooks were not applied by load_plugins(); run `sglang-moe-plugins doctor`")
    selector = api.get_selector()
    for i, case in enumerate(CRASH_CASES):
        gateup, masked = _inputs(case.experts, case.rows, case.hidden, seed=i)
        try:
            stock(
                gateup.clone(),
                masked,
                128,
                case.topk,
                swiglu_limit=case.swiglu_limit,
                silu_mul_keep_fp32=case.keep_fp32,
            )
            here_stock = "ran"
        except NotImplementedError as exc:  # the GPU-only kernel of the plain branch: not the shape bug
            here_stock = f"no CPU kernel ({_short(exc)[:80]}...): not the shape bug; see the GPU line"
        except Exception as exc:  # noqa: BLE001 - the point is to show it
            here_stock = _short(exc)
        before = {"on_gpu": case.on_gpu, "here": here_stock}
        out, scale = hooked(
            gateup.clone(), masked, 128, case.topk, swiglu_limit=case.swiglu_limit, silu_mul_keep_fp32=case.keep_fp32
        )
        layout: ScaleLayout = "row_major" if case.swiglu_limit is not None or case.keep_fp32 else "column_major"
        from .ops import silu_mul_quant as smq

        shape, config = smq.describe(
            gateup,
            masked,
            group_size=128,
            topk=case.topk,
            swiglu_limit=case.swiglu_limit,
            scale_layout=layout,
            keep_fp32=case.keep_fp32,
        )
        here = selector.explain(smq.OP, shape, config)
        h200 = selector.explain(smq.OP, shape, dataclasses.replace(config, platform=Platform.cuda(9, 0)))
        chosen = here.chosen.name  # type: ignore[union-attr]  # the hooked call above ran: a plugin was chosen
        report["crash_cases"].append(
            {
                "case": case.label,
                "stock_sglang": before,
                "hooked": {
                    "plugin": chosen,
                    "why": here.candidate(chosen).reason,
                    "not_chosen": {c.name: f"{c.verdict}: {c.reason}" for c in here.candidates if c.name != chosen},
                    "check": _check(gateup, masked, out, scale, 128, case.swiglu_limit, layout, case.keep_fp32),
                },
                "on_h200": {
                    "plugin": h200.chosen.name if h200.chosen else None,
                    "not_chosen": {
                        c.name: f"{c.verdict}: {c.reason}"
                        for c in h200.candidates
                        if h200.chosen is None or c.name != h200.chosen.name
                    },
                },
            }
        )
    for model in load_catalog():
        if model.gpt_oss_activation:
            report["catalog"].append(
                {"model": model.short_name, "note": "gpt-oss activation: handed to SGLang's own path (not modelled)"}
            )
            continue
        for ep in (1, 8):
            if model.experts % ep:
                continue
            (cpu_case,) = silu_mul_quant_cases(model, ep=ep, rows=(6,), platform=Platform.cpu())
            e, n, d = cpu_case.shape.num_experts, cpu_case.shape.max_rows, cpu_case.shape.hidden
            gateup, masked = _inputs(e, n, d, seed=ep)
            out, scale = hooked(gateup, masked, 128, model.topk, swiglu_limit=model.swiglu_limit)
            check = _check(gateup, masked, out, scale, 128, model.swiglu_limit, cpu_case.config.scale_layout)
            (h200_case,) = silu_mul_quant_cases(model, ep=ep, rows=(128,), platform=Platform.cuda(9, 0))
            h200 = selector.explain("silu_mul_quant", h200_case.shape, h200_case.config)
            jit = h200.candidate("jit_ep") if "jit_ep" in {c.name for c in h200.candidates} else None
            report["catalog"].append(
                {
                    "model": model.short_name,
                    "ep": ep,
                    "E": e,
                    "D": d,
                    "swiglu_limit": model.swiglu_limit,
                    "here": selector.explain("silu_mul_quant", cpu_case.shape, cpu_case.config).chosen.name,  # type: ignore[union-attr]  # the hooked call above ran on it
                    "check": check,
                    "h200": h200.chosen.name if h200.chosen else None,
                    "jit_ep_on_h200": f"{jit.verdict}: {jit.reason}" if jit else "not registered",
                }
            )
    report["hook_calls"] = hook_status()["calls"]
    return report


def _print_text(report: dict[str, Any]) -> None:
    print("sglang-moe-plugins demo: SGLang's load_plugins() applied hooks to:")
    for target in report["hooks"]["targets"]:
        print(f"  {'hooked' if target['ok'] else 'NOT hooked'}: {target['path']} ({target['reason']})")
    print("\nThe DeepGEMM masked runner's calls behind the crashes (stock SGLang's own function vs the hooked one)")
    for item in report["crash_cases"]:
        h = item["hooked"]
        print(f"\n* {item['case']}")
        print(f"  before, stock SGLang on a GPU: {item['stock_sglang']['on_gpu']}")
        print(f"  before, stock SGLang here:     {item['stock_sglang']['here']}")
        print(
            f"  after (hooked):                plugin {h['plugin']!r} ({h['why']}); vs fp64: {h['check']['detail']}, "
            f"all real rows written: {h['check']['all_real_rows_written']} -> {'OK' if h['check']['ok'] else 'FAILED'}"
        )
        for name, why in h["not_chosen"].items():
            print(f"      not {name}: {why}")
        print(f"  on an H200 (sm90) it would run: {item['on_h200']['plugin']}")
        for name, why in item["on_h200"]["not_chosen"].items():
            print(f"      not {name}: {why}")
    print("\nEmbedded model catalog (hooked call here, N=6 rows; and the choice on an H200 at N=128)")
    header = f"{'model':<24} {'EP':>2} {'E':>4} {'D':>6} {'limit':>6}  {'here':<13} {'worst/bound':>11} {'ok':<3} {'H200':<13} jit_ep on H200"
    print(header)
    print("-" * len(header))
    for row in report["catalog"]:
        if "note" in row:
            print(f"{row['model']:<24} {row['note']}")
            continue
        limit = "-" if row["swiglu_limit"] is None else f"{row['swiglu_limit']:g}"
        print(
            f"{row['model']:<24} {row['ep']:>2} {row['E']:>4} {row['D']:>6} {limit:>6}  {row['here']:<13} "
            f"{row['check']['worst_vs_bound']:>11.3f} {'yes' if row['check']['ok'] else 'NO':<3} {row['h200']!s:<13} {row['jit_ep_on_h200']}"
        )
    print(f"\nhooked calls served: {report['hook_calls']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_moe_plugins.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--log-level", default="WARNING", help="logging level (INFO shows every selection)")
    args = parser.parse_args(argv)
    report = run_demo(args.log_level)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_text(report)
    failures = [c for c in report["crash_cases"] if not c["hooked"]["check"]["ok"]]
    failures += [r for r in report["catalog"] if "check" in r and not r["check"]["ok"]]
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
