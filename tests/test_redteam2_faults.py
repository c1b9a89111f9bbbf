"""Issue #30, findings 4, 5 and 6: faults inside a plugin's run, through SGLang's real ``load_plugins()`` and its
hooked functions (in this process, and in a subprocess where the faulty plugins are an installed distribution),
and through the conformance kit.

4. A plugin's ``writes_inputs`` is not taken on trust: a declaration naming an input the op does not let a host
   mark writable is refused when the plugin registers (static) or read as "may write everything" (per call); a
   third-party declaration counts only once a call of the key that marked the inputs writable showed it true
   (the writable inputs are compared before and after the key's first such call); a plugin seen writing an
   input it did not declare is never trusted again. The kit compares every input before and after every run.
5. Outputs on another device than the call's inputs are an error: on a key's first call, on every call under
   strict, and on every call where a launch returns its own outputs object (silu_mul_quant,
   silu_mul_quant_contig, mega_moe).
6. ``SystemExit`` from a plugin is a fault of that plugin, as at start-up; ``KeyboardInterrupt`` passes through.
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
import torch

pytest.importorskip("sglang")

from contig_host import compact_runner, make_layer, run_layer  # noqa: F401 - compact_runner: fixture
from sglang_session import (  # noqa: F401 - runner, default_selector: the shared fixtures
    MEGA_REFERENCE,
    REFERENCE,
    default_selector,
    ep,
    hooked_targets,
    require_mega_target,
    runner,
)

from sglang_moe_plugins import MoEPluginsError, OutputValidationError, UserConfig, api
from sglang_moe_plugins.config import parse_config
from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference

pytestmark = pytest.mark.sglang
LOGGER = "sglang_moe_plugins"
TESTS = pathlib.Path(__file__).resolve().parent
CONTIG_REFERENCE = ep(
    "contig_reference", "sglang_moe_plugins.plugins.reference.silu_mul_quant_contig:ContigReferencePlugin"
)
CONTIG_RUNNER = "sglang.srt.layers.moe.moe_runner.deep_gemm.DeepGemmRunnerCore._run_contiguous_gemm"


def rt2(name: str, cls: str):
    return ep(name, f"rt2_fault_plugins:{cls}")


def data(e=4, n=8, d=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gateup = (torch.randn(e, n, 2 * d, generator=gen) * 3).to(torch.bfloat16)
    masked = torch.tensor([n, 3, 0, n - 1][:e], dtype=torch.int32)
    return gateup, masked


def expected(gateup, masked):
    """The reference outputs on an untouched copy of ``gateup``, and the real rows."""
    shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
    outputs = smq.allocate_outputs(shape, config, gateup.device)
    silu_mul_quant_reference(smq.SiluMulQuantInputs(gateup.clone(), masked), outputs, shape, config)
    return outputs, smq.real_rows(masked, shape.max_rows)


def right(out, scale, gateup, masked) -> bool:
    want, mask = expected(gateup, masked)
    return (
        out.device == gateup.device
        and torch.equal(out[mask].view(torch.uint8), want.out[mask].view(torch.uint8))
        and torch.equal(scale.float()[mask], want.scale.float()[mask])
    )


def hooked(runner_module, seed):
    """One hooked call on fresh data: ``(gateup as passed, masked, pristine copy, result or exception)``."""
    gateup, masked = data(seed=seed)
    pristine = gateup.clone()
    try:
        return masked, pristine, runner_module._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    except Exception as exc:  # noqa: BLE001 - the test looks at it
        return masked, pristine, exc


def notes(exc: BaseException) -> str:
    return " ".join(getattr(exc, "__notes__", []))


def chosen(seed=0) -> str:
    gateup, masked = data(seed=seed)
    shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
    return api.get_selector().explain(smq.OP, shape, config).chosen.name


def errors_naming(caplog, plugin: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and plugin in r.getMessage()]


# -- finding 4: a misdeclared writes_inputs -------------------------------------------------------------
def test_f4_an_undeclared_write_then_a_failure_raises_instead_of_a_wrong_fallback(runner, caplog):
    """Declares it writes nothing, writes gateup, raises: the reference must not run on the damaged gateup."""
    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_lies", "LiesAboutWrites"), REFERENCE])
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        masked, pristine, result = hooked(runner, 0)
    assert isinstance(result, RuntimeError), f"the call returned {type(result).__name__}, not the plugin's error"
    text = notes(result)
    assert "plugin 'rt2_fault_lies'" in text and "no fallback: it may have modified the input gateup" in text
    assert "it changed gateup on this call, which its writes_inputs leaves out" in text
    (line,) = errors_naming(caplog, "rt2_fault_lies")
    assert "this call raises" in line
    # Excluded for the key: the next call, on a fresh workspace, runs the reference.
    masked, pristine, (out, scale) = hooked(runner, 1)
    assert right(out, scale, pristine, masked) and chosen() == "reference"


def test_f4_a_static_declaration_naming_no_writable_input_is_refused_at_registration(runner):
    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_misnamed", "MisnamedWrites"), REFERENCE])
    registry = api.get_selector().registry
    (problem,) = [p.describe() for p in registry.problems if p.entry_point == "rt2_fault_misnamed"]
    assert "writes_inputs=('gateup_output',)" in problem and "'gateup_output'" in problem and "('gateup',)" in problem
    masked, pristine, result = hooked(runner, 2)
    assert not isinstance(result, Exception), result
    assert right(*result, pristine, masked) and chosen() == "reference"


def test_f4_a_per_call_declaration_naming_no_writable_input_means_it_may_write_everything(runner):
    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_misnamed_call", "MisnamedWritesPerCall"), REFERENCE])
    masked, pristine, result = hooked(runner, 3)
    assert isinstance(result, RuntimeError), f"the call returned {type(result).__name__}, not the plugin's error"
    assert "no fallback: it may have modified the input gateup" in notes(result)
    masked, pristine, (out, scale) = hooked(runner, 4)
    assert right(out, scale, pristine, masked)


def test_f4_an_undeclared_write_on_a_successful_call_withdraws_the_trust(runner, caplog):
    """Right on its first call but writes gateup there, undeclared: logged, and its declaration no longer
    counts; its failure on the next call (after writing gateup again) raises instead of falling back."""
    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_writes_later", "WritesThenFailsLater"), REFERENCE])
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        masked, pristine, first = hooked(runner, 5)
        assert not isinstance(first, Exception), first
        assert right(*first, pristine, masked)
        (line,) = errors_naming(caplog, "rt2_fault_writes_later")
        assert "gateup" in line and "writes_inputs" in line
        masked, pristine, second = hooked(runner, 6)
    assert isinstance(second, RuntimeError), f"the call returned {type(second).__name__}, not the plugin's error"
    assert "no fallback: it may have modified the input gateup" in notes(second)
    masked, pristine, (out, scale) = hooked(runner, 7)
    assert right(out, scale, pristine, masked)


def test_f4_a_declaration_shown_true_on_the_first_writable_call_keeps_the_fallback(runner):
    """A third party that left gateup alone on the key's first hooked call falls back on a later failure."""
    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_fails_later", "FailsLater"), REFERENCE])
    masked, pristine, first = hooked(runner, 8)
    assert right(*first, pristine, masked)
    masked, pristine, second = hooked(runner, 9)
    assert not isinstance(second, Exception), second
    assert right(*second, pristine, masked) and chosen() == "reference"


