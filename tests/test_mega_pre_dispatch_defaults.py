"""``pre_dispatch="auto"`` is this project's Triton pre-dispatch only on the GPU architectures where it has a
recorded GPU run (sm90); elsewhere it is the host's own, and ``explain`` says which and why."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _mega_cases import API_MMA_TYPE, model_key

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.plugins.deep_gemm import plugin as mdg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SM90, SM100 = Platform.cuda(9, 0), Platform.cuda(10, 0)
MODEL = "Qwen/Qwen3-30B-A3B"


def test_triton_is_the_default_where_it_was_verified_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mdg, "triton_available", lambda: True)
    assert mdg.TRITON_PRE_DISPATCH_VERIFIED == frozenset({90})
    for cls in (mdg.MegaW4A8Plugin, mdg.MegaW4A4Plugin):
        plugin = cls(API_MMA_TYPE)
        assert plugin.pre_dispatch_choice(SM100) == "host"
        assert plugin.pre_dispatch_choice(Platform.cuda(10, 3)) == "host"
        assert (
            plugin.pre_dispatch_reason(SM100) == "host pre-dispatch (auto: triton pre-dispatch verified on sm90 only)"
        )
        plugin.options = {"pre_dispatch": "triton"}  # still available as an option
        assert plugin.pre_dispatch_choice(SM100) == "triton"
        assert plugin.pre_dispatch_reason(SM100).startswith("triton pre-dispatch (option pre_dispatch='triton'")
    sm90 = mdg.MegaSm90Fp8Plugin(API_MMA_TYPE)
    assert sm90.pre_dispatch_choice(SM90) == "triton"
    assert sm90.pre_dispatch_reason(SM90) == "triton pre-dispatch (auto: triton pre-dispatch verified on sm90)"
    monkeypatch.setattr(mdg, "triton_available", lambda: False)
    assert sm90.pre_dispatch_reason(SM90) == "host pre-dispatch (auto: triton is not importable)"


def test_the_chosen_reason_names_the_pre_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mdg, "triton_available", lambda: True)
    shape, config = model_key(MODEL, "fp8xfp4", SM100)
    support = mdg.MegaW4A8Plugin(API_MMA_TYPE).supports(shape, config)
    assert support and support.reason.endswith("host pre-dispatch (auto: triton pre-dispatch verified on sm90 only)")


def test_explain_shows_the_pre_dispatch_and_why() -> None:
    """``explain --platform sm100`` with sgl-deep-gemm 0.2.3.post2 installed (its real sources on the path:
    detection reads them, nothing is imported)."""
    from test_deep_gemm_releases import _sources

    package = _sources("0.2.3.post2")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(package.parent)]))
    env = {k: v for k, v in env.items() if not k.startswith("SGLANG_MOE_PLUGINS")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_moe_plugins.cli",
            "explain",
            "--platform",
            "sm100",
            "--model",
            MODEL,
            "--op",
            "mega_moe",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    chosen = [line for line in proc.stdout.splitlines() if "mega_w4a8" in line and "chosen" in line]
    assert chosen, proc.stdout
    assert "sgl-deep-gemm 0.2.3.post2" in chosen[0]
    assert chosen[0].rstrip().endswith("host pre-dispatch (auto: triton pre-dispatch verified on sm90 only)"), chosen[0]
