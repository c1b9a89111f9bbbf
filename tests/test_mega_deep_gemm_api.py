"""Detection of the sgl-deep-gemm MegaMoE API: the installed package and the documented older API."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from sglang_moe_plugins.plugins.deep_gemm import api as dga

REPO = pathlib.Path(__file__).resolve().parents[1]


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
    assert api.flavour == "mma_type" and api.refuses_legacy_env and api.shared_experts
    assert {
        "get_symm_buffer_for_mega_moe",
        "fp8_fp4_mega_moe",
        "fp8_mega_moe",
        "mega_moe_pre_dispatch",
        "mega_moe_pre_dispatch_sm90",
        "get_block_m_for_mega_moe",
    } <= api.functions
    from importlib import metadata

    assert api.version == metadata.version("sgl-deep-gemm")


def test_static_detection_agrees_with_the_imported_module() -> None:
    """ast on the sources and inspect.signature on the imported module read the same API."""
    deep_gemm = pytest.importorskip("deep_gemm")
    static = dga.detect_deep_gemm_api(refresh=True)
    live = dga.api_of_module(deep_gemm)
    assert (live.flavour, live.signatures, live.refuses_legacy_env, live.version) == (
        static.flavour,
        static.signatures,
        static.refuses_legacy_env,
        static.version,
    )


def test_capabilities_follow_the_signatures() -> None:
    from _mega_cases import API_LEGACY, API_MMA_TYPE

    assert API_MMA_TYPE.takes("get_symm_buffer_for_mega_moe", "num_shared_experts")
    assert not API_LEGACY.takes("get_symm_buffer_for_mega_moe", "num_shared_experts")
    assert API_LEGACY.takes("get_symm_buffer_for_mega_moe", "mma_type")  # takes it, but 'fp8xfp4' only
    assert API_LEGACY.mma_types == ("fp8xfp4",) and "mxf4xmxf4" in API_MMA_TYPE.mma_types
    assert API_MMA_TYPE.shared_experts and not API_LEGACY.shared_experts
    assert API_LEGACY.params("get_block_m_for_mega_moe") == () and not API_LEGACY.has("get_block_m_for_mega_moe")
    assert dga.DeepGemmApi("absent").mma_types == ()


def test_installed_package_refuses_the_legacy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why we never forward SGLANG_OPT_..._USE_FP4_ACTS into DG_USE_FP4_ACTS: 0.2.x raises on it."""
    mega = pytest.importorskip("deep_gemm.mega")
    for name in dga.LEGACY_ENV_VARS:
        monkeypatch.setenv(name, "1")
        with pytest.raises(RuntimeError, match="no longer supported"):
            mega._check_legacy_fp4_acts_env()
        monkeypatch.delenv(name)
    mega._check_legacy_fp4_acts_env()


def test_no_mega_and_absent(tmp_path: pathlib.Path) -> None:
    pkg = _write_package(tmp_path, "def fp8_gemm_nt(a, b, d):\n    pass\n", "", "0.0.1")
    assert dga.api_from_source_dir(pkg, environ={}).flavour == "no_mega"
    assert not dga.DeepGemmApi("absent").present
    assert dga.DeepGemmApi("absent").describe() == "sgl-deep-gemm not installed"


def test_legacy_env_parsing() -> None:
    assert dga.legacy_env_set({}) == ()
    assert dga.legacy_env_set({"DG_USE_FP4_ACTS": "0", "DG_USE_MXF4_KIND": ""}) == ()
    assert dga.legacy_env_set({"DG_USE_FP4_ACTS": "1", "DG_USE_MXF4_KIND": "yes"}) == dga.LEGACY_ENV_VARS


def test_importing_the_mega_modules_has_no_side_effects() -> None:
    """No deep_gemm / triton / sglang import, no CUDA init, no environment change at import time."""
    code = textwrap.dedent(
        """
        import json, os, sys
        before = dict(os.environ)
        import sglang_moe_plugins.ops.mega_moe
        import sglang_moe_plugins.ops.mega_moe_numerics, sglang_moe_plugins.plugins.reference.mega_moe
        import sglang_moe_plugins.ops.mega_moe.formats, sglang_moe_plugins.ops.mega_moe.reference
        import sglang_moe_plugins.ops.mega_moe.sm90, sglang_moe_plugins.ops.mega_moe.activation
        import sglang_moe_plugins.plugins.deep_gemm.api, sglang_moe_plugins.plugins.deep_gemm.plugin
        import sglang_moe_plugins.plugins.deep_gemm.launch, sglang_moe_plugins.plugins.deep_gemm.sglang_host
        import sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_triton, sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_kernel
        import sglang_moe_plugins.integrations.sglang.mega_moe
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
