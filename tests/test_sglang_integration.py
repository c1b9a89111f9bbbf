"""Issue 3: the package inside real SGLang (0.5.23, and the older release of the second environment): load_plugins(), its hooked functions, the guard."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from numerics import check_against_fp64

pytest.importorskip("sglang")

from sglang_session import SMQ_TARGET, hooked_targets, installed_parameters, loaded_sglang

from sglang_moe_plugins import InvalidArgumentError, UserConfig, api
from sglang_moe_plugins.catalog import load_catalog
from sglang_moe_plugins.ops import silu_mul_quant as smq

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def runner():
    return loaded_sglang()


def ragged_masked(e: int, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    m = torch.randint(0, n + 1, (e,), generator=gen, dtype=torch.int32)
    m[0] = n
    if e > 1:
        m[1] = 0  # an empty expert
    return m


def gateup_for(e: int, n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-6, 5, (e, n, 1), generator=gen).float())
    return (torch.randn(e, n, 2 * d, generator=gen) * mag).to(torch.bfloat16)


def call_hooked(runner, gateup, masked, topk, **kwargs):
    out, scale = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, topk, **kwargs)
    return out, scale


def test_load_plugins_applies_our_hooks(runner):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_moe_plugins.integrations.sglang import hook_status

    expected = hooked_targets()  # both on 0.5.21+, only the silu_mul_quant target before (no MegaMoE)
    assert SMQ_TARGET in expected and expected <= set(HookRegistry._patched)
    status = hook_status()
    assert status["registered"]
    assert {t["path"] for t in status["targets"] if t["ok"]} == expected
    assert getattr(runner._varlen_deep_gemm_silu_mul_quant, "__wrapped__", None) is not None


def _catalog_cases():
    for model in load_catalog():
        if model.gpt_oss_activation:
            continue
        for ep in (1, 2, 4, 8):
            if model.experts % ep == 0:
                yield pytest.param(model, ep, id=f"{model.short_name}-EP{ep}")


@pytest.fixture
def fresh_selector():
    """A fresh process-wide selector (default configuration), restored afterwards."""
    selector = api.reload(UserConfig())
    yield selector
    api.reload(UserConfig())


@pytest.mark.parametrize("model, ep", list(_catalog_cases()))
def test_hooked_function_correct_for_catalog(runner, model, ep, fresh_selector):
    e, d = model.experts // ep, model.inter
    n = 6  # not a multiple of 4
    gateup = gateup_for(e, n, d, seed=ep)
    masked = ragged_masked(e, n, seed=ep)
    real = smq.real_rows(masked, n)
    for limit in (None, 10.0):
        out, scale = call_hooked(runner, gateup, masked, model.topk, swiglu_limit=limit)
        shape, config = smq.describe(
            gateup,
            masked,
            group_size=128,
            topk=model.topk,
            swiglu_limit=limit,
            scale_layout="row_major" if limit else "column_major",
        )
        smq.validate_outputs(smq.SiluMulQuantOutputs(out, scale), shape, config)
        check_against_fp64(smq.SiluMulQuantInputs(gateup, masked), smq.SiluMulQuantOutputs(out, scale), shape, config)
        again, again_scale = call_hooked(runner, gateup, masked, model.topk, swiglu_limit=limit)  # a known key
        assert torch.equal(again.view(torch.uint8)[real], out.view(torch.uint8)[real]) and torch.equal(
            again_scale[real], scale[real]
        )
        assert (again_scale.shape, again_scale.stride()) == (scale.shape, scale.stride())
    info = fresh_selector.cache_info()
    assert (info["decisions"], info["bound"], info["call_keys"]) == (2, 2, 2)  # one per key, never again


def test_default_path_layout_matches_sglang_allocator(runner):
    """The column-major fp32 and packed UE8M0 scales have exactly the strides SGLang's own allocator gives."""
    from sglang.kernels.ops.quantization.per_token_group_quant import _allocate_outputs

    gateup = gateup_for(5, 6, 1536, seed=3)
    masked = ragged_masked(5, 6, seed=3)
    meta = torch.empty(gateup.shape, dtype=torch.bfloat16, device="meta")
    for ue8m0, layout in ((False, "column_major"), (True, "ue8m0_packed")):
        q_host, s_host = _allocate_outputs(meta, 128, torch.float8_e4m3fn, ue8m0, True, True)
        shape, config = smq.describe(gateup, masked, group_size=128, topk=2, scale_layout=layout)
        ours = smq.allocate_outputs(shape, config, torch.device("meta"))
        assert (ours.scale.shape, ours.scale.stride(), ours.scale.dtype) == (
            s_host.shape,
            s_host.stride(),
            s_host.dtype,
        )
        assert (ours.out.shape, ours.out.dtype) == (q_host.shape, q_host.dtype)


