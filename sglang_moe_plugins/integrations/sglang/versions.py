"""Which case of the SGLang version table (:mod:`.version_table`: the host functions of each release and
what the host does around them) applies to the installed SGLang, and the table entries the hooks read.

The hooks read the record of the release they were registered for (:func:`active_target`); they hold
no per-release if-chains. The table's names are importable from here too.

Which case applies to the installed SGLang (:func:`version_case`, shown by ``doctor``):

- ``known``: a release of the table. Each target is hooked when it resolves with the table's parameters.
- ``newer``: a release newer than the table whose targets all resolve with exactly the parameters of
  the newest release: hooked, with one warning naming the untested release.
- ``newer-refused``: the same, but ``SGLANG_MOE_PLUGINS_REQUIRE_KNOWN_SGLANG=1`` asks for a known release:
  no hook, one warning.
- ``newer-mismatch``: a newer release where a target is missing or its parameters differ: no hook, one warning.
- ``unsupported``: older than the table or between its releases (e.g. a ``.post`` of an older release):
  no hook, one warning.
- ``absent``: SGLang is not installed.
"""

from __future__ import annotations

import os
import pkgutil
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...config_values import REQUIRE_KNOWN_ENV, _env_flag
from ...errors import ConfigError
from ...signatures import parameter_names
from .version_table import (
    CONTIG_RUNNER_TARGET,
    GUARD_TARGET,
    KNOWN_TARGETS,
    MEGA_TARGET,
    POLICY_TARGET,
    SMQ_TARGET,
    ContigHost,
    HookTarget,
    MegaHost,
    SmqHost,
)

__all__ = [
    "HookTarget",
    "TargetCheck",
    "VersionCase",
    "SmqHost",
    "MegaHost",
    "ContigHost",
    "KNOWN_TARGETS",
    "REQUIRE_KNOWN_ENV",
    "SMQ_TARGET",
    "MEGA_TARGET",
    "CONTIG_RUNNER_TARGET",
    "GUARD_TARGET",
    "POLICY_TARGET",
    "sglang_version",
    "check_targets",
    "version_case",
    "active_target",
    "set_active_targets",
]


@dataclass(frozen=True)
class TargetCheck:
    """Whether a target can be hooked here, and why (shown by ``doctor``)."""

    path: str
    op: str
    ok: bool
    reason: str


@dataclass(frozen=True)
class VersionCase:
    """Which rule applies to the installed SGLang, and the per-target checks under it."""

    case: str
    version: str | None
    table_release: str | None
    hooks: bool
    message: str
    checks: tuple[TargetCheck, ...]
    targets: tuple[HookTarget, ...] = ()


_active: dict[str, HookTarget] = {}


def sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _release_key(version: str) -> tuple:
    """Sortable key: (release numbers, pre/post rank, suffix number); no dependency on ``packaging``."""
    m = re.match(r"^(\d+(?:\.\d+)*)(?:\.?(a|b|rc|dev|post)\.?(\d*))?", version.strip())
    if m is None:
        return ((), 0, 0)
    release = tuple(int(x) for x in m.group(1).split("."))
    release = release + (0,) * (4 - len(release))
    rank = {"dev": -4, "a": -3, "b": -2, "rc": -1, None: 0, "post": 1}[m.group(2)]
    return (release, rank, int(m.group(3) or 0))


def _resolve(path: str) -> Any:
    """The object at a dotted path: ``module.function`` or ``module.Class.method``, as SGLang's
    ``HookRegistry`` resolves its targets (``pkgutil.resolve_name``)."""
    return pkgutil.resolve_name(path)


def _check(target: HookTarget, label: str) -> TargetCheck:
    try:
        fn = _resolve(target.path)
    except Exception as exc:  # noqa: BLE001 - a missing target must never break start-up
        return TargetCheck(target.path, target.op, False, f"cannot resolve: {type(exc).__name__}: {exc}")
    try:
        params = parameter_names(fn)
    except (TypeError, ValueError) as exc:
        return TargetCheck(target.path, target.op, False, f"no inspectable signature: {exc}")
    if params != target.parameters:
        return TargetCheck(
            target.path, target.op, False, f"signature differs: expected {target.parameters}, found {params}"
        )
    return TargetCheck(target.path, target.op, True, f"{label}: signature matches")


