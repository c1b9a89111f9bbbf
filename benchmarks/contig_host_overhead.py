"""Host time the compact-runner hooks add to one eager MoE layer call (CPU; no kernels).

Times, in one process after SGLang's real ``load_plugins()``: (a) a call of SGLang's hooked
``DeepGemmRunnerCore._run_contiguous_gemm`` whose method body is replaced by one call of the (hooked)
``silu_and_mul_contig_post_quant`` on preallocated buffers, with the bound op's launch replaced by a no-op, and
(b) the same body called directly with the unhooked kernel wrapper replaced by a no-op. The difference is what the
package adds per layer call on the host: the runner hook (the step read from the runner, one cache lookup, the
redirect set and restored), the kernel hook and ``Selector.call``. Median of 7 rounds of 20,000 calls.

Usage: ``PYTHONPATH=$PWD:$PWD/tests python benchmarks/contig_host_overhead.py [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import timeit

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "tests")]
    import torch
    from contig_host import make_layer
    from sglang_session import loaded_sglang

    from sglang_moe_plugins import UserConfig, api
    from sglang_moe_plugins.bench.provenance import run_info
    from sglang_moe_plugins.integrations.sglang import contig
    from sglang_moe_plugins.integrations.sglang.versions import active_target

    dg = loaded_sglang()
    api.reload(UserConfig(allow=frozenset()))
    layer = make_layer(rows=16, swiglu_limit=10.0)
    ri = dg.DeepGemmRunnerInput(
        hidden_states=layer.hidden_states,
        hidden_states_scale=layer.hidden_states_scale,
        use_masked_gemm=False,
        m_indices=layer.m_indices,
    )
    gateup = torch.randn(16, 512).to(torch.bfloat16)
    out, scale = torch.empty(16, 256, dtype=torch.float8_e4m3fn), torch.empty(16, 2)
    kernel = active_target("silu_mul_quant_contig").host.kernel_path
    import pkgutil

    hooked_kernel = pkgutil.resolve_name(kernel)

    def body(runner, runner_input, quant_info, state):  # what the method does around the step, reduced to the call
        hooked_kernel(
            input=gateup,
            output=out,
            output_scale=scale,
            quant_group_size=128,
            scale_ue8m0=False,
            transposed=False,
            swiglu_limit=runner.swiglu_limit,
            swizzle=False,
        )

    def bare_kernel(**kwargs):
        return None

    def bare(runner, runner_input, quant_info, state):
        bare_kernel(
            input=gateup,
            output=out,
            output_scale=scale,
            quant_group_size=128,
            scale_ue8m0=False,
            transposed=False,
            swiglu_limit=runner.swiglu_limit,
            swizzle=False,
        )

    state: dict = {"all_tokens": 16}
    contig.contig_runner_hook(body, layer.runner, ri, layer.quant_info, state)  # first call: binds and checks
    (bound,) = [b for k, b in api.current_selector().call_cache.items() if k[0] == "silu_mul_quant_contig"]
    object.__setattr__(bound, "launch", lambda inputs, outputs: None)  # no kernel: host time only
    n = 20000
    hooked = [
        timeit.timeit(lambda: contig.contig_runner_hook(body, layer.runner, ri, layer.quant_info, state), number=n)
        / n
        * 1e6
        for _ in range(7)
    ]
    plain = [
        timeit.timeit(lambda: bare(layer.runner, ri, layer.quant_info, state), number=n) / n * 1e6 for _ in range(7)
    ]
    result = {
        "hooked_us": statistics.median(hooked),
        "sglang_body_us": statistics.median(plain),
        "added_us": statistics.median(hooked) - statistics.median(plain),
        "rounds": {"hooked": hooked, "plain": plain},
        "run": run_info(),
    }
    print(
        f"hooked layer call {result['hooked_us']:.2f} us, SGLang's body {result['sglang_body_us']:.2f} us: "
        f"the hooks add {result['added_us']:.2f} us per layer call"
    )
    if args.out:
        path = pathlib.Path(args.out) / "contig_host_overhead_cpu.json"
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
