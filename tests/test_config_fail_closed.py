"""Issue 18, items 1 and 4: a configuration mistake fails closed by default, ``on_config_error = "stock"``
turns the package off without a traceback, a config path that is not a regular file is refused without
being opened, and ``stock`` leaves single ops to SGLang. Each through SGLang's real ``load_plugins()``
and its hooked function, in a fresh process (tests/sglang_probe.py)."""

from __future__ import annotations

import os

import pytest

from sglang_moe_plugins.config import config_error_policy, load_config, parse_config
from sglang_moe_plugins.errors import ConfigError


def _file(tmp_path, text: str | bytes, name: str = "moe.toml") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


# -- the form of the new settings -------------------------------------------------------------------
def test_new_settings_parse_and_env_overrides(tmp_path):
    path = _file(tmp_path, 'on_config_error = "stock"\nallow = ["my_kernels"]\nstock = ["mega_moe"]\n')
    config = load_config({"SGLANG_MOE_PLUGINS_CONFIG": path})
    assert (config.on_config_error, config.allow, config.stock) == (
        "stock",
        frozenset({"my_kernels"}),
        frozenset({"mega_moe"}),
    )
    env = {
        "SGLANG_MOE_PLUGINS_CONFIG": path,
        "SGLANG_MOE_PLUGINS_ALLOW": "a, b",
        "SGLANG_MOE_PLUGINS_STOCK": "silu_mul_quant",
        "SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR": "closed",
    }
    config = load_config(env)
    assert config.allow == frozenset({"a", "b"}) and config.stock == frozenset({"mega_moe", "silu_mul_quant"})
    assert config.on_config_error == "closed"
    assert load_config({}).allow is None  # unset: every installed plugin may load
    assert load_config({"SGLANG_MOE_PLUGINS_ALLOW": ""}).allow == frozenset()  # set and empty: no third party


