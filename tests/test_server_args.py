"""Issue #31 item 8: the package's switches as SGLang server arguments (``--moe-plugins-*``, group
"sglang-moe-plugins"), in ``python -m sglang.launch_server --help``, on the command line and as keys of SGLang's
YAML ``--config``, exported as the package's environment variables for the server's processes.

Everything goes through SGLang's real ``load_plugins()``, which runs the package's entry point ``moe_plugins``; its
``register()`` calls :func:`register_server_args` (one line of ``entry.register()``: every test here but
``test_a_release_without_the_targets...`` needs that line; ``test_the_entry_point_registers_the_hooks`` checks it
alone). The parsing goes through SGLang's own
``prepare_server_args`` (what ``sglang serve`` and ``launch_server`` call, YAML ``--config`` included), without
starting a server: one probe process runs every case (SGLang loads its plugins once per process), and a child of it,
started after the parse, shows what the server's processes read.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("sglang")

pytestmark = pytest.mark.sglang

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
FLAGS = (
    "--moe-plugins-config",
    "--moe-plugins-stock",
    "--moe-plugins-disable",
    "--moe-plugins-enable",
    "--moe-plugins-allow",
    "--moe-plugins-force",
    "--moe-plugins-priority",
    "--moe-plugins-on-config-error",
    "--moe-plugins-masked-layout",
    "--moe-plugins-strict",
    "--moe-plugins-debug",
    "--moe-plugins-require-known-sglang",
)
E = "SGLANG_MOE_PLUGINS_"

PROBE = r"""
import contextlib, io, json, os, subprocess, sys
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.layers.moe.moe_runner.deep_gemm  # the MoE targets are hooked when SGLang imports its runner
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.server_args import prepare_server_args

CHILD = (
    "import json; from sglang_moe_plugins.config import load_config; c = load_config(); "
    "print(json.dumps({'stock': sorted(c.stock), 'disable': sorted(c.disable), 'strict': c.strict, "
    "'debug': c.debug, 'masked_layout': c.masked_layout, 'on_config_error': c.on_config_error, "
    "'allow': None if c.allow is None else sorted(c.allow)}))"
)
cases = json.loads(sys.argv[1])
results = {
    "sources": {
        target: sorted({src.plugin_name for _, _, src in HookRegistry._hooks.get(target, ()) if src is not None})
        for target in cases.pop("_targets")
    }
}
for name, case in cases.items():
    for key in [k for k in os.environ if k.startswith("SGLANG_MOE_PLUGINS_")]:
        del os.environ[key]
    os.environ.update(case["env"])
    err = io.StringIO()
    out = {}
    try:
        with contextlib.redirect_stderr(err):
            out["model_path"] = prepare_server_args(case["argv"]).model_path
        if case.get("child"):
            child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
            out["child"] = json.loads(child.stdout) if child.returncode == 0 else child.stderr[-2000:]
    except SystemExit as exc:
        out["exit"] = exc.code
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["env"] = {k: v for k, v in os.environ.items() if k.startswith("SGLANG_MOE_PLUGINS_")}
    out["stderr"] = err.getvalue()[-4000:]
    results[name] = out
print("RESULT " + json.dumps(results))
"""


def _env(**extra: str) -> dict[str, str]:
    """This environment less SGLang's and the package's variables, plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")} | extra


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    """Every parse case of this file, in one process that ran SGLang's ``load_plugins()``."""
    tmp = tmp_path_factory.mktemp("server_args")
    toml = tmp / "moe.toml"
    toml.write_text("debug = true\n")
    yaml = tmp / "serve.yaml"
    yaml.write_text(
        textwrap.dedent(
            """\
            model-path: dummy-model
            moe-plugins-stock: mega_moe
            moe-plugins-disable: [jit_ep, fp8_fallback]
            moe-plugins-force: {silu_mul_quant: triton}
            moe-plugins-priority: {fp8_fallback: 200}
            moe-plugins-strict: true
            moe-plugins-masked-layout: sglang
            """
        )
    )
    model = ["--model-path", "dummy-model"]
    cases = {
        "_targets": [ADD_CLI_ARGS, FROM_CLI_ARGS],
        "yaml_and_flags": {
            "env": {},
            "argv": [
                "--config",
                str(yaml),
                "--moe-plugins-priority",
                "triton=150,fp8_fallback=-5",  # the command line wins over the YAML key, as for SGLang's own flags
                "--moe-plugins-enable",
                "my_experimental",
                "--moe-plugins-config",
                str(toml),
                "--moe-plugins-on-config-error",
                "stock",
                "--moe-plugins-allow",
                "my_kernels",
            ],
            "child": True,
        },
        "no_flags": {"env": {E + "STOCK": "silu_mul_quant"}, "argv": model},
        "same_value": {
            "env": {E + "STOCK": "mega_moe", E + "STRICT": "1", E + "DISABLE": "fp8_fallback, jit_ep"},
            "argv": [
                *model,
                "--moe-plugins-stock",
                "mega_moe",
                "--moe-plugins-strict",
                "--moe-plugins-disable",
                "jit_ep,fp8_fallback",
            ],
        },
        "conflict": {
            "env": {E + "STOCK": "silu_mul_quant", E + "STRICT": "0"},
            "argv": [*model, "--moe-plugins-stock", "mega_moe", "--moe-plugins-strict", "--moe-plugins-debug"],
        },
        "bad_force": {"env": {}, "argv": [*model, "--moe-plugins-force", "silu_mul_quant"]},
        "bad_priority": {"env": {}, "argv": [*model, "--moe-plugins-priority", "triton=high"]},
        "bad_choice": {"env": {}, "argv": [*model, "--moe-plugins-masked-layout", "fast"]},
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(cases)], capture_output=True, text=True, env=_env(), timeout=900
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    results = json.loads(line[len("RESULT ") :])
    results["_paths"] = {"toml": str(toml)}
    return results


