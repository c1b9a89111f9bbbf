"""Fake distributions for issue #30 findings 1-3 (tests/test_redteam2_discovery.py): two distributions that
declare the same entry-point name, and distributions that claim to be this package's.

Each distribution is written into its own site directory (a ``.dist-info`` with METADATA and
entry_points.txt, its modules next to it), so a test puts them on ``PYTHONPATH`` in the order it wants.
The modules reuse tests/startup_fakes.py's marker protocol: ``imported <module>`` is appended to the file
named by ``MOE_TEST_MARKER`` at import, ``ran <plugin>`` when a plugin takes a call.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from startup_fakes import _PLUGIN, markers

__all__ = ["FakeDist", "GOOD", "EVIL", "IMPOSTOR_REFERENCE", "claims_builtin", "write_dist", "markers"]

#: The plugin both distributions name ``rt2_good``; the priority makes it serve every call when loaded.
_NAMED = _PLUGIN + "class {cls}(_Base):\n    name = 'rt2_good'\n    priority = 10**6\n"
#: It marks which distribution's plugin ran.
_NAMED_RUN = (
    "\n    def run(self, inputs, outputs, shape, config):\n"
    "        mark('ran rt2_good from ' + __name__)\n"
    "        silu_mul_quant_reference(inputs, outputs, shape, config)\n"
)


@dataclass(frozen=True)
class FakeDist:
    """A distribution to write: METADATA ``Name`` (None: no Name line), version, the dist-info
    directory's stem, its entry points and its modules."""

    name: str | None
    version: str
    stem: str
    entry_points: dict[str, str]
    modules: dict[str, str]

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


GOOD = FakeDist(
    "rt2-good",
    "1.0",
    "rt2_good-1.0",
    {"rt2_good": "rt2_disc_good:GoodPlugin"},
    {"rt2_disc_good": _NAMED.format(cls="GoodPlugin") + _NAMED_RUN},
)
#: Found earlier on sys.path, it declares the same entry-point name; its import-time code must not run.
EVIL = FakeDist(
    "rt2-evil",
    "6.6",
    "rt2_evil-6.6",
    {"rt2_good": "rt2_disc_evil:EvilPlugin"},
    {"rt2_disc_evil": _NAMED.format(cls="EvilPlugin") + _NAMED_RUN},
)
#: A third party that takes the built-in name 'reference' (finding 3: ``check reference``).
IMPOSTOR_REFERENCE = FakeDist(
    "rt2-impostor",
    "9.9",
    "rt2_impostor-9.9",
    {"reference": "rt2_disc_impostor:FakeReference"},
    {"rt2_disc_impostor": _PLUGIN + "class FakeReference(_Base):\n    name = 'reference'\n    priority = 10**6\n"},
)


def claims_builtin(name: str | None, stem: str, entry_point: str, extra: dict[str, str] | None = None) -> FakeDist:
    """Finding 2: a dist-info that says it is ``sglang-moe-plugins`` (``name``; None: no ``Name`` at all)
    and declares ``entry_point`` into a module of this package that does not exist: classified as a
    built-in, it would be imported whatever ``allow`` says and fail (under strict, every call)."""
    eps = {entry_point: "sglang_moe_plugins.rt2_disc_no_such_module:Plugin", **(extra or {})}
    return FakeDist(name, "6.6.6", stem, eps, {})


def write_dist(site: pathlib.Path, dist: FakeDist) -> pathlib.Path:
    """Write ``dist`` (its dist-info and modules) into ``site``; returns ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    info = site / f"{dist.stem}.dist-info"
    info.mkdir()
    metadata = "Metadata-Version: 2.1\n" + (f"Name: {dist.name}\n" if dist.name else "") + f"Version: {dist.version}\n"
    (info / "METADATA").write_text(metadata)
    lines = ["[sglang_moe_plugins.kernels]"] + [f"{k} = {v}" for k, v in dist.entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in dist.modules.items():
        (site / f"{module}.py").write_text(source)
    return site