def _require_known(environ: Mapping[str, str]) -> bool:
    """``SGLANG_MOE_PLUGINS_REQUIRE_KNOWN_SGLANG`` (set to 1 to hook only releases of the table), read by the one
    parser of boolean variables. An invalid value reads as unset here only because the configuration refuses it
    (:func:`..config.load_config` raises it), so the hooks fail closed with that error, as for every config error."""
    try:
        return bool(_env_flag(environ, REQUIRE_KNOWN_ENV))
    except ConfigError:
        return False


def version_case(
    version: str | None = None,
    table: Mapping[str, tuple[HookTarget, ...]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> VersionCase:
    """Which case applies to ``version`` (default: the installed SGLang); imports the target modules."""
    table = KNOWN_TARGETS if table is None else table
    environ = os.environ if environ is None else environ
    version = sglang_version() if version is None else version
    if version is None:
        checks: tuple[TargetCheck, ...] = (TargetCheck("sglang", "*", False, "sglang is not installed"),)
        return VersionCase("absent", None, None, False, "sglang is not installed", checks)
    known = ", ".join(sorted(table, key=_release_key)) or "(none)"
    public = version.split("+", 1)[0]  # a local build of a listed release (e.g. 0.5.23+cu129) is that release
    if public in table:
        checks = tuple(_check(t, f"sglang {version}") for t in table[public])
        return VersionCase(
            "known", version, public, True, f"sglang {version} is in the version table", checks, table[public]
        )
    newest = max(table, key=_release_key) if table else None
    if newest is None or _release_key(public) <= _release_key(newest):
        message = f"sglang {version} is not in the version table (known: {known}); no hooks"
        return VersionCase("unsupported", version, None, False, message, (TargetCheck("sglang", "*", False, message),))
    targets = table[newest]
    label = f"sglang {version} (untested; signatures of {newest})"
    checks = tuple(_check(t, label) for t in targets)
    if not all(c.ok for c in checks):
        why = "; ".join(f"{c.path}: {c.reason}" for c in checks if not c.ok)
        message = f"sglang {version} is newer than the version table (known: {known}) and differs from {newest}: {why}; no hooks"
        return VersionCase(
            "newer-mismatch", version, newest, False, message, tuple(_refuse(c, message) for c in checks)
        )
    if _require_known(environ):
        message = (
            f"sglang {version} is newer than the version table (known: {known}) and {REQUIRE_KNOWN_ENV}=1 "
            f"requires a known release; no hooks"
        )
        return VersionCase("newer-refused", version, newest, False, message, tuple(_refuse(c, message) for c in checks))
    message = (
        f"sglang {version} is newer than the tested releases (known: {known}); its hook targets match {newest}'s "
        f"signatures, so they are hooked as {newest} (untested release; set {REQUIRE_KNOWN_ENV}=1 to refuse)"
    )
    return VersionCase("newer", version, newest, True, message, checks, targets)


def _refuse(check: TargetCheck, message: str) -> TargetCheck:
    return TargetCheck(check.path, check.op, False, check.reason if not check.ok else message)


def check_targets(
    version: str | None = None, table: Mapping[str, tuple[HookTarget, ...]] | None = None
) -> tuple[TargetCheck, ...]:
    """Check every target for the installed SGLang (imports the target modules)."""
    return version_case(version, table).checks


def set_active_targets(targets: tuple[HookTarget, ...]) -> None:
    """Record the table entries :func:`register` hooked (the hooks read their host record from here)."""
    _active.clear()
    for target in targets:  # an op's first target carries its host record (a guard hook may follow it)
        _active.setdefault(target.op, target)


def active_target(op: str) -> HookTarget:
    """The table entry of ``op`` registered in this process; the newest release's before registration."""
    target = _active.get(op)
    if target is not None:
        return target
    newest = max(KNOWN_TARGETS, key=_release_key)
    return next(t for t in KNOWN_TARGETS[newest] if t.op == op)
