"""A module global that imports its module on first use and then is that module.

``torch = lazy_module("torch", globals())`` at the top of a module keeps torch out of that module's import
(so that ``sglang-moe-plugins list`` starts without torch). The first attribute read through it
(``torch.empty``, ``torch.Tensor``) imports torch and rebinds the module's global ``torch`` to torch
itself: from then on the module's functions read the global exactly as after ``import torch``, at the
same cost (a hooked call pays nothing for it). Type checkers see ``if TYPE_CHECKING: import torch``.
"""

from __future__ import annotations

import importlib
from collections.abc import MutableMapping
from typing import Any

__all__ = ["LazyModule", "lazy_module"]


class LazyModule:
    """Stands in for module ``name`` under ``alias`` in ``namespace`` until one of its attributes is read."""

    __slots__ = ("_alias", "_name", "_namespace")

    def __init__(self, name: str, namespace: MutableMapping[str, Any], alias: str) -> None:
        self._name = name
        self._namespace = namespace
        self._alias = alias

    def __getattr__(self, attribute: str) -> Any:
        if attribute in LazyModule.__slots__ or (attribute.startswith("__") and attribute.endswith("__")):
            # copy/pickle/hasattr probes (``__setstate__``, ``__deepcopy__``, ...) and lookups before
            # ``__init__`` ran (``_name`` unset): not the module's attributes, and no import for them
            raise AttributeError(attribute)
        module = importlib.import_module(self._name)
        if self._namespace.get(self._alias) is self:
            self._namespace[self._alias] = module
        return getattr(module, attribute)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return importlib.import_module, (self._name,)  # a copy or a pickle is the module itself

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def lazy_module(name: str, namespace: MutableMapping[str, Any], alias: str | None = None) -> Any:
    """A :class:`LazyModule` for ``name``, to bind as ``namespace[alias]`` (``alias`` defaults to the last
    part of ``name``): ``torch = lazy_module("torch", globals())``."""
    return LazyModule(name, namespace, alias or name.rpartition(".")[2])
