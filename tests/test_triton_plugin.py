"""CPU tests of the ``triton`` plugin: import hygiene, ``available``/``supports`` reasons, and the
kernel's indexing logic under Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape
from sglang_moe_plugins.plugins.triton_smq import plugin as triton_plugin_module
from sglang_moe_plugins.plugins.triton_smq.plugin import TritonPlugin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200 = Platform.cuda(9, 0)


def _run_python(code: str, env: dict | None = None, timeout: int = 120) -> str:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# ------------------------------------------------------------------------------ import hygiene
def test_import_does_not_import_triton_or_touch_cuda():
    out = _run_python(
        """
        import sys, json, torch
        import sglang_moe_plugins.plugins.triton_smq.plugin as t
        plugin = t.TritonPlugin()
        print(json.dumps({
            "triton": "triton" in sys.modules,
            "kernel": any(f"sglang_moe_plugins.plugins.triton_smq.{name}" in sys.modules for name in ("kernel", "launch")),
            "cuda_init": torch.cuda.is_initialized(),
        }))
        """
    )
    assert json.loads(out.strip().splitlines()[-1]) == {"triton": False, "kernel": False, "cuda_init": False}


def test_import_and_answers_without_triton_installed():
    out = _run_python(
        """
        import sys
        sys.modules["triton"] = None  # import triton -> ImportError; find_spec -> None
        import sglang_moe_plugins.plugins.triton_smq.plugin as t
        from sglang_moe_plugins.hardware import Platform
        from sglang_moe_plugins.ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape
        p = t.TritonPlugin()
        a = p.available(Platform.cuda(9, 0))
        s = p.supports(SiluMulQuantShape(32, 64, 2048, 128, 8), SiluMulQuantConfig(Platform.cuda(9, 0)))
        print(bool(a), a.reason)
        print(bool(s), s.reason)
        """
    )
    lines = out.strip().splitlines()
    assert lines[-2].startswith("False") and "triton" in lines[-2]
    assert lines[-1].startswith("False") and "triton" in lines[-1]


# ---------------------------------------------------------------------- available / supports
def test_plugin_passes_the_registry_checks_under_its_entry_point_name():
    """The registry accepts the plugin (name pattern, op, priority, contract version, options) and
    records it under the name and op the package's entry point declares."""
    import tomllib

    from sglang_moe_plugins.core.registry import Registry

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        entry_points = tomllib.load(handle)["project"]["entry-points"]
    record = Registry.from_plugins([TritonPlugin()]).get("triton")
    assert (
        entry_points["sglang_moe_plugins.kernels"][record.name]
        == "sglang_moe_plugins.plugins.triton_smq.plugin:TritonPlugin"
    )
    assert record.op == "silu_mul_quant" and record.priority == TritonPlugin.priority
    assert dict(record.options) == {"pdl": True}
    assert "\n" not in TritonPlugin.description and TritonPlugin.description.strip()


@pytest.mark.parametrize(
    "platform, ok, words",
    [
        (Platform.cpu(), False, ["CUDA", "cpu"]),
        (Platform.cuda(8, 0), False, ["sm89", "sm80"]),
        (Platform.cuda(8, 9), True, ["sm89"]),
        (H200, True, ["sm90"]),
        (Platform.cuda(10, 0), True, ["sm100"]),
    ],
)
def test_available_reasons(monkeypatch, platform, ok, words):
    monkeypatch.setattr(triton_plugin_module, "triton_available", lambda: True)
    answer = TritonPlugin().available(platform)
    assert bool(answer) is ok
    for word in words:
        assert word in answer.reason


def test_available_without_triton(monkeypatch):
    monkeypatch.setattr(triton_plugin_module, "triton_available", lambda: False)
    answer = TritonPlugin().available(H200)
    assert not answer and "triton" in answer.reason


@pytest.fixture()
def with_triton(monkeypatch):
    monkeypatch.setattr(triton_plugin_module, "triton_available", lambda: True)


