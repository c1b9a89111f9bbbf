"""Shared fixtures: small test plugins (real plugin classes, not mocks of SGLang) and registries."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from sglang_moe_plugins import Plugin, Registry, Selector, Support, UserConfig
from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import ReferencePlugin, silu_mul_quant_reference

sys.path.insert(0, os.path.dirname(__file__))


class RecordingPlugin(Plugin):
    """A plugin for tests: supports what ``accept`` says, counts calls, runs the reference."""

    op = smq.OP

    def __init__(self, name: str, priority: int, accept=lambda shape, config: True, fail: Exception | None = None):
        self.name = name  # type: ignore[misc]
        self.priority = priority  # type: ignore[misc]
        self._accept = accept
        self._fail = fail
        self.supports_calls = 0
        self.run_calls = 0

    def supports(self, shape, config):
        self.supports_calls += 1
        ok = self._accept(shape, config)
        return Support.yes(f"{self.name} accepts") if ok else Support.no(f"{self.name} rejects E={shape.num_experts}")

    def run(self, inputs, outputs, shape, config):
        self.run_calls += 1
        if self._fail is not None:
            raise self._fail
        silu_mul_quant_reference(inputs, outputs, shape, config)


@pytest.fixture
def make_selector():
    def build(*plugins, config: UserConfig | None = None) -> Selector:
        return Selector(Registry.from_plugins(plugins, config or UserConfig()))

    return build


def random_call(
    e=4, n=8, d=256, group=128, topk=2, *, limit=None, swizzle=False, layout="column_major", seed=0, device="cpu"
):
    """Fresh random inputs spanning many binades, ragged masked_m with an empty expert."""
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-8, 6, (e, n, 1), generator=gen).float())
    gateup = (torch.randn(e, n, 2 * d, generator=gen) * mag).to(torch.bfloat16).to(device)
    masked = torch.randint(0, n + 1, (e,), generator=gen, dtype=torch.int32)
    if e > 1:
        masked[1] = 0
        masked[0] = n
    masked = masked.to(device)
    shape, config = smq.describe(
        gateup, masked, group_size=group, topk=topk, swiglu_limit=limit, swizzle=swizzle, scale_layout=layout
    )
    return smq.SiluMulQuantInputs(gateup, masked), shape, config


@pytest.fixture
def reference_plugin():
    return ReferencePlugin()
