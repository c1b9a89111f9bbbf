"""Third-party distributions that misbehave at start-up (issue 18: findings 3 to 6), written into a
temporary site directory with a ``.dist-info`` each (see test_startup_safety.py).

Every module appends ``imported <module>`` to the file named by ``MOE_TEST_MARKER`` when it is imported,
and the plugins that run append ``ran <plugin>``: a test sees which modules were imported and which
plugin took a call, also in a subprocess.
"""

from __future__ import annotations

import pathlib

__all__ = ["EVIL_DIST", "EVIL_ENTRY_POINTS", "STALE_DIST", "STALE_ENTRY_POINTS", "MODULES", "write_site", "markers"]

_MARK = """
import os
def mark(text):
    if os.environ.get("MOE_TEST_MARKER"):
        with open(os.environ["MOE_TEST_MARKER"], "a") as handle:
            handle.write(text + "\\n")
mark("imported " + __name__)
"""

_PLUGIN = (
    _MARK
    + """
from sglang_moe_plugins import Plugin, Support
from sglang_moe_plugins.ops.silu_mul_quant import OP
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference

class _Base(Plugin):
    op = OP
    def available(self, platform):
        return Support.yes("runs anywhere")
    def supports(self, shape, config):
        return Support.yes("every call")
    def run(self, inputs, outputs, shape, config):
        mark("ran " + self.name)
        silu_mul_quant_reference(inputs, outputs, shape, config)
"""
)

MODULES = {
    # Finding 5: priority 10**9, taken for every call without any opt-in.
    "evil_top": _PLUGIN + "class TopPriority(_Base):\n    name = 'evil_top'\n    priority = 10**9\n",
    # Finding 6: takes the built-in's name.
    "evil_takeover": _PLUGIN + "class FakeReference(_Base):\n    name = 'reference'\n    priority = 10**6\n",
    # Finding 3: an attribute whose access raises something that is not ours.
    "evil_op_raises": _PLUGIN
    + (
        "class OpRaises(_Base):\n    name = 'evil_op_raises'\n    priority = 5\n"
        "    @property\n    def op(self):\n        raise RuntimeError('op lookup exploded')\n"
    ),
    # Finding 3: SystemExit at import would end SGLang's process.
    "evil_sysexit": _MARK + "raise SystemExit(3)\n",
    # An entry point whose name is not its plugin's.
    "evil_misnamed": _PLUGIN + "class Misnamed(_Base):\n    name = 'evil_other_name'\n    priority = 1\n",
}

EVIL_DIST = ("moe-evil-plugins", "1.0")
EVIL_ENTRY_POINTS = {
    "evil_top": "evil_top:TopPriority",
    "reference": "evil_takeover:FakeReference",
    "evil_op_raises": "evil_op_raises:OpRaises",
    "evil_sysexit": "evil_sysexit:Plugin",
    "evil_misnamed": "evil_misnamed:Misnamed",
}
#: Finding 4: a dist-info left behind after its module was removed.
STALE_DIST = ("moe-stale-plugin", "2.0")
STALE_ENTRY_POINTS = {"stale_kernels": "stale_kernels_removed:Plugin"}


def _dist_info(site: pathlib.Path, dist: tuple[str, str], eps: dict[str, str]) -> None:
    name, version = dist
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = ["[sglang_moe_plugins.kernels]"] + [f"{k} = {v}" for k, v in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def write_site(site: pathlib.Path, evil: bool = True, stale: bool = False) -> pathlib.Path:
    """Write the modules and the dist-info(s) into ``site``; returns it."""
    site.mkdir(parents=True, exist_ok=True)
    if evil:
        for module, source in MODULES.items():
            (site / f"{module}.py").write_text(source)
        _dist_info(site, EVIL_DIST, EVIL_ENTRY_POINTS)
    if stale:
        _dist_info(site, STALE_DIST, STALE_ENTRY_POINTS)
    return site


def markers(path: pathlib.Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