@pytest.mark.parametrize(
    "shape",
    [
        SiluMulQuantShape(32, 1024, 2048, 128, 6),  # DSV4-Flash EP8
        SiluMulQuantShape(128, 1024, 768, 128, 8),  # Qwen3-30B-A3B: JIT rejects (D // 8 < E)
        SiluMulQuantShape(512, 256, 512, 128, 10),  # Qwen3-Next: E > 256
        SiluMulQuantShape(8, 4096, 14336, 128, 2),  # Mixtral: D > 8192
        SiluMulQuantShape(3, 5, 96, 32, 8),  # N % 4 != 0, G % 4 != 0
        SiluMulQuantShape(1, 1, 16, 16, 1),
        SiluMulQuantShape(4, 7, 512, 256, 2),
        SiluMulQuantShape(2000, 3, 64, 64, 8),  # E above one prologue chunk
        SiluMulQuantShape(0, 0, 128, 128, 8),  # empty call
    ],
)
@pytest.mark.parametrize("layout", ["row_major", "column_major", "ue8m0_packed"])
@pytest.mark.parametrize("limit, swizzle", [(None, False), (10.0, True), (7.0, False)])
def test_supports_every_valid_shape(with_triton, shape, layout, limit, swizzle):
    config = SiluMulQuantConfig(H200, swiglu_limit=limit, swizzle=swizzle, scale_layout=layout)
    answer = TritonPlugin().supports(shape, config)
    assert answer, answer.reason
    assert layout in answer.reason


def test_supports_rejects_with_specific_reasons(with_triton):
    plugin = TritonPlugin()
    cfg = SiluMulQuantConfig(H200)
    answer = plugin.supports(SiluMulQuantShape(4, 8, 96, 48, 8), cfg)
    assert not answer and "group_size 48" in answer.reason
    answer = plugin.supports(SiluMulQuantShape(4, 8, 100, 32, 8), cfg)
    assert not answer and "D (100)" in answer.reason
    answer = plugin.supports(SiluMulQuantShape(4, 2**31, 128, 128, 8), cfg)
    assert not answer and "N (2147483648)" in answer.reason
    answer = plugin.supports(SiluMulQuantShape(4096, 2**20, 128, 128, 8), cfg)
    assert not answer and "E * N" in answer.reason
    answer = plugin.supports(SiluMulQuantShape(32, 64, 2048, 128, 8), SiluMulQuantConfig(Platform.cpu()))
    assert not answer and "CUDA" in answer.reason


def test_supports_is_pure_and_cheap(monkeypatch):
    """``supports`` answers from the shape and config alone: no CUDA query, no import (of Triton or
    the kernel module), and the Triton probe (``find_spec``) at most once however often it is asked."""
    import builtins
    import importlib.util

    import torch

    from sglang_moe_plugins import hardware

    counts = {"cuda": 0, "find_spec": 0, "imports": []}

    def cuda_query(*args, **kwargs):
        counts["cuda"] += 1
        raise AssertionError("supports() queried CUDA")

    for name in ("is_available", "current_device", "get_device_capability", "get_device_properties", "device_count"):
        monkeypatch.setattr(torch.cuda, name, cuda_query)
    real_find_spec, real_import = importlib.util.find_spec, builtins.__import__

    def find_spec(name, *args, **kwargs):
        counts["find_spec"] += 1
        return real_find_spec(name, *args, **kwargs)

    def tracking_import(name, globals=None, locals=None, fromlist=(), level=0):
        if "triton" in name or any("triton" in str(item) for item in fromlist or ()):
            counts["imports"].append((name, fromlist, level))
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(builtins, "__import__", tracking_import)
    hardware.triton_available.cache_clear()
    try:
        plugin = TritonPlugin()
        shapes = [SiluMulQuantShape(32, 64, 2048, 128, 8), SiluMulQuantShape(4, 8, 96, 48, 8)]
        configs = [
            SiluMulQuantConfig(H200),
            SiluMulQuantConfig(Platform.cpu()),
            SiluMulQuantConfig(Platform.cuda(8, 0)),
        ]
        first = {(s, c): plugin.supports(s, c) for s in shapes for c in configs}
        for _ in range(100):
            assert {(s, c): plugin.supports(s, c) for s in shapes for c in configs} == first
    finally:
        hardware.triton_available.cache_clear()
    assert counts["cuda"] == 0
    assert counts["imports"] == []
    assert counts["find_spec"] <= 1
    installed = real_find_spec("triton") is not None
    assert [bool(a) for a in first.values()] == [installed, False, False, False, False, False]


