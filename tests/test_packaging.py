"""The distribution's metadata: built as a user's `python -m build` builds it, and read back from the wheel."""

from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("build", reason="the test extra's `build` is not installed")
    pytest.importorskip("setuptools", reason="setuptools (>=77, pyproject's build backend) is not installed")
    src = tmp_path_factory.mktemp("src")
    for name in (
        "pyproject.toml",
        "README.md",
        "README.pypi.md",
        "LICENSE",
        "MANIFEST.in",
        "CHANGELOG.md",
        "CONTRIBUTING.md",
    ):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "sglang_moe_plugins", src / "sglang_moe_plugins", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the backend comes from this environment (no download), as in CI.
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (path,) = out.glob("*.whl")
    return path


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_string(zf.read(name).decode())


def test_license_is_in_the_wheel(wheel):
    with zipfile.ZipFile(wheel) as zf:
        licenses = [n for n in zf.namelist() if re.search(r"\.dist-info/licenses/LICENSE$", n)]
        assert licenses, zf.namelist()
        text = zf.read(licenses[0]).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    meta = _metadata(wheel)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]


def test_index_page_renders_on_its_own(wheel):
    meta = _metadata(wheel)
    assert meta["Description-Content-Type"].startswith("text/markdown")
    body = meta.get_payload()
    assert "pip install sglang-moe-plugins" in body and "AssertionError: DSV4 JIT activation requires" in body
    relative = [link for link in re.findall(r"\]\(([^)]+)\)", body) if not re.match(r"https?://", link)]
    assert not relative, f"relative links do not resolve on the package index: {relative}"
    assert "./dev.sh" not in body


def test_classifiers_and_extras(wheel):
    meta = _metadata(wheel)
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers and "Framework :: Pytest" in classifiers
    requires = meta.get_all("Requires-Dist")
    deep_gemm = [r for r in requires if r.startswith("sgl-deep-gemm")]
    # docs/deep-gemm-releases.md: 0.1.4.post1 (SGLang 0.5.16's pin) to 0.2.5
    assert deep_gemm and "<=0.2.5" in deep_gemm[0] and ">=0.1.4.post1" in deep_gemm[0], deep_gemm
    assert any(r.startswith(("sglang<0.6,>=0.5.16", "sglang>=0.5.16,<0.6")) for r in requires), requires
    twine = shutil.which("twine")
    if twine:
        result = subprocess.run([twine, "check", "--strict", str(wheel)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr


def test_index_page_is_generated_from_the_readme():
    """README.pypi.md is README.md for the index (tests/readme_for_index.py): one text, never two drifting."""
    from readme_for_index import render

    assert (ROOT / "README.pypi.md").read_text() == render((ROOT / "README.md").read_text()), (
        "README.pypi.md is stale: run `python tests/readme_for_index.py`"
    )
