"""Issue 3 on the GPU: ``jit_ep`` and ``fp8_fallback`` run SGLang 0.5.23's own CUDA kernels (built from
the sglang wheel's JIT sources through tvm-ffi, ``sglang_moe_plugins/bench/sglang_kernels.py``) through the plugins' own
argument and layout handling, against the ``reference`` plugin, for every catalog shape they support.

Skipped without CUDA, tvm-ffi or the JIT sources. Run on the GPU machine from the repository root:
``SGL_JIT_ROOT=.device/sgl_jit/sglang/kernels/jit PYTHONPATH=.:/tmp/site python -m pytest -q tests/gpu``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA device", allow_module_level=True)
from sglang_host import sglang_jit  # noqa: E402

JIT, WHY_NOT = sglang_jit("/tmp/sgl_jit_build")
if JIT is None:  # pragma: no cover - depends on the machine
    pytest.skip(WHY_NOT, allow_module_level=True)

from sglang_moe_plugins.catalog import load_catalog  # noqa: E402
from sglang_moe_plugins.hardware import platform_of  # noqa: E402
from sglang_moe_plugins.ops import silu_mul_quant as smq  # noqa: E402
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference  # noqa: E402
from sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback import Fp8FallbackPlugin  # noqa: E402
from sglang_moe_plugins.plugins.sglang_kernels.host import use_host_kernels  # noqa: E402
from sglang_moe_plugins.plugins.sglang_kernels.jit_ep import JitEpPlugin  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def host_kernels():
    with use_host_kernels(JIT.host_kernels()) as kernels:
        yield kernels
    print("\n".join(JIT.log))


def _cases():
    seen = set()
    for model in load_catalog():
        if model.gpt_oss_activation:
            continue
        for ep in (1, 2, 4, 8):
            if model.experts % ep:
                continue
            e, d = model.experts // ep, model.inter
            for n in (64, 6):
                for limit in (None, 10.0):
                    for layout in ("row_major", "column_major", "ue8m0_packed"):
                        key = (e, n, d, model.topk, limit, layout)
                        if key not in seen:
                            seen.add(key)
                            yield pytest.param(
                                key, id=f"{model.short_name}-EP{ep}-N{n}-{'lim' if limit else 'silu'}-{layout}"
                            )


def _run(plugin, key, seed, within_budget=True):
    e, n, d, topk, limit, layout = key
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(e, n, 2 * d, device="cuda", generator=gen)
    x *= torch.exp2(torch.randint(-6, 7, (e, n, 1), device="cuda", generator=gen).float())
    gateup = x.to(torch.bfloat16)
    masked = torch.randint(0, n + 1, (e,), device="cuda", generator=gen, dtype=torch.int32)
    masked[0] = n
    if e > 1:
        masked[1] = 0
    if within_budget:
        # the host guarantees sum(masked_m) <= N * topk: experts past that budget are emptied; expert 0
        # keeps its N rows, so every case has real rows to check
        masked[masked.cumsum(0) > n * topk] = 0
    else:  # every expert full: sum(masked_m) = E * N, beyond the host's guarantee
        masked.fill_(n)
    shape, config = smq.describe(gateup, masked, group_size=128, topk=topk, swiglu_limit=limit, scale_layout=layout)
    support = plugin.supports(shape, config)
    if not support:
        pytest.skip(f"{plugin.name}: {support.reason}")
    inputs = smq.SiluMulQuantInputs(gateup.clone(), masked)
    outputs = smq.allocate_outputs(shape, config, gateup.device)
    outputs.out.view(torch.uint8).fill_(0x7F)
    outputs.scale.fill_(-1 if config.scale_ue8m0 else float("nan"))
    plugin.run(inputs, outputs, shape, config)
    torch.cuda.synchronize()
    smq.validate_outputs(outputs, shape, config, plugin.name)
    ref = smq.allocate_outputs(shape, config, gateup.device)
    silu_mul_quant_reference(smq.SiluMulQuantInputs(gateup, masked), ref, shape, config)
    real = smq.real_rows(masked, n)
    assert int(real.sum()) >= n > 0
    return outputs, ref, real, shape, config


def _fp8_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in representable fp8 values (same sign ordering as uint8 codes)."""
    ia, ib = a.view(torch.uint8).to(torch.int32), b.view(torch.uint8).to(torch.int32)
    sa = torch.where(ia >= 128, -(ia - 128), ia)
    sb = torch.where(ib >= 128, -(ib - 128), ib)
    return (sa - sb).abs()


def _assert_jit_ep_matches(outputs, ref, real, shape, config) -> None:
    assert not torch.isnan(outputs.out[real].float()).any(), "a real row was not written"
    got_s = smq.scale_to_float(outputs.scale, shape, config)[real]
    ref_s = smq.scale_to_float(ref.scale, shape, config)[real]
    if config.scale_ue8m0:
        assert torch.equal(got_s, ref_s)
    else:
        torch.testing.assert_close(got_s, ref_s, rtol=1e-6, atol=0)
    steps = _fp8_steps(outputs.out[real], ref.out[real])
    assert steps.max().item() <= 1
    assert (steps == 0).float().mean().item() >= 0.999


@pytest.mark.parametrize("key", list(_cases()))
def test_jit_ep_matches_reference(host_kernels, key):
    outputs, ref, real, shape, config = _run(JitEpPlugin(), key, seed=hash(key) % 1000)
    assert platform_of(outputs.out).is_cuda
    _assert_jit_ep_matches(outputs, ref, real, shape, config)


@pytest.mark.parametrize("layout", ["row_major", "ue8m0_packed"])
@pytest.mark.parametrize("e, n, topk", [(32, 64, 6), (2, 4, 1), (256, 8, 8)])
def test_jit_ep_writes_rows_beyond_n_times_topk(host_kernels, e, n, topk, layout):
    """sum(masked_m) > N * topk (outside the host's guarantee; found by the GPU fuzz): SGLang's kernel
    caps its rows at N * topk, so the plugin passes topk >= E and every real row is still written."""
    outputs, ref, real, shape, config = _run(
        JitEpPlugin(), (e, n, 2048, topk, None, layout), seed=e + n, within_budget=False
    )
    assert int(real.sum()) == e * n > n * topk
    _assert_jit_ep_matches(outputs, ref, real, shape, config)


@pytest.mark.parametrize("key", list(_cases()))
def test_fp8_fallback_matches_reference(host_kernels, key):
    """SGLang's legacy mode rounds SiLU to bf16 before the product: checked with the looser documented bound."""
    outputs, ref, real, shape, config = _run(Fp8FallbackPlugin(), key, seed=hash(key) % 1000 + 1)
    assert not torch.isnan(outputs.out[real].float()).any(), "a real row was not written"
    got = smq.dequantize(outputs, shape, config)[real]
    want = smq.dequantize(ref, shape, config)[real]
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 3e-2, f"relative error {rel:.3e}"
    got_s = smq.scale_to_float(outputs.scale, shape, config)[real]
    ref_s = smq.scale_to_float(ref.scale, shape, config)[real]
    torch.testing.assert_close(got_s, ref_s, rtol=1e-2 if not config.scale_ue8m0 else 1.0, atol=0)
