"""The pytest plugin costs nothing until asked: loading it imports neither torch nor the package's heavy parts.

Every pytest run of an environment with sglang-moe-plugins loads its ``pytest11`` entry point
(``sglang_moe_plugins.testing.pytest_plugin``); these tests measure that cost in fresh interpreters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "sglang", "triton", "deep_gemm", "sglang_moe_plugins.api", "sglang_moe_plugins.testing.suite")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_loading_the_plugin_imports_nothing_heavy():
    code = textwrap.dedent(
        f"""
        import sys
        import sglang_moe_plugins.testing.pytest_plugin
        import sglang_moe_plugins, sglang_moe_plugins.testing
        dir(sglang_moe_plugins); dir(sglang_moe_plugins.testing)
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", f"imported by loading the pytest plugin: {result.stdout.strip()}"


def test_pytest_plugin_is_registered_and_loaded_in_the_timed_run():
    # The timing below only means something if the timed run really loads the plugin.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--version", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=ROOT,
    )
    if "sglang-moe-plugins" not in result.stdout + result.stderr:
        pytest.skip("the pytest11 entry point is not installed in this environment")
    assert "pytest_plugin.py" in result.stdout + result.stderr


def test_loading_the_plugin_under_pytest_adds_only_its_own_four_modules():
    # Its cost is counted, not timed (a timing bound in a unit test fails on a busy machine; the time
    # itself is measured by benchmarks/pytest_plugin_cost.py). With pytest already imported, as it is
    # when pytest loads its plugins, loading ours must import nothing but the package root, its version
    # and the two testing modules on the way to the plugin.
    code = textwrap.dedent(
        """
        import sys
        import pytest
        before = set(sys.modules)
        import sglang_moe_plugins.testing.pytest_plugin
        print(sorted(set(sys.modules) - before))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    expected = [
        "sglang_moe_plugins",
        "sglang_moe_plugins._version",
        "sglang_moe_plugins.testing",
        "sglang_moe_plugins.testing.pytest_plugin",
    ]
    assert result.stdout.strip() == repr(expected), f"imported by loading the pytest plugin: {result.stdout.strip()}"


def test_package_root_is_lazy_and_complete():
    code = textwrap.dedent(
        """
        import sys
        import sglang_moe_plugins as m
        assert "torch" not in sys.modules
        names = dir(m)
        missing = [n for n in m.__all__ if n not in names]
        assert not missing, missing
        for n in m.__all__:
            getattr(m, n)
        from sglang_moe_plugins import Selector, select, ConfigError
        assert m.Selector is Selector and m.api.select is select
        try:
            m.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise SystemExit("no AttributeError")
        print("OK")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
