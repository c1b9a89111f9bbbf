"""Eager host time of one SM90 MegaMoE call: DeepGEMM's calls made directly vs the same calls through
``mega_sm90_fp8`` (its prepared launch) and through the real hook, ``integrations.sglang.mega_moe_hook``
(``integrations.sglang.mega_moe.run``: the layer plan, the op bound once per plan and kept by the Selector, ``Selector.call``). One H200, a process group of one rank, sgl-deep-gemm 0.1.5.post1 (or any 0.1.4.post1+).

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD \\
        python benchmarks/mega_call_overhead.py [--tokens 32] [--experts 8 --hidden 1024 --inter 512 --topk 2] \\
        [--pre-dispatch host|triton]
    PYTHONPATH=$PWD python benchmarks/mega_call_overhead.py --cpu [--profile]   # the hook layer alone, any machine with SGLang

Prints the median of 5 x 1000 back-to-back calls per path (host time: the loop synchronizes once at
its end), the plugin's paths with ``pre_dispatch="host"`` (DeepGEMM's ``mega_moe_pre_dispatch_sm90``,
the default) or ``"triton"`` (the prepared Triton launcher, top-k ids/weights read as they are), and
the difference to the direct calls (always DeepGEMM's pre-dispatch). ``bound_us``: the op bound as the
hook binds it, run by ``Selector.call`` without the adapter (``bound_launch_is_prepared_launch`` must be
true: the plugin's ``prepare`` is memoized, so the hook launches the very closure timed as ``prepared``). Target (issue #12): the hooked call at most 10 us above direct.

``--cpu``: the hook layer alone (no GPU, no DeepGEMM): SGLang's real ``load_plugins()`` and its hooked
``run_mega_routed_experts`` on CPU tensors, a do-nothing ``mega_moe`` plugin (``prepare`` returns a launch
that does nothing) forced; the per-call cost of everything but the plugin's launch (``build_call``, the
bound op, ``Selector.call``; ``hook_layer_us`` = hooked less the output allocation). Thread CPU time, min of
5 x 20000 calls. Target: <= ~8 us. ``--profile``: cProfile of it.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats

from sglang_moe_plugins.bench.mega_overhead import cpu_hook_layer, gpu_call_overhead
from sglang_moe_plugins.bench.provenance import run_info


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inter", type=int, default=512)
    parser.add_argument("--topk", type=int, default=2)
    parser.add_argument("--pre-dispatch", choices=("host", "triton"), default="host")
    parser.add_argument("--cpu", action="store_true", help="the hook layer alone on CPU (SGLang, no GPU)")
    parser.add_argument("--profile", action="store_true", help="with --cpu: cProfile of the hooked call")
    args = parser.parse_args()
    sizes = dict(experts=args.experts, hidden=args.hidden, inter=args.inter, tokens=args.tokens, topk=args.topk)
    if not args.cpu:
        print(json.dumps({"run": run_info(), **gpu_call_overhead(**sizes, pre_dispatch=args.pre_dispatch)}, indent=1))
        return
    results, through = cpu_hook_layer(**sizes)
    print(json.dumps({"run": run_info(), **results}, indent=1))
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20000):
            through()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
