"""Run the long CUDA fuzz (tests/gpu/test_fuzz_cuda.py, 10,000 cases per CUDA plugin) as W parallel
shards and merge their summaries into one JSON. Run from the repository root on the GPU machine:

    PYTHONPATH=$PWD:$PWD/tests python tests/gpu/run_long_fuzz.py --seed 20261130 --shards 14 \
        --out tests/fuzz_runs/<date>-gpu-long-seed20261130.json

First every kernel the compact long profile can ask for is compiled in parallel (Triton's on-disk cache
is then shared by the shards). Each shard is its own pytest process on the same GPU (``MOE_FUZZ_SHARD=k/W``)
with one CPU thread; it writes its tallies every 250 cases. On SIGTERM (e.g. ``timeout``) the shards are
stopped with SIGINT and the summary says ``interrupted``. Exit status: 0 when every shard passed, else 1
(the failing shard's log is printed). Logs go next to the summary (``<out>.shardK.log``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _warm(keys: list[tuple]) -> int:
    """Compile the triton plugin's kernels for these (D, group, limit, swizzle, UE8M0) keys (one process)."""
    import torch

    from sglang_moe_plugins.plugins.triton_smq import launch as K

    for hidden, group, limit, swizzle, ue8m0 in keys:
        groups = hidden // group
        x = torch.zeros(1, 1, 2 * hidden, dtype=torch.bfloat16, device="cuda")
        m = torch.ones(1, dtype=torch.int32, device="cuda")
        out = torch.empty(1, 1, hidden, dtype=torch.float8_e4m3fn, device="cuda")
        scale = torch.empty(
            1, 1, (groups + 3) // 4 if ue8m0 else groups, dtype=torch.int32 if ue8m0 else torch.float32, device="cuda"
        )
        K.launch(x, m, out, scale, group_size=group, swiglu_limit=limit, swizzle=swizzle, ue8m0=ue8m0)
    torch.cuda.synchronize()
    return len(keys)


def prewarm(workers: int) -> float:
    """Fill Triton's on-disk cache with every kernel the compact long profile can ask for, in parallel."""
    import multiprocessing as mp

    sys.path.insert(0, str(HERE.parent))
    from fuzz_cases import COMPACT_GROUPS

    from sglang_moe_plugins.ops.silu_mul_quant import GROUP_SIZES

    keys = [
        (g * n, g, limit, swizzle, ue8m0)
        for g in GROUP_SIZES
        for n in COMPACT_GROUPS
        for limit in (None, 1.0)
        for swizzle in (False, True)
        for ue8m0 in (False, True)
    ]
    start = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(_warm, [keys[i::workers] for i in range(workers)])
    return time.time() - start


def host_specs(seed: int, examples: int) -> tuple[list, list]:
    """The template combinations of SGLang's kernels (DSV4 JIT for jit_ep, per_token_group_quant for
    fp8_fallback) that the long run's cases ask for on sm90: the cases drawn as the shards draw them
    without hypothesis, kept where the plugin's ``supports`` accepts the call. The combinations depend on
    the group size, scale layout, swizzle and limit only, and 10,000 cases reach every one the plugins
    accept (16 and 20), so the hypothesis path's cases are covered too."""
    import dataclasses
    import random

    import torch

    sys.path.insert(0, str(HERE.parent))
    import fuzz_cases as fc

    from sglang_moe_plugins.bench.sglang_kernels import plugin_specs
    from sglang_moe_plugins.hardware import Platform
    from sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback import Fp8FallbackPlugin
    from sglang_moe_plugins.plugins.sglang_kernels.host import HostKernels, use_host_kernels
    from sglang_moe_plugins.plugins.sglang_kernels.jit_ep import JitEpPlugin

    jit_ep, fallback = JitEpPlugin(), Fp8FallbackPlugin()
    dsv4, ptgq = set(), set()
    never_called = HostKernels(None, None, source="enumeration only")  # supports() asks only that kernels exist
    with use_host_kernels(never_called):
        for i in range(examples):
            case = fc.draw_case(random.Random(seed * 100_003 + i), compact=True)
            gateup = torch.empty(case["e"], case["n"], 2 * case["d"], dtype=torch.bfloat16)
            shape, config = fc.describe_case(case, gateup, torch.zeros(case["e"], dtype=torch.int32))
            config = dataclasses.replace(config, platform=Platform.cuda(9, 0))
            want_dsv4, want_ptgq = plugin_specs(shape, config)
            if jit_ep.supports(shape, config):
                dsv4.add(want_dsv4)
            if fallback.supports(shape, config):
                ptgq.add(want_ptgq)
    return sorted(dsv4), sorted(ptgq, key=str)