# ------------------------------------------------------------------ kernel logic (interpreter)
_INTERPRETER_SCRIPT = """
import json, os, sys
import numpy as np
import torch
import triton
import triton.language as tl
from sglang_moe_plugins.ops.silu_mul_quant import (SiluMulQuantInputs, allocate_outputs, describe, real_rows,
                                                   split_gate_up)
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference
from sglang_moe_plugins.plugins.triton_smq import launch as K
from sglang_moe_plugins.plugins.triton_smq.tuning import KernelConfig
from sglang_moe_plugins.quant import quantize_fp8_groups, round_to_bf16, ceil_to_ue8m0


@triton.jit
def _cvt(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n).to(tl.float8e4nv), mask=offs < n)


def interpreter_fp8(values):
    # The interpreter's own fp32 -> e4m3 conversion (it differs from hardware RNE on ties, carries and
    # subnormals), applied to the reference's exact scaled values: the kernel must match it.
    flat = values.contiguous().reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.float8_e4m3fn)
    if flat.numel():
        _cvt[(triton.cdiv(flat.numel(), 1024),)](flat, out, flat.numel(), BLOCK=1024)
    return out.reshape(values.shape)


def check(E, N, D, gs, layout, limit=None, swizzle=False, masked=None, cfg=None, seed=0, special=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(E, N, 2 * D, generator=g)
    x = x * torch.exp2(torch.randint(-6, 7, x.shape, generator=g).float())
    if special:  # the op's non-finite policy: NaN, +-Inf, fp32 overflow, a group of NaN only
        flat = x.view(-1)
        pick = torch.randint(0, flat.numel(), (6, 8), generator=g)
        for values, idx in zip((float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 0.0), pick):
            flat[idx] = values
        x[0, 0, :gs] = float("nan")
    x = x.to(torch.bfloat16)
    if masked is None:
        masked = torch.randint(0, N + 1, (E,), generator=g).tolist()
    m = torch.tensor(masked, dtype=torch.int32)
    shape, config = describe(x, m, group_size=gs, topk=8, swiglu_limit=limit, swizzle=swizzle, scale_layout=layout)
    ref, got = allocate_outputs(shape, config, x.device), allocate_outputs(shape, config, x.device)
    for o in (ref, got):
        o.out.view(torch.uint8).fill_(0xFF)
        o.scale.fill_(-1) if o.scale.dtype == torch.int32 else o.scale.fill_(float("nan"))
    silu_mul_quant_reference(SiluMulQuantInputs(x, m), ref, shape, config)
    K.launch(x, m, got.out, got.scale, group_size=gs, swiglu_limit=None if limit is None else round_to_bf16(limit),
             swizzle=swizzle, ue8m0=config.scale_ue8m0, config=cfg)
    mask = real_rows(m, N)
    rows = x[mask]
    gate, up = split_gate_up(rows, swizzle)
    if limit is not None:
        L = round_to_bf16(limit)
        gate, up = gate.clamp(max=L), up.clamp(min=-L, max=L)
    v = gate.float() / (1.0 + torch.exp(-gate.float())) * up.float()
    grouped = v.reshape(v.shape[0], D // gs, gs)
    magnitude = grouped.abs()
    magnitude = torch.where(torch.isnan(magnitude), 0.0, magnitude.clamp(max=torch.finfo(torch.float32).max))
    scale = magnitude.amax(-1).clamp_min(1e-10) / torch.full_like(magnitude[..., 0], 448.0)
    if config.scale_ue8m0:
        scale = ceil_to_ue8m0(scale)
    expect = interpreter_fp8((grouped * (1.0 / scale).unsqueeze(-1)).reshape(v.shape))
    qa, qb = expect.view(torch.uint8), got.out.view(torch.uint8)[mask]
    same = float((qa == qb).float().mean()) if qa.numel() else 1.0
    if config.scale_ue8m0:
        scales_ok = torch.equal(ref.scale[mask], got.scale[mask])
    else:
        a, b = ref.scale[mask], got.scale[mask]
        scales_ok = bool(((a - b).abs() <= 1e-6 * a.abs()).all()) and not bool(torch.isnan(b).any())
    padding_untouched = bool((got.out.view(torch.uint8)[~mask] == 0xFF).all())
    return {"case": [E, N, D, gs, layout, limit, swizzle, masked, str(cfg)], "same": same,
            "scales_ok": scales_ok, "padding_untouched": padding_untouched}


C = KernelConfig
results = [
    check(3, 5, 64, 16, "column_major", masked=[5, 0, 3], cfg=C(2, 32)),
    check(3, 5, 64, 32, "ue8m0_packed", masked=[2, 0, 9], cfg=C(2, 32)),  # masked_m > N is clamped
    check(4, 6, 96, 32, "ue8m0_packed", cfg=C(4, 64)),  # G = 3: partial packed word, pad bytes zeroed
    check(4, 6, 96, 32, "row_major", limit=7.0, swizzle=True, cfg=C(4, 64, prefetch=True)),
    check(2, 7, 128, 64, "column_major", limit=10.0, cfg=C(2, 128)),
    check(5, 3, 80, 16, "ue8m0_packed", swizzle=True, cfg=C(1, 16, prefetch=True)),  # G = 5
    check(6, 9, 80, 16, "ue8m0_packed", swizzle=True, masked=[0, 9, 0, 0, 1, 3], cfg=C(2, 32, prefetch=True)),
    check(6, 9, 80, 16, "column_major", masked=[0, 0, 0, 0, 0, 0], cfg=C(2, 32)),  # all experts empty
    check(3, 4, 256, 128, "ue8m0_packed", masked=[0, 0, 4]),  # default config
    check(40, 2, 32, 16, "column_major", cfg=C(1, 32)),  # several experts per program, many empty
    check(1, 1, 512, 256, "ue8m0_packed", masked=[1]),  # group 256, G = 2
    check(2, 5, 128, 32, "column_major", masked=[5, 3], special=True),  # non-finite policy
    check(2, 5, 128, 32, "ue8m0_packed", limit=7.0, masked=[5, 3], special=True, cfg=C(2, 64)),
]
# masked_m read in several chunks of BLOCK_E experts (on the GPU: more than 1024 experts)
K._MAX_BLOCK_E = 16
results += [
    check(40, 3, 32, 16, "ue8m0_packed", cfg=C(1, 32), seed=5),
    check(37, 4, 64, 32, "column_major", masked=[0] * 20 + [4] + [0] * 15 + [3], cfg=C(2, 32, prefetch=True)),
]
print(json.dumps(results))
"""


