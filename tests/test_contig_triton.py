"""``contig_triton`` on a CPU: available()/supports() reasons, import hygiene, the launch configuration, and
the kernel run under Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess) on small shapes against
``contig_reference``: every layout, swizzle, limit, group sizes 16-256, partial packed words, M = 0 and
several tiles per program. The interpreter's fp32 -> e4m3 conversion is not the hardware's RNE (ties,
carries, subnormals), so fp8 values are compared with the interpreter's own conversion of the reference's
exactly scaled values; UE8M0 scales bit for bit, fp32 scales within 1e-6 relative (the interpreter's ``tl.exp``
is numpy's float32 exp, which may differ from torch's by an ulp). The GPU run:
tests/gpu/test_contig_triton_gpu.py (bytes against the reference and SGLang's fused kernel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops.silu_mul_quant_contig import ContigConfig, ContigShape
from sglang_moe_plugins.plugins.contig.triton_plugin import ContigTritonPlugin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = ContigTritonPlugin()


def test_identity_and_registration() -> None:
    from sglang_moe_plugins.core.discovery import BUILTIN_PLUGINS

    assert PLUGIN.name == "contig_triton" and PLUGIN.op == "silu_mul_quant_contig" and PLUGIN.priority == 110
    assert "contig_triton" in BUILTIN_PLUGINS
    assert PLUGIN.writes_inputs == frozenset()
    assert dict(PLUGIN.options) == {"pdl": True, "fast_exp": True, "waves": 0}


def test_available_and_supports_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_moe_plugins import hardware

    no = PLUGIN.available(Platform.cpu())
    assert not no and "CUDA" in no.reason
    old = PLUGIN.available(Platform.cuda(8, 0))
    assert not old and "sm89" in old.reason and "sm80" in old.reason
    monkeypatch.setattr(hardware, "triton_available", lambda: False)
    monkeypatch.setattr("sglang_moe_plugins.plugins.triton_smq.plugin.triton_available", lambda: False)  # its one check
    missing = PLUGIN.available(Platform.cuda(9, 0))
    assert not missing and "triton" in missing.reason
    monkeypatch.setattr("sglang_moe_plugins.plugins.triton_smq.plugin.triton_available", lambda: True)
    sm90 = Platform.cuda(9, 0)
    assert PLUGIN.available(sm90)
    for shape, cfg in [
        (ContigShape(2048, 128), ContigConfig(sm90)),
        (ContigShape(7168, 32), ContigConfig(sm90, 10.0, True, "ue8m0_packed")),
        (ContigShape(2880, 64), ContigConfig(sm90, None, False, "ue8m0_packed")),
        (ContigShape(256, 256), ContigConfig(sm90)),
    ]:
        yes = PLUGIN.supports(shape, cfg)
        assert yes, yes.reason
    bad_group = PLUGIN.supports(ContigShape(2048, 48), ContigConfig(sm90))
    assert not bad_group and "group_size 48" in bad_group.reason
    bad_d = PLUGIN.supports(ContigShape(200, 128), ContigConfig(sm90))
    assert not bad_d and "D (200)" in bad_d.reason
    on_cpu = PLUGIN.supports(ContigShape(2048, 128), ContigConfig(Platform.cpu()))
    assert not on_cpu and "CUDA" in on_cpu.reason


def test_import_hygiene() -> None:
    """Importing the plugin module imports neither Triton nor the kernel modules."""
    code = (
        "import sys; import sglang_moe_plugins.plugins.contig.triton_plugin as p; "
        "p.ContigTritonPlugin().supports(p.ContigShape(2048, 128), p.ContigConfig()); "
        "bad = [m for m in ('triton', 'sglang_moe_plugins.plugins.contig.triton_kernel', "
        "'sglang_moe_plugins.plugins.contig.triton_launch') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_launch_configuration() -> None:
    pytest.importorskip("triton")
    from sglang_moe_plugins.plugins.contig.triton_launch import choose_contig_config, scale_strides

    assert choose_contig_config(256, 128).block_c == 256 and choose_contig_config(256, 128).block_m == 8
    assert choose_contig_config(2048, 128).block_c == 1024 and choose_contig_config(2048, 128).block_m == 2
    assert choose_contig_config(768, 128).block_c == 256
    assert choose_contig_config(2880, 32).block_c == 1024  # masked last chunk
    assert scale_strides(5, 7, True) == (1, 8) and scale_strides(5, 7, False) == (7, 1)


_SCRIPT = """
import json
import torch
import triton
import triton.language as tl
from sglang_moe_plugins.ops.silu_mul_quant_contig import ContigInputs, allocate_outputs, describe
from sglang_moe_plugins.plugins.contig import triton_launch as L
from sglang_moe_plugins.plugins.contig.triton_plugin import ContigTritonPlugin
from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import contig_values, silu_mul_quant_contig_reference
from sglang_moe_plugins.quant import ceil_to_ue8m0, round_to_bf16


@triton.jit
def _cvt(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n).to(tl.float8e4nv), mask=offs < n)


def interpreter_fp8(values):
    flat = values.contiguous().reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.float8_e4m3fn)
    if flat.numel():
        _cvt[(triton.cdiv(flat.numel(), 1024),)](flat, out, flat.numel(), BLOCK=1024)
    return out.reshape(values.shape)


