"""SGLang 0.5.23's MoE permute kernels (Triton, ``sglang/kernels/ops/moe``), loaded from the wheel's sources on a
machine without SGLang (the benchmark GPU machine), behind a minimal import shim.

``ep_moe_kernels.py`` and ``triton_pad_expert_counts.py`` are copied unchanged from the sglang 0.5.23 wheel into
``<py_root>/sglang/kernels/ops/moe/`` (``benchmarks/run_contig_e2e_h200.sh`` carries them under
``.device/sgl_py``; :func:`copy_sources` copies them out of a wheel). Their module-level imports of the SGLang
stack are answered by stub modules that :func:`load` puts into ``sys.modules``:

==================================================  ===========================================================
``sglang.srt.environ.envs``                         every ``envs.X.get()`` returns False (the defaults on the
                                                    paths used: ``SGLANG_OPT_DG_MASKED_M_CAP`` off)
``sglang.srt.utils``                                ``ceil_div``, ``is_cuda`` (True), ``is_musa`` (False)
``sglang.kernels.ops.quantization.fp8_kernel``      ``sglang_per_token_group_quant_fp8`` (the caller's: SGLang's
                                                    wrapper over its JIT kernel, ``sglang_contig_kernels``)
``sglang.srt.layers.deep_gemm_wrapper``             ``DEEPGEMM_SCALE_UE8M0`` False (Hopper), for
                                                    ``moe_ep_deepgemm_preprocess``'s function-level import
==================================================  ===========================================================

The stubs stay installed (the kernels import some of them when called). :func:`load` refuses to run where a real
``sglang`` is importable, so it never shadows one.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types
import zipfile
from collections.abc import Callable
from typing import Any

__all__ = ["SOURCES", "MoeKernels", "copy_sources", "load"]

#: The wheel's files this shim loads (paths inside the wheel).
SOURCES = ("sglang/kernels/ops/moe/ep_moe_kernels.py", "sglang/kernels/ops/moe/triton_pad_expert_counts.py")


def copy_sources(wheel: str, py_root: str) -> list[str]:
    """Copy :data:`SOURCES` out of the sglang wheel into ``py_root`` (same relative paths)."""
    out = []
    with zipfile.ZipFile(wheel) as zf:
        for name in SOURCES:
            target = pathlib.Path(py_root) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))
            out.append(str(target))
    return out


class _Env:
    def get(self) -> bool:
        return False


class _Envs:
    def __getattr__(self, name: str) -> _Env:
        return _Env()


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__path__ = []  # a package, so that submodules resolve
    sys.modules[name] = mod
    return mod


class MoeKernels:
    """The loaded modules: ``ep`` (``ep_moe_kernels``) and ``pad`` (``triton_pad_expert_counts``)."""

    def __init__(self, ep: types.ModuleType, pad: types.ModuleType) -> None:
        self.ep = ep
        self.pad = pad

    def __getattr__(self, name: str) -> Any:
        if name == "pad_expert_counts":
            return self.pad.pad_expert_counts
        return getattr(self.ep, name)


def load(py_root: str, per_token_group_quant_fp8: Callable[..., Any]) -> MoeKernels:
    """Install the stubs and import the two modules from ``py_root``."""
    existing = sys.modules.get("sglang")
    if existing is not None and not getattr(existing, "__sglang_moe_shim__", False):
        raise RuntimeError("sglang_moe_host.load: a real sglang is imported; use its own kernels instead of the shim")
    if existing is None and importlib.util.find_spec("sglang") is not None:
        raise RuntimeError("sglang_moe_host.load: sglang is installed here; the shim is for machines without it")
    root = pathlib.Path(py_root)
    for rel in SOURCES:
        if not (root / rel).is_file():
            raise FileNotFoundError(f"{root / rel} (copy it from the sglang 0.5.23 wheel: copy_sources)")

    def ceil_div(a: int, b: int) -> int:
        return -(-a // b)

    _module("sglang", __sglang_moe_shim__=True)
    _module("sglang.srt")
    _module("sglang.srt.environ", envs=_Envs())
    _module("sglang.srt.utils", ceil_div=ceil_div, is_cuda=lambda: True, is_musa=lambda: False)
    _module("sglang.srt.layers")
    wrapper = _module(
        "sglang.srt.layers.deep_gemm_wrapper", DEEPGEMM_SCALE_UE8M0=False, DEEPGEMM_NEED_TMA_ALIGNED_SCALES=True
    )
    sys.modules["sglang.srt.layers"].deep_gemm_wrapper = wrapper  # type: ignore[attr-defined]
    _module("sglang.kernels")
    _module("sglang.kernels.ops")
    _module("sglang.kernels.ops.quantization")
    _module("sglang.kernels.ops.quantization.fp8_kernel", sglang_per_token_group_quant_fp8=per_token_group_quant_fp8)
    _module("sglang.kernels.ops.moe")
    loaded = []
    for rel in SOURCES:
        name = rel[:-3].replace("/", ".")
        spec = importlib.util.spec_from_file_location(name, root / rel)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {root / rel}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        loaded.append(mod)
    return MoeKernels(loaded[0], loaded[1])
