"""Issue 18, findings 3 to 6: start-up never dies from one plugin, ``allow``, entry points that are not
allowed or disabled are never imported, reserved built-in names, a third party outranking the built-ins.

Fake distributions (tests/startup_fakes.py) are written into a temporary site directory with a
``.dist-info`` each and found by ``importlib.metadata``: in this process (the registry, ``sys.path``
prepended) and in subprocesses, through SGLang's real ``load_plugins()`` and its hooked function
(tests/sglang_probe.py) and through the real CLI.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest
from startup_fakes import EVIL_DIST, MODULES, STALE_DIST, markers, write_site

from sglang_moe_plugins import ConfigError, PluginValidationError, Registry, UserConfig
from sglang_moe_plugins.config import load_config, parse_config
from sglang_moe_plugins.core.registry import BUILTIN_PLUGINS, ENTRY_POINT_GROUP
from sglang_moe_plugins.plugins.reference import ReferencePlugin

TESTS = pathlib.Path(__file__).resolve().parent
EVIL = f"{EVIL_DIST[0]} {EVIL_DIST[1]}"
SMQ_TARGET = "sglang.srt.layers.moe.moe_runner.deep_gemm._varlen_deep_gemm_silu_mul_quant"


@pytest.fixture()
def site(tmp_path, monkeypatch):
    """Both fake distributions on this process's sys.path; the marker file in MOE_TEST_MARKER."""
    path = write_site(tmp_path / "site", evil=True, stale=True)
    monkeypatch.syspath_prepend(str(path))
    marker = tmp_path / "marker.txt"
    monkeypatch.setenv("MOE_TEST_MARKER", str(marker))
    for module in MODULES:
        sys.modules.pop(module, None)
    yield marker
    for module in MODULES:
        sys.modules.pop(module, None)


def _discover(**config) -> Registry:
    return Registry.discover(parse_config(config) if config else UserConfig())


def test_builtin_names_are_the_pyproject_entry_points():
    table = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    assert set(BUILTIN_PLUGINS) == set(table)


# -- finding 3: one plugin never takes start-up down --------------------------------------------------
def test_each_broken_plugin_is_skipped_with_one_line_naming_its_distribution(site, caplog):
    with caplog.at_level(logging.WARNING, logger="sglang_moe_plugins"):
        registry = _discover()
    problems = {p.entry_point: p for p in registry.problems}
    assert problems["evil_op_raises"].error == "RuntimeError: op lookup exploded"
    assert problems["evil_sysexit"].error == "SystemExit: 3"
    assert problems["stale_kernels"].error.startswith("ModuleNotFoundError: No module named 'stale_kernels_removed'")
    assert problems["stale_kernels"].distribution == STALE_DIST[0]
    for name in ("evil_op_raises", "evil_sysexit"):
        assert problems[name].distribution == EVIL_DIST[0]
        lines = [r.getMessage() for r in caplog.records if f"'{name}'" in r.getMessage()]
        assert len(lines) == 1 and f"from {EVIL_DIST[0]}" in lines[0], lines
    # The rest keeps working: the built-ins and the well-formed third-party plugin are registered.
    assert {"reference", "jit_ep", "evil_top"} <= set(registry.names())


def test_entry_point_name_must_equal_the_plugin_name(site):
    problem = next(p for p in _discover().problems if p.entry_point == "evil_misnamed")
    assert "the plugin it loads is named 'evil_other_name', not 'evil_misnamed'" in problem.error
    assert "evil_other_name" not in _discover().names()


# -- finding 4: a stale entry point can be disabled by its name, which stops the strict failure ---------
def test_disabling_a_stale_entry_point_stops_the_strict_failure(site):
    with pytest.raises(PluginValidationError, match="stale_kernels"):
        _discover(strict=True, allow=["evil_top", "stale_kernels"])
    registry = _discover(strict=True, allow=["evil_top", "stale_kernels"], disable=["stale_kernels"])
    (entry,) = [n for n in registry.not_loaded if n.entry_point == "stale_kernels"]
    assert (
        entry.reason == "disabled by 'disable'"
        and entry.distribution == STALE_DIST[0]
        and entry.version == STALE_DIST[1]
    )
    assert not registry.problems