def compile_host(directory: Path, seed: int, examples: int, workers: int) -> int:
    """Compile (no GPU needed, nvcc and tvm-ffi are) SGLang's kernels for the long run into ``directory``
    in the layout of ``.device/sgl_prebuilt``; modules already there are skipped."""
    dsv4, ptgq = host_specs(seed, examples)  # puts tests/gpu on sys.path
    from sglang_host import JIT_ROOT

    from sglang_moe_plugins.bench.sglang_kernels import SglangJit

    jit = SglangJit(JIT_ROOT, directory)

    def built(tag: str) -> bool:
        return (directory / tag / f"sgl_{tag}.so").is_file()

    todo_dsv4 = [s for s in dsv4 if not built(jit.dsv4_source(s)[0])]
    todo_ptgq = [s for s in ptgq if not built(jit.ptgq_source(s)[0])]
    sys.stdout.write(
        f"{len(dsv4)} DSV4 and {len(ptgq)} per_token_group_quant combinations; "
        f"compiling {len(todo_dsv4) + len(todo_ptgq)}\n"
    )
    sys.stdout.flush()
    for lib in jit.compile_only(todo_dsv4, todo_ptgq, workers=workers):
        sys.stdout.write(lib + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--shards", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--examples", type=int, default=10_000, help="cases per plugin, over all shards")
    parser.add_argument("--out", type=Path, help="merged summary (JSON)")
    parser.add_argument(
        "--compile-host",
        type=Path,
        metavar="DIR",
        help="only compile the SGLang kernels the run asks for into DIR (e.g. .device/sgl_prebuilt)",
    )
    parser.add_argument("--workers", type=int, default=2, help="parallel compilers for --compile-host")
    parser.add_argument("--test-file", type=Path, default=HERE / "test_fuzz_cuda.py", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-prewarm",
        dest="prewarm",
        action="store_false",
        help="skip compiling the compact profile's kernels up front",
    )
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error(f"--shards={args.shards}: must be >= 1")
    if args.compile_host is not None:
        return compile_host(args.compile_host, args.seed, args.examples, args.workers)
    if args.out is None:
        parser.error("--out is required (or --compile-host DIR)")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    warm_s = prewarm(args.shards) if args.prewarm else 0.0
    sys.stdout.write(f"prewarm: {warm_s:.1f}s\n")
    sys.stdout.flush()
    start = time.time()
    procs = []
    for k in range(args.shards):
        summary = args.out.with_name(f"{args.out.stem}.shard{k}.json")
        log = args.out.with_name(f"{args.out.stem}.shard{k}.log")
        # one CPU thread per shard: the fp64 comparison of 14 shards x all cores thrashed (0.6 s per case)
        threads = {k: os.environ.get(k, "1") for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        env = dict(
            os.environ,
            **threads,
            MOE_FUZZ_PROFILE="long",
            MOE_FUZZ_SEED=str(args.seed),
            MOE_FUZZ_EXAMPLES=str(args.examples),
            MOE_FUZZ_SHARD=f"{k}/{args.shards}",
            MOE_FUZZ_SUMMARY=str(summary),
        )
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            str(args.test_file),
            "-p",
            "no:cacheprovider",
            "-k",
            "fuzz_silu_mul_quant",
        ]
        handle = open(log, "w")
        # own session: a `timeout` that signals our process group reaches the shards only through stop()
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append((k, proc, summary, log, handle))

    interrupted = []

    def stop(signum, frame):  # e.g. `timeout`: let every shard finish its case and write its tallies
        interrupted.append(signum)
        for _, proc, *_rest in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, stop)
    counts: Counter = Counter()
    worst: dict[str, float] = {}
    failed = []
    shards = []
    for k, proc, summary, log, handle in procs:
        while True:
            try:
                rc = proc.wait()
                break
            except InterruptedError:  # pragma: no cover - wait() is retried after the handler
                continue
        handle.close()
        shard = {"shard": k, "rc": rc, "log": log.name}
        if summary.exists():
            data = json.loads(summary.read_text())
            counts.update(data["counts"])
            for name, value in data["worst"].items():
                worst[name] = max(worst.get(name, 0.0), value)
            shard["seconds"] = data["seconds"]
            shard["device"] = data["device"]
            summary.unlink()
        shards.append(shard)
        if rc != 0 and not (interrupted and rc == 2):  # 2: pytest interrupted (SIGINT), tallies written
            failed.append(k)
            sys.stdout.write(f"--- shard {k} failed (rc {rc}); its log:\n{log.read_text()[-6000:]}\n")

    merged = {
        "profile": "long",
        "seed": args.seed,
        "examples_per_plugin": args.examples,
        "shards": shards,
        "prewarm_seconds": round(warm_s, 1),
        "wall_seconds": round(time.time() - start, 1),
        "counts": dict(sorted(counts.items())),
        "worst": worst,
        "failed_shards": failed,
        "interrupted": bool(interrupted),
        "complete": not failed and not interrupted,
    }
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    sys.stdout.write(json.dumps(merged, indent=2) + "\n")
    return 1 if failed or interrupted else 0


if __name__ == "__main__":
    raise SystemExit(main())
