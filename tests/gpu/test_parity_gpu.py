"""``parity = true`` on the GPU: through the package's real masked hook (``silu_mul_quant_hook``), on every catalog
shape at decode and prefill sizes, every call SGLang 0.5.23 serves returns SGLang's kernels' outputs bit for bit, and
the package's plugins run only the calls SGLang's own code crashes on.

SGLang itself does not import on the GPU machine (docs/host-notes.md), so SGLang 0.5.23's
``_varlen_deep_gemm_silu_mul_quant`` is rebuilt here line for line (:func:`stock_0523`: its assert and its two
branches, with fp32 scales as on Hopper) over SGLang's own kernels built from the wheel's JIT sources; the hook gets
it as ``original`` exactly as SGLang's HookRegistry hands it. Each case also records, for the package's default
(``parity = false``) and for stock, the fp8 bytes that differ between the two and each one's error against the fp32
activation (``$OUT``-free: printed, and kept by the run script's log) — the numbers behind the default.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA device", allow_module_level=True)
from sglang_host import sglang_jit  # noqa: E402

JIT, WHY_NOT = sglang_jit("/tmp/sgl_jit_build")
if JIT is None:  # pragma: no cover - depends on the machine
    pytest.skip(WHY_NOT, allow_module_level=True)

from sglang_moe_plugins import api  # noqa: E402
from sglang_moe_plugins.catalog import load_catalog  # noqa: E402
from sglang_moe_plugins.config import load_config  # noqa: E402
from sglang_moe_plugins.counters import totals  # noqa: E402
from sglang_moe_plugins.integrations.sglang.silu_mul_quant import silu_mul_quant_hook  # noqa: E402
from sglang_moe_plugins.integrations.sglang.stock_rules import masked_stock_crash  # noqa: E402
from sglang_moe_plugins.plugins.sglang_kernels.host import use_host_kernels  # noqa: E402

pytestmark = pytest.mark.gpu
OP = "silu_mul_quant"


def stock_0523(
    gateup_output,
    masked_m,
    group_size,
    topk,
    swiglu_limit=None,
    swizzle=False,
    gemm1_alpha=None,
    gemm1_clamp_limit=None,
    num_real_tokens=None,
    silu_mul_keep_fp32=False,
):
    """SGLang 0.5.23's ``_varlen_deep_gemm_silu_mul_quant`` without gemm1_alpha, DEEPGEMM_SCALE_UE8M0 off (Hopper)."""
    E, N, D_2 = gateup_output.shape
    D = D_2 // 2
    G = D // group_size
    if swiglu_limit is not None or swizzle or silu_mul_keep_fp32:
        assert N % 4 == 0 and G % 4 == 0 and D // 8 >= E, (
            "DSV4 JIT activation requires N % 4 == 0, G % 4 == 0 and "
            f"D // 8 >= num_experts, got N={N} G={G} D={D} E={E}"
        )
        out = torch.empty((E, N, D), device=gateup_output.device, dtype=torch.float8_e4m3fn)
        scale = torch.empty((E, N, G), device=gateup_output.device, dtype=torch.float32)
        JIT.silu_and_mul_masked_post_quant(
            gateup_output, out, scale, group_size, masked_m, scale_ue8m0=False, topk=topk, transposed=False,
            swiglu_limit=swiglu_limit, swizzle=swizzle,
        )  # fmt: skip
        return out, scale
    expected_m = -(-num_real_tokens * topk // E) if num_real_tokens else None
    return JIT.per_token_group_quant(
        gateup_output, group_size=group_size, scale_ue8m0=False, fuse_silu_and_mul=True, masked_m=masked_m,
        expected_m=expected_m, column_major_scales=True,
    )  # fmt: skip


def _cases():
    seen = set()
    for model in load_catalog():
        if model.gpt_oss_activation:
            continue
        for ep, tp in ((1, 1), (4, 1), (8, 1), (16, 1), (1, 4), (1, 8)):
            if model.experts % ep or model.inter % (tp * 128):
                continue
            e, d = model.experts // ep, model.inter // tp
            for n in (8, 256):
                key = (e, n, d, model.topk, model.swiglu_limit)
                if key not in seen:
                    seen.add(key)
                    yield pytest.param(key, id=f"{model.short_name}-EP{ep}-TP{tp}-N{n}")


@pytest.fixture(scope="module")
def hooks():
    """The process's selector under ``parity = true`` and under the default, with SGLang's kernels installed."""
    with use_host_kernels(JIT.host_kernels()):
        selectors = {name: api.reload(config) for name, config in (("default", load_config({})),)}
        selectors["parity"] = api.reload(load_config({"SGLANG_MOE_PLUGINS_PARITY": "1"}))
        yield selectors
    api.reload(load_config({}))


def _use(selector):
    api._selector = selector  # the process's selector, as api.reload sets it (without rediscovering each case)


def _inputs(e, n, d, topk, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(e, n, 2 * d, device="cuda", generator=gen) * 2 + 0.01
    gateup = x.to(torch.bfloat16)
    masked = torch.randint(1, n + 1, (e,), device="cuda", generator=gen, dtype=torch.int32)
    masked[0] = n
    # The host's budget, sum(masked_m) <= N * topk, after the full first expert: the DSV4 JIT kernel leaves the rows
    # past N * topk unwritten (its max_rows), so a budget broken here would compare uninitialised memory.
    masked[masked.cumsum(0) > n * topk] = 0
    return gateup, masked


def _real(t, masked, n):
    rows = torch.arange(n, device=t.device)[None, :] < masked[:, None]
    return t[rows]


def _dequant(out, scale, masked, n, group):
    q = _real(out, masked, n).float()
    s = _real(scale.contiguous() if scale.dim() == 3 else scale, masked, n)
    return (q.view(q.shape[0], -1, group) * s[..., None]).flatten(1)


@pytest.mark.parametrize("key", list(_cases()))
def test_parity_is_sglangs_kernels_bit_for_bit_and_the_package_only_where_sglang_crashes(key, hooks):
    e, n, d, topk, limit = key
    gateup, masked = _inputs(e, n, d, topk, seed=e * 1000 + n)
    kwargs = {} if limit is None else {"swiglu_limit": limit}
    crash = masked_stock_crash(
        ("swiglu_limit", "swizzle", "silu_mul_keep_fp32"), experts=e, rows=n, hidden=d, group_size=128,
        swiglu_limit=limit,
    )  # fmt: skip
    _use(hooks["parity"])
    before = totals()
    if crash is None:
        want_out, want_scale = stock_0523(gateup, masked, 128, topk, **kwargs)
        got_out, got_scale = silu_mul_quant_hook(stock_0523, gateup, masked, 128, topk, **kwargs)
        torch.cuda.synchronize()
        real = _real(got_out.view(torch.uint8), masked, n)
        assert torch.equal(real, _real(want_out.view(torch.uint8), masked, n))
        assert got_scale.shape == want_scale.shape and got_scale.stride() == want_scale.stride()
        assert torch.equal(_real(got_scale.contiguous(), masked, n), _real(want_scale.contiguous(), masked, n))
        delta = {k: v - before.get(k, 0) for k, v in totals().items() if v != before.get(k, 0)}
        assert delta == {("delegations", OP, "parity"): 1}, delta
    else:
        # SGLang's assert on the shape, or the JIT kernel's own check of its limits (E <= 256: DeepSeek-V4-Pro at EP1)
        with pytest.raises((AssertionError, RuntimeError), match=r"DSV4 JIT activation requires|exceeds maximum"):
            stock_0523(gateup, masked, 128, topk, **kwargs)
        got_out, got_scale = silu_mul_quant_hook(stock_0523, gateup, masked, 128, topk, **kwargs)
        torch.cuda.synchronize()
        delta = {k: v - before.get(k, 0) for k, v in totals().items() if v != before.get(k, 0)}
        assert len(delta) == 1 and next(iter(delta))[0] == "calls", delta  # a plugin ran it, nothing delegated
        assert torch.isfinite(_dequant(got_out, got_scale, masked, n, 128)).all()
    # The package's default on the same call (information: how far it moves from stock, and from fp32).
    _use(hooks["default"])
    pkg_out, pkg_scale = silu_mul_quant_hook(stock_0523, gateup, masked, 128, topk, **kwargs)
    rows = _real(gateup, masked, n).float()
    gate, up = rows[:, :d], rows[:, d:]
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    exact = gate / (1 + torch.exp(-gate)) * up
    pkg = _dequant(pkg_out, pkg_scale, masked, n, 128)
    line = f"PARITY {e=} {n=} {d=} {topk=} {limit=} stock={'crashes' if crash else 'serves'}"
    line += f" package_err={((pkg - exact).abs().mean() / exact.abs().mean()).item():.3e}"
    if crash is None:
        stock = _dequant(want_out, want_scale, masked, n, 128)
        differ = (_real(pkg_out.view(torch.uint8), masked, n) != _real(want_out.view(torch.uint8), masked, n)).float()
        line += f" stock_err={((stock - exact).abs().mean() / exact.abs().mean()).item():.3e}"
        line += f" fp8_bytes_differ={differ.mean().item():.4%}"
    print(line, flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "parity_numerics.txt"), "a") as f:
            f.write(line + "\n")
