"""The GPU machine's long fuzz loads SGLang's kernels compiled ahead of time, one module per template
combination (tests/gpu/run_long_fuzz.py --compile-host). On CPU: the combinations it enumerates
(sglang_moe_plugins.bench.sglang_kernels.plugin_specs) are exactly those that SGLang's wrappers (as rebuilt in
sglang_moe_plugins/bench/sglang_kernels.py) derive when the jit_ep and fp8_fallback plugins run those calls."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
pytest.importorskip("tvm_ffi")

import fuzz_cases as fc  # noqa: E402
import run_long_fuzz  # noqa: E402

from sglang_moe_plugins.bench import sglang_kernels as sglang_jit  # noqa: E402
from sglang_moe_plugins.hardware import Platform  # noqa: E402
from sglang_moe_plugins.ops import silu_mul_quant as smq  # noqa: E402
from sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback import Fp8FallbackPlugin  # noqa: E402
from sglang_moe_plugins.plugins.sglang_kernels.host import use_host_kernels  # noqa: E402
from sglang_moe_plugins.plugins.sglang_kernels.jit_ep import JitEpPlugin  # noqa: E402


class _NoOpModule:
    def run(self, *args) -> None:
        pass

    def per_token_group_quant(self, *args) -> None:
        pass


class _RecordingJit(sglang_jit.SglangJit):
    """SGLang's wrappers as rebuilt in sglang_moe_plugins/bench/sglang_kernels.py, recording the module each call asks for."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, root / "build")
        self.asked: list[tuple] = []

    def dsv4_module(self, spec):
        self.asked.append(("dsv4", spec))
        return _NoOpModule()

    def ptgq_module(self, spec):
        self.asked.append(("ptgq", spec))
        return _NoOpModule()


@pytest.fixture()
def recording_jit(tmp_path, monkeypatch):
    import tvm_ffi

    (tmp_path / "include").mkdir()
    (tmp_path / "csrc").mkdir()
    monkeypatch.setattr(tvm_ffi, "use_torch_stream", contextlib.nullcontext)  # no CUDA stream on CPU
    return _RecordingJit(tmp_path)


def test_plugin_specs_match_what_the_wrappers_ask_for(recording_jit):
    plugins = {"dsv4": JitEpPlugin(), "ptgq": Fp8FallbackPlugin()}
    calls = {"dsv4": 0, "ptgq": 0}
    with use_host_kernels(recording_jit.host_kernels()):
        for i in range(400):
            case = fc.draw_case(random.Random(20261130 * 100_003 + i), compact=True)
            gen = torch.Generator().manual_seed(case["seed"])
            gateup, masked = fc.make_gateup(case, gen), fc.make_masked(case, gen)
            shape, config = fc.describe_case(case, gateup, masked)
            config = dataclasses.replace(config, platform=Platform.cuda(9, 0))
            want = dict(zip(("dsv4", "ptgq"), sglang_jit.plugin_specs(shape, config)))
            for kind, plugin in plugins.items():
                if not plugin.supports(shape, config):
                    continue
                recording_jit.asked.clear()
                outputs = smq.allocate_outputs(shape, config, torch.device("cpu"))
                plugin.run(smq.SiluMulQuantInputs(gateup, masked), outputs, shape, config)
                assert recording_jit.asked == [(kind, want[kind])], (plugin.name, case)
                calls[kind] += 1
    assert calls["dsv4"] >= 10 and calls["ptgq"] >= 50, calls


def test_host_specs_cover_both_kernels_and_every_group_size():
    dsv4, ptgq = run_long_fuzz.host_specs(20261130, 600)
    assert {spec[0] for spec in dsv4} == {32, 128}  # jit_ep's group sizes
    assert {spec[2] for spec in ptgq} == set(smq.GROUP_SIZES)  # fp8_fallback takes every group size
    assert all(spec[3] for spec in dsv4)  # use_pdl, as SGLang launches on sm90