def test_kernel_logic_under_triton_interpreter():
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    out = _run_python(_INTERPRETER_SCRIPT, env={"TRITON_INTERPRET": "1"}, timeout=300)
    results = json.loads(out.strip().splitlines()[-1])
    for r in results:
        assert r["scales_ok"], r
        assert r["padding_untouched"], r
        assert r["same"] >= 0.995, r


_SHARES_SCRIPT = """
import itertools, json
import torch
from sglang_moe_plugins.ops.silu_mul_quant import allocate_outputs, describe, real_rows
from sglang_moe_plugins.plugins.triton_smq import launch as K
from sglang_moe_plugins.plugins.triton_smq.tuning import KernelConfig

K._MAX_BLOCK_E = 16  # E > 16: the chunked masked_m scan as well as the one-chunk one
torch.manual_seed(0)
bad = []
for E, N, D, gs, bm, bc in [(12, 3, 32, 16, 1, 32), (40, 3, 32, 16, 1, 32), (37, 4, 64, 32, 2, 32)]:
    x = torch.randn(E, N, 2 * D).to(torch.bfloat16)
    for trial in range(2):
        m = torch.randint(0, N + 1, (E,), dtype=torch.int32)
        mask = real_rows(m, N)
        shape, config = describe(x, m, group_size=gs, topk=8, swiglu_limit=None, scale_layout="column_major")
        ref = None
        for front, grid in itertools.product((False, True), (1, 2, 3, 5, 7, 64)):
            o = allocate_outputs(shape, config, x.device)
            o.out.view(torch.uint8).fill_(0xFF)
            o.scale.fill_(float("nan"))
            plan = K.plan_launch(E, N, D, group_size=gs, scale_strides=o.scale.stride(), swiglu_limit=None,
                                 swizzle=False, ue8m0=False, config=KernelConfig(bm, bc, front_load=front),
                                 device_index=None, pointers=(x, m, o.out, o.scale))
            K.silu_mul_quant_kernel[(grid,)](x, m, o.out, o.scale, *plan.runtime, **plan.kwargs_dict)
            q = o.out.view(torch.uint8)
            if ref is None:
                ref = (q.clone(), o.scale.clone())
            same = torch.equal(q, ref[0]) and torch.equal(o.scale.nan_to_num(7.0), ref[1].nan_to_num(7.0))
            written = not bool((q[mask] == 0xFF).all(-1).any()) and not bool(o.scale[mask].isnan().any())
            if not (same and written and bool((q[~mask] == 0xFF).all())):
                bad.append([E, N, D, front, grid, m.tolist()])
print(json.dumps(bad))
"""


