"""Expert parallelism, EP = 2 on two H200s of one host: DeepGEMM's SM90 MegaMoE through the selector.

Run from the repository root (2 GPUs, sgl-deep-gemm 0.1.5.post1 + apache-tvm-ffi 0.1.11 on PYTHONPATH)::

    export PYTHONPATH=/tmp/site:$PWD:$PWD/tests NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    python3 -m torch.distributed.run --nproc_per_node 2 tests/gpu/mega_ep2.py --out $OUT/ep2.json
    timeout 180 python3 -m torch.distributed.run --nproc_per_node 2 tests/gpu/mega_ep2.py --inject-failure-rank 1; echo "exit $?"

Each rank: ``torch.cuda.set_device(rank)``, ``init_process_group("nccl", device_id=...)``, holds half
the experts' FP8 weights (every rank draws the same global weights from one seed), its own tokens
(different counts per rank in some cases, T = 0 on one rank in one) routed over all experts. Checks:

- both ranks choose the same plugin for every case (``mega_sm90_fp8``; ``mega_reference`` declines
  ``ep_size = 2``), compared with ``all_gather_object``;
- every rank's ``y`` (poisoned first) equals the reference of the whole problem (all tokens, all
  experts; each expert's rows with the kernel configuration of the rank that owns the expert) per case
  and per row within ``mega_sm90_common.CASE_RTOL`` / ``ROW_RTOL``.

``--inject-failure-rank R`` (or ``MEGA_EP2_FAIL_RANK=R``): on rank R the chosen plugin's ``run`` raises ``RuntimeError`` before
the kernel. What must happen: the op never falls back per rank (collective), so the error is raised
on rank R, which exits 1; the other rank has launched the kernel, which spins on the cross-rank
barrier. It must not wait forever: torchrun's agent stops the remaining worker once one fails, the
process group's timeout (``--pg-timeout-s``, default 60) aborts a rank stuck in a collective, and a
``faulthandler`` deadline (``--deadline-s``, default 300) dumps every thread's stack and exits.
The script prints each rank's outcome and the seconds it took; the run is recorded in
tests/gpu/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from mega_sm90_common import (
    DEEPGEMM_CALC_DIFF_TOL,
    SHAPES,
    Sm90Case,
    build_case,
    case_rtol,
    compare,
    env_ok,
    poisoned_outputs,
)

from sglang_moe_plugins import api
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.ops.mega_moe.sm90 import sm90_numerics_for, sm90_reference_slots

#: (label, experts, hidden, inter, top_k, tokens per rank, clamp)
CASES = [
    ("E=16 H=2048 I=1024 k=4", 16, 2048, 1024, 4, (64, 64), 10.0),
    ("E=32 H=4096 I=1536 k=8 (prefill, BLOCK_M=128)", 32, 4096, 1536, 8, (256, 256), None),
    (SHAPES["qwen3-30b-a3b"][0] + ", uneven T", *SHAPES["qwen3-30b-a3b"][1:], (7, 3), 10.0),
    (SHAPES["qwen3-30b-a3b"][0] + ", T=0 on rank 1", *SHAPES["qwen3-30b-a3b"][1:], (5, 0), 10.0),
]
MAX_TOKENS = 512


def whole_problem_reference(cases: list[Sm90Case], full: Sm90Case, tokens: list[int]) -> torch.Tensor:
    """``y`` of every rank's tokens, in rank order: each expert's rows as its owner rank's kernel computes them."""
    experts, ranks = full.shape.num_experts, len(cases)
    x = torch.cat([c.inputs.hidden_states for c in cases])
    ids = torch.cat([c.inputs.topk_ids for c in cases])
    w = torch.cat([c.inputs.topk_weights for c in cases]).float()
    if full.config.routed_scaling_factor != 1.0:
        w = w * full.config.routed_scaling_factor
    shape = mm.MegaMoEShape(
        experts, full.shape.hidden, full.shape.intermediate, full.shape.top_k, max_tokens_per_rank=max(1, x.shape[0])
    )
    slots = torch.zeros((x.shape[0], shape.top_k, shape.hidden), dtype=torch.float32, device=x.device)
    per_rank = experts // ranks
    for owner in range(ranks):
        mine = (ids >= owner * per_rank) & (ids < (owner + 1) * per_rank)
        owned = torch.where(mine, ids, torch.full_like(ids, -1))
        inputs = mm.MegaMoEInputs(
            hidden_states=x,
            topk_ids=owned,
            topk_weights=w,
            l1_weights=full.inputs.l1_weights,
            l2_weights=full.inputs.l2_weights,
        )
        numerics = sm90_numerics_for(tokens[owner], ranks, shape.top_k, experts)
        slots += sm90_reference_slots(inputs, shape, full.config, w, numerics)
    acc = torch.zeros((x.shape[0], shape.hidden), dtype=torch.float32, device=x.device)
    for slot in range(shape.top_k):
        acc += slots[:, slot]
    return acc.to(torch.bfloat16)


