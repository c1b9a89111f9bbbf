"""One rank of the ``expert_parallel`` check: ``python -m sglang_moe_plugins.testing.ep_worker JOB.json RANK``.

Joins the gloo group, loads the plugin, builds the whole problem (every rank builds the same one from
the seed), keeps its tokens and its experts' weights, runs the plugin with ``ep_group`` set, and
writes ``{"rank", "error" | "declined"}`` to the job's output file for this rank.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

__all__ = ["run_rank", "main"]


def run_rank(job: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from ..ops import mega_moe as mm
    from ..ops.mega_moe.reference import mega_moe_reference
    from .case import poison
    from .execute import error_text
    from .loading import load_plugin
    from .ops.mega_moe import compare_rows, find_unwritten_rows
    from .ops.mega_moe_cases import make_problem

    world, tokens = int(job["world"]), [int(t) for t in job["tokens"]]
    dist.init_process_group(
        "gloo",
        init_method=f"file://{job['rendezvous']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=float(job["timeout"])),
    )
    try:
        plugin = load_plugin(job["target"]).plugin
        total, offset, mine = sum(tokens), sum(tokens[:rank]), tokens[rank]
        p = make_problem(
            job["variant"],
            experts=job["experts"],
            hidden=job["hidden"],
            inter=job["inter"],
            tokens=total,
            top_k=job["top_k"],
            clamp=job["clamp"],
            rsf=job["rsf"],
            seed=job["seed"],
            routing="random",
            max_tokens_per_rank=max(total, job["cap"]),
        )
        expected = mm.allocate_outputs(p.shape, p.config, torch.device("cpu"), num_tokens=total)
        sm90 = None
        if job["variant"] == "sm90_fp8":
            from ..ops.mega_moe.sm90 import sm90_numerics_for

            sm90 = sm90_numerics_for(mine, world, job["top_k"], job["experts"])
        mega_moe_reference(p.inputs, expected, p.shape, p.config, sm90=sm90)
        local = job["experts"] // world
        experts = slice(rank * local, (rank + 1) * local)
        rows = slice(offset, offset + mine)

        def part(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return pair[0][experts], pair[1][experts]

        x = p.inputs.hidden_states[rows].clone()
        ids, weights = p.inputs.topk_ids[rows].clone(), p.inputs.topk_weights[rows].clone()  # type: ignore[index]  # tensors when T > 0
        l1, l2 = part(p.inputs.l1_weights), part(p.inputs.l2_weights)
        shape, config = mm.describe(
            x,
            ids,
            weights,
            l1_weights=l1,
            l2_weights=l2,
            variant=job["variant"],
            num_experts=job["experts"],
            hidden_size=job["hidden"],
            intermediate_size=job["inter"],
            top_k=job["top_k"],
            activation_clamp=job["clamp"],
            routed_scaling_factor=job["rsf"],
            ep_size=world,
            max_tokens_per_rank=job["cap"],
        )
        answer = plugin.supports(shape, config)
        if not answer:
            return {
                "rank": rank,
                "declined": f"supports() declines {shape.describe()} [{config.describe()}]: {answer.reason}",
            }
        inputs = mm.MegaMoEInputs(x, ids, weights, l1, l2, ep_group=dist.group.WORLD)
        outputs = mm.allocate_outputs(shape, config, torch.device("cpu"), num_tokens=mine)
        poison(outputs)
        try:
            returned = plugin.run(inputs, outputs, shape, config)
        except Exception as exc:  # noqa: BLE001 - the finding
            return {"rank": rank, "error": f"run() raised {error_text(exc)}"}
        result = outputs if returned is None else returned
        mm.validate_outputs(result, shape, config, getattr(plugin, "name", "?"))
        problem = find_unwritten_rows(result.y, mine) or compare_rows(
            result.y[:mine], expected.y[rows], ids, job["hidden"]
        )
        if problem:
            problem += f" (rank {rank}'s tokens {offset}..{offset + mine - 1} of the whole problem; its experts {experts.start}..{experts.stop - 1})"
        return {"rank": rank, "error": problem}
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with open(args[0]) as f:
        job = json.load(f)
    rank = int(args[1])
    try:
        result = run_rank(job, rank)
    except Exception as exc:  # noqa: BLE001 - reported to the suite
        from .execute import error_text

        result = {"rank": rank, "error": f"the rank failed: {error_text(exc)}"}
    with open(job["out"][rank], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
