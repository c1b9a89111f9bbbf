"""Issue #30, findings 1-3: plugin discovery.

1. An ``allow`` entry identifies a distribution: ``dist-name:entry-point``; a bare name that two
   distributions declare imports neither (one ERROR naming both), so the unnamed distribution's
   import-time code never runs, under strict too.
2. Built-ins are the entry points of the distribution the package was imported from, proved by file
   location; a dist-info that says ``Name: sglang-moe-plugins`` (or has no Name) is a third party.
3. ``check NAME`` resolves names exactly as the runtime does (allow, disable, reserved names) and says
   which distribution it checked; ``check dist-name:entry-point`` works too.

Fake distributions (tests/rt2_disc_fakes.py) are written into temporary site directories and found by
``importlib.metadata``: in this process, through SGLang's real ``load_plugins()`` (tests/sglang_probe.py)
and through the CLI as a user runs it.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
from rt2_disc_fakes import EVIL, GOOD, IMPOSTOR_REFERENCE, FakeDist, claims_builtin, markers, write_dist

import sglang_moe_plugins
from sglang_moe_plugins import PluginValidationError, Registry
from sglang_moe_plugins.config import load_config
from sglang_moe_plugins.core.registry import BUILTIN_PLUGINS

TESTS = pathlib.Path(__file__).resolve().parent
#: The tree of the package under test: this checkout, or the one PYTHONPATH puts first (tests/run_against_revision.py).
ROOT = pathlib.Path(sglang_moe_plugins.__file__).resolve().parents[1]
SMQ_TARGET = "sglang.srt.layers.moe.moe_runner.deep_gemm._varlen_deep_gemm_silu_mul_quant"
MODULES = ("rt2_disc_good", "rt2_disc_evil", "rt2_disc_impostor")
#: Finding 2's three ways of claiming to be this package: its Name under another directory, no Name at
#: all, and its own dist-info directory name (which importlib.metadata lets shadow the real one).
CLAIMS = {
    "named": claims_builtin("sglang-moe-plugins", "rt2_claims-6.6.6", "rt2_claims_named"),
    "nameless": claims_builtin(None, "rt2_nameless-6.6.6", "rt2_claims_nameless"),
    "same-directory-name": claims_builtin("sglang-moe-plugins", "sglang_moe_plugins-6.6.6", "rt2_claims_shadow"),
}


def _sites(tmp_path: pathlib.Path, *dists: FakeDist) -> list[pathlib.Path]:
    """One site directory per distribution, in the order given (the first is found first)."""
    return [write_dist(tmp_path / f"site{i}", dist) for i, dist in enumerate(dists)]


@pytest.fixture()
def on_path(tmp_path, monkeypatch):
    """Put the given distributions on this process's sys.path, first given first; the marker file."""
    marker = tmp_path / "marker.txt"
    monkeypatch.setenv("MOE_TEST_MARKER", str(marker))
    for module in MODULES:
        sys.modules.pop(module, None)

    def put(*dists: FakeDist) -> pathlib.Path:
        for site in reversed(_sites(tmp_path, *dists)):
            monkeypatch.syspath_prepend(str(site))
        return marker

    yield put
    for module in MODULES:
        sys.modules.pop(module, None)


def _discover(**env: str) -> Registry:
    return Registry.discover(load_config(env))


def _env(tmp_path: pathlib.Path, paths: list[pathlib.Path], **env: str) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    marker = tmp_path / "sub_marker.txt"
    full.update(PYTHONPATH=os.pathsep.join(str(p) for p in [*paths, ROOT]), MOE_TEST_MARKER=str(marker), **env)
    return full


def _probe(tmp_path: pathlib.Path, dists: tuple[FakeDist, ...], **env: str) -> tuple[dict, str, list[str]]:
    """SGLang's real load_plugins() and hooked function, the distributions first on PYTHONPATH."""
    pytest.importorskip("sglang")
    from sglang_probe import run_probe

    sites = _sites(tmp_path / "probe", *dists)
    full = _env(tmp_path, sites, **env)
    result, stderr = run_probe(PYTHONPATH=full["PYTHONPATH"], MOE_TEST_MARKER=full["MOE_TEST_MARKER"], **env)
    return result, stderr, markers(tmp_path / "sub_marker.txt")