def test_f4_a_declaration_never_checked_on_a_writable_call_is_not_trusted(runner):
    """The key's first call came through the public API (gateup not writable): nothing showed the declaration
    true, so the hooked call that fails after it raises (the plugin may have written gateup)."""
    import sglang_moe_plugins as smp

    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_fails_later", "FailsLater"), REFERENCE])
    gateup, masked = data(seed=10)
    smp.silu_mul_quant(gateup, masked, group_size=128, topk=2)
    _, _, second = hooked(runner, 11)
    assert isinstance(second, RuntimeError), f"the call returned {type(second).__name__}, not the plugin's error"
    assert "rt2_fault_fails_later" in notes(second) and "not verified" in notes(second)


def test_f4_builtin_declarations_are_trusted_without_a_snapshot(runner, monkeypatch):
    """The warm path and the built-ins' first calls copy nothing: only a third party's first writable call."""
    clones = []
    original = torch.Tensor.clone

    def counting(self, *args, **kwargs):
        clones.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    api.reload(UserConfig(), entry_points=[REFERENCE])
    gateup, masked = data(seed=12)
    monkeypatch.setattr(torch.Tensor, "clone", counting)
    runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    assert tuple(gateup.shape) not in clones


# -- finding 5: outputs on another device ----------------------------------------------------------------
@pytest.mark.parametrize("cls", ["MetaOutputs", "MetaOutputsLater"])
def test_f5_smq_outputs_on_another_device_fall_back_by_default(runner, caplog, cls):
    name = "rt2_fault_meta" if cls == "MetaOutputs" else "rt2_fault_meta_later"
    api.reload(UserConfig(), entry_points=[rt2(name, cls), REFERENCE])
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for seed in (20, 21, 22):
            masked, pristine, result = hooked(runner, seed)
            assert not isinstance(result, Exception), result
            out, scale = result
            assert out.device.type == "cpu" and scale.device.type == "cpu", (out.device, scale.device)
            assert right(out, scale, pristine, masked)
    (line,) = errors_naming(caplog, name)
    assert "out.device=meta" in line and "OutputValidationError" in line


