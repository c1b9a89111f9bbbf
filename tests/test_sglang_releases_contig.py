"""The version table's compact-runner entries (op ``silu_mul_quant_contig``) against each release's source.

What :mod:`sglang_moe_plugins.integrations.sglang.contig` relies on, read with ``ast`` from each listed
wheel (downloaded once, as ``test_sglang_releases.py`` does): the runner method and its parameters, where it
imports ``silu_and_mul_contig_post_quant`` from and that this module has the function with the table's
parameters, the fused branch's condition, that the fused branch allocates the outputs the two-kernel branch
returns (the same dtypes and UE8M0 flags), and that the redirect attribute is used nowhere else in the method.
"""

from __future__ import annotations

import ast

import pytest
from test_sglang_releases import RELEASES, RUNNER, _function, _source

from sglang_moe_plugins.integrations.sglang.versions import CONTIG_RUNNER_TARGET, KNOWN_TARGETS, ContigHost

OP = "silu_mul_quant_contig"
CONTIG_RELEASES = [r for r in RELEASES if any(t.op == OP for t in KNOWN_TARGETS[r])]
UE8M0 = "deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0"


def _host(release: str) -> ContigHost:
    (host,) = {t.host for t in KNOWN_TARGETS[release] if t.op == OP}
    assert isinstance(host, ContigHost)
    return host


def _method(release: str) -> ast.FunctionDef:
    source = _source(release, RUNNER)
    assert source is not None
    (cls,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "DeepGemmRunnerCore"]
    (fn,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_run_contiguous_gemm"]
    return fn


def _text(condition: str) -> str:
    return "self." + condition


def test_the_table_starts_at_the_first_release_with_the_compact_layout_guard() -> None:
    assert CONTIG_RELEASES and CONTIG_RELEASES[0] == "0.5.20" and CONTIG_RELEASES[-1] == RELEASES[-1]


@pytest.mark.parametrize("release", CONTIG_RELEASES)
def test_runner_method_and_kernel_have_the_tables_parameters(release: str) -> None:
    targets = {t.path: t for t in KNOWN_TARGETS[release] if t.op == OP}
    method = _method(release)
    runner = targets[CONTIG_RUNNER_TARGET]
    assert tuple(a.arg for a in method.args.args) == runner.parameters
    host = _host(release)
    module, name = host.kernel_path.rsplit(".", 1)
    # the method imports the kernel from this module, inside its body (so the hooked attribute is read per call)
    imports = [n for n in ast.walk(method) if isinstance(n, ast.ImportFrom) and any(a.name == name for a in n.names)]
    assert [n.module for n in imports] == [module], f"sglang {release}"
    # the module (a package re-exporting it, or the module itself) defines or imports the function
    member = module.replace(".", "/")
    source = _source(release, member + ".py") or _source(release, member + "/__init__.py")
    assert source is not None and name in source
    fn = _function(release, member + ".py", name)
    if fn is None:  # re-exported: from .x import name
        (origin,) = [
            n
            for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.ImportFrom) and any(a.name == name for a in n.names)
        ]
        fn = _function(release, f"{member}/{origin.module}.py", name)
    assert fn is not None, f"sglang {release}: {host.kernel_path}"
    assert tuple(a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)) == targets[host.kernel_path].parameters


@pytest.mark.parametrize("release", CONTIG_RELEASES)
def test_the_branches_the_redirect_relies_on(release: str) -> None:
    host = _host(release)
    method = _method(release)
    ifs = [n for n in ast.walk(method) if isinstance(n, ast.If)]
    (situ,) = [n for n in ifs if ast.unparse(n.test) == "self.config.activation == 'situ'"]
    fused_test = " or ".join(_text(c) for c in host.fused_when)
    (fused,) = [n for n in ifs if ast.unparse(n.test) == fused_test]
    assert situ.orelse == [fused], "situ first, then the fused branch, else the two kernels"
    body = "\n".join(ast.unparse(s) for s in fused.body)
    # the fused branch allocates fp8 [all_tokens, N // 2] and the scales with every flag = UE8M0 ...
    assert "torch.empty((all_tokens, N // 2), device=gateup_output.device, dtype=torch.float8_e4m3fn)" in body
    for flag in ("column_major_scales", "scale_tma_aligned", "scale_ue8m0"):
        assert f"{flag}={UE8M0}" in body
    assert f"transposed={UE8M0}" in body and "quant_group_size=scale_block_size" in body
    assert "swiglu_limit=swiglu_limit_arg" in body and "swiglu_limit_arg: Optional[float] = self.swiglu_limit" in body
    assert (
        "use_contig_swizzle = self.use_swizzle and (not running_state.get('deepep_v2_disable_contig_swizzle', False))"
        in body
    )
    # ... which is what the two-kernel branch returns from sglang_per_token_group_quant_fp8 with the same flags
    two = "\n".join(ast.unparse(s) for s in fused.orelse)
    assert "sglang_per_token_group_quant_fp8(down_input, scale_block_size, " in two
    for flag in ("column_major_scales", "scale_tma_aligned", "scale_ue8m0"):
        assert f"{flag}={UE8M0}" in two
    assert "silu_and_mul_clamp(gateup_output.view(-1, N), down_input, self.swiglu_limit)" in two
    assert "_legacy_silu_and_mul(gateup_output.view(-1, N), down_input)" in two
    # the redirect attribute decides the branch and nothing else in the method
    text = ast.unparse(method)
    redirect = _text(host.redirect)
    uses = text.count(redirect)
    expected = text.count("use_contig_swizzle = " + redirect) + fused_test.count(redirect)
    assert uses == expected, f"sglang {release}: {redirect} is used {uses} times, the table expects {expected}"
    assert "scale_block_size = quant_info.block_shape[1] if quant_info.use_mxfp8 else 128" in text
    assert "N = quant_info.w13_weight.size(1)" in text
