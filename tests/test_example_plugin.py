"""The example third-party package (examples/sglang-moe-example-plugin), installed into the venv.

Shows, through the real CLI, entry points, configuration and selection: the example appears in
``list``; it is selected where its priority and supports() say so and skipped with its reason
elsewhere; disabling it by environment and by TOML file works; ``check`` passes on it; and the same
suite fails on deliberately broken copies (tests/broken_plugins.py, checked by path), naming each failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from numerics import check_against_fp64

from sglang_moe_plugins import api
from sglang_moe_plugins.catalog import get_model, silu_mul_quant_cases
from sglang_moe_plugins.cli import check as cli_check
from sglang_moe_plugins.core.dispatcher import Verdict
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import silu_mul_quant as smq

pytest.importorskip("sglang_moe_example_plugin", reason="pip install -e examples/sglang-moe-example-plugin")

HERE = os.path.dirname(__file__)
BROKEN = os.path.join(HERE, "broken_plugins.py")
BIN = os.path.dirname(sys.executable)
NAME = "example_torch"
OP = "silu_mul_quant"
CONFIG_VARS = ("SGLANG_MOE_PLUGINS_CONFIG", "SGLANG_MOE_PLUGINS_DISABLE", "SGLANG_MOE_PLUGINS_STRICT")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in CONFIG_VARS and not k.startswith("SGLANG_OPT_")}


@pytest.fixture
def selector_from_env(monkeypatch):
    """``build(env)`` -> the process-wide selector reloaded from that environment (restored afterwards)."""
    for var in CONFIG_VARS:
        monkeypatch.delenv(var, raising=False)

    def build(**env: str):
        return api.reload(env={**_clean_env(), **env})

    yield build
    api.reload(env=_clean_env())


def _cpu_call(group_size=128, swizzle=False, limit=None, layout="column_major"):
    """A real call's shape and config, built by the op's describe() from CPU tensors."""
    e, n, d = 4, 8, 512
    gen = torch.Generator().manual_seed(0)
    gateup = (torch.randn(e, n, 2 * d, generator=gen) * 4).to(torch.bfloat16)
    masked = torch.tensor([8, 0, 3, 5], dtype=torch.int32)
    shape, config = smq.describe(
        gateup, masked, group_size=group_size, topk=2, swiglu_limit=limit, swizzle=swizzle, scale_layout=layout
    )
    return gateup, masked, shape, config


def test_example_appears_in_list():
    result = subprocess.run(
        [os.path.join(BIN, "sglang-moe-plugins"), "list", "--json"],
        capture_output=True,
        text=True,
        env=_clean_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    example = plugins[NAME]
    assert example["op"] == OP and example["priority"] == 25 and example["enabled"]
    assert example["distribution"] == "sglang-moe-example-plugin"
    assert example["entry_point"] == f"{NAME} = sglang_moe_example_plugin:ExampleTorchPlugin"
    assert example["available_here"] == "yes" and example["options"] == {"chunk_experts": 0}
    assert plugins["reference"]["priority"] < example["priority"] < plugins["fp8_fallback"]["priority"]


def test_selected_by_priority_and_supports_skipped_with_its_reason_elsewhere(selector_from_env):
    selector = selector_from_env()
    # CPU: above reference (0); the CUDA plugins cannot run here.
    _, _, shape, config = _cpu_call()
    selection = selector.explain(OP, shape, config)
    assert selection.chosen.name == NAME, selection.explain()
    assert selection.candidate("reference").verdict == Verdict.OUTRANKED
    assert "vectorised torch" in selection.candidate(NAME).reason
    # Outside its supports(): skipped with its own reason; the reference takes the call.
    for kwargs, reason in (
        ({"group_size": 64}, "only group_size 128 (this call has group_size 64)"),
        ({"swizzle": True}, "not gran-8 swizzled input"),
    ):
        _, _, shape, config = _cpu_call(**kwargs)
        selection = selector.explain(OP, shape, config)
        assert selection.chosen.name == "reference"
        candidate = selection.candidate(NAME)
        assert candidate.verdict == Verdict.UNSUPPORTED and reason in candidate.reason
        assert reason in selection.explain()
    # A catalog call on sm90: every candidate above priority 25 that supports it comes first.
    case = silu_mul_quant_cases(get_model("Qwen3-30B-A3B"), ep=8, platform=Platform.cuda(9, 0))[0]
    selection = selector.explain(OP, case.shape, case.config)
    ours = selection.candidate(NAME)
    if selection.chosen.name == NAME:  # no plugin above it can run this call on this machine
        assert all(
            c.priority < 25 or c.verdict in (Verdict.UNSUPPORTED, Verdict.DISABLED)
            for c in selection.candidates
            if c.name != NAME
        ), selection.explain()
    else:
        assert ours.verdict == Verdict.OUTRANKED and selection.chosen.priority > 25


def test_priority_from_a_toml_file_puts_it_first(selector_from_env, tmp_path):
    path = tmp_path / "moe.toml"
    path.write_text(f"[priority]\n{NAME} = 500\n[options.{NAME}]\nchunk_experts = 2\n")
    selector = selector_from_env(SGLANG_MOE_PLUGINS_CONFIG=str(path))
    case = silu_mul_quant_cases(get_model("DeepSeek-V4-Flash"), ep=8, platform=Platform.cuda(9, 0))[0]
    selection = selector.explain(OP, case.shape, case.config)
    assert selection.chosen.name == NAME and selection.chosen.priority == 500
    record = selector.registry.get(NAME)
    assert "set by [priority]" in record.status and record.options["chunk_experts"] == 2
    # And it runs, through the public API, with the user's option applied (two experts at a time).
    gateup, masked, shape, config = _cpu_call(limit=10.0, layout="ue8m0_packed")
    out, scale = api.silu_mul_quant(
        gateup, masked, group_size=128, topk=2, swiglu_limit=10.0, scale_layout="ue8m0_packed"
    )
    assert api.select(OP, shape, config).chosen.name == NAME
    check_against_fp64(smq.SiluMulQuantInputs(gateup, masked), smq.SiluMulQuantOutputs(out, scale), shape, config)


@pytest.mark.parametrize("how", ["env", "toml"])
def test_disabling_it_by_config(selector_from_env, tmp_path, how):
    if how == "env":
        selector = selector_from_env(SGLANG_MOE_PLUGINS_DISABLE=NAME)
        why = "SGLANG_MOE_PLUGINS_DISABLE"
    else:
        path = tmp_path / "moe.toml"
        path.write_text(f'disable = ["{NAME}"]\n')
        selector = selector_from_env(SGLANG_MOE_PLUGINS_CONFIG=str(path))
        why = str(path)
    _, _, shape, config = _cpu_call()
    selection = selector.explain(OP, shape, config)
    assert selection.chosen.name == "reference"
    # Issue 18: a disabled third-party plugin is never imported: no candidate, listed as not loaded.
    assert NAME not in selector.registry and all(c.name != NAME for c in selection.candidates)
    (entry,) = [n for n in selector.registry.not_loaded if n.entry_point == NAME]
    assert why in entry.reason and entry.distribution == "sglang-moe-example-plugin"


def test_cli_check_passes_on_the_example():
    """``sglang-moe-plugins check example_torch`` through the real console script (or, until cli.py wires the
    command, the same parser run as ``python -m sglang_moe_plugins.cli.check``)."""
    from sglang_moe_plugins import cli

    wired = "check" in cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    args = [NAME, "--seed", "0", "--cases", "8", "--catalog-runs", "8", "--json", "--no-progress"]
    command = (
        [os.path.join(BIN, "sglang-moe-plugins"), "check"]
        if wired
        else [sys.executable, "-m", "sglang_moe_plugins.cli.check"]
    ) + args
    result = subprocess.run(command, capture_output=True, text=True, env=_clean_env(), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["status"] == "passed" and report["plugin"] == NAME and report["seed"] == 0
    assert report["cases_run"] >= 15 and report["cases_failed"] == 0 and report["cases_rejected"] > 0
    assert all(check["status"] == "passed" for check in report["checks"])
    assert any(case["status"] == "rejected" and "only group_size 128" in case["reason"] for case in report["cases"])


def test_cli_check_is_wired_into_the_main_cli():
    from sglang_moe_plugins import cli

    choices = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    if "check" not in choices:
        pytest.skip(
            "cli.py does not wire `check` yet: add `add_check_parser(sub)` "
            "(from sglang_moe_plugins.cli.check) in build_parser()"
        )
    assert cli.main(["check", NAME, "--seed", "1", "--cases", "2", "--catalog-runs", "2", "--no-progress"]) == 0


BROKEN_COPIES = [
    ("WrongScaleLayoutPlugin", "output_layout", "scale.stride()"),
    ("UnwrittenRowPlugin", "rows_written", "not written"),
    ("AcceptsThenCrashesPlugin", "run_no_crash", "supports() accepted the case"),
]


@pytest.mark.parametrize("cls, check, message", BROKEN_COPIES, ids=[b[0] for b in BROKEN_COPIES])
def test_check_fails_on_broken_copies_naming_the_failure(capsys, cls, check, message):
    target = f"{BROKEN}:{cls}"
    code = cli_check.main([target, "--seed", "0", "--cases", "4", "--catalog-runs", "4", "--json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert code == cli_check.EXIT_FAILED
    assert report["status"] == "failed" and report["failed_checks"] == [check]
    first = report["first_failure"]
    assert first["check"] == check and message in first["error"] and first["shape"].startswith("E=")
    # The text form names it too.
    assert cli_check.main([target, "--seed", "0", "--cases", "4", "--catalog-runs", "4", "--no-progress"]) == 1
    text = capsys.readouterr().out
    assert f"first failure: [{check}]" in text and "result: FAILED" in text and textwrap.dedent(message) in text


def test_check_exit_codes_for_unknown_targets_and_nothing_exercised(capsys):
    assert cli_check.main(["no_such_plugin", "--no-progress"]) == cli_check.EXIT_ERROR
    assert "no plugin named 'no_such_plugin'" in capsys.readouterr().err
    assert cli_check.main([NAME, "--device", "tpu:x", "--no-progress"]) == cli_check.EXIT_ERROR
    assert "invalid argument device='tpu:x'" in capsys.readouterr().err
    code = cli_check.main(["triton", "--device", "cpu", "--no-catalog", "--cases", "1", "--seed", "0", "--no-progress"])
    assert code == cli_check.EXIT_NOT_EXERCISED
    assert "NOT EXERCISED" in capsys.readouterr().out