def test_front_loaded_and_spread_shares_give_the_same_bytes_under_the_interpreter():
    """Both share orders (``front_load`` on and off, grids of 1-64 programs: more and fewer items than
    programs) write every real row, leave the padding rows alone and give the same bytes."""
    pytest.importorskip("triton")
    out = _run_python(_SHARES_SCRIPT, env={"TRITON_INTERPRET": "1"}, timeout=600)
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_choose_config_is_a_pure_function_of_sizes():
    pytest.importorskip("triton")
    from sglang_moe_plugins.plugins.triton_smq.tuning import choose_config

    for E, N, D, gs in [
        (32, 1024, 2048, 128),
        (128, 1024, 768, 128),
        (512, 256, 512, 128),
        (8, 4096, 14336, 128),
        (3, 5, 96, 32),
        (1, 1, 16, 16),
        (4, 7, 512, 256),
    ]:
        cfg = choose_config(E, N, D, gs)
        assert cfg == choose_config(E, N, D, gs)
        assert choose_config(E, N, D, gs) is cfg  # cached: it runs on every launch
        assert cfg.block_c & (cfg.block_c - 1) == 0 and cfg.block_c % gs == 0
        assert cfg.block_m & (cfg.block_m - 1) == 0 and cfg.block_m >= 1
        assert cfg.block_m * cfg.block_c <= 16384
        # the compiled part depends on N only through the regime: for E <= 64 a decode and a prefill kernel,
        # for E > 64 one kernel plus a one-row one where the row bound N * topk is at most E (the small N
        # here), whichever the token count
        compiled = {
            (c.block_m, c.block_c, c.num_warps, c.prefetch, c.idle_exit, c.early_trigger, c.front_load, c.max_registers)
            for c in (choose_config(E, n, D, gs) for n in (1, 7, 64, 256, 257, 1000, 65536))
        }
        assert len(compiled) == 2, compiled


# ------------------------------------------------------------------------------ grid sizing
def test_resident_programs_fallback_bound_from_registers_and_shared(monkeypatch):
    """Without the driver's occupancy call, residency follows registers, threads and shared memory."""
    K = pytest.importorskip("sglang_moe_plugins.plugins.triton_smq.launch")
    import types

    monkeypatch.setattr(K, "_libcuda", lambda: None)
    props = types.SimpleNamespace(
        regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, shared_memory_per_multiprocessor=233472
    )
    monkeypatch.setattr(K.torch.cuda, "get_device_properties", lambda index: props)

    def compiled(regs, shared):
        return types.SimpleNamespace(n_regs=regs, metadata=types.SimpleNamespace(shared=shared), function=0)

    assert K.resident_programs_per_sm(compiled(32, 0), 4, 0) == 16  # thread-bound
    assert K.resident_programs_per_sm(compiled(39, 16), 4, 0) == 12  # 40 regs/thread after rounding
    assert K.resident_programs_per_sm(compiled(54, 0), 4, 0) == 9
    assert K.resident_programs_per_sm(compiled(55, 0), 8, 0) == 4
    assert K.resident_programs_per_sm(compiled(32, 100_000), 4, 0) == 2  # shared-memory-bound


