"""Eager host time per launch of this project's two Triton kernels: Triton's JIT dispatch against the
prepared low-level launch (issue 12, item 2), with the per-call pieces around them timed alone.

Two sections, on one GPU:

- ``silu_mul_quant`` (DSV4-Flash EP8 decode E=32 N=128 D=2048; Qwen3-30B EP1 decode E=128 N=64 D=768):
  ``launch`` (JIT dispatch, every decision made again), the JIT dispatch alone with precomputed
  arguments, the prepared launch (``prepare``'s closure, tensor level and bound-op level),
  ``TritonPlugin.run``, the bare ``LowLevelLaunch`` with pointer integers (the floor of this design),
  and ``torch.empty_like`` for scale.
- MegaMoE pre-dispatch (``sm90_fp8``, E=8 H=1024 T=32 top-k 8, P=8192: the shape where an eager
  ``mega_sm90_fp8`` call took 200 us with ``pre_dispatch="triton"`` and 62 us with ``"host"``):
  ``pre_dispatch`` (JIT path) and its pieces (``choose_tiling``, the PDL probe, the capability query
  it used to make on every call), the JIT dispatch alone, the prepared launcher, the bare low-level
  launch, the dtype conversions ``mega_deep_gemm.run`` makes per call (``topk_ids.to(int32)`` on
  int64 ids is a copy kernel), and sgl-deep-gemm's ``mega_moe_pre_dispatch_sm90`` when importable.

Each row: the median over ``--repeats`` of ``--iters`` back-to-back calls timed on the host
(``perf_counter``, synchronised before and after each batch), in microseconds per call; GPU time is
small at these sizes (2-4 us), so the figures are host-bound. Without CUDA (or Triton) the script
writes a JSON with ``skipped`` and exits 0.

Usage (GPU machine, repository root): ``python benchmarks/host_overhead_kernels.py --out $OUT/host_overhead_kernels.json``
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _commit() -> str:
    """The measured commit: ``$SGLANG_MOE_PLUGINS_COMMIT`` (a copied tree's ``.git`` may be older), else git."""
    from sglang_moe_plugins.bench.provenance import source_commit

    return source_commit(ROOT)


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    for name in ("torch", "triton", "deep_gemm"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "unknown")
        except Exception:  # noqa: BLE001
            out[name] = None
    return out


def time_host(fn: Callable[[], Any], iters: int, repeats: int) -> float:
    """Median host microseconds per call over ``repeats`` batches of ``iters`` calls."""
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - start) / iters * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def silu_section(iters: int, repeats: int) -> list[dict[str, Any]]:
    import torch

    from sglang_moe_plugins.ops.silu_mul_quant import SiluMulQuantInputs, allocate_outputs, describe
    from sglang_moe_plugins.plugins import _triton_silu_mul_quant as K
    from sglang_moe_plugins.plugins.triton import TritonPlugin

    rows = []
    for label, (E, N, D) in {"DSV4-Flash EP8 decode": (32, 128, 2048), "Qwen3-30B EP1 decode": (128, 64, 768)}.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(E, N, 2 * D, device="cuda", generator=gen).to(torch.bfloat16)
        m = torch.randint(0, 4, (E,), device="cuda", dtype=torch.int32, generator=gen)
        shape, config = describe(x, m, group_size=128, topk=8, swiglu_limit=10.0, scale_layout="ue8m0_packed")
        outputs = allocate_outputs(shape, config, x.device)
        inputs = SiluMulQuantInputs(x, m)
        plugin = TritonPlugin()
        bound = plugin.prepare(shape, config)
        launch = bound.launch
        low = getattr(launch, "low_level", None)
        kcfg = K.choose_config(E, N, D, 128, 8)
        index = torch.cuda.current_device()
        plan = K.plan_launch(E, N, D, group_size=128, scale_strides=outputs.scale.stride(), swiglu_limit=10.0,
                             swizzle=False, ue8m0=True, config=kcfg, device_index=index,
                             pointers=(x, m, outputs.out, outputs.scale))
        grid, runtime, kwargs = plan.grid, plan.runtime, plan.kwargs_dict
        ptrs = (x.data_ptr(), m.data_ptr(), outputs.out.data_ptr(), outputs.scale.data_ptr())
        cases: dict[str, Callable[[], Any]] = {
            "torch.empty_like(scale)": lambda: torch.empty_like(outputs.scale),
            "launch (JIT dispatch, decisions per call)": lambda: K.launch(
                x, m, outputs.out, outputs.scale, group_size=128, swiglu_limit=10.0, swizzle=False, ue8m0=True,
                config=kcfg),
            "JIT dispatch alone (kernel[grid], precomputed args)": lambda: K._silu_mul_quant_kernel[grid](
                x, m, outputs.out, outputs.scale, *runtime, **kwargs),
            "prepared launch (tensors)": lambda: launch(x, m, outputs.out, outputs.scale),
            "prepared bound op (inputs, outputs)": lambda: bound(inputs, outputs),
            "TritonPlugin.run (prepared per key)": lambda: plugin.run(inputs, outputs, shape, config),
        }
        if low is not None:
            cases["LowLevelLaunch alone (pointer ints)"] = lambda: low(*ptrs)
        for name, fn in cases.items():
            rows.append({"section": "silu_mul_quant", "shape": f"{label} E={E} N={N} D={D}", "path": name,
                         "us_per_call": round(time_host(fn, iters, repeats), 2)})
        rows.append({"section": "silu_mul_quant", "shape": f"{label} E={E} N={N} D={D}", "path": "low-level entry used",
                     "us_per_call": None, "note": str(low is not None)})
        rows.append({"section": "silu_mul_quant", "shape": f"{label} E={E} N={N} D={D}",
                     "path": "cProfile of TritonPlugin.run (prepared)", "us_per_call": None,
                     "note": profile_top(cases["TritonPlugin.run (prepared per key)"], iters)})
    return rows