def _cli(tmp_path: pathlib.Path, dists: tuple[FakeDist, ...], *args: str, **env: str) -> subprocess.CompletedProcess:
    sites = _sites(tmp_path / "cli", *dists)
    return subprocess.run(
        [sys.executable, "-m", "sglang_moe_plugins.cli", *args],
        capture_output=True,
        text=True,
        env=_env(tmp_path, sites, **env),
        timeout=300,
        cwd=tmp_path,
    )


#: ``check`` options that make a run short: the first supports() call past the first fails at once.
QUICK = ("--no-catalog", "--cases", "1", "--no-progress", "--supports-limit-ms", "0.000001")


# -- finding 1: a name collision does not get past allow ----------------------------------------------
def test_f1_a_bare_allowed_name_that_two_distributions_declare_imports_neither(on_path, caplog):
    marker = on_path(EVIL, GOOD)
    with caplog.at_level(logging.WARNING, logger="sglang_moe_plugins"):
        registry = _discover(SGLANG_MOE_PLUGINS_ALLOW="rt2_good")
    assert "rt2_good" not in registry.names()
    assert markers(marker) == []  # neither module was imported
    refused = [r for r in caplog.records if "'rt2_good'" in r.getMessage() and "declared by" in r.getMessage()]
    assert refused and all(r.levelno == logging.ERROR for r in refused), [r.getMessage() for r in caplog.records]
    assert all(EVIL.label in r.getMessage() and GOOD.label in r.getMessage() for r in refused)
    assert "rt2-good:rt2_good" in refused[0].getMessage()  # says how to name the one meant
    with pytest.raises(PluginValidationError, match="declared by 2 distributions"):
        _discover(SGLANG_MOE_PLUGINS_ALLOW="rt2_good", SGLANG_MOE_PLUGINS_STRICT="1")
    assert markers(marker) == []


def test_f1_dist_qualified_allow_loads_that_distribution_only(on_path, caplog):
    marker = on_path(EVIL, GOOD)
    with caplog.at_level(logging.WARNING, logger="sglang_moe_plugins"):
        registry = _discover(SGLANG_MOE_PLUGINS_ALLOW="rt2-good:rt2_good", SGLANG_MOE_PLUGINS_STRICT="1")
    record = registry.get("rt2_good")
    assert (record.distribution, record.version, record.builtin) == ("rt2-good", "1.0", False)
    assert markers(marker) == ["imported rt2_disc_good"]
    (evil,) = [n for n in registry.not_loaded if n.distribution == EVIL.name]
    assert evil.reason == "not in allow (SGLANG_MOE_PLUGINS_ALLOW: rt2-good:rt2_good)"
    assert not [r for r in caplog.records if "not installed here" in r.getMessage()]
    # The distribution part is matched as pip matches names: rt2_good, RT2.Good are rt2-good.
    assert _discover(SGLANG_MOE_PLUGINS_ALLOW="RT2_Good:rt2_good").get("rt2_good").distribution == "rt2-good"


@pytest.mark.sglang
def test_f1_sglang_the_unnamed_distribution_import_time_code_never_runs(tmp_path):
    """Through SGLang's load_plugins(): under strict, a bare allowed name that two distributions declare
    fails closed without importing either; ``dist:name`` serves the call with the named one."""
    result, stderr, marks = _probe(
        tmp_path, (EVIL, GOOD), SGLANG_MOE_PLUGINS_ALLOW="rt2_good", SGLANG_MOE_PLUGINS_STRICT="1"
    )
    assert SMQ_TARGET in result["patched"], stderr[-3000:]
    assert all("declared by 2 distributions" in c for c in result["calls"]), result["calls"]
    assert marks == [], marks
    line = next(x for x in stderr.splitlines() if "declared by 2 distributions" in x)
    assert "ERROR" in line and EVIL.label in line and GOOD.label in line

    result, stderr, marks = _probe(
        tmp_path / "2", (EVIL, GOOD), SGLANG_MOE_PLUGINS_ALLOW="rt2-good:rt2_good", SGLANG_MOE_PLUGINS_STRICT="1"
    )
    assert result["calls"] == ["ok", "ok"], stderr[-3000:]
    assert "imported rt2_disc_evil" not in marks and "ran rt2_good from rt2_disc_good" in marks, marks


