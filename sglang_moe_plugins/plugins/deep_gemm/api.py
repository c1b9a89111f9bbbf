"""Which sgl-deep-gemm MegaMoE API is installed, read from its real signatures (no import needed).

Every sgl-deep-gemm release from 0.1.4 to 0.2.5 was read (docs/deep-gemm-releases.md has the table,
tests/test_deep_gemm_releases.py checks this module against each release's wheel). What changes:

- ``get_symm_buffer_for_mega_moe`` takes ``mma_type`` from 0.1.4 on, ``num_shared_experts`` from 0.1.6.
- ``fp8_fp4_mega_moe`` takes ``shared_l1_weights`` / ``shared_l2_weights`` from 0.1.6;
  ``get_block_m_for_mega_moe`` (the shared experts' scale layout) exists from 0.1.7.
- FP4 activations: up to 0.1.6 the C++ side accepts only ``mma_type='fp8xfp4'`` and reads
  ``DG_USE_FP4_ACTS`` / ``DG_USE_MXF4_KIND`` at every call (``mega_moe_pre_dispatch(...,
  use_fp4_acts)``): the **legacy env** API. From 0.1.7 ``mma_type='mxf4xmxf4'`` selects them
  (``mega_moe_pre_dispatch(..., mma_type)``) and ``SymmBuffer`` raises ``RuntimeError`` when a
  ``DG_USE_*`` variable is set (``deep_gemm.mega._check_legacy_fp4_acts_env``): the **mma_type** API.
- SM90: ``fp8_mega_moe`` from 0.1.4 (0.2.5 adds an optional ``num_tokens_bound``),
  ``mega_moe_pre_dispatch_sm90`` from 0.1.4.post1.
- E2M1 ties (MXFP4 activations): up to 0.1.7 midpoints round toward zero, in the kernel and in
  ``deep_gemm.utils.math._quantize_to_fp4_e2m1`` (``ax > boundary`` for every midpoint); from 0.2.0
  to the even code (``ax >= boundary`` at 0.75, 1.75, 3.5). :attr:`DeepGemmApi.e2m1_ties` is read
  from that function's comparisons.

This package never sets the ``DG_USE_*`` variables (0.1.7+ refuses them; on older releases they switch
every MegaMoE layer of the process at once), and the plugins pass only the arguments the installed
release takes (:meth:`DeepGemmApi.takes`).

:func:`api_from_source_dir` reads a package directory's Python sources with :mod:`ast` (no import,
no CUDA initialisation, the same answer on every rank); :func:`detect_deep_gemm_api` does that for
the installed ``deep_gemm`` (found with ``importlib.util.find_spec``), once per process.
:func:`api_of_module` reads an imported module with :func:`inspect.signature`.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import os
import pathlib
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from ...log import get_logger
from ...signatures import ast_parameter_names, parameter_names

__all__ = [
    "Flavour",
    "E2M1Ties",
    "LEGACY_ENV_VARS",
    "MEGA_FUNCTIONS",
    "DeepGemmApi",
    "detect_deep_gemm_api",
    "api_from_source_dir",
    "api_of_module",
    "legacy_env_set",
    "load_deep_gemm",
]

logger = get_logger(__name__)

Flavour = Literal["mma_type", "legacy_env", "no_mega", "absent"]
E2M1Ties = Literal["even", "toward_zero"]
_E2M1_FUNCTION = "_quantize_to_fp4_e2m1"

#: Environment variables that sgl-deep-gemm up to 0.1.6 reads and 0.1.7+ refuses.
LEGACY_ENV_VARS = ("DG_USE_FP4_ACTS", "DG_USE_MXF4_KIND")

#: The deep_gemm functions whose signatures are recorded (the plugins call the first six; the
#: weight transforms are SGLang's, recorded for the release table).
MEGA_FUNCTIONS = (
    "get_symm_buffer_for_mega_moe",
    "fp8_fp4_mega_moe",
    "fp8_mega_moe",
    "mega_moe_pre_dispatch",
    "mega_moe_pre_dispatch_sm90",
    "get_block_m_for_mega_moe",
    "transform_weights_for_mega_moe",
    "transform_weights_for_mega_moe_sm90",
)

#: MMA types of the SM100 MegaMoE kernels (``fp8xfp4`` only, up to 0.1.6).
_MMA_TYPES_ALL = ("fp8xfp4", "mxf4xmxf4", "nvfp4xnvfp4")


@dataclass(frozen=True)
class DeepGemmApi:
    """What the installed sgl-deep-gemm offers to MegaMoE. Hashable.

    ``flavour``: ``"mma_type"`` (0.1.7+: FP4 activations chosen by ``mma_type``), ``"legacy_env"``
    (up to 0.1.6: by the ``DG_USE_*`` variables), ``"no_mega"`` (installed, without MegaMoE) or
    ``"absent"``. ``signatures``: ``(function, parameter names)`` of each :data:`MEGA_FUNCTIONS`
    entry the package exports, in order. ``refuses_legacy_env``: the package raises when a
    :data:`LEGACY_ENV_VARS` variable is set. ``legacy_env``: those set to a non-zero value when detected.
    ``e2m1_ties``: how the release rounds E2M1 midpoints (``"toward_zero"`` up to 0.1.7, ``"even"``
    from 0.2.0), read from ``deep_gemm/utils/math.py``; None when it cannot be read.
    """

    flavour: Flavour
    version: str | None = None
    signatures: tuple[tuple[str, tuple[str, ...]], ...] = ()
    refuses_legacy_env: bool = False
    legacy_env: tuple[str, ...] = ()
    origin: str | None = None
    e2m1_ties: E2M1Ties | None = None

    @property
    def present(self) -> bool:
        return self.flavour != "absent"

    @property
    def functions(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.signatures)

    def has(self, function: str) -> bool:
        return any(name == function for name, _ in self.signatures)

    def params(self, function: str) -> tuple[str, ...]:
        """The parameter names of ``deep_gemm.<function>`` (empty when it is missing)."""
        for name, params in self.signatures:
            if name == function:
                return params
        return ()

    def takes(self, function: str, parameter: str) -> bool:
        return parameter in self.params(function)

    @property
    def mma_types(self) -> tuple[str, ...]:
        """The ``mma_type`` values the SM100 kernels accept (``fp8xfp4`` only on the legacy env API)."""
        if not self.takes("get_symm_buffer_for_mega_moe", "mma_type"):
            return ()
        return _MMA_TYPES_ALL if self.flavour == "mma_type" else ("fp8xfp4",)

    @property
    def shared_experts(self) -> bool:
        """In-kernel (fused) shared experts: the buffer sized for them, the kernel taking their
        weights, and the block size their scale layout follows (0.1.7+)."""
        return (
            self.takes("get_symm_buffer_for_mega_moe", "num_shared_experts")
            and self.takes("fp8_fp4_mega_moe", "shared_l1_weights")
            and self.has("get_block_m_for_mega_moe")
        )

    def describe(self) -> str:
        if self.flavour == "absent":
            return "sgl-deep-gemm not installed"
        text = f"sgl-deep-gemm {self.version or '?'} ({self.flavour} API)"
        if self.legacy_env:
            text += f", {'/'.join(self.legacy_env)} set"
        return text

    def __str__(self) -> str:
        return self.describe()


def legacy_env_set(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The :data:`LEGACY_ENV_VARS` set to a non-zero value (the test sgl-deep-gemm applies)."""
    environ = os.environ if environ is None else environ
    found = []
    for name in LEGACY_ENV_VARS:
        value = environ.get(name, "0").strip() or "0"
        try:
            nonzero = int(value) != 0
        except ValueError:
            nonzero = True  # sgl-deep-gemm's int() would raise; treat as set so that we say so
        if nonzero:
            found.append(name)
    return tuple(found)


