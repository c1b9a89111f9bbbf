"""lazy.py: the modules on ``list``'s path import torch on first use, and from then on hold torch itself (a
hooked call reads the same global as after ``import torch``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from sglang_moe_plugins.lazy import LazyModule, lazy_module


def test_a_lazy_module_imports_on_first_attribute_and_rebinds_the_global():
    sys.modules.pop("colorsys", None)  # a stdlib module nothing here needs
    namespace: dict = {}
    namespace["colorsys"] = lazy_module("colorsys", namespace)
    assert isinstance(namespace["colorsys"], LazyModule) and "colorsys" not in sys.modules
    assert "imported on first use" in repr(namespace["colorsys"])
    assert namespace["colorsys"].rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert namespace["colorsys"] is sys.modules["colorsys"]


def test_a_lazy_module_leaves_a_global_rebound_meanwhile_alone():
    namespace: dict = {}
    proxy = namespace["c"] = lazy_module("colorsys", namespace, "c")
    namespace["c"] = "something else"
    assert proxy.ONE_THIRD == 1.0 / 3.0
    assert namespace["c"] == "something else"


def test_copies_pickles_and_dunder_probes_of_a_lazy_module_neither_recurse_nor_import():
    import copy
    import pickle

    sys.modules.pop("colorsys", None)
    proxy = lazy_module("colorsys", {})
    assert not hasattr(proxy, "__deepcopy__") and "colorsys" not in sys.modules  # a probe imports nothing
    assert copy.copy(proxy) is copy.deepcopy(proxy) is pickle.loads(pickle.dumps(proxy)) is sys.modules["colorsys"]
    bare = LazyModule.__new__(LazyModule)  # no __init__: the slots are unset
    assert not hasattr(bare, "_name") and not hasattr(bare, "anything")


#: core.dispatcher keeps a lazy torch too, used only when a plugin's prepare() fails: not bound by a plain call.
LAZY_MODULES = (
    "sglang_moe_plugins.core.bound",
    "sglang_moe_plugins.ops.silu_mul_quant",
    "sglang_moe_plugins.ops.mega_moe",
    "sglang_moe_plugins.quant",
    "sglang_moe_plugins.plugins.reference.silu_mul_quant",
)


def test_the_package_modules_hold_torch_itself_after_the_first_call():
    """Importing the modules imports no torch; one call through the real registry and selector (the
    ``reference`` plugin on CPU) binds each module's ``torch`` to torch (``mega_moe``'s on its describe)."""
    code = textwrap.dedent(f"""
        import importlib, sys
        modules = [importlib.import_module(name) for name in {LAZY_MODULES!r}]
        assert "torch" not in sys.modules, "importing the modules imported torch"
        assert all(type(m.torch).__name__ == "LazyModule" for m in modules)
        import torch
        import sglang_moe_plugins
        from sglang_moe_plugins.ops import mega_moe
        gateup = torch.randn(2, 4, 256).to(torch.bfloat16)
        out, scale = sglang_moe_plugins.silu_mul_quant(gateup, torch.tensor([3, 1], dtype=torch.int32))
        assert out.dtype == torch.float8_e4m3fn and sglang_moe_plugins.api.get_selector().registry
        from sglang_moe_plugins.errors import InvalidArgumentError
        try:
            mega_moe.describe(torch.zeros(2, 8), None, None, l1_weights=(None, None), l2_weights=(None, None),
                              variant="fp8xfp4", num_experts=1, hidden_size=8, intermediate_size=8, top_k=1)
        except InvalidArgumentError as exc:
            assert "hidden_states.dtype" in str(exc), exc  # fp32 rejected: the check read torch.bfloat16
        stale = [m.__name__ for m in modules if m.torch is not torch]
        assert not stale, f"still a LazyModule after a call: {{stale}}"
        print("BOUND")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")} | {"SGLANG_MOE_PLUGINS_ALLOW": ""}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and "BOUND" in result.stdout, result.stderr[-3000:]
