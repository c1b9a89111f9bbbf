"""MegaMoE on a CUDA GPU: the Triton pre-dispatch kernels bit for bit against the torch reference,
and mega_reference on GPU against CPU. Skipped without CUDA (run by hand on the GPU machine)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _mega_cases import make_problem

from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.ops.mega_moe import formats as nm
from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

triton = pytest.importorskip("triton")
from sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_triton import PreDispatchTiling, pre_dispatch  # noqa: E402


def _activations(tokens: int, hidden: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    binades = torch.exp2(torch.randint(-14, 14, (tokens, 1), device="cuda", generator=gen).float())
    x = torch.randn(tokens, hidden, device="cuda", generator=gen) * binades
    if tokens > 3:
        x[0, :64] = 448.0 * 2.0**-3  # exact power-of-two scale edge
        x[1, :32] = 3e-7  # below both absmax floors' effects
        x[2, 32:64] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4, device="cuda")
        x[3, :] = 0.0
    return x.to(torch.bfloat16)


def _buffers(variant: str, rows: int, hidden: int, top_k: int):
    if variant == "mxf4xmxf4":
        x = torch.full((rows, hidden // 2), 0x5A, dtype=torch.int8, device="cuda")
    else:
        x = torch.full((rows, hidden), 0x5A, dtype=torch.int8, device="cuda").view(torch.float8_e4m3fn)
    if variant == "sm90_fp8":
        sf = torch.full((rows, hidden // 128), float("nan"), device="cuda")
    else:
        sf = torch.full((rows, hidden // 128), 0x5A5A5A5A, dtype=torch.int32, device="cuda")
    return (
        x,
        sf,
        torch.full((rows, top_k), 77, dtype=torch.int64, device="cuda"),
        torch.full((rows, top_k), float("nan"), device="cuda"),
    )


def _shared_sf(tokens: int, hidden: int, block_m: int) -> torch.Tensor:
    rows = -(-max(tokens, 1) // block_m) * (-(-block_m // 128) * 128)
    storage = torch.full((hidden // 128 * (rows + 4),), 0x3C3C3C3C, dtype=torch.int32, device="cuda")
    return torch.as_strided(storage, (rows, hidden // 128), (1, rows + 4))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point and a.dtype.itemsize == 4:
        return torch.equal(a.view(torch.int32), b.view(torch.int32))
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


CASES = [(1, 4096, 6), (7, 7168, 6), (64, 4096, 8), (333, 2048, 6), (2048, 4096, 6), (100, 2560, 9)]


@pytest.mark.parametrize("variant", ["fp8xfp4", "mxf4xmxf4", "sm90_fp8"])
@pytest.mark.parametrize("tokens,hidden,top_k", CASES)
@pytest.mark.parametrize("rsf", [1.0, 2.5])
def test_triton_pre_dispatch_bit_exact(variant: str, tokens: int, hidden: int, top_k: int, rsf: float) -> None:
    rows = 4096
    x = _activations(tokens, hidden, seed=tokens * 31 + hidden + int(rsf * 10))
    ids = torch.randint(-1, 256, (tokens, top_k), device="cuda", dtype=torch.int32)
    weights = torch.rand(tokens, top_k, device="cuda")
    want, got = _buffers(variant, rows, hidden, top_k), _buffers(variant, rows, hidden, top_k)
    nm.pre_dispatch_reference(x, ids, weights, *want, variant=variant, routed_scaling_factor=rsf)
    pre_dispatch(x, ids, weights, *got, variant=variant, routed_scaling_factor=rsf)
    torch.cuda.synchronize()
    for name, a, b in zip(("x", "x_sf", "topk_idx", "topk_weights"), want, got):
        assert _same(a, b), f"{variant} T={tokens} H={hidden}: {name} differs"


@pytest.mark.parametrize(
    "tiling",
    [
        PreDispatchTiling(1, 256, 4),
        PreDispatchTiling(16, 512, 8),
        PreDispatchTiling(2, 2048, 8, evict_first=True),
        PreDispatchTiling(1, 8192, 16),
        PreDispatchTiling(4, 1024, 8),
    ],
)
def test_tilings_agree(tiling: PreDispatchTiling) -> None:
    x = _activations(129, 7168, seed=7)
    ids = torch.randint(0, 384, (129, 6), device="cuda", dtype=torch.int32)
    weights = torch.rand(129, 6, device="cuda")
    for variant in ("fp8xfp4", "mxf4xmxf4", "sm90_fp8"):
        want, got = _buffers(variant, 256, 7168, 6), _buffers(variant, 256, 7168, 6)
        nm.pre_dispatch_reference(x, ids, weights, *want, variant=variant)
        pre_dispatch(x, ids, weights, *got, variant=variant, tiling=tiling)
        assert all(_same(a, b) for a, b in zip(want, got)), variant


@pytest.mark.parametrize("tokens,block_m", [(5, 32), (300, 48), (1000, 192)])
def test_shared_expert_scales(tokens: int, block_m: int) -> None:
    hidden = 4096
    x = _activations(tokens, hidden, seed=tokens)
    ids = torch.randint(0, 256, (tokens, 7), device="cuda", dtype=torch.int32)
    weights = torch.rand(tokens, 7, device="cuda")
    want, got = _buffers("fp8xfp4", 1024, hidden, 7), _buffers("fp8xfp4", 1024, hidden, 7)
    want_sf, got_sf = _shared_sf(tokens, hidden, block_m), _shared_sf(tokens, hidden, block_m)
    nm.pre_dispatch_reference(x, ids, weights, *want, variant="fp8xfp4", shared_x_sf=want_sf, shared_block_m=block_m)
    pre_dispatch(x, ids, weights, *got, variant="fp8xfp4", shared_x_sf=got_sf, shared_block_m=block_m)
    assert all(_same(a, b) for a, b in zip(want, got))
    assert torch.equal(
        want_sf.as_strided((want_sf.untyped_storage().nbytes() // 4,), (1,)),
        got_sf.as_strided((got_sf.untyped_storage().nbytes() // 4,), (1,)),
    )


def test_zero_tokens_only_pads() -> None:
    want, got = _buffers("fp8xfp4", 512, 4096, 6), _buffers("fp8xfp4", 512, 4096, 6)
    x = torch.empty(0, 4096, dtype=torch.bfloat16, device="cuda")
    nm.pre_dispatch_reference(x, None, None, *want, variant="fp8xfp4")
    pre_dispatch(x, None, None, *got, variant="fp8xfp4")
    assert all(_same(a, b) for a, b in zip(want, got))


@pytest.mark.parametrize("variant", ["fp8xfp4", "mxf4xmxf4", "sm90_fp8"])
def test_reference_on_gpu_matches_cpu(variant: str) -> None:
    cpu = make_problem(variant, rsf=2.5, shared=variant == "fp8xfp4", seed=90)
    gpu = make_problem(variant, rsf=2.5, shared=variant == "fp8xfp4", seed=90, device="cuda")
    outs = []
    for p in (cpu, gpu):
        out = mm.allocate_outputs(p.shape, p.config, p.inputs.device, num_tokens=p.inputs.num_tokens)
        MegaReferencePlugin().run(p.inputs, out, p.shape, p.config)
        outs.append(out.y.cpu().float())
    rel = ((outs[0] - outs[1]).norm() / outs[0].norm()).item()
    assert rel < 1e-2, rel
    assert dataclasses.replace(gpu.config, platform=cpu.config.platform) == cpu.config


# -- the prepared pre-dispatch launcher (issue 12) ------------------------------------------------------
from sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_triton import prepare_pre_dispatch  # noqa: E402


@pytest.mark.parametrize("variant", ["fp8xfp4", "mxf4xmxf4", "sm90_fp8"])
@pytest.mark.parametrize("hidden,top_k", [(1024, 8), (4096, 6), (7168, 9)])
def test_prepared_pre_dispatch_equals_jit_bit_for_bit(variant: str, hidden: int, top_k: int) -> None:
    """``prepare_pre_dispatch``'s launcher (compiled kernel's launcher, precomputed arguments) writes the
    bytes ``pre_dispatch`` (Triton's JIT dispatch) writes, over a sequence of token counts into the same
    buffers (as decode and prefill alternate), with int64 top-k ids and bf16 weights too."""
    rows = 4096
    want, got = _buffers(variant, rows, hidden, top_k), _buffers(variant, rows, hidden, top_k)
    launcher = prepare_pre_dispatch(*got, variant=variant, routed_scaling_factor=2.5)
    for step, tokens in enumerate((32, 1, 0, 333, 32, 2048, 1)):
        x = _activations(tokens, hidden, seed=step * 7 + hidden)
        ids = torch.randint(-1, 256, (tokens, top_k), device="cuda", dtype=torch.int64 if step % 2 else torch.int32)
        weights = torch.rand(tokens, top_k, device="cuda").to(torch.bfloat16 if step == 3 else torch.float32)
        pre_dispatch(x, ids, weights, *want, variant=variant, routed_scaling_factor=2.5)
        launcher(x, ids, weights)
        torch.cuda.synchronize()
        for name, a, b in zip(("x", "x_sf", "topk_idx", "topk_weights"), want, got):
            assert _same(a, b), f"{variant} T={tokens} H={hidden} step {step}: {name} differs"
    plan = launcher._plans[next(k for k in launcher._plans if k[0][0] == 32)]
    assert hasattr(plan, "low_level"), "the prepared launch fell back to the JIT path"


def test_prepared_pre_dispatch_captures_in_a_cuda_graph() -> None:
    """Captured once, replayed with new activations and routing in the same input tensors: equal to
    the eager JIT launch; no host sync (capture would fail on one)."""
    variant, tokens, hidden, top_k, rows = "sm90_fp8", 32, 1024, 8, 8192
    x = _activations(tokens, hidden, seed=1)
    ids = torch.randint(-1, 8, (tokens, top_k), device="cuda", dtype=torch.int32)
    weights = torch.rand(tokens, top_k, device="cuda")
    want, got = _buffers(variant, rows, hidden, top_k), _buffers(variant, rows, hidden, top_k)
    launcher = prepare_pre_dispatch(*got, variant=variant)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launcher(x, ids, weights)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launcher(x, ids, weights)
    for seed in (2, 3):
        x.copy_(_activations(tokens, hidden, seed=seed))
        ids.copy_(torch.randint(-1, 8, (tokens, top_k), device="cuda", dtype=torch.int32))
        weights.copy_(torch.rand(tokens, top_k, device="cuda"))
        graph.replay()
        pre_dispatch(x, ids, weights, *want, variant=variant)
        torch.cuda.synchronize()
        for name, a, b in zip(("x", "x_sf", "topk_idx", "topk_weights"), want, got):
            assert _same(a, b), f"replay seed {seed}: {name} differs"
    assert launcher.plans_built == 1
