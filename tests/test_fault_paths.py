"""Issue 18, "No silent corruption on fault paths", through SGLang's real ``load_plugins()`` and its hooked
functions (docs/reliability.md):

- a plugin that may have written an input the host marked writable (``gateup``) and then fails is not
  followed by another plugin on that call: the call raises, naming the plugin and why;
- a plugin result of another type than the op's outputs is an error naming the plugin, on every call;
- mega_moe outputs with fewer rows than the call's tokens are an error naming the plugin;
- swiglu_limit / activation_clamp values that do not fit a float, or that round to 0 in bf16, are
  InvalidArgumentError;
- option values are checked by the plugins (``check_options``), reported as ConfigError.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("sglang")

from sglang_session import (  # noqa: F401 - runner, default_selector: the shared fixtures
    MEGA_REFERENCE,
    REFERENCE,
    default_selector,
    ep,
    require_mega_target,
    runner,
)

from sglang_moe_plugins import ConfigError, InvalidArgumentError, OutputValidationError, Registry, UserConfig, api
from sglang_moe_plugins.config import load_config, parse_config
from sglang_moe_plugins.ops import mega_moe as mm, silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference

pytestmark = pytest.mark.sglang
LOGGER = "sglang_moe_plugins"


def data(e=4, n=8, d=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gateup = (torch.randn(e, n, 2 * d, generator=gen) * 3).to(torch.bfloat16)
    masked = torch.tensor([n, 3, 0, n - 1][:e], dtype=torch.int32)
    return gateup, masked


def reference_of(gateup, masked, group_size=128, topk=2, **kw):
    """The reference outputs of a call on an untouched copy of ``gateup`` (real rows compared only)."""
    shape, config = smq.describe(gateup, masked, group_size=group_size, topk=topk, **kw)
    outputs = smq.allocate_outputs(shape, config, gateup.device)
    silu_mul_quant_reference(smq.SiluMulQuantInputs(gateup.clone(), masked), outputs, shape, config)
    return outputs, smq.real_rows(masked, shape.max_rows)


def same_real_rows(got_out, got_scale, want, mask):
    return torch.equal(got_out[mask].view(torch.uint8), want.out[mask].view(torch.uint8)) and torch.equal(
        got_scale.float()[mask], want.scale.float()[mask]
    )


# -- finding 7: no fallback on a clobbered input -------------------------------------------------------
def test_failure_after_writing_a_writable_input_raises_instead_of_falling_back(runner, caplog):
    api.reload(
        UserConfig(), entry_points=[ep("policy_smq_clobbers", "policy_plugins:SmqClobbersThenRaises"), REFERENCE]
    )
    gateup, masked = data()
    want, mask = reference_of(gateup, masked)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        with pytest.raises(RuntimeError, match="failed after writing its workspace") as info:
            runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "plugin 'policy_smq_clobbers'" in notes
    assert "no fallback: it may have modified the input gateup (marked writable by the host)" in notes
    # One ERROR line for the failure (the registry's WARNING that the plugin outranks the built-ins is not it).
    (line,) = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "policy_smq_clobbers" in r.getMessage()
    ]
    assert "this call raises" in line and "falling back" not in line
    # The plugin is excluded for the key: the next call (fresh workspace) runs the reference, right.
    out, scale = runner._varlen_deep_gemm_silu_mul_quant(data()[0], masked, 128, 2)
    assert same_real_rows(out, scale, want, mask)
    shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
    assert api.get_selector().explain(smq.OP, shape, config).chosen.name == "reference"


def test_declared_writes_decide_per_call(runner):
    """writes_inputs(shape, config): a plugin that writes gateup only with a swiglu_limit (as fp8_fallback
    does) falls back on calls without one, and raises on calls with one."""
    api.reload(
        UserConfig(), entry_points=[ep("policy_smq_clamps", "policy_plugins:SmqDeclaresClampThenRaises"), REFERENCE]
    )
    gateup, masked = data(seed=1)
    want, mask = reference_of(gateup, masked)
    out, scale = runner._varlen_deep_gemm_silu_mul_quant(gateup.clone(), masked, 128, 2)  # no limit: falls back
    assert same_real_rows(out, scale, want, mask)
    with pytest.raises(RuntimeError, match="kernel failed") as info:
        runner._varlen_deep_gemm_silu_mul_quant(gateup.clone(), masked, 128, 2, swiglu_limit=7.0)
    assert any(
        "policy_smq_clamps" in n and "no fallback: it may have modified the input gateup" in n
        for n in info.value.__notes__
    )


def test_plugin_that_declares_no_writes_still_falls_back(runner):
    api.reload(UserConfig(), entry_points=[ep("policy_smq_raises", "policy_plugins:SmqRaises"), REFERENCE])
    gateup, masked = data(seed=2)
    want, mask = reference_of(gateup, masked)
    out, scale = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    assert same_real_rows(out, scale, want, mask)


def test_builtin_declarations():
    from sglang_moe_plugins.core.bound import inputs_maybe_written
    from sglang_moe_plugins.plugins.reference import ReferencePlugin
    from sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback import Fp8FallbackPlugin
    from sglang_moe_plugins.plugins.sglang_kernels.jit_ep import JitEpPlugin
    from sglang_moe_plugins.plugins.triton_smq.plugin import TritonPlugin

    gateup, masked = data()
    writable = smq.SPEC.writable_inputs
    plain = smq.describe(gateup, masked, group_size=128, topk=2)
    limited = smq.describe(gateup, masked, group_size=128, topk=2, swiglu_limit=7.0)
    marked = smq.SiluMulQuantInputs(gateup, masked, None, True)
    for plugin in (ReferencePlugin(), TritonPlugin(), JitEpPlugin()):
        assert inputs_maybe_written(plugin, writable, marked, *limited) == ()
    fp8 = Fp8FallbackPlugin()
    assert inputs_maybe_written(fp8, writable, marked, *plain) == ()
    assert inputs_maybe_written(fp8, writable, marked, *limited) == ("gateup",)
    assert inputs_maybe_written(fp8, writable, smq.SiluMulQuantInputs(gateup, masked), *limited) == ()  # not marked
    assert inputs_maybe_written(object(), writable, marked, *plain) == ("gateup",)  # undeclared: conservative


# -- finding 11: a result of the wrong type ---------------------------------------------------------------
def test_wrong_result_type_is_an_error_naming_the_plugin_and_falls_back(runner, caplog):
    api.reload(UserConfig(), entry_points=[ep("policy_smq_tuple", "policy_plugins:SmqReturnsTupleLater"), REFERENCE])
    gateup, masked = data(seed=3)
    want, mask = reference_of(gateup, masked)
    runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)  # first call: right, checked, cached
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        out, scale = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)  # a tuple: the next plugin
    assert same_real_rows(out, scale, want, mask)
    (line,) = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "policy_smq_tuple" in r.getMessage()
    ]
    assert "OutputValidationError" in line and "returned tuple from run()" in line and "SiluMulQuantOutputs" in line


def test_wrong_result_type_raises_on_every_call_under_strict(runner):
    api.reload(
        parse_config({"strict": True}),
        entry_points=[ep("policy_smq_tuple", "policy_plugins:SmqReturnsTupleLater"), REFERENCE],
    )
    gateup, masked = data(seed=4)
    runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    for _ in range(2):
        with pytest.raises(
            OutputValidationError, match=r"plugin 'policy_smq_tuple' returned tuple from run\(\) on op 'silu_mul_quant'"
        ):
            runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)


def _mega(runner_module, problem):
    from test_failure_policy import _mega_call

    return _mega_call(runner_module, problem)


def test_mega_wrong_result_type_raises_naming_the_plugin(runner):
    require_mega_target()
    import sglang.srt.layers.moe.mega_moe as host
    from _mega_cases import make_problem

    api.reload(UserConfig(), entry_points=[ep("policy_mega_tuple", "policy_plugins:MegaReturnsTuple"), MEGA_REFERENCE])
    problem = make_problem("fp8xfp4", seed=6)
    for _ in range(2):
        with pytest.raises(OutputValidationError, match="plugin 'policy_mega_tuple' returned tuple") as info:
            _mega(host, problem)
        assert any("collective" in n for n in info.value.__notes__)


# -- finding 8: mega_moe outputs with too few rows ----------------------------------------------------
def test_mega_outputs_with_too_few_rows_are_an_error(runner):
    require_mega_target()
    import sglang.srt.layers.moe.mega_moe as host
    from _mega_cases import make_problem

    problem = make_problem("fp8xfp4", seed=7)
    tokens = problem.inputs.num_tokens
    assert tokens > 1
    api.reload(UserConfig(), entry_points=[ep("policy_mega_short", "policy_plugins:MegaShortRows"), MEGA_REFERENCE])
    with pytest.raises(OutputValidationError) as info:
        _mega(host, problem)
    assert (
        f"plugin 'policy_mega_short' returned y.shape=(1, {problem.shape.hidden}) for a call of {tokens} tokens"
        in str(info.value)
    )


def test_mega_too_few_rows_on_a_later_call_is_an_error_under_strict(runner):
    require_mega_target()
    import sglang.srt.layers.moe.mega_moe as host
    from _mega_cases import make_problem

    problem = make_problem("fp8xfp4", seed=8)
    api.reload(
        parse_config({"strict": True}),
        entry_points=[ep("policy_mega_short_later", "policy_plugins:MegaShortRowsLater"), MEGA_REFERENCE],
    )
    assert _mega(host, problem).shape[0] == problem.inputs.num_tokens  # first call: right size
    with pytest.raises(OutputValidationError, match=r"plugin 'policy_mega_short_later' returned y.shape=.1, "):
        _mega(host, problem)


def test_mega_validate_outputs_counts_rows_against_the_inputs():
    from _mega_cases import make_problem

    p = make_problem("fp8xfp4", seed=9)
    short = mm.MegaMoEOutputs(torch.zeros((1, p.shape.hidden), dtype=torch.bfloat16))
    mm.validate_outputs(short, p.shape, p.config, "x")  # without the inputs: >= 1 row is all it can check
    with pytest.raises(OutputValidationError, match=r"plugin 'x' returned y.shape"):
        mm.validate_outputs(short, p.shape, p.config, "x", inputs=p.inputs)
    full = mm.allocate_outputs(p.shape, p.config, p.inputs.device, num_tokens=p.inputs.num_tokens)
    mm.validate_outputs(full, p.shape, p.config, "x", inputs=p.inputs)


# -- swiglu_limit / activation_clamp that do not fit -------------------------------------------------------
@pytest.mark.parametrize(
    "limit",
    [10**400, -(10**400), 2.0**-127, 1e-45],
    ids=["int-too-big", "negative-int-too-big", "below-bf16-normal", "bf16-subnormal"],
)
def test_swiglu_limit_that_does_not_fit_is_an_invalid_argument(runner, limit):
    api.reload(UserConfig(), entry_points=[REFERENCE])
    gateup, masked = data()
    with pytest.raises(InvalidArgumentError) as info:
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2, swiglu_limit=limit)
    assert info.value.argument == "swiglu_limit" and "2**-126" in info.value.allowed


def test_smallest_accepted_swiglu_limit(runner):
    api.reload(UserConfig(), entry_points=[REFERENCE])
    gateup, masked = data()
    out, _ = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2, swiglu_limit=2.0**-126)
    assert out.shape == (4, 8, 256)
    _, config = smq.describe(gateup, masked, group_size=128, topk=2, swiglu_limit=10**30)  # a big int that fits
    assert config.swiglu_limit == 1e30


@pytest.mark.parametrize(
    "clamp, ok",
    [(10**400, False), (2.0**-127, False), (0, True), (2.0**-126, True), (10, True)],
    ids=["int-too-big", "below-bf16-normal", "zero", "bf16-normal-min", "ten"],
)
def test_mega_activation_clamp_bounds(clamp, ok):
    from _mega_cases import make_problem

    p = make_problem("fp8xfp4", seed=10)
    s, i = p.shape, p.inputs

    def call():
        return mm.describe(
            i.hidden_states,
            i.topk_ids,
            i.topk_weights,
            l1_weights=i.l1_weights,
            l2_weights=i.l2_weights,
            variant="fp8xfp4",
            num_experts=s.num_experts,
            hidden_size=s.hidden,
            intermediate_size=s.intermediate,
            top_k=s.top_k,
            activation_clamp=clamp,
        )

    if ok:
        assert call()[1].activation_clamp == float(clamp)
    else:
        with pytest.raises(InvalidArgumentError, match="activation_clamp"):
            call()


# -- finding 9: option values ------------------------------------------------------------------------
def test_option_value_error_is_a_config_error_naming_plugin_option_value_and_allowed(tmp_path):
    path = tmp_path / "moe.toml"
    path.write_text("[options.policy_options]\nblock = 48\n")
    config = load_config({"SGLANG_MOE_PLUGINS_CONFIG": str(path)})
    with pytest.raises(ConfigError) as info:
        Registry.discover(config, eps=[ep("policy_options", "policy_plugins:OptionsChecked")])
    assert str(info.value) == (
        f"option block=48 for plugin 'policy_options' in {path} is not accepted; allowed: a power of two >= 1"
    )
    with pytest.raises(
        ConfigError, match=r"option mode='slow' for plugin 'policy_options' is not accepted; allowed: 'fast' or 'exact'"
    ):
        Registry.discover(
            parse_config({"options": {"policy_options": {"mode": "slow"}}}),
            eps=[ep("policy_options", "policy_plugins:OptionsChecked")],
        )
    registry = Registry.discover(
        parse_config({"options": {"policy_options": {"block": 128, "mode": "exact"}}}),
        eps=[ep("policy_options", "policy_plugins:OptionsChecked")],
    )
    assert dict(registry.get("policy_options").options) == {"block": 128, "mode": "exact"}


def test_example_plugin_rejects_a_negative_chunk_experts():
    example = pytest.importorskip("sglang_moe_example_plugin.plugin")
    value = "sglang_moe_example_plugin.plugin:ExampleTorchPlugin"
    with pytest.raises(ConfigError) as info:
        Registry.discover(
            parse_config({"options": {"example_torch": {"chunk_experts": -1}}}), eps=[ep("example_torch", value)]
        )
    text = str(info.value)
    assert "plugin 'example_torch'" in text and "chunk_experts=-1" in text and "an int >= 1" in text
    ok = Registry.discover(
        parse_config({"options": {"example_torch": {"chunk_experts": 2}}}), eps=[ep("example_torch", value)]
    )
    assert ok.get("example_torch").options["chunk_experts"] == 2
    assert example.ExampleTorchPlugin.writes_inputs == frozenset()


def test_builtin_mega_deep_gemm_rejects_an_unknown_pre_dispatch():
    value = "sglang_moe_plugins.plugins.deep_gemm.plugin:MegaW4A8Plugin"
    with pytest.raises(
        ConfigError, match=r"option pre_dispatch='tritn' for plugin 'mega_w4a8' is not accepted; allowed: one of"
    ):
        Registry.discover(
            parse_config({"options": {"mega_w4a8": {"pre_dispatch": "tritn"}}}), eps=[ep("mega_w4a8", value)]
        )
    ok = Registry.discover(
        parse_config({"options": {"mega_w4a8": {"pre_dispatch": "torch"}}}), eps=[ep("mega_w4a8", value)]
    )
    assert ok.get("mega_w4a8").options["pre_dispatch"] == "torch"