def _flavour(signatures: Mapping[str, tuple[str, ...]], refuses: bool) -> Flavour:
    if "get_symm_buffer_for_mega_moe" not in signatures:
        return "no_mega"
    if refuses or "mma_type" in signatures.get("mega_moe_pre_dispatch", ()):
        return "mma_type"
    return "legacy_env"


def _ordered(signatures: Mapping[str, tuple[str, ...]]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((name, signatures[name]) for name in MEGA_FUNCTIONS if name in signatures)


# -- static detection -------------------------------------------------------------------------------


def _function_params(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    return {node.name: ast_parameter_names(node.args) for node in tree.body if isinstance(node, ast.FunctionDef)}


def _names_from_mega(tree: ast.Module) -> set[str]:
    """Names the top-level ``__init__`` re-exports from its ``mega`` submodule."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == "mega":
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _parse(path: pathlib.Path) -> tuple[ast.Module | None, str]:
    try:
        text = path.read_text(encoding="utf-8")
        return ast.parse(text), text
    except (OSError, SyntaxError, ValueError):
        return None, ""


def _e2m1_ties_of(tree: ast.Module | None) -> E2M1Ties | None:
    """The tie rule of ``_quantize_to_fp4_e2m1`` in a parsed ``utils/math.py``: a ``>=`` comparison
    (some midpoints round up) is ties-to-even, ``>`` alone is toward zero; None without the function."""
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == _E2M1_FUNCTION:
            ops = {type(op) for c in ast.walk(node) if isinstance(c, ast.Compare) for op in c.ops}
            if ast.GtE in ops:
                return "even"
            return "toward_zero" if ast.Gt in ops else None
    return None


def _read_version(package_dir: pathlib.Path) -> str | None:
    try:
        return (package_dir / "VERSION").read_text(encoding="utf-8").strip() or None
    except OSError:
        pass
    try:
        from importlib import metadata

        return metadata.version("sgl-deep-gemm")
    except Exception:  # noqa: BLE001 - a version is informative only
        return None


def api_from_source_dir(package_dir: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> DeepGemmApi:
    """The API of a ``deep_gemm`` package directory, from its sources (nothing is imported).

    A function counts when the top-level ``__init__`` defines it (it wins: on 0.1.4+ it wraps the
    SM90 / SM100 choice) or re-exports it from ``mega``; its parameters are those of that definition.
    """
    root = pathlib.Path(package_dir)
    top_tree, top_text = _parse(root / "__init__.py")
    mega_tree, mega_text = _parse(root / "mega" / "__init__.py")
    if mega_tree is None:
        mega_tree, mega_text = _parse(root / "mega.py")
    top = _function_params(top_tree) if top_tree is not None else {}
    mega = _function_params(mega_tree) if mega_tree is not None else {}
    exported = _names_from_mega(top_tree) if top_tree is not None else set()
    signatures: dict[str, tuple[str, ...]] = {}
    for name in MEGA_FUNCTIONS:
        if name in top:
            signatures[name] = top[name]
        elif name in exported and name in mega:
            signatures[name] = mega[name]
    refuses = "_check_legacy_fp4_acts_env" in mega_text or "_check_legacy_fp4_acts_env" in top_text
    return DeepGemmApi(
        flavour=_flavour(signatures, refuses),
        version=_read_version(root),
        signatures=_ordered(signatures),
        refuses_legacy_env=refuses,
        legacy_env=legacy_env_set(environ),
        origin=str(root),
        e2m1_ties=_e2m1_ties_of(_parse(root / "utils" / "math.py")[0]),
    )


@functools.lru_cache(maxsize=1)
def _detect_cached() -> DeepGemmApi:
    try:
        spec = importlib.util.find_spec("deep_gemm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return DeepGemmApi(flavour="absent", legacy_env=legacy_env_set())
    api = api_from_source_dir(next(iter(spec.submodule_search_locations)))
    logger.debug("sglang-moe-plugins: detected %s at %s", api.describe(), api.origin)
    return api


def detect_deep_gemm_api(refresh: bool = False) -> DeepGemmApi:
    """The installed sgl-deep-gemm's MegaMoE API (read once per process; ``refresh`` re-reads it).

    The environment snapshot (:attr:`DeepGemmApi.legacy_env`) is taken at that first read.
    """
    if refresh:
        _detect_cached.cache_clear()
    return _detect_cached()


def api_of_module(module: ModuleType | Any, environ: Mapping[str, str] | None = None) -> DeepGemmApi:
    """The API of an imported ``deep_gemm`` module (or a stand-in), by :func:`inspect.signature`."""
    signatures: dict[str, tuple[str, ...]] = {}
    for name in MEGA_FUNCTIONS:
        fn = getattr(module, name, None)
        if not callable(fn):
            continue
        try:
            signatures[name] = parameter_names(fn)
        except (TypeError, ValueError):
            signatures[name] = ()
    mega = getattr(module, "mega", None)
    refuses = callable(getattr(mega, "_check_legacy_fp4_acts_env", None))
    try:
        quantize = getattr(module.utils.math, _E2M1_FUNCTION)
        ties = _e2m1_ties_of(ast.parse(textwrap.dedent(inspect.getsource(quantize))))
    except Exception:  # noqa: BLE001 - a stand-in without it, or no source: unknown
        ties = None
    return DeepGemmApi(
        flavour=_flavour(signatures, refuses),
        version=getattr(module, "__version__", None),
        signatures=_ordered(signatures),
        refuses_legacy_env=refuses,
        legacy_env=legacy_env_set(environ),
        origin=getattr(module, "__file__", None),
        e2m1_ties=ties,
    )


def load_deep_gemm() -> ModuleType:
    """Import ``deep_gemm`` (first use only; this loads its CUDA library). ImportError if missing."""
    import deep_gemm  # noqa: PLC0415 - lazy by design

    return deep_gemm
