#!/usr/bin/env python3
"""Make a source checkout's entry points visible without installing it (e.g. on the GPU machine, where
the tree is copied and run with ``PYTHONPATH``): writes ``DIR/sglang_moe_plugins-<version>.dist-info`` with
``METADATA`` and ``entry_points.txt`` from pyproject.toml, so ``importlib.metadata`` finds the built-in
plugins (group ``sglang_moe_plugins.kernels``) exactly as an installed copy would
(:func:`sglang_moe_plugins.bench.dist_info.checkout_dist_info`). Then run with ``PYTHONPATH=DIR:$PWD``::

    PYTHONPATH=$PWD python3 benchmarks/checkout_dist_info.py /tmp/dist-info
    PYTHONPATH=/tmp/dist-info:$PWD python3 -m sglang_moe_plugins.cli list
"""

from __future__ import annotations

import argparse
import pathlib

from sglang_moe_plugins.bench.dist_info import checkout_dist_info

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main(target: str) -> None:
    print(checkout_dist_info(ROOT, target))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target", nargs="?", default="/tmp/dist-info", help="directory to write the dist-info into")
    main(parser.parse_args().target)