def pre_dispatch_section(iters: int, repeats: int) -> list[dict[str, Any]]:
    import torch

    from sglang_moe_plugins.plugins import _mega_pre_dispatch_triton as P

    tokens, hidden, top_k, rows_p, variant = 32, 1024, 8, 8192, "sm90_fp8"
    shape = f"sm90_fp8 E=8 H={hidden} T={tokens} topk={top_k} P={rows_p}"
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, 8, (tokens, top_k), device="cuda", dtype=torch.int32, generator=gen)
    ids64 = ids.to(torch.int64)
    w = torch.rand(tokens, top_k, device="cuda", generator=gen)
    bufs = [torch.empty((rows_p, hidden), dtype=torch.float8_e4m3fn, device="cuda"),
            torch.empty((rows_p, hidden // 128), device="cuda"),
            torch.empty((rows_p, top_k), dtype=torch.int64, device="cuda"),
            torch.empty((rows_p, top_k), device="cuda")]
    launcher = P.prepare_pre_dispatch(*bufs, variant=variant)
    launcher(x, ids, w)
    plan = next(iter(launcher._plans.values()))
    low = getattr(plan, "low_level", None)
    use_pdl = P._use_pdl(x.device)
    planned = P._arguments(x, ids, w, (x.stride(0), ids.stride(0), w.stride(0)), tokens, hidden, *bufs,
                           variant=variant, routed_scaling_factor=1.0, shared_x_sf=None, shared_block_m=0,
                           tiling=None, use_pdl=use_pdl)
    grid, args, kwargs = planned
    kernel = P._kernel()
    leading = (x.data_ptr(), x.stride(0), ids.data_ptr(), ids.stride(0), w.data_ptr(), w.stride(0))
    device = x.device

    def import_statement() -> None:  # what mega_deep_gemm._our_pre_dispatch runs on every call
        from sglang_moe_plugins.plugins._mega_pre_dispatch_triton import pre_dispatch  # noqa: F401

    cases: dict[str, Callable[[], Any]] = {
        "pre_dispatch (JIT path, decisions per call)": lambda: P.pre_dispatch(x, ids, w, *bufs, variant=variant),
        "  the plugin's per-call import statement": import_statement,
        "  choose_tiling": lambda: P.choose_tiling(tokens, hidden, 128),
        "  PDL probe (_use_pdl, cached capability)": lambda: P._use_pdl(device),
        "  torch.cuda.get_device_capability (per call before issue 12)": lambda: torch.cuda.get_device_capability(device),
        "JIT dispatch alone (kernel[grid], precomputed args)": lambda: kernel[grid](*args, **kwargs),
        "prepared launcher (x, topk_ids, topk_weights)": lambda: launcher(x, ids, w),
        "mega_deep_gemm.run: topk_ids.to(int32), int32 ids (no-op)": lambda: ids.to(torch.int32),
        "mega_deep_gemm.run: topk_ids.to(int32), int64 ids (copy kernel)": lambda: ids64.to(torch.int32),
        "mega_deep_gemm.run: topk_weights.to(float32) (no-op)": lambda: w.to(torch.float32),
        "prepared launcher, int64 ids passed directly": lambda: launcher(x, ids64, w),
    }
    if low is not None:
        cases["LowLevelLaunch alone (pointer ints)"] = lambda: low(*leading)
    try:
        import deep_gemm

        host = getattr(deep_gemm, "mega_moe_pre_dispatch_sm90", None)
        if host is not None:
            cases["deep_gemm.mega_moe_pre_dispatch_sm90 (host kernel)"] = lambda: host(
                x, ids, w, *bufs, num_tokens=tokens, group_size=128, routed_scaling_factor=1.0)
    except Exception:  # noqa: BLE001 - no sgl-deep-gemm here
        pass
    out = []
    for name, fn in cases.items():
        try:
            value = round(time_host(fn, iters, repeats), 2)
            note = None
        except Exception as exc:  # noqa: BLE001 - report, keep the other rows
            value, note = None, f"{type(exc).__name__}: {exc}"
        out.append({"section": "mega_pre_dispatch", "shape": shape, "path": name, "us_per_call": value, "note": note})
    out.append({"section": "mega_pre_dispatch", "shape": shape, "path": "low-level entry used", "us_per_call": None,
                "note": str(low is not None)})
    out.append({"section": "mega_pre_dispatch", "shape": shape, "path": "cProfile of pre_dispatch (JIT path)",
                "us_per_call": None, "note": profile_top(lambda: P.pre_dispatch(x, ids, w, *bufs, variant=variant), iters)})
    return out


def profile_top(fn: Callable[[], Any], iters: int, top: int = 25) -> list[str]:
    """Where the host time of ``fn`` goes: cProfile over ``iters`` calls, the ``top`` functions by
    internal time (per-call microseconds, cumulative microseconds, calls per call, function)."""
    import cProfile
    import pstats

    import torch

    fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(iters):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((tottime, cumtime, ncalls, f"{pathlib.Path(filename).name}:{line}({name})"))
    rows.sort(reverse=True)
    return [f"self {t / iters * 1e6:7.2f} us  cum {c / iters * 1e6:7.2f} us  x{n / iters:.1f}  {where}"
            for t, c, n, where in rows[:top]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=None, help="JSON output path")
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    meta: dict[str, Any] = {"benchmark": "host_overhead_kernels", "commit": _commit(), "versions": _versions(),
                            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "iters": args.iters, "repeats": args.repeats}
    skipped = None
    try:
        import torch

        if not torch.cuda.is_available():
            skipped = "no CUDA device"
        else:
            import triton  # noqa: F401

            meta["device"] = torch.cuda.get_device_name()
    except ImportError as exc:
        skipped = f"missing dependency: {exc}"
    if skipped:
        payload = dict(meta, skipped=skipped, rows=[])
    else:
        rows = silu_section(args.iters, args.repeats) + pre_dispatch_section(args.iters, args.repeats)
        payload = dict(meta, rows=rows)
    text = json.dumps(payload, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    for row in payload["rows"]:
        value = "" if row["us_per_call"] is None else f"{row['us_per_call']:8.2f} us"
        note = row.get("note")
        if isinstance(note, list):
            print(f"{row['section']:18s} {row['path']}:")
            for line in note:
                print("    " + line)
            continue
        print(f"{row['section']:18s} {row['shape'][:40]:40s} {row['path'][:62]:62s} {value} {note or ''}")
    if skipped:
        print(f"skipped: {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
