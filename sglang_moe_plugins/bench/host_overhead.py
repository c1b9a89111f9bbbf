"""Eager host time per call of the ``silu_mul_quant`` paths (``benchmarks/host_overhead.py``): the CPU
section (the plugin layer through SGLang's own hooked function, a do-nothing plugin forced), the GPU section
(the Triton path against SGLang's own Python path over its DSV4 JIT kernel) and the markdown table."""

from __future__ import annotations

import os
import pathlib
import platform as _platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .dist_info import temporary_site
from .host_overhead_sglang import _sglang_jit, sglang_dsv4_branch

__all__ = [
    "REPEATS",
    "CALLS",
    "SMQ_TARGET",
    "SHAPES",
    "CPU_SHAPES",
    "NOOP_MODULE",
    "time_calls",
    "row",
    "inputs_for",
    "sglang_kwargs",
    "install_noop_distribution",
    "cpu_section",
    "sglang_dsv4_branch",
    "gpu_section",
    "versions",
    "device_name",
    "markdown",
]

REPEATS, CALLS = 5, 1000
SMQ_TARGET = "sglang.srt.layers.moe.moe_runner.deep_gemm._varlen_deep_gemm_silu_mul_quant"

#: (label, E, N, D, topk, swiglu_limit, sglang_too): the shapes of the issue.
SHAPES = [
    ("DSV4-Flash EP8 decode", 32, 128, 2048, 6, 10.0, True),
    ("DSV4-Pro EP8 decode", 48, 64, 3072, 6, 10.0, True),
    ("Qwen3-30B EP1 decode", 128, 64, 768, 8, None, False),
]
#: The CPU section adds a small call, where allocating the outputs costs little on a CPU host.
CPU_SHAPES = [*SHAPES, ("small (E=8, N=16, D=512)", 8, 16, 512, 2, None, False)]


def time_calls(fn: Callable[[], Any], repeats: int, calls: int, sync: Callable[[], None] | None = None) -> list[float]:
    """Per-call microseconds of ``repeats`` runs of ``calls`` back-to-back calls (after a warm-up)."""
    for _ in range(min(calls, 50)):
        fn()
    if sync:
        sync()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter_ns() - start) / calls / 1e3)
        if sync:
            sync()
    return runs


def row(path: str, shape: str, runs: list[float] | None, note: str = "") -> dict:
    return {
        "path": path,
        "shape": shape,
        "us": statistics.median(runs) if runs else None,
        "runs_us": [round(r, 3) for r in runs] if runs else None,
        "note": note,
    }


