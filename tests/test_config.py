"""Configuration: TOML file, environment switches, legacy flags, and every error message."""

from __future__ import annotations

import pytest

from sglang_moe_plugins import ConfigError, Registry, UserConfig
from sglang_moe_plugins.config import load_config, parse_config
from sglang_moe_plugins.plugins.reference import ReferencePlugin
from sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback import Fp8FallbackPlugin
from sglang_moe_plugins.plugins.sglang_kernels.jit_ep import JitEpPlugin


def _registry(config: UserConfig) -> Registry:
    return Registry.from_plugins([JitEpPlugin(), Fp8FallbackPlugin(), ReferencePlugin()], config)


def _write(tmp_path, text: str) -> dict:
    path = tmp_path / "moe.toml"
    path.write_text(text)
    return {"SGLANG_MOE_PLUGINS_CONFIG": str(path)}


def test_defaults_without_env():
    config = load_config({})
    assert config == UserConfig() or (not config.strict and not config.disable and not config.force)
    reg = _registry(config)
    assert [r.name for r in reg.records("silu_mul_quant")] == ["jit_ep", "fp8_fallback", "reference"]
    assert all(r.enabled for r in reg.records())


def test_file_disable_priority_force_options(tmp_path):
    env = _write(
        tmp_path,
        'strict = true\ndisable = ["jit_ep"]\n[priority]\nreference = 500\n[force]\nsilu_mul_quant = "reference"\n',
    )
    config = load_config(env)
    reg = _registry(config)
    assert config.strict
    assert not reg.get("jit_ep").enabled
    assert "disabled by 'disable' in" in reg.get("jit_ep").status
    assert reg.get("reference").priority == 500 and reg.get("reference").default_priority == 0
    assert "priority 500 set by [priority]" in reg.get("reference").status
    assert reg.records("silu_mul_quant")[0].name == "reference"
    assert config.force["silu_mul_quant"] == "reference"


def test_env_disable_and_strict():
    config = load_config({"SGLANG_MOE_PLUGINS_DISABLE": " jit_ep, fp8_fallback ,", "SGLANG_MOE_PLUGINS_STRICT": "1"})
    reg = _registry(config)
    assert config.strict
    assert {r.name for r in reg.records() if not r.enabled} == {"jit_ep", "fp8_fallback"}
    assert reg.get("jit_ep").status == "disabled by SGLANG_MOE_PLUGINS_DISABLE"


@pytest.mark.parametrize(
    "env, needle",
    [
        # A name in DISABLE that is not installed here is a warning (tests/test_config_fail_closed.py).
        (
            {"SGLANG_MOE_PLUGINS_STOCK": "megamoe"},
            "unknown op 'megamoe' (left to SGLang by SGLANG_MOE_PLUGINS_STOCK); valid ops: mega_moe, silu_mul_quant",
        ),
        ({"SGLANG_MOE_PLUGINS_STRICT": "maybe"}, "SGLANG_MOE_PLUGINS_STRICT='maybe' is not a boolean"),
        ({"SGLANG_MOE_PLUGINS_CONFIG": "/nonexistent/moe.toml"}, "file not found"),
        (
            {"SGLANG_OPT_USE_JIT_EP_ACTIVATION": "perhaps"},
            "SGLANG_OPT_USE_JIT_EP_ACTIVATION='perhaps' is not a boolean",
        ),
    ],
)
def test_env_errors(env, needle):
    with pytest.raises(ConfigError) as info:
        _registry(load_config(env))
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("stict = true", "unknown key 'stict'"),
        (
            "stict = true",
            "valid keys: strict, debug, on_config_error, allow, stock, disable, enable, priority, force, options",
        ),
        ("strict = 1", "strict in"),
        ('disable = "jit_ep"', "disable in"),
        ('stock = ["megamoe"]', "unknown op 'megamoe' (left to SGLang by 'stock' in"),
        ('enable = ["nope"]', "unknown plugin 'nope' (enabled by 'enable' in"),
        ('disable = ["jit_ep"]\nenable = ["jit_ep"]', "'jit_ep' is both enabled and disabled"),
        ("[priority]\njit_ep = 'high'", "priority.jit_ep in"),
        ("[priority]\nnope = 3", "unknown plugin 'nope' (set by [priority] in"),
        ('[force]\nsilu_mul_quantt = "jit_ep"', "unknown op 'silu_mul_quantt' in force"),
        ('[force]\nsilu_mul_quant = "jet_ep"', "unknown plugin 'jet_ep' in force.silu_mul_quant"),
        ('disable = ["jit_ep"]\n[force]\nsilu_mul_quant = "jit_ep"', "force.silu_mul_quant = 'jit_ep'"),
        ("[options.reference]\nfoo = 1", "unknown option 'foo' for plugin 'reference'"),
        ("[options.nope]\nfoo = 1", "unknown plugin 'nope'"),
        ("strict = [", "TOML syntax error"),
    ],
)
def test_file_errors_name_the_entry(tmp_path, text, needle):
    with pytest.raises(ConfigError) as info:
        _registry(load_config(_write(tmp_path, text)))
    assert needle in str(info.value)


