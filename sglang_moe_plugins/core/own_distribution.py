"""Which installed distribution is this package's own, proved by file location, and the installed entry
points of a group with that distribution never hidden by another of its name.

A dist-info's ``Name`` is no evidence (anyone can write one, or none); where it sits is: a wheel install
puts it next to the package directory and lists the package's files in RECORD, an editable install puts
it in a site directory (or one added with ``site.addsitedir``, where its ``.pth`` hook is seen to have run)
with the ``.pth`` hook it installed and names the source tree in ``direct_url.json``. Checked once per distribution and process, reading only the candidate's RECORD
and ``direct_url.json``.
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

try:  # Python 3.12+ has the selectable entry_points API in the stdlib.
    from importlib.metadata import distributions
except ImportError:  # pragma: no cover
    from importlib_metadata import distributions  # type: ignore[no-redef]

__all__ = ["BUILTIN_MODULE_PREFIX", "package_dir", "meta_dir", "is_own_distribution", "installed_entry_points"]

#: A built-in entry point names a module of this package.
BUILTIN_MODULE_PREFIX = "sglang_moe_plugins."
_PASS_THROUGH = (KeyboardInterrupt, GeneratorExit)
_OWN: dict[str, bool] = {}  # dist-info directory -> proved; filled once per distribution and process


def package_dir() -> Path:
    """The directory this package was imported from."""
    return Path(__file__).resolve().parents[1]


def meta_dir(dist: Any) -> Path | None:
    """``dist``'s metadata directory (dist-info or egg-info), resolved; None for other kinds."""
    path = getattr(dist, "_path", None)  # PathDistribution
    return Path(path).resolve() if path is not None else None


def _site_dirs() -> set[Path]:
    """The directories whose ``.pth`` files Python processes at start-up (not ``PYTHONPATH`` entries)."""
    dirs = list(getattr(site, "getsitepackages", list)())
    if getattr(site, "ENABLE_USER_SITE", False):
        dirs.append(site.getusersitepackages())
    return {Path(d).resolve() for d in dirs}


def _proves_own(dist: Any, meta: Path) -> bool:
    import json
    from urllib.parse import unquote, urlparse

    package = package_dir()
    files = [str(f).replace("\\", "/") for f in (dist.files or ())]
    if meta.parent == package.parent:  # installed next to the package (a wheel; egg-info in a checkout)
        return f"{package.name}/__init__.py" in files
    # An editable install: its dist-info in a site directory, with the .pth hook it installed there, and
    # direct_url.json naming the tree the package was imported from.
    direct = json.loads(dist.read_text("direct_url.json") or "null")
    if not isinstance(direct, dict) or not (direct.get("dir_info") or {}).get("editable"):
        return False
    url = urlparse(str(direct.get("url", "")))
    if url.scheme != "file" or not package.is_relative_to(Path(unquote(url.path)).resolve()):
        return False
    hooks = [f for f in files if f.endswith(".pth") and "/" not in f and (meta.parent / f).is_file()]
    return bool(hooks) and (meta.parent in _site_dirs() or _hook_took_effect(meta.parent, hooks, package))


def _hook_took_effect(where: Path, hooks: list[str], package: Path) -> bool:
    """Whether one of the ``.pth`` hooks in ``where`` ran in this process: ``where`` was added as a site directory
    by other means than :func:`site.getsitepackages` (``site.addsitedir`` from another ``.pth``, as a venv layered
    over another one does). Evidence: the editable finder module that hook imports is loaded from ``where``, or a
    path line of the hook that names the package's parent directory is on ``sys.path``."""
    import sys

    for name, module in list(sys.modules.items()):
        if (
            name.startswith("__editable__")
            and Path(str(getattr(module, "__file__", "") or "")).resolve().parent == where
        ):
            return True
    entries = {str(Path(p).resolve()) for p in sys.path if p}
    for hook in hooks:
        try:
            lines = (where / hook).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", "import ")) and (where / line).resolve() == package.parent:
                if str(package.parent) in entries:
                    return True
    return False


