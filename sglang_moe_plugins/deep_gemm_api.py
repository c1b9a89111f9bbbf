"""Which sgl-deep-gemm MegaMoE API is installed, told without importing it.

sgl-deep-gemm changed how MegaMoE picks FP4 activations:

- **mma_type API** (sgl-deep-gemm 0.2.x, e.g. 0.2.3.post2 pinned by SGLang 0.5.23):
  ``get_symm_buffer_for_mega_moe(..., mma_type='fp8xfp4' | 'mxf4xmxf4' | 'nvfp4xnvfp4')`` and
  ``mega_moe_pre_dispatch(..., mma_type=...)``. Its ``SymmBuffer`` raises ``RuntimeError`` when
  ``DG_USE_FP4_ACTS`` or ``DG_USE_MXF4_KIND`` is set to a non-zero value
  (``deep_gemm.mega._check_legacy_fp4_acts_env``): those variables were replaced by ``mma_type``.
- **legacy env API** (older forks): ``get_symm_buffer_for_mega_moe(..., use_fp8_dispatch=True,
  activation='swiglu')`` without ``mma_type``; the C++ side reads ``DG_USE_FP4_ACTS`` /
  ``DG_USE_MXF4_KIND`` at every call (buffer sizing and kernel), process-wide.

This package never sets those variables. For a release that refuses them that is required; for a
legacy release setting them would switch every MegaMoE layer of the process at once, so the W4A4
plugin declines such a release instead (its ``supports`` says why). SGLang's own old switches
``SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS`` / ``_USE_MXF4_KIND`` are not forwarded either:
:func:`legacy_sglang_fp4_flags` reports them so that the configuration layer can translate them.

Detection reads the package's Python sources with :mod:`ast` (found through
``importlib.util.find_spec``), so it costs no import, no CUDA initialisation and no compilation,
and gives the same answer on every rank. :func:`api_of_module` inspects an imported module instead.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import logging
import os
import pathlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Mapping

__all__ = [
    "Flavour",
    "LEGACY_ENV_VARS",
    "LEGACY_SGLANG_FLAGS",
    "MEGA_FUNCTIONS",
    "DeepGemmApi",
    "detect_deep_gemm_api",
    "api_from_source_dir",
    "api_of_module",
    "legacy_env_set",
    "legacy_sglang_fp4_flags",
    "load_deep_gemm",
]

logger = logging.getLogger(__name__)

Flavour = Literal["mma_type", "legacy_env", "no_mega", "absent"]

#: Environment variables that older sgl-deep-gemm releases read and 0.2.x refuses.
LEGACY_ENV_VARS = ("DG_USE_FP4_ACTS", "DG_USE_MXF4_KIND")

#: SGLang's old switches (seed PRs) that forwarded into :data:`LEGACY_ENV_VARS`.
LEGACY_SGLANG_FLAGS = ("SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS", "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_MXF4_KIND")

#: The deep_gemm functions the MegaMoE plugins may call.
MEGA_FUNCTIONS = (
    "get_symm_buffer_for_mega_moe",
    "fp8_fp4_mega_moe",
    "fp8_mega_moe",
    "mega_moe_pre_dispatch",
    "mega_moe_pre_dispatch_sm90",
    "get_block_m_for_mega_moe",
)


@dataclass(frozen=True)
class DeepGemmApi:
    """What the installed sgl-deep-gemm offers to MegaMoE. Hashable; part of the mega_moe config.

    ``flavour``: ``"mma_type"`` (0.2.x), ``"legacy_env"`` (FP4 activations by env vars),
    ``"no_mega"`` (installed, without MegaMoE) or ``"absent"`` (not installed).
    ``functions``: the :data:`MEGA_FUNCTIONS` the package defines.
    ``refuses_legacy_env``: the package raises when a :data:`LEGACY_ENV_VARS` variable is set.
    ``legacy_env``: the :data:`LEGACY_ENV_VARS` set to a non-zero value when detected.
    """

    flavour: Flavour
    version: str | None = None
    functions: frozenset[str] = frozenset()
    refuses_legacy_env: bool = False
    legacy_env: tuple[str, ...] = ()
    origin: str | None = None

    @property
    def present(self) -> bool:
        return self.flavour != "absent"

    def has(self, function: str) -> bool:
        return function in self.functions

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


def legacy_sglang_fp4_flags(environ: Mapping[str, str] | None = None) -> dict[str, bool]:
    """SGLang's old FP4-activation switches that are set to a true value, by name.

    They meant "use W4A4 (MXFP4 activations) MegaMoE". In SGLang 0.5.23 the weights' layout is
    chosen at load time by ``--enable-w4a4-mxfp4-megamoe`` (``experts._mega_moe_w4a4``); these
    variables must be translated into configuration (prefer ``mega_w4a4``), never forwarded into
    ``DG_USE_*`` (sgl-deep-gemm 0.2.x raises on those).
    """
    environ = os.environ if environ is None else environ
    truthy = {"1", "true", "yes", "on"}
    return {name: True for name in LEGACY_SGLANG_FLAGS if environ.get(name, "").strip().lower() in truthy}


# -- static detection -------------------------------------------------------------------------------


def _function_params(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    params: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
            params[node.name] = tuple(names)
    return params


def _imported_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _parse(path: pathlib.Path) -> tuple[ast.Module | None, str]:
    try:
        text = path.read_text(encoding="utf-8")
        return ast.parse(text), text
    except (OSError, SyntaxError, ValueError):
        return None, ""


def _read_version(package_dir: pathlib.Path) -> str | None:
    version_file = package_dir / "VERSION"
    try:
        return version_file.read_text(encoding="utf-8").strip() or None
    except OSError:
        pass
    try:
        from importlib import metadata

        return metadata.version("sgl-deep-gemm")
    except Exception:  # noqa: BLE001 - a version is informative only
        return None


def api_from_source_dir(package_dir: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> DeepGemmApi:
    """Detect the API of a deep_gemm package directory from its sources (nothing is imported)."""
    root = pathlib.Path(package_dir)
    top_tree, top_text = _parse(root / "__init__.py")
    mega_tree, mega_text = _parse(root / "mega" / "__init__.py")
    if mega_tree is None:
        mega_tree, mega_text = _parse(root / "mega.py")
    params: dict[str, tuple[str, ...]] = {}
    exported: set[str] = set()
    for tree in (mega_tree, top_tree):  # top-level definitions win (they wrap the mega ones)
        if tree is not None:
            params.update(_function_params(tree))
    if top_tree is not None:
        exported = _imported_names(top_tree)
    functions = frozenset(f for f in MEGA_FUNCTIONS if f in params or f in exported)
    text = top_text + "\n" + mega_text
    refuses = "_check_legacy_fp4_acts_env" in text or ("DG_USE_FP4_ACTS" in text and "no longer supported" in text)
    buffer_params = params.get("get_symm_buffer_for_mega_moe", ())
    if "get_symm_buffer_for_mega_moe" not in functions:
        flavour: Flavour = "no_mega"
    elif "mma_type" in buffer_params:
        flavour = "mma_type"
    else:
        flavour = "legacy_env"
    return DeepGemmApi(
        flavour=flavour,
        version=_read_version(root),
        functions=functions,
        refuses_legacy_env=refuses,
        legacy_env=legacy_env_set(environ),
        origin=str(root),
    )


@functools.lru_cache(maxsize=1)
def _detect_cached() -> DeepGemmApi:
    try:
        spec = importlib.util.find_spec("deep_gemm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return DeepGemmApi(flavour="absent", legacy_env=legacy_env_set())
    api = api_from_source_dir(list(spec.submodule_search_locations)[0])
    logger.debug("sglang-moe-plugins: detected %s at %s", api.describe(), api.origin)
    return api


def detect_deep_gemm_api(refresh: bool = False) -> DeepGemmApi:
    """The installed sgl-deep-gemm's MegaMoE API (cached per process; ``refresh`` re-reads it).

    The environment snapshot (:attr:`DeepGemmApi.legacy_env`) is taken at the first call.
    """
    if refresh:
        _detect_cached.cache_clear()
    return _detect_cached()


def api_of_module(module: ModuleType | Any, environ: Mapping[str, str] | None = None) -> DeepGemmApi:
    """Detect the API of an already imported ``deep_gemm`` module (or a stand-in) by introspection."""
    functions = frozenset(f for f in MEGA_FUNCTIONS if callable(getattr(module, f, None)))
    flavour: Flavour
    if "get_symm_buffer_for_mega_moe" not in functions:
        flavour = "no_mega"
    else:
        try:
            params = inspect.signature(module.get_symm_buffer_for_mega_moe).parameters
        except (TypeError, ValueError):
            params = {}
        flavour = "mma_type" if "mma_type" in params else "legacy_env"
    mega = getattr(module, "mega", None)
    refuses = callable(getattr(mega, "_check_legacy_fp4_acts_env", None))
    return DeepGemmApi(
        flavour=flavour,
        version=getattr(module, "__version__", None),
        functions=functions,
        refuses_legacy_env=refuses,
        legacy_env=legacy_env_set(environ),
        origin=getattr(module, "__file__", None),
    )


def load_deep_gemm() -> ModuleType:
    """Import ``deep_gemm`` (first use only; this loads its CUDA library). ImportError if missing."""
    import deep_gemm  # noqa: PLC0415 - lazy by design

    return deep_gemm
