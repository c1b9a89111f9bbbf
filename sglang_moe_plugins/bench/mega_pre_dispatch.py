"""MegaMoE pre-dispatch timing of ``benchmarks/mega_pre_dispatch.py``: this project's Triton kernels, SGLang's JIT
``mega_moe_pre_dispatch`` (built from the wheel's sources through tvm-ffi) and the torch reference, checked
bit-exact, timed against the device copy ceiling, and the tiling sweeps behind ``choose_tiling``."""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..ops.mega_moe.formats import pre_dispatch_reference
from ..plugins.deep_gemm.pre_dispatch_triton import PreDispatchTiling, choose_tiling, pre_dispatch
from .mega_pre_dispatch_cases import ROWS, SHAPES, SWEEP_SETS, TOP_K, VARIANTS

__all__ = [
    "VARIANTS",
    "ROWS",
    "TOP_K",
    "SHAPES",
    "SWEEP_SETS",
    "build_sglang_jit",
    "copy_bandwidth",
    "inputs",
    "buffers",
    "same",
    "moved_bytes",
    "time_graph",
    "time_bench",
    "interleave",
    "run_checks",
    "run_timing",
    "run_sweep",
    "print_summary",
]


def build_sglang_jit(jit_root: pathlib.Path) -> Any:
    import tvm_ffi
    import tvm_ffi.cpp

    os.environ.setdefault("TVM_FFI_CUDA_ARCH_LIST", "9.0a")  # what SGLang's JIT targets on an H200
    head = [
        "#include <tvm/ffi/container/tensor.h>",
        "#include <tvm/ffi/dtype.h>",
        "#include <tvm/ffi/error.h>",
        "#include <tvm/ffi/extra/c_env_api.h>",
        "#include <tvm/ffi/function.h>",
    ]
    build_dir = pathlib.Path("/tmp/sgl_mega_pre_dispatch")
    build_dir.mkdir(exist_ok=True)
    source = build_dir / "w.cu"
    source.write_text(
        "\n".join(
            [
                *head,
                f'#include "{jit_root}/csrc/deepseek_v4/mega_moe_pre_dispatch.cuh"',
                "namespace sglang {",
                # make_cpp_args(quant_group_size, is_arch_support_pdl(), write_shared_sf, copy_topk)
                "TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, (MegaMoEPreDispatchKernel<32, true, false, true>::run));",
                "TVM_FFI_DLL_EXPORT_TYPED_FUNC(run_shared, (MegaMoEPreDispatchKernel<32, true, true, true>::run));",
                "}",
            ]
        )
    )
    flags = ["-DSGL_CUDA_ARCH=900", "-std=c++20", "-O3", "--expt-relaxed-constexpr"]
    lib = tvm_ffi.cpp.build(
        "sgl_mega_pre_dispatch",
        cuda_files=[str(source)],
        extra_cuda_cflags=flags,
        extra_cflags=["-std=c++20", "-O3", "-DSGL_CUDA_ARCH=900"],
        extra_include_paths=[str(jit_root / "include")],
        build_directory=str(build_dir),
    )
    return tvm_ffi.load_module(lib), tvm_ffi


def copy_bandwidth() -> float:
    from triton.testing import do_bench

    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")  # noqa: F821 - a closure's name, del'd later
    del x, y
    return 2 * 2**30 / (ms * 1e-3)