@pytest.mark.parametrize(
    "text, message",
    [
        ('on_config_error = "open"', "on_config_error in"),
        ("stock = 7", "stock in"),
        ("priority = { triton = 99999999999999999999 }", "does not fit a 64-bit integer"),
        ("priority = { triton = -9223372036854775809 }", "does not fit a 64-bit integer"),
    ],
)
def test_bad_values_are_config_errors(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config({"SGLANG_MOE_PLUGINS_CONFIG": _file(tmp_path, text)})


@pytest.mark.parametrize("text, ops", [('stock = "mega_moe"', {"mega_moe"}), ('stock = "all"', None)])
def test_a_single_stock_name_is_a_list_of_one(tmp_path, text, ops):
    # The rollback written as one string (the docs show "all") must never fail closed.
    from sglang_moe_plugins.config_file import stock_rollback

    path = _file(tmp_path, text)
    stock = load_config({"SGLANG_MOE_PLUGINS_CONFIG": path}).stock
    assert stock == ops if ops is not None else len(stock) >= 3
    assert stock_rollback(("silu_mul_quant", "mega_moe"), {"SGLANG_MOE_PLUGINS_CONFIG": path}).ops >= (ops or set())


def test_a_deeply_nested_file_is_a_config_error(tmp_path):
    from sglang_moe_plugins.config_file import stock_rollback

    path = _file(tmp_path, "a = " + "[" * 5000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config({"SGLANG_MOE_PLUGINS_CONFIG": path})
    assert stock_rollback(("silu_mul_quant",), {"SGLANG_MOE_PLUGINS_CONFIG": path}).ops == frozenset()


def test_priority_at_the_int64_bounds_is_accepted():
    assert parse_config({"priority": {"a": (1 << 63) - 1, "b": -(1 << 63)}}).priority["a"] == (1 << 63) - 1


def test_on_config_error_env_value_is_checked():
    with pytest.raises(ConfigError, match="SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR must be one of 'closed', 'stock'"):
        load_config({"SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR": "maybe"})


def test_unknown_stock_op_is_an_error():
    from sglang_moe_plugins import Registry

    with pytest.raises(
        ConfigError, match=r"unknown op 'mega' .*SGLANG_MOE_PLUGINS_STOCK.*valid ops: mega_moe, silu_mul_quant"
    ):
        Registry.from_plugins([], load_config({"SGLANG_MOE_PLUGINS_STOCK": "mega"}))


def test_bom_and_tilde(tmp_path, monkeypatch):
    _file(tmp_path, b"\xef\xbb\xbfdebug = true\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config({"SGLANG_MOE_PLUGINS_CONFIG": "~/moe.toml"}).debug


@pytest.mark.parametrize("kind", ["fifo", "device", "too-large"])
def test_non_regular_or_huge_files_are_refused_without_opening(tmp_path, kind):
    if kind == "fifo":
        path, text = str(tmp_path / "moe.toml"), "is a FIFO; it must name a regular TOML file (not opened)"
        os.mkfifo(path)
    elif kind == "device":
        path, text = "/dev/zero", "is a device; it must name a regular TOML file (not opened)"
    else:
        path, text = _file(tmp_path, b"#" * ((1 << 20) + 1)), "bytes; a configuration file may have at most 1048576"
    with pytest.raises(ConfigError, match=text.replace("(", r"\(").replace(")", r"\)")):
        load_config({"SGLANG_MOE_PLUGINS_CONFIG": path})
    assert config_error_policy({"SGLANG_MOE_PLUGINS_CONFIG": path}) == "closed"


def test_policy_is_read_from_a_file_that_is_otherwise_invalid(tmp_path):
    path = _file(tmp_path, 'on_config_error = "stock"\ndisabel = ["jit_ep"]\n')
    assert config_error_policy({"SGLANG_MOE_PLUGINS_CONFIG": path}) == "stock"
    assert (
        config_error_policy({"SGLANG_MOE_PLUGINS_CONFIG": path, "SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR": "closed"})
        == "closed"
    )
    assert config_error_policy({"SGLANG_MOE_PLUGINS_CONFIG": _file(tmp_path, "[x", "bad.toml")}) == "closed"


def test_disable_of_a_plugin_not_installed_is_a_warning(caplog):
    from sglang_moe_plugins import Registry
    from sglang_moe_plugins.plugins.reference import ReferencePlugin

    registry = Registry.from_plugins([ReferencePlugin()], load_config({"SGLANG_MOE_PLUGINS_DISABLE": "example_torch"}))
    assert registry.get("reference").enabled
    assert (
        "disable names plugin 'example_torch' (disabled by SGLANG_MOE_PLUGINS_DISABLE), which is not installed here"
        in caplog.text
    )
    with pytest.raises(ConfigError, match="unknown plugin 'example_torch'"):  # enable still must exist
        Registry.from_plugins([ReferencePlugin()], parse_config({"enable": ["example_torch"]}))


# -- through SGLang's real load_plugins() -----------------------------------------------------------
sglang_tests = pytest.mark.sglang


@sglang_tests
@pytest.mark.parametrize("mistake", ["typo key", "bad legacy switch", "bad strict value"])
def test_config_mistakes_fail_closed_by_default(tmp_path, mistake):
    pytest.importorskip("sglang")
    from sglang_probe import run_probe

    env = {
        "typo key": {"SGLANG_MOE_PLUGINS_CONFIG": _file(tmp_path, 'disabel = ["jit_ep"]\n')},
        "bad legacy switch": {"SGLANG_OPT_USE_JIT_EP_ACTIVATION": "maybe"},
        "bad strict value": {"SGLANG_MOE_PLUGINS_DEBUG": "sometimes"},
    }[mistake]
    result, stderr = run_probe(**env)
    assert result["patched"], "hooks must be installed, raising the error"
    assert len(result["calls"]) == 2 and all(c.startswith("ConfigError: ") for c in result["calls"]), result["calls"]
    assert "failing closed" in stderr and "Traceback" not in stderr
    assert "Failed to execute general plugin" not in stderr  # register() never re-raises into SGLang's loader
    stock, stock_err = run_probe(SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR="stock", **env)
    assert stock["patched"] == [] and "NOT active (on_config_error = stock)" in stock_err
    assert "Traceback" not in stock_err and "Failed to execute general plugin" not in stock_err
    assert not any(c.startswith("ConfigError") for c in stock["calls"])  # SGLang's own function ran


@sglang_tests
def test_disable_of_a_missing_plugin_keeps_the_package_on(tmp_path):
    pytest.importorskip("sglang")
    from sglang_probe import run_probe

    result, stderr = run_probe(SGLANG_MOE_PLUGINS_DISABLE="example_torch_not_here")
    assert result["patched"] and result["calls"] == ["ok", "ok"]
    assert "which is not installed here; ignored" in stderr


@sglang_tests
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_special_config_paths_do_not_hang_or_turn_the_package_off(tmp_path, kind):
    pytest.importorskip("sglang")
    from sglang_probe import run_probe

    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "moe.toml")
        os.mkfifo(path)
    result, _ = run_probe(timeout=120, SGLANG_MOE_PLUGINS_CONFIG=path)
    assert result["patched"] and all(c.startswith("ConfigError") and "(not opened)" in c for c in result["calls"])


@sglang_tests
def test_stock_op_is_left_unhooked_and_the_other_stays_hooked():
    pytest.importorskip("sglang")
    from sglang_probe import run_probe
    from sglang_session import MEGA_TARGET, SMQ_TARGET, hooked_targets

    result, stderr = run_probe(SGLANG_MOE_PLUGINS_STOCK="silu_mul_quant")
    assert SMQ_TARGET not in result["patched"]
    from sglang_moe_plugins.integrations.sglang.versions import version_case

    others = {t.path for t in version_case().targets if t.op != "silu_mul_quant" and "moe" in t.path}
    assert MEGA_TARGET in others or MEGA_TARGET not in hooked_targets()
    assert result["patched"] == sorted(others)  # every other op's targets (mega_moe, silu_mul_quant_contig)
    assert result["stock"] == ["silu_mul_quant"]
    assert "op silu_mul_quant is stock" in stderr
    assert all(c != "ok" for c in result["calls"])  # SGLang's own code: no CPU kernel for plain silu
    hooked, _ = run_probe()
    assert hooked["calls"] == ["ok", "ok"] and SMQ_TARGET in hooked["patched"]


@sglang_tests
def test_stock_from_the_environment_holds_even_when_the_config_is_invalid(tmp_path):
    pytest.importorskip("sglang")
    from sglang_probe import run_probe
    from sglang_session import SMQ_TARGET

    result, _ = run_probe(
        SGLANG_MOE_PLUGINS_STOCK="silu_mul_quant", SGLANG_MOE_PLUGINS_CONFIG=_file(tmp_path, "bogus = 1\n")
    )
    assert SMQ_TARGET not in result["patched"] and all(c != "ok" and "ConfigError" not in c for c in result["calls"])
