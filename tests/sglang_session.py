"""One real SGLang per test process: ``load_plugins()`` run once, as SGLang itself does."""

from __future__ import annotations

import functools
import os
from importlib.metadata import EntryPoint

import pytest

SMQ_TARGET = "sglang.srt.layers.moe.moe_runner.deep_gemm._varlen_deep_gemm_silu_mul_quant"
MEGA_TARGET = "sglang.srt.layers.moe.mega_moe.run_mega_routed_experts"


def ep(name: str, value: str) -> EntryPoint:
    """A kernel-plugin entry point (group ``sglang_moe_plugins.kernels``), as ``api.reload(entry_points=...)`` takes."""
    from sglang_moe_plugins.core.registry import ENTRY_POINT_GROUP

    return EntryPoint(name, value, ENTRY_POINT_GROUP)


#: The built-ins the policy tests register by hand (their pyproject entry points).
REFERENCE = ep("reference", "sglang_moe_plugins.plugins.reference.silu_mul_quant:ReferencePlugin")
TRITON = ep("triton", "sglang_moe_plugins.plugins.triton_smq.plugin:TritonPlugin")
MEGA_REFERENCE = ep("mega_reference", "sglang_moe_plugins.plugins.reference.mega_moe:MegaReferencePlugin")


@functools.lru_cache(maxsize=1)
def loaded_sglang():
    """Import SGLang's MoE runner and run its real ``load_plugins()``; returns the runner module."""
    os.environ.pop("SGLANG_PLUGINS", None)
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return runner


def hooked_targets() -> set[str]:
    """The host functions the version table hooks on the installed SGLang release (0.5.19: no MegaMoE)."""
    from sglang_moe_plugins.integrations.sglang.versions import version_case

    return {t.path for t in version_case().targets}


def installed_parameters(path: str) -> tuple[str, ...]:
    """The table's parameter list of a target on the installed release (empty when not hooked)."""
    from sglang_moe_plugins.integrations.sglang.versions import version_case

    return next((t.parameters for t in version_case().targets if t.path == path), ())


def require_mega_target() -> None:
    """Skip the calling test on a release without ``run_mega_routed_experts`` (0.5.16-0.5.20)."""
    import pytest

    if MEGA_TARGET not in hooked_targets():
        pytest.skip("this SGLang release has no run_mega_routed_experts (MegaMoE arrived in 0.5.21)")


@pytest.fixture(scope="module")
def runner():
    """SGLang's MoE runner after its real ``load_plugins()`` (import into a test module to use it)."""
    return loaded_sglang()


@pytest.fixture(autouse=True)
def default_selector():
    """After each test of a module that imports it: the process selector back to the default configuration."""
    yield
    from sglang_moe_plugins import UserConfig, api

    api.reload(UserConfig())