def _inject_failure(plugin) -> None:
    def fail(*args, **kwargs):
        raise RuntimeError(f"injected failure in {plugin.name}.run on rank {dist.get_rank()}")

    plugin.run = fail
    if hasattr(plugin, "prepare"):
        plugin.prepare = lambda shape, config: fail


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, default=None)
    env_rank = os.environ.get("MEGA_EP2_FAIL_RANK")
    parser.add_argument(
        "--inject-failure-rank",
        type=int,
        default=int(env_rank) if env_rank else None,
        help="make the chosen plugin raise on this rank (default: $MEGA_EP2_FAIL_RANK)",
    )
    parser.add_argument("--pg-timeout-s", type=int, default=60)
    parser.add_argument("--deadline-s", type=int, default=300)
    args = parser.parse_args()
    why = env_ok()
    if why or torch.cuda.device_count() < 2:
        print(f"SKIP: {why or 'needs 2 CUDA devices'}")
        return 0
    faulthandler.dump_traceback_later(args.deadline_s, exit=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group(
        "nccl", device_id=torch.device("cuda", local), timeout=datetime.timedelta(seconds=args.pg_timeout_s)
    )
    group = dist.group.WORLD
    if args.inject_failure_rank == rank:  # before any selection, so no bound launch predates it
        _inject_failure(api.get_registry().get("mega_sm90_fp8").plugin)
    results = []
    t_start = time.time()
    for label, experts, hidden, inter, top_k, tokens, clamp in CASES:
        t0 = time.time()
        half = experts // world
        seed = experts * 100 + hidden
        mk = dict(
            experts=experts, hidden=hidden, inter=inter, top_k=top_k, clamp=clamp, seed=seed, max_tokens=MAX_TOKENS
        )
        case = build_case(
            group,
            tokens=tokens[rank],
            ep_size=world,
            expert_slice=slice(rank * half, (rank + 1) * half),
            token_seed=seed * 10 + rank,
            label=label,
            **mk,
        )
        selection = api.select("mega_moe", case.shape, case.config)
        chosen = selection.chosen.name if selection.chosen else None
        names = [None] * world
        dist.all_gather_object(names, chosen)
        same = len(set(names)) == 1 and names[0] == "mega_sm90_fp8"
        out = poisoned_outputs(case)
        status = "ok"
        try:
            api.dispatch("mega_moe", case.inputs, case.shape, case.config, outputs=out)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported, then this rank exits non-zero
            status = f"{type(exc).__name__}: {exc}"
            print(f"rank {rank}: {label}: raised after {time.time() - t0:.1f} s: {status}", flush=True)
            return 1
        # the whole problem on every rank: gather tokens, rebuild all experts' weights from the seed
        gathered = [None] * world
        dist.all_gather_object(
            gathered, (case.inputs.hidden_states.cpu(), case.inputs.topk_ids.cpu(), case.inputs.topk_weights.cpu())
        )
        full = build_case(group, tokens=0, label=label, **mk)
        cases = [
            Sm90Case(
                mm.MegaMoEInputs(
                    hidden_states=g[0].cuda(),
                    topk_ids=g[1].cuda(),
                    topk_weights=g[2].cuda(),
                    l1_weights=full.inputs.l1_weights,
                    l2_weights=full.inputs.l2_weights,
                ),
                full.shape,
                full.config,
            )
            for g in gathered
        ]
        ref = whole_problem_reference(cases, full, list(tokens))
        start = sum(tokens[:rank])
        res = compare(out.y[: tokens[rank]], ref[start : start + tokens[rank]])
        results.append(
            {
                "case": label,
                "rank": rank,
                "tokens": tokens,
                "chosen": names,
                "same_plugin": same,
                "unwritten_rows": int((~torch.isfinite(out.y[: tokens[rank]])).any(-1).sum()),
                "rel_l2": res.rel_l2,
                "worst_row": res.worst_row,
                "calc_diff": res.calc_diff,
                "gain": res.gain,
                "ok": bool(
                    same
                    and res.ok(case_rtol(max(tokens), world, top_k, experts))
                    and res.calc_diff < DEEPGEMM_CALC_DIFF_TOL
                ),
                "seconds": round(time.time() - t0, 1),
            }
        )
    every = [None] * world
    dist.all_gather_object(every, results)
    if rank == 0:
        flat = [r for rs in every for r in rs]
        for r in flat:
            print(
                f"rank {r['rank']} {r['case']} T={r['tokens']}: chose {r['chosen']}, rel L2 {r['rel_l2']:.3%}, "
                f"worst row {r['worst_row']:.2%}, unwritten {r['unwritten_rows']}, {'OK' if r['ok'] else 'FAIL'}"
            )
        if args.out:
            args.out.write_text(
                json.dumps(
                    {
                        "device": torch.cuda.get_device_name(),
                        "world": world,
                        "results": flat,
                        "seconds": round(time.time() - t_start, 1),
                    },
                    indent=1,
                )
            )
        ok = all(r["ok"] for r in flat)
        print("EP2", "PASSED" if ok else "FAILED", flush=True)
    else:
        ok = all(r["ok"] for r in results)
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
