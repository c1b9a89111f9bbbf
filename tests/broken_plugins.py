"""Deliberately broken copies of the example plugin: the conformance suite must fail each, naming why.

Checked by path (``sglang-moe-plugins check tests/broken_plugins.py:Class``) in test_example_plugin.py
and test_conformance.py. Never registered as entry points.
"""

from __future__ import annotations

import time

import torch
from sglang_moe_example_plugin import ExampleTorchPlugin

from sglang_moe_plugins import Support
from sglang_moe_plugins.ops.silu_mul_quant import SiluMulQuantOutputs


class WrongScaleLayoutPlugin(ExampleTorchPlugin):
    """Returns its own contiguous (row-major) scale tensor whatever layout the host asked for."""

    name = "broken_scale_layout"

    prepare = None  # the example's prepare() would bypass the broken run() below

    def run(self, inputs, outputs, shape, config):
        scale = torch.empty(outputs.scale.shape, dtype=outputs.scale.dtype, device=outputs.scale.device)
        super().run(inputs, SiluMulQuantOutputs(outputs.out, scale), shape, config)
        return SiluMulQuantOutputs(outputs.out, scale)


class UnwrittenRowPlugin(ExampleTorchPlugin):
    """Off by one: never writes the last row of an expert (missed whenever an expert is full)."""

    name = "broken_unwritten_row"

    prepare = None  # the example's prepare() would bypass the broken run() below

    def run(self, inputs, outputs, shape, config):
        if shape.num_experts == 0 or shape.max_rows == 0:
            return
        scratch = SiluMulQuantOutputs(torch.empty_like(outputs.out), torch.empty_like(outputs.scale))
        super().run(inputs, scratch, shape, config)
        last = shape.max_rows - 1
        outputs.out[:, :last].copy_(scratch.out[:, :last])
        outputs.scale[:, :last].copy_(scratch.scale[:, :last])


class AcceptsThenCrashesPlugin(ExampleTorchPlugin):
    """supports() accepts every group-128 call, but run() tiles rows by 4 and crashes when N % 4 != 0."""

    name = "broken_accepts_then_crashes"

    prepare = None  # the example's prepare() would bypass the broken run() below

    def run(self, inputs, outputs, shape, config):
        e, n = shape.num_experts, shape.max_rows
        inputs.gateup.view(e, n // 4, 4, 2 * shape.hidden)  # RuntimeError unless N % 4 == 0
        super().run(inputs, outputs, shape, config)


class RaisingSupportsPlugin(ExampleTorchPlugin):
    """Raises in supports() for a shape it cannot take, instead of returning Support.no(reason)."""

    name = "broken_raising_supports"

    def supports(self, shape, config):
        if shape.num_experts > 64:
            raise ValueError(f"too many experts: {shape.num_experts}")
        return super().supports(shape, config)


class FlakySupportsPlugin(ExampleTorchPlugin):
    """supports() depends on how often it was asked: different ranks would pick different plugins."""

    name = "broken_flaky_supports"

    def __init__(self):
        self.calls = 0

    def supports(self, shape, config):
        self.calls += 1
        if self.calls % 2 == 0:
            return Support.no("busy")
        return super().supports(shape, config)


class SlowSupportsPlugin(ExampleTorchPlugin):
    """supports() does expensive work (here: sleeps 2 ms) on every call."""

    name = "broken_slow_supports"

    def supports(self, shape, config):
        time.sleep(0.002)
        return super().supports(shape, config)


class ModifiesInputPlugin(ExampleTorchPlugin):
    """Clamps up in place (numerically harmless) although the caller did not mark gateup writable."""

    name = "broken_modifies_input"

    prepare = None  # the example's prepare() would bypass the broken run() below

    def run(self, inputs, outputs, shape, config):
        if config.swiglu_limit is not None:
            inputs.gateup[..., shape.hidden:].clamp_(-config.swiglu_limit, config.swiglu_limit)
        super().run(inputs, outputs, shape, config)


class WrongNumericsPlugin(ExampleTorchPlugin):
    """Divides by 440 instead of 448: every fp32 scale is 1.8% too large."""

    name = "broken_numerics"

    prepare = None  # the example's prepare() would bypass the broken run() below

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        if not config.scale_ue8m0:
            outputs.scale.mul_(448.0 / 440.0)


class OldContractPlugin(ExampleTorchPlugin):
    """Written for a plugin contract version this sglang-moe-plugins does not implement."""

    name = "broken_old_contract"
    contract_version = 0


# -- broken mega_moe plugins (the suite's mega_moe adapter must name each failure) -------------------

from sglang_moe_plugins.ops.mega_moe import MegaMoEOutputs  # noqa: E402
from sglang_moe_plugins.plugins.mega_reference import MegaReferencePlugin  # noqa: E402


class _MegaW4A8Only(MegaReferencePlugin):
    """The reference, narrowed to fp8xfp4 (as a real W4A8 kernel is): keeps the suite runs short."""

    def supports(self, shape, config):
        if config.variant != "fp8xfp4":
            return Support.no(f"W4A8 only; variant {config.variant} is another kernel's")
        return super().supports(shape, config)


class MegaUnwrittenRowPlugin(_MegaW4A8Only):
    """Off by one: never writes the last token's row of y."""

    name = "broken_mega_unwritten_row"

    def run(self, inputs, outputs, shape, config):
        scratch = MegaMoEOutputs(torch.empty_like(outputs.y))
        super().run(inputs, scratch, shape, config)
        last = inputs.num_tokens - 1
        if last > 0:
            outputs.y[:last].copy_(scratch.y[:last])


class MegaWrongDtypePlugin(_MegaW4A8Only):
    """Returns y in fp32 (its accumulator) instead of the bf16 the host requires."""

    name = "broken_mega_wrong_dtype"

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        return MegaMoEOutputs(outputs.y.float())


class MegaWrongNumericsPlugin(_MegaW4A8Only):
    """Ignores routed_scaling_factor and the clamp's effect: scales every row by 1.1."""

    name = "broken_mega_numerics"

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        outputs.y.mul_(1.1)


class MegaCrashesOnZeroTokensPlugin(_MegaW4A8Only):
    """supports() accepts every call, but run() indexes token 0 and crashes on an empty batch."""

    name = "broken_mega_zero_tokens"

    def run(self, inputs, outputs, shape, config):
        inputs.hidden_states[0]  # IndexError when T == 0
        super().run(inputs, outputs, shape, config)