def test_yaml_config_and_flags_set_the_environment_of_the_server_processes(probe):
    case = probe["yaml_and_flags"]
    assert "exit" not in case and "error" not in case, case
    assert case["model_path"] == "dummy-model"
    assert case["env"] == {
        E + "STOCK": "mega_moe",
        E + "DISABLE": "jit_ep,fp8_fallback",
        E + "FORCE": "silu_mul_quant=triton",
        E + "PRIORITY": "triton=150,fp8_fallback=-5",
        E + "STRICT": "1",
        E + "MASKED_LAYOUT": "sglang",
        E + "ENABLE": "my_experimental",
        E + "CONFIG": probe["_paths"]["toml"],
        E + "ON_CONFIG_ERROR": "stock",
        E + "ALLOW": "my_kernels",
    }
    # A process started after the parse (as SGLang's scheduler and detokenizer are) reads them as configuration.
    assert case["child"] == {
        "stock": ["mega_moe"],
        "disable": ["fp8_fallback", "jit_ep"],
        "strict": True,
        "debug": True,  # from the TOML file --moe-plugins-config names
        "masked_layout": "sglang",
        "on_config_error": "stock",
        "allow": ["my_kernels"],
    }
    assert "SGLANG_MOE_PLUGINS_STOCK='mega_moe'" in case["stderr"]  # the one INFO line saying what was set


def test_a_flag_and_a_variable_with_the_same_value_agree(probe):
    case = probe["same_value"]
    assert "error" not in case and case["model_path"] == "dummy-model", case
    assert case["env"] == {E + "STOCK": "mega_moe", E + "STRICT": "1", E + "DISABLE": "fp8_fallback, jit_ep"}
    assert "server arguments set" not in case["stderr"]  # the variables stay as the user wrote them
    case = probe["no_flags"]  # and without a flag nothing is set
    assert case["model_path"] == "dummy-model" and case["env"] == {E + "STOCK": "silu_mul_quant"}, case


def test_a_flag_and_a_different_variable_is_an_error_naming_both(probe):
    case = probe["conflict"]
    error = case.get("error", "")
    assert error.startswith("ConfigError: "), case
    for part in (
        "--moe-plugins-stock 'mega_moe'",
        "SGLANG_MOE_PLUGINS_STOCK='silu_mul_quant'",
        "--moe-plugins-strict",
        "SGLANG_MOE_PLUGINS_STRICT='0'",
    ):
        assert part in error, error
    assert "--moe-plugins-debug" not in error  # no variable set: no conflict
    assert case["env"] == {E + "STOCK": "silu_mul_quant", E + "STRICT": "0"}  # nothing exported


@pytest.mark.parametrize(
    "name, words",
    [
        ("bad_force", ("--moe-plugins-force", "'silu_mul_quant'", "op=plugin")),
        ("bad_priority", ("--moe-plugins-priority", "'triton=high'", "integer")),
        ("bad_choice", ("--moe-plugins-masked-layout", "'fast'", "measured", "sglang")),
    ],
)
def test_a_malformed_value_is_a_parser_error_naming_flag_value_and_form(probe, name, words):
    case = probe[name]
    assert case.get("exit") == 2, case
    for word in words:
        assert word in case["stderr"], case["stderr"]
    assert case["env"] == {}


def _help(**env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--help"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(COLUMNS="120", **env),
    )


def test_launch_server_help_lists_the_group_unless_sglang_plugins_leaves_the_package_out():
    shown, hidden = _help(), _help(SGLANG_PLUGINS="some_other_plugin")  # two processes at once
    out, err = shown.communicate(timeout=900)
    out_hidden, err_hidden = hidden.communicate(timeout=900)
    assert shown.returncode == 0, err[-3000:]
    assert "\nsglang-moe-plugins:\n" in out, out[-3000:]
    for flag in FLAGS:
        assert flag in out
    assert "SGLANG_MOE_PLUGINS_STOCK" in out and "op=plugin" in out.lower()
    assert hidden.returncode == 0, err_hidden[-3000:]
    assert "--model-path" in out_hidden and "moe-plugins" not in out_hidden


def test_a_release_without_the_targets_logs_one_info_line_and_adds_nothing(monkeypatch, caplog):
    import sglang.srt.server_args as host
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_moe_plugins.integrations.sglang import server_args

    monkeypatch.setattr(server_args, "_registered", False)
    monkeypatch.delattr(host.ServerArgs, "from_cli_args")
    before = {t: list(HookRegistry._hooks.get(t, ())) for t in (ADD_CLI_ARGS, FROM_CLI_ARGS)}
    with caplog.at_level(logging.DEBUG, logger=server_args.__name__):
        server_args.register_server_args()
        server_args.register_server_args()  # once per process
    assert {t: list(HookRegistry._hooks.get(t, ())) for t in before} == before
    lines = [r for r in caplog.records if r.name == server_args.__name__]
    assert [r.levelno for r in lines] == [logging.INFO], [r.getMessage() for r in lines]
    assert "from_cli_args" in lines[0].getMessage() and "SGLANG_MOE_PLUGINS_" in lines[0].getMessage()


def test_the_entry_point_registers_the_hooks(probe):
    """The one line of ``entry.register()``: the package's entry point, run by ``load_plugins()``, registered both
    hooks (HookRegistry records the plugin that registered each)."""
    assert "moe_plugins" in probe["sources"][ADD_CLI_ARGS], probe["sources"]  # next to other plugins' flags
    assert "moe_plugins" in probe["sources"][FROM_CLI_ARGS], probe["sources"]
