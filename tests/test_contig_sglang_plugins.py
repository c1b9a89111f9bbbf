"""contig_sglang_fused and contig_sglang_two_kernel on a CPU: supports()/available() against each real limit,
their run() argument handling through the host indirection (CPU stand-ins computing the op's numerics), the
unwrap of SGLang's hooked kernel wrapper through a real HookRegistry AROUND hook, and the release table
against each release's wheel (read with ``ast``, nothing imported). The GPU run: tests/gpu/test_contig_sglang_gpu.py.
"""

from __future__ import annotations

import ast
import collections
import functools
import re
import sys
import zipfile

import pytest
import torch

from sglang_moe_plugins.errors import KernelNotAvailableError
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops.silu_mul_quant_contig import ContigConfig, ContigInputs, ContigShape, allocate_outputs
from sglang_moe_plugins.plugins.contig import sglang_host as host
from sglang_moe_plugins.plugins.contig.sglang_fused import ContigSglangFusedPlugin
from sglang_moe_plugins.plugins.contig.sglang_host import ContigHostKernels, original_function, use_contig_kernels
from sglang_moe_plugins.plugins.contig.sglang_two_kernel import ContigSglangTwoKernelPlugin
from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import contig_values
from sglang_moe_plugins.quant import pack_ue8m0_bytes, quantize_fp8_groups, ue8m0_exponent

SM90 = Platform.cuda(9, 0)
FUSED, TWO = ContigSglangFusedPlugin(), ContigSglangTwoKernelPlugin()


def cfg(platform=SM90, limit=None, swizzle=False, layout="row_major", keep_fp32=False) -> ContigConfig:
    return ContigConfig(platform, limit, swizzle, layout, keep_fp32)


# --- CPU stand-ins with SGLang's signatures, computing the op's numerics -------------------------------


class Recorder:
    def __init__(self, fused_groups=(32, 128)) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []
        self.fused_groups = fused_groups

    def kernels(self) -> ContigHostKernels:
        return ContigHostKernels(
            self.fused, self.clamp, self.silu, self.quant, source="cpu stand-ins", fused_groups=self.fused_groups
        )

    def fused(
        self,
        input,
        output,
        output_scale,
        quant_group_size,
        scale_ue8m0=False,
        transposed=False,
        swiglu_limit=None,
        swizzle=False,
    ):
        self.calls.append(
            (
                "fused",
                (input, output, output_scale, quant_group_size),
                dict(scale_ue8m0=scale_ue8m0, transposed=transposed, swiglu_limit=swiglu_limit, swizzle=swizzle),
            )
        )
        config = cfg(limit=swiglu_limit, swizzle=swizzle)
        q, scale = quantize_fp8_groups(contig_values(input, config), quant_group_size, ue8m0=scale_ue8m0)
        output.copy_(q)
        output_scale.copy_(pack_ue8m0_bytes(ue8m0_exponent(scale)) if transposed else scale)

    def clamp(self, input, output, swiglu_limit):
        self.calls.append(("clamp", (input, output, swiglu_limit), {}))
        output.copy_(contig_values(input, cfg(limit=swiglu_limit), bf16_product=True).to(torch.bfloat16))

    def silu(self, input, out=None):
        self.calls.append(("silu", (input, out), {}))
        out.copy_(contig_values(input, cfg(), bf16_product=True).to(torch.bfloat16))
        return out

    def quant(
        self,
        x,
        group_size,
        eps=1e-10,
        column_major_scales=False,
        scale_tma_aligned=False,
        scale_ue8m0=False,
        *,
        output_q,
        output_s,
    ):
        self.calls.append(
            (
                "quant",
                (x, group_size),
                dict(
                    column_major_scales=column_major_scales,
                    scale_tma_aligned=scale_tma_aligned,
                    scale_ue8m0=scale_ue8m0,
                    output_q=output_q,
                    output_s=output_s,
                ),
            )
        )
        q, scale = quantize_fp8_groups(x.float(), group_size, ue8m0=scale_ue8m0)
        output_q.copy_(q)
        output_s.copy_(pack_ue8m0_bytes(ue8m0_exponent(scale)) if scale_ue8m0 else scale)
        return output_q, output_s


