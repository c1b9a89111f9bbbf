"""Issue 7.6: the dispatched silu_mul_quant call inside CUDA graphs (skipped without CUDA).

Run on the GPU machine from the repository root (the lead runs these):

    PYTHONPATH=. python -m pytest -q tests/gpu/test_cuda_graphs.py

What is checked:

- ``triton`` path: ``Selector.dispatch`` (what SGLang's hook calls) is warmed up eagerly (selection and
  Triton compilation happen there), captured in a ``torch.cuda.CUDAGraph``, replayed with different
  ``masked_m`` contents (ragged, all full, all empty, one hot, counts above N and negative, which the op
  clamps) and different inputs, and each replay equals an eager call on the same data, byte for byte,
  and is within the tolerance policy against fp64. Capture makes no new selection.
- ``reference`` path: it reads masked_m on the host, so it cannot be captured. It refuses with
  KernelNotAvailableError before touching the device (the capture itself stays valid), the failure is
  not remembered (the reference still serves eager calls), and nothing falls back inside the capture.
- Selection and fallback do not break capture: a plugin that fails at run time during the eager
  warm-up is excluded before capture, and the graph records the fallback (``triton``).
- A plugin that fails only while capturing is not remembered as failed and is not replaced inside the
  capture (the error is raised).
- Through SGLang's real hooked function when SGLang is importable (the GPU machine usually lacks it).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA device", allow_module_level=True)

from builtin_eps import builtin_entry_points  # noqa: E402

from sglang_moe_plugins import KernelNotAvailableError, Plugin, Registry, Selector, Support, UserConfig  # noqa: E402
from sglang_moe_plugins.config import parse_config  # noqa: E402
from sglang_moe_plugins.hardware import local_platform  # noqa: E402
from sglang_moe_plugins.ops import silu_mul_quant as smq  # noqa: E402
from sglang_moe_plugins.testing.case import poison  # noqa: E402
from sglang_moe_plugins.testing.ops.silu_mul_quant import compare_with_fp64, tolerance_for  # noqa: E402

pytestmark = pytest.mark.gpu
OP = smq.OP
DEVICE = torch.device("cuda")


def registry(config: UserConfig | None = None, extra=()) -> Registry:
    reg = Registry.discover(config or UserConfig(), builtin_entry_points())
    if extra:
        plugins = [r.plugin for r in reg.records()] + list(extra)
        reg = Registry.from_plugins(plugins, config or UserConfig())
    return reg


def triton_usable() -> bool:
    reg = registry()
    return "triton" in reg and bool(reg.get("triton").plugin.available(local_platform()))


needs_triton = pytest.mark.skipif(not triton_usable(), reason="the triton plugin is not available on this device")


def masked_patterns(e: int, n: int, gen: torch.Generator) -> list[list[int]]:
    ragged = torch.randint(0, n + 1, (e,), generator=gen).tolist()
    hot = [0] * e
    hot[e // 2] = n
    wild = [(n + 3) if i % 3 == 0 else (-2 if i % 3 == 1 else n // 2) for i in range(e)]  # clamped to [0, N]
    return [ragged, [n] * e, [0] * e, hot, wild]


def data(e: int, n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(e, n, 2 * d, generator=gen) * torch.exp2(torch.randint(-6, 6, (e, n, 1), generator=gen).float())
    return x.to(torch.bfloat16).to(DEVICE)


def same_real_rows(a: smq.SiluMulQuantOutputs, b: smq.SiluMulQuantOutputs, masked: torch.Tensor, n: int) -> bool:
    real = smq.real_rows(masked.cpu(), n)
    a_out, b_out = a.out.cpu().view(torch.uint8), b.out.cpu().view(torch.uint8)
    a_s, b_s = a.scale.cpu(), b.scale.cpu()
    return torch.equal(a_out[real], b_out[real]) and torch.equal(
        a_s[real].view(torch.int32), b_s[real].view(torch.int32)
    )


def warm_up(selector: Selector, inputs, shape, config, times: int = 2):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(times):
            selector.dispatch(OP, inputs, shape, config)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def capture_and_check(
    selector: Selector,
    e: int,
    n: int,
    d: int,
    *,
    limit=None,
    swizzle=False,
    layout="column_major",
    expect: str = "triton",
) -> None:
    static_x = data(e, n, d, seed=1)
    static_m = torch.full((e,), n, dtype=torch.int32, device=DEVICE)
    shape, config = smq.describe(
        static_x, static_m, group_size=128, topk=2, swiglu_limit=limit, swizzle=swizzle, scale_layout=layout
    )
    inputs = smq.SiluMulQuantInputs(static_x, static_m)
    warm_up(selector, inputs, shape, config)
    assert selector.explain(OP, shape, config).chosen.name == expect
    decisions = selector.cache_info()["decisions"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = selector.dispatch(OP, inputs, shape, config)
    assert selector.cache_info()["decisions"] == decisions, "capture made a new selection"
    gen = torch.Generator().manual_seed(e * 1000 + n)
    for trial, pattern in enumerate(masked_patterns(e, n, gen)):
        x = data(e, n, d, seed=100 + trial)
        m = torch.tensor(pattern, dtype=torch.int32, device=DEVICE)
        static_x.copy_(x)
        static_m.copy_(m)
        poison(static_out)
        graph.replay()
        torch.cuda.synchronize()
        eager_inputs = smq.SiluMulQuantInputs(x.clone(), m.clone())
        eager = selector.dispatch(OP, eager_inputs, shape, config)
        torch.cuda.synchronize()
        assert same_real_rows(static_out, eager, m, n), f"replay {trial} (masked_m={pattern}) differs from eager"
        verdict = compare_with_fp64(eager_inputs, static_out, shape, config, tolerance_for(config))
        assert verdict.ok, f"replay {trial}: {verdict.message}"


# -- triton: must capture ------------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize(
    "e, n, d, limit, swizzle, layout",
    [
        (8, 64, 512, None, False, "column_major"),
        (8, 6, 512, 10.0, False, "row_major"),  # N not a multiple of 4, swiglu_limit
        (32, 16, 2048, 10.0, True, "row_major"),  # swizzle
        (16, 12, 1536, None, False, "ue8m0_packed"),  # G = 12: three packed words
        (128, 4, 512, 10.0, False, "column_major"),  # D // 8 < E (SGLang's JIT kernel rejects it)
        (1, 1, 128, None, False, "column_major"),
    ],
)
def test_triton_dispatch_captures_and_replays_like_eager(e, n, d, limit, swizzle, layout):
    selector = Selector(registry(parse_config({"force": {OP: "triton"}})))
    capture_and_check(selector, e, n, d, limit=limit, swizzle=swizzle, layout=layout)


@needs_triton
def test_default_selection_captures_with_triton():
    """No force: the default priorities pick triton for this shape, before capture, and capture works."""
    selector = Selector(registry())
    capture_and_check(selector, 8, 6, 512, limit=10.0, layout="row_major", expect="triton")


# -- reference: cannot be captured, refuses clearly -----------------------------------------------------
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "only-plugin"])
def test_reference_refuses_capture_and_stays_usable(forced, caplog):
    config = parse_config({"force": {OP: "reference"}}) if forced else UserConfig()
    if forced:
        selector = Selector(registry(config))
    else:
        from sglang_moe_plugins.plugins.reference import ReferencePlugin

        selector = Selector(Registry.from_plugins([ReferencePlugin()]))
    x = data(4, 8, 256, seed=2)
    m = torch.tensor([8, 0, 3, 5], dtype=torch.int32, device=DEVICE)
    shape, config_ = smq.describe(x, m, group_size=128, topk=2)
    inputs = smq.SiluMulQuantInputs(x, m)
    warm_up(selector, inputs, shape, config_)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(KernelNotAvailableError, match="cannot run inside CUDA graph capture"):
        with torch.cuda.graph(graph):
            selector.dispatch(OP, inputs, shape, config_)
    assert selector.failed_plugins() == {}, "a capture-only failure must not exclude the plugin"
    out = selector.dispatch(OP, inputs, shape, config_)  # eager still works, with the reference
    torch.cuda.synchronize()
    assert selector.explain(OP, shape, config_).chosen.name == "reference"
    assert compare_with_fp64(inputs, out, shape, config_, tolerance_for(config_)).ok


# -- selection and fallback around capture --------------------------------------------------------------
class FailsAtRunTime(Plugin):
    """Accepts every CUDA call, fails in run() before launching anything (e.g. an unsupported tile)."""

    name = "fails_at_run_time"
    op = OP
    priority = 10_000

    def supports(self, shape, config):
        return Support.yes("accepts") if config.platform.is_cuda else Support.no("CUDA only")

    def run(self, inputs, outputs, shape, config):
        raise RuntimeError("no kernel for this tile")


class FailsOnlyWhileCapturing(FailsAtRunTime):
    name = "fails_only_while_capturing"

    def run(self, inputs, outputs, shape, config):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("this kernel allocates a workspace with cudaMalloc")
        from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference

        silu_mul_quant_reference(inputs, outputs, shape, config)


@needs_triton
def test_fallback_during_warm_up_then_capture_records_the_fallback():
    selector = Selector(registry(extra=[FailsAtRunTime()]))
    capture_and_check(selector, 8, 6, 512, limit=10.0, layout="row_major", expect="triton")
    (failed,) = selector.failed_plugins().values()
    assert list(failed) == ["fails_at_run_time"]


def test_failure_only_while_capturing_is_raised_not_remembered():
    selector = Selector(registry(extra=[FailsOnlyWhileCapturing()]))
    x = data(4, 8, 256, seed=3)
    m = torch.tensor([8, 1, 0, 4], dtype=torch.int32, device=DEVICE)
    shape, config = smq.describe(x, m, group_size=128, topk=2)
    inputs = smq.SiluMulQuantInputs(x, m)
    warm_up(selector, inputs, shape, config)
    assert selector.explain(OP, shape, config).chosen.name == "fails_only_while_capturing"
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cudaMalloc"):
        with torch.cuda.graph(graph):
            selector.dispatch(OP, inputs, shape, config)
    assert selector.failed_plugins() == {}
    assert selector.explain(OP, shape, config).chosen.name == "fails_only_while_capturing"


# -- through SGLang's hooked function, when SGLang is importable here -----------------------------------
@needs_triton
def test_sglang_hooked_function_captures():
    pytest.importorskip("sglang")
    from sglang_session import loaded_sglang

    from sglang_moe_plugins import api

    runner = loaded_sglang()
    hooked = runner._varlen_deep_gemm_silu_mul_quant
    e, n, d = 8, 6, 512
    static_x = data(e, n, d, seed=4)
    static_m = torch.full((e,), n, dtype=torch.int32, device=DEVICE)
    for _ in range(2):
        hooked(static_x, static_m, 128, 2, swiglu_limit=10.0)
    torch.cuda.synchronize()
    shape, config = smq.describe(
        static_x, static_m, group_size=128, topk=2, swiglu_limit=10.0, scale_layout="row_major"
    )
    assert api.get_selector().explain(OP, shape, config).chosen.name == "triton"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, scale = hooked(static_x, static_m, 128, 2, swiglu_limit=10.0)
    for trial, pattern in enumerate(masked_patterns(e, n, torch.Generator().manual_seed(5))):
        x = data(e, n, d, seed=200 + trial)
        m = torch.tensor(pattern, dtype=torch.int32, device=DEVICE)
        static_x.copy_(x)
        static_m.copy_(m)
        graph.replay()
        eager_out, eager_scale = hooked(x.clone(), m.clone(), 128, 2, swiglu_limit=10.0)
        torch.cuda.synchronize()
        assert same_real_rows(
            smq.SiluMulQuantOutputs(out, scale), smq.SiluMulQuantOutputs(eager_out, eager_scale), m, n
        )
