"""DeepGEMM's real SM90 MegaMoE (``deep_gemm.fp8_mega_moe``) through the ``mega_sm90_fp8`` plugin.

On one H200 (compute capability 9.0) with sgl-deep-gemm 0.1.5.post1 + apache-tvm-ffi 0.1.11 (the
release built for torch 2.11) and a process group of one rank. Skipped cleanly without CUDA, on
another architecture, or without ``deep_gemm``. Each case: fresh random non-zero inputs, ``y``
poisoned with NaN, compared per case and per row with ``mega_reference``'s SM90 emulation
(the bound: ``mega_sm90_common.CASE_RTOL`` / ``ROW_RTOL``, docs/mega-moe.md).

Every distinct (shape, token-count class, clamp) is a new JIT build of the kernel (tens of seconds
on a fresh machine), so the cases share a few: the catalog sweep runs each model at T = 1 and 512
(the smallest also at 7); routings, clamp/rsf, pre-dispatch, graphs and the SGLang hook run on the
smallest catalog shape at T in {0, 1, 7, 64, 96, 512}. ``tests/gpu/run_mega_sm90.sh`` runs this file.
"""

from __future__ import annotations

import sys
import types
import zlib

import pytest

torch = pytest.importorskip("torch")

from mega_sm90_common import (  # noqa: E402
    CASE_RTOL,
    DEEPGEMM_CALC_DIFF_TOL,
    MAX_TOKENS,
    ROW_RTOL,
    SHAPES,
    build_case,
    case_rtol,
    case_rtol_for,
    compare,
    direct_buffer,
    direct_call,
    env_ok,
    poisoned_outputs,
    reference,
    run_plugin,
    single_rank_group,
    sm90_plugin,
    with_tokens,
)

_why = env_ok()
if _why is not None:  # pragma: no cover - depends on the machine
    pytest.skip(_why, allow_module_level=True)

pytestmark = pytest.mark.gpu

SMALL = "qwen3-30b-a3b"


@pytest.fixture(scope="module")
def group():
    return single_rank_group()


def _case(group, name: str = SMALL, **kwargs):
    _, experts, hidden, inter, top_k = SHAPES[name]
    return build_case(group, experts=experts, hidden=hidden, inter=inter, top_k=top_k, label=name, **kwargs)


def _check(case, y: torch.Tensor) -> None:
    ref = reference(case)
    res = compare(y, ref)
    print(f"{case.label} T={case.num_tokens}: {res.text()}")
    assert torch.isfinite(y).all(), f"{case.label}: rows left unwritten (NaN poison) or non-finite"
    assert res.zero_rows_ok, f"{case.label}: a token with every slot masked got a non-zero row"
    bound = case_rtol_for(case)
    assert res.ok(bound), f"{case.label}: {res.text()} (case bound {bound:.0e})"
    assert res.calc_diff < DEEPGEMM_CALC_DIFF_TOL, f"{case.label}: {res.text()} (DeepGEMM's own calc_diff bound)"


CATALOG_RUNS = [(SMALL, 1), (SMALL, 7), (SMALL, MAX_TOKENS)] + [
    (name, t) for name in SHAPES if name != SMALL for t in (1, MAX_TOKENS)
]


@pytest.mark.parametrize("name,tokens", CATALOG_RUNS)
def test_catalog_shapes(group, name: str, tokens: int) -> None:
    case = _case(group, name, tokens=tokens, seed=zlib.crc32(f"{name}/{tokens}".encode()) % 10_000)
    _check(case, run_plugin(case))


def test_zero_tokens(group) -> None:
    case = _case(group, tokens=0, seed=3)
    out = poisoned_outputs(case)
    sm90_plugin().run(case.inputs, out, case.shape, case.config)
    torch.cuda.synchronize()
    assert out.y.shape == (1, case.shape.hidden)


@pytest.mark.parametrize("routing", ["random", "distinct", "unused", "hot", "masked"])
@pytest.mark.parametrize("tokens", [7, 96])
def test_routings(group, routing: str, tokens: int) -> None:
    case = _case(group, tokens=tokens, routing=routing, seed=tokens * 7 + len(routing))
    y = run_plugin(case)
    if routing == "masked":
        assert torch.equal(y, torch.zeros_like(y))
    _check(case, y)


@pytest.mark.parametrize("clamp,rsf", [(None, 1.0), (None, 2.5), (10.0, 2.5), (1.0, 1.0)])
@pytest.mark.parametrize("tokens", [7, MAX_TOKENS])
def test_clamp_and_routed_scaling(group, clamp, rsf: float, tokens: int) -> None:
    case = _case(group, tokens=tokens, clamp=clamp, rsf=rsf, seed=11 + tokens)
    _check(case, run_plugin(case))


def test_clamp_is_active(group) -> None:
    on = run_plugin(_case(group, tokens=7, clamp=1.0, seed=5))
    off = run_plugin(_case(group, tokens=7, clamp=None, seed=5))
    assert not torch.equal(on, off)


@pytest.mark.parametrize("tokens", [1, 64, MAX_TOKENS])
def test_pre_dispatch_choices_identical(group, tokens: int) -> None:
    case = _case(group, tokens=tokens, rsf=2.5, seed=21 + tokens)
    ys = {choice: run_plugin(case, choice) for choice in ("triton", "host", "torch")}
    assert torch.equal(ys["triton"], ys["host"]), "triton vs host pre-dispatch"
    assert torch.equal(ys["torch"], ys["host"]), "torch vs host pre-dispatch"
    _check(case, ys["host"])


