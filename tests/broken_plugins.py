"""Deliberately broken copies of the example plugin: the conformance suite must fail each, naming why.

Checked by path (``sglang-moe-plugins check tests/broken_plugins.py:Class``) in test_example_plugin.py
and test_conformance.py. Never registered as entry points.
"""

from __future__ import annotations

import dataclasses
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
            inputs.gateup[..., shape.hidden :].clamp_(-config.swiglu_limit, config.swiglu_limit)
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
from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin  # noqa: E402


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


# -- stateful, nondeterministic, tile-size and naming bugs (each must be caught, named) ---------------

import torch.distributed as dist  # noqa: E402

from sglang_moe_plugins.ops import mega_moe as mm  # noqa: E402
from sglang_moe_plugins.ops.mega_moe.reference import mega_moe_reference  # noqa: E402


class FirstTilePlugin(ExampleTorchPlugin):
    """A tiled kernel launched with one 64-row tile per expert: rows past 64 are never written."""

    name = "broken_first_tile"

    prepare = None

    def run(self, inputs, outputs, shape, config):
        scratch = SiluMulQuantOutputs(torch.empty_like(outputs.out), torch.empty_like(outputs.scale))
        super().run(inputs, scratch, shape, config)
        outputs.out[:, :64].copy_(scratch.out[:, :64])
        outputs.scale[:, :64].copy_(scratch.scale[:, :64])


class PrepareReplaysPlugin(ExampleTorchPlugin):
    """prepare()'s launch computes on its first call and replays those outputs on every later call."""

    name = "broken_prepare_replays"

    def prepare(self, shape, config):
        saved = []

        def launch(inputs, outputs):
            if not saved:
                self.run(inputs, outputs, shape, config)
                saved.append((outputs.out.clone(), outputs.scale.clone()))
            else:
                outputs.out.copy_(saved[0][0])
                outputs.scale.copy_(saved[0][1])

        return launch


class PrepareKeepsInputsPlugin(ExampleTorchPlugin):
    """prepare()'s launch binds the first call's input tensors (as a captured graph would) and reads them again."""

    name = "broken_prepare_keeps_inputs"

    def prepare(self, shape, config):
        bound = []

        def launch(inputs, outputs):
            if not bound:
                bound.append(inputs)
            self.run(bound[0], outputs, shape, config)

        return launch


class RunCachesPerKeyPlugin(ExampleTorchPlugin):
    """run() memoises its outputs per shape key: the next call of the key gets the first call's results."""

    name = "broken_run_caches"

    prepare = None

    def __init__(self):
        self.cache = {}

    def run(self, inputs, outputs, shape, config):
        key = (shape, config)
        if key not in self.cache:
            super().run(inputs, outputs, shape, config)
            self.cache[key] = outputs  # returned again for every later call of the key
        return self.cache[key]


class NondeterministicPlugin(ExampleTorchPlugin):
    """Correct within the tolerance, but fp32 scales vary by one ulp from call to call (a racy reduction)."""

    name = "broken_nondeterministic"

    prepare = None

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        if not config.scale_ue8m0 and outputs.scale.numel():
            jitter = torch.randint(0, 2, outputs.scale.shape, device=outputs.scale.device).float() * 2.0**-23
            outputs.scale.mul_(1.0 + jitter)


class DeclaredNondeterministicPlugin(NondeterministicPlugin):
    """The same plugin, declaring it: legal (the kit compares within the tolerance)."""

    name = "declared_nondeterministic"
    deterministic = False


class ReadsPastMaskedMPlugin(ExampleTorchPlugin):
    """Rows 2k and 2k+1 share one scale per group (a 2-row tile): a real row next to a padding row reads it."""

    name = "broken_reads_past_masked_m"

    prepare = None

    def run(self, inputs, outputs, shape, config):
        n = shape.max_rows
        if shape.num_experts == 0 or n == 0:
            return
        gateup = inputs.gateup.clone()
        for start in range(0, n - 1, 2):  # add 0 * |partner row| to each value of the pair: NaN partners leak
            pair = gateup[:, start : start + 2].float()
            leak = pair.abs().amax(dim=1, keepdim=True) * 0.0
            gateup[:, start : start + 2] = (pair + leak).to(torch.bfloat16)
        super().run(dataclasses.replace(inputs, gateup=gateup), outputs, shape, config)