def test_choose_config_waves_by_regime():
    K = pytest.importorskip("sglang_moe_plugins.plugins.triton_smq.tuning")
    # E <= 64 at decode sizes (N * topk <= 2048): 1024-element items, up to 16 programs per SM, idle programs
    # leave at once, never more programs than the row bound's items (N = 128, topk 8: 1024 rows x 2 chunks)
    decode = K.choose_config(32, 128, 2048, 128)
    assert (decode.block_m, decode.block_c, decode.ctas_per_sm, decode.waves) == (1, 1024, 16, 1)
    assert decode.idle_exit and not decode.early_trigger and decode.max_programs == 2048
    # partial tiles: N = 128, D = 1536 (512-column items of 2 rows): sum(ceil(m_e / 2)) <= (1024 + 32) // 2, x 3
    assert K.choose_config(32, 128, 1536, 128).max_programs == 528 * 3
    # E <= 64 at prefill sizes: 2048-element items, no cap, one program per 2.5 items of the row bound in
    # 4 to 16 waves (Kimi-K2 EP8: 16384 rows -> (16384 + 48) // 2 row tiles x 2 chunks / 2.5)
    few = K.choose_config(48, 2048, 2048, 128)
    assert (few.block_m, few.ctas_per_sm, few.waves, few.max_programs, few.max_waves) == (2, 16, 4, None, 16)
    assert few.idle_exit and few.target_programs == round(8216 * 2 / 2.5)
    # E > 64: one compiled kernel for every N whose row bound exceeds E; 4 per SM at decode, one wave of 8 beyond
    many = K.choose_config(128, 1024, 768, 128)
    assert (many.ctas_per_sm, many.waves, many.idle_exit, many.max_programs) == (8, 1, False, None)
    assert many.target_programs is None
    assert K.choose_config(128, 64, 768, 128).ctas_per_sm == 4
    assert {
        (c.block_m, c.block_c, c.num_warps) for c in (K.choose_config(128, n, 768, 128) for n in (17, 128, 4096))
    } == {(many.block_m, many.block_c, many.num_warps)}
    # E > 64 with the row bound at most E (Qwen3-Next EP1, 32 tokens: 320 rows over 512 experts): one-row
    # items, exactly one program per item the row bound allows
    tiny = K.choose_config(512, 32, 512, 128, 10)
    assert (tiny.block_m, tiny.block_c, tiny.ctas_per_sm, tiny.max_programs, tiny.idle_exit) == (1, 512, 16, 320, False)
    assert K.choose_config(128, 16, 768, 128).block_m == 1 and K.choose_config(128, 17, 768, 128).block_m == 8
    # E <= 64: two compiled kernels per family, switching where N * topk crosses 2048
    tiles = {n: (K.choose_config(48, n, 2048, 128).block_m) for n in (7, 128, 256, 257, 4096)}
    assert tiles == {7: 1, 128: 1, 256: 1, 257: 2, 4096: 2}


def test_waves_follow_the_target_in_whole_waves_between_the_bounds():
    from sglang_moe_plugins.plugins.triton_smq.tuning import KernelConfig, waves_for

    fixed = KernelConfig(block_m=2, block_c=1024, waves=4)
    assert waves_for(fixed, 1188) == 4
    target = KernelConfig(block_m=2, block_c=1024, waves=4, target_programs=6566, max_waves=16)
    assert waves_for(target, 1188) == 6  # 5.53 waves -> 6 (DSV3 EP8 prefill on 132 SMs x 9)
    assert waves_for(target, 1320) == 5  # 4.97 -> 5
    assert (
        waves_for(KernelConfig(block_m=2, block_c=1024, waves=4, target_programs=22960), 1188) == 16
    )  # Mixtral: at most 16
    assert waves_for(KernelConfig(block_m=2, block_c=1024, waves=4, target_programs=1651), 1320) == 4  # at least 4
    assert waves_for(KernelConfig(block_m=2, block_c=1024, waves=4, target_programs=10**9, max_waves=2), 1) == 4


