"""Issue 30 finding 11 and issue 31 item 3: no silent misconfiguration.

- every boolean environment variable is read by one parser: ``SGLANG_MOE_PLUGINS_REQUIRE_KNOWN_SGLANG=y``,
  ``enabled`` or ``maybe`` is a ConfigError naming the variable, the value and the allowed values, handled like
  every other configuration error (SGLang's hooked functions raise it; ``doctor`` exits 1);
- an unknown ``SGLANG_MOE_PLUGINS_*`` variable is one WARNING naming the closest known one (one table of known
  variables); ``doctor`` lists it, and every other configuration warning, as a problem and exits 1;
- contradictory settings are a ConfigError naming both keys;
- every name error says which known name is closest (did you mean ...).

Through SGLang's real ``load_plugins()`` (tests/sglang_probe.py), the installed command (tests/test_cli.py) and
the configuration API where the finding is about a message.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_cli import cli

from sglang_moe_plugins import ConfigError, Registry
from sglang_moe_plugins.config import load_config
from sglang_moe_plugins.plugins.reference import ReferencePlugin
from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin
from sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback import Fp8FallbackPlugin
from sglang_moe_plugins.plugins.sglang_kernels.jit_ep import JitEpPlugin

REQUIRE = "SGLANG_MOE_PLUGINS_REQUIRE_KNOWN_SGLANG"
sglang_tests = pytest.mark.sglang


def _registry(env: dict) -> Registry:
    return Registry.from_plugins(
        [JitEpPlugin(), Fp8FallbackPlugin(), ReferencePlugin(), MegaReferencePlugin()], load_config(env)
    )


def _file(tmp_path, text: str) -> dict:
    path = tmp_path / "moe.toml"
    path.write_text(text)
    return {"SGLANG_MOE_PLUGINS_CONFIG": str(path)}


# -- issue 30 finding 11: one parser for every boolean variable --------------------------------------------------
BOOLEANS = (
    REQUIRE,
    "SGLANG_MOE_PLUGINS_STRICT",
    "SGLANG_MOE_PLUGINS_DEBUG",
    "SGLANG_OPT_USE_JIT_EP_ACTIVATION",
    "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS",
    "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_MXF4_KIND",
)


@pytest.mark.parametrize("value", ["y", "enabled", "maybe"])
@pytest.mark.parametrize("name", BOOLEANS)
def test_every_boolean_variable_rejects_a_value_it_does_not_know(name, value):
    with pytest.raises(ConfigError) as info:
        load_config({name: value})
    assert str(info.value) == f"{name}={value!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off"


@pytest.mark.parametrize("value, expected", [("1", True), ("yes", True), (" ON ", True), ("0", False), ("", False)])
def test_require_known_reads_the_same_words_as_the_other_switches(value, expected):
    pytest.importorskip("sglang")
    from sglang_moe_plugins.integrations.sglang import versions as sv

    load_config({REQUIRE: value})  # no error
    installed = sv.sglang_version()
    newer = sv.version_case(installed, {"0.5.1": sv.KNOWN_TARGETS[installed]}, environ={REQUIRE: value})
    assert newer.case == ("newer-refused" if expected else "newer")


@sglang_tests
def test_an_invalid_require_known_value_fails_closed_through_load_plugins():
    pytest.importorskip("sglang")
    from sglang_probe import run_probe

    result, stderr = run_probe(**{REQUIRE: "maybe"})
    assert result["patched"] and len(result["calls"]) == 2, result
    needle = f"ConfigError: {REQUIRE}='maybe' is not a boolean; use one of 1/0, true/false, yes/no, on/off"
    assert all(c == needle for c in result["calls"]), result["calls"]
    assert "failing closed" in stderr and "Traceback" not in stderr


def test_doctor_exits_1_on_an_invalid_require_known_value():
    out = cli("doctor", "--no-hooks", "--no-self-check", **{REQUIRE: "enabled"})
    assert out.returncode == 1 and f"{REQUIRE}='enabled' is not a boolean" in out.stdout, out.stdout


# -- issue 31 item 3: unknown variables ----------------------------------------------------------------------------
def test_one_table_names_every_variable_the_package_reads():
    from sglang_moe_plugins.config import KNOWN_ENV

    root = Path(__file__).resolve().parent.parent / "sglang_moe_plugins"
    read = set()
    for path in root.rglob("*.py"):
        read |= set(re.findall(r"SGLANG_MOE_PLUGINS_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert read and read <= set(KNOWN_ENV), sorted(read - set(KNOWN_ENV))
    assert all(KNOWN_ENV[name] for name in KNOWN_ENV)  # each with what it does


@pytest.mark.parametrize(
    "name, closest",
    [
        ("SGLANG_MOE_PLUGINS_DISABLED", "SGLANG_MOE_PLUGINS_DISABLE"),
        ("SGLANG_MOE_PLUGINS_STOKC", "SGLANG_MOE_PLUGINS_STOCK"),
        ("SGLANG_MOE_PLUGIN_STRICT", "SGLANG_MOE_PLUGINS_STRICT"),
        ("SGLANG_MOE_PLUGINS_CONFIG_FILE", "SGLANG_MOE_PLUGINS_CONFIG"),
    ],
)
def test_an_unknown_variable_names_the_closest_known_one(name, closest):
    from sglang_moe_plugins.config import unknown_env_warnings

    (warning,) = unknown_env_warnings({name: "x", "SGLANG_MOE_PLUGINS_DISABLE": "jit_ep", "OTHER": "1"})
    assert name in warning and f"did you mean {closest}?" in warning
    assert load_config({name: "x"}) is not None  # a warning, not an error
    assert unknown_env_warnings({"SGLANG_MOE_PLUGINS_STOCK": "mega_moe"}) == ()


@sglang_tests
def test_an_unknown_variable_is_one_warning_at_load_plugins():
    pytest.importorskip("sglang")
    from sglang_probe import run_probe

    result, stderr = run_probe(SGLANG_MOE_PLUGINS_DISABLED="jit_ep")
    assert result["calls"] == ["ok", "ok"]
    lines = [x for x in stderr.splitlines() if "SGLANG_MOE_PLUGINS_DISABLED" in x]
    assert len(lines) == 1 and lines[0].startswith("WARNING:"), lines
    assert "did you mean SGLANG_MOE_PLUGINS_DISABLE?" in lines[0]


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"SGLANG_MOE_PLUGINS_DISABLED": "jit_ep"}, "did you mean SGLANG_MOE_PLUGINS_DISABLE?"),
        ({"SGLANG_MOE_PLUGINS_DISABLE": "jit_epp"}, "disable names plugin 'jit_epp'"),
    ],
)
def test_doctor_lists_configuration_warnings_as_problems(env, needle):
    out = cli("doctor", "--json", "--no-hooks", "--no-self-check", **env)
    report = json.loads(out.stdout)
    assert out.returncode == 1 and any(needle in p for p in report["problems"]), report["problems"]


# -- issue 31 item 3: contradictions name both keys ----------------------------------------------------------------
@pytest.mark.parametrize(
    "text, env, needles",
    [
        (
            'stock = ["mega_moe"]\n[force]\nmega_moe = "mega_reference"\n',
            {},
            ("force.mega_moe = 'mega_reference'", "'stock' in"),
        ),
        ('stock = ["all"]\n[force]\nsilu_mul_quant = "reference"\n', {}, ("force.silu_mul_quant", "'stock' in")),
        (
            'enable = ["jit_ep"]\n',
            {"SGLANG_MOE_PLUGINS_DISABLE": "jit_ep"},
            ("'jit_ep' is both enabled and disabled", "'enable' in", "SGLANG_MOE_PLUGINS_DISABLE"),
        ),
        (
            '[force]\nsilu_mul_quant = "jit_ep"\n',
            {"SGLANG_MOE_PLUGINS_DISABLE": "jit_ep"},
            ("force.silu_mul_quant = 'jit_ep' in", "SGLANG_MOE_PLUGINS_DISABLE"),
        ),
    ],
)
def test_contradictory_settings_are_an_error_naming_both_keys(tmp_path, text, env, needles):
    with pytest.raises(ConfigError) as info:
        _registry({**_file(tmp_path, text), **env})
    assert all(n in str(info.value) for n in needles), str(info.value)


def test_stock_from_the_environment_overrides_the_files_force_with_a_warning(tmp_path):
    env = {**_file(tmp_path, '[force]\nmega_moe = "mega_reference"\n'), "SGLANG_MOE_PLUGINS_STOCK": "mega_moe"}
    config = load_config(env)
    assert dict(config.force) == {} and config.stock == frozenset({"mega_moe"})
    (warning,) = config.warnings
    assert "force.mega_moe = 'mega_reference'" in warning and "SGLANG_MOE_PLUGINS_STOCK" in warning
    _registry(env)  # not an error


# -- issue 31 items 2 and 3: did you mean, in every name error ------------------------------------------------------
@pytest.mark.parametrize(
    "text, env, needle",
    [
        ("stict = true\n", {}, "unknown key 'stict'"),
        ('enable = ["jit_epp"]\n', {}, "unknown plugin 'jit_epp'"),
        ("[priority]\nrefrence = 3\n", {}, "unknown plugin 'refrence'"),
        ("[options.refrence]\nx = 1\n", {}, "unknown plugin 'refrence'"),
        ('[force]\nsilu_mul_quantt = "jit_ep"\n', {}, "unknown op 'silu_mul_quantt'"),
        ('[force]\nsilu_mul_quant = "jet_ep"\n', {}, "unknown plugin 'jet_ep'"),
        ('stock = ["megamoe"]\n', {}, "unknown op 'megamoe'"),
        ("", {"SGLANG_MOE_PLUGINS_STOCK": "megamoe"}, "unknown op 'megamoe'"),
    ],
)
def test_every_name_error_says_which_name_is_closest(tmp_path, text, env, needle):
    closest = {
        "stict": "strict",
        "jit_epp": "jit_ep",
        "refrence": "reference",
        "silu_mul_quantt": "silu_mul_quant",
        "jet_ep": "jit_ep",
        "megamoe": "mega_moe",
    }[needle.split("'")[1]]
    with pytest.raises(ConfigError) as info:
        _registry({**_file(tmp_path, text), **env})
    assert needle in str(info.value) and f"did you mean {closest!r}?" in str(info.value), str(info.value)


def test_a_disabled_name_not_installed_says_which_name_is_closest(caplog):
    _registry({"SGLANG_MOE_PLUGINS_DISABLE": "jit_epp"})
    assert "disable names plugin 'jit_epp'" in caplog.text and "did you mean 'jit_ep'?" in caplog.text


def test_registry_get_says_which_name_is_closest():
    with pytest.raises(KeyError, match="did you mean 'jit_ep'"):
        _registry({}).get("jit_epp")
