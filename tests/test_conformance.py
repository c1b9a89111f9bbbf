"""The conformance suite (sglang_moe_plugins.testing): case generation, checks, report, pytest plugin.

Runs on CPU. Every suite run here uses a fixed seed and a reduced case budget to stay fast.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numerics
import pytest
import torch

from sglang_moe_plugins import Plugin, Support
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import OPS, silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import ReferencePlugin, silu_mul_quant_reference
from sglang_moe_plugins.testing import (
    BF16_INTERMEDIATES,
    CHECKS,
    STRICT,
    ConformanceFailure,
    PluginLoadError,
    SuiteOptions,
    ToleranceError,
    check_against_fp64,
    conformance_for,
    load_plugin,
    run_conformance,
    tolerance_for,
)
from sglang_moe_plugins.testing.ops import silu_mul_quant as tolerance
from sglang_moe_plugins.testing.ops.silu_mul_quant_cases import MASKED_PATTERNS, masked_pattern
from sglang_moe_plugins.testing.report import FAILED, NOT_EXERCISED, PASSED

HERE = os.path.dirname(__file__)
BROKEN = os.path.join(HERE, "broken_plugins.py")
#: A small but complete draw: one catalog model at EP 1 and 8, every edge case, a few random cases.
SMALL = dict(seed=0, models=("Qwen3-30B-A3B",), eps=(1, 8), max_catalog_runs=2, random_cases=3)

# -- tolerance policy: one source ---------------------------------------------------------------------


def test_tests_numerics_reexports_the_package_policy():
    from sglang_moe_plugins.testing import case

    for module, name in (
        (tolerance, "fp64_expected"),
        (tolerance, "check_against_fp64"),
        (case, "poison"),
        (case, "POISON_FP8"),
    ):
        assert getattr(numerics, name) is getattr(module, name)


def _reference_outputs(seed=0, layout="column_major", limit=None, keep_fp32=False):
    gen = torch.Generator().manual_seed(seed)
    shape = smq.SiluMulQuantShape(3, 6, 384, 128, 2)
    config = smq.SiluMulQuantConfig(Platform.cpu(), swiglu_limit=limit, scale_layout=layout, keep_fp32=keep_fp32)
    masked = masked_pattern("ragged", 3, 6, 2, gen)
    from sglang_moe_plugins.testing.ops.silu_mul_quant_cases import make_gateup

    inputs = smq.SiluMulQuantInputs(make_gateup(shape, masked, gen), masked)
    outputs = smq.allocate_outputs(shape, config, torch.device("cpu"))
    numerics.poison(outputs)
    silu_mul_quant_reference(inputs, outputs, shape, config)
    return inputs, outputs, shape, config


@pytest.mark.parametrize("layout", smq.SCALE_LAYOUTS)
def test_policy_accepts_the_reference_and_rejects_perturbations(layout):
    inputs, outputs, shape, config = _reference_outputs(layout=layout, limit=7.3)
    check_against_fp64(inputs, outputs, shape, config)  # strict policy, limit not exact in bf16
    real = smq.real_rows(inputs.masked_m, shape.max_rows)
    e, r = (int(i) for i in real.nonzero()[0])
    if layout == "ue8m0_packed":
        outputs.scale[e, r, 0] += 1  # one exponent one binade off
        message = "UE8M0 scale"
    else:
        outputs.scale[e, r, 0] *= 1.0001
        message = "fp32 scale"
    with pytest.raises(ToleranceError, match=message):
        check_against_fp64(inputs, outputs, shape, config)
    with pytest.raises(AssertionError):  # ToleranceError is an AssertionError for pytest
        check_against_fp64(inputs, outputs, shape, config)


def test_policy_names_an_unwritten_row_and_a_wrong_value():
    inputs, outputs, shape, config = _reference_outputs()
    real = smq.real_rows(inputs.masked_m, shape.max_rows)
    e, r = (int(i) for i in real.nonzero()[-1])
    saved = outputs.out[e, r].clone()
    outputs.out[e, r].view(torch.uint8).fill_(numerics.POISON_FP8)
    with pytest.raises(ToleranceError, match=rf"real row {r} of expert {e} .*poison"):
        check_against_fp64(inputs, outputs, shape, config)
    outputs.out[e, r] = saved
    outputs.out.view(torch.uint8)[e, r, 5] ^= 0x02  # a mantissa bit: two fp8 steps away
    with pytest.raises(ToleranceError, match=rf"fp8 value of expert {e} row {r} column 5"):
        check_against_fp64(inputs, outputs, shape, config)


def test_bf16_intermediates_allowed_only_without_keep_fp32():
    assert tolerance_for(smq.SiluMulQuantConfig(keep_fp32=True)) is STRICT
    assert tolerance_for(smq.SiluMulQuantConfig()) is BF16_INTERMEDIATES
    inputs, outputs, shape, config = _reference_outputs(layout="row_major")
    # What a plugin that rounds SiLU * up to bf16 before quantizing produces:
    real = smq.real_rows(inputs.masked_m, shape.max_rows)
    gate, up = smq.split_gate_up(inputs.gateup[real].float(), False)
    values = (torch.nn.functional.silu(gate).bfloat16().float() * up).bfloat16().float()
    from sglang_moe_plugins.quant import quantize_fp8_groups

    q, scale = quantize_fp8_groups(values, 128, ue8m0=False)
    outputs.out[real], outputs.scale[real] = q, scale
    assert tolerance.compare_with_fp64(inputs, outputs, shape, config, BF16_INTERMEDIATES).ok
    assert not tolerance.compare_with_fp64(inputs, outputs, shape, config, STRICT).ok


def test_fast_exp_argument_rounding_is_allowed_for_negative_gates_only():
    """``ex2.approx(g * fp32(log2 e))`` (``__expf``, SGLang's kernel, ``triton``): for a group whose largest
    value has a large negative gate the scale is off by up to ~4e-6. The default policy allows
    ``2^-23 * |g|`` on values with negative gates, and a scale only as far as its largest value moves;
    ``fast_exp=False`` allows nothing; more than that, or on a positive gate, still fails."""
    from sglang_moe_plugins.quant import quantize_fp8_groups

    gates = torch.tensor([-87.0, -80.0, -71.5, -64.0, -60.5, -45.25, -30.0, -20.5, 3.0, 0.75, -1.5, 12.0])
    n = gates.numel()
    shape = smq.SiluMulQuantShape(1, n, 128, 128, 1)
    config = smq.SiluMulQuantConfig(Platform.cpu(), scale_layout="row_major", keep_fp32=True)
    x = torch.zeros(1, n, 256)
    x[0, :, 0] = gates  # each row's only non-zero gate: its silu is the group's absmax
    x[0, :, 128] = torch.exp2(torch.arange(n) % 7 * 5.0 - 15)
    inputs = smq.SiluMulQuantInputs(x.bfloat16(), torch.tensor([n], dtype=torch.int32))
    gate, up = smq.split_gate_up(inputs.gateup[0].float(), False)
    values = numerics.fast_exp_silu_mul(gate, up)
    exact = gate.double() * torch.sigmoid(gate.double()) * up.double()
    assert float(((values.double() - exact).abs() / exact.abs().clamp_min(1e-300))[:, 0].max()) > 1e-6  # the effect
    outputs = smq.allocate_outputs(shape, config, torch.device("cpu"))
    q, scale = quantize_fp8_groups(values, 128, ue8m0=False)
    outputs.out[0], outputs.scale[0] = q, scale
    assert tolerance.compare_with_fp64(inputs, outputs, shape, config, STRICT).ok
    assert "fast exp" not in tolerance.EXACT.describe()
    assert not tolerance.compare_with_fp64(inputs, outputs, shape, config, tolerance.EXACT).ok
    saved = outputs.scale.clone()
    outputs.scale[0, 8, 0] *= 1 + 2e-6  # the g = 3.0 row: a positive gate gets no allowance
    assert "fp32 scale of expert 0 row 8" in tolerance.compare_with_fp64(inputs, outputs, shape, config, STRICT).message
    outputs.scale.copy_(saved)
    outputs.scale[0, 0, 0] *= 1 + 2e-5  # beyond 1e-6 + 87 * 2^-23 for the g = -87 row
    assert "fp32 scale of expert 0 row 0" in tolerance.compare_with_fp64(inputs, outputs, shape, config, STRICT).message


def test_fast_exp_allowance_follows_the_value_that_sets_the_scale():
    """A large negative gate elsewhere in the group must not loosen a scale set by a positive gate."""
    from sglang_moe_plugins.quant import quantize_fp8_groups

    shape = smq.SiluMulQuantShape(1, 4, 128, 128, 1)
    config = smq.SiluMulQuantConfig(Platform.cpu(), scale_layout="row_major", keep_fp32=True)
    x = torch.zeros(1, 4, 256)
    x[0, :, 0], x[0, :, 128] = 3.0, 1.0  # absmax: silu(3) ~ 2.86
    x[0, :, 1], x[0, :, 129] = -80.0, 1.0  # silu(-80) ~ -1e-33: in the group, far from its absmax
    inputs = smq.SiluMulQuantInputs(x.bfloat16(), torch.tensor([4], dtype=torch.int32))
    gate, up = smq.split_gate_up(inputs.gateup[0].double(), False)
    outputs = smq.allocate_outputs(shape, config, torch.device("cpu"))
    outputs.out[0], outputs.scale[0] = quantize_fp8_groups((gate * torch.sigmoid(gate) * up).float(), 128, ue8m0=False)
    assert tolerance.compare_with_fp64(inputs, outputs, shape, config, STRICT).ok
    outputs.scale[0, 1, 0] *= 1 + 4.5e-6  # within 80 * 2^-23 (9.5e-6), but the absmax's gate is positive
    result = tolerance.compare_with_fp64(inputs, outputs, shape, config, STRICT)
    assert not result.ok and "fp32 scale of expert 0 row 1" in result.message


# -- case generation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", MASKED_PATTERNS)
def test_masked_patterns_keep_the_host_guarantee(pattern):
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        e, n, topk = 1 + seed % 9, 1 + seed % 13, 1 + seed % 4
        m = masked_pattern(pattern, e, n, topk, gen)
        assert m.dtype == torch.int32 and m.shape == (e,)
        assert (m >= 0).all() and (m <= n).all() and int(m.sum()) <= n * topk
        if pattern == "empty":
            assert int(m.sum()) == 0
        if pattern == "ragged" and e > 1:
            assert int(m[0]) == min(n, n * topk) and int(m[1]) == 0


def test_cases_cover_catalog_eps_rows_edges_and_seeded_random():
    adapter = conformance_for("silu_mul_quant")
    options = SuiteOptions(seed=7, random_cases=5)
    cases = adapter.cases(options, Platform.cpu(), 7)
    labels = [c.label for c in cases]
    for ep in (1, 2, 4, 8):
        assert any(f" EP{ep} " in label for label in labels)
    assert any("N=128" in label for label in labels) and any("N=1024" in label for label in labels)
    assert any(c.shape.max_rows == 1024 and not c.execute for c in cases), "prefill size probed through supports()"
    assert {c.masked_m for c in cases} >= {"ragged", "empty", "uniform", "skewed", "full"}
    assert {c.origin for c in cases} == {"catalog", "edge", "random"}
    assert all(c.config.platform == Platform.cpu() for c in cases)
    assert not any("gpt-oss" in label for label in labels)
    assert sum(c.origin == "random" for c in cases) == 5 and "seed 7" in labels[-1]
    budget = options.resolved_max_elements(Platform.cpu())
    # Every case that runs fits the size budget, except catalog cases already reduced to N = 1.
    assert all(
        c.shape.num_experts * c.shape.max_rows * 2 * c.shape.hidden <= budget or c.shape.max_rows == 1
        for c in cases
        if c.execute
    )
    # Reproducible from the seed; another seed draws other random cases.
    again = adapter.cases(options, Platform.cpu(), 7)
    assert [(c.shape, c.config, c.seed) for c in again] == [(c.shape, c.config, c.seed) for c in cases]
    other = adapter.cases(options, Platform.cpu(), 8)
    assert [c.shape for c in other if c.origin == "random"] != [c.shape for c in cases if c.origin == "random"]


# -- the suite on good plugins ------------------------------------------------------------------------


def test_reference_passes_every_check():
    progress = []
    report = run_conformance("reference", SuiteOptions(**SMALL), progress=lambda d, t, label: progress.append((d, t)))
    assert report.passed, report.summary()
    assert report.status == PASSED and report.coverage == "full" and report.seed == 0
    assert [c.name for c in report.checks] == list(CHECKS)
    assert all(c.status == PASSED for c in report.checks), report.summary()
    prepare = next(c for c in report.checks if c.name == "prepare")  # the reference has no prepare(): allowed
    assert prepare.checked == 1 and "has no prepare()" in prepare.note
    assert report.cases_run >= 20 and report.cases_failed == 0 and report.first_failure is None
    ran = {c.masked_m for c in report.cases if c.status == PASSED}
    assert {"ragged", "empty"} <= ran
    assert progress[-1][0] == progress[-1][1] == len(report.cases)
    assert report.supports_median_us < 1000
    # Frozen and JSON-ready.
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.plugin = "x"  # type: ignore[misc]
    data = json.loads(json.dumps(report.to_dict(), default=str))
    assert data["status"] == "passed" and data["seed"] == 0 and data["cases_run"] == report.cases_run
    assert "result: PASSED" in report.summary() and "--seed 0" in report.summary()


def test_a_seed_is_drawn_and_reported_when_not_given():
    report = run_conformance(ReferencePlugin, catalog=False, edge_cases=False, random_cases=1)
    assert isinstance(report.seed, int) and f"seed {report.seed}" in report.summary()
    assert report.options.seed == report.seed


def test_plugin_that_supports_nothing_here_is_not_exercised():
    report = run_conformance("triton", catalog=False, random_cases=2, seed=0, device="cpu")
    assert report.status == NOT_EXERCISED and not report.passed
    assert "supports none" in report.not_exercised_reason() and "CUDA" in report.not_exercised_reason()
    with pytest.raises(ConformanceFailure, match="NOT EXERCISED"):
        report.raise_for_failures()


def test_mega_moe_is_covered_only_as_far_as_its_op_module_offers():
    assert "mega_moe" in OPS
    report = run_conformance("mega_reference", seed=0, random_cases=2)
    module = sys.modules["sglang_moe_plugins.ops.mega_moe"]
    adapter = conformance_for("mega_moe")
    if getattr(module, "conformance", None) is not None or (adapter is not None and adapter.coverage == "full"):
        assert report.coverage == "full"  # the suite's own adapter: tests/test_conformance_mega.py
    elif callable(getattr(module, "cases_for_model", None)):
        assert report.coverage == "supports-only" and report.cases_run == 0
        assert report.check("numerics").status == "skipped" and "not exercised" in report.check("numerics").note
    else:
        assert report.coverage == "none" and report.status == NOT_EXERCISED
        assert "not covered by the conformance suite yet" in report.coverage_note
    assert report.check("contract").status == PASSED


# -- the suite on broken plugins: each failure named --------------------------------------------------

BROKEN_EXPECTED = [
    ("WrongScaleLayoutPlugin", "output_layout", "the host requires"),
    ("UnwrittenRowPlugin", "rows_written", "still holds the poison"),
    ("AcceptsThenCrashesPlugin", "run_no_crash", "then run() raised RuntimeError"),
    ("RaisingSupportsPlugin", "supports_answer", "supports() raised ValueError"),
    ("FlakySupportsPlugin", "supports_deterministic", "answered"),
    ("SlowSupportsPlugin", "supports_cheap", "over the 1000 us budget"),
    ("ModifiesInputPlugin", "inputs_unchanged", "gateup changed"),
    ("WrongNumericsPlugin", "numerics", "the reference plugin passes this case"),
    ("OldContractPlugin", "contract", "written for plugin contract version 0"),
]


@pytest.mark.parametrize("cls, check, message", BROKEN_EXPECTED, ids=[b[0] for b in BROKEN_EXPECTED])
def test_suite_fails_each_broken_plugin_and_names_the_check(cls, check, message):
    report = run_conformance(f"{BROKEN}:{cls}", SuiteOptions(**SMALL))
    assert report.status == FAILED
    assert [c.name for c in report.failed_checks] == [check], report.summary()
    failure = report.check(check).first_failure
    assert failure is not None and message in failure.error, failure
    if check != "contract" and check != "supports_cheap":
        assert failure.shape.startswith("E=") and failure.case in {c.label for c in report.cases}
    assert report.first_failure == failure
    assert f"first failure: [{check}]" in report.summary()
    with pytest.raises(ConformanceFailure):
        report.raise_for_failures()


class _IdentitySupports(Plugin):
    """Answers from a cache keyed on the shape object's identity: equal copies get another answer."""

    name = "identity_supports"
    op = "silu_mul_quant"
    priority = 1

    def __init__(self):
        self.seen = set()

    def supports(self, shape, config):
        if not self.seen or id(shape) in self.seen:
            self.seen.add(id(shape))
            return Support.yes("seen")
        return Support.no("a new object")

    def run(self, inputs, outputs, shape, config):
        silu_mul_quant_reference(inputs, outputs, shape, config)


def test_supports_must_answer_equal_copies_alike():
    report = run_conformance(_IdentitySupports(), catalog=False, edge_cases=True, random_cases=0, seed=0)
    assert report.check("supports_deterministic").status == FAILED
    assert "equal copy" in report.check("supports_deterministic").first_failure.error


@pytest.mark.parametrize(
    "field, value",
    [
        ("random_cases", -1),
        ("eps", (0,)),
        ("rows", [128]),
        ("max_elements", 0),
        ("supports_budget_us", 0),
        ("seed", "1"),
        ("models", "Qwen3-30B-A3B"),
    ],
)
def test_options_are_validated_with_the_allowed_values(field, value):
    from sglang_moe_plugins import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=f"invalid argument {field}="):
        SuiteOptions(**{field: value})