@pytest.fixture
def stand_ins():
    recorder = Recorder()
    with use_contig_kernels(recorder.kernels()):
        yield recorder


# --- available / supports ------------------------------------------------------------------------------


def test_available_is_no_on_cpu_and_old_gpus(stand_ins) -> None:
    for plugin in (FUSED, TWO):
        answer = plugin.available(Platform.cpu())
        assert not answer and "CUDA-only" in answer.reason
        answer = plugin.available(Platform.cuda(7, 5))
        assert not answer and "sm80+" in answer.reason and "sm75" in answer.reason
        assert plugin.available(SM90) and "cpu stand-ins" in plugin.available(SM90).reason
        assert not plugin.supports(ContigShape(512, 128), cfg(platform=Platform.cpu()))


def test_available_without_sglang_or_override(monkeypatch) -> None:
    monkeypatch.setattr(host, "_default", None)
    monkeypatch.setattr(host, "installed_release", lambda: None)
    answer = FUSED.available(SM90)
    assert not answer and "not reachable" in answer.reason and "use_contig_kernels" in answer.reason


FUSED_CASES = [
    (ContigShape(512, 128), cfg(), True, "within SGLang's fused contiguous kernel's limits"),
    (ContigShape(8192, 128), cfg(limit=10.0, swizzle=True, keep_fp32=True), True, "within"),
    (ContigShape(256, 32), cfg(layout="ue8m0_packed"), True, "within"),
    (ContigShape(512, 64), cfg(), False, "group_size (64) must be one of (32, 128)"),
    (ContigShape(512, 16), cfg(), False, "group_size (16) must be one of (32, 128)"),
    (ContigShape(384, 128), cfg(), False, "D (384) must be a multiple of 256"),
    (ContigShape(640, 32), cfg(), False, "D (640) must be a multiple of 256"),
    (ContigShape(8448, 128), cfg(), False, "D (8448) must be <= 8192"),
    (ContigShape(768, 128), cfg(layout="ue8m0_packed"), False, "packed UE8M0 scales need G % 4 == 0 (G=6)"),
    (ContigShape(768, 128), cfg(), True, "within"),  # row-major fp32 scales: any G
    (ContigShape(256, 128), cfg(layout="ue8m0_packed"), False, "G % 4 == 0 (G=2)"),
]


@pytest.mark.parametrize("shape, config, ok, reason", FUSED_CASES)
def test_fused_supports_each_limit(stand_ins, shape, config, ok, reason) -> None:
    answer = FUSED.supports(shape, config)
    assert bool(answer) is ok and reason in answer.reason, answer


def test_fused_group_sizes_follow_the_release(monkeypatch) -> None:
    """0.5.20's template is group 128 only (the table's fused_groups reach supports())."""
    with use_contig_kernels(Recorder(fused_groups=(128,)).kernels()):
        answer = FUSED.supports(ContigShape(512, 32), cfg())
        assert not answer and "must be one of (128,)" in answer.reason
        assert FUSED.supports(ContigShape(512, 128), cfg())
    monkeypatch.setattr(host, "_default", None)
    monkeypatch.setattr(host, "installed_release", lambda: host.RELEASES["0.5.20"])
    assert "must be one of (128,)" in FUSED.supports(ContigShape(512, 32), cfg()).reason
    monkeypatch.setattr(host, "installed_release", lambda: host.RELEASES["0.5.21"])
    assert FUSED.supports(ContigShape(512, 32), cfg())


