"""Registry: discovery through real entry points, validation, and problems reported not raised."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import pytest

from sglang_moe_plugins import ConfigError, Registry, UserConfig
from sglang_moe_plugins.config import parse_config
from sglang_moe_plugins.core.registry import ENTRY_POINT_GROUP

BUILTINS = {
    "jit_ep",
    "fp8_fallback",
    "triton",
    "reference",
    "mega_w4a8",
    "mega_w4a4",
    "mega_sm90_fp8",
    "mega_reference",
}


def ep(name: str, attr: str) -> EntryPoint:
    return EntryPoint(name, f"plugins_for_tests:{attr}", ENTRY_POINT_GROUP)


def test_builtin_entry_points_are_installed_and_load():
    names = {e.name for e in entry_points(group=ENTRY_POINT_GROUP)}
    assert BUILTINS <= names
    registry = Registry.discover(UserConfig())
    assert not [p for p in registry.problems if p.entry_point in BUILTINS], [p.describe() for p in registry.problems]
    assert BUILTINS <= set(registry.names())
    for record in registry.records():
        if record.name in BUILTINS:
            assert record.distribution == "sglang-moe-plugins"
            assert record.entry_point.startswith(f"{record.name} = sglang_moe_plugins.plugins.")


def test_discover_good_and_bad_entry_points_reports_each_problem(caplog):
    eps = [
        ep("good_test_plugin", "GoodPlugin"),
        ep("bad_op_plugin", "BadOpPlugin"),
        ep("bad_priority_plugin", "BadPriorityPlugin"),
        ep("no_run_plugin", "NoRunPlugin"),
        ep("old_contract_plugin", "OldContractPlugin"),
        ep("good_test_plugin", "DuplicatePlugin"),
        ep("raising", "RaisingInitPlugin"),
        ep("instance", "NOT_A_CLASS"),
        EntryPoint("missing_module", "no_such_module_xyz:Plugin", ENTRY_POINT_GROUP),
        EntryPoint("missing_attr", "plugins_for_tests:Nope", ENTRY_POINT_GROUP),
    ]
    registry = Registry.discover(UserConfig(), eps)
    assert registry.names() == ("good_test_plugin",)
    errors = {p.entry_point: p.error for p in registry.problems}
    assert "op='softmax' is not a known op" in errors["bad_op_plugin"]
    assert "priority='high' must be an int" in errors["bad_priority_plugin"]
    assert "run must be a method" in errors["no_run_plugin"]
    assert "written for plugin contract version 0" in errors["old_contract_plugin"]
    assert "duplicate plugin name 'good_test_plugin'" in errors["good_test_plugin"]
    assert "ImportError: needs the package 'fancy_kernels'" in errors["raising"]
    assert "must name a plugin class" in errors["instance"]
    assert "ModuleNotFoundError" in errors["missing_module"]
    assert "AttributeError" in errors["missing_attr"]
    assert len(registry.problems) == 9
    assert sum("skipped" in r.message for r in caplog.records) == 9


def test_options_merge_and_validation():
    config = parse_config({"options": {"good_test_plugin": {"block": 32}}})
    registry = Registry.discover(config, [ep("good_test_plugin", "GoodPlugin")])
    record = registry.get("good_test_plugin")
    assert dict(record.options) == {"block": 32, "mode": "fast"}
    assert record.plugin.options["block"] == 32
    with pytest.raises(
        ConfigError, match=r"option block='big' for plugin 'good_test_plugin' must be of type int \(default 16\)"
    ):
        Registry.discover(
            parse_config({"options": {"good_test_plugin": {"block": "big"}}}), [ep("good_test_plugin", "GoodPlugin")]
        )
    with pytest.raises(
        ConfigError, match="unknown option 'blok' for plugin 'good_test_plugin'; valid options: block, mode"
    ):
        Registry.discover(
            parse_config({"options": {"good_test_plugin": {"blok": 1}}}), [ep("good_test_plugin", "GoodPlugin")]
        )


def test_get_unknown_lists_names():
    registry = Registry.discover(UserConfig(), [ep("good_test_plugin", "GoodPlugin")])
    with pytest.raises(KeyError, match="registered plugins: good_test_plugin"):
        registry.get("nope")


def test_off_by_default_plugin_needs_enable():
    from plugins_for_tests import GoodPlugin

    class Experimental(GoodPlugin):
        name = "experimental"
        enabled_by_default = False

    reg = Registry.from_plugins([Experimental()])
    assert not reg.get("experimental").enabled and "off by default" in reg.get("experimental").status
    reg = Registry.from_plugins([Experimental()], parse_config({"enable": ["experimental"]}))
    assert reg.get("experimental").enabled