def test_item_bound_bounds_the_items_of_every_masked_m_within_the_row_bound():
    import itertools

    K = pytest.importorskip("sglang_moe_plugins.plugins.triton_smq.tuning")
    for E, N, BM, topk in itertools.product((1, 2, 3), (1, 2, 3, 5), (1, 2, 4), (1, 2, 8)):
        rows = min(E * N, N * topk)
        most = max(
            sum(-(-m // BM) for m in counts)
            for counts in itertools.product(range(N + 1), repeat=E)
            if sum(counts) <= rows
        )
        bound = K.item_bound(E, N, 96, BM, 32, topk)
        assert bound >= most * 3, (E, N, BM, topk)  # a program cap below it could leave items to fewer programs
        if BM == 1:
            assert bound == most * 3, (E, N, topk)  # one row per item: exact


# ------------------------------------------------------------------ prepared launch
_PREPARE_SCRIPT = """
import json
import torch
from sglang_moe_plugins.ops.silu_mul_quant import SiluMulQuantInputs, allocate_outputs, describe
from sglang_moe_plugins.plugins.triton_smq import launch as K
from sglang_moe_plugins.plugins.triton_smq.plugin import TritonPlugin
from sglang_moe_plugins.plugins.triton_smq.tuning import choose_config
from sglang_moe_plugins.quant import round_to_bf16
from sglang_moe_plugins.testing.case import poison

plans = []
real_plan = K.plan_launch
def counting_plan(*args, **kwargs):
    plans.append(args[:3])
    return real_plan(*args, **kwargs)
K.plan_launch = counting_plan

def outputs(shape, config):
    o = allocate_outputs(shape, config, torch.device("cpu"))
    poison(o)
    return o

def same(a, b):
    return torch.equal(a.out.view(torch.uint8), b.out.view(torch.uint8)) and torch.equal(
        a.scale.contiguous().view(torch.uint8), b.scale.contiguous().view(torch.uint8))

plugin = TritonPlugin()
results = []
for E, N, D, gs, layout, limit, swizzle, seed in [(3, 5, 64, 16, "column_major", None, False, 1),
                                                   (4, 6, 96, 32, "ue8m0_packed", 7.3, True, 2),
                                                   (2, 7, 128, 64, "row_major", 10.0, False, 3)]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(E, N, 2 * D, generator=g) * 3).to(torch.bfloat16)
    m = torch.randint(0, N + 1, (E,), generator=g, dtype=torch.int32)
    shape, config = describe(x, m, group_size=gs, topk=8, swiglu_limit=limit, swizzle=swizzle, scale_layout=layout)
    jit, via_run, via_prepare = outputs(shape, config), outputs(shape, config), outputs(shape, config)
    K.launch(x, m, jit.out, jit.scale, group_size=gs, swiglu_limit=None if limit is None else round_to_bf16(limit),
             swizzle=swizzle, ue8m0=config.scale_ue8m0, config=choose_config(E, N, D, gs, 8))
    before = len(plans)
    for _ in range(3):
        plugin.run(SiluMulQuantInputs(x, m), via_run, shape, config)
    plans_for_three_runs = len(plans) - before
    bound = plugin.prepare(shape, config)
    returned = bound(SiluMulQuantInputs(x, m), via_prepare)
    results.append({"case": [E, N, D, gs, layout, limit, swizzle], "run_equals_jit": same(jit, via_run),
                    "prepare_equals_jit": same(jit, via_prepare), "plans_for_three_runs": plans_for_three_runs,
                    "returned": repr(returned), "written": not bool(torch.isnan(via_prepare.out.float()).all())})
x0, m0 = torch.empty(0, 0, 256, dtype=torch.bfloat16), torch.empty(0, dtype=torch.int32)
empty = describe(x0, m0, group_size=128, topk=8, swiglu_limit=None, swizzle=False, scale_layout="row_major")
before = len(plans)
result = plugin.prepare(*empty)(SiluMulQuantInputs(x0, m0), allocate_outputs(*empty, torch.device("cpu")))
print(json.dumps({"results": results, "empty_returns": repr(result), "empty_plans": len(plans) - before,
                  "keys": len(plugin._launches)}))
"""


def test_prepare_and_run_equal_the_jit_launch_under_the_interpreter():
    """Under Triton's CPU interpreter: ``run`` (three calls) and ``prepare``'s launch write the same
    bytes as the JIT launcher ``launch``; ``run`` plans once per shape key; an empty shape launches
    nothing."""
    pytest.importorskip("triton")
    out = _run_python(_PREPARE_SCRIPT, env={"TRITON_INTERPRET": "1"}, timeout=300)
    report = json.loads(out.strip().splitlines()[-1])
    for r in report["results"]:
        assert r["run_equals_jit"] and r["prepare_equals_jit"] and r["written"], r
        assert r["plans_for_three_runs"] == 1, r  # prepared on the first run of the key, reused after
        assert r["returned"] == "None", r
    assert report["keys"] == 3
    assert report["empty_returns"] == "None" and report["empty_plans"] == 1


def test_argument_plan_matches_the_kernel_signature():
    """The low-level launcher gets every parameter in declaration order (runtime arguments, then the
    constexpr values), as ``JITFunction.run`` passes ``bound_args.values()``: checked against Python's
    own binding of the kernel's signature. Options (num_warps, launch_pdl, ...) are not parameters."""
    pytest.importorskip("triton")
    import inspect

    from sglang_moe_plugins.plugins.triton_common import ordered_arguments
    from sglang_moe_plugins.plugins.triton_smq import launch as K

    plan = K.plan_launch(
        5,
        7,
        256,
        group_size=128,
        scale_strides=(14, 1, 8),
        swiglu_limit=7.0,
        swizzle=True,
        ue8m0=False,
        device_index=None,
        pointers=("gateup", "m", "out", "scale"),
    )
    kwargs = plan.kwargs_dict
    runtime = ("gateup", "m", "out", "scale", *plan.runtime)
    fn = K.silu_mul_quant_kernel.fn
    signature = inspect.signature(fn)
    params = {name: kwargs[name] for name in signature.parameters if name in kwargs}
    expected = tuple(signature.bind(*runtime, **params).arguments.values())
    assert ordered_arguments(K.silu_mul_quant_kernel.arg_names, runtime, kwargs) == expected
    assert len(expected) == len(signature.parameters)
    assert plan.runtime == (5, 7, 14, 1, 8, 7.0)
    assert {"num_warps", "num_stages"} <= set(kwargs) - set(signature.parameters)
    with pytest.raises(KeyError, match="BLOCK_E"):
        ordered_arguments(
            K.silu_mul_quant_kernel.arg_names, runtime, {k: v for k, v in kwargs.items() if k != "BLOCK_E"}
        )


class _RecordingCompiled:
    """A stand-in for Triton's CompiledKernel that records what its launcher is called with."""

    def __init__(self):
        self.calls = []
        self.function = 1234
        self.packed_metadata = (4, 1, 0)

    def run(self, *args):
        self.calls.append(args)

    def launch_metadata(self, grid, stream, *args):
        return {"grid": grid, "stream": stream, "nargs": len(args)}


def test_low_level_launch_passes_hooks_only_when_installed(monkeypatch):
    """With Triton's launch hooks idle the launcher gets None for metadata and hooks (the JIT path
    would build the metadata on every call); once a hook is installed (a profiler), the metadata and
    both hook chains are passed, as the JIT path does."""
    pytest.importorskip("triton")
    from triton import knobs

    from sglang_moe_plugins.plugins import triton_common as L

    monkeypatch.setattr(L, "_stream_getter", lambda: lambda index: 7000 + index)
    compiled = _RecordingCompiled()
    low = L.LowLevelLaunch(compiled, (9, 1, 1), (11, 22.0, True), device_index=3)
    low(101, 102)
    assert compiled.calls[-1] == (9, 1, 1, 7003, 1234, (4, 1, 0), None, None, None, 101, 102, 11, 22.0, True)
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        low(201, 202)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    call = compiled.calls[-1]
    assert call[:6] == (9, 1, 1, 7003, 1234, (4, 1, 0))
    assert call[6] == {"grid": (9, 1, 1), "stream": 7003, "nargs": 5}
    assert call[7] is knobs.runtime.launch_enter_hook and call[8] is knobs.runtime.launch_exit_hook
    assert call[9:] == (201, 202, 11, 22.0, True)
    with pytest.raises(RuntimeError, match="entry point"):
        L.LowLevelLaunch(object(), (1, 1, 1), (), device_index=0)


def test_next_pow2_is_shared():
    from sglang_moe_plugins.plugins.deep_gemm import pre_dispatch_triton as P
    from sglang_moe_plugins.plugins.triton_common import next_pow2

    assert [next_pow2(n) for n in (0, 1, 2, 3, 4, 5, 1023, 1024, 1025)] == [1, 1, 2, 4, 4, 8, 1024, 1024, 2048]
    assert P.next_pow2 is next_pow2
    K = pytest.importorskip("sglang_moe_plugins.plugins.triton_smq.launch")
    assert K.next_pow2 is next_pow2 and K.pdl_supported is P.pdl_supported