TWO_CASES = [
    (ContigShape(512, 128), cfg(), True, "silu_and_mul to bf16, then sglang_per_token_group_quant_fp8"),
    (ContigShape(384, 128), cfg(limit=7.0, layout="ue8m0_packed"), True, "silu_and_mul_clamp to bf16"),
    (ContigShape(16, 16), cfg(), True, "stock's numerics"),  # no D % 256, no G % 4 (unaligned UE8M0 packs too)
    (ContigShape(48, 16), cfg(layout="ue8m0_packed"), True, "stock's numerics"),
    (ContigShape(512, 128), cfg(keep_fp32=True), False, "rounds the SiLU * up product to bf16"),
    (ContigShape(512, 128), cfg(keep_fp32=True), False, "keep_fp32"),
    (ContigShape(512, 128), cfg(swizzle=True), False, "cannot read gran-8 swizzled input"),
]


@pytest.mark.parametrize("shape, config, ok, reason", TWO_CASES)
def test_two_kernel_supports_each_limit(stand_ins, shape, config, ok, reason) -> None:
    answer = TWO.supports(shape, config)
    assert bool(answer) is ok and reason in answer.reason, answer


def test_priorities_and_declared_writes() -> None:
    assert FUSED.priority == 100 and TWO.priority == 10 and 0 < TWO.priority < FUSED.priority
    assert FUSED.writes_inputs == frozenset() and TWO.writes_inputs == frozenset()


# --- run: arguments and outputs through the indirection ------------------------------------------------