@pytest.mark.parametrize("tokens", [1, 64])
def test_plugin_equals_deep_gemm_called_directly(group, tokens: int) -> None:
    case = _case(group, tokens=tokens, seed=31 + tokens)
    direct = direct_call(case, direct_buffer(group, case.shape)).clone()
    torch.cuda.synchronize()
    assert torch.equal(run_plugin(case, "host"), direct)


@pytest.mark.parametrize("pre_dispatch", ["triton", "host"])
@pytest.mark.parametrize("tokens", [1, 64])
def test_cuda_graph_replay_equals_eager(group, pre_dispatch: str, tokens: int) -> None:
    case = _case(group, tokens=tokens, seed=41 + tokens)
    plugin = sm90_plugin(pre_dispatch)
    out = poisoned_outputs(case)
    static = with_tokens(
        case, case.inputs.hidden_states.clone(), case.inputs.topk_ids.clone(), case.inputs.topk_weights.clone()
    )
    plugin.run(static.inputs, out, static.shape, static.config)  # warm up: JIT build, buffer
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            plugin.run(static.inputs, out, static.shape, static.config)
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (101, 102):
        fresh = _case(group, tokens=tokens, seed=seed)
        static.inputs.hidden_states.copy_(fresh.inputs.hidden_states)
        static.inputs.topk_ids.copy_(fresh.inputs.topk_ids)
        static.inputs.topk_weights.copy_(fresh.inputs.topk_weights)
        out.y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = run_plugin(
            with_tokens(case, fresh.inputs.hidden_states, fresh.inputs.topk_ids, fresh.inputs.topk_weights),
            pre_dispatch,
        )
        assert torch.equal(out.y[:tokens], eager), f"replay with seed {seed} differs from eager"


# -- SGLang 0.5.23's run_mega_routed_experts arguments, through our hook ----------------------------


def _install_parallel_state(group, monkeypatch) -> None:
    """Without SGLang on this machine, give ``sglang.srt.runtime_context.get_parallel`` (what the
    adapter reads the EP group from) the one-rank group. With SGLang installed, nothing is replaced."""
    try:
        import sglang.srt.runtime_context  # noqa: F401

        pytest.skip("SGLang is installed: run the hook through its own parallel state instead")
    except ImportError:
        pass
    state = types.SimpleNamespace(moe_ep_group=types.SimpleNamespace(device_group=group))
    mod = types.ModuleType("sglang.srt.runtime_context")
    mod.get_parallel = lambda: state
    for name in ("sglang", "sglang.srt"):
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", mod)


def _experts(case):
    """The attributes SGLang's experts module has after ``build_sm90_mega_moe_experts_weights``."""
    return types.SimpleNamespace(
        num_experts=case.shape.num_experts,
        moe_ep_size=1,
        mega_l1_weights=case.inputs.l1_weights,
        mega_l2_weights=case.inputs.l2_weights,
        _mega_moe_sm90_fp8_weights=True,
        _mega_moe_weights_built=True,
    )


@pytest.mark.parametrize("style", ["deepseek", "qwen3"])
@pytest.mark.parametrize("tokens", [0, 1, 64])
def test_sglang_hook(group, monkeypatch, style: str, tokens: int) -> None:
    from sglang_moe_plugins import api
    from sglang_moe_plugins.integrations.sglang import mega_moe_hook

    monkeypatch.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", str(MAX_TOKENS))
    _install_parallel_state(group, monkeypatch)
    clamp = 10.0 if style == "deepseek" else None
    rsf = 2.5 if style == "deepseek" else 1.0
    case = _case(group, tokens=tokens, clamp=clamp, rsf=rsf, seed=51 + tokens)
    experts = _experts(case)
    x = case.inputs.hidden_states
    ids, weights = (case.inputs.topk_ids, case.inputs.topk_weights) if tokens else (None, None)
    kwargs = dict(
        hidden_size=case.shape.hidden,
        intermediate_size=case.shape.intermediate,
        top_k=case.shape.top_k,
        num_tokens=tokens,
    )
    if style == "deepseek":  # sglang/srt/layers/moe/mega_moe.py's forward: every keyword
        kwargs.update(
            activation_clamp=clamp,
            routed_scaling_factor=rsf,
            num_shared_experts=0,
            shared_l1_weights=None,
            shared_l2_weights=None,
            routing_in_buffer=False,
        )
    calls = []

    def original(experts_, hidden_states, topk_ids, topk_weights, **kw):  # SGLang's SM90 sequence
        calls.append(kw)
        return direct_call(case, direct_buffer(group, case.shape)).clone()

    api.reload()
    y = mega_moe_hook(original, experts, x, ids, weights, **kwargs)
    torch.cuda.synchronize()
    assert not calls, "the hook handed the call to SGLang's original"
    assert y.shape == (tokens, case.shape.hidden)
    want = original(experts, x, ids, weights, **kwargs)
    torch.cuda.synchronize()
    assert torch.equal(y, want), compare(y, want).text()
    if tokens:
        _check(case, y)


def test_bound_is_tighter_than_deepgemms_own() -> None:
    assert CASE_RTOL**2 / 2 < DEEPGEMM_CALC_DIFF_TOL / 1000
    assert CASE_RTOL <= 1e-2 and ROW_RTOL <= 3e-2
    for args in ((512, 1, 8, 32), (1, 1, 8, 32), (256, 2, 8, 32)):  # BLOCK_M 128, 64, EP=2 prefill
        assert case_rtol(*args) == CASE_RTOL
