"""Plugin classes loaded through real importlib.metadata entry points in test_registry.py."""

from sglang_moe_plugins import Plugin, Support


class GoodPlugin(Plugin):
    name = "good_test_plugin"
    op = "silu_mul_quant"
    priority = 7
    options = {"block": 16, "mode": "fast"}

    def supports(self, shape, config):
        return Support.yes("test")

    def run(self, inputs, outputs, shape, config):
        raise RuntimeError("not for running")


class BadOpPlugin(GoodPlugin):
    name = "bad_op_plugin"
    op = "softmax"


class BadPriorityPlugin(GoodPlugin):
    name = "bad_priority_plugin"
    priority = "high"


class NoRunPlugin:
    name = "no_run_plugin"
    op = "silu_mul_quant"
    priority = 1

    def supports(self, shape, config):
        return Support.yes("test")

    run = None


class OldContractPlugin(GoodPlugin):
    name = "old_contract_plugin"
    contract_version = 0


class DuplicatePlugin(GoodPlugin):
    """Same name as GoodPlugin."""


class RaisingInitPlugin(GoodPlugin):
    name = "raising_init"

    def __init__(self):
        raise ImportError("needs the package 'fancy_kernels'")


NOT_A_CLASS = GoodPlugin()