def _call(plugin, shape, config, rows, *, misaligned=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    gateup = (torch.randn(rows, 2 * shape.hidden, generator=g) * 3).to(torch.bfloat16)
    outputs = allocate_outputs(shape, config, torch.device("cpu"), rows)
    if misaligned:  # an fp8 output view one byte into its storage
        base = torch.empty(rows * shape.hidden + 1, dtype=torch.float8_e4m3fn)
        outputs = type(outputs)(base[1:].view(rows, shape.hidden), outputs.scale)
    outputs.out.view(torch.uint8).fill_(0x7F)  # NaN bytes
    outputs.scale.view(torch.int32).fill_(-1)
    launch = plugin.prepare(shape, config)
    launch(ContigInputs(gateup), outputs)
    return gateup, outputs


def _expected(gateup, shape, config, bf16_product):
    q, scale = quantize_fp8_groups(
        contig_values(gateup, config, bf16_product=bf16_product), shape.group_size, ue8m0=config.scale_ue8m0
    )
    return q, (pack_ue8m0_bytes(ue8m0_exponent(scale)) if config.scale_ue8m0 else scale)


@pytest.mark.parametrize("layout", ["row_major", "ue8m0_packed"])
@pytest.mark.parametrize("limit", [None, 6.5])
@pytest.mark.parametrize("rows", [1, 5, 8])
def test_fused_run_passes_sglangs_arguments(stand_ins, layout, limit, rows) -> None:
    shape, config = ContigShape(1024, 128), cfg(limit=limit, swizzle=rows == 5, layout=layout, keep_fp32=True)
    gateup, outputs = _call(FUSED, shape, config, rows)
    [(kind, args, kwargs)] = stand_ins.calls
    ue8m0 = layout == "ue8m0_packed"
    assert kind == "fused" and args[0].data_ptr() == gateup.data_ptr() and args[3] == 128
    assert kwargs == dict(scale_ue8m0=ue8m0, transposed=ue8m0, swiglu_limit=limit, swizzle=rows == 5)
    assert args[1].data_ptr() == outputs.out.data_ptr() and args[2].data_ptr() == outputs.scale.data_ptr()
    assert args[2].stride() == ((1, (rows + 3) // 4 * 4) if ue8m0 else (8, 1))
    q, scale = _expected(gateup, shape, config, bf16_product=False)
    assert torch.equal(outputs.out.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(outputs.scale.view(torch.int32), scale.view(torch.int32))


@pytest.mark.parametrize("layout", ["row_major", "ue8m0_packed"])
@pytest.mark.parametrize("limit", [None, 6.5])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_two_kernel_run_is_sglangs_sequence(stand_ins, layout, limit, rows) -> None:
    shape, config = ContigShape(384, 64), cfg(limit=limit, layout=layout)
    gateup, outputs = _call(TWO, shape, config, rows)
    ue8m0 = layout == "ue8m0_packed"
    (first, first_args, _), (second, second_args, kwargs) = stand_ins.calls
    assert first == ("clamp" if limit is not None else "silu") and first_args[0].data_ptr() == gateup.data_ptr()
    down = first_args[1]
    assert down.dtype == torch.bfloat16 and down.shape == (rows, 384) and down.is_contiguous()
    if limit is not None:
        assert first_args[2] == limit  # as the runner passes self.swiglu_limit
    assert second == "quant" and second_args == (down, 64)
    assert (
        kwargs["column_major_scales"] is ue8m0
        and kwargs["scale_tma_aligned"] is ue8m0
        and kwargs["scale_ue8m0"] is ue8m0
    )
    assert kwargs["output_q"].data_ptr() == outputs.out.data_ptr(), "written in place: no copy"
    assert kwargs["output_s"].data_ptr() == outputs.scale.data_ptr()
    q, scale = _expected(gateup, shape, config, bf16_product=True)
    assert torch.equal(outputs.out.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(outputs.scale.view(torch.int32), scale.view(torch.int32))


@pytest.mark.parametrize("plugin", [FUSED, TWO], ids=lambda p: p.name)
def test_zero_rows_launch_nothing(stand_ins, plugin) -> None:
    _call(plugin, ContigShape(512, 128), cfg(), 0)
    assert stand_ins.calls == []


@pytest.mark.parametrize("plugin", [FUSED, TWO], ids=lambda p: p.name)
def test_a_misaligned_output_is_staged_and_copied(stand_ins, plugin) -> None:
    shape, config = ContigShape(512, 128), cfg()
    gateup, outputs = _call(plugin, shape, config, 4, misaligned=True)
    written = stand_ins.calls[-1][2].get("output_q") if plugin is TWO else stand_ins.calls[-1][1][1]
    assert written.data_ptr() % host.ALIGN == 0 and written.data_ptr() != outputs.out.data_ptr()
    q, _ = _expected(gateup, shape, config, bf16_product=plugin is TWO)
    assert torch.equal(outputs.out.view(torch.uint8), q.view(torch.uint8))


def test_kernel_input_views() -> None:
    row = torch.randn(1, 64).to(torch.bfloat16)
    odd = row.as_strided((1, 64), (1000, 1))
    assert host.kernel_input(odd).stride() == (64, 1) and host.kernel_input(odd).data_ptr() == odd.data_ptr()
    strided = torch.randn(1, 128).to(torch.bfloat16)[:, ::2]
    fixed = host.kernel_input(strided)
    assert fixed.is_contiguous() and torch.equal(fixed, strided) and fixed.data_ptr() != strided.data_ptr()
    offset = torch.randn(3 * 64 + 1).to(torch.bfloat16)[1:].view(3, 64)
    fixed = host.kernel_input(offset)
    assert fixed.data_ptr() % host.ALIGN == 0 and torch.equal(fixed, offset)


# --- the unwrap of a hooked wrapper -----------------------------------------------------------------------


FUSED_PATH = "sglang.kernels.ops.activation.silu_and_mul_clamp.silu_and_mul_contig_post_quant"


@pytest.fixture
def private_hook_registry(monkeypatch):
    """SGLang's real HookRegistry with empty state; every module attribute it patches is restored after."""
    pytest.importorskip("sglang.srt.plugins.hook_registry")
    import sglang.kernels.ops.activation.silu_and_mul_clamp as module
    from sglang.srt.plugins.hook_registry import HookRegistry

    before = module.silu_and_mul_contig_post_quant
    holders = [
        (m, name)
        for m in list(sys.modules.values())
        if m is not None
        for name, value in list(getattr(m, "__dict__", {}).items())
        if value is before
    ]
    monkeypatch.setattr(HookRegistry, "_hooks", collections.defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    monkeypatch.setattr(host, "_default", None)
    yield HookRegistry, module, before
    for m, name in holders:
        setattr(m, name, before)


def test_the_plugins_get_sglangs_kernel_not_the_hooked_wrapper(private_hook_registry) -> None:
    registry, module, before = private_hook_registry
    from sglang.srt.plugins.hook_registry import HookType

    hook_calls = []

    def around(original, *args, **kwargs):
        hook_calls.append(args)
        return original(*args, **kwargs)

    registry.register(FUSED_PATH, around, HookType.AROUND)
    registry.register(FUSED_PATH, around, HookType.AROUND)  # two wrappers deep
    registry.apply_hooks()
    hooked = module.silu_and_mul_contig_post_quant
    # ``before`` may already be this package's own hook (SGLang's load_plugins() ran earlier in this process)
    assert hooked is not before and hooked.__wrapped__.__wrapped__ is before
    assert hooked.__module__ == before.__module__ and hooked.__qualname__ == before.__qualname__  # functools.wraps
    kernels = host.get_contig_kernels()
    assert kernels.silu_and_mul_contig_post_quant is original_function(before, "silu_and_mul_contig_post_quant")
    assert kernels.silu_and_mul_contig_post_quant is not hooked and not hasattr(
        kernels.silu_and_mul_contig_post_quant, "__wrapped__"
    )
    assert hook_calls == []


def test_the_real_integration_hook_is_unwrapped(monkeypatch) -> None:
    """After SGLang's own load_plugins() (our integration hooks the kernel), the plugins get the original."""
    pytest.importorskip("sglang.srt.plugins")
    from sglang_session import loaded_sglang

    loaded_sglang()
    import sglang.kernels.ops.activation.silu_and_mul_clamp as module

    hooked = module.silu_and_mul_contig_post_quant
    assert getattr(hooked, "__wrapped__", None) is not None, "the integration hooks this kernel"
    monkeypatch.setattr(host, "_default", None)
    kernel = host.get_contig_kernels().silu_and_mul_contig_post_quant
    assert kernel is not hooked and not hasattr(kernel, "__wrapped__")
    assert kernel.__code__.co_filename == module.__file__


def test_a_chain_that_ends_outside_sglang_is_refused() -> None:
    def foreign(*args):
        return args

    @functools.wraps(foreign)
    def wrapper(*args):
        return foreign(*args)

    wrapper.__module__ = "sglang.kernels.ops.activation.silu_and_mul_clamp"
    wrapper.__qualname__ = "silu_and_mul_contig_post_quant"
    with pytest.raises(KernelNotAvailableError, match="cannot reach SGLang's own silu_and_mul_contig_post_quant"):
        original_function(wrapper, "silu_and_mul_contig_post_quant")


def test_the_sglang_functions_are_the_originals_defined_in_their_modules(monkeypatch) -> None:
    pytest.importorskip("sglang.kernels.ops.quantization.fp8_kernel")
    monkeypatch.setattr(host, "_default", None)
    kernels = host.get_contig_kernels()
    expected = {
        "silu_and_mul_contig_post_quant": "sglang.kernels.ops.activation.silu_and_mul_clamp",
        "silu_and_mul_clamp": "sglang.kernels.ops.activation.silu_and_mul_clamp",
        "silu_and_mul": host.ACTIVATION_MODULE,
        "sglang_per_token_group_quant_fp8": host.QUANT_MODULE,
    }
    got = [
        kernels.silu_and_mul_contig_post_quant,
        kernels.silu_and_mul_clamp,
        kernels.silu_and_mul,
        kernels.per_token_group_quant_fp8,
    ]
    assert {fn.__name__: fn.__module__ for fn in got} == expected
    assert kernels.fused_groups == (32, 128) and kernels.source.startswith("sglang 0.5.23")


# --- the release table -------------------------------------------------------------------------------------


def test_release_for_versions(tmp_path) -> None:
    assert host.release_for("0.5.20").fused_module == "sglang.kernels.ops.attention.dsv4"
    assert (
        host.release_for("0.5.21").fused_module
        == host.release_for("0.5.22").fused_module
        == "sglang.kernels.ops.moe.dsv4"
    )
    assert host.release_for("0.5.23+cu129").fused_module == "sglang.kernels.ops.activation.silu_and_mul_clamp"
    assert host.release_for("0.5.20").fused_groups == (128,) and host.release_for("0.5.21").fused_groups == (32, 128)
    for other in ("0.5.19", "0.5.22.post1", "0.5.23rc1", None):
        assert host.release_for(other) is None, other
    assert host.release_for("0.5.24") is None and host.release_for("0.5.24", tmp_path) is None
    newest = tmp_path / host.RELEASES["0.5.23"].fused_file
    newest.parent.mkdir(parents=True)
    newest.write_text("")
    assert host.release_for("0.5.24", tmp_path) is host.RELEASES["0.5.23"]


def test_installed_release_is_the_installed_sglangs() -> None:
    from importlib.metadata import version

    pytest.importorskip("sglang")
    assert host.installed_release() is host.release_for(version("sglang"))


def test_quant_into_runs_the_old_body_on_the_given_outputs() -> None:
    """0.5.20/0.5.21: the whole-row branch and the group kernel, both on the caller's buffers."""
    calls = []

    def _run_per_token_group_quant_8bit_kernel(*args, **kwargs):
        calls.append(("group", args, kwargs))

    module = type(sys)("fake_fp8_kernel")
    module.__file__ = __file__
    _run_per_token_group_quant_8bit_kernel.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        module._run_per_token_group_quant_8bit_kernel = _run_per_token_group_quant_8bit_kernel
        module.sgl_per_token_quant_fp8 = lambda *args: calls.append(("token", args, {}))
        module.fp8_min, module.fp8_max = -448.0, 448.0
        # the stand-in's code is in this file, which is not its module's: expected to be refused
        with pytest.raises(KernelNotAvailableError):
            host._quant_into(module)
        module.__file__ = _run_per_token_group_quant_8bit_kernel.__code__.co_filename
        _run_per_token_group_quant_8bit_kernel.__qualname__ = "_run_per_token_group_quant_8bit_kernel"
        quant = host._quant_into(module)
    finally:
        del sys.modules[module.__name__]
    x, q, s = torch.zeros(4, 128), torch.empty(4, 128), torch.empty(4, 1)
    assert quant(x, 128, output_q=q, output_s=s) == (q, s) and calls[-1] == ("token", (x, q, s), {})
    quant(x, 64, 1e-10, True, True, True, output_q=q, output_s=s)
    assert calls[-1] == (
        "group",
        (x, q, s, 64, 1e-10, -448.0, 448.0),
        dict(scale_ue8m0=True, fuse_silu_and_mul=False, masked_m=None),
    )
    quant(x, 128, scale_ue8m0=True, output_q=q, output_s=s)  # whole row, but UE8M0: the group kernel
    assert calls[-1][0] == "group"
    n = len(calls)
    quant(x[:0], 64, output_q=q[:0], output_s=s[:0])
    assert len(calls) == n, "no rows: no kernel (as the function's x.shape[0] > 0 guard)"


# --- the table against each release's wheel ----------------------------------------------------------------


def _wheel_source(release: str, member: str) -> str | None:
    from test_sglang_releases import _wheel

    with zipfile.ZipFile(_wheel(release)) as whl:
        return whl.read(member).decode() if member in whl.namelist() else None


def _names(source: str) -> dict[str, ast.AST]:
    """Top-level names a module binds: functions it defines and names it imports."""
    names: dict[str, ast.AST] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            names[node.name] = node
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name] = node
    return names


def _function(source: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize("release", sorted(host.RELEASES))
def test_the_release_table_against_the_wheel(release: str) -> None:
    entry = host.RELEASES[release]
    fused = _wheel_source(release, "sglang/" + entry.fused_file)
    assert fused is not None, f"sglang {release}: {entry.fused_file} is missing"
    names = _names(fused)
    assert {"silu_and_mul_contig_post_quant", "silu_and_mul_clamp"} <= set(names), release
    runner = _wheel_source(release, "sglang/srt/layers/moe/moe_runner/deep_gemm.py")
    method = _function(runner, "_run_contiguous_gemm")
    imports = {a.name: n.module for n in ast.walk(method) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert imports["silu_and_mul_contig_post_quant"] == entry.fused_module, (
        "the runner imports the fused kernel from here"
    )
    top = {
        a.asname or a.name: n.module
        for n in ast.walk(ast.parse(runner))
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    }
    assert top["silu_and_mul_clamp"] == entry.fused_module and top["_legacy_silu_and_mul"] == host.ACTIVATION_MODULE
    cuh = _wheel_source(release, "sglang/kernels/jit/csrc/deepseek_v4/silu_and_mul_masked_post_quant.cuh")
    struct = cuh[
        cuh.index("struct SiluAndMulContigPostQuantKernel") - 200 : cuh.index("struct SiluAndMulContigPostQuantKernel")
        + 200
    ]
    groups = tuple(
        int(g) for g in re.findall(r"kGroupSize == (\d+)", struct.split("static_assert", 1)[1].split(";")[0])
    )
    assert groups == entry.fused_groups
    activation = _wheel_source(release, "sglang/kernels/ops/activation/activation.py")
    assert "silu_and_mul" in _names(activation)
    quant_source = _wheel_source(release, "sglang/kernels/ops/quantization/fp8_kernel.py")
    quant = _function(quant_source, "sglang_per_token_group_quant_fp8")
    takes_outputs = {"output_q", "output_s"} <= {a.arg for a in quant.args.kwonlyargs}
    assert takes_outputs is (release >= "0.5.22")
    if not takes_outputs:  # what _quant_into reproduces: the whole-row branch and the group kernel on x_q/x_s
        body = ast.unparse(quant)
        assert (
            "group_size == x.shape[-1] and x.dim() == 2 and (not (column_major_scales or scale_ue8m0 or "
            "fuse_silu_and_mul)) and (masked_m is None)" in body
        )
        assert "return sglang_per_token_quant_fp8(x)" in body
        assert (
            "_run_per_token_group_quant_8bit_kernel(x, x_q, x_s, group_size, eps, fp8_min, fp8_max, "
            "scale_ue8m0=scale_ue8m0, fuse_silu_and_mul=fuse_silu_and_mul, masked_m=masked_m)" in body
        )
        token = ast.unparse(_function(quant_source, "sglang_per_token_quant_fp8"))
        assert "sgl_per_token_quant_fp8(x, x_q, x_s)" in token
        group_kernel = _function(quant_source, "_run_per_token_group_quant_8bit_kernel")
        assert [a.arg for a in group_kernel.args.args] == ["x", "x_q", "x_s", "group_size", "eps", "fp8_min", "fp8_max"]
        assert [a.arg for a in group_kernel.args.kwonlyargs] == ["scale_ue8m0", "fuse_silu_and_mul", "masked_m"]


def test_silu_and_mul_contig_post_quant_signature_is_the_same_everywhere() -> None:
    for release, entry in host.RELEASES.items():
        source = _wheel_source(release, "sglang/" + entry.fused_file)
        node = _names(source)["silu_and_mul_contig_post_quant"]
        if isinstance(node, ast.ImportFrom):  # 0.5.20: re-exported by the package from .moe
            source = _wheel_source(release, "sglang/" + entry.fused_file.replace("__init__.py", "moe.py"))
        fn = _function(source, "silu_and_mul_contig_post_quant")
        assert [a.arg for a in fn.args.args] == [
            "input",
            "output",
            "output_scale",
            "quant_group_size",
            "scale_ue8m0",
            "transposed",
            "swiglu_limit",
            "swizzle",
        ], release
        clamp = _function(source, "silu_and_mul_clamp")
        assert [a.arg for a in clamp.args.args] == ["input", "output", "swiglu_limit"], release