def inputs_for(e: int, n: int, d: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    gateup = torch.randn(e, n, 2 * d, generator=gen).to(torch.bfloat16).to(device)
    masked = torch.randint(0, n + 1, (e,), generator=gen, dtype=torch.int32).to(device)
    return gateup, masked


def sglang_kwargs(topk: int, limit: float | None, tokens: int) -> dict:
    """The keyword arguments SGLang 0.5.23's DeepGEMM runner passes (deep_gemm.py: group_size onward)."""
    return dict(
        group_size=128,
        topk=topk,
        swiglu_limit=limit,
        swizzle=False,
        gemm1_alpha=None,
        gemm1_clamp_limit=None,
        num_real_tokens=tokens,
        silu_mul_keep_fp32=False,
    )


def _call_setup(e: int, n: int, d: int, topk: int, limit: float | None, device: str) -> tuple:
    """One shape's inputs, SGLang's keyword arguments, the op's shape and config, outputs and scale layout."""
    from ..ops import silu_mul_quant as smq

    gateup, masked = inputs_for(e, n, d, device)
    kwargs = sglang_kwargs(topk, limit, tokens=n)
    layout = "row_major" if limit is not None else "column_major"
    shape, config = smq.describe(gateup, masked, group_size=128, topk=topk, swiglu_limit=limit, scale_layout=layout)  # type: ignore[arg-type]  # a layout name
    inputs = smq.SiluMulQuantInputs(gateup, masked, n, gateup_writable=True)
    outputs = smq.allocate_outputs(shape, config, gateup.device)
    sizes, strides = smq.expected_scale_strides(shape, config)
    return gateup, masked, kwargs, shape, config, inputs, outputs, sizes, strides


# ------------------------------------------------------------------------------------------ cpu
NOOP_MODULE = '''
"""Do-nothing silu_mul_quant plugins for benchmarks/host_overhead.py (installed for the run only)."""
from sglang_moe_plugins import Plugin, Support


class NoopRun(Plugin):
    name = "noop_run"
    op = "silu_mul_quant"
    priority = -100
    description = "does nothing (benchmark of the plugin layer): run only"

    def supports(self, shape, config):
        return Support.yes("accepts everything, computes nothing")

    def run(self, inputs, outputs, shape, config):
        return None


def _nothing(inputs, outputs):
    return None


class NoopPrepared(NoopRun):
    name = "noop_prepared"
    description = "does nothing (benchmark of the plugin layer): prepare returns the launch"

    def prepare(self, shape, config):
        return _nothing
'''


def install_noop_distribution() -> pathlib.Path:
    """A ``bench_noop_plugins-0.1.dist-info`` with two kernel entry points, on ``sys.path``."""
    return temporary_site(
        "host_overhead_site_",
        "bench-noop-plugins",
        {"bench_noop_plugins": NOOP_MODULE},
        {"noop_run": "bench_noop_plugins:NoopRun", "noop_prepared": "bench_noop_plugins:NoopPrepared"},
    )


def cpu_section(repeats: int, calls: int) -> dict:
    try:
        import sglang  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"needs SGLang installed ({exc})", "rows": []}
    for name in list(os.environ):
        if name.startswith("SGLANG_MOE_PLUGINS") or name == "SGLANG_PLUGINS":
            del os.environ[name]
    install_noop_distribution()
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    from sglang.srt.plugins import load_plugins

    from .. import api
    from ..config import parse_config
    from ..ops import silu_mul_quant as smq

    load_plugins()
    hooked = runner._varlen_deep_gemm_silu_mul_quant
    if getattr(hooked, "__wrapped__", None) is None:
        return {"skipped": f"{SMQ_TARGET} is not hooked after load_plugins()", "rows": []}
    rows = []
    for label, e, n, d, topk, limit, _ in CPU_SHAPES:
        gateup, masked, kwargs, shape, config, inputs, outputs, sizes, strides = _call_setup(
            e, n, d, topk, limit, "cpu"
        )
        alloc = time_calls(
            lambda: (
                torch.empty((e, n, d), dtype=torch.float8_e4m3fn),
                torch.empty_strided(sizes, strides, dtype=torch.float32),
            ),
            repeats,
            calls,
        )
        rows.append(row("`torch.empty` of both outputs (SGLang's own function allocates them too)", label, alloc))
        for plugin_name in ("noop_run", "noop_prepared"):
            api.reload(parse_config({"force": {smq.OP: plugin_name}}))
            plugin = api.get_registry().get(plugin_name).plugin
            prepare = getattr(plugin, "prepare", None)
            if prepare is not None:
                launch = prepare(shape, config)
                bare = time_calls(lambda: launch(inputs, outputs), repeats, calls)
                bare_path = f"bare `{plugin_name}` prepared launch(inputs, outputs)"
            else:
                bare = time_calls(lambda: plugin.run(inputs, outputs, shape, config), repeats, calls)
                bare_path = f"bare `{plugin_name}`.run(inputs, outputs, shape, config)"
            out, _ = hooked(gateup, masked, **kwargs)
            chosen = api.get_selector().explain(smq.OP, shape, config).chosen
            if chosen is None or chosen.name != plugin_name or out.shape != (e, n, d):
                raise RuntimeError(f"the hooked call did not run {plugin_name!r}: {chosen}")
            through = time_calls(lambda: hooked(gateup, masked, **kwargs), repeats, calls)
            rows.append(row(bare_path, label, bare))
            rows.append(
                row(f"SGLang's hooked `_varlen_deep_gemm_silu_mul_quant`, `{plugin_name}` forced", label, through)
            )
            rows.append(
                row(
                    f"hooked - bare, `{plugin_name}`",
                    label,
                    [t - b for t, b in zip(through, bare)],
                    "difference of the per-repeat times",
                )
            )
            rows.append(
                row(
                    f"plugin layer cost, `{plugin_name}` (hooked - bare - allocation; target <= 8 us)",
                    label,
                    [t - b - a for t, b, a in zip(through, bare, alloc)],
                    "difference of the per-repeat times",
                )
            )
    api.reload()
    return {"rows": rows}


def gpu_section(repeats: int, calls: int, jit_root: pathlib.Path, prebuilt: pathlib.Path, root: pathlib.Path) -> dict:
    """The GPU section; ``root`` is the checkout whose pyproject.toml names the built-in plugins where the
    package is not installed."""
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device", "rows": []}
    from .. import api
    from ..config import parse_config
    from ..integrations.sglang import silu_mul_quant_hook
    from ..ops import silu_mul_quant as smq
    from ..plugins.triton_smq import launch as kernel
    from ..plugins.triton_smq.plugin import TritonPlugin
    from ..plugins.triton_smq.tuning import choose_config
    from ..quant import round_to_bf16
    from .dist_info import checkout_entry_points

    selector = api.reload(parse_config({"force": {smq.OP: "triton"}}), entry_points=checkout_entry_points(root))
    jit, jit_note = _sglang_jit(jit_root, prebuilt)
    sync = torch.cuda.synchronize
    rows = []

    def add(path, label, fn, note=""):
        try:
            rows.append(row(path, label, time_calls(fn, repeats, calls, sync), note))
        except Exception as exc:  # noqa: BLE001 - one path failing must not lose the others
            rows.append(row(path, label, None, f"failed: {type(exc).__name__}: {exc}"[:300]))

    for label, e, n, d, topk, limit, sglang_too in SHAPES:
        gateup, masked, kwargs, shape, config, inputs, outputs, sizes, strides = _call_setup(
            e, n, d, topk, limit, "cuda"
        )
        add("`torch.empty_like(scale)`", label, lambda: torch.empty_like(outputs.scale))
        add(
            "`torch.empty` of both outputs",
            label,
            lambda: (
                torch.empty((e, n, d), dtype=torch.float8_e4m3fn, device="cuda"),
                torch.empty_strided(sizes, strides, dtype=torch.float32, device="cuda"),
            ),
        )
        kconfig = choose_config(e, n, d, 128, topk)
        klimit = None if limit is None else round_to_bf16(limit)
        add(
            "Triton `launch` of our kernel (JIT dispatch, config chosen)",
            label,
            lambda: kernel.launch(
                gateup,
                masked,
                outputs.out,
                outputs.scale,
                group_size=128,
                swiglu_limit=klimit,
                swizzle=False,
                ue8m0=False,
                config=kconfig,
            ),
        )
        plugin = TritonPlugin()
        prepare = getattr(plugin, "prepare", None)
        launch = prepare(shape, config) if callable(prepare) else None
        if launch is not None:
            add("`TritonPlugin` prepared launch(inputs, outputs)", label, lambda: launch(inputs, outputs))
        add("`TritonPlugin.run`", label, lambda: plugin.run(inputs, outputs, shape, config))
        bound = selector.bind(smq.OP, shape, config)
        add("`Selector` bound call (allocates the outputs)", label, lambda: selector.call(bound, inputs))
        if sglang_too and jit is not None:
            original = sglang_dsv4_branch(jit.silu_and_mul_masked_post_quant, ue8m0=False)
            add(
                "SGLang's own call of its DSV4 JIT kernel (its Python path, wrapper, tvm-ffi)",
                label,
                lambda: original(gateup, masked, **kwargs),
            )
        else:
            original = _unexpected_original
            if sglang_too:
                rows.append(
                    row(
                        "SGLang's own call of its DSV4 JIT kernel (its Python path, wrapper, tvm-ffi)",
                        label,
                        None,
                        jit_note,
                    )
                )
        add(
            "our hook `silu_mul_quant_hook(original, ...)` running `triton`",
            label,
            lambda: silu_mul_quant_hook(original, gateup, masked, **kwargs),
        )
    return {"rows": rows}


def _unexpected_original(*args, **kwargs):
    raise RuntimeError("the hook handed a modelled call to the original function")


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"python": _platform.python_version(), "torch": torch.__version__}
    for dist in ("triton", "sglang", "apache-tvm-ffi", "sglang-moe-plugins"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = None
    return found


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name().replace(" ", "-")
    return "cpu"


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"# Host time per eager call ({meta['device']}, {meta['date']})",
        "",
        f"Commit {meta['commit']}; median of {meta['repeats']} x {meta['calls']} back-to-back calls, in us; "
        f"{meta['cpu_count']} CPUs, load average {meta['load_average_1_5_15_min']} when written; "
        f"versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v),
        "",
    ]
    for name, section in result["sections"].items():
        lines.append(f"## {name}")
        lines.append("")
        if section.get("skipped"):
            lines += [f"skipped: {section['skipped']}", ""]
            continue
        shapes = list(dict.fromkeys(r["shape"] for r in section["rows"]))
        paths = list(dict.fromkeys(r["path"] for r in section["rows"]))
        cell = {(r["path"], r["shape"]): r for r in section["rows"]}
        lines.append("| path | " + " | ".join(shapes) + " |")
        lines.append("|---|" + "---|" * len(shapes))
        for path in paths:
            cells = []
            for shape in shapes:
                r = cell.get((path, shape))
                cells.append("" if r is None else (f"{r['us']:.1f}" if r["us"] is not None else f"- ({r['note']})"))
            lines.append(f"| {path} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
