"""Plugins for the failure-policy and binding tests (test_failure_policy.py, test_binding.py), loaded
through real ``importlib.metadata`` entry points (``tests/`` is on ``sys.path``, see conftest.py)."""

from __future__ import annotations

from sglang_moe_plugins import Plugin, Support
from sglang_moe_plugins.ops.silu_mul_quant import OP as SMQ
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference


class SmqRaises(Plugin):
    """Ranked first; every run raises (a kernel that fails on this machine)."""

    name = "policy_smq_raises"
    op = SMQ
    priority = 1000

    def supports(self, shape, config):
        return Support.yes("accepts every call")

    def run(self, inputs, outputs, shape, config):
        raise RuntimeError("silu_mul_quant kernel failed on this rank")


class MegaRaises(Plugin):
    """A mega_moe plugin ranked first whose run raises on this rank (a collective kernel's failure)."""

    name = "policy_mega_raises"
    op = "mega_moe"
    priority = 1000

    def supports(self, shape, config):
        return Support.yes("accepts every call")

    def run(self, inputs, outputs, shape, config):
        raise RuntimeError("mega kernel failed on this rank")


class PreparedReference(Plugin):
    """The reference numerics through ``prepare``: counts how often it prepares and launches."""

    name = "policy_prepared"
    op = SMQ
    priority = 900

    def __init__(self) -> None:
        self.prepares = 0
        self.launches = 0
        self.runs = 0

    def supports(self, shape, config):
        return Support.yes("accepts every call")

    def prepare(self, shape, config):
        self.prepares += 1

        def launch(inputs, outputs):
            self.launches += 1
            silu_mul_quant_reference(inputs, outputs, shape, config)

        return launch

    def run(self, inputs, outputs, shape, config):
        self.runs += 1
        silu_mul_quant_reference(inputs, outputs, shape, config)


class MegaSupportsRaises(MegaRaises):
    """A mega_moe plugin ranked first whose ``supports`` raises (e.g. a probe that fails on one rank only)."""

    name = "policy_mega_supports_raises"

    def supports(self, shape, config):
        raise RuntimeError("probe failed on this rank")
