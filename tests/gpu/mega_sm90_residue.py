"""Reference vs DeepGEMM's real SM90 MegaMoE kernel: the residue, per case, for each reference.

For the issue's measured shapes (and the catalog shapes at a prefill T), runs SGLang 0.5.23's SM90
sequence (``mega_moe_pre_dispatch_sm90`` + ``fp8_mega_moe``, called directly: independent of the
plugin) and compares ``y`` with:

- ``per128``: the old reference (L2 activations requantized per 128, exact GEMM sums);
- ``per64``: per-64 fp32 L2 scales, exact GEMM sums;
- ``final``: the default reference (``sm90_numerics_for``: the heuristic's accumulation, ``BLOCK_M
  = 128``: the whole K loop in the tensor-core accumulator, else promoted per scale block; ``terms``
  alignment, 13 bits; since run 2 of 2026-12-01 the same as ``terms13``);
- ``sum13``: the heuristic's mode with the step sum truncated to e8m13 (the default before run 2);
- ``reuse13`` / ``promote13`` / ``reuse14`` / ``reuse15``: the model's parameters forced, to show
  which fits (the 2026-12-01 run also had ``reuse12`` and ``reuse13k16``: both clearly worse);
- ``terms13`` / ``terms14``: the heuristic's mode with the ``terms`` alignment (every addend of a
  32-K step, the accumulator and each FP8 product, truncated at the largest addend's leading bit
  minus 13 / 14 bits, then summed exactly): the adder-tree model of the tensor core.

Prints rel L2 of y, the worst row, calc_diff (DeepGEMM's metric) and the gain <y,ref>/<ref,ref>.
Usage: ``python tests/gpu/mega_sm90_residue.py --out $OUT/residue.json`` (one H200).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch
from mega_sm90_common import build_case, compare, direct_buffer, direct_call, env_ok, reference, single_rank_group

from sglang_moe_plugins.ops.mega_moe.sm90 import Sm90Numerics, sm90_block_m

#: (E, H, I, T, top_k, clamp): the issue's table, then the catalog shapes at prefill T
CASES = [
    (8, 1024, 512, 32, 2, 10.0),
    (16, 2048, 1024, 128, 4, 10.0),
    (32, 4096, 1536, 512, 8, None),
    (32, 7168, 2048, 64, 8, 10.0),
    (32, 4096, 1536, 1, 8, 10.0),
    (8, 1024, 512, 512, 2, 10.0),
    (16, 2048, 768, 512, 8, 10.0),
    (32, 7168, 2048, 512, 8, 10.0),
]

REFERENCES = {
    "per128": Sm90Numerics(l2_act_group=128),
    "per64": Sm90Numerics(),
    "final": None,
    "sum13": "sum13",
    "reuse13": Sm90Numerics("reuse"),
    "promote13": Sm90Numerics("promote"),
    "reuse14": Sm90Numerics("reuse", fraction_bits=14),
    "reuse15": Sm90Numerics("reuse", fraction_bits=15),
    "terms13": "terms13",
    "terms14": "terms14",
}


def _numerics(spec: Sm90Numerics | str | None, tokens: int, top_k: int, experts: int) -> Sm90Numerics | None:
    if not isinstance(spec, str):
        return spec
    mode = "reuse" if sm90_block_m(tokens, 1, top_k, experts) == 128 else "promote"
    return Sm90Numerics(mode, fraction_bits=int(spec[-2:]), alignment="terms" if spec.startswith("terms") else "sum")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--max-cases", type=int, default=len(CASES))
    args = parser.parse_args()
    why = env_ok()
    if why:
        print(f"SKIP: {why}")
        return 0
    group = single_rank_group()
    rows = []
    for experts, hidden, inter, tokens, top_k, clamp in CASES[: args.max_cases]:
        t0 = time.time()
        case = build_case(
            group,
            experts=experts,
            hidden=hidden,
            inter=inter,
            top_k=top_k,
            tokens=tokens,
            clamp=clamp,
            max_tokens=512,
            seed=experts * 1000 + tokens,
        )
        y = direct_call(case, direct_buffer(group, case.shape)).clone()
        torch.cuda.synchronize()
        t_kernel = time.time() - t0
        row = {
            "E": experts,
            "H": hidden,
            "I": inter,
            "T": tokens,
            "top_k": top_k,
            "clamp": clamp,
            "block_m": sm90_block_m(tokens, 1, top_k, experts),
            "unwritten_rows": int((~torch.isfinite(y)).any(-1).sum()),
            "first_call_s": round(t_kernel, 1),
            "refs": {},
        }
        for name, spec in REFERENCES.items():
            res = compare(y, reference(case, _numerics(spec, tokens, top_k, experts)))
            row["refs"][name] = {
                "rel_l2": res.rel_l2,
                "worst_row": res.worst_row,
                "calc_diff": res.calc_diff,
                "gain": res.gain,
            }
        rows.append(row)
        cells = "  ".join(
            f"{n} {r['rel_l2']:.3%}/{r['worst_row']:.2%}/g{r['gain']:.4f}" for n, r in row["refs"].items()
        )
        print(
            f"E={experts} H={hidden} I={inter} T={tokens} k={top_k} clamp={clamp} BLOCK_M={row['block_m']} "
            f"({time.time() - t0:.0f} s): {cells}",
            flush=True,
        )
        if args.out:
            args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "cases": rows}, indent=1))
    print("\n| E, H, I, T, top-k, clamp | BLOCK_M | " + " | ".join(REFERENCES) + " |")
    print("|---|---|" + "---|" * len(REFERENCES))
    for r in rows:
        cells = " | ".join(f"{v['rel_l2']:.2%} ({v['worst_row']:.1%})" for v in r["refs"].values())
        print(f"| {r['E']}, {r['H']}, {r['I']}, {r['T']}, {r['top_k']}, {r['clamp']} | {r['block_m']} | {cells} |")
    print("cells: rel L2 of y over the case (worst row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