@pytest.fixture
def host_ue8m0(monkeypatch):
    """SGLang in DeepGEMM's UE8M0 mode. The hook reads the mode once (SGLang sets it at start-up), so it is
    told to read it again, here and after the test."""
    from sglang.srt.layers import deep_gemm_wrapper

    from sglang_moe_plugins.integrations.sglang import refresh_host_state

    monkeypatch.setattr(deep_gemm_wrapper, "DEEPGEMM_SCALE_UE8M0", True)
    refresh_host_state()
    yield
    monkeypatch.undo()
    refresh_host_state()


def test_ue8m0_mode_is_read_once(runner, host_ue8m0, monkeypatch):
    from sglang.srt.layers import deep_gemm_wrapper

    gateup, masked = gateup_for(8, 8, 1536, seed=9), ragged_masked(8, 8, seed=9)
    assert call_hooked(runner, gateup, masked, 6)[1].dtype == torch.int32
    monkeypatch.setattr(deep_gemm_wrapper, "DEEPGEMM_SCALE_UE8M0", False)  # not re-read on every call
    assert call_hooked(runner, gateup, masked, 6)[1].dtype == torch.int32


def test_ue8m0_mode_returns_packed_scales(runner, host_ue8m0):
    gateup = gateup_for(8, 6, 1536, seed=4)
    masked = ragged_masked(8, 6, seed=4)
    for limit in (None, 10.0):
        out, scale = call_hooked(runner, gateup, masked, 6, swiglu_limit=limit)
        assert scale.dtype == torch.int32 and scale.shape == (8, 6, 3) and scale.stride() == (24, 1, 8)
        shape, config = smq.describe(
            gateup, masked, group_size=128, topk=6, swiglu_limit=limit, scale_layout="ue8m0_packed"
        )
        check_against_fp64(smq.SiluMulQuantInputs(gateup, masked), smq.SiluMulQuantOutputs(out, scale), shape, config)


def test_swizzle_and_keep_fp32_branches(runner):
    if "silu_mul_keep_fp32" not in installed_parameters(SMQ_TARGET):
        pytest.skip("this SGLang release's target has no silu_mul_keep_fp32 (9 parameters)")
    gateup = gateup_for(4, 8, 512, seed=5)
    masked = ragged_masked(4, 8, seed=5)
    out, scale = call_hooked(runner, gateup, masked, 2, swiglu_limit=10.0, swizzle=True, silu_mul_keep_fp32=True)
    shape, config = smq.describe(
        gateup, masked, group_size=128, topk=2, swiglu_limit=10.0, swizzle=True, scale_layout="row_major"
    )
    check_against_fp64(smq.SiluMulQuantInputs(gateup, masked), smq.SiluMulQuantOutputs(out, scale), shape, config)


@pytest.mark.parametrize(
    "e, n, d, limit",
    [
        pytest.param(128, 64, 512, 10.0, id="Qwen3.5-35B-A3B-EP2-limit"),
        pytest.param(128, 6, 512, None, id="N6-plain"),
        pytest.param(32, 6, 2048, 10.0, id="DSV4-Flash-EP8-N6"),
    ],
)
def test_stock_sglang_fails_where_the_hook_succeeds(runner, e, n, d, limit):
    """The original function (read from the hook's __wrapped__) crashes on CPU or asserts; the hook answers."""
    original = runner._varlen_deep_gemm_silu_mul_quant.__wrapped__
    gateup = gateup_for(e, n, d, seed=6)
    masked = ragged_masked(e, n, seed=6)
    with pytest.raises((AssertionError, NotImplementedError, RuntimeError)):
        original(gateup, masked, 128, 8, swiglu_limit=limit)
    out, scale = call_hooked(runner, gateup, masked, 8, swiglu_limit=limit)
    shape, config = smq.describe(
        gateup,
        masked,
        group_size=128,
        topk=8,
        swiglu_limit=limit,
        scale_layout="row_major" if limit else "column_major",
    )
    check_against_fp64(smq.SiluMulQuantInputs(gateup, masked), smq.SiluMulQuantOutputs(out, scale), shape, config)


