"""Op ``silu_mul_quant_contig`` through SGLang's real ``load_plugins()`` and its hooked compact runner, on a CPU.

SGLang's activation kernels have no CPU implementation, so on a CPU every hooked call that reaches one
of them fails in SGLang's own code: a served call shows that the plugins (``contig_reference`` on a CPU) wrote
SGLang's buffers, byte for byte what the reference writes, and a delegated call shows SGLang's own error.
"""

from __future__ import annotations

import pytest
import torch
from contig_host import compact_runner, make_layer, run_layer  # noqa: F401 - compact_runner: fixture
from sglang_session import default_selector, hooked_targets, loaded_sglang  # noqa: F401 - default_selector: fixture

pytestmark = pytest.mark.sglang

RUNNER = "sglang.srt.layers.moe.moe_runner.deep_gemm.DeepGemmRunnerCore._run_contiguous_gemm"
OP = "silu_mul_quant_contig"


@pytest.fixture(autouse=True)
def _require_contig() -> None:
    if RUNNER not in hooked_targets():
        pytest.skip("this SGLang release has no compact-runner hook (0.5.20 and later)")


def _expected(gateup: torch.Tensor, limit: float | None, ue8m0: bool, swizzle: bool = False):
    from sglang_moe_plugins.ops.silu_mul_quant_contig import ContigConfig, ContigInputs, ContigShape, allocate_outputs
    from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import silu_mul_quant_contig_reference

    shape = ContigShape(gateup.shape[1] // 2, 128)
    config = ContigConfig(swiglu_limit=limit, swizzle=swizzle, scale_layout="ue8m0_packed" if ue8m0 else "row_major")
    outputs = allocate_outputs(shape, config, gateup.device, rows=gateup.shape[0])
    silu_mul_quant_contig_reference(ContigInputs(gateup), outputs, shape, config)
    return outputs


def _calls(plugin: str) -> int:
    from sglang_moe_plugins import stats

    return sum(p.calls for p in stats().plugins if p.op == OP and p.plugin == plugin)


def _delegations(kind: str) -> int:
    from sglang_moe_plugins import stats

    return stats().delegations.get(OP, {}).get(kind, 0)


@pytest.mark.parametrize("limit", [None, 10.0, 0.75])
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_the_two_kernel_branch_is_served_by_the_plugins(compact_runner, limit, rows) -> None:
    layer = make_layer(rows=rows, swiglu_limit=limit, seed=rows)
    before = _calls("contig_reference")
    out = run_layer(layer)
    first, second = compact_runner.calls
    want = _expected(first["out"], limit, ue8m0=False)
    # SGLang's own buffers reached the down GEMM, written by the plugin: bytes and scales equal the reference
    assert second["a"].dtype == torch.float8_e4m3fn and second["a"].shape == (rows, 256)
    assert torch.equal(second["a"].view(torch.uint8), want.out.view(torch.uint8))
    assert second["a_scale"].dtype == torch.float32 and second["a_scale"].stride() == (2, 1)
    assert torch.equal(second["a_scale"], want.scale)
    assert out.shape == (rows, 256) and out.dtype == torch.bfloat16
    assert _calls("contig_reference") == before + 1
    # the attribute the hook set for the call is SGLang's value again
    assert getattr(layer.runner.config, "silu_mul_keep_fp32", False) is False and layer.runner.use_swizzle is False


def test_ue8m0_scales_in_the_layout_sglang_allocates(compact_runner, monkeypatch) -> None:
    from sglang.srt.layers import deep_gemm_wrapper

    from sglang_moe_plugins.integrations.sglang.silu_mul_quant import refresh_host_state

    monkeypatch.setattr(deep_gemm_wrapper, "DEEPGEMM_SCALE_UE8M0", True)
    refresh_host_state()
    layer = make_layer(rows=13, swiglu_limit=10.0, inter=512, seed=3)
    run_layer(layer)
    first, second = compact_runner.calls
    want = _expected(first["out"], 10.0, ue8m0=True)
    scale = second["a_scale"]
    assert scale.dtype == torch.int32 and scale.shape == (13, 1) and scale.stride() == (1, 16)
    assert torch.equal(second["a"].view(torch.uint8), want.out.view(torch.uint8))
    assert torch.equal(scale, want.scale)


def test_the_fused_branch_keeps_its_numerics(compact_runner, monkeypatch) -> None:
    """silu_mul_keep_fp32 (0.5.21+) or a swizzled input take SGLang's fused branch: served with keep_fp32."""
    layer = make_layer(rows=16, swiglu_limit=10.0, seed=5)
    if hasattr(layer.runner.config, "silu_mul_keep_fp32") and "keep_fp32" in _fused_conditions():
        layer.runner.config.silu_mul_keep_fp32 = True
    else:
        layer.runner.use_swizzle = True
    from sglang_moe_plugins import api

    run_layer(layer)
    first, second = compact_runner.calls
    want = _expected(first["out"], 10.0, ue8m0=False, swizzle=layer.runner.use_swizzle)
    assert torch.equal(second["a"].view(torch.uint8), want.out.view(torch.uint8))
    bound = [b for k, b in api.current_selector().call_cache.items() if k[0] == OP]
    assert any(b.config.keep_fp32 for b in bound)


def _fused_conditions() -> str:
    from sglang_moe_plugins.integrations.sglang.versions import active_target

    return " ".join(active_target(OP).host.fused_when)


def test_the_redirect_is_restored_when_the_call_fails(compact_runner, monkeypatch) -> None:
    from sglang.srt.layers import deep_gemm_wrapper

    def failing(*args, **kwargs):
        if compact_runner.calls:  # the down GEMM, after the step the hook redirected
            raise RuntimeError("down GEMM failed")
        compact_runner(*args, **kwargs)

    layer = make_layer(rows=8, seed=7)
    monkeypatch.setattr(deep_gemm_wrapper, "grouped_gemm_nt_f8f8bf16_contig", failing)
    with pytest.raises(RuntimeError, match="down GEMM failed"):
        run_layer(layer)
    assert getattr(layer.runner.config, "silu_mul_keep_fp32", False) is False and layer.runner.use_swizzle is False


def test_situ_goes_to_sglang_unchanged(compact_runner) -> None:
    layer = make_layer(rows=8, activation="situ", seed=9)
    before_kind, before_calls = _delegations("activation"), _calls("contig_reference")
    with pytest.raises(Exception) as caught:  # SGLang's own situ code: no CPU kernel
        run_layer(layer)
    from sglang_moe_plugins.errors import MoEPluginsError

    assert not isinstance(caught.value, MoEPluginsError)
    assert _delegations("activation") == before_kind + 1 and _calls("contig_reference") == before_calls


def test_the_kernel_outside_a_runner_call_is_sglangs(compact_runner) -> None:
    import pkgutil

    from sglang_moe_plugins.errors import MoEPluginsError
    from sglang_moe_plugins.integrations.sglang.versions import active_target

    kernel = pkgutil.resolve_name(active_target(OP).host.kernel_path)
    assert getattr(kernel, "__wrapped__", None) is not None, "the kernel wrapper is hooked"
    before = _calls("contig_reference")
    gateup = torch.randn(4, 256).to(torch.bfloat16)
    with pytest.raises(Exception) as caught:  # SGLang's JIT kernel: no CPU build
        kernel(gateup, torch.empty(4, 128, dtype=torch.float8_e4m3fn), torch.empty(4, 1), 128)
    assert not isinstance(caught.value, MoEPluginsError) and _calls("contig_reference") == before


def test_no_plugin_for_the_step_fails_before_sglang_runs(compact_runner) -> None:
    from sglang_moe_plugins import UserConfig, api
    from sglang_moe_plugins.errors import NoPluginAvailableError

    api.reload(UserConfig(allow=frozenset(), disable=frozenset({"contig_reference"})))
    layer = make_layer(rows=8, seed=11)
    with pytest.raises(NoPluginAvailableError, match=OP):
        run_layer(layer)
    assert compact_runner.calls == [], "nothing ran: the selection comes before SGLang's GEMMs"


def test_stock_leaves_the_compact_runner_to_sglang() -> None:
    """``SGLANG_MOE_PLUGINS_STOCK=silu_mul_quant_contig``: neither the runner nor SGLang's kernel wrapper is hooked,
    the masked op stays hooked (a fresh process through SGLang's real load_plugins())."""
    from sglang_probe import run_probe
    from sglang_session import SMQ_TARGET

    from sglang_moe_plugins.integrations.sglang.versions import active_target

    result, stderr = run_probe(SGLANG_MOE_PLUGINS_STOCK=OP)
    assert RUNNER not in result["patched"] and SMQ_TARGET in result["patched"]
    assert result["stock"] == [OP] and result["calls"] == ["ok", "ok"]
    assert f"not hooking {RUNNER}: op {OP} is stock" in stderr
    assert f"not hooking {active_target(OP).host.kernel_path}: op {OP} is stock" in stderr


def test_two_threads_on_one_runner_leave_sglangs_attribute_as_it_was(compact_runner) -> None:
    """The redirect is counted per runner: the first call sets it, the last restores SGLang's value."""
    import threading

    from sglang_moe_plugins.integrations.sglang import contig
    from sglang_moe_plugins.integrations.sglang.versions import active_target

    dg = loaded_sglang()
    layer = make_layer(rows=8, seed=13)
    host = active_target(OP).host
    _, get_redirect, _ = contig._accessors(host)
    both_inside = threading.Barrier(2, timeout=30)
    seen = []

    def original(runner, runner_input, quant_info, state):  # SGLang's method, reduced to what the test needs
        seen.append(bool(get_redirect(runner)))
        both_inside.wait()

    ri = dg.DeepGemmRunnerInput(
        hidden_states=layer.hidden_states,
        hidden_states_scale=layer.hidden_states_scale,
        use_masked_gemm=False,
        m_indices=layer.m_indices,
    )
    threads = [
        threading.Thread(target=contig.contig_runner_hook, args=(original, layer.runner, ri, layer.quant_info, {}))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert seen == [True, True], "both calls ran redirected"
    assert get_redirect(layer.runner) is False and contig._redirects == {}


def test_the_runner_is_hooked_only_with_its_kernel() -> None:
    """A release whose fused-kernel target does not resolve: neither contig target is hooked (a redirect without
    the kernel hook would hand the step to SGLang's fused kernel)."""
    import textwrap

    from test_sglang_integration import HOOKED_PROBE, _run_python

    pre = """
    from sglang_moe_plugins.integrations.sglang import versions as sv
    import dataclasses
    release = sv.sglang_version()
    sv.KNOWN_TARGETS[release] = tuple(
        dataclasses.replace(t, path=t.path + "_renamed") if t.hook.endswith(":contig_kernel_hook") else t
        for t in sv.KNOWN_TARGETS[release])
    """
    result = _run_python(HOOKED_PROBE.format(pre=textwrap.dedent(pre).replace("\n", "\n    ")))
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout + result.stderr
    assert f"not hooking {RUNNER}: it needs" in out
    assert RUNNER not in result.stdout.split("PATCHED", 1)[1]