def inputs(tokens: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    binades = torch.exp2(torch.randint(-10, 10, (tokens, 1), device="cuda", generator=gen).float())
    x = (torch.randn(tokens, hidden, device="cuda", generator=gen) * binades).to(torch.bfloat16)
    ids = torch.randint(0, 256, (tokens, TOP_K), device="cuda", dtype=torch.int32, generator=gen)
    w = torch.rand(tokens, TOP_K, device="cuda", generator=gen)
    return x, ids, w


def buffers(variant: str, hidden: int) -> list[torch.Tensor]:
    if variant == "mxf4xmxf4":
        bx = torch.full((ROWS, hidden // 2), 0x5A, dtype=torch.int8, device="cuda")
    else:
        bx = torch.full((ROWS, hidden), 0x5A, dtype=torch.int8, device="cuda").view(torch.float8_e4m3fn)
    if variant == "sm90_fp8":
        sf = torch.full((ROWS, hidden // 128), float("nan"), device="cuda")
    else:
        sf = torch.full((ROWS, hidden // 128), 0x5A5A5A5A, dtype=torch.int32, device="cuda")
    return [
        bx,
        sf,
        torch.full((ROWS, TOP_K), 77, dtype=torch.int64, device="cuda"),
        torch.full((ROWS, TOP_K), float("nan"), device="cuda"),
    ]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.uint8)

    return all(torch.equal(raw(u), raw(v)) for u, v in zip(a, b))


def moved_bytes(variant: str, tokens: int, hidden: int) -> int:
    group, out_bytes = VARIANTS[variant]
    scale_bytes = 4 if variant == "sm90_fp8" else 1
    return int(
        tokens * hidden * (2 + out_bytes)
        + tokens * hidden // group * scale_bytes
        + tokens * TOP_K * (8 + 12)
        + (ROWS - tokens) * TOP_K * 12
    )


def time_graph(
    fns: Sequence[Callable[..., None]], stream_ctx: Callable[[Any], Any] | None = None, launches: int = 48
) -> float:
    """Microseconds per launch, from replays of a graph of ``launches`` back-to-back calls cycling
    through ``fns`` (one per input/buffer set)."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    ctx = torch.cuda.graph(graph)
    with stream_ctx(ctx) if stream_ctx else ctx:
        for i in range(launches):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def time_bench(fn: Callable[[], None]) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=20, rep=100, return_mode="median") * 1e3


def interleave(jit: Any, tvm: Any, rounds: int, copy: float) -> list[dict[str, Any]]:
    """SGLang's kernel and our tilings timed in turn, ``rounds`` times, on the shapes where they were
    within a few percent; medians and the per-round ratios (SGLang / ours)."""
    if jit is None:
        raise SystemExit("--interleave needs --jit-root (SGLang's kernel)")
    out = []
    for tokens, hidden, tilings in [
        (512, 4096, [(8, 512, 4), (4, 1024, 4), (16, 512, 8)]),
        (64, 4096, [(1, 4096, 8), (2, 1024, 4)]),
    ]:
        sets = [
            (*inputs(tokens, hidden, seed=3 + i), buffers("fp8xfp4", hidden)) for i in range(1 if tokens <= 256 else 4)
        ]
        chosen = choose_tiling(tokens, hidden, 32)
        times: dict[str, list[float]] = {"sglang_jit": []}
        for _ in range(rounds):
            fns = [(lambda st=st: jit.run(st[0], st[1], st[2], *st[3], None, 0)) for st in sets]
            times["sglang_jit"].append(time_graph(fns, lambda ctx: tvm.use_torch_stream(ctx)))
            for spec in tilings:
                tiling = PreDispatchTiling(*spec)
                fns = [
                    (lambda st=st: pre_dispatch(st[0], st[1], st[2], *st[3], variant="fp8xfp4", tiling=tiling))
                    for st in sets
                ]
                times.setdefault(str(list(spec)), []).append(time_graph(fns))
        row = {
            "T": tokens,
            "H": hidden,
            "floor_us": round(moved_bytes("fp8xfp4", tokens, hidden) / copy * 1e6, 2),
            "default_tiling": [chosen.block_tokens, chosen.block_cols, chosen.num_warps],
            "median_us": {k: round(statistics.median(v), 3) for k, v in times.items()},
            "x_sglang_median_of_rounds": {
                k: round(statistics.median(a / b for a, b in zip(times["sglang_jit"], v)), 3)
                for k, v in times.items()
                if k != "sglang_jit"
            },
            "rounds_us": {k: [round(t, 3) for t in v] for k, v in times.items()},
        }
        print(json.dumps(row), flush=True)
        out.append(row)
        del sets
    return out


def run_checks(jit: Any) -> list[dict[str, Any]]:
    """Bit-exactness of the Triton kernels (and SGLang's, when built) against the torch reference."""
    checks = []
    for variant in VARIANTS:
        for tokens, hidden in [(1, 4096), (37, 7168), (1000, 4096), (8192, 7168), (300, 2560)]:
            for rsf in (1.0, 2.5):
                x, ids, w = inputs(tokens, hidden, seed=tokens + hidden + int(rsf * 7))
                x[min(1, tokens - 1), :32] = 1e-7  # below the FP8 floors' difference
                x[0, 64:96] = 448.0 * 2.0**-3  # absmax exactly 448 * 2^k: the UE8M0 power-of-two edge
                x[0, 96:128] = 3.0  # absmax 6 * 2^-1: the E2M1 scale edge
                want, got = buffers(variant, hidden), buffers(variant, hidden)
                pre_dispatch_reference(x, ids, w, *want, variant=variant, routed_scaling_factor=rsf)
                pre_dispatch(x, ids, w, *got, variant=variant, routed_scaling_factor=rsf)
                row = {"variant": variant, "T": tokens, "H": hidden, "rsf": rsf, "triton_bit_exact": same(want, got)}
                if jit is not None and variant == "fp8xfp4":
                    mine = buffers(variant, hidden)
                    wj = w * rsf if rsf != 1.0 else w  # SGLang scales the weights before its kernel
                    jit.run(x, ids, wj, *mine, None, 0)
                    row["sglang_jit_bit_exact"] = same(want, mine)
                checks.append(row)
                print(json.dumps(row), flush=True)
    if jit is not None:  # shared-expert scale copy (BLOCK_M-paged), SGLang vs reference vs Triton
        for tokens, block_m in [(300, 48), (4000, 192)]:
            x, ids, w = inputs(tokens, 4096, seed=block_m)
            page_rows = -(-tokens // block_m) * (-(-block_m // 128) * 128)
            sfs = [
                torch.as_strided(
                    torch.full((32 * (page_rows + 4),), 0x3C3C3C3C, dtype=torch.int32, device="cuda"),
                    (page_rows, 32),
                    (1, page_rows + 4),
                )
                for _ in range(3)
            ]
            bufs = [buffers("fp8xfp4", 4096) for _ in range(3)]
            pre_dispatch_reference(x, ids, w, *bufs[0], variant="fp8xfp4", shared_x_sf=sfs[0], shared_block_m=block_m)
            pre_dispatch(x, ids, w, *bufs[1], variant="fp8xfp4", shared_x_sf=sfs[1], shared_block_m=block_m)
            jit.run_shared(x, ids, w, *bufs[2], sfs[2], block_m)
            flat = [s.as_strided((s.untyped_storage().nbytes() // 4,), (1,)) for s in sfs]
            row = {
                "variant": "fp8xfp4+shared_sf",
                "T": tokens,
                "block_m": block_m,
                "triton_bit_exact": same(bufs[0], bufs[1]) and torch.equal(flat[0], flat[1]),
                "sglang_jit_bit_exact": same(bufs[0], bufs[2]) and torch.equal(flat[0], flat[2]),
            }
            checks.append(row)
            print(json.dumps(row), flush=True)
    return checks


def run_timing(jit: Any, tvm: Any, copy: float) -> list[dict[str, Any]]:
    """Every variant and shape timed against the copy ceiling ``copy`` (bytes/s)."""
    rows = []
    stream_ctx = (lambda ctx: tvm.use_torch_stream(ctx)) if tvm is not None else None
    for variant in VARIANTS:
        for tokens, hidden in SHAPES:
            sets = [
                (*inputs(tokens, hidden, seed=1 + i), buffers(variant, hidden))
                for i in range(1 if tokens <= 256 else 4)
            ]
            floor_us = moved_bytes(variant, tokens, hidden) / copy * 1e6
            tiling = choose_tiling(tokens, hidden, VARIANTS[variant][0], packed_fp4=variant == "mxf4xmxf4")
            row: dict[str, Any] = {
                "variant": variant,
                "T": tokens,
                "H": hidden,
                "floor_us": round(floor_us, 2),
                "tiling": [tiling.block_tokens, tiling.block_cols, tiling.num_warps],
            }

            def ours(x, ids, w, bufs, pdl=None):
                return lambda: pre_dispatch(x, ids, w, *bufs, variant=variant, pdl=pdl)

            cands: dict[str, tuple[list[Callable[..., None]], Any]] = {
                "triton": ([ours(*st) for st in sets], None),
                "triton_nopdl": ([ours(*st, pdl=False) for st in sets], None),
            }
            if jit is not None and variant == "fp8xfp4":
                cands["sglang_jit"] = (
                    [(lambda st=st: jit.run(st[0], st[1], st[2], *st[3], None, 0)) for st in sets],
                    stream_ctx,
                )
            for name, (fns, ctx) in cands.items():
                try:
                    us = time_graph(fns, ctx)
                    row[name] = {"us": round(us, 2), "frac": round(floor_us / us, 3)}
                except Exception as exc:  # noqa: BLE001
                    row[name] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            if tokens <= 2048:
                x, ids, w, bufs = sets[0]
                us = time_bench(lambda: pre_dispatch_reference(x, ids, w, *bufs, variant=variant))
                row["torch"] = {"us": round(us, 2), "frac": round(floor_us / us, 3)}
            del sets
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def run_sweep(
    jit: Any, tvm: Any, copy: float, sweep_set: str, started: float, budget_s: float, report: dict[str, Any]
) -> list[dict[str, Any]]:
    """The tiling sweep ``sweep_set`` (to set ``choose_tiling``), stopped ``budget_s`` after ``started``."""
    stream_ctx = (lambda ctx: tvm.use_torch_stream(ctx)) if tvm is not None else None
    sweep = []
    for variant, tokens, hidden, tilings in SWEEP_SETS[sweep_set]:
        if time.time() - started > budget_s:
            report["sweep_skipped"] = "time budget"
            break
        sets = [
            (*inputs(tokens, hidden, seed=2 + i), buffers(variant, hidden)) for i in range(1 if tokens <= 256 else 4)
        ]
        floor_us = moved_bytes(variant, tokens, hidden) / copy * 1e6
        best = None
        for spec in tilings:
            tiling = PreDispatchTiling(*spec)
            fns = [
                (lambda st=st: pre_dispatch(st[0], st[1], st[2], *st[3], variant=variant, tiling=tiling)) for st in sets
            ]
            try:
                us = time_graph(fns)
            except Exception as exc:  # noqa: BLE001
                sweep.append(
                    {"variant": variant, "T": tokens, "H": hidden, "tiling": list(spec), "error": str(exc)[:200]}
                )
                continue
            sweep.append(
                {
                    "variant": variant,
                    "T": tokens,
                    "H": hidden,
                    "tiling": list(spec),
                    "us": round(us, 2),
                    "frac": round(floor_us / us, 3),
                }
            )
            if best is None or us < best[0]:
                best = (round(us, 2), list(spec))
        if jit is not None and variant == "fp8xfp4":  # SGLang's kernel on the same shape, same run
            fns = [(lambda st=st: jit.run(st[0], st[1], st[2], *st[3], None, 0)) for st in sets]
            us = time_graph(fns, stream_ctx)
            sweep.append(
                {
                    "variant": variant,
                    "T": tokens,
                    "H": hidden,
                    "tiling": "sglang_jit",
                    "us": round(us, 2),
                    "frac": round(floor_us / us, 3),
                }
            )
        print(f"sweep {variant} T={tokens} H={hidden}: best {best}", flush=True)
        del sets
    return sweep


def print_summary(report: dict[str, Any], checks: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """The run's table on stdout."""
    print(
        f"\n{report['device']} {report['date']} copy {report['copy_TBps']} TB/s; bit-exact: triton "
        f"{all(c['triton_bit_exact'] for c in checks)}, sglang_jit {all(c.get('sglang_jit_bit_exact', True) for c in checks)}"
    )
    print(
        f"{'variant':10s} {'T':>5s} {'H':>5s} {'floor':>7s} | {'triton':>14s} | {'triton_nopdl':>14s} | {'sglang_jit':>14s} | {'torch':>14s}"
    )

    def cell(r: dict, k: str) -> str:
        v = r.get(k)
        return f"{v['us']:7.2f}us {v['frac']:.2f}" if isinstance(v, dict) else ("-" if v is None else "ERR")

    for r in rows:
        print(
            f"{r['variant']:10s} {r['T']:5d} {r['H']:5d} {r['floor_us']:6.2f}u | {cell(r, 'triton'):>14s} | "
            f"{cell(r, 'triton_nopdl'):>14s} | {cell(r, 'sglang_jit'):>14s} | {cell(r, 'torch'):>14s}"
        )