# -- finding 5: allow, and entry points that are not allowed or disabled are never imported -------------
def test_allow_and_disable_keep_modules_from_being_imported(site):
    registry = Registry.discover(load_config({"SGLANG_MOE_PLUGINS_ALLOW": "evil_top"}))
    assert "evil_top" in registry.names() and "reference" in registry.names()  # built-ins are always allowed
    reasons = {n.entry_point: n.reason for n in registry.not_loaded}
    assert reasons["evil_op_raises"] == "not in allow (SGLANG_MOE_PLUGINS_ALLOW: evil_top)"
    assert reasons["stale_kernels"] == reasons["evil_sysexit"] == reasons["evil_op_raises"]
    assert not registry.problems  # the broken ones were never imported
    imported = {line for line in markers(site) if line.startswith("imported ")}
    assert imported == {"imported evil_top"}, imported

    registry = Registry.discover(
        load_config({"SGLANG_MOE_PLUGINS_DISABLE": "evil_top", "SGLANG_MOE_PLUGINS_ALLOW": ""})
    )
    assert "evil_top" not in registry.names()
    assert {n.entry_point: n.reason for n in registry.not_loaded}[
        "evil_top"
    ] == "disabled by SGLANG_MOE_PLUGINS_DISABLE"
    assert "example_torch" not in registry.names()  # set and empty: no third party at all


def test_config_entries_of_plugins_that_are_not_loaded(site):
    # priority / options of a plugin that is installed but not loaded are ignored, not errors ...
    registry = _discover(disable=["evil_top"], priority={"evil_top": 5}, options={"evil_top": {"x": 1}}, allow=[])
    assert "evil_top" not in registry.names()
    # ... but force cannot be honoured, and enabling a plugin outside allow contradicts it.
    with pytest.raises(
        ConfigError, match=r"force.silu_mul_quant = 'evil_top', but plugin 'evil_top' is not loaded: not in allow"
    ):
        _discover(allow=[], force={"silu_mul_quant": "evil_top"})
    with pytest.raises(ConfigError, match="enable names plugin 'evil_top', which is not in allow"):
        _discover(allow=[], enable=["evil_top"])


def test_a_third_party_plugin_outranking_the_builtins_is_named_once(site, caplog):
    with caplog.at_level(logging.WARNING, logger="sglang_moe_plugins"):
        registry = _discover(allow=["evil_top"])
    lines = [r.getMessage() for r in caplog.records if "above every built-in plugin" in r.getMessage()]
    assert len(lines) == 1 and f"third-party plugin 'evil_top' ({EVIL}) has priority 1000000000" in lines[0]
    assert "op 'silu_mul_quant' (highest: triton, 110)" in lines[0]
    assert registry.notices == (lines[0].removeprefix("sglang-moe-plugins: "),)


