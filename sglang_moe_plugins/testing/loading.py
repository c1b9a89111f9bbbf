"""Resolve what ``check`` was given: a registered plugin name, ``path/to/module.py[:Class]`` or ``module:Class``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any

from ..core.registry import ENTRY_POINT_GROUP
from ..errors import MoEPluginsError

try:  # Python 3.12+ has the selectable entry_points API in the stdlib.
    from importlib.metadata import entry_points
except ImportError:  # pragma: no cover
    from importlib_metadata import entry_points  # type: ignore[no-redef]

__all__ = ["PluginLoadError", "LoadedPlugin", "load_plugin", "instantiate"]


class PluginLoadError(MoEPluginsError, ValueError):
    """The target given to the suite is not a loadable plugin; the message says what would be."""


@dataclass(frozen=True)
class LoadedPlugin:
    """A plugin instance and where it came from (for the report)."""

    plugin: Any
    origin: str
    #: The entry point's name when loaded through one (it must equal the plugin's ``name``).
    entry_point: str | None = None
    #: A target string that loads the same plugin in another process (the expert-parallel ranks), or None.
    spec: str | None = None


def _looks_like_plugin_class(obj: Any) -> bool:
    return (
        inspect.isclass(obj)
        and isinstance(getattr(obj, "name", None), str)
        and bool(getattr(obj, "name", ""))
        and isinstance(getattr(obj, "op", None), str)
        and callable(getattr(obj, "supports", None))
        and callable(getattr(obj, "run", None))
    )


def instantiate(target: Any, origin: str) -> Any:
    """An instance from a plugin class (called with no arguments) or the instance itself."""
    if not inspect.isclass(target):
        return target
    try:
        return target()
    except Exception as exc:  # noqa: BLE001 - report, do not crash
        raise PluginLoadError(
            f"{origin}: instantiating {target.__name__}() raised {type(exc).__name__}: {exc}"
        ) from exc


def _from_module(module: Any, attr: str | None, origin: str) -> Any:
    if attr:
        try:
            return getattr(module, attr)
        except AttributeError:
            raise PluginLoadError(f"{origin}: module has no attribute {attr!r}") from None
    found = [
        obj for obj in vars(module).values() if _looks_like_plugin_class(obj) and obj.__module__ == module.__name__
    ]
    if len(found) == 1:
        return found[0]
    if not found:
        raise PluginLoadError(f"{origin}: no plugin class (with name, op, supports, run) is defined in the module")
    names = ", ".join(sorted(f"{origin}:{cls.__name__}" for cls in found))
    raise PluginLoadError(f"{origin} defines several plugin classes; name one: {names}")


def _load_path(path: str, attr: str | None) -> LoadedPlugin:
    if not os.path.isfile(path):
        raise PluginLoadError(f"no such file: {path}")
    full = os.path.abspath(path)
    digest = hashlib.sha1(full.encode()).hexdigest()[:10]
    module_name = f"_moe_plugin_check_{os.path.splitext(os.path.basename(full))[0]}_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, full)
        if spec is None or spec.loader is None:
            raise PluginLoadError(f"cannot import {path}: not a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001
            del sys.modules[module_name]
            raise PluginLoadError(f"importing {path} raised {type(exc).__name__}: {exc}") from exc
    origin = f"{path}" + (f":{attr}" if attr else "")
    spec = full + (f":{attr}" if attr else "")  # type: ignore[assignment]  # the spec string from here on
    return LoadedPlugin(instantiate(_from_module(module, attr, path), origin), f"file {origin}", spec=spec)  # type: ignore[arg-type]  # the spec string


def _load_entry_point(name: str) -> LoadedPlugin | None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name != name:
            continue
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else "unknown distribution"  # type: ignore[union-attr]  # checked on this line
        origin = f"entry point {ep.name} = {ep.value} ({dist})"
        try:
            target = ep.load()
        except Exception as exc:  # noqa: BLE001
            raise PluginLoadError(f"{origin}: loading raised {type(exc).__name__}: {exc}") from exc
        return LoadedPlugin(instantiate(target, origin), origin, entry_point=ep.name, spec=ep.name)
    return None


def _class_spec(target: Any) -> str | None:
    """``module:Class`` that another process can import, or None (a class defined in a function,
    ``__main__`` or a module loaded from a path)."""
    cls = target if inspect.isclass(target) else type(target)
    module, qualname = getattr(cls, "__module__", ""), getattr(cls, "__qualname__", "")
    if not module or module == "__main__" or module.startswith("_moe_plugin_check_") or "<" in qualname:
        return None
    return f"{module}:{qualname}"


def load_plugin(target: Any) -> LoadedPlugin:
    """Load ``target``: a plugin instance or class, a registered name (entry point group
    ``sglang_moe_plugins.kernels``), ``path/to/module.py[:Class]`` or ``package.module:Class``."""
    if not isinstance(target, str):
        origin = f"object {type(target).__name__ if not inspect.isclass(target) else target.__name__}"
        return LoadedPlugin(instantiate(target, origin), origin, spec=_class_spec(target))
    text = target.strip()
    path, _, attr = text.partition(":") if not os.path.isfile(text) else (text, "", "")
    if path.endswith(".py") or os.sep in path or os.path.isfile(path):
        return _load_path(path, attr or None)
    if attr:
        try:
            module = importlib.import_module(path)
        except ImportError as exc:
            raise PluginLoadError(f"cannot import module {path!r}: {exc}") from exc
        return LoadedPlugin(instantiate(_from_module(module, attr, path), text), f"module {text}", spec=text)
    loaded = _load_entry_point(text)
    if loaded is not None:
        return loaded
    from ..core.registry import Registry

    # Entry point names normally equal plugin names; fall back to the plugins' own names.
    registry = Registry.discover()
    if text in registry:
        record = registry.get(text)
        ep_name = str(record.entry_point).partition(" ")[0].partition("=")[0].strip() or None
        return LoadedPlugin(
            record.plugin,
            f"entry point {record.entry_point} ({record.distribution})",
            entry_point=ep_name,
            spec=ep_name,
        )
    valid = ", ".join(sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))) or "(none)"
    raise PluginLoadError(
        f"no plugin named {text!r} is registered (entry point group {ENTRY_POINT_GROUP}); registered: {valid}. "
        "Give a registered name, path/to/module.py[:Class] or package.module:Class"
    )
