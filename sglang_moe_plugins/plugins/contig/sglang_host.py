"""A narrow indirection to SGLang's own kernels of the contiguous (compact) activation step, used by
``contig_sglang_fused`` and ``contig_sglang_two_kernel``, and the check both plugins share.

By default the four callables come from the installed SGLang's Python wrappers, imported on first use
from the module of the running release (:data:`RELEASES`):

- ``silu_and_mul_contig_post_quant(input, output, output_scale, quant_group_size, scale_ue8m0=False,
  transposed=False, swiglu_limit=None, swizzle=False) -> None``: 0.5.20 ``sglang.kernels.ops.attention.dsv4``,
  0.5.21/0.5.22 ``sglang.kernels.ops.moe.dsv4``, 0.5.23 ``sglang.kernels.ops.activation.silu_and_mul_clamp``;
- ``silu_and_mul_clamp(input, output, swiglu_limit) -> None``: the same module as the fused kernel;
- ``silu_and_mul(input, out) -> out``: ``sglang.kernels.ops.activation.activation`` (what the runner
  imports as ``_legacy_silu_and_mul``);
- ``per_token_group_quant_fp8(x, group_size, eps=1e-10, column_major_scales=False, scale_tma_aligned=False,
  scale_ue8m0=False, *, output_q, output_s) -> (q, s)``: ``sglang_per_token_group_quant_fp8`` of
  ``sglang.kernels.ops.quantization.fp8_kernel`` writing into the given outputs. 0.5.22+ take
  ``output_q``/``output_s`` themselves; on 0.5.20/0.5.21, which allocate, :func:`_quant_into` runs the
  same body on the given outputs (the whole-row branch through ``sgl_per_token_quant_fp8``, else
  ``_run_per_token_group_quant_8bit_kernel``, the two kernel wrappers the function calls with its buffers).

Our own SGLang integration hooks ``silu_and_mul_contig_post_quant`` (a HookRegistry AROUND hook, whose
wrapper is ``functools.wraps``'d, so ``__module__``/``__qualname__`` are the original's). Calling the hooked
function from a plugin would run the hook again, so every callable is taken through
:func:`original_function`: it follows ``__wrapped__`` to the function whose code lives in the file of its
own module (a wrapper's code lives elsewhere, e.g. in ``hook_registry.py``).

A machine without SGLang (the GPU machine) installs the same kernels built from the sglang wheel's JIT
sources with :func:`use_contig_kernels` (``sglang_moe_plugins/bench``), so the plugins' own argument and
layout handling is what runs there.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import pathlib
import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...contract import Support
from ...errors import KernelNotAvailableError
from ...hardware import Platform
from ...signatures import accepted_keywords

__all__ = [
    "ACTIVATION_MODULE",
    "ALIGN",
    "QUANT_MODULE",
    "RELEASES",
    "ContigHostKernels",
    "ContigRelease",
    "aligned",
    "canonical_view",
    "MIN_SM",
    "contig_kernels_source",
    "cuda_contig_kernels",
    "get_contig_kernels",
    "installed_release",
    "kernel_input",
    "original_function",
    "release_for",
    "use_contig_kernels",
]

ACTIVATION_MODULE = "sglang.kernels.ops.activation.activation"
QUANT_MODULE = "sglang.kernels.ops.quantization.fp8_kernel"
#: bf16x2 ``__hmin2``/``__hmax2`` (the clamp of both fused kernels) need sm80.
MIN_SM = 80


@dataclass(frozen=True)
class ContigRelease:
    """Where one SGLang release defines the contiguous step's kernel wrappers (read from its wheel)."""

    release: str
    #: The module (as the runner imports it: the hook target) of ``silu_and_mul_contig_post_quant`` and
    #: ``silu_and_mul_clamp``.
    fused_module: str
    #: That module's file, relative to the ``sglang`` package directory.
    fused_file: str
    #: ``SiluAndMulContigPostQuantKernel``'s group sizes: 0.5.20's template is ``static_assert(kGroupSize == 128)``.
    fused_groups: tuple[int, ...]


RELEASES: dict[str, ContigRelease] = {
    "0.5.20": ContigRelease(
        "0.5.20", "sglang.kernels.ops.attention.dsv4", "kernels/ops/attention/dsv4/__init__.py", (128,)
    ),
    "0.5.21": ContigRelease("0.5.21", "sglang.kernels.ops.moe.dsv4", "kernels/ops/moe/dsv4.py", (32, 128)),
    "0.5.22": ContigRelease("0.5.22", "sglang.kernels.ops.moe.dsv4", "kernels/ops/moe/dsv4.py", (32, 128)),
    "0.5.23": ContigRelease(
        "0.5.23",
        "sglang.kernels.ops.activation.silu_and_mul_clamp",
        "kernels/ops/activation/silu_and_mul_clamp.py",
        (32, 128),
    ),
}


@dataclass(frozen=True)
class ContigHostKernels:
    """The host's kernel entry points, with the signatures of the module docstring."""

    silu_and_mul_contig_post_quant: Callable[..., Any]
    silu_and_mul_clamp: Callable[..., Any]
    silu_and_mul: Callable[..., Any]
    per_token_group_quant_fp8: Callable[..., Any]
    source: str
    #: Group sizes ``silu_and_mul_contig_post_quant`` compiles for (the release's template).
    fused_groups: tuple[int, ...] = (32, 128)


def _release_numbers(version: str) -> tuple[int, ...]:
    match = re.match(r"^(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(x) for x in match.group(1).split(".")) if match else ()


def release_for(version: str | None, sglang_root: pathlib.Path | None = None) -> ContigRelease | None:
    """The table entry for SGLang ``version``: exact for a listed release (a local build such as
    ``0.5.23+cu129`` is that release); a newer release takes the newest entry when that entry's module
    file is there (``sglang_root`` given); None otherwise (older, between releases, a ``.post``, absent)."""
    if version is None:
        return None
    public = version.split("+", 1)[0]
    if public in RELEASES:
        return RELEASES[public]
    newest = max(RELEASES.values(), key=lambda r: _release_numbers(r.release))
    if not re.fullmatch(r"\d+\.\d+\.\d+", public) or _release_numbers(public) <= _release_numbers(newest.release):
        return None
    if sglang_root is None or not (sglang_root / newest.fused_file).is_file():
        return None
    return newest


def _sglang_root() -> pathlib.Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def installed_release() -> ContigRelease | None:
    """The table entry of the installed SGLang (its distribution metadata; SGLang is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("sglang")
    except PackageNotFoundError:
        return None
    return release_for(installed, _sglang_root())


def _defined_here(fn: Any, name: str) -> bool:
    """Whether ``fn`` is the function ``name`` whose code is in the file of its own ``__module__``."""
    code = getattr(fn, "__code__", None)
    module_name = getattr(fn, "__module__", None)
    if code is None or not module_name or getattr(fn, "__qualname__", None) != name:
        return False
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if file is None:
        return False
    return pathlib.Path(code.co_filename).resolve() == pathlib.Path(file).resolve()


def original_function(fn: Any, name: str) -> Callable[..., Any]:
    """``fn`` with every wrapper around it removed: follows ``__wrapped__`` (HookRegistry's and
    ``functools.wraps``' link) to the function ``name`` defined in its module's own file. Raises
    :class:`KernelNotAvailableError` when the chain ends elsewhere."""
    current = fn
    for _ in range(64):
        if _defined_here(current, name):
            return current
        inner = getattr(current, "__wrapped__", None)
        if inner is None:
            break
        current = inner
    raise KernelNotAvailableError(
        f"cannot reach SGLang's own {name}: following __wrapped__ from {fn!r} ends at {current!r}, which is "
        f"not a function defined in its module's file (an unknown wrapper; calling it could re-enter a hook)"
    )


def _quant_into(module: Any) -> Callable[..., Any]:
    """0.5.20/0.5.21: ``sglang_per_token_group_quant_fp8``'s body on given outputs (those releases allocate).
    The whole-row branch (group == D, fp32 row-major scales) runs ``sgl_per_token_quant_fp8`` as
    ``sglang_per_token_quant_fp8`` does; every other call ``_run_per_token_group_quant_8bit_kernel``."""
    group_kernel = original_function(
        module._run_per_token_group_quant_8bit_kernel, "_run_per_token_group_quant_8bit_kernel"
    )
    fp8_min, fp8_max = module.fp8_min, module.fp8_max

    def per_token_group_quant_fp8(
        x: Any,
        group_size: int,
        eps: float = 1e-10,
        column_major_scales: bool = False,
        scale_tma_aligned: bool = False,
        scale_ue8m0: bool = False,
        *,
        output_q: Any,
        output_s: Any,
    ) -> tuple[Any, Any]:
        if group_size == x.shape[-1] and x.dim() == 2 and not (column_major_scales or scale_ue8m0):
            module.sgl_per_token_quant_fp8(x, output_q, output_s)
        elif x.shape[0] > 0:
            group_kernel(
                x,
                output_q,
                output_s,
                group_size,
                eps,
                fp8_min,
                fp8_max,
                scale_ue8m0=scale_ue8m0,
                fuse_silu_and_mul=False,
                masked_m=None,
            )
        return output_q, output_s

    return per_token_group_quant_fp8


def _load_sglang() -> ContigHostKernels:
    release = installed_release()
    if release is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed: str | None = version("sglang")
        except PackageNotFoundError:
            installed = None
        raise KernelNotAvailableError(
            f"SGLang {installed or '(not installed)'} is not a release whose contiguous-step kernels are known "
            f"(known: {', '.join(RELEASES)})"
        )
    fused_module = importlib.import_module(release.fused_module)
    quant_module = importlib.import_module(QUANT_MODULE)
    activation = importlib.import_module(ACTIVATION_MODULE)
    quant = original_function(quant_module.sglang_per_token_group_quant_fp8, "sglang_per_token_group_quant_fp8")
    if accepted_keywords(quant, ("output_q", "output_s")) != frozenset({"output_q", "output_s"}):
        quant = _quant_into(quant_module)
    return ContigHostKernels(
        original_function(fused_module.silu_and_mul_contig_post_quant, "silu_and_mul_contig_post_quant"),
        original_function(fused_module.silu_and_mul_clamp, "silu_and_mul_clamp"),
        original_function(activation.silu_and_mul, "silu_and_mul"),
        quant,
        source=f"sglang {release.release} ({release.fused_module})",
        fused_groups=release.fused_groups,
    )


_lock = threading.Lock()
_override: ContigHostKernels | None = None
_default: ContigHostKernels | None = None


def get_contig_kernels() -> ContigHostKernels:
    """The installed override, else SGLang's own wrappers, unwrapped (ImportError when SGLang is missing,
    KernelNotAvailableError for a release the table does not know)."""
    global _default
    with _lock:
        if _override is not None:
            return _override
        if _default is None:
            _default = _load_sglang()
        return _default


def contig_kernels_source() -> tuple[str, tuple[int, ...]] | None:
    """``(where the kernels come from, the fused kernel's group sizes)`` now, or None when there is neither
    an override nor a known SGLang release. Cheap: SGLang's metadata and files, not an import."""
    with _lock:
        if _override is not None:
            return _override.source, _override.fused_groups
        if _default is not None:
            return _default.source, _default.fused_groups
    release = installed_release()
    if release is None:
        return None
    return f"sglang {release.release} ({release.fused_module})", release.fused_groups


@contextlib.contextmanager
def use_contig_kernels(kernels: ContigHostKernels) -> Iterator[ContigHostKernels]:
    """Install ``kernels`` as the host kernels for the duration of the ``with`` block."""
    global _override
    with _lock:
        previous, _override = _override, kernels
    try:
        yield kernels
    finally:
        with _lock:
            _override = previous


def cuda_contig_kernels(platform: Platform) -> Support:
    """Yes when the call is on CUDA sm80+ and SGLang's contiguous-step kernels can be reached."""
    if not platform.is_cuda:
        return Support.no(f"SGLang's kernels are CUDA-only (JIT CUDA kernels); the call is on {platform}")
    if (platform.sm or 0) < MIN_SM:
        return Support.no(
            f"requires CUDA sm{MIN_SM}+ (bf16x2 __hmin2/__hmax2 in the clamp); the device is sm{platform.sm}"
        )
    found = contig_kernels_source()
    if found is None:
        return Support.no(
            f"SGLang's contiguous-step kernels are not reachable (install sglang {min(RELEASES)}-{max(RELEASES)}, "
            "or install a ContigHostKernels override with use_contig_kernels)"
        )
    return Support.yes(f"SGLang kernels from {found[0]}")


#: Byte alignment of the vector loads/stores of SGLang's kernels (32 B vectors on Blackwell, 16 B on Hopper).
ALIGN = 32


def canonical_view(tensor: Any, strides: tuple[int, ...]) -> Any:
    """``tensor`` with ``strides``: the same elements at the same addresses when ``tensor``'s strides differ
    only on size-1 dimensions (what the op allows: a 1-row call, a 1-group scale), which SGLang's
    stride matchers would otherwise refuse."""
    if tuple(tensor.stride()) == strides:
        return tensor
    return tensor.as_strided(tensor.shape, strides)


def kernel_input(gateup: Any) -> Any:
    """``gateup`` as SGLang's wrappers take it: contiguous ``(2D, 1)`` strides (``TensorMatcher`` without
    strides checks ``is_contiguous``) and a base aligned for the vector loads. A copy only for a 1-row
    call with a non-unit column stride or a misaligned view (never for the host's own buffers)."""
    if gateup.stride(-1) != 1 or gateup.data_ptr() % ALIGN:
        return gateup.new_empty(gateup.shape).copy_(gateup)
    return canonical_view(gateup, (gateup.shape[1], 1))


def aligned(tensor: Any) -> bool:
    """Whether ``tensor``'s base is aligned for the kernels' vector stores."""
    return tensor.data_ptr() % ALIGN == 0
