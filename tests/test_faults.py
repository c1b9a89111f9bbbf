"""Issue 7.2: faults injected through real entry points.

Each fault (tests/fault_plugins.py, tests/fault_missing_dep.py) is loaded through
``importlib.metadata.EntryPoint`` objects handed to ``Registry.discover`` in-process, and as a really
installed distribution (a ``moe_fault_plugins-0.1.dist-info`` in a temporary directory on a subprocess's
PYTHONPATH) that ``importlib.metadata.entry_points(group="sglang_moe_plugins.kernels")`` finds, read by
the real ``sglang-moe-plugins doctor`` CLI and by SGLang's real ``load_plugins()``.

For every fault: one clear log line, the rest keeps working (the call returns the reference's result),
``doctor`` shows it, and ``strict`` turns it into an error.
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
from importlib.metadata import EntryPoint

import pytest
import torch
from conftest import random_call
from fault_plugins import ENTRY_POINTS

from sglang_moe_plugins import (
    ConfigError,
    OutputValidationError,
    PluginValidationError,
    Registry,
    Selector,
    UserConfig,
    Verdict,
    api,
)
from sglang_moe_plugins.config import CONFIG_ENV, load_config, parse_config
from sglang_moe_plugins.core.registry import ENTRY_POINT_GROUP
from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference

TESTS = pathlib.Path(__file__).resolve().parent
REFERENCE_EP = EntryPoint(
    "reference", "sglang_moe_plugins.plugins.reference.silu_mul_quant:ReferencePlugin", ENTRY_POINT_GROUP
)
LOGGER = "sglang_moe_plugins"

#: Runtime faults: (plugin name, verdict after the first call, text of the log line, error under strict)
RUNTIME_FAULTS = [
    ("fault_supports", Verdict.ERROR, "supports() raised: RuntimeError: supports exploded", RuntimeError),
    ("fault_run", Verdict.FAILED, "RuntimeError: run exploded", RuntimeError),
    (
        "fault_wrong_shape",
        Verdict.FAILED,
        "returned out.shape=(4, 8, 128), the host requires (4, 8, 256)",
        OutputValidationError,
    ),
    ("fault_wrong_dtype", Verdict.FAILED, "returned out.dtype=torch.bfloat16", OutputValidationError),
    ("fault_wrong_layout", Verdict.FAILED, "returned scale.stride()=(16, 2, 1)", OutputValidationError),
]
#: Load faults: (entry point name, text of the problem)
LOAD_FAULTS = [
    ("fault_missing_dep", "ModuleNotFoundError: No module named 'fancy_kernels_not_installed'"),
    ("fault_missing_module", "ModuleNotFoundError: No module named 'moe_no_such_module_xyz'"),
]


def fault_ep(name: str) -> EntryPoint:
    return EntryPoint(name, ENTRY_POINTS[name], ENTRY_POINT_GROUP)


def reference_outputs(inputs, shape, config):
    outputs = smq.allocate_outputs(shape, config, torch.device("cpu"))
    silu_mul_quant_reference(inputs, outputs, shape, config)
    return outputs


def same_real_rows(a, b, inputs, shape) -> bool:
    real = smq.real_rows(inputs.masked_m, shape.max_rows)
    return torch.equal(a.out.view(torch.uint8)[real], b.out.view(torch.uint8)[real]) and torch.equal(
        a.scale[real], b.scale[real]
    )


#: The fault plugins' priorities (500 to 900) are above every built-in's: since issue 18 each is also named
#: once at WARNING when the registry is built; the fault counts below leave those lines out.
OUTRANKS = "above every built-in plugin"


def problem_records(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith(LOGGER) and r.levelno >= logging.WARNING and OUTRANKS not in r.getMessage()
    ]


# -- in-process, through EntryPoint objects ----------------------------------------------------------
@pytest.mark.parametrize("name, verdict, text, strict_error", RUNTIME_FAULTS, ids=[f[0] for f in RUNTIME_FAULTS])
def test_runtime_fault_logs_once_falls_back_and_strict_raises(name, verdict, text, strict_error, caplog):
    registry = Registry.discover(UserConfig(), [fault_ep(name), REFERENCE_EP])
    assert registry.names() == (name, "reference") and not registry.problems
    selector = Selector(registry)
    inputs, shape, config = random_call(e=4, n=8, d=256)
    want = reference_outputs(inputs, shape, config)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):  # the same key again: no new log line, the failed plugin is not retried
            got = selector.dispatch(smq.OP, inputs, shape, config)
            assert same_real_rows(got, want, inputs, shape)
    records = problem_records(caplog)
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].levelno == logging.ERROR and name in records[0].getMessage() and text in records[0].getMessage()
    sel = selector.explain(smq.OP, shape, config)
    assert sel.chosen.name == "reference" and sel.candidate(name).verdict == verdict
    if verdict == Verdict.FAILED:
        assert selector.failed_plugins() == {(smq.OP, shape, config): {name: sel.candidate(name).reason}}

    strict = Selector(Registry.discover(parse_config({"strict": True}), [fault_ep(name), REFERENCE_EP]))
    with pytest.raises(strict_error):
        strict.dispatch(smq.OP, inputs, shape, config)


def test_runtime_fault_logs_once_per_key(caplog):
    """The failure memory is per (op, shape, config): a new key tries the plugin again, one line each."""
    selector = Selector(Registry.discover(UserConfig(), [fault_ep("fault_run"), REFERENCE_EP]))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for e in (2, 3, 2, 3):
            inputs, shape, config = random_call(e=e)
            selector.dispatch(smq.OP, inputs, shape, config)
    assert len(problem_records(caplog)) == 2
    assert len(selector.failed_plugins()) == 2


@pytest.mark.parametrize("name, text", LOAD_FAULTS, ids=[f[0] for f in LOAD_FAULTS])
def test_load_fault_is_reported_once_and_strict_raises(name, text, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        registry = Registry.discover(UserConfig(), [fault_ep(name), REFERENCE_EP])
    assert registry.names() == ("reference",)
    (problem,) = registry.problems
    assert problem.entry_point == name and text in problem.error
    records = problem_records(caplog)
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert f"plugin entry point {name!r}" in records[0].getMessage() and text in records[0].getMessage()
    inputs, shape, config = random_call()
    got = Selector(registry).dispatch(smq.OP, inputs, shape, config)
    assert same_real_rows(got, reference_outputs(inputs, shape, config), inputs, shape)
    with pytest.raises(PluginValidationError, match=r"strict = true and 1 plugin\(s\) could not be registered") as info:
        Registry.discover(parse_config({"strict": True}), [fault_ep(name), REFERENCE_EP])
    assert name in str(info.value) and text in str(info.value)


def test_every_fault_at_once_the_reference_still_answers(caplog):
    eps = [fault_ep(n) for n in ENTRY_POINTS] + [REFERENCE_EP]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        selector = Selector(Registry.discover(UserConfig(), eps))
        inputs, shape, config = random_call(e=4, n=8, d=256)
        for _ in range(2):
            got = selector.dispatch(smq.OP, inputs, shape, config)
    assert same_real_rows(got, reference_outputs(inputs, shape, config), inputs, shape)
    verdicts = {c.name: c.verdict for c in selector.explain(smq.OP, shape, config).candidates}
    assert verdicts == {
        "fault_supports": Verdict.ERROR,
        "fault_run": Verdict.FAILED,
        "fault_wrong_shape": Verdict.FAILED,
        "fault_wrong_dtype": Verdict.FAILED,
        "fault_wrong_layout": Verdict.FAILED,
        "reference": Verdict.CHOSEN,
    }
    # 2 load problems + 1 supports error + 4 run/output failures: one line each.
    assert len(problem_records(caplog)) == 7
    # and each of the 5 fault plugins that loaded outranks the built-ins: named once each.
    assert sum(OUTRANKS in r.getMessage() for r in caplog.records) == 5


def test_config_syntax_error_is_one_clear_error_and_keeps_the_running_selector(tmp_path):
    bad = tmp_path / "moe.toml"
    bad.write_text('strict = true\ndisable = ["jit_ep"]\n[priority\nreference = 5\n')
    with pytest.raises(ConfigError, match=r"TOML syntax error: .*line 3") as info:
        load_config({CONFIG_ENV: str(bad)})
    assert str(bad) in str(info.value) and "\n" not in str(info.value)
    current = api.get_selector()
    with pytest.raises(ConfigError, match="TOML syntax error"):
        api.reload(env={CONFIG_ENV: str(bad)})
    assert api.get_selector() is current  # the process keeps the selector it had
    _, shape, config = random_call()
    assert api.select(smq.OP, shape, config).chosen is not None


# -- a really installed distribution, read by the real CLI and by SGLang -------------------------------
DIST = "moe-fault-plugins"


@pytest.fixture(scope="module")
def fault_site(tmp_path_factory) -> pathlib.Path:
    """A directory holding the faulty modules and ``moe_fault_plugins-0.1.dist-info`` declaring them."""
    site = tmp_path_factory.mktemp("fault_site")
    for module in ("fault_plugins.py", "fault_missing_dep.py"):
        shutil.copy(TESTS / module, site / module)
    info = site / "moe_fault_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n")
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{name} = {value}" for name, value in ENTRY_POINTS.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (info / "top_level.txt").write_text("fault_plugins\nfault_missing_dep\n")
    return site


def _env(site: pathlib.Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    # This checkout first (the subprocess runs elsewhere, and an editable install may point at another one).
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent)] + ([str(site)] if site is not None else []))
    env.update(extra)
    return env


def doctor(site, *args: str, **env: str) -> subprocess.CompletedProcess:
    exe = pathlib.Path(sys.executable).with_name("sglang-moe-plugins")
    return subprocess.run(
        [str(exe), "doctor", "--no-hooks", "--json", *args],
        capture_output=True,
        text=True,
        env=_env(site, **env),
        timeout=180,
        cwd=site or TESTS,
    )


def test_installed_fault_distribution_is_found_by_importlib_metadata(fault_site):
    code = (
        "import json; from importlib.metadata import entry_points; "
        f"print(json.dumps(sorted((e.name, e.value, e.dist.name) for e in entry_points(group='{ENTRY_POINT_GROUP}'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(fault_site), timeout=60)
    found = {name: (value, dist) for name, value, dist in json.loads(out.stdout)}
    for name, value in ENTRY_POINTS.items():
        assert found[name] == (value, DIST)
    assert found["reference"][1] == "sglang-moe-plugins"


def test_doctor_shows_every_fault_of_an_installed_distribution(fault_site):
    result = doctor(fault_site)
    assert result.returncode == 1, result.stderr[-3000:]  # issue 20: a listed problem exits 1
    report = json.loads(result.stdout)
    problems = "\n".join(report["problems"])
    for name, text in LOAD_FAULTS:
        assert f"plugin entry point {name!r} ({ENTRY_POINTS[name]}, from {DIST}) skipped: {text}" in problems
    assert (
        "plugin 'fault_supports' self-check: supports(E=2 N=4 D=512 group=128 topk=1) raised RuntimeError: supports exploded"
        in problems
    )
    assert (
        "plugin 'fault_run' self-check: run() on the probe call (E=2 N=4 D=512 group=128 topk=1) failed: RuntimeError: run exploded"
        in problems
    )
    for name, what in (
        ("fault_wrong_shape", "out.shape"),
        ("fault_wrong_dtype", "out.dtype"),
        ("fault_wrong_layout", "scale.stride()"),
    ):
        assert (
            f"plugin {name!r} self-check: run() on the probe call" in problems
            and f"OutputValidationError: plugin {name!r} returned {what}" in problems
        )
    assert len(report["problems"]) == 7
    states = {row["plugin"]: row["state"] for row in report["self check"]}
    assert states["reference"] == "ok"
    # strict: the registry refuses to build; doctor says so and exits 1 (--strict-exit is accepted).
    strict = doctor(fault_site, "--strict-exit", SGLANG_MOE_PLUGINS_STRICT="1")
    assert strict.returncode == 1
    (problem,) = json.loads(strict.stdout)["problems"]
    assert problem.startswith("plugin registry error: strict = true and 2 plugin(s) could not be registered")
    assert "fault_missing_dep" in problem and "fault_missing_module" in problem


def test_doctor_shows_a_config_syntax_error(tmp_path):
    bad = tmp_path / "moe.toml"
    bad.write_text("[priority\nreference = 5\n")
    result = doctor(None, "--strict-exit", SGLANG_MOE_PLUGINS_CONFIG=str(bad))
    assert result.returncode == 1
    (problem,) = json.loads(result.stdout)["problems"]
    assert problem.startswith(f"configuration error: SGLANG_MOE_PLUGINS_CONFIG='{bad}': TOML syntax error")


SGLANG_PROBE = """
    import json, logging, sys
    import torch
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            if (record.levelno >= logging.WARNING and "moe" in record.getMessage() + record.name
                    and "above every built-in plugin" not in record.getMessage()):
                records.append(record.getMessage().splitlines()[0])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger().addHandler(Keep())
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    load_plugins()
    patched = sorted(t for t in HookRegistry._patched if "moe" in t)
    result = {"patched": patched, "records_after_load": list(records)}
    if patched:
        from sglang_moe_plugins.ops import silu_mul_quant as smq
        from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference
        gen = torch.Generator().manual_seed(0)
        gateup = (torch.randn(4, 8, 512, generator=gen) * 3).to(torch.bfloat16)
        masked = torch.tensor([8, 0, 5, 2], dtype=torch.int32)
        result["errors"] = []
        for _ in range(2):
            try:
                out, scale = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
            except Exception as exc:
                result["errors"].append(f"{type(exc).__name__}: {exc}")
        if not result["errors"]:
            shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
            want = smq.allocate_outputs(shape, config, gateup.device)
            silu_mul_quant_reference(smq.SiluMulQuantInputs(gateup, masked), want, shape, config)
            real = smq.real_rows(masked, 8)
            result["match"] = bool(torch.equal(out.view(torch.uint8)[real], want.out.view(torch.uint8)[real])
                                   and torch.equal(scale[real], want.scale[real]))
            from sglang_moe_plugins import api
            sel = api.get_selector().explain(smq.OP, shape, config)
            result["verdicts"] = {c.name: c.verdict for c in sel.candidates}
    result["records"] = records
    print("RESULT " + json.dumps(result))
