"""One expert-parallel rank for tests/test_ranks.py (gloo, CPU) and tests/gpu/test_ranks_nccl.py (NCCL).

    python tests/rank_worker.py --rank R --world W --init file:///tmp/x --out DIR [--backend gloo|nccl] [--no-sglang]

Every rank runs the same MoE calls (same shapes and flags) on rank-specific data (different values and
masked_m), through SGLang's real ``load_plugins()`` and hooked ``_varlen_deep_gemm_silu_mul_quant`` (or,
with ``--no-sglang``, e.g. on a GPU machine without SGLang, through ``sglang_moe_plugins.silu_mul_quant``,
the same selector), reads the chosen plugin of each call from ``api.get_selector().explain(...)``, and
gathers the choices with ``all_gather_object``. Then it shows what the per-process failure memory does:
a plugin that fails at run time on rank 1 only (a data-dependent failure) makes the ranks' choices
diverge for that key; with ``strict`` rank 1 raises instead. Writes ``DIR/rank{R}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import traceback

#: (label, E, N, D, swiglu_limit, topk): one call of each host branch, small enough for CPU.
CALLS = [
    ("default-path", 8, 6, 512, None, 4),
    ("swiglu-limit", 8, 6, 512, 10.0, 4),
    ("G12-column-major", 4, 16, 1536, None, 2),
    ("Qwen3.5-35B-A3B-EP2-limit", 128, 4, 512, 10.0, 8),
    ("one-expert", 1, 32, 256, None, 1),
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--init", required=True, help="torch.distributed init_method, e.g. file:///tmp/rdzv")
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--no-sglang", action="store_true")
    args = parser.parse_args()
    if args.backend == "nccl":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (see the device notes)

    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if args.backend == "nccl":
        torch.cuda.set_device(args.rank)
        device = torch.device("cuda", args.rank)
    dist.init_process_group(args.backend, init_method=args.init, rank=args.rank, world_size=args.world)
    result: dict = {"rank": args.rank, "world": args.world, "backend": args.backend, "device": str(device)}
    try:
        result.update(run(args, device, dist))
    except BaseException:  # noqa: BLE001 - reported to the parent
        result["error"] = traceback.format_exc()
        raise
    finally:
        pathlib.Path(args.out, f"rank{args.rank}.json").write_text(json.dumps(result, indent=1))
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def run(args, device, dist) -> dict:
    import torch

    from sglang_moe_plugins import Plugin, Registry, Selector, Support, api
    from sglang_moe_plugins.config import parse_config
    from sglang_moe_plugins.ops import silu_mul_quant as smq
    from sglang_moe_plugins.plugins.reference import ReferencePlugin, silu_mul_quant_reference
    from sglang_moe_plugins.testing.ops.silu_mul_quant import compare_with_fp64, tolerance_for

    if args.no_sglang:
        # The selector api.silu_mul_quant would use; built-in plugins from pyproject.toml when the package
        # runs from the checkout without being installed (the GPU machine).
        from builtin_eps import builtin_entry_points

        from sglang_moe_plugins.config import load_config

        selector = Selector(Registry.discover(load_config(), builtin_entry_points()))

        def call(gateup, masked, topk, limit):
            shape, config = smq.describe(
                gateup,
                masked,
                group_size=128,
                topk=topk,
                swiglu_limit=limit,
                scale_layout="row_major" if limit is not None else "column_major",
            )
            outputs = selector.dispatch(smq.OP, smq.SiluMulQuantInputs(gateup, masked), shape, config)
            return outputs.out, outputs.scale

        via = "Selector.dispatch (what sglang_moe_plugins.silu_mul_quant and the hook call)"
    else:
        os.environ.pop("SGLANG_PLUGINS", None)
        import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
        from sglang.srt.plugins import load_plugins

        load_plugins()
        hooked = runner._varlen_deep_gemm_silu_mul_quant
        if getattr(hooked, "__wrapped__", None) is None:
            raise RuntimeError("load_plugins() did not hook _varlen_deep_gemm_silu_mul_quant")

        def call(gateup, masked, topk, limit):
            return hooked(gateup, masked, 128, topk, swiglu_limit=limit)

        via = "SGLang's hooked _varlen_deep_gemm_silu_mul_quant"
        selector = api.get_selector()

    choices = []
    checked = 0
    for i, (label, e, n, d, limit, topk) in enumerate(CALLS):
        gen = torch.Generator().manual_seed(1000 * args.rank + i)  # rank-specific data, same shapes
        gateup = (torch.randn(e, n, 2 * d, generator=gen) * (1 + args.rank)).to(torch.bfloat16).to(device)
        masked = torch.randint(0, n + 1, (e,), generator=gen, dtype=torch.int32).to(device)
        out, scale = call(gateup, masked, topk, limit)
        layout = "row_major" if limit is not None else "column_major"
        shape, config = smq.describe(gateup, masked, group_size=128, topk=topk, swiglu_limit=limit, scale_layout=layout)
        selection = selector.explain(smq.OP, shape, config)
        choices.append(
            {
                "call": label,
                "chosen": selection.chosen.name if selection.chosen else None,
                "candidates": [[c.name, c.verdict] for c in selection.candidates],
            }
        )
        # The answer is right, whichever plugin gave it: the tolerance policy against fp64.
        real = smq.real_rows(masked, n)
        verdict = compare_with_fp64(
            smq.SiluMulQuantInputs(gateup, masked),
            smq.SiluMulQuantOutputs(out, scale),
            shape,
            config,
            tolerance_for(config),
        )
        if not verdict.ok:
            raise AssertionError(f"{label}: {verdict.message}")
        checked += int(real.sum())
    gathered: list = [None] * args.world
    dist.all_gather_object(gathered, choices)
    identical = all(g == gathered[0] for g in gathered)

    # -- the hazard: a data-dependent run-time failure on one rank only -----------------------------
    class FailsOnRankOne(Plugin):
        name = "fails_on_rank_one"
        op = smq.OP
        priority = 100

        def supports(self, shape, config):
            return Support.yes("accepts every call")  # pure: same answer on every rank

        def run(self, inputs, outputs, shape, config):
            if int(inputs.masked_m.sum()) > shape.max_rows * shape.num_experts // 2 and args.rank == 1:
                raise RuntimeError("rank 1: too many rows for this kernel's workspace")
            silu_mul_quant_reference(inputs, outputs, shape, config)

    def divergence(strict: bool):
        sel = Selector(Registry.from_plugins([FailsOnRankOne(), ReferencePlugin()], parse_config({"strict": strict})))
        e, n = 4, 8
        gen = torch.Generator().manual_seed(7)
        gateup = torch.randn(e, n, 512, generator=gen).to(torch.bfloat16).to(device)
        masked = torch.full((e,), n if args.rank == 1 else 1, dtype=torch.int32).to(device)
        shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
        try:
            sel.dispatch(smq.OP, smq.SiluMulQuantInputs(gateup, masked), shape, config)
            outcome = "ok"
        except RuntimeError as exc:
            outcome = f"raised: {exc}"
        first = sel.explain(smq.OP, shape, config).chosen.name
        # A later call of the same key, whatever its data: the failure memory decides.
        return {"outcome": outcome, "chosen_after": first}

    hazard: list = [None] * args.world
    dist.all_gather_object(hazard, divergence(strict=False))
    hazard_strict: list = [None] * args.world
    dist.all_gather_object(hazard_strict, divergence(strict=True))
    dist.barrier()
    return {
        "via": via,
        "choices": choices,
        "gathered": gathered,
        "identical": identical,
        "real_rows_checked": checked,
        "hazard": hazard,
        "hazard_strict": hazard_strict,
    }


if __name__ == "__main__":
    sys.exit(main())
