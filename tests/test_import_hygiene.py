"""Importing the package (and every built-in plugin module) does nothing: no env change, no CUDA, no sglang."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_import_has_no_side_effects():
    code = textwrap.dedent(
        """
        import os, sys
        before = dict(os.environ)
        import torch
        import sglang_moe_plugins, sglang_moe_plugins.cli, sglang_moe_plugins.integrations.sglang
        import sglang_moe_plugins.cli.list, sglang_moe_plugins.cli.explain, sglang_moe_plugins.cli.doctor
        import sglang_moe_plugins.cli.check, sglang_moe_plugins.cli.bench
        import sglang_moe_plugins.plugins.reference, sglang_moe_plugins.plugins.reference.silu_mul_quant
        import sglang_moe_plugins.plugins.reference.mega_moe, sglang_moe_plugins.plugins.triton_smq.plugin
        import sglang_moe_plugins.plugins.triton_smq.tuning, sglang_moe_plugins.plugins.triton_common
        import sglang_moe_plugins.plugins.sglang_kernels.jit_ep, sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback
        import sglang_moe_plugins.plugins.sglang_kernels.host
        import importlib
        for name in ("triton", "mega_reference", "mega_deep_gemm", "jit_ep", "fp8_fallback"):
            try:
                importlib.import_module("sglang_moe_plugins.plugins." + name)
            except ModuleNotFoundError as exc:
                if "sglang_moe_plugins" not in str(exc):
                    raise
        assert dict(os.environ) == before, "environment changed"
        assert not torch.cuda.is_initialized(), "CUDA initialised"
        heavy = [m for m in ("sglang", "deep_gemm", "triton") if m in sys.modules]
        assert not heavy, f"imported at import time: {heavy}"
        assert sglang_moe_plugins.api._selector is None, "plugins discovered at import time"
        print("CLEAN")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "CLEAN" in result.stdout, result.stderr[-3000:]


def test_public_api_is_curated():
    import sglang_moe_plugins

    assert sorted(sglang_moe_plugins.__all__) == sorted(set(sglang_moe_plugins.__all__))
    for name in sglang_moe_plugins.__all__:
        assert hasattr(sglang_moe_plugins, name), name


def test_core_modules_log_through_the_rank_filter():
    import importlib

    from sglang_moe_plugins.log import RANK_FILTER

    for name in ("registry", "dispatcher"):
        module = importlib.import_module(f"sglang_moe_plugins.core.{name}")
        assert module.logger.name == f"sglang_moe_plugins.core.{name}"
        assert RANK_FILTER in module.logger.filters, name