@pytest.mark.parametrize("cls", ["MetaOutputs", "MetaOutputsLater"])
def test_f5_smq_outputs_on_another_device_raise_under_strict(runner, cls):
    name = "rt2_fault_meta" if cls == "MetaOutputs" else "rt2_fault_meta_later"
    api.reload(parse_config({"strict": True}), entry_points=[rt2(name, cls), REFERENCE])
    if cls == "MetaOutputsLater":
        hooked(runner, 23)
    for seed in (24, 25):
        _, _, result = hooked(runner, seed)
        assert isinstance(result, OutputValidationError), result
        assert f"plugin {name!r} returned out.device=meta" in str(result)


def _contig_ready() -> None:
    if CONTIG_RUNNER not in hooked_targets():
        pytest.skip("this SGLang release has no compact-runner hook (0.5.20 and later)")


def _contig_expected(gateup):
    from sglang_moe_plugins.ops.silu_mul_quant_contig import ContigConfig, ContigInputs, ContigShape, allocate_outputs
    from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import silu_mul_quant_contig_reference

    shape, config = ContigShape(gateup.shape[1] // 2, 128), ContigConfig()
    outputs = allocate_outputs(shape, config, gateup.device, rows=gateup.shape[0])
    silu_mul_quant_contig_reference(ContigInputs(gateup.clone()), outputs, shape, config)
    return outputs


@pytest.mark.parametrize("cls", ["ContigMetaOutputs", "ContigMetaOutputsLater"])
def test_f5_contig_outputs_on_another_device_fall_back_by_default(compact_runner, cls):
    """SGLang's compact runner reads its own buffers: a plugin's own outputs on another device are an error, and
    the fallback writes SGLang's buffers, which reach the down GEMM."""
    _contig_ready()
    name = "rt2_fault_contig_meta" if cls == "ContigMetaOutputs" else "rt2_fault_contig_meta_later"
    api.reload(UserConfig(), entry_points=[rt2(name, cls), CONTIG_REFERENCE])
    for seed in (30, 31, 32):
        compact_runner.calls.clear()
        run_layer(make_layer(rows=13, seed=seed))
        first, second = compact_runner.calls
        want = _contig_expected(first["out"])
        assert torch.equal(second["a"].view(torch.uint8), want.out.view(torch.uint8)), seed
        assert torch.equal(second["a_scale"], want.scale)


@pytest.mark.parametrize("cls", ["ContigMetaOutputs", "ContigMetaOutputsLater"])
def test_f5_contig_outputs_on_another_device_raise_under_strict(compact_runner, cls):
    _contig_ready()
    name = "rt2_fault_contig_meta" if cls == "ContigMetaOutputs" else "rt2_fault_contig_meta_later"
    api.reload(parse_config({"strict": True}), entry_points=[rt2(name, cls), CONTIG_REFERENCE])
    if cls == "ContigMetaOutputsLater":
        run_layer(make_layer(rows=13, seed=33))
    with pytest.raises(OutputValidationError, match=rf"plugin {name!r} returned out.device=meta"):
        run_layer(make_layer(rows=13, seed=34))


def _mega(problem):
    import sglang.srt.layers.moe.mega_moe as host
    from test_failure_policy import _mega_call

    return _mega_call(host, problem)


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@pytest.mark.parametrize("cls", ["MegaMetaOutputs", "MegaMetaOutputsLater"])
def test_f5_mega_outputs_on_another_device_raise(runner, cls, strict):
    """mega_moe is collective: the error is raised on that rank, by default and under strict."""
    require_mega_target()
    from _mega_cases import make_problem

    name = "rt2_fault_mega_meta" if cls == "MegaMetaOutputs" else "rt2_fault_mega_meta_later"
    api.reload(parse_config({"strict": strict}), entry_points=[rt2(name, cls), MEGA_REFERENCE])
    problem = make_problem("fp8xfp4", seed=9)
    if cls == "MegaMetaOutputsLater":
        assert _mega(problem).device.type == "cpu"
    for _ in range(2):
        with pytest.raises(OutputValidationError, match=rf"plugin {name!r} returned y.device=meta") as info:
            _mega(problem)
        assert any("collective" in n for n in info.value.__notes__)


# -- finding 6: SystemExit from a plugin ---------------------------------------------------------------------
def test_f6_system_exit_from_run_is_a_plugin_fault_that_falls_back(runner, caplog):
    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_sysexit", "SystemExitInRun"), REFERENCE])
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for seed in (40, 41):
            try:
                masked, pristine, result = hooked(runner, seed)
            except SystemExit as exc:  # the finding: it must not leave the hooked call
                pytest.fail(f"SystemExit({exc.code}) left the hooked call")
            assert not isinstance(result, Exception), result
            assert right(*result, pristine, masked)
    (line,) = errors_naming(caplog, "rt2_fault_sysexit")
    assert "SystemExit" in line and "falling back" in line
    assert chosen() == "reference"


def test_f6_system_exit_from_prepare_is_a_plugin_fault_that_falls_back(runner):
    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_sysexit_prepare", "SystemExitInPrepare"), REFERENCE])
    try:
        masked, pristine, result = hooked(runner, 42)
    except SystemExit as exc:
        pytest.fail(f"SystemExit({exc.code}) left the hooked call")
    assert right(*result, pristine, masked)


def test_f6_system_exit_under_strict_raises_an_error_naming_the_plugin(runner):
    api.reload(parse_config({"strict": True}), entry_points=[rt2("rt2_fault_sysexit", "SystemExitInRun"), REFERENCE])
    try:
        _, _, result = hooked(runner, 43)
    except SystemExit as exc:
        pytest.fail(f"SystemExit({exc.code}) left the hooked call")
    assert isinstance(result, MoEPluginsError), result
    assert "plugin 'rt2_fault_sysexit' raised SystemExit(3)" in str(result)
    assert isinstance(result.__cause__, SystemExit) and "strict = true" in notes(result)


def test_f6_system_exit_from_a_mega_plugin_raises_an_error_naming_the_plugin(runner):
    require_mega_target()
    from _mega_cases import make_problem

    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_mega_sysexit", "MegaSystemExit"), MEGA_REFERENCE])
    try:
        with pytest.raises(MoEPluginsError, match=r"plugin 'rt2_fault_mega_sysexit' raised SystemExit\(5\)") as info:
            _mega(make_problem("fp8xfp4", seed=10))
    except SystemExit as exc:
        pytest.fail(f"SystemExit({exc.code}) left the hooked call")
    assert any("collective" in n for n in info.value.__notes__)


def test_f6_keyboard_interrupt_passes_through_and_excludes_nothing(runner):
    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_interrupt", "KeyboardInterruptInRun"), REFERENCE])
    gateup, masked = data(seed=44)
    with pytest.raises(KeyboardInterrupt):
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    assert api.get_selector().failed_plugins() == {} and chosen(44) == "rt2_fault_interrupt"


# -- the conformance kit ----------------------------------------------------------------------------------------
def test_kit_fails_a_plugin_that_writes_an_input_it_does_not_declare():
    from sglang_moe_plugins.testing import run_conformance

    report = run_conformance(
        f"{TESTS / 'rt2_fault_plugins.py'}:WritesWhenAllowed", seed=0, catalog=False, random_cases=2
    )
    check = report.check("inputs_unchanged")
    assert check.status == "failed", report
    error = check.first_failure.error
    assert "gateup" in error and "writes_inputs" in error and "rt2_fault_kit_writes" in error


def test_kit_fails_outputs_on_another_device():
    from sglang_moe_plugins.testing import run_conformance

    report = run_conformance(f"{TESTS / 'rt2_fault_plugins.py'}:MetaOutputs", seed=0, catalog=False, random_cases=2)
    check = report.check("output_layout")
    assert check.status == "failed" and "out.device=meta" in check.first_failure.error, report


def test_kit_passes_the_reference_and_a_declared_write():
    """The input comparison passes plugins that write what they declare (fp8_fallback's kind) and the reference."""
    from sglang_moe_plugins.plugins.reference import ReferencePlugin
    from sglang_moe_plugins.testing import run_conformance

    class DeclaresGateup(ReferencePlugin):
        name = "rt2_declares_gateup"
        writes_inputs = frozenset({"gateup"})

        def run(self, inputs, outputs, shape, config):
            super().run(inputs, outputs, shape, config)
            if inputs.gateup_writable:
                inputs.gateup.fill_(7.0)

    for plugin in (ReferencePlugin(), DeclaresGateup()):
        report = run_conformance(plugin, seed=0, catalog=False, random_cases=2)
        assert report.check("inputs_unchanged").status == "passed", report


# -- the same through an installed distribution, in a fresh SGLang process -----------------------------------
DIST = "moe-rt2-fault-plugins"

PROBE = """
    import json, logging, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from sglang.srt.plugins import load_plugins
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    load_plugins()
    from sglang_moe_plugins import api
    from sglang_moe_plugins.config import parse_config
    from sglang_moe_plugins.ops import silu_mul_quant as smq
    from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference
    ALL = NAMES
    result = {"problems": [p.describe() for p in api.get_selector().registry.problems]}

    def data(seed):
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(4, 8, 512, generator=gen) * 3).to(torch.bfloat16), torch.tensor([8, 3, 0, 7], dtype=torch.int32)

    def right(out, scale, gateup, masked):
        shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
        want = smq.allocate_outputs(shape, config, gateup.device)
        silu_mul_quant_reference(smq.SiluMulQuantInputs(gateup, masked), want, shape, config)
        real = smq.real_rows(masked, 8)
        return (out.device == gateup.device and torch.equal(out.view(torch.uint8)[real], want.out.view(torch.uint8)[real])
                and torch.equal(scale[real], want.scale[real]))

    for only in ALL:
        for strict in (False, True):
            calls = result[f"{only} strict={strict}"] = []
            try:  # the other rt2 plugins disabled; no other third party (an installed example plugin) imported
                api.reload(parse_config({"strict": strict, "allow": ALL, "disable": [n for n in ALL if n != only]}))
            except Exception as exc:
                calls.append(f"reload: {type(exc).__name__}: {exc}")
                continue
            for seed in range(3):
                gateup, masked = data(seed)
                pristine = gateup.clone()
                try:
                    out, scale = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
                    calls.append("right" if right(out, scale, pristine, masked) else f"WRONG on {out.device}")
                except BaseException as exc:
                    calls.append(f"{type(exc).__name__}: {exc} | " + " ".join(getattr(exc, "__notes__", [])))
    print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    """The probe's outcome: SGLang's ``load_plugins()`` finds ``moe-rt2-fault-plugins`` through
    ``importlib.metadata``; each faulty plugin runs alone (the others disabled), by default and under strict,
    three hooked calls each."""
    from rt2_fault_plugins import ENTRY_POINTS

    from sglang_moe_plugins.core.registry import ENTRY_POINT_GROUP

    site = tmp_path_factory.mktemp("rt2_fault_site")
    shutil.copy(TESTS / "rt2_fault_plugins.py", site / "rt2_fault_plugins.py")
    info = site / "moe_rt2_fault_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n")
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{name} = {value}" for name, value in ENTRY_POINTS.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (info / "top_level.txt").write_text("rt2_fault_plugins\n")
    import sglang_moe_plugins

    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    # The package this process tests first (this checkout, unless PYTHONPATH names another tree).
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(sglang_moe_plugins.__file__).parents[1]), str(site)])
    code = textwrap.dedent(PROBE).replace("NAMES", repr(sorted(ENTRY_POINTS)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, cwd=site)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"exit status {proc.returncode}: {proc.stderr[-4000:]}"
    return json.loads(line[len("RESULT ") :])


def test_probe_f4_undeclared_write(probe):
    first, *rest = probe["rt2_fault_lies strict=False"]
    assert first.startswith("RuntimeError: rt2 kernel failed after scaling gateup in place")
    assert "no fallback: it may have modified the input gateup" in first
    assert rest == ["right", "right"]
    assert all(c.startswith("RuntimeError") for c in probe["rt2_fault_lies strict=True"])


def test_probe_f4_misnamed_declaration_is_refused_at_start_up(probe):
    (problem,) = [p for p in probe["problems"] if "rt2_fault_misnamed" in p]
    assert f"from {DIST}" in problem and "writes_inputs=('gateup_output',)" in problem
    assert probe["rt2_fault_misnamed strict=False"] == ["right"] * 3
    (strict,) = probe["rt2_fault_misnamed strict=True"]  # strict: the registry refuses to build
    assert strict.startswith("reload: PluginValidationError: strict = true and 1 plugin(s) could not be registered")


@pytest.mark.parametrize("name", ["rt2_fault_meta", "rt2_fault_meta_later"])
def test_probe_f5_outputs_on_another_device(probe, name):
    assert probe[f"{name} strict=False"] == ["right"] * 3
    calls = probe[f"{name} strict=True"]
    failing = calls if name == "rt2_fault_meta" else calls[1:]
    assert all(c.startswith(f"OutputValidationError: plugin {name!r} returned out.device=meta") for c in failing)


def test_probe_f6_system_exit(probe):
    assert probe["rt2_fault_sysexit strict=False"] == ["right"] * 3
    for call in probe["rt2_fault_sysexit strict=True"]:
        assert call.startswith("MoEPluginsError: plugin 'rt2_fault_sysexit' raised SystemExit(3)")


def test_contig_outputs_of_a_plugins_own_reach_sglangs_buffers(compact_runner):
    """A plugin that returns outputs of its own (right device, right values) instead of filling SGLang's buffers:
    the hook copies them into SGLang's buffers, which the down GEMM reads (they were left unwritten before)."""
    _contig_ready()
    api.reload(UserConfig(), entry_points=[rt2("rt2_fault_contig_own", "ContigOwnOutputs")])
    for seed in (40, 41):
        compact_runner.calls.clear()
        run_layer(make_layer(rows=13, seed=seed))
        first, second = compact_runner.calls
        want = _contig_expected(first["out"])
        assert torch.equal(second["a"].view(torch.uint8), want.out.view(torch.uint8)), seed
        assert torch.equal(second["a_scale"], want.scale)