# -- finding 6: a built-in's name can never be taken -------------------------------------------------
@pytest.mark.parametrize("order", ["third party first", "built-in first"])
def test_a_builtin_name_is_never_taken_whatever_the_order(site, order, caplog):
    from importlib.metadata import entry_points

    eps = list(entry_points(group=ENTRY_POINT_GROUP))
    eps.sort(key=lambda e: (e.dist.name != EVIL_DIST[0]) == (order == "third party first"))
    with caplog.at_level(logging.WARNING, logger="sglang_moe_plugins"):
        registry = Registry.discover(UserConfig(), eps)
    assert type(registry.get("reference").plugin) is ReferencePlugin
    assert registry.get("reference").distribution == "sglang-moe-plugins"
    refused = [r for r in caplog.records if "built-in names are reserved" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR
    assert f"from {EVIL_DIST[0]}" in refused[0].getMessage() and "of sglang-moe-plugins" in refused[0].getMessage()
    assert "imported evil_takeover" not in markers(site)  # refused before import


# -- the same through SGLang's real load_plugins() and hooked function --------------------------------
def _sglang_probe(tmp_path, site_kinds: dict, **env):
    pytest.importorskip("sglang")
    from sglang_probe import run_probe

    path = write_site(tmp_path / "sub_site", **site_kinds)
    marker = tmp_path / "sub_marker.txt"
    # The fake distributions come first on sys.path: they are discovered before the built-ins.
    result, stderr = run_probe(
        PYTHONPATH=os.pathsep.join([str(path), str(TESTS.parent)]), MOE_TEST_MARKER=str(marker), **env
    )
    return result, stderr, markers(marker)


@pytest.mark.sglang
def test_sglang_start_up_survives_every_broken_plugin(tmp_path):
    """Findings 3, 5, 6 through SGLang: SystemExit at import and a raising ``op`` skip only their plugin,
    the hooks are installed and calls run; the 'reference' impostor is refused with an ERROR; the plugin
    at priority 10**9 is named at WARNING."""
    result, stderr, marks = _sglang_probe(tmp_path, {"evil": True})
    assert SMQ_TARGET in result["patched"] and result["calls"] == ["ok", "ok"], stderr[-3000:]
    assert "NOT active" not in stderr and "failing closed" not in stderr
    assert "SystemExit: 3" in stderr and "RuntimeError: op lookup exploded" in stderr
    assert "ERROR" in next(line for line in stderr.splitlines() if "built-in names are reserved" in line)
    assert f"third-party plugin 'evil_top' ({EVIL}) has priority 1000000000" in stderr
    assert "ran evil_top" in marks and "ran reference" not in marks and "imported evil_takeover" not in marks


@pytest.mark.sglang
def test_sglang_with_allow_imports_no_third_party_module(tmp_path):
    result, stderr, marks = _sglang_probe(tmp_path, {"evil": True}, SGLANG_MOE_PLUGINS_ALLOW="")
    assert SMQ_TARGET in result["patched"] and result["calls"] == ["ok", "ok"], stderr[-3000:]
    assert marks == [] and "SystemExit" not in stderr


@pytest.mark.sglang
def test_sglang_strict_stale_entry_point_disabled_by_name(tmp_path):
    """Finding 4: under strict the stale entry point fails closed; disabling it by name runs the calls."""
    result, stderr, _ = _sglang_probe(tmp_path, {"evil": False, "stale": True}, SGLANG_MOE_PLUGINS_STRICT="1")
    assert all(c.startswith("PluginValidationError: strict = true and 1 plugin(s)") for c in result["calls"]), result
    result, stderr, _ = _sglang_probe(
        tmp_path / "2",
        {"evil": False, "stale": True},
        SGLANG_MOE_PLUGINS_STRICT="1",
        SGLANG_MOE_PLUGINS_DISABLE="stale_kernels",
    )
    assert result["calls"] == ["ok", "ok"], stderr[-3000:]


# -- the CLI: problems as lines, never a traceback ---------------------------------------------------
def _cli(tmp_path, *args, **env) -> subprocess.CompletedProcess:
    path = write_site(tmp_path / "cli_site", evil=True, stale=True)
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full.update(PYTHONPATH=os.pathsep.join([str(path), str(TESTS.parent)]), **env)
    return subprocess.run(
        [sys.executable, "-m", "sglang_moe_plugins.cli", *args], capture_output=True, text=True, env=full, timeout=300
    )


def test_list_and_doctor_show_broken_plugins_as_lines(tmp_path):
    listed = _cli(tmp_path, "list", SGLANG_MOE_PLUGINS_DISABLE="evil_misnamed")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr + listed.stdout, listed.stderr[-3000:]
    out = listed.stdout
    # The table's columns are as wide as the longest name installed (the example plugin's, where it is).
    assert (
        re.search(r"^evil_top +silu_mul_quant +1000000000 ", out, re.M)
        and EVIL in out
        and "sglang-moe-plugins 0." in out
    )
    assert (
        f"plugin entry point 'evil_misnamed' (evil_misnamed:Misnamed, from {EVIL}) not loaded: disabled by "
        "SGLANG_MOE_PLUGINS_DISABLE"
    ) in out
    assert f"plugin entry point 'evil_sysexit' (evil_sysexit:Plugin, from {EVIL_DIST[0]}) skipped: SystemExit: 3" in out
    assert "above every built-in plugin of op 'silu_mul_quant'" in out
    doctor = _cli(
        tmp_path / "2", "doctor", "--no-hooks", "--no-self-check", "--json", SGLANG_MOE_PLUGINS_STOCK="mega_moe"
    )
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr[-3000:]
    report = json.loads(doctor.stdout)
    assert any("'evil_op_raises'" in p and "RuntimeError: op lookup exploded" in p for p in report["problems"])
    assert any("'reference'" in p and "built-in names are reserved" in p for p in report["problems"])
    assert report["distributions"]["evil_top"] == EVIL and report["stock"] == [
        "op mega_moe: stock, SGLang's own function runs it"
    ]
    assert report["imported from"] == str(TESTS.parent / "sglang_moe_plugins")
    strict = _cli(tmp_path / "3", "list", SGLANG_MOE_PLUGINS_STRICT="1")
    assert strict.returncode == 1 and "Traceback" not in strict.stderr, strict.stderr[-3000:]
    assert "plugin registry error: strict = true and" in strict.stdout and "evil_top" in strict.stdout


def test_doctor_flags_an_op_no_enabled_plugin_can_run_and_hides_host_warnings(tmp_path):
    doctor = _cli(
        tmp_path, "doctor", "--no-self-check", SGLANG_MOE_PLUGINS_ALLOW="", SGLANG_MOE_PLUGINS_DISABLE="reference"
    )
    assert doctor.returncode == 1
    import torch

    if not torch.cuda.is_available():
        assert "op silu_mul_quant: no enabled plugin can run on this machine (cpu)" in doctor.stdout
    assert "UserWarning" not in doctor.stderr, doctor.stderr[-2000:]
