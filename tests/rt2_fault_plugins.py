"""Faulty third-party plugins for issue #30, findings 4, 5 and 6 (tests/test_redteam2_faults.py): faults inside
a plugin's run. Loaded through real entry points: ``EntryPoint`` objects in-process, and as an installed
distribution ``moe-rt2-fault-plugins`` in a subprocess that runs SGLang's ``load_plugins()``.

Self-contained (imports only sglang_moe_plugins and torch): the test copies this file into a temporary site
directory next to a ``.dist-info`` that declares the entry points (:data:`ENTRY_POINTS`).
"""

from __future__ import annotations

import torch

from sglang_moe_plugins import Plugin, Support
from sglang_moe_plugins.ops import mega_moe as mm, silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference
from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin


class _Smq(Plugin):
    """Ranked above the built-ins; the reference numerics unless a subclass says otherwise."""

    op = smq.OP
    priority = 1000
    description = "deliberately faulty plugin (tests, issue #30)"
    #: It says it never writes its inputs (each subclass shows what that claim is worth).
    writes_inputs: object = frozenset()

    def __init__(self) -> None:
        self.calls = 0

    def available(self, platform):
        return Support.yes("runs anywhere")

    def supports(self, shape, config):
        return Support.yes("accepts every call")

    def run(self, inputs, outputs, shape, config):
        self.calls += 1
        silu_mul_quant_reference(inputs, outputs, shape, config)


# -- finding 4: writes an input its declaration leaves out ----------------------------------------------
class LiesAboutWrites(_Smq):
    """Declares it writes nothing; writes ``gateup`` (a half-finished in-place step), then raises."""

    name = "rt2_fault_lies"

    def run(self, inputs, outputs, shape, config):
        inputs.gateup.mul_(-4)
        raise RuntimeError("rt2 kernel failed after scaling gateup in place")


class MisnamedWrites(LiesAboutWrites):
    """Declares ``gateup_output``, a name the op does not have; writes ``gateup``, then raises."""

    name = "rt2_fault_misnamed"
    writes_inputs = ("gateup_output",)


class MisnamedWritesPerCall(LiesAboutWrites):
    """The same misnamed declaration, returned per call by ``writes_inputs(shape, config)``."""

    name = "rt2_fault_misnamed_call"

    def writes_inputs(self, shape, config):  # type: ignore[override]
        return ("gateup_output",)


class WritesThenFailsLater(_Smq):
    """Declares it writes nothing. Every call computes its outputs, then uses ``gateup`` as scratch (the host
    allows it: the workspace is dead after the call, so the first call's result is right); from the second
    call on it raises after scribbling."""

    name = "rt2_fault_writes_later"

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        inputs.gateup.fill_(7.0)
        if self.calls > 1:
            raise RuntimeError("rt2 kernel failed after using gateup as scratch")


class FailsLater(_Smq):
    """Declares it writes nothing, and never does; right on its first call, raises from the second on."""

    name = "rt2_fault_fails_later"

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        if self.calls > 1:
            raise RuntimeError("rt2 kernel failed on a later call")


class WritesWhenAllowed(_Smq):
    """For the conformance kit: right results, and it uses ``gateup`` as scratch whenever the caller marks it
    writable, though it declares it writes nothing (the kit must fail it, naming ``gateup``)."""

    name = "rt2_fault_kit_writes"

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        if inputs.gateup_writable:
            inputs.gateup.fill_(7.0)


