"""Faulty plugins for issue 7.2, loaded through real entry points (``EntryPoint`` objects in-process, and
as an installed distribution ``moe-fault-plugins`` in subprocesses; see test_faults.py).

Self-contained (imports only sglang_moe_plugins and torch): test_faults.py copies this file into a
temporary site directory next to a ``.dist-info`` that declares the entry points.
"""

from __future__ import annotations

import torch

from sglang_moe_plugins import Plugin, Support
from sglang_moe_plugins.ops.silu_mul_quant import OP, SiluMulQuantOutputs
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference


class _CpuPlugin(Plugin):
    op = OP
    description = "deliberately faulty plugin (tests)"
    #: Their faults are in what they return: none writes its inputs, so each failure may fall back on
    #: the same call (undeclared, a failure on the hook's writable gateup raises instead).
    writes_inputs = frozenset()

    def available(self, platform):
        return Support.yes("runs anywhere")

    def supports(self, shape, config):
        return Support.yes("accepts every call")

    def run(self, inputs, outputs, shape, config):
        silu_mul_quant_reference(inputs, outputs, shape, config)


class RaisingSupports(_CpuPlugin):
    name = "fault_supports"
    priority = 900

    def supports(self, shape, config):
        raise RuntimeError("supports exploded: tuning table missing")


class RaisingRun(_CpuPlugin):
    name = "fault_run"
    priority = 800

    def run(self, inputs, outputs, shape, config):
        raise RuntimeError("run exploded: illegal memory access")


class WrongShape(_CpuPlugin):
    name = "fault_wrong_shape"
    priority = 700

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        return SiluMulQuantOutputs(outputs.out[:, :, : shape.hidden // 2], outputs.scale)


class WrongDtype(_CpuPlugin):
    name = "fault_wrong_dtype"
    priority = 600

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        return SiluMulQuantOutputs(outputs.out.float().to(torch.bfloat16), outputs.scale)


class WrongLayout(_CpuPlugin):
    name = "fault_wrong_layout"
    priority = 500

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        return SiluMulQuantOutputs(outputs.out, outputs.scale.contiguous())  # row-major, whatever was asked


#: name -> (entry point value, the plugin's class name or None when it cannot even be imported)
ENTRY_POINTS = {
    "fault_missing_dep": "fault_missing_dep:MissingDependency",
    "fault_missing_module": "moe_no_such_module_xyz:Plugin",
    "fault_supports": "fault_plugins:RaisingSupports",
    "fault_run": "fault_plugins:RaisingRun",
    "fault_wrong_shape": "fault_plugins:WrongShape",
    "fault_wrong_dtype": "fault_plugins:WrongDtype",
    "fault_wrong_layout": "fault_plugins:WrongLayout",
}