# -- finding 2: built-ins are proved by file location, not by a name ------------------------------------
@pytest.mark.parametrize("kind", sorted(CLAIMS))
def test_f2_a_distribution_claiming_to_be_this_package_is_a_third_party(on_path, kind):
    claim = CLAIMS[kind]
    (ep_name,) = claim.entry_points
    on_path(claim)
    # Not in allow: not imported, so under strict nothing fails.
    registry = _discover(SGLANG_MOE_PLUGINS_ALLOW="", SGLANG_MOE_PLUGINS_STRICT="1")
    assert ep_name not in registry.names() and not registry.problems
    for name in ("reference", "jit_ep", "mega_reference", "contig_reference"):
        record = registry.get(name)
        assert record.builtin and (record.distribution, record.version) == ("sglang-moe-plugins", "0.3.0"), record
    if kind != "same-directory-name":  # that one never shadows the real distribution: it is ignored
        assert ep_name in {n.entry_point for n in registry.not_loaded}
        # disable stops it too, without allow
        registry = _discover(SGLANG_MOE_PLUGINS_DISABLE=ep_name, SGLANG_MOE_PLUGINS_STRICT="1")
        assert not registry.problems
        # and without either it is a third party that cannot be imported (not a built-in failing every call)
        problem = next(p for p in _discover().problems if p.entry_point == ep_name)
        assert "No module named 'sglang_moe_plugins.rt2_disc_no_such_module'" in problem.error


def test_f2_an_impostor_cannot_take_a_builtin_name(on_path, caplog):
    real = "sglang_moe_plugins.plugins.reference.silu_mul_quant:ReferencePlugin"
    on_path(claims_builtin("sglang-moe-plugins", "rt2_claims-6.6.6", "rt2_x", {"reference": real}))
    with caplog.at_level(logging.WARNING, logger="sglang_moe_plugins"):
        registry = _discover()
    assert registry.get("reference").version == "0.3.0" and registry.get("reference").builtin
    refused = next(p for p in registry.problems if p.entry_point == "reference")
    assert refused.level == "ERROR" and refused.version == "6.6.6" and "built-in names are reserved" in refused.error


@pytest.mark.sglang
def test_f2_sglang_strict_serves_calls_with_impostors_on_the_path(tmp_path):
    """Before: each impostor was a built-in that bypassed allow, failed to import and, under strict,
    failed every call. (The same-directory-name impostor is left out: it shadows this package's
    ``sglang.srt.plugins`` entry point in SGLang's own discovery, which is SGLang's.)"""
    result, stderr, _ = _probe(
        tmp_path, (CLAIMS["named"], CLAIMS["nameless"]), SGLANG_MOE_PLUGINS_ALLOW="", SGLANG_MOE_PLUGINS_STRICT="1"
    )
    assert SMQ_TARGET in result["patched"] and result["calls"] == ["ok", "ok"], stderr[-3000:]


_BUILTINS_PROBE = """
    import json, sglang_moe_plugins
    from sglang_moe_plugins import Registry
    r = Registry.discover()
    print("RESULT " + json.dumps({"file": sglang_moe_plugins.__file__, "problems": [p.describe() for p in r.problems],
        "builtins": {x.name: [x.builtin, x.distribution, x.version] for x in r.records()}}))
"""


def _builtins_in(cwd: pathlib.Path, pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_") and k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_BUILTINS_PROBE)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[len("RESULT ") :])


def _assert_all_builtin(found: dict, version: str = "0.3.0") -> None:
    builtins = {n: v for n, v in found["builtins"].items() if n in BUILTIN_PLUGINS}
    assert set(builtins) == set(BUILTIN_PLUGINS), found
    assert all(v == [True, "sglang-moe-plugins", version] for v in builtins.values()), builtins


@pytest.mark.parametrize("how", ["editable install only", "checkout on sys.path"])
def test_f2_the_editable_install_of_this_checkout_has_its_builtins(tmp_path, how):
    found = _builtins_in(tmp_path, None if how == "editable install only" else str(ROOT))
    assert found["file"] == str(ROOT / "sglang_moe_plugins" / "__init__.py")
    _assert_all_builtin(found)


def test_f2_a_wheel_install_has_its_builtins(tmp_path):
    """A real wheel, built from a copy of the checkout and installed with pip into a target directory
    that comes first on sys.path: the built-ins are its entry points (the editable install's dist-info,
    which points at the checkout, is not where the package was imported from)."""
    pytest.importorskip("build", reason="the test extra's `build` is not installed")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "README.pypi.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "sglang_moe_plugins", src / "sglang_moe_plugins", ignore=shutil.ignore_patterns("__pycache__")
    )
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(tmp_path / "dist"), str(src)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    target = tmp_path / "target"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = _builtins_in(tmp_path, str(target))
    assert found["file"] == str(target / "sglang_moe_plugins" / "__init__.py")
    _assert_all_builtin(found)
    assert not found["problems"], found["problems"]


