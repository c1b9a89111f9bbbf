"""Issue #31 item 8 (``--version``): ``python -m sglang_moe_plugins --version`` (and ``sglang-moe-plugins --version``)
prints the package version, then the installed SGLang release and whether the release table knows it, without
importing torch or SGLang. Run as a user runs it, in a fresh interpreter."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from importlib.metadata import version

import pytest

from sglang_moe_plugins import __version__

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: ``python -m sglang_moe_plugins ARGS``, then the names in ``sys.modules`` written to a file (every module
#: imported, also through ``importlib``).
_RUN = """
import json, runpy, sys
out, sys.argv = sys.argv[1], ["sglang_moe_plugins", *sys.argv[2:]]
try:
    runpy.run_module("sglang_moe_plugins", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as exc:
    code = exc.code
with open(out, "w") as f:
    json.dump(sorted(sys.modules), f)
sys.exit(code)
"""


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")} | extra


def _run(*cmd: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, env=_env(**env), timeout=300, cwd=ROOT)


def test_module_version_names_package_and_known_sglang_without_torch(tmp_path) -> None:
    result = _run(sys.executable, "-m", "sglang_moe_plugins", "--version")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"sglang-moe-plugins {__version__}", result.stdout
    assert lines[1].startswith(f"sglang {version('sglang')}: a known release"), result.stdout
    assert "0.5.16" in lines[1] and "0.5.23" in lines[1], result.stdout  # the table's range
    # The same command, recording what it imported: neither torch nor SGLang (only SGLang's metadata is read).
    out = tmp_path / "modules.json"
    traced = _run(sys.executable, "-c", _RUN, str(out), "--version")
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == result.stdout
    modules = set(json.loads(out.read_text()))
    heavy = sorted(m for m in modules if m.split(".")[0] in {"torch", "sglang", "triton", "numpy"})
    assert not heavy, f"--version imported {heavy[:10]}"


def test_console_script_version() -> None:
    script = pathlib.Path(sys.executable).parent / "sglang-moe-plugins"
    if not script.exists():
        pytest.skip(f"{script} is not installed (pip install -e . installs it)")
    result = _run(str(script), "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"sglang-moe-plugins {__version__}", result.stdout


def _fake_sglang(tmp_path: pathlib.Path, release: str) -> str:
    """A directory that, first on ``PYTHONPATH``, makes ``importlib.metadata`` report sglang ``release``."""
    info = tmp_path / f"sglang-{release.replace('+', '_')}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {release}\n")
    return str(tmp_path)


@pytest.mark.parametrize(
    "release, expected",
    [
        ("0.5.23+cu129", "sglang 0.5.23+cu129: a known release"),  # a local build of a listed release
        ("0.5.19", "sglang 0.5.19: a known release"),
        ("0.6.0", "sglang 0.6.0: not a release of the table"),
        ("0.5.15.post1", "sglang 0.5.15.post1: not a release of the table"),
    ],
)
def test_version_classifies_the_installed_release(tmp_path, release: str, expected: str) -> None:
    result = _run(sys.executable, "-m", "sglang_moe_plugins", "--version", PYTHONPATH=_fake_sglang(tmp_path, release))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"sglang-moe-plugins {__version__}"
    assert lines[1].startswith(expected), result.stdout
    if "not a release" in expected:
        assert "sglang-moe-plugins doctor" in lines[1], result.stdout  # where to see whether it is hooked


def test_version_on_the_older_release_environments() -> None:
    """Each ``.venv-sglang-<release>`` that ``./dev.sh setup`` built reports its own release as known."""
    venvs = sorted(ROOT.glob(".venv-sglang-*/bin/python"))
    if not venvs:
        pytest.skip("no .venv-sglang-<release> here (./dev.sh setup builds them)")
    for python in venvs:
        release = python.parents[1].name.removeprefix(".venv-sglang-")
        result = _run(str(python), "-m", "sglang_moe_plugins", "--version")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[1].startswith(f"sglang {release}: a known release"), result.stdout