"""


def _sglang_probe(site, **env) -> dict:
    pytest.importorskip("sglang")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SGLANG_PROBE)],
        capture_output=True,
        text=True,
        env=_env(site, **env),
        timeout=300,
        cwd=site,
    )
    line = next((line for line in proc.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    return json.loads(line[len("RESULT ") :]) | {"stderr": proc.stderr}


@pytest.mark.sglang
def test_sglang_with_the_fault_distribution_keeps_working(fault_site):
    result = _sglang_probe(fault_site)
    assert any(t.endswith("_varlen_deep_gemm_silu_mul_quant") for t in result["patched"])
    assert result["match"]
    verdicts = result["verdicts"]
    assert verdicts["fault_supports"] == "error" and verdicts["reference"] in ("chosen", "outranked")
    assert all(
        verdicts[n] == "failed" for n in ("fault_run", "fault_wrong_shape", "fault_wrong_dtype", "fault_wrong_layout")
    )
    lines = result["records"]
    # One line per fault: 2 load problems when the registry is built in load_plugins(), then 1 supports
    # error and 4 run failures on the first call; the second call adds nothing.
    assert len(result["records_after_load"]) == 2
    assert len(lines) == 7, lines
    for name in ENTRY_POINTS:
        assert sum(name in line for line in lines) == 1, (name, lines)


@pytest.mark.sglang
def test_sglang_with_the_fault_distribution_under_strict(fault_site):
    """strict: the registry refuses to build; register() fails closed: the hooks are installed and every
    hooked call raises the PluginValidationError (SGLang never runs its own code in their place)."""
    result = _sglang_probe(fault_site, SGLANG_MOE_PLUGINS_STRICT="1")
    assert any(t.endswith("_varlen_deep_gemm_silu_mul_quant") for t in result["patched"]), result["stderr"][-3000:]
    assert len(result["errors"]) == 2
    for error in result["errors"]:
        assert error.startswith("PluginValidationError: strict = true and 2 plugin(s) could not be registered")
        assert "fault_missing_dep" in error and "fault_missing_module" in error
    assert (
        "failing closed: the hooks are installed and every hooked call raises this PluginValidationError"
        in result["stderr"]
    )
