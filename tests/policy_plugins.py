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
    #: It never writes its inputs: a failure may fall back to the next plugin on the same call.
    writes_inputs = ()

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


# -- issue 18 (no silent corruption on fault paths): tests/test_fault_paths.py -----------------------
class SmqClobbersThenRaises(Plugin):
    """Ranked first; writes into ``gateup`` (which the hook marks writable), then raises. Declares
    nothing about its writes: the conservative default (it may write every writable input)."""

    name = "policy_smq_clobbers"
    op = SMQ
    priority = 1000

    def supports(self, shape, config):
        return Support.yes("accepts every call")

    def run(self, inputs, outputs, shape, config):
        inputs.gateup.mul_(-4)  # a half-finished in-place step (e.g. a clamp) of a kernel that then fails
        raise RuntimeError("silu_mul_quant kernel failed after writing its workspace")


class SmqDeclaresClampThenRaises(SmqClobbersThenRaises):
    """Like fp8_fallback: declares it writes ``gateup`` only on calls with a swiglu_limit; raises always
    (and writes only when it declares it may)."""

    name = "policy_smq_clamps"

    def writes_inputs(self, shape, config):
        return ("gateup",) if config.swiglu_limit is not None else ()

    def run(self, inputs, outputs, shape, config):
        if config.swiglu_limit is not None:
            inputs.gateup.clamp_(max=0.5)
        raise RuntimeError("silu_mul_quant kernel failed")


class SmqReturnsTupleLater(Plugin):
    """Right on its first call (fills the outputs, returns None); from the second call on it returns
    the ``(out, scale)`` tuple instead of SiluMulQuantOutputs. Reads its inputs only."""

    name = "policy_smq_tuple"
    op = SMQ
    priority = 1000
    writes_inputs = ()

    def __init__(self) -> None:
        self.calls = 0

    def supports(self, shape, config):
        return Support.yes("accepts every call")

    def run(self, inputs, outputs, shape, config):
        self.calls += 1
        silu_mul_quant_reference(inputs, outputs, shape, config)
        return None if self.calls == 1 else (outputs.out, outputs.scale)


class MegaReturnsTuple(MegaRaises):
    """A mega_moe plugin ranked first that returns a tuple ``(y,)`` instead of MegaMoEOutputs."""

    name = "policy_mega_tuple"

    def run(self, inputs, outputs, shape, config):
        outputs.y.zero_()
        return (outputs.y,)


class MegaShortRows(MegaRaises):
    """A mega_moe plugin ranked first that returns a ``y`` of one row, whatever the token count; with
    ``first_ok``, the first call returns None (its outputs, of the right size) instead."""

    name = "policy_mega_short"
    first_ok = False

    def __init__(self) -> None:
        self.calls = 0

    def run(self, inputs, outputs, shape, config):
        import torch

        from sglang_moe_plugins.ops.mega_moe import MegaMoEOutputs

        self.calls += 1
        outputs.y.zero_()
        if self.first_ok and self.calls == 1:
            return None
        return MegaMoEOutputs(torch.zeros((1, shape.hidden), dtype=torch.bfloat16, device=inputs.device))


class MegaShortRowsLater(MegaShortRows):
    name = "policy_mega_short_later"
    first_ok = True


class OptionsChecked(Plugin):
    """Options with a value check (``check_options`` raising OptionValueError)."""

    name = "policy_options"
    op = SMQ
    priority = 1
    options = {"block": 64, "mode": "fast"}

    def supports(self, shape, config):
        return Support.yes("accepts every call")

    def check_options(self, options):
        from sglang_moe_plugins import OptionValueError

        if options["block"] < 1 or options["block"] & (options["block"] - 1):
            raise OptionValueError("block", options["block"], "a power of two >= 1")
        if options["mode"] not in ("fast", "exact"):
            raise OptionValueError("mode", options["mode"], "'fast' or 'exact'")

    def run(self, inputs, outputs, shape, config):
        silu_mul_quant_reference(inputs, outputs, shape, config)
