"""Resolve what ``check`` was given: a registered plugin name or ``dist-name:entry-point``,
``path/to/module.py[:Class]`` or ``module:Class``.

A name is resolved exactly as the runtime resolves it (:func:`..core.discovery.resolve` under the
configuration of this environment: ``allow``, ``disable``, the reserved built-in names, a name two
distributions declare): ``check`` loads the entry point SGLang would load, or none, and says why.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from ..core.discovery import (
    EntryPointInfo,
    Resolution,
    allow_matches,
    describe_entry_point,
    find,
    installed_entry_points,
    resolve,
)
from ..core.registry import ENTRY_POINT_GROUP
from ..errors import MoEPluginsError

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


#: A dotted module path: ``a:b`` is ``package.module:Class`` only when ``a`` is one.
_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _installed() -> list[EntryPointInfo]:
    eps, _, _ = installed_entry_points(ENTRY_POINT_GROUP)
    return [describe_entry_point(ep) for ep in eps]


def _load_entry_point(target: str, resolution: Resolution) -> LoadedPlugin | None:
    """The entry point ``target`` (a name or ``dist-name:entry-point``) resolves to, loaded; None when
    none is installed; PluginLoadError when one is installed but the runtime would not load it."""
    info, why = find(resolution, target)
    if info is None:
        if why is None:
            return None
        raise PluginLoadError(
            f"plugin {target!r} is not loaded here, so it is not checked (check resolves names as SGLang's "
            f"start-up does, under this environment's configuration): {why}"
        )
    dist = info.dist_label + (", built-in" if info.builtin else "")
    origin = f"entry point {info.origin}, from {dist}"
    try:
        factory = info.entry_point.load()
    except Exception as exc:  # noqa: BLE001
        raise PluginLoadError(f"{origin}: loading raised {type(exc).__name__}: {exc}") from exc
    # Another process (an expert-parallel rank) resolves the same entry point from this spec.
    spec = f"{info.distribution}:{info.name}" if info.distribution else info.name
    return LoadedPlugin(instantiate(factory, origin), origin, entry_point=info.name, spec=spec)


def _class_spec(target: Any) -> str | None:
    """``module:Class`` that another process can import, or None (a class defined in a function,
    ``__main__`` or a module loaded from a path)."""
    cls = target if inspect.isclass(target) else type(target)
    module, qualname = getattr(cls, "__module__", ""), getattr(cls, "__qualname__", "")
    if not module or module == "__main__" or module.startswith("_moe_plugin_check_") or "<" in qualname:
        return None
    return f"{module}:{qualname}"


def load_plugin(target: Any) -> LoadedPlugin:
    """Load ``target``: a plugin instance or class, a registered name or ``dist-name:entry-point`` (entry
    point group ``sglang_moe_plugins.kernels``, resolved as the runtime resolves it), ``path/to/module.py[:Class]``
    or ``package.module:Class``."""
    if not isinstance(target, str):
        origin = f"object {type(target).__name__ if not inspect.isclass(target) else target.__name__}"
        return LoadedPlugin(instantiate(target, origin), origin, spec=_class_spec(target))
    text = target.strip()
    path, _, attr = text.partition(":") if not os.path.isfile(text) else (text, "", "")
    if path.endswith(".py") or os.sep in path or os.path.isfile(path):
        return _load_path(path, attr or None)
    infos = _installed()
    # "a:b" is dist-name:entry-point when an installed distribution `a` declares entry point `b` (or `a`
    # cannot name a module), otherwise package.module:Class.
    if attr and _MODULE_PATH.fullmatch(path) and not any(allow_matches(text, i) for i in infos):
        try:
            module = importlib.import_module(path)
        except ImportError as exc:
            raise PluginLoadError(f"cannot import module {path!r}: {exc}") from exc
        return LoadedPlugin(instantiate(_from_module(module, attr, path), text), f"module {text}", spec=text)
    from ..config import load_config

    resolution = resolve(infos, load_config())  # the runtime's resolution, under this environment's config
    loaded = _load_entry_point(text, resolution)
    if loaded is not None:
        return loaded
    names = ", ".join(sorted({i.name for i in resolution.admitted})) or "(none)"
    raise PluginLoadError(
        f"no plugin named {text!r} is registered (entry point group {ENTRY_POINT_GROUP}); registered: {names}. "
        "Give a registered name, dist-name:entry-point, path/to/module.py[:Class] or package.module:Class"
    )
