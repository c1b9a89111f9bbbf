"""SGLang 0.5.23's own CUDA kernels for the GPU tests on a machine without SGLang (the GPU machine).

``jit_ep`` and ``fp8_fallback`` call SGLang's kernels through :mod:`sglang_moe_plugins.plugins.sglang_kernels.host`.
Where SGLang itself is not installed, :func:`sglang_jit` builds those kernels from the sglang wheel's JIT
sources through tvm-ffi (``sglang_moe_plugins/bench/sglang_kernels.py``), loading modules compiled ahead of time from
``.device/sgl_prebuilt`` when they are there. Install them around a call with
``use_host_kernels(jit.host_kernels())``.
"""

from __future__ import annotations

import os
import pathlib

__all__ = ["ROOT", "JIT_ROOT", "PREBUILT", "sglang_jit"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
JIT_ROOT = pathlib.Path(os.environ.get("SGL_JIT_ROOT", ROOT / ".device/sgl_jit/sglang/kernels/jit"))
PREBUILT = ROOT / ".device/sgl_prebuilt"


def sglang_jit(build_root: str | os.PathLike | None = None):
    """``(SglangJit, None)``, or ``(None, why not)`` when tvm-ffi or the JIT sources are missing.

    ``build_root`` defaults to a directory of this process's own, so that parallel processes never
    compile into the same place (modules not found in ``.device/sgl_prebuilt`` are built there)."""
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return None, "tvm-ffi is not importable"
    if not (JIT_ROOT / "csrc").is_dir():
        return None, f"SGLang's JIT sources are not at {JIT_ROOT}"
    from sglang_moe_plugins.bench.sglang_kernels import SglangJit

    build = build_root or f"/tmp/sgl_jit_build/pid{os.getpid()}"
    return SglangJit(JIT_ROOT, build, prebuilt_root=PREBUILT), None
