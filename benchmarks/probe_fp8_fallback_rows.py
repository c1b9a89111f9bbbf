"""Probe: for which (E, N) does SGLang 0.5.23's masked fused per_token_group_quant (the fp8_fallback path)
leave real rows' scales unwritten? Run on the GPU machine from the repository root with
``PYTHONPATH=$PWD python benchmarks/probe_fp8_fallback_rows.py``. Runs the plugin over SGLang's kernels built from the wheel's JIT
sources (sglang_moe_plugins/bench/sglang_kernels.py) and prints, per layout, the (E, N) pairs with unwritten real rows."""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import torch

from sglang_moe_plugins.bench.sglang_kernels import SglangJit
from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback import Fp8FallbackPlugin
from sglang_moe_plugins.plugins.sglang_kernels.host import use_host_kernels

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    jit = SglangJit(
        ROOT / ".device/sgl_jit/sglang/kernels/jit", "/tmp/sgl_jit_build", prebuilt_root=ROOT / ".device/sgl_prebuilt"
    )
    plugin = Fp8FallbackPlugin()
    bad: dict[str, list] = {}
    with use_host_kernels(jit.host_kernels()):
        for layout in ("column_major", "row_major", "ue8m0_packed"):
            bad[layout] = []
            for e in (1, 8, 32, 64, 96, 128, 160, 256, 512):
                for n in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 64):
                    for d in (512, 2048):
                        g = torch.randn(e, n, 2 * d, device="cuda").bfloat16()
                        m = torch.full((e,), n, dtype=torch.int32, device="cuda")
                        shape, config = smq.describe(g, m, group_size=128, topk=8, scale_layout=layout)
                        out = smq.allocate_outputs(shape, config, g.device)
                        out.out.view(torch.uint8).fill_(0x7F)
                        out.scale.fill_(-1 if config.scale_ue8m0 else float("nan"))
                        plugin.run(smq.SiluMulQuantInputs(g, m), out, shape, config)
                        torch.cuda.synchronize()
                        s = smq.scale_to_float(out.scale, shape, config)
                        q_bad = torch.isnan(out.out.float()).any(-1)
                        s_bad = (
                            torch.isnan(s).any(-1) | (s <= 0).any(-1)
                            if not config.scale_ue8m0
                            else (out.scale == -1).any(-1)
                        )
                        rows = int((q_bad | s_bad).sum())
                        if rows:
                            bad[layout].append((e, n, d, rows, int(q_bad.sum()), int(s_bad.sum())))
    for layout, items in bad.items():
        print(layout, "unwritten (E, N, D, rows, fp8 rows, scale rows):", items)
    out_dir = os.environ.get("OUT")
    if out_dir:
        (pathlib.Path(out_dir) / "probe_fp8_fallback_rows.json").write_text(json.dumps(bad))


if __name__ == "__main__":
    main()
