"""The ``name`` check: a plugin may not take a built-in plugin's name, and its entry point is named as it is.

The built-in names are read from this package's own distribution: the entry points it declares in group
``sglang_moe_plugins.kernels``, from the distribution proved to be the one this package was imported from
(:func:`..core.own_distribution.is_own_distribution`, by file location; never by a ``Name`` that any
dist-info can write). A third-party plugin of the same name would
replace the built-in (or be dropped as a duplicate) in the registry, so the kit fails it. The built-in
plugins themselves (the class the built-in entry point names) pass.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from ..core.registry import ENTRY_POINT_GROUP
from ..log import get_logger

__all__ = ["DISTRIBUTION", "builtin_plugins", "check_name"]

logger = get_logger(__name__)

#: The distribution whose entry points are the built-in plugins.
DISTRIBUTION = "sglang-moe-plugins"


def builtin_plugins() -> dict[str, str]:
    """``name -> "module:Class"`` of the built-in plugins: the entry points of this package's own distribution,
    proved by location (a dist-info that only says ``Name: sglang-moe-plugins`` is not it)."""
    from ..core.own_distribution import installed_entry_points, is_own_distribution

    eps, _broken, _notices = installed_entry_points(ENTRY_POINT_GROUP)
    found = {ep.name: ep.value for ep in eps if ep.dist is not None and is_own_distribution(ep.dist)}
    if not found:  # a checkout on sys.path without an install: the reserved names, their classes unknown ("")
        from ..core.discovery import BUILTIN_PLUGINS

        found = dict.fromkeys(BUILTIN_PLUGINS, "")
    return found


def _class_path(plugin: Any) -> str:
    cls = plugin if inspect.isclass(plugin) else type(plugin)
    return f"{cls.__module__}:{cls.__qualname__}"


def _is_builtin_class(plugin: Any, value: str) -> bool:
    """The class ``value`` names (re-exported under another module path, say) is the plugin's class."""
    module, _, attr = value.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - cannot load the built-in: not the same class
        return False
    return obj is plugin or (inspect.isclass(obj) and type(plugin) is obj)


def check_name(plugin: Any, entry_point: str | None) -> str | None:
    """None when ``plugin``'s name is its own; else what is wrong with it."""
    name = getattr(plugin, "name", None)
    if not isinstance(name, str):
        return None  # the contract check reports it
    builtins = builtin_plugins()
    own = builtins.get(name)
    if own == "":  # the built-in's class is not known here: only this package's own modules may use the name
        own_class = _class_path(plugin).startswith("sglang_moe_plugins.")
    else:
        own_class = own is None or own == _class_path(plugin) or _is_builtin_class(plugin, own)
    if own is not None and not own_class:
        return (
            f"plugin name {name!r} is the name of the built-in plugin {own or name} (distribution {DISTRIBUTION}); a third-party "
            f"plugin of that name would replace it. Choose another name (built-in names: {', '.join(sorted(builtins))})"
        )
    if entry_point is not None and entry_point != name:
        return (
            f"the entry point is named {entry_point!r} but the plugin's name is {name!r}: users disable, prioritise and "
            f"configure plugins by name, so name the entry point {name!r} in group {ENTRY_POINT_GROUP}"
        )
    return None
