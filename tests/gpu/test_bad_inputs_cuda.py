"""Issue 7.1 on the GPU machine: the data-dependent rows of docs/reliability.md ("Bad input") for every
plugin available on this CUDA device, each forced, compared with the reference's defined result.
Skipped without CUDA. Run: ``PYTHONPATH=. python -m pytest -q tests/gpu/test_bad_inputs_cuda.py``.

Rows: masked_m above N / negative / int32 extremes (clamped to [0, N]); NaN, +-Inf and huge finite
values (the op's non-finite policy: NaN stays in its element, Inf and fp32 overflow count as FLT_MAX and
saturate, scales always finite); E = 0, N = 0, all experts empty; NaN in padding rows; a gateup at a
storage offset that is not 16-byte aligned.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA device", allow_module_level=True)

from builtin_eps import builtin_entry_points  # noqa: E402

from sglang_moe_plugins import Registry, Selector, UserConfig  # noqa: E402
from sglang_moe_plugins.config import parse_config  # noqa: E402
from sglang_moe_plugins.hardware import local_platform  # noqa: E402
from sglang_moe_plugins.ops import silu_mul_quant as smq  # noqa: E402
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference  # noqa: E402
from sglang_moe_plugins.testing.case import poison  # noqa: E402

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
NAN, INF = float("nan"), float("inf")


def _plugins():
    here = local_platform()
    reg = Registry.discover(UserConfig(), builtin_entry_points())
    return [r.plugin for r in reg.records(smq.OP) if r.plugin.available(here)]


PLUGINS = _plugins()
LAYOUTS = ("row_major", "column_major", "ue8m0_packed")


def run(plugin, gateup, masked, *, group=128, limit=None, layout="row_major"):
    shape, config = smq.describe(gateup, masked, group_size=group, topk=8, swiglu_limit=limit, scale_layout=layout)
    support = plugin.supports(shape, config)
    if not support:
        pytest.skip(f"{plugin.name} does not support {shape.describe()}: {support.reason}")
    outputs = smq.allocate_outputs(shape, config, gateup.device)
    poison(outputs)
    selector = Selector(Registry.from_plugins([plugin], parse_config({"force": {smq.OP: plugin.name}})))
    result = selector.dispatch(smq.OP, smq.SiluMulQuantInputs(gateup, masked), shape, config, outputs=outputs)
    torch.cuda.synchronize()
    return result, shape, config


def reference_on_cpu(gateup, masked, shape, config):
    want = smq.allocate_outputs(shape, config, torch.device("cpu"))
    poison(want)
    silu_mul_quant_reference(smq.SiluMulQuantInputs(gateup.cpu(), masked.cpu()), want, shape, config)
    return want


def assert_same(result, want, masked, n, *, exact=True):
    real = smq.real_rows(masked.cpu(), n)
    got_q, want_q = result.out.cpu().float()[real], want.out.cpu().float()[real]
    assert torch.equal(torch.isnan(got_q), torch.isnan(want_q)), "NaN elements differ from the defined result"
    finite = ~torch.isnan(want_q)
    if exact:
        assert torch.equal(got_q[finite], want_q[finite])
    else:  # fast exp/division: one fp8 step at most
        assert ((got_q[finite] - want_q[finite]).abs() <= want_q[finite].abs() * 2.0**-3 + 2.0**-9).all()
    got_s, want_s = result.scale.cpu()[real], want.scale.cpu()[real]
    assert (
        torch.equal(got_s.view(torch.int32), want_s.view(torch.int32))
        if exact
        else torch.allclose(got_s.float(), want_s.float(), rtol=2.0**-7)
    )


def gateup_for(e, n, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(e, n, 2 * d, generator=gen) * 3).to(torch.bfloat16).to(CUDA)


ids = [p.name for p in PLUGINS]


@pytest.mark.parametrize("plugin", PLUGINS, ids=ids)
@pytest.mark.parametrize("given", [[9, 2, 0, 8], [2**31 - 1, -1, 3, -(2**31)]], ids=["above-N", "int32-extremes"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_masked_m_clamped_to_0_N(plugin, given, layout):
    n = 8
    gateup = gateup_for(4, n, 512)
    got, _shape, _config = run(plugin, gateup, torch.tensor(given, dtype=torch.int32, device=CUDA), layout=layout)
    clamped = torch.tensor([min(max(v, 0), n) for v in given], dtype=torch.int32, device=CUDA)
    want, _, _ = run(plugin, gateup, clamped, layout=layout)
    assert_same(got, want, clamped, n)


@pytest.mark.parametrize("plugin", PLUGINS, ids=ids)
@pytest.mark.parametrize("limit", [None, 10.0])
def test_non_finite_policy(plugin, limit):
    e, n, d = 4, 8, 512
    x = torch.randn(e, n, 2 * d, generator=torch.Generator().manual_seed(1)) * 2
    x[0, 0, 0] = NAN  # gate NaN
    x[0, 1, d + 5] = NAN  # up NaN
    x[1, 0, 3] = INF  # gate +Inf
    x[1, 1, 4] = -INF  # gate -Inf -> NaN
    x[1, 2, d + 6] = -INF  # up -Inf
    x[2, 0, 7] = 3e38  # huge finite: the product overflows fp32
    x[2, 0, d + 7] = 3e38
    gateup = x.to(torch.bfloat16).to(CUDA)
    masked = torch.tensor([n, n, n, 2], dtype=torch.int32, device=CUDA)
    got, shape, config = run(plugin, gateup, masked, limit=limit)
    want = reference_on_cpu(gateup, masked, shape, config)
    assert_same(got, want, masked, n, exact=plugin.name == "reference")  # kernels: fast exp, one fp8 step
    real = smq.real_rows(masked.cpu(), n)
    scale = smq.scale_to_float(got.scale.cpu(), shape, config)[real]
    assert torch.isfinite(scale).all() and (scale > 0).all(), "scales must stay finite and positive"


@pytest.mark.parametrize("plugin", PLUGINS, ids=ids)
def test_huge_finite_input_never_gives_nan(plugin):
    big = torch.finfo(torch.bfloat16).max
    gen = torch.Generator().manual_seed(2)
    x = (torch.rand(4, 8, 1024, generator=gen) * 2 - 1) * big
    gateup = x.to(torch.bfloat16).to(CUDA)
    masked = torch.tensor([8, 8, 3, 0], dtype=torch.int32, device=CUDA)
    got, _shape, _config = run(plugin, gateup, masked)
    real = smq.real_rows(masked.cpu(), 8)
    q = got.out.cpu().float()[real]
    assert not torch.isnan(q).any() and q.abs().max() <= 448
    assert torch.isfinite(got.scale.cpu()[real]).all()


@pytest.mark.parametrize("plugin", PLUGINS, ids=ids)
@pytest.mark.parametrize(
    "e, n, masked", [(0, 8, []), (4, 0, [0, 3, 0, 1]), (4, 8, [0, 0, 0, 0])], ids=["E0", "N0", "all-empty"]
)
def test_empty_calls(plugin, e, n, masked):
    gateup = gateup_for(e, n, 512)
    m = torch.tensor(masked, dtype=torch.int32, device=CUDA)
    got, _shape, _ = run(plugin, gateup, m)
    assert got.out.shape == (e, n, 512)  # no real row: nothing to check (padding contents are unspecified)


@pytest.mark.parametrize("plugin", PLUGINS, ids=ids)
def test_nan_in_padding_rows_is_not_read(plugin):
    n = 8
    gateup = gateup_for(4, n, 512, seed=3)
    dirty = gateup.clone()
    masked = torch.tensor([3, 0, 8, 5], dtype=torch.int32, device=CUDA)
    real = smq.real_rows(masked.cpu(), n).to(CUDA)
    dirty[~real] = NAN
    clean, _, _ = run(plugin, gateup, masked)
    got, _, _ = run(plugin, dirty, masked)
    assert_same(got, clean, masked, n)


@pytest.mark.parametrize("plugin", PLUGINS, ids=ids)
def test_misaligned_gateup(plugin):
    gateup = gateup_for(4, 8, 512, seed=4)
    flat = torch.empty(gateup.numel() + 1, dtype=torch.bfloat16, device=CUDA)
    view = flat[1:].view(gateup.shape)
    view.copy_(gateup)
    masked = torch.tensor([8, 1, 0, 6], dtype=torch.int32, device=CUDA)
    aligned, _, _ = run(plugin, gateup, masked)
    got, _, _ = run(plugin, view, masked)
    assert_same(got, aligned, masked, 8)