# -- finding 3: check resolves names as the runtime does ----------------------------------------------
def test_f3_check_reference_checks_the_builtin_not_an_impostor(tmp_path):
    done = _cli(tmp_path, (IMPOSTOR_REFERENCE,), "check", "reference", *QUICK)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert "ReferencePlugin" in first and "from sglang-moe-plugins 0.3.0" in first, first
    assert markers(tmp_path / "sub_marker.txt") == []  # the impostor's module was never imported


def test_f3_check_honours_allow_and_disable(tmp_path):
    bare = _cli(tmp_path / "a", (EVIL, GOOD), "check", "rt2_good", *QUICK, SGLANG_MOE_PLUGINS_ALLOW="rt2_good")
    assert bare.returncode == 2 and "Traceback" not in bare.stderr, bare.stderr[-3000:]
    assert "declared by 2 distributions" in bare.stderr and EVIL.label in bare.stderr and GOOD.label in bare.stderr
    assert markers(tmp_path / "a" / "sub_marker.txt") == []

    evil = _cli(tmp_path / "b", (EVIL, GOOD), "check", "rt2-evil:rt2_good", *QUICK, SGLANG_MOE_PLUGINS_ALLOW="rt2_x")
    assert evil.returncode == 2 and "not in allow (SGLANG_MOE_PLUGINS_ALLOW: rt2_x)" in evil.stderr, evil.stderr
    assert markers(tmp_path / "b" / "sub_marker.txt") == []

    off = _cli(tmp_path / "c", (GOOD,), "check", "rt2_good", *QUICK, SGLANG_MOE_PLUGINS_DISABLE="rt2_good")
    assert off.returncode == 2 and "disabled by SGLANG_MOE_PLUGINS_DISABLE" in off.stderr, off.stderr
    assert markers(tmp_path / "c" / "sub_marker.txt") == []


@pytest.mark.parametrize("target", ["rt2_good", "rt2-good:rt2_good"])
def test_f3_check_names_the_distribution_it_checked(tmp_path, target):
    done = _cli(tmp_path, (EVIL, GOOD), "check", target, *QUICK, SGLANG_MOE_PLUGINS_ALLOW="rt2-good:rt2_good")
    assert done.returncode in (0, 1), done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert "rt2_disc_good.GoodPlugin" in first and f"from {GOOD.label}" in first, first
    # only the named distribution's module was imported (the kit also runs its plugin: "ran ..." lines)
    seen = markers(tmp_path / "sub_marker.txt")
    assert [m for m in seen if not m.startswith("ran ")] == ["imported rt2_disc_good"], seen
    assert set(seen) <= {"imported rt2_disc_good", "ran rt2_good from rt2_disc_good"}, seen


@pytest.mark.parametrize("release", ["0.5.19", "0.5.20"])
def test_f2_a_venv_layered_over_the_install_keeps_its_builtins(release):
    # dev.sh's older-release environments see .venv's site-packages through `site.addsitedir` in a .pth:
    # the editable install's dist-info sits in a directory that site.getsitepackages() does not list, and
    # its .pth hook has run. The built-ins must still be this package's own.
    python = TESTS.parent / f".venv-sglang-{release}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python.parent.parent.name} is not built (./dev.sh setup)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_MOE_PLUGINS_")}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(python), "-m", "sglang_moe_plugins.cli", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(TESTS.parent.parent),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
    assert set(BUILTIN_PLUGINS) <= set(listed), sorted(set(BUILTIN_PLUGINS) - set(listed))
    assert all(listed[name]["builtin"] for name in BUILTIN_PLUGINS), listed
    assert "reserved" not in proc.stderr, proc.stderr[-3000:]
