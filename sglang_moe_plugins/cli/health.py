"""What ``list`` and ``doctor`` say about the registry besides the table: the registry itself when start-up
cannot build it (never a traceback), entry points not loaded, stock ops, the platform warnings and the
``[force]``d plugins this machine cannot run."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from collections.abc import Iterator
from typing import Any

from .. import api
from ..config import load_config
from ..core.registry import Registry
from ..errors import ConfigError, MoEPluginsError, PluginValidationError
from ..hardware import Platform, local_platform
from ..ops import OPS

__all__ = [
    "RegistryReport",
    "load_registry",
    "platform_findings",
    "stock_lines",
    "quiet_host_import",
    "PURE_TORCH",
    "forced_here_warnings",
]

#: Plugins that are pure torch with a host sync per call: correct anywhere, slow on a GPU.
PURE_TORCH = ("reference", "mega_reference")


@dataclasses.dataclass(frozen=True)
class RegistryReport:
    """The registry to show, the problems that loading it raised, and whether start-up would fail."""

    registry: Registry | None
    problems: tuple[str, ...]
    #: The configuration or, under strict, the registry cannot be built: every hooked call raises it
    #: (or, with ``on_config_error = "stock"``, the package is off).
    failed: bool
    #: The exception that loading the registry raised, if any.
    error: BaseException | None = dataclasses.field(default=None, compare=False)


@contextlib.contextmanager
def _registry_log_silenced() -> Iterator[None]:
    log = logging.getLogger("sglang_moe_plugins.core.registry")
    before, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = before


def load_registry() -> RegistryReport:
    """The process registry, or why there is none. Under strict, a registry that refuses to build is
    rebuilt without strict for display only (its problems are already in the strict error)."""
    try:
        return RegistryReport(api.get_registry(), (), False)
    except ConfigError as exc:
        return RegistryReport(None, (f"configuration error: {exc}",), True, exc)
    except PluginValidationError as exc:  # strict = true and a plugin could not be registered
        problem = (f"plugin registry error: {exc}",)
        try:
            with _registry_log_silenced():
                lenient = Registry.discover(dataclasses.replace(load_config(), strict=False))
        except Exception:  # noqa: BLE001 - display only
            lenient = None
        return RegistryReport(lenient, problem, True, exc)
    except MoEPluginsError as exc:
        return RegistryReport(None, (f"plugin registry error: {exc}",), True, exc)
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - start-up would fail closed with it; show it as a line
        return RegistryReport(None, (f"start-up error: {type(exc).__name__}: {exc}",), True, exc)


def stock_lines(registry: Registry) -> list[str]:
    return [f"op {op}: stock, SGLang's own function runs it" for op in sorted(registry.config.stock)]


def _runs_here(record: Any, here: Platform) -> tuple[bool, str]:
    try:
        avail = record.plugin.available(here) if hasattr(record.plugin, "available") else None
    except Exception as exc:  # noqa: BLE001
        return False, f"available() raised {type(exc).__name__}: {exc}"
    if avail is None or avail:
        return True, ""
    return False, str(getattr(avail, "reason", "not available"))


def platform_findings(registry: Registry, here: Platform) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` per hooked op, by each enabled plugin's ``available(here)`` and its static
    priority: no enabled plugin can run here (a problem: every hooked call of that op raises), or on a
    CUDA machine a pure-torch reference would be chosen first (a warning). Ops in ``stock`` and ops with
    a ``force`` entry (see the force warnings) are not judged."""
    problems: list[str] = []
    notes: list[str] = []
    config = registry.config
    for op in sorted(OPS):
        if op in config.stock or op in config.force:
            continue
        records = [r for r in registry.records(op) if r.enabled]
        verdicts = [(r, *_runs_here(r, here)) for r in records]
        runnable = [r for r, ok, _ in verdicts if ok]
        if not runnable:
            why = "; ".join(f"{r.name}: {reason}" for r, _, reason in verdicts) or "no plugin of it is enabled"
            problems.append(
                f"op {op}: no enabled plugin can run on this machine ({here}) ({why}); every hooked call "
                f"of it raises NoPluginAvailableError (enable one, or list the op in 'stock')"
            )
        elif here.is_cuda and runnable[0].name in PURE_TORCH:
            notes.append(
                f"op {op}: {runnable[0].name} would be chosen first on this CUDA machine ({here}): pure torch, "
                f"with a host sync per call (slow); no faster enabled plugin is available here"
            )
    return problems, notes


def forced_here_warnings(registry: Any) -> list[str]:
    """A line for every ``[force]``d plugin that is not available on this machine."""
    here, out = local_platform(), []
    for op, name in sorted(registry.config.force.items()):
        if name not in registry:
            continue
        plugin = registry.get(name).plugin
        try:
            avail = plugin.available(here) if hasattr(plugin, "available") else None
        except Exception as exc:  # noqa: BLE001 - report, do not die
            out.append(f"force.{op} = {name!r}: available() raised {type(exc).__name__}: {exc}")
            continue
        if avail is not None and not avail:
            out.append(
                f"force.{op} = {name!r} is not available on this machine ({here}): {avail.reason}; every {op} call here raises"
            )
    return out


@contextlib.contextmanager
def quiet_host_import() -> Iterator[None]:
    """Hide the host's import-time UserWarnings (SGLang's AWQ / GGUF 'only CUDA ...' lines)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield
