"""Selection among the four mega_moe plugins for the catalog's MegaMoE models on simulated platforms."""

from __future__ import annotations

import dataclasses

import pytest
from _mega_cases import API_ABSENT, API_LEGACY, API_MMA_TYPE, model_key, with_platform

from sglang_moe_plugins.config import UserConfig
from sglang_moe_plugins.core.dispatcher import Selector, Verdict
from sglang_moe_plugins.core.registry import Registry
from sglang_moe_plugins.errors import NoPluginAvailableError
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.plugins.deep_gemm.plugin import MegaSm90Fp8Plugin, MegaW4A4Plugin, MegaW4A8Plugin
from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin

SM90, SM100, CPU = Platform.cuda(9, 0), Platform.cuda(10, 0), Platform.cpu()
MODELS = ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro")
PLUGINS = ("mega_w4a4", "mega_w4a8", "mega_sm90_fp8", "mega_reference")


def _selector(pre_dispatch: str = "auto", *, reference_on_gpu: bool = False) -> Selector:
    plugins = [
        MegaW4A8Plugin(API_MMA_TYPE),
        MegaW4A4Plugin(API_MMA_TYPE),
        MegaSm90Fp8Plugin(API_MMA_TYPE),
        MegaReferencePlugin(),
    ]
    registry = Registry.from_plugins(plugins, UserConfig(reference_on_gpu=reference_on_gpu))
    for record in registry.records(mm.OP):
        if "pre_dispatch" in getattr(record.plugin, "options", {}):
            record.plugin.options = {"pre_dispatch": pre_dispatch}
    return Selector(registry)


def _reasons(selection) -> dict[str, tuple[str, str]]:
    return {c.name: (c.verdict, c.reason) for c in selection.candidates}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("variant,expected", [("fp8xfp4", "mega_w4a8"), ("mxf4xmxf4", "mega_w4a4")])
@pytest.mark.parametrize("ep_size", [1, 8])
def test_sm100_picks_the_variant_plugin(model: str, variant: str, expected: str, ep_size: int) -> None:
    shape, config = model_key(model, variant, SM100, ep_size=ep_size)
    selection = _selector("torch").select(mm.OP, shape, config)
    assert selection.chosen.name == expected
    reasons = _reasons(selection)
    other = "mega_w4a4" if expected == "mega_w4a8" else "mega_w4a8"
    assert reasons[other][0] == Verdict.UNSUPPORTED and f"laid out for {variant}" in reasons[other][1]
    assert reasons["mega_sm90_fp8"][0] == Verdict.UNSUPPORTED
    assert "compute capability 9.0 only" in reasons["mega_sm90_fp8"][1] and "sm100" in reasons["mega_sm90_fp8"][1]
    if ep_size == 1:
        assert reasons["mega_reference"][0] == Verdict.OUTRANKED
    else:
        assert reasons["mega_reference"][0] == Verdict.UNSUPPORTED and "ep_size=8" in reasons["mega_reference"][1]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("variant", ["fp8xfp4", "mxf4xmxf4"])
def test_sm90_has_no_fp4_megamoe(model: str, variant: str) -> None:
    shape, config = model_key(model, variant, SM90)
    # By default the pure-torch reference, the only plugin that could run it, is withheld: SGLang's function runs it.
    withheld = _selector("torch").explain(mm.OP, shape, config)
    assert withheld.chosen is None and withheld.candidate("mega_reference").verdict == Verdict.WITHHELD
    with pytest.raises(NoPluginAvailableError) as info:
        _selector("torch").select(mm.OP, shape, config)
    assert info.value.to_host
    selection = _selector("torch", reference_on_gpu=True).select(mm.OP, shape, config)
    assert selection.chosen.name == "mega_reference"
    reasons = _reasons(selection)
    for name in ("mega_w4a8", "mega_w4a4"):
        assert "compute capability 10.x only" in reasons[name][1] and "sm90" in reasons[name][1]
    assert "needs FP8 e4m3 weights with 128x128 block scales" in reasons["mega_sm90_fp8"][1]


@pytest.mark.parametrize("model", MODELS)
def test_sm90_fp8_weights_pick_mega_sm90_fp8(model: str) -> None:
    shape, config = model_key(model, "sm90_fp8", SM90, fused_shared=False)
    selection = _selector("torch").select(mm.OP, shape, config)
    assert selection.chosen.name == "mega_sm90_fp8"
    on_sm100 = _selector("torch", reference_on_gpu=True).select(mm.OP, shape, with_platform(config, SM100))
    assert on_sm100.chosen.name == "mega_reference"
    assert _selector("torch").explain(mm.OP, shape, with_platform(config, SM100)).chosen is None
    assert "9.0 only" in on_sm100.candidate("mega_sm90_fp8").reason


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("variant", ["fp8xfp4", "mxf4xmxf4", "sm90_fp8"])
def test_cpu_only_reference(model: str, variant: str) -> None:
    shape, config = model_key(model, variant, CPU)
    selection = _selector().select(mm.OP, shape, config)
    assert selection.chosen.name == "mega_reference"
    for name in ("mega_w4a8", "mega_w4a4", "mega_sm90_fp8"):
        verdict, reason = _reasons(selection)[name]
        assert verdict == Verdict.UNSUPPORTED and "requires CUDA" in reason and "cpu" in reason


def test_cpu_with_expert_parallelism_has_no_plugin() -> None:
    shape, config = model_key(MODELS[0], "fp8xfp4", CPU, ep_size=8)
    selection = _selector().explain(mm.OP, shape, config)
    assert selection.chosen is None
    assert all(c.verdict == Verdict.UNSUPPORTED for c in selection.candidates)


def _check(plugin, shape, config) -> str:
    verdict = plugin.supports(shape, config)
    assert not verdict
    return verdict.reason


def test_each_shape_rule_has_its_own_reason() -> None:
    shape, config = model_key(MODELS[0], "fp8xfp4", SM100)
    w4a8, w4a4, sm90 = MegaW4A8Plugin(API_MMA_TYPE), MegaW4A4Plugin(API_MMA_TYPE), MegaSm90Fp8Plugin(API_MMA_TYPE)
    for p in (w4a8, w4a4, sm90):
        p.options = {"pre_dispatch": "torch"}
    assert "hidden_size=4352 is not a multiple of 512" in _check(w4a8, dataclasses.replace(shape, hidden=4352), config)
    assert "moe_intermediate_size=2112 is not a multiple of 128" in _check(
        w4a8, dataclasses.replace(shape, intermediate=2112), config
    )
    assert w4a8.supports(dataclasses.replace(shape, intermediate=2304), config)  # V4.1-Flash: % 128 suffices
    assert "top_k=33 > 32" in _check(w4a8, dataclasses.replace(shape, top_k=33), config)
    w4a4_config = dataclasses.replace(config, variant="mxf4xmxf4")
    w4a4_shape = dataclasses.replace(shape, num_shared_experts=0)
    assert w4a4.supports(w4a4_shape, w4a4_config)
    assert "moe_intermediate_size=2304 is not a multiple of 512" in _check(
        w4a4, dataclasses.replace(w4a4_shape, intermediate=2304), w4a4_config
    )
    assert "shared experts take FP8 weights with fp8xfp4 only" in _check(w4a4, shape, w4a4_config)
    sm90_config = dataclasses.replace(config, platform=SM90, variant="sm90_fp8", weight_format="fp8_e4m3_block128")
    assert sm90.supports(w4a4_shape, sm90_config)
    assert "must be multiples of 128" in _check(sm90, dataclasses.replace(w4a4_shape, intermediate=2112), sm90_config)
    assert "no in-kernel shared experts" in _check(sm90, shape, sm90_config)
    assert "sm120" in _check(w4a8, shape, with_platform(config, Platform.cuda(12, 0)))


def _plugin(cls, api, pre_dispatch: str = "torch"):
    plugin = cls(api)
    plugin.options = {"pre_dispatch": pre_dispatch}
    return plugin


def test_api_reasons() -> None:
    shape, config = model_key(MODELS[0], "fp8xfp4", SM100)
    assert "sgl-deep-gemm is not installed" in _check(_plugin(MegaW4A8Plugin, API_ABSENT), shape, config)
    no_fp4 = dataclasses.replace(API_MMA_TYPE, signatures=API_MMA_TYPE.signatures[:1])
    assert "lacks deep_gemm.fp8_fp4_mega_moe" in _check(_plugin(MegaW4A8Plugin, no_fp4), shape, config)
    # 0.1.5.post1: W4A8 works without shared experts (FP8 activations are its default) ...
    w4a8_legacy = _plugin(MegaW4A8Plugin, API_LEGACY)
    no_shared = dataclasses.replace(shape, num_shared_experts=0)
    assert w4a8_legacy.supports(no_shared, config)
    reason = _check(w4a8_legacy, shape, config)
    assert "takes no num_shared_experts" in reason and "0.1.7+" in reason and "0.1.5.post1" in reason
    # ... W4A4 would need the process-wide DG_USE_* variables, which we never set
    w4a4_key = (no_shared, dataclasses.replace(config, variant="mxf4xmxf4"))
    reason = _check(_plugin(MegaW4A4Plugin, API_LEGACY), *w4a4_key)
    assert "DG_USE_FP4_ACTS" in reason and "never sets" in reason and "mma_type='mxf4xmxf4'" in reason
    # ... and SM90 runs there, with DeepGEMM's own pre-dispatch too
    sm90_key = (
        no_shared,
        dataclasses.replace(config, platform=SM90, variant="sm90_fp8", weight_format="fp8_e4m3_block128"),
    )
    assert _plugin(MegaSm90Fp8Plugin, API_LEGACY, "host").supports(*sm90_key)
    # a DG_USE_* variable set in the environment
    refused = dataclasses.replace(API_MMA_TYPE, legacy_env=("DG_USE_FP4_ACTS",))
    assert "raises RuntimeError" in _check(_plugin(MegaW4A8Plugin, refused), shape, config)
    assert _plugin(MegaSm90Fp8Plugin, refused).supports(*sm90_key)  # the SM90 buffer has no FP4 activations
    legacy_set = dataclasses.replace(API_LEGACY, legacy_env=("DG_USE_FP4_ACTS",))
    assert "lays the buffer out for FP4 activations" in _check(_plugin(MegaW4A8Plugin, legacy_set), no_shared, config)


def test_variants_table_keeps_names_priorities_and_entry_points() -> None:
    from importlib import metadata

    from sglang_moe_plugins.plugins.deep_gemm import plugin as mdg

    assert [(v.name, v.priority, v.variant, v.kernel) for v in mdg.VARIANTS] == [
        ("mega_w4a8", 100, "fp8xfp4", "fp8_fp4_mega_moe"),
        ("mega_w4a4", 110, "mxf4xmxf4", "fp8_fp4_mega_moe"),
        ("mega_sm90_fp8", 100, "sm90_fp8", "fp8_mega_moe"),
    ]
    for cls, v in ((MegaW4A8Plugin, mdg.W4A8), (MegaW4A4Plugin, mdg.W4A4), (MegaSm90Fp8Plugin, mdg.SM90_FP8)):
        assert (cls.name, cls.priority, cls.variant) == (v.name, v.priority, v)
    points = {ep.name: ep.value for ep in metadata.entry_points(group="sglang_moe_plugins.kernels")}
    assert points["mega_w4a8"] == "sglang_moe_plugins.plugins.deep_gemm.plugin:MegaW4A8Plugin"
    assert points["mega_w4a4"] == "sglang_moe_plugins.plugins.deep_gemm.plugin:MegaW4A4Plugin"
    assert points["mega_sm90_fp8"] == "sglang_moe_plugins.plugins.deep_gemm.plugin:MegaSm90Fp8Plugin"


def test_pre_dispatch_option_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    shape, config = model_key(MODELS[1], "mxf4xmxf4", SM100)
    w4a4 = MegaW4A4Plugin(API_MMA_TYPE)
    w4a4.options = {"pre_dispatch": "fast"}
    assert "pre_dispatch='fast' is not one of" in _check(w4a4, shape, config)
    no_host = dataclasses.replace(
        API_MMA_TYPE, signatures=tuple(x for x in API_MMA_TYPE.signatures if x[0] != "mega_moe_pre_dispatch")
    )
    assert "needs deep_gemm.mega_moe_pre_dispatch" in _check(_plugin(MegaW4A4Plugin, no_host, "host"), shape, config)
    w4a4.options = {"pre_dispatch": "host"}
    import sglang_moe_plugins.plugins.deep_gemm.plugin as mdg

    monkeypatch.setattr(mdg, "triton_available", lambda: False)
    w4a4.options = {"pre_dispatch": "triton"}
    assert "triton is not importable" in _check(w4a4, shape, config)
    w4a4.options = {"pre_dispatch": "auto"}
    assert w4a4.supports(shape, config)
    assert "host pre-dispatch" in w4a4.supports(shape, config).reason


def test_selection_is_a_pure_function_of_the_key() -> None:
    """Same (shape, config) -> same answer, whatever the batch: what every EP rank relies on."""
    shape, config = model_key(MODELS[0], "fp8xfp4", SM100, ep_size=8)
    key_copy = (dataclasses.replace(shape), dataclasses.replace(config))
    assert key_copy == (shape, config) and hash(key_copy) == hash((shape, config))
    a = [_reasons(_selector("torch").explain(mm.OP, shape, config)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
