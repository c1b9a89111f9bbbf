"""What a measurement ran on: the commit, device, driver and library versions (recorded in every result)."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import subprocess
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["COMMIT_ENV", "source_commit", "run_info", "write_result"]

#: Set it where the source tree has no ``.git`` (e.g. a copied tree): ``SGLANG_MOE_PLUGINS_COMMIT=$(git rev-parse HEAD)``.
COMMIT_ENV = "SGLANG_MOE_PLUGINS_COMMIT"


def source_commit(start: str | os.PathLike[str] | None = None) -> str:
    """The git commit of the source tree (``+dirty`` if it has local changes), or ``$SGLANG_MOE_PLUGINS_COMMIT``,
    or ``"unknown (no .git; set SGLANG_MOE_PLUGINS_COMMIT)"``."""
    given = os.environ.get(COMMIT_ENV, "").strip()
    if given:
        return given
    here = pathlib.Path(start) if start is not None else pathlib.Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode == 0 and commit.stdout.strip():
            dirty = subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return f"unknown (no .git; set {COMMIT_ENV})"


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def run_info() -> dict[str, Any]:
    """Commit, device, driver and versions (``None`` for what is absent)."""
    import torch

    from .._version import __version__

    device = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        device = f"{props.name} (sm{props.major}{props.minor})"
    return {
        "commit": source_commit(),
        "sglang_moe_plugins": __version__,
        "device": device,
        "driver": _driver() if device else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "sglang": _version("sglang"),
        "sgl_deep_gemm": _version("sgl-deep-gemm"),
    }


def write_result(
    out: str | os.PathLike[str], stem: str, results: list, *, device_name: str | None = None, **extra: Any
) -> pathlib.Path:
    """Write ``<stem>_<date>_<device>.json`` into ``out``: the device, the UTC date, :func:`run_info`, the torch and
    Triton versions, ``extra`` (e.g. ``copy_TBps``) and ``results``; returns its path. ``device_name`` defaults to
    the current CUDA device's name."""
    import torch

    taken = {"device", "date", "run", "torch", "triton", "results"} & set(extra)
    if taken:
        raise ValueError(
            f"write_result: extra keys {sorted(taken)} would replace the provenance; allowed: any other key"
        )
    if device_name is None:
        device_name = torch.cuda.get_device_properties(torch.cuda.current_device()).name
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    payload = {
        "device": device_name,
        "date": date,
        "run": run_info(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        **extra,
        "results": results,
    }
    path = pathlib.Path(out) / f"{stem}_{date}_{device_name.replace(' ', '-')}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path
