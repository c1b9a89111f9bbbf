"""Eager host time per launch of this project's two Triton kernels (``benchmarks/host_overhead_kernels.py``):
Triton's JIT dispatch against the prepared low-level launch, with the per-call pieces around them timed alone."""

from __future__ import annotations

import pathlib
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["versions", "time_host", "silu_section", "pre_dispatch_section", "profile_top"]


def versions() -> dict[str, Any]:
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

    from ..ops.silu_mul_quant import SiluMulQuantInputs, allocate_outputs, describe
    from ..plugins.triton_smq import kernel as kernel_module, launch as K
    from ..plugins.triton_smq.plugin import TritonPlugin
    from ..plugins.triton_smq.tuning import choose_config

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
        launch = bound.launch  # type: ignore[attr-defined]  # the prepared launch object
        low = getattr(launch, "low_level", None)
        kcfg = choose_config(E, N, D, 128, 8)
        index = torch.cuda.current_device()
        plan = K.plan_launch(
            E,
            N,
            D,
            group_size=128,
            scale_strides=outputs.scale.stride(),  # type: ignore[arg-type]  # a 3-d scale
            swiglu_limit=10.0,
            swizzle=False,
            ue8m0=True,
            config=kcfg,
            device_index=index,
            pointers=(x, m, outputs.out, outputs.scale),
        )
        grid, runtime, kwargs = plan.grid, plan.runtime, plan.kwargs_dict  # type: ignore[union-attr]  # a plan: the grid is not empty
        ptrs = (x.data_ptr(), m.data_ptr(), outputs.out.data_ptr(), outputs.scale.data_ptr())
        cases: dict[str, Callable[[], Any]] = {
            "torch.empty_like(scale)": lambda: torch.empty_like(outputs.scale),
            "launch (JIT dispatch, decisions per call)": lambda: K.launch(
                x,
                m,
                outputs.out,
                outputs.scale,
                group_size=128,
                swiglu_limit=10.0,
                swizzle=False,
                ue8m0=True,
                config=kcfg,
            ),
            "JIT dispatch alone (kernel[grid], precomputed args)": lambda: kernel_module.silu_mul_quant_kernel[grid](
                x, m, outputs.out, outputs.scale, *runtime, **kwargs
            ),
            "prepared launch (tensors)": lambda: launch(x, m, outputs.out, outputs.scale),
            "prepared bound op (inputs, outputs)": lambda: bound(inputs, outputs),
            "TritonPlugin.run (prepared per key)": lambda: plugin.run(inputs, outputs, shape, config),
        }
        if low is not None:
            cases["LowLevelLaunch alone (pointer ints)"] = lambda: low(*ptrs)
        for name, fn in cases.items():
            rows.append(
                {
                    "section": "silu_mul_quant",
                    "shape": f"{label} E={E} N={N} D={D}",
                    "path": name,
                    "us_per_call": round(time_host(fn, iters, repeats), 2),
                }
            )
        rows.append(
            {
                "section": "silu_mul_quant",
                "shape": f"{label} E={E} N={N} D={D}",
                "path": "low-level entry used",
                "us_per_call": None,
                "note": str(low is not None),
            }
        )
        rows.append(
            {
                "section": "silu_mul_quant",
                "shape": f"{label} E={E} N={N} D={D}",
                "path": "cProfile of TritonPlugin.run (prepared)",
                "us_per_call": None,
                "note": profile_top(cases["TritonPlugin.run (prepared per key)"], iters),
            }
        )
    return rows


def pre_dispatch_section(iters: int, repeats: int) -> list[dict[str, Any]]:
    import torch

    from ..plugins.deep_gemm import pre_dispatch_triton as P
    from ..plugins.deep_gemm.pre_dispatch_kernel import pre_dispatch_kernel

    tokens, hidden, top_k, rows_p, variant = 32, 1024, 8, 8192, "sm90_fp8"
    shape = f"sm90_fp8 E=8 H={hidden} T={tokens} topk={top_k} P={rows_p}"
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, 8, (tokens, top_k), device="cuda", dtype=torch.int32, generator=gen)
    ids64 = ids.to(torch.int64)
    w = torch.rand(tokens, top_k, device="cuda", generator=gen)
    bufs = [
        torch.empty((rows_p, hidden), dtype=torch.float8_e4m3fn, device="cuda"),
        torch.empty((rows_p, hidden // 128), device="cuda"),
        torch.empty((rows_p, top_k), dtype=torch.int64, device="cuda"),
        torch.empty((rows_p, top_k), device="cuda"),
    ]
    launcher = P.prepare_pre_dispatch(*bufs, variant=variant)
    launcher(x, ids, w)
    plan = next(iter(launcher._plans.values()))
    low = getattr(plan, "low_level", None)
    use_pdl = P._use_pdl(x.device)
    planned = P._arguments(
        x,
        ids,
        w,
        (x.stride(0), ids.stride(0), w.stride(0)),
        tokens,
        hidden,
        *bufs,
        variant=variant,
        routed_scaling_factor=1.0,
        shared_x_sf=None,
        shared_block_m=0,
        tiling=None,
        use_pdl=use_pdl,
    )
    grid, args, kwargs = planned  # type: ignore[misc]  # a plan: the grid is not empty
    kernel = pre_dispatch_kernel()
    leading = (x.data_ptr(), x.stride(0), ids.data_ptr(), ids.stride(0), w.data_ptr(), w.stride(0))
    device = x.device

    def import_statement() -> None:  # what mega_deep_gemm._our_pre_dispatch runs on every call
        from sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_triton import pre_dispatch  # noqa: F401

    cases: dict[str, Callable[[], Any]] = {
        "pre_dispatch (JIT path, decisions per call)": lambda: P.pre_dispatch(x, ids, w, *bufs, variant=variant),
        "  the plugin's per-call import statement": import_statement,
        "  choose_tiling": lambda: P.choose_tiling(tokens, hidden, 128),
        "  PDL probe (_use_pdl, cached capability)": lambda: P._use_pdl(device),
        "  torch.cuda.get_device_capability (per call before issue 12)": lambda: torch.cuda.get_device_capability(
            device
        ),
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
                x, ids, w, *bufs, num_tokens=tokens, group_size=128, routed_scaling_factor=1.0
            )
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
    out.append(
        {
            "section": "mega_pre_dispatch",
            "shape": shape,
            "path": "low-level entry used",
            "us_per_call": None,
            "note": str(low is not None),
        }
    )
    out.append(
        {
            "section": "mega_pre_dispatch",
            "shape": shape,
            "path": "cProfile of pre_dispatch (JIT path)",
            "us_per_call": None,
            "note": profile_top(lambda: P.pre_dispatch(x, ids, w, *bufs, variant=variant), iters),  # type: ignore[dict-item]  # a list of profile lines
        }
    )
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
    return [
        f"self {t / iters * 1e6:7.2f} us  cum {c / iters * 1e6:7.2f} us  x{n / iters:.1f}  {where}"
        for t, c, n, where in rows[:top]
    ]
