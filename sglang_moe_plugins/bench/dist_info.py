"""Temporary ``.dist-info`` directories: entry points that ``importlib.metadata`` finds without installing.

Two uses in ``benchmarks/``: a do-nothing plugin installed for one run as a real distribution with an entry
point (``host_overhead.py --section cpu``, ``mega_call_overhead.py --cpu``), and a source checkout's own
entry points made visible where the tree is copied rather than installed (``checkout_dist_info.py``, the
GPU machine).
"""

from __future__ import annotations

import importlib
import pathlib
import sys
import tempfile
import textwrap
import tomllib
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points

__all__ = ["write_dist_info", "temporary_site", "checkout_dist_info", "checkout_entry_points", "KERNELS_GROUP"]

#: The entry point group of kernel plugins (``sglang_moe_plugins.core.registry.ENTRY_POINT_GROUP``).
KERNELS_GROUP = "sglang_moe_plugins.kernels"


def write_dist_info(
    site: str | pathlib.Path, name: str, version: str, groups: Mapping[str, Mapping[str, str]]
) -> pathlib.Path:
    """Write ``site/<name>-<version>.dist-info`` (``METADATA``, ``entry_points.txt`` with ``groups``:
    group -> entry point name -> ``module:attr``); returns the dist-info directory."""
    info = pathlib.Path(site) / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines: list[str] = []
    for group, table in groups.items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in table.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines).rstrip("\n") + "\n")
    return info


def temporary_site(prefix: str, name: str, modules: Mapping[str, str], kernels: Mapping[str, str]) -> pathlib.Path:
    """A fresh temporary directory holding ``modules`` (module name -> source) and the distribution
    ``name`` 0.1 declaring ``kernels`` (entry point name -> ``module:attr``) in the kernel group, put
    first on ``sys.path`` for the rest of this process; returns the directory."""
    site = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))
    write_dist_info(site, name, "0.1", {KERNELS_GROUP: kernels})
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    return site


def _project(root: str | pathlib.Path) -> dict:
    return tomllib.loads((pathlib.Path(root) / "pyproject.toml").read_text())["project"]


def checkout_dist_info(root: str | pathlib.Path, target: str | pathlib.Path) -> pathlib.Path:
    """The dist-info of the checkout at ``root`` (its pyproject.toml's name, version, entry points and
    scripts) written under ``target``; with ``PYTHONPATH=target:root`` the built-in plugins are found
    exactly as an installed copy's are."""
    project = _project(root)
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    return write_dist_info(target, project["name"], project["version"], groups)


def checkout_entry_points(root: str | pathlib.Path) -> list[EntryPoint]:
    """The built-in plugins' entry points: the installed ones where this package is installed, else built
    from the pyproject.toml at ``root`` (a copied tree run with ``PYTHONPATH``)."""
    installed = list(entry_points(group=KERNELS_GROUP))
    if any(ep.dist is not None and ep.dist.name == "sglang-moe-plugins" for ep in installed):
        return installed
    table = _project(root)["entry-points"][KERNELS_GROUP]
    return [EntryPoint(name, value, KERNELS_GROUP) for name, value in table.items()]
