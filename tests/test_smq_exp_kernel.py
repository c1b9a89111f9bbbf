"""``benchmarks/smq_exp_kernel.py`` (run I's experimental kernel) still compiles for sm90 against the production
kernel's per-item functions, and each switch compiles to what its docstring says (CPU only: Triton's compiler
for an sm90 target, no GPU). The benchmark itself runs on the GPU machine only; this keeps it from rotting
when the production kernel changes."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

triton = pytest.importorskip("triton")

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compile_exp():
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:  # pragma: no cover - depends on the Triton release
        pytest.skip(f"this Triton has no ASTSource/GPUTarget ({exc})")
    spec = importlib.util.spec_from_file_location("smq_exp_kernel", ROOT / "benchmarks" / "smq_exp_kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = module.smq_exp_kernel
    signature = {
        "x_ptr": "*bf16",
        "m_ptr": "*i32",
        "out_ptr": "*fp8e4nv",
        "s_ptr": "*fp32",
        "ctr_ptr": "*i32",
        "num_experts": "i32",
        "num_rows": "i32",
        "s_e": "i32",
        "s_r": "i32",
        "s_g": "i32",
        "limit": "fp32",
        "act_div": "i32",
        "act_min": "i32",
        "wave": "i32",
    }
    # DSV4-Flash EP8 decode's tiles: E = 32, D = 2048, one-row items of 1024 columns, swiglu_limit, fp32 scales
    base = dict(
        D=2048,
        GS=128,
        G=16,
        GP=4,
        BM=1,
        BC=1024,
        NC=2,
        BLOCK_E=32,
        HAS_LIMIT=True,
        SWIZZLE=False,
        UE8M0=False,
        EVEN_D=True,
        USE_PDL=True,
        IDLE_EXIT=True,
        FRONT_LOAD=True,
        PACK_FIRST=False,
        ACTIVE=False,
        DYNAMIC=0,
        EVICT=False,
    )

    def run(**switches) -> str:
        constexprs = dict(base, **switches)
        sig = dict(signature, **dict.fromkeys(constexprs, "constexpr"))
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(5)}
        compiled = triton.compile(
            ASTSource(kernel, sig, constexprs, attrs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4, "num_stages": 1, "launch_pdl": True},
        )
        return compiled.asm["ptx"]

    return run


def _body(ptx: str) -> str:
    """The instructions of a PTX listing, without its debug sections and comments."""
    lines = (line.split("//")[0].strip() for line in ptx.split(".section")[0].splitlines())
    return "\n".join(line for line in lines if line and not line.startswith(".loc"))


def test_the_default_and_the_static_switches_compile_without_atomics(compile_exp):
    default = _body(compile_exp())
    for switches in ({}, {"PACK_FIRST": True}, {"ACTIVE": True, "IDLE_EXIT": True}, {"EVICT": True}):
        ptx = compile_exp(**switches)
        assert "griddepcontrol.wait" in ptx, switches
        assert "atom.global" not in ptx, switches
        # a switch that compiles to the default's code would measure nothing
        assert (_body(ptx) != default) == bool(switches), switches


def test_evict_first_marks_the_loads(compile_exp):
    assert "evict_first" not in compile_exp()
    assert "evict_first" in compile_exp(EVICT=True)


@pytest.mark.parametrize("chunk", [1, 2])
def test_the_work_queue_claims_with_an_atomic_add_and_the_last_program_resets_both_words(compile_exp, chunk):
    ptx = compile_exp(DYNAMIC=chunk, IDLE_EXIT=False, FRONT_LOAD=False)
    assert "atom.global.gpu.acq_rel.add" in ptx
    assert ptx.count("atom.global.gpu.acq_rel.exch") == 2  # the reset of the counter and of the done count