def test_gemm1_alpha_goes_to_the_original(runner):
    gateup = gateup_for(2, 4, 256, seed=7)
    masked = ragged_masked(2, 4, seed=7)
    before = api.get_selector().cache_info()["decisions"]
    try:
        call_hooked(runner, gateup, masked, 2, gemm1_alpha=1.702, gemm1_clamp_limit=7.0)
    except Exception as exc:  # noqa: BLE001 - the original has no CPU kernel
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_filename)
            tb = tb.tb_next
        assert any("sglang/srt/layers/moe/moe_runner/deep_gemm.py" in f for f in frames)
    assert api.get_selector().cache_info()["decisions"] == before


def test_invalid_call_raises_our_error(runner):
    """An invalid call is not handed to SGLang (whose assertions would name something else): it raises
    InvalidArgumentError naming the argument (more cases: test_failure_policy.py)."""
    gateup = gateup_for(2, 4, 256, seed=8).float()
    masked = ragged_masked(2, 4, seed=8)
    with pytest.raises(
        InvalidArgumentError,
        match=r"^silu_mul_quant: invalid argument gateup.dtype=torch.float32; allowed: torch.bfloat16$",
    ):
        call_hooked(runner, gateup, masked, 2)


def test_positional_and_keyword_calls_share_one_bound_op(runner, fresh_selector):
    gateup, masked = gateup_for(3, 8, 512, seed=10), ragged_masked(3, 8, seed=10)
    names = (
        "gateup_output",
        "masked_m",
        "group_size",
        "topk",
        "swiglu_limit",
        "swizzle",
        "gemm1_alpha",
        "gemm1_clamp_limit",
        "num_real_tokens",
        "silu_mul_keep_fp32",
    )
    values = (gateup, masked, 128, 2, 10.0, False, None, None, 5, False)
    shape, config = smq.describe(gateup, masked, group_size=128, topk=2, swiglu_limit=10.0, scale_layout="row_major")
    for split in (10, 0, 4, 2, 5):  # positional, keyword, mixed, as SGLang calls it, defaults left out below
        args, kwargs = values[:split], dict(zip(names[split:], values[split:]))
        if split == 5:
            kwargs = {"num_real_tokens": 5}
        out, scale = runner._varlen_deep_gemm_silu_mul_quant(*args, **kwargs)
        check_against_fp64(smq.SiluMulQuantInputs(gateup, masked), smq.SiluMulQuantOutputs(out, scale), shape, config)
    info = fresh_selector.cache_info()
    assert (info["decisions"], info["bound"], info["call_keys"]) == (1, 1, 1)
    with pytest.raises(TypeError):  # not a call of the host function: SGLang's own TypeError
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2, swizle=True)


def test_nine_parameter_host_signature(fresh_selector):
    """SGLang 0.5.16-0.5.20's function has no silu_mul_keep_fp32; the same hook serves it (wrapped the way
    SGLang's HookRegistry wraps a target)."""
    from sglang_moe_plugins.integrations.sglang import silu_mul_quant_hook

    def host(
        gateup_output,
        masked_m,
        group_size,
        topk,
        swiglu_limit=None,
        swizzle=False,
        gemm1_alpha=None,
        gemm1_clamp_limit=None,
        num_real_tokens=None,
    ):
        raise AssertionError("a modelled call reached the original")

    gateup, masked = gateup_for(2, 4, 256, seed=11), ragged_masked(2, 4, seed=11)
    for args, kwargs in (
        ((gateup, masked, 128, 2, 10.0, False, None, None, 3), {}),
        (
            (gateup, masked),
            dict(
                group_size=128,
                topk=2,
                swiglu_limit=10.0,
                swizzle=False,
                gemm1_alpha=None,
                gemm1_clamp_limit=None,
                num_real_tokens=3,
            ),
        ),
    ):
        out, scale = silu_mul_quant_hook(host, *args, **kwargs)
        assert out.shape == (2, 4, 256) and scale.shape == (2, 4, 2) and scale.stride() == (8, 2, 1)
    assert fresh_selector.cache_info()["call_keys"] == 1


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=300
    )


