#!/usr/bin/env python3
"""Make a source checkout's entry points visible without installing it (e.g. on the GPU machine, where
the tree is copied and run with ``PYTHONPATH``): writes ``DIR/sglang_moe_plugins-<version>.dist-info`` with
``METADATA`` and ``entry_points.txt`` from pyproject.toml, so ``importlib.metadata`` finds the built-in
plugins (group ``sglang_moe_plugins.kernels``) exactly as an installed copy would. Then run with
``PYTHONPATH=DIR:$PWD``::

    python3 benchmarks/checkout_dist_info.py /tmp/dist-info
    PYTHONPATH=/tmp/dist-info:$PWD python3 -m sglang_moe_plugins.cli list
"""

from __future__ import annotations

import pathlib
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main(target: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    info = pathlib.Path(target) / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, table in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in table.items()]
        lines.append("")
    scripts = project.get("scripts", {})
    if scripts:
        lines.append("[console_scripts]")
        lines += [f"{key} = {value}" for key, value in scripts.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    print(info)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/dist-info")
