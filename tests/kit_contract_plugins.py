"""Copies of the example plugin that break a part of the contract the first call's checks do not see.
Each passed ``check`` before the kit checked it. Checked by path (``tests/kit_contract_plugins.py:Class``);
never registered as entry points.
"""

from __future__ import annotations

import time

import torch
from sglang_moe_example_plugin import ExampleTorchPlugin

_KEPT: list[object] = []


class HostSyncPlugin(ExampleTorchPlugin):
    """Reads masked_m on the host in run() (``masked_m.tolist()``) to skip empty experts."""

    name = "kit_host_sync"
    prepare = None

    def run(self, inputs, outputs, shape, config):
        if shape.num_experts and not any(inputs.masked_m.tolist()):
            return None
        return super().run(inputs, outputs, shape, config)


class LaunchDriftsPlugin(ExampleTorchPlugin):
    """Its prepared launch writes other bits from its second call on: fp32 scales one ulp up (a stale
    accumulator), well within the tolerance, so only a bit-for-bit comparison of repeated calls sees it."""

    name = "kit_launch_drifts"

    def prepare(self, shape, config):
        launch = super().prepare(shape, config)
        calls = [0]

        def drifting(inputs, outputs):
            launch(inputs, outputs)
            calls[0] += 1
            if calls[0] > 1 and outputs.scale.is_floating_point():
                outputs.scale.copy_(torch.nextafter(outputs.scale, torch.full_like(outputs.scale, float("inf"))))
            return None

        return drifting


class KeepsInputsPlugin(ExampleTorchPlugin):
    """Keeps a reference to every call's inputs (a debugging list never cleared)."""

    name = "kit_keeps_inputs"
    prepare = None

    def run(self, inputs, outputs, shape, config):
        _KEPT.append(inputs.gateup)
        return super().run(inputs, outputs, shape, config)


class NonzeroPadBytesPlugin(ExampleTorchPlugin):
    """Packed UE8M0 scales with 0x7F in the pad bytes of the last int32 word (the contract says 0)."""

    name = "kit_pad_bytes"
    prepare = None

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        groups = shape.num_groups
        if config.scale_ue8m0 and groups % 4 and shape.num_experts and shape.max_rows:
            pad = sum(0x7F << (8 * byte) for byte in range(groups % 4, 4))  # little-endian bytes of the word
            outputs.scale[..., -1] |= pad
        return None


class SlowRunPlugin(ExampleTorchPlugin):
    """Correct but slow: sleeps 20 ms per call (the speed report says so; no check fails)."""

    name = "kit_slow_run"
    prepare = None

    def run(self, inputs, outputs, shape, config):
        time.sleep(0.02)
        return super().run(inputs, outputs, shape, config)


class JitterInTheKernelPlugin(ExampleTorchPlugin):
    """fp32 scales vary by one ulp from call to call inside the kernel itself, so run() and prepare()'s
    launch both vary (a racy reduction), without declaring deterministic = False."""

    name = "kit_jitter_in_kernel"

    def _run_experts(self, gateup, outputs, start, stop, shape, config):
        super()._run_experts(gateup, outputs, start, stop, shape, config)
        scale = outputs.scale[start:stop]
        if not config.scale_ue8m0 and scale.numel():
            jitter = torch.randint(0, 2, scale.shape, device=scale.device).float() * 2.0**-23
            scale.mul_(1.0 + jitter)


class ZeroesMaskedMPlugin(ExampleTorchPlugin):
    """Clears masked_m after use (an in-place reset of the routing counts): an input it must not change."""

    name = "kit_zeroes_masked_m"
    prepare = None

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        inputs.masked_m.zero_()


class RarelyNondeterministicPlugin(ExampleTorchPlugin):
    """Writes fp32 scales one ulp up on the third call it sees with the same inputs (a rare race): only a
    run with more than two calls per case on identical inputs (``--repeats 3`` or more) sees it."""

    name = "kit_rarely_nondeterministic"
    prepare = None

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        seen = self.__dict__.setdefault("seen", {})
        key = (shape, config, int(inputs.gateup.view(torch.int16).to(torch.int64).sum()))
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 3 and outputs.scale.is_floating_point():
            outputs.scale.copy_(torch.nextafter(outputs.scale, torch.full_like(outputs.scale, float("inf"))))
