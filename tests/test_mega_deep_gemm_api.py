"""Detection of the sgl-deep-gemm MegaMoE API: the installed package and the documented older API."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from sglang_moe_plugins import deep_gemm_api as dga

REPO = pathlib.Path(__file__).resolve().parents[1]

# The older fork's Python API, as its sources read (get_symm_buffer_for_mega_moe without mma_type,
# FP4 activations chosen by DG_USE_FP4_ACTS / DG_USE_MXF4_KIND read by the C++ side at call time).
LEGACY_INIT = textwrap.dedent(
    """
    import os
    from . import _C
    from .mega import SymmBuffer, get_symm_buffer_for_mega_moe, fp8_fp4_mega_moe
    """
)
LEGACY_MEGA = textwrap.dedent(
    """
    import torch
    from .. import _C

    class SymmBuffer:
        def __init__(self, group, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                     intermediate_hidden, use_fp8_dispatch=True, activation='swiglu'):
            pass

    def get_symm_buffer_for_mega_moe(group, num_experts, num_max_tokens_per_rank, num_topk,
                                     hidden, intermediate_hidden, use_fp8_dispatch=True,
                                     activation='swiglu'):
        return SymmBuffer(group, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                          intermediate_hidden, use_fp8_dispatch, activation)

    def fp8_fp4_mega_moe(y, l1_weights, l2_weights, sym_buffer, cumulative_local_expert_recv_stats=None,
                         recipe=(1, 1, 32), activation='swiglu', activation_clamp=None, fast_math=True):
        _C.fp8_fp4_mega_moe(y, l1_weights, l2_weights, sym_buffer)
    """
)


def _write_package(root: pathlib.Path, init: str, mega: str, version: str) -> pathlib.Path:
    pkg = root / "deep_gemm"
    (pkg / "mega").mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    (pkg / "mega" / "__init__.py").write_text(mega)
    (pkg / "VERSION").write_text(version)
    return pkg


def test_installed_package_is_the_mma_type_api() -> None:
    pytest.importorskip("deep_gemm", reason="sgl-deep-gemm installed")
    api = dga.detect_deep_gemm_api(refresh=True)
    assert api.flavour == "mma_type"
    assert api.refuses_legacy_env
    assert set(dga.MEGA_FUNCTIONS) <= api.functions
    from importlib import metadata

    assert api.version == metadata.version("sgl-deep-gemm")


def test_static_detection_agrees_with_the_imported_module() -> None:
    deep_gemm = pytest.importorskip("deep_gemm")
    static = dga.detect_deep_gemm_api(refresh=True)
    live = dga.api_of_module(deep_gemm)
    assert (live.flavour, live.functions, live.refuses_legacy_env, live.version) == (
        static.flavour, static.functions, static.refuses_legacy_env, static.version,
    )


def test_installed_package_refuses_the_legacy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why we never forward SGLANG_OPT_..._USE_FP4_ACTS into DG_USE_FP4_ACTS: 0.2.x raises on it."""
    mega = pytest.importorskip("deep_gemm.mega")
    for name in dga.LEGACY_ENV_VARS:
        monkeypatch.setenv(name, "1")
        with pytest.raises(RuntimeError, match="no longer supported"):
            mega._check_legacy_fp4_acts_env()
        monkeypatch.delenv(name)
    mega._check_legacy_fp4_acts_env()


def test_legacy_source_tree(tmp_path: pathlib.Path) -> None:
    pkg = _write_package(tmp_path, LEGACY_INIT, LEGACY_MEGA, "0.1.9")
    api = dga.api_from_source_dir(pkg, environ={})
    assert api.flavour == "legacy_env" and api.version == "0.1.9"
    assert api.functions == frozenset({"get_symm_buffer_for_mega_moe", "fp8_fp4_mega_moe"})
    assert not api.refuses_legacy_env and api.legacy_env == ()
    api = dga.api_from_source_dir(pkg, environ={"DG_USE_FP4_ACTS": "1", "DG_USE_MXF4_KIND": "0"})
    assert api.legacy_env == ("DG_USE_FP4_ACTS",)


def test_legacy_module_introspection(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _write_package(tmp_path, LEGACY_INIT.replace("from . import _C\n", ""), LEGACY_MEGA.replace("from .. import _C\n", ""), "0.1.9")
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = {m: mod for m, mod in sys.modules.items() if m == "deep_gemm" or m.startswith("deep_gemm.")}
    for name in saved:
        del sys.modules[name]
    try:
        import deep_gemm as legacy  # the fake tree, not the installed package

        assert pathlib.Path(legacy.__file__).parent == pkg
        api = dga.api_of_module(legacy, environ={})
        assert api.flavour == "legacy_env" and not api.refuses_legacy_env
    finally:
        for name in [m for m in sys.modules if m == "deep_gemm" or m.startswith("deep_gemm.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_no_mega_and_absent(tmp_path: pathlib.Path) -> None:
    pkg = _write_package(tmp_path, "def fp8_gemm_nt(a, b, d):\n    pass\n", "", "0.0.1")
    assert dga.api_from_source_dir(pkg, environ={}).flavour == "no_mega"
    assert not dga.DeepGemmApi("absent").present
    assert dga.DeepGemmApi("absent").describe() == "sgl-deep-gemm not installed"


def test_legacy_env_parsing() -> None:
    assert dga.legacy_env_set({}) == ()
    assert dga.legacy_env_set({"DG_USE_FP4_ACTS": "0", "DG_USE_MXF4_KIND": ""}) == ()
    assert dga.legacy_env_set({"DG_USE_FP4_ACTS": "1", "DG_USE_MXF4_KIND": "yes"}) == dga.LEGACY_ENV_VARS


def test_legacy_sglang_flags_are_reported_not_forwarded() -> None:
    env = {"SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS": "1", "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_MXF4_KIND": "false"}
    before = dict(env)
    assert dga.legacy_sglang_fp4_flags(env) == {"SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS": True}
    assert env == before
    assert dga.legacy_sglang_fp4_flags({}) == {}


def test_importing_the_mega_modules_has_no_side_effects() -> None:
    """No deep_gemm / triton / sglang import, no CUDA init, no environment change at import time."""
    code = textwrap.dedent(
        """
        import json, os, sys
        before = dict(os.environ)
        import sglang_moe_plugins.deep_gemm_api, sglang_moe_plugins.ops.mega_moe
        import sglang_moe_plugins.ops.mega_moe_numerics, sglang_moe_plugins.plugins.mega_reference
        import sglang_moe_plugins.plugins.mega_deep_gemm, sglang_moe_plugins.plugins._mega_pre_dispatch_triton
        import sglang_moe_plugins.integrations.mega_adapter
        import torch
        print(json.dumps({
            "modules": sorted(m for m in ("deep_gemm", "triton", "sglang") if m in sys.modules),
            "env_changed": dict(os.environ) != before,
            "cuda_initialized": torch.cuda.is_initialized(),
        }))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"modules": [], "env_changed": False, "cuda_initialized": False}
