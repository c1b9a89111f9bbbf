"""The Triton pre-dispatch kernel's indexing on CPU, under Triton's interpreter (``TRITON_INTERPRET=1``):
scales, top-k copies, padding and (for E2M1, which is pure integer arithmetic) the packed codes equal
:func:`pre_dispatch_reference`; FP8 values equal the interpreter's own fp32 -> e4m3 conversion of the
reference's exactly scaled values (that conversion is not the hardware's round-to-nearest-even, e.g. at
carries into the next binade). The GPU tests (tests/gpu/test_mega_gpu.py) check bit-exactness."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = """
import torch
import triton
import triton.language as tl
from sglang_moe_plugins.ops.mega_moe.formats import pre_dispatch_reference
from sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_triton import PreDispatchTiling, pre_dispatch

def buffers(variant, rows, hidden, top_k):
    if variant == "mxf4xmxf4":
        x = torch.full((rows, hidden // 2), 0x5A, dtype=torch.int8)
    else:
        x = torch.full((rows, hidden), 0x5A, dtype=torch.int8).view(torch.float8_e4m3fn)
    gs = 128 if variant == "sm90_fp8" else 32
    if variant == "sm90_fp8":
        sf = torch.full((rows, hidden // gs), float("nan"))
    else:
        sf = torch.full((rows, hidden // 128), 0x5A5A5A5A, dtype=torch.int32)
    return [x, sf, torch.full((rows, top_k), 77, dtype=torch.int64), torch.full((rows, top_k), float("nan"))]

@triton.jit
def _to_fp8(x_ptr, y_ptr, n, B: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n).to(tl.float8e4nv), mask=offs < n)

def interpreter_fp8(values):
    flat = values.contiguous().flatten()
    out = torch.empty(flat.shape, dtype=torch.float8_e4m3fn)
    _to_fp8[(triton.cdiv(flat.numel(), 1024),)](flat, out, flat.numel(), B=1024)
    return out.view(values.shape)

checked = 0
for variant in ("fp8xfp4", "mxf4xmxf4", "sm90_fp8"):
    for tokens, hidden, top_k, tiling in [(5, 256, 3, PreDispatchTiling(2, 128, 4)),
                                         (3, 384, 2, PreDispatchTiling(1, 256, 4)),
                                         (7, 512, 6, PreDispatchTiling(4, 512, 4))]:
        gen = torch.Generator().manual_seed(tokens * 1000 + hidden)
        x = (torch.randn(tokens, hidden, generator=gen)
             * torch.exp2(torch.randint(-10, 10, (tokens, 1), generator=gen).float())).to(torch.bfloat16)
        x[0, :32] = 448.0 * 2.0 ** -3
        ids = torch.randint(-1, 64, (tokens, top_k), generator=gen, dtype=torch.int32)
        w = torch.rand(tokens, top_k, generator=gen)
        want, got = buffers(variant, 16, hidden, top_k), buffers(variant, 16, hidden, top_k)
        pre_dispatch_reference(x, ids, w, *want, variant=variant, routed_scaling_factor=2.5)
        pre_dispatch(x, ids, w, *got, variant=variant, routed_scaling_factor=2.5, tiling=tiling)
        tag = f"{variant} T={tokens} H={hidden} tiling={tiling}"
        if want[1].dtype == torch.float32:
            assert torch.equal(want[1].view(torch.int32), got[1].view(torch.int32)), tag + ": x_sf"
        else:
            assert torch.equal(want[1], got[1]), tag + ": x_sf"
        assert torch.equal(want[2], got[2]), tag + ": topk_idx"
        assert torch.equal(want[3].view(torch.int32), got[3].view(torch.int32)), tag + ": topk_weights"
        if variant == "mxf4xmxf4":
            assert torch.equal(want[0], got[0]), tag + ": E2M1 codes"
        else:
            assert torch.equal(want[0][tokens:].view(torch.uint8), got[0][tokens:].view(torch.uint8)), tag + ": pad rows"
            gs = 128 if variant == "sm90_fp8" else 32
            groups = x.float().view(tokens, hidden // gs, gs)
            if variant == "sm90_fp8":
                inv = 1.0 / want[1][:tokens]
                scaled = (groups * inv[..., None]).clamp(-448.0, 448.0)
            else:
                e = want[1][:tokens].contiguous().view(torch.uint8)[:, : hidden // gs].to(torch.int32)
                scaled = groups * torch.exp2((127 - e).float())[..., None]
            expect = interpreter_fp8(scaled.reshape(tokens, hidden))
            assert torch.equal(expect.view(torch.uint8), got[0][:tokens].view(torch.uint8)), tag + ": fp8 values"
        checked += 1
print("checked", checked)
"""


def test_pre_dispatch_kernel_under_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT)], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checked 9" in proc.stdout


def test_choose_tiling_follows_the_measured_rules():
    """The tiles behind benchmarks/results/mega_pre_dispatch_h200.md (a pure function of the sizes)."""
    from sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_triton import PreDispatchTiling as T, choose_tiling as c

    assert c(8192, 4096, 32) == c(2048, 7168, 32) == c(1024, 4096, 128) == T(4, 1024, 4)
    assert c(512, 4096, 32) == c(512, 4096, 32, packed_fp4=True) == c(256, 7168, 128) == T(8, 512, 4)
    assert c(64, 4096, 32) == c(64, 4096, 128) == T(1, 4096, 8)  # FP8, power-of-two H <= 4096: one token
    assert c(64, 2048, 32) == T(1, 2048, 4)
    assert c(64, 7168, 32) == T(2, 1024, 4)  # a 4096 + 3072 split row was slower
    assert c(64, 4096, 32, packed_fp4=True) == c(1, 4096, 32) == T(1, 1024, 4)
    assert c(16, 4096, 32) == T(2, 1024, 4)
    assert not any(c(t, h, 32).evict_first for t in (1, 64, 512, 8192) for h in (4096, 7168))


_LAUNCHER_SCRIPT = """
import torch
from sglang_moe_plugins.plugins.deep_gemm import pre_dispatch_triton as P

def buffers(variant, rows, hidden, top_k):
    if variant == "mxf4xmxf4":
        x = torch.full((rows, hidden // 2), 0x5A, dtype=torch.int8)
    else:
        x = torch.full((rows, hidden), 0x5A, dtype=torch.int8).view(torch.float8_e4m3fn)
    if variant == "sm90_fp8":
        sf = torch.full((rows, hidden // 128), float("nan"))
    else:
        sf = torch.full((rows, hidden // 128), 0x5A5A5A5A, dtype=torch.int32)
    return [x, sf, torch.full((rows, top_k), 77, dtype=torch.int64), torch.full((rows, top_k), float("nan"))]

def raw(bufs):
    return [b.contiguous().view(torch.uint8) for b in bufs]

built = []
for variant in ("fp8xfp4", "mxf4xmxf4", "sm90_fp8"):
    hidden, top_k = 256, 3
    want, got = buffers(variant, 16, hidden, top_k), buffers(variant, 16, hidden, top_k)
    launcher = P.prepare_pre_dispatch(*got, variant=variant, routed_scaling_factor=1.5)
    for tokens in (5, 0, 5, 16, 5):  # repeated token counts reuse their plan
        gen = torch.Generator().manual_seed(tokens + 7)
        x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
        ids = torch.randint(-1, 64, (tokens, top_k), generator=gen, dtype=torch.int32)
        w = torch.rand(tokens, top_k, generator=gen)
        P.pre_dispatch(x, ids, w, *want, variant=variant, routed_scaling_factor=1.5)
        launcher(x, ids, w)
        for a, b, name in zip(raw(want), raw(got), ("x", "x_sf", "topk_idx", "topk_weights")):
            assert torch.equal(a, b), f"{variant} T={tokens}: {name}"
    built.append(launcher.plans_built)
print("plans", built)
"""


def test_prepared_launcher_equals_pre_dispatch_under_interpreter() -> None:
    """``prepare_pre_dispatch``'s launcher writes the same bytes as ``pre_dispatch`` into its buffers,
    over a sequence of token counts (including 0), and builds one plan per token count."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LAUNCHER_SCRIPT)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plans [3, 3, 3]" in proc.stdout


def test_prepared_launcher_checks_its_buffers() -> None:
    import torch

    from sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_triton import prepare_pre_dispatch

    x = torch.empty(8, 256, dtype=torch.float8_e4m3fn)
    sf = torch.empty(8, 2)
    idx, w = torch.empty(8, 2, dtype=torch.int64), torch.empty(8, 2)
    with pytest.raises(ValueError, match="variant"):
        prepare_pre_dispatch(x, sf, idx, w, variant="fp4")
    with pytest.raises(ValueError, match="contiguous"):
        prepare_pre_dispatch(x, sf, idx.t(), w, variant="sm90_fp8")
    with pytest.raises(ValueError, match="unit stride"):
        prepare_pre_dispatch(x, torch.empty(2, 8).t(), idx, w, variant="sm90_fp8")
