"""Importing the package (and every module in it) does nothing: no env change, no CUDA, no sglang.

Every module under ``sglang_moe_plugins`` is found by walking the package on disk and imported without
any ``except``: a module that fails to import, or that was renamed, fails the test. The only modules not
imported are listed in :data:`SKIPPED`, each with its reason. The same check runs against injected
faults (a temporary package whose modules misbehave) and must fail there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = "sglang_moe_plugins"
ROOT = Path(__file__).resolve().parent.parent

#: Modules not imported by the check, and why (each must exist: a stale entry fails the test).
SKIPPED: dict[str, str] = {
    f"{PACKAGE}.cli.__main__": "the command-line entry point: importing it runs the CLI and exits",
    f"{PACKAGE}.plugins.triton_smq.kernel": "the @triton.jit kernels: imports Triton (a GPU-only dependency) at "
    "its top level by design; the plugin imports it on first use",
    f"{PACKAGE}.plugins.triton_smq.launch": "imports .kernel (Triton) at its top level by design; the plugin "
    "imports it on first prepare/run",
    f"{PACKAGE}.plugins.contig.triton_kernel": "the contig @triton.jit kernel: imports Triton at its top level by "
    "design; contig_triton imports it on first use",
    f"{PACKAGE}.plugins.contig.triton_launch": "imports .triton_kernel (Triton) at its top level by design; the "
    "contig_triton plugin imports it on first prepare/run",
}

HEAVY = ("sglang", "deep_gemm", "triton")

# Runs in a fresh interpreter: argv[1] = package, argv[2] = JSON list of skipped modules.
_CHECK = textwrap.dedent(
    """
    import importlib, json, os, pkgutil, sys
    before = dict(os.environ)
    import torch
    package, skipped = sys.argv[1], set(json.loads(sys.argv[2]))
    root = importlib.import_module(package)

    def fail_walk(name):
        raise ImportError(f"walking {package}: {name} does not import") from sys.exc_info()[1]

    names = [m.name for m in pkgutil.walk_packages(root.__path__, package + ".", onerror=fail_walk)]
    stale = sorted(skipped - set(names))
    assert not stale, f"skipped modules that do not exist: {stale}"
    imported = [package]
    for name in names:
        if name not in skipped:
            importlib.import_module(name)
            imported.append(name)
    changed = {k: (before.get(k), os.environ.get(k)) for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
    assert not changed, f"environment changed: {sorted(changed)}"
    assert not torch.cuda.is_initialized(), "CUDA initialised"
    heavy = [m for m in HEAVY if m in sys.modules]
    assert not heavy, f"imported at import time: {heavy}"
    api = sys.modules.get("sglang_moe_plugins.api")
    assert api is None or api._selector is None, "plugins discovered at import time"
    print("IMPORTED " + json.dumps(imported))
    print("CLEAN")
    """
).replace("HEAVY", repr(HEAVY))


def check_imports_clean(package: str, skipped: dict[str, str], extra_path: Path | None = None) -> list[str]:
    """Import every module of ``package`` (but ``skipped``) in a fresh interpreter; AssertionError, with the
    child's traceback, unless that changed no environment variable, initialised no CUDA, imported none of
    :data:`HEAVY` and discovered no plugins. Returns the modules imported."""
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(extra_path), env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-c", _CHECK, package, json.dumps(sorted(skipped))],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0 and "CLEAN" in result.stdout, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("IMPORTED "))
    return json.loads(line[len("IMPORTED ") :])


def modules_on_disk(package_dir: Path, package: str) -> set[str]:
    """Every module a package directory holds, from its files alone (nothing imported)."""
    found = set()
    for path in package_dir.rglob("*.py"):
        parts = path.relative_to(package_dir).with_suffix("").parts
        if "__pycache__" in parts or not all(
            (package_dir.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(len(parts))
        ):
            continue
        found.add(".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts)))
    return found


def test_import_has_no_side_effects() -> None:
    imported = check_imports_clean(PACKAGE, SKIPPED)
    # the walk saw every module on disk: nothing is left out but the listed ones
    assert set(imported) == modules_on_disk(ROOT / PACKAGE, PACKAGE) - set(SKIPPED)
    assert len(imported) > 50


def _fault_package(tmp_path: Path, body: str) -> Path:
    pkg = tmp_path / "faultpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "clean.py").write_text("import os\nVALUE = os.environ.get('HOME')\n")
    (pkg / "sub" / "faulty.py").write_text(body)
    return tmp_path


@pytest.mark.parametrize(
    ("body", "skipped", "message"),
    [
        ("import os\nos.environ['SGLANG_MOE_PLUGINS_INJECTED'] = '1'\n", {}, "environment changed"),
        ("import os\nos.environ.pop('PATH')\n", {}, "environment changed"),
        ("import triton\n", {}, "imported at import time: ['triton']"),
        # what the old check swallowed: a module of the package that is gone
        ("from faultpkg import renamed_away\n", {}, "cannot import name 'renamed_away'"),
        ("import faultpkg.gone\n", {}, "No module named 'faultpkg.gone'"),
        ("", {"faultpkg.triton": "stale"}, "skipped modules that do not exist: ['faultpkg.triton']"),
    ],
    ids=["env-set", "env-removed", "heavy-import", "missing-name", "missing-module", "stale-skip"],
)
def test_the_check_fails_on_an_injected_fault(tmp_path: Path, body: str, skipped: dict[str, str], message: str) -> None:
    root = _fault_package(tmp_path, body)
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_imports_clean("faultpkg", skipped, extra_path=root)


def test_the_check_passes_on_the_clean_fault_package(tmp_path: Path) -> None:
    """The companion tests fail because of the fault alone: without it the same package passes."""
    root = _fault_package(tmp_path, "X = 1\n")
    assert sorted(check_imports_clean("faultpkg", {}, extra_path=root)) == [
        "faultpkg",
        "faultpkg.clean",
        "faultpkg.sub",
        "faultpkg.sub.faulty",
    ]
    assert modules_on_disk(root / "faultpkg", "faultpkg") == {
        "faultpkg",
        "faultpkg.clean",
        "faultpkg.sub",
        "faultpkg.sub.faulty",
    }


def test_public_api_is_curated() -> None:
    import sglang_moe_plugins

    assert sorted(sglang_moe_plugins.__all__) == sorted(set(sglang_moe_plugins.__all__))
    for name in sglang_moe_plugins.__all__:
        assert hasattr(sglang_moe_plugins, name), name


def test_core_modules_log_through_the_rank_filter() -> None:
    import importlib

    from sglang_moe_plugins.log import RANK_FILTER

    for name in ("registry", "dispatcher"):
        module = importlib.import_module(f"sglang_moe_plugins.core.{name}")
        assert module.logger.name == f"sglang_moe_plugins.core.{name}"
        assert RANK_FILTER in module.logger.filters, name