def test_load_errors_name_what_is_valid(tmp_path):
    with pytest.raises(PluginLoadError, match=r"registered: .*reference"):
        load_plugin("no_such_plugin")
    with pytest.raises(PluginLoadError, match=r"several plugin classes; name one: .*WrongScaleLayoutPlugin"):
        load_plugin(BROKEN)
    with pytest.raises(PluginLoadError, match="no attribute 'Nope'"):
        load_plugin(f"{BROKEN}:Nope")
    with pytest.raises(PluginLoadError, match="no such file"):
        load_plugin(str(tmp_path / "missing.py"))
    single = tmp_path / "single.py"
    single.write_text(
        "from sglang_moe_plugins.plugins.reference import ReferencePlugin\n"
        "class Mine(ReferencePlugin):\n    name = 'mine'\n"
    )
    loaded = load_plugin(str(single))
    assert loaded.plugin.name == "mine" and "single.py" in loaded.origin
    assert load_plugin("sglang_moe_plugins.plugins.reference.silu_mul_quant:ReferencePlugin").plugin.name == "reference"


# -- the pytest plugin --------------------------------------------------------------------------------


class _Outcomes:
    def __init__(self):
        self.reports = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.reports[report.nodeid] = report.outcome


def test_pytest_plugin_is_opt_in_and_runs_the_suite(tmp_path):
    test_file = tmp_path / "test_mine.py"
    test_file.write_text(
        "import pytest\n"
        "def test_plain():\n    pass\n"
        "@pytest.mark.moe_plugin('reference', seed=0, catalog=False, random_cases=1)\n"
        "def test_marker(moe_plugin_report):\n"
        "    assert moe_plugin_report.passed and moe_plugin_report.plugin == 'reference'\n"
        f"def test_fixture(moe_conformance):\n"
        f"    report = moe_conformance({BROKEN + ':UnwrittenRowPlugin'!r}, seed=0, catalog=False, random_cases=1)\n"
        "    assert [c.name for c in report.failed_checks] == ['rows_written']\n"
    )
    args = ["-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(test_file)]
    plain = _Outcomes()
    assert pytest.main(args, plugins=[plain]) == 0
    assert sorted(plain.reports) == sorted(f"test_mine.py::{n}" for n in ("test_plain", "test_marker", "test_fixture"))

    opted = _Outcomes()
    target = f"{BROKEN}:WrongScaleLayoutPlugin"
    code = pytest.main(
        [*args, "--moe-plugin", target, "--moe-plugin-seed", "0", "--moe-plugin-cases", "1"], plugins=[opted]
    )
    assert code == 1
    assert opted.reports[f"::moe-plugin-conformance[{target}]"] == "failed"
    assert sum(outcome == "passed" for outcome in opted.reports.values()) == 3


# -- supports() cost: medians, a per-call limit (fails fast), progress; tensor reads -------------------


class _SleepySupports(ReferencePlugin):
    """supports() takes half a second on every call (a costly search over real model shapes)."""

    name = "sleepy_supports"
    priority = 1

    def supports(self, shape, config):
        import time

        time.sleep(0.5)
        return super().supports(shape, config)


def test_a_costly_supports_fails_fast_by_its_median():
    import time

    progress = []
    started = time.perf_counter()
    report = run_conformance(
        _SleepySupports(), SuiteOptions(seed=0), progress=lambda d, t, label: progress.append(label)
    )
    elapsed = time.perf_counter() - started
    # One slow call decides nothing (a busy machine); the median over the first 5 cases is over the
    # 50 ms limit: stop there, not after 3 calls on each of the ~375 catalog, edge and random cases
    # (more than 9 minutes). Reported by its median.
    assert elapsed < 30, elapsed
    cheap = report.check("supports_cheap")
    assert cheap.status == FAILED, report.summary()
    assert cheap.first_failure.error.startswith("supports() takes 500 ms per call (median of 5 cases")
    assert "ms per-call limit" in cheap.first_failure.error
    assert "remaining case(s) not asked" in cheap.first_failure.error
    assert len(report.cases) == 5 and report.status == FAILED
    assert progress and progress[0].startswith("supports() ")


def test_the_per_call_limit_is_an_option_and_the_slowest_call_is_reported():
    report = run_conformance(ReferencePlugin(), SuiteOptions(**SMALL, supports_limit_us=1e9))
    note = report.check("supports_cheap").note
    assert report.check("supports_cheap").status == PASSED and "slowest" in note and "per call" in note
    with pytest.raises(Exception, match="invalid argument supports_limit_us=0"):
        SuiteOptions(supports_limit_us=0)


_HELD = torch.tensor([4.0])


class _ReadsATensor(ReferencePlugin):
    """supports() decides from a tensor it holds (.item()): a host sync, possibly different per rank."""

    name = "reads_a_tensor"
    priority = 1

    def supports(self, shape, config):
        if _HELD.item() < 0:
            return Support.no("never")
        return super().supports(shape, config)


class _TruthOfATensor(ReferencePlugin):
    name = "truth_of_a_tensor"
    priority = 1

    def supports(self, shape, config):
        if not bool(_HELD > 0):
            return Support.no("never")
        return super().supports(shape, config)


@pytest.mark.parametrize("plugin, read", [(_ReadsATensor, ".item()"), (_TruthOfATensor, "bool(tensor)")])
def test_supports_that_reads_a_tensor_is_caught(plugin, read):
    report = run_conformance(plugin(), SuiteOptions(seed=0, catalog=False, random_cases=2))
    check = report.check("supports_no_sync")
    assert check.status == FAILED and report.status == FAILED
    assert f"supports() read tensor values ({read})" in check.first_failure.error
    clean = run_conformance(ReferencePlugin(), SuiteOptions(seed=0, catalog=False, random_cases=2))
    assert clean.check("supports_no_sync").status == PASSED


def test_unknown_suite_options_name_the_valid_fields():
    from sglang_moe_plugins import InvalidArgumentError

    with pytest.raises(
        InvalidArgumentError,
        match=r"invalid argument random_case=3; allowed: a SuiteOptions field: seed, random_cases, ",
    ):
        run_conformance(ReferencePlugin(), random_case=3)


def test_pytest_marker_with_a_wrong_keyword_names_the_fields(tmp_path):
    test_file = tmp_path / "test_wrong.py"
    test_file.write_text(
        "import pytest\n"
        "@pytest.mark.moe_plugin('reference', random_case=1)\n"
        "def test_marker(moe_plugin_report):\n    pass\n"
    )
    result = _pytest_subprocess(tmp_path, str(test_file))
    assert result.returncode == 1
    assert (
        "moe_plugin options: unknown keyword(s) 'random_case'; valid (SuiteOptions fields): seed, random_cases"
        in result.stdout
    )
    assert "TypeError" not in result.stdout


def test_pytest_moe_plugin_counts_its_item_as_collected(tmp_path):
    (tmp_path / "conftest.py").write_text("")
    result = _pytest_subprocess(
        tmp_path,
        "--moe-plugin",
        f"{BROKEN}:WrongScaleLayoutPlugin",
        "--moe-plugin-seed",
        "0",
        "--moe-plugin-cases",
        "0",
        str(tmp_path),
    )
    assert "collected 0 items" not in result.stdout
    assert "collected 1 item" in result.stdout, result.stdout
    assert result.returncode == 1


def _pytest_subprocess(tmp_path, *args):
    import subprocess

    import sglang_moe_plugins

    root = os.path.dirname(os.path.dirname(sglang_moe_plugins.__file__))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )


# -- prepare(): the optional launch of a shape key ----------------------------------------------------
def test_plugin_with_prepare_passes_the_prepare_check():
    from policy_plugins import PreparedReference

    plugin = PreparedReference()
    report = run_conformance(plugin, SuiteOptions(**SMALL))
    assert report.passed, report.summary()
    check = next(c for c in report.checks if c.name == "prepare")
    assert check.status == PASSED and check.checked == report.cases_run
    assert (
        plugin.prepares == 3 * report.cases_run
    )  # twice per key (allowed, and checked), once more for the repeated launch


class _PrepareDiffers(ReferencePlugin):
    name = "prepare_differs"

    def prepare(self, shape, config):
        def launch(inputs, outputs):
            self.run(inputs, outputs, shape, config)
            outputs.scale.mul_(2)  # not what run() writes

        return launch


class _PrepareOnce(ReferencePlugin):
    name = "prepare_once"

    def __init__(self):
        self.keys = set()

    def prepare(self, shape, config):
        if (shape, config) in self.keys:
            raise RuntimeError("prepared this key already")
        self.keys.add((shape, config))
        return lambda inputs, outputs: self.run(inputs, outputs, shape, config)


@pytest.mark.parametrize(
    "plugin, message",
    [
        (_PrepareDiffers(), "the launch from prepare() wrote a different scale than run()"),
        (_PrepareOnce(), "prepare() raised RuntimeError: prepared this key already"),
    ],
    ids=["differs", "once-only"],
)
def test_broken_prepare_fails_the_prepare_check(plugin, message):
    report = run_conformance(plugin, SuiteOptions(**dict(SMALL, random_cases=2)))
    assert [c.name for c in report.failed_checks] == ["prepare"], report.summary()
    assert message in report.failed_checks[0].first_failure.error