class BuiltinNamedReferencePlugin(ExampleTorchPlugin):
    """A correct plugin that took a built-in plugin's name: registered, it would replace the built-in."""

    name = "reference"


class BuiltinNamedTritonPlugin(ExampleTorchPlugin):
    name = "triton"


class MegaFirstTilePlugin(_MegaW4A8Only):
    """Writes only the first 64 token rows of y (one row tile)."""

    name = "broken_mega_first_tile"

    def run(self, inputs, outputs, shape, config):
        scratch = MegaMoEOutputs(torch.empty_like(outputs.y))
        super().run(inputs, scratch, shape, config)
        outputs.y[:64].copy_(scratch.y[:64])


class MegaDecodesOncePerKeyPlugin(_MegaW4A8Only):
    """Decodes the experts' weights on the first call of a shape key and keeps them: every layer of a model
    shares one key, so the second layer computes with the first layer's weights."""

    name = "broken_mega_decodes_once"

    def __init__(self):
        self.weights = {}

    def run(self, inputs, outputs, shape, config):
        key = (shape, config)
        if key not in self.weights:
            self.weights[key] = (
                inputs.l1_weights,
                inputs.l2_weights,
                inputs.shared_l1_weights,
                inputs.shared_l2_weights,
            )
        l1, l2, s1, s2 = self.weights[key]
        mega_moe_reference(
            mm.MegaMoEInputs(inputs.hidden_states, inputs.topk_ids, inputs.topk_weights, l1, l2, s1, s2),
            outputs,
            shape,
            config,
        )


class MegaClaimsEpPlugin(_MegaW4A8Only):
    """Says yes to ep_size > 1 but computes with this rank's experts only (what it holds): other ranks'
    experts never contribute."""

    name = "broken_mega_claims_ep"

    def supports(self, shape, config):
        if config.variant != "fp8xfp4":
            return Support.no(f"W4A8 only; variant {config.variant} is another kernel's")
        return Support.yes("any ep_size")

    def run(self, inputs, outputs, shape, config):
        local = shape.num_local_experts
        rank = dist.get_rank(inputs.ep_group) if inputs.ep_group is not None else 0
        ids = inputs.topk_ids
        if ids is not None and shape.ep_size > 1:
            ids = torch.where(
                (ids >= rank * local) & (ids < (rank + 1) * local), ids - rank * local, torch.full_like(ids, -1)
            )
        single = mm.MegaMoEShape(
            local, shape.hidden, shape.intermediate, shape.top_k, shape.num_shared_experts, 1, shape.max_tokens_per_rank
        )
        mega_moe_reference(
            mm.MegaMoEInputs(
                inputs.hidden_states,
                ids,
                inputs.topk_weights,
                inputs.l1_weights,
                inputs.l2_weights,
                inputs.shared_l1_weights,
                inputs.shared_l2_weights,
            ),
            outputs,
            single,
            config,
        )


class MegaAllGatherEpPlugin(MegaClaimsEpPlugin):
    """Legal control under EP: gathers every rank's experts' weights over ep_group, then computes its own tokens."""

    name = "mega_allgather_ep"

    def run(self, inputs, outputs, shape, config):
        if shape.ep_size == 1:
            return mega_moe_reference(inputs, outputs, shape, config)
        group = inputs.ep_group

        def gather(t):
            parts = [torch.empty_like(t.contiguous()) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, t.contiguous(), group=group)
            return torch.cat(parts)

        l1 = tuple(gather(t) for t in inputs.l1_weights)
        l2 = tuple(gather(t) for t in inputs.l2_weights)
        whole = mm.MegaMoEShape(
            shape.num_experts,
            shape.hidden,
            shape.intermediate,
            shape.top_k,
            shape.num_shared_experts,
            1,
            shape.max_tokens_per_rank,
        )
        mega_moe_reference(
            mm.MegaMoEInputs(inputs.hidden_states, inputs.topk_ids, inputs.topk_weights, l1, l2), outputs, whole, config
        )