def test_unknown_plugin_error_lists_valid_names(tmp_path):
    with pytest.raises(ConfigError, match="valid plugins: fp8_fallback, jit_ep, reference"):
        _registry(load_config(_write(tmp_path, 'enable = ["x"]')))


def test_force_of_wrong_op_names_the_op(tmp_path):
    class MegaLike(ReferencePlugin):
        name = "mega_like"
        op = "mega_moe"

    from sglang_moe_plugins.ops import OPS

    if "mega_moe" not in OPS:
        pytest.skip("mega_moe op not present")
    config = load_config(_write(tmp_path, '[force]\nsilu_mul_quant = "mega_like"'))
    with pytest.raises(ConfigError, match="implements op 'mega_moe'"):
        Registry.from_plugins([ReferencePlugin(), MegaLike()], config)


def test_legacy_jit_ep_switch_is_translated():
    config = load_config({"SGLANG_OPT_USE_JIT_EP_ACTIVATION": "0"})
    reg = _registry(config)
    assert not reg.get("jit_ep").enabled
    assert "legacy SGLANG_OPT_USE_JIT_EP_ACTIVATION=0" in reg.get("jit_ep").status
    assert any("translated to: disable jit_ep" in note for note in config.notes)
    assert _registry(load_config({"SGLANG_OPT_USE_JIT_EP_ACTIVATION": "1"})).get("jit_ep").enabled


@pytest.mark.parametrize(
    "flag", ["SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS", "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_MXF4_KIND"]
)
def test_legacy_fp4_switches_prefer_w4a4_and_are_not_forwarded(flag, monkeypatch):
    monkeypatch.delenv("DG_USE_FP4_ACTS", raising=False)
    monkeypatch.delenv("DG_USE_MXF4_KIND", raising=False)
    config = load_config({flag: "1"})
    assert config.priority["mega_w4a4"] == 1000
    assert config.provenance["priority:mega_w4a4"] == f"set by legacy {flag}=1"
    assert any(flag in note and "mega_w4a4" in note for note in config.notes)
    import os

    assert "DG_USE_FP4_ACTS" not in os.environ and "DG_USE_MXF4_KIND" not in os.environ


def test_parse_config_is_pure():
    config = parse_config({"disable": ["a"], "priority": {"b": 3}})
    assert config.disable == frozenset({"a"}) and config.priority["b"] == 3
    with pytest.raises(TypeError):
        config.priority["b"] = 4  # type: ignore[index]


@pytest.mark.parametrize(
    "kind, needle",
    [
        ("directory", "is a directory; it must name a TOML file"),
        ("not-utf8", "not UTF-8 text (byte b'\\xe9' at offset"),
        ("unreadable", "cannot read the file"),
    ],
)
def test_unreadable_config_path_is_a_config_error(tmp_path, kind, needle):
    import os

    path = tmp_path / "moe.toml"
    if kind == "directory":
        path = tmp_path
    elif kind == "not-utf8":
        path.write_bytes(b'disable = ["jit_ep"]\n# caf\xe9\n')
    else:
        path.write_text("strict = true\n")
        path.chmod(0)
        if os.access(path, os.R_OK):  # running as root: permissions do not stop reading
            pytest.skip("the file stays readable for this user")
    with pytest.raises(ConfigError) as info:
        load_config({"SGLANG_MOE_PLUGINS_CONFIG": str(path)})
    assert str(info.value).startswith(f"SGLANG_MOE_PLUGINS_CONFIG={str(path)!r}") and needle in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_strict_requested_also_when_the_configuration_is_invalid(tmp_path):
    from sglang_moe_plugins.config import strict_requested

    bad = tmp_path / "moe.toml"
    bad.write_text("strict = true\n[priority\n")
    assert strict_requested({"SGLANG_MOE_PLUGINS_STRICT": "1", "SGLANG_MOE_PLUGINS_CONFIG": str(bad)})
    assert strict_requested({"SGLANG_MOE_PLUGINS_STRICT": "maybe"})  # meant something: fail closed
    assert not strict_requested({"SGLANG_MOE_PLUGINS_STRICT": "0"})
    assert not strict_requested({"SGLANG_MOE_PLUGINS_CONFIG": str(bad)})  # cannot tell from a broken file
    good = tmp_path / "good.toml"
    good.write_text('strict = true\ndisable = ["nope"]\n')  # parses: strict is known, the name error comes later
    assert strict_requested({"SGLANG_MOE_PLUGINS_CONFIG": str(good)})


def test_debug_key_in_file(tmp_path):
    assert load_config(_write(tmp_path, "debug = true")).debug
    with pytest.raises(ConfigError, match=r"debug in .* must be true or false"):
        load_config(_write(tmp_path, "debug = 1"))
