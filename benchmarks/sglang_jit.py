"""Temporary re-export: SGLang's kernels built from the wheel's JIT sources live in
:mod:`sglang_moe_plugins.bench.sglang_kernels`."""

from sglang_moe_plugins.bench.sglang_kernels import *  # noqa: F401,F403
from sglang_moe_plugins.bench.sglang_kernels import __all__  # noqa: F401
