"""The built-in plugins' entry points, also where the package is not installed (e.g. the GPU machine,
where tests run from the checkout with ``PYTHONPATH=.`` and no dist-info exists).

Installed: the real ``importlib.metadata`` entry points of group ``sglang_moe_plugins.kernels``.
Not installed: ``EntryPoint`` objects built from pyproject.toml's ``[project.entry-points]`` table, loaded
by ``Registry.discover`` exactly as installed ones are.
"""

from __future__ import annotations

import pathlib
import tomllib
from importlib.metadata import EntryPoint, entry_points

from sglang_moe_plugins.core.registry import ENTRY_POINT_GROUP

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def builtin_entry_points() -> list[EntryPoint]:
    installed = list(entry_points(group=ENTRY_POINT_GROUP))
    if any(ep.dist is not None and ep.dist.name == "sglang-moe-plugins" for ep in installed):
        return installed
    table = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    return [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in table.items()]
