"""``sglang-moe-plugins bench`` on a GPU machine without SGLang, with SGLang's own kernels timed too.

``jit_ep`` and ``fp8_fallback`` run SGLang's kernels; where SGLang is not installed (the H200 benchmark
machine) ``bench`` reports them as unavailable. This driver builds those kernels from the sglang wheel's
JIT sources through tvm-ffi (:mod:`sglang_moe_plugins.bench.sglang_kernels`, as ``benchmarks/silu_mul_quant.py`` does), installs them as
the host kernels (:func:`sglang_moe_plugins.plugins.sglang_kernels.host.use_host_kernels`) and then runs the ``bench``
command with the arguments given, so every plugin is timed side by side in one run.

Usage (repository root; apache-tvm-ffi importable, the wheel's ``sglang/kernels/jit`` unpacked under
``.device/sgl_jit``): ``PYTHONPATH=$PWD python benchmarks/bench_with_sglang_kernels.py --model DeepSeek-V4-Flash --ep 8 --out DIR``
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    from sglang_moe_plugins import cli
    from sglang_moe_plugins.bench.sglang_kernels import build_host_kernels
    from sglang_moe_plugins.plugins.sglang_kernels.host import use_host_kernels

    if "-h" in argv or "--help" in argv:  # the bench command's help; no kernels built
        return cli.main(["bench", *argv])
    jit_root = ROOT / ".device/sgl_jit/sglang/kernels/jit"
    with use_host_kernels(build_host_kernels(jit_root, build_root="/tmp/sgl_jit_build/bench")):
        return cli.main(["bench", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