HOOKED_PROBE = """
    import logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
    {pre}
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    load_plugins()
    print("BEFORE", sorted(t for t in HookRegistry._patched if "moe" in t))  # deferred until the runner is imported
    import sglang.srt.layers.moe.moe_runner.deep_gemm  # as a scheduler building a MoE model does
    print("PATCHED", sorted(t for t in HookRegistry._patched if "moe" in t))
    print("ALL", sorted(HookRegistry._patched))  # the contig activation target is outside sglang.srt.layers.moe
"""


def test_sglang_plugins_allowlist_is_honoured():
    skipped = _run_python(HOOKED_PROBE.format(pre=""), SGLANG_PLUGINS="some_other_plugin")
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    assert "PATCHED []" in skipped.stdout
    assert "Skipping plugin moe_plugins (not in SGLANG_PLUGINS)" in skipped.stdout + skipped.stderr
    allowed = _run_python(HOOKED_PROBE.format(pre=""), SGLANG_PLUGINS="moe_plugins")
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert all(target in allowed.stdout.split("\nALL", 1)[1] for target in hooked_targets())
    assert "BEFORE []" in allowed.stdout  # nothing hooked, nothing of the MoE runner imported, until SGLang imports it


def test_version_guard_skips_a_missing_target_and_warns():
    pre = f"""
    from sglang_moe_plugins.integrations import sglang as integ
    t = integ.KNOWN_TARGETS[integ.sglang_version()]
    integ.KNOWN_TARGETS[integ.sglang_version()] = (integ.HookTarget("{SMQ_TARGET}_renamed", t[0].op, t[0].parameters), *t[1:])
    """
    result = _run_python(HOOKED_PROBE.format(pre=textwrap.dedent(pre).replace("\n", "\n    ")))
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout + result.stderr
    assert f"not hooking {SMQ_TARGET}_renamed: cannot resolve" in out
    from sglang_moe_plugins.integrations.sglang.versions import version_case

    # the layout guard and policy need the masked op's hook (HookTarget.requires): they go with it
    needs_smq = {t.path for t in version_case().targets if SMQ_TARGET in t.requires}
    kept = sorted(t for t in hooked_targets() - {SMQ_TARGET} - needs_smq if "moe" in t)
    assert f"PATCHED {kept}" in result.stdout


def test_version_guard_unknown_version_hooks_nothing():
    """A release older than the table (here: every installed release, against a table of 9.9.9) is not hooked."""
    pre = """
    from sglang_moe_plugins.integrations.sglang import versions as sv
    entry = sv.KNOWN_TARGETS[sv.sglang_version()]
    sv.KNOWN_TARGETS.clear()
    sv.KNOWN_TARGETS["9.9.9"] = entry
    """
    result = _run_python(HOOKED_PROBE.format(pre=textwrap.dedent(pre).replace("\n", "\n    ")))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "is not in the version table (known: 9.9.9); no hooks" in result.stdout + result.stderr
    assert "PATCHED []" in result.stdout


def test_signature_change_is_detected():
    from sglang_moe_plugins.integrations.sglang import HookTarget, check_targets

    table = {"0.5.23": (HookTarget(SMQ_TARGET, "silu_mul_quant", ("gateup_output", "masked_m")),)}
    (check,) = check_targets("0.5.23", table)  # the version is only the table's key here
    assert not check.ok and "signature differs" in check.reason


def test_invalid_config_is_reported_and_sglang_keeps_running(tmp_path):
    """With on_config_error = stock (the default fails closed: tests/test_config_fail_closed.py)."""
    bad = tmp_path / "bad.toml"
    bad.write_text('on_config_error = "stock"\nenable = ["jit_epp"]\n')
    result = _run_python(HOOKED_PROBE.format(pre=""), SGLANG_MOE_PLUGINS_CONFIG=str(bad))
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout + result.stderr
    assert (
        "sglang-moe-plugins is NOT active (on_config_error = stock): invalid configuration: unknown plugin 'jit_epp'"
        in out
    )
    assert "PATCHED []" in result.stdout