def is_own_distribution(dist: Any) -> bool:
    """Whether ``dist`` is the distribution this package was imported from: its metadata next to this
    package's directory, listing its ``__init__.py`` (a wheel install; egg-info in a checkout on
    ``sys.path``), or an editable install whose dist-info sits in a site directory with the ``.pth`` hook
    it installed and whose ``direct_url.json`` names the tree this package was imported from. Never
    raises: unreadable metadata proves nothing."""
    try:
        meta = meta_dir(dist)
        if meta is None:
            return False
        key = str(meta)
        if key not in _OWN:
            _OWN[key] = _proves_own(dist, meta)
        return _OWN[key]
    except _PASS_THROUGH:
        raise
    except BaseException:  # noqa: BLE001
        return False


def _dist_key(dist: Any) -> str:
    """importlib.metadata's key for "the same distribution" (the dist-info directory's name)."""
    try:
        return str(dist._normalized_name)
    except _PASS_THROUGH:
        raise
    except BaseException:  # noqa: BLE001
        return str(getattr(dist, "_path", id(dist)))


def _label(dist: Any) -> str:
    try:
        return " ".join(str(x) for x in (dist.metadata["Name"], dist.version) if x) or "no name"
    except _PASS_THROUGH:
        raise
    except BaseException:  # noqa: BLE001
        return "unreadable metadata"


def installed_entry_points(group: str) -> tuple[list[Any], list[tuple[str, str]], list[str]]:
    """The installed entry points of ``group``, ``(distribution, error)`` for each distribution whose
    metadata could not be read (one broken dist-info does not hide the others), and one notice per
    ignored distribution.

    As ``importlib.metadata.entry_points`` does, the first distribution found on ``sys.path`` hides later
    ones of the same name, except that this package's own distribution (:func:`is_own_distribution`) is
    never hidden: another dist-info of its name found earlier is ignored, with a notice."""
    found: list[tuple[str, Any, list[Any]]] = []
    broken: list[tuple[str, str]] = []
    for dist in distributions():
        try:
            found.append((_dist_key(dist), dist, [ep for ep in dist.entry_points if ep.group == group]))
        except _PASS_THROUGH:
            raise
        except BaseException as exc:  # noqa: BLE001
            broken.append((str(getattr(dist, "_path", "?")), f"{type(exc).__name__}: {exc}"))
    own_keys = {
        key
        for key, dist, eps in found
        if any(str(ep.value).startswith(BUILTIN_MODULE_PREFIX) for ep in eps) and is_own_distribution(dist)
    }
    notices: list[str] = []
    if not own_keys:  # no install of this tree (a second checkout or a worktree on sys.path): the first by name
        for key, dist, eps in found:
            if key == "sglang_moe_plugins" and any(str(ep.value).startswith(BUILTIN_MODULE_PREFIX) for ep in eps):
                meta = meta_dir(dist)
                _OWN[str(meta)] = True
                own_keys.add(key)
                notices.append(
                    f"no installed distribution is the tree sglang_moe_plugins was imported from ({package_dir()}); "
                    f"the built-ins are taken from {meta} ({_label(dist)}), the first of its name on sys.path"
                )
                break
    kept: list[Any] = []
    seen: set[str] = set()
    for key, dist, eps in found:
        if key in seen:
            continue
        if key in own_keys and not is_own_distribution(dist):
            if eps:
                label = _label(dist)
                notices.append(
                    f"distribution metadata at {meta_dir(dist)} ({label}) is not the distribution "
                    f"sglang_moe_plugins was imported from ({package_dir()}); its entry points "
                    f"({', '.join(sorted(ep.name for ep in eps))}) are ignored"
                )
            continue
        seen.add(key)
        kept += eps
    return kept, broken, notices