def poison(o):
    o.out.view(torch.uint8).fill_(0x7F)
    o.scale.fill_(-1) if o.scale.dtype == torch.int32 else o.scale.fill_(float("nan"))


def check(M, D, gs, layout, limit=None, swizzle=False, cfg=None, programs=None, seed=0, special=False, via=None):
    g = torch.Generator().manual_seed(seed * 7919 + M * 31 + D)
    x = torch.randn(M, 2 * D, generator=g) * torch.exp2(torch.randint(-6, 7, (M, 2 * D), generator=g).float())
    if special and M:
        flat = x.view(-1)
        pick = torch.randint(0, flat.numel(), (5, 4), generator=g)
        for value, idx in zip((float("nan"), float("inf"), float("-inf"), 1e30, -1e30), pick):
            flat[idx] = value
    x = x.to(torch.bfloat16)
    # rows past M exist in storage and must stay unread/unwritten: a view of a larger buffer
    big = torch.randn(M + 3, 2 * D, generator=g).to(torch.bfloat16)
    big[:M] = x
    x = big[:M]
    shape, config = describe(x, group_size=gs, swiglu_limit=limit, swizzle=swizzle, scale_layout=layout)
    ref, got = allocate_outputs(shape, config, x.device, rows=M), allocate_outputs(shape, config, x.device, rows=M)
    for o in (ref, got):
        poison(o)
    # a guard row after the outputs: the kernel must not write past M
    out_big = torch.full((M + 2, D), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
    got = type(got)(out_big[:M], got.scale)
    silu_mul_quant_contig_reference(ContigInputs(x), ref, shape, config)
    L_ = None if limit is None else round_to_bf16(limit)
    if via == "plugin":
        ContigTritonPlugin().run(ContigInputs(x), got, shape, config)
    elif via == "prepare":
        ContigTritonPlugin().prepare(shape, config)(ContigInputs(x), got)
    else:
        L.launch(x, got.out, got.scale, group_size=gs, swiglu_limit=L_, swizzle=swizzle, ue8m0=config.scale_ue8m0,
                 config=cfg, programs=programs)
    v = contig_values(x, config)
    grouped = v.reshape(M, D // gs, gs)
    mag = grouped.abs()
    mag = torch.where(torch.isnan(mag), 0.0, mag.clamp(max=torch.finfo(torch.float32).max))
    scale = mag.amax(-1).clamp_min(1e-10) / torch.full_like(mag[..., 0], 448.0) if M else mag.sum(-1)
    if config.scale_ue8m0 and M:
        scale = ceil_to_ue8m0(scale)
    expect = interpreter_fp8((grouped * (1.0 / scale).unsqueeze(-1)).reshape(M, D)) if M else ref.out
    qa, qb = expect.view(torch.uint8), got.out.view(torch.uint8)
    same = float((qa == qb).float().mean()) if qa.numel() else 1.0
    if config.scale_ue8m0:
        scales_ok = torch.equal(ref.scale, got.scale)
    else:
        # numpy's float32 exp (the interpreter's tl.exp) and torch's may differ by an ulp: 1e-6 relative
        a, b = ref.scale, got.scale
        scales_ok = bool(((a - b).abs() <= 1e-6 * a.abs()).all()) and not bool(torch.isnan(b).any())
    guard = bool((out_big[M:].view(torch.uint8) == 0x7F).all())
    unwritten = int((qb == 0x7F).sum()) - int((qa == 0x7F).sum())
    return {"case": [M, D, gs, layout, limit, swizzle, str(cfg), programs, special, via], "same": same,
            "scales_ok": scales_ok, "guard": guard, "unwritten": unwritten}


C = L.ContigKernelConfig
results = [
    check(5, 256, 128, "row_major"),
    check(5, 256, 128, "ue8m0_packed"),
    check(3, 96, 32, "ue8m0_packed", cfg=C(2, 32)),  # G = 3: partial packed word, pad bytes zeroed
    check(7, 80, 16, "ue8m0_packed", swizzle=True, cfg=C(4, 16)),  # G = 5
    check(6, 128, 32, "row_major", limit=7.0, swizzle=True, cfg=C(4, 64)),
    check(9, 192, 64, "ue8m0_packed", limit=10.0, cfg=C(2, 128)),  # D not a multiple of BC: masked chunk
    check(4, 512, 256, "ue8m0_packed"),  # group 256, G = 2
    check(11, 64, 16, "row_major", cfg=C(4, 32), programs=3),  # several tiles per program
    check(11, 64, 16, "ue8m0_packed", limit=3.0, cfg=C(4, 32), programs=2),
    check(0, 256, 128, "ue8m0_packed"),  # M = 0: nothing launched, nothing written
    check(1, 256, 32, "ue8m0_packed", swizzle=True),
    check(5, 128, 32, "row_major", special=True),  # non-finite policy
    check(5, 128, 32, "ue8m0_packed", limit=7.0, special=True),
    check(6, 256, 128, "ue8m0_packed", limit=10.0, via="plugin"),
    check(6, 256, 64, "row_major", swizzle=True, via="prepare"),
    check(0, 256, 64, "row_major", via="prepare"),
]
print(json.dumps(results))
"""


def test_kernel_under_triton_interpreter() -> None:
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT)], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 16
    for r in results:
        assert r["scales_ok"], r
        assert r["guard"], r
        assert r["unwritten"] == 0, r
        assert r["same"] >= 0.995, r