# -- finding 5: outputs on another device -----------------------------------------------------------------
def _meta(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")


class MetaOutputs(_Smq):
    """Returns outputs of the right type, shape, dtype and strides, on the meta device (every call)."""

    name = "rt2_fault_meta"

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        return smq.SiluMulQuantOutputs(_meta(outputs.out), _meta(outputs.scale))


class MetaOutputsLater(_Smq):
    """Right on its first call (fills the outputs); from the second call on returns meta outputs."""

    name = "rt2_fault_meta_later"

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        if self.calls > 1:
            return smq.SiluMulQuantOutputs(_meta(outputs.out), _meta(outputs.scale))
        return None


class ContigMetaOutputsLater(Plugin):
    """``silu_mul_quant_contig``: right on its first call (fills SGLang's buffers); from the second call on it
    returns outputs of its own on the meta device and leaves SGLang's buffers as they were."""

    name = "rt2_fault_contig_meta_later"
    op = "silu_mul_quant_contig"
    priority = 1000
    writes_inputs: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.calls = 0

    def supports(self, shape, config):
        return Support.yes("accepts every call")

    def run(self, inputs, outputs, shape, config):
        # Imported here: the module stays importable on releases of the package without this op.
        from sglang_moe_plugins.ops.silu_mul_quant_contig import ContigOutputs
        from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import silu_mul_quant_contig_reference

        self.calls += 1
        if self.calls > 1:
            return ContigOutputs(_meta(outputs.out), _meta(outputs.scale))
        silu_mul_quant_contig_reference(inputs, outputs, shape, config)
        return None


class ContigMetaOutputs(ContigMetaOutputsLater):
    """Meta outputs from the first call on."""

    name = "rt2_fault_contig_meta"

    def __init__(self) -> None:
        self.calls = 1


class MegaMetaOutputsLater(MegaReferencePlugin):
    """``mega_moe``: right on its first call; from the second call on returns ``y`` on the meta device."""

    name = "rt2_fault_mega_meta_later"
    priority = 1000

    def __init__(self) -> None:
        self.calls = 0

    def run(self, inputs, outputs, shape, config):
        self.calls += 1
        if self.calls > 1:
            return mm.MegaMoEOutputs(_meta(outputs.y))
        return super().run(inputs, outputs, shape, config)


class MegaMetaOutputs(MegaMetaOutputsLater):
    """Meta ``y`` from the first call on."""

    name = "rt2_fault_mega_meta"

    def __init__(self) -> None:
        self.calls = 1


# -- finding 6: SystemExit (and KeyboardInterrupt) from run() ---------------------------------------------
class SystemExitInRun(_Smq):
    """``run()`` calls ``sys.exit(3)`` (a kernel library's fatal-error path)."""

    name = "rt2_fault_sysexit"

    def run(self, inputs, outputs, shape, config):
        raise SystemExit(3)


class SystemExitInPrepare(_Smq):
    """``prepare()`` calls ``sys.exit(4)``."""

    name = "rt2_fault_sysexit_prepare"

    def prepare(self, shape, config):
        raise SystemExit(4)


class KeyboardInterruptInRun(_Smq):
    """``run()`` is interrupted (Ctrl-C while the kernel ran): the interrupt is the user's, not a plugin fault."""

    name = "rt2_fault_interrupt"

    def run(self, inputs, outputs, shape, config):
        raise KeyboardInterrupt


class MegaSystemExit(MegaReferencePlugin):
    """``mega_moe``: ``run()`` calls ``sys.exit(5)``."""

    name = "rt2_fault_mega_sysexit"
    priority = 1000

    def run(self, inputs, outputs, shape, config):
        raise SystemExit(5)


#: The entry points of the installed distribution ``moe-rt2-fault-plugins`` (name -> value).
ENTRY_POINTS = {
    "rt2_fault_lies": "rt2_fault_plugins:LiesAboutWrites",
    "rt2_fault_misnamed": "rt2_fault_plugins:MisnamedWrites",
    "rt2_fault_meta": "rt2_fault_plugins:MetaOutputs",
    "rt2_fault_meta_later": "rt2_fault_plugins:MetaOutputsLater",
    "rt2_fault_sysexit": "rt2_fault_plugins:SystemExitInRun",
}


class ContigOwnOutputs(ContigMetaOutputsLater):
    """``silu_mul_quant_contig``: right values, always in outputs of its own on the right device (SGLang's buffers are
    left as they were): the host must copy them into SGLang's buffers, which its down GEMM reads."""

    name = "rt2_fault_contig_own"

    def run(self, inputs, outputs, shape, config):
        import torch

        from sglang_moe_plugins.ops.silu_mul_quant_contig import ContigOutputs
        from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import silu_mul_quant_contig_reference

        own = ContigOutputs(
            torch.empty_like(outputs.out),
            torch.empty_strided(
                tuple(outputs.scale.shape),
                outputs.scale.stride(),
                dtype=outputs.scale.dtype,
                device=outputs.scale.device,
            ),
        )
        silu_mul_quant_contig_reference(inputs, own, shape, config)
        return own
