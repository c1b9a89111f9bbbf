"""Issue 7.3 on the GPU machine: the CPU fuzz (tests/test_fuzz.py) for every plugin available on this
CUDA device (triton, jit_ep, fp8_fallback when their kernels load, and the reference on CUDA), each
forced (no fallback hides a failure), against the fp64 tolerance policy. Skipped without CUDA.

``jit_ep`` and ``fp8_fallback`` run SGLang's own kernels: SGLang's when it is installed, else the same
kernels built from the sglang wheel's JIT sources through tvm-ffi (``tests/gpu/sglang_host.py``; the
GPU machine has no SGLang). ``MOE_FUZZ_HOST=0`` leaves them out. ``run_long_fuzz.py --compile-host DIR``
compiles, on any machine with nvcc, every template combination the long run asks for.

Run from the repository root (the lead runs these):

    PYTHONPATH=.:tests python -m pytest -q tests/gpu/test_fuzz_cuda.py --hypothesis-show-statistics
    # the long run (10,000 cases per plugin) as parallel shards, merged into one summary:
    PYTHONPATH=$PWD:$PWD/tests python tests/gpu/run_long_fuzz.py --seed 20261130 --shards 14 \
        --out tests/fuzz_runs/<date>-gpu-long-seed20261130.json

The CI profile runs 150 cases per plugin (``MOE_FUZZ_EXAMPLES`` overrides). ``MOE_FUZZ_SHARD=k/W`` runs
only shard k of W (case i belongs to shard i % W; with hypothesis, shard k draws its share of the cases
from seed ``MOE_FUZZ_SEED * 1000 + k``); ``tests/gpu/run_long_fuzz.py`` runs the shards in parallel
processes (one CPU thread each: the fp64 comparison is the per-case cost), compiles the kernels up front
and merges the summaries. Every hidden size compiles its own Triton kernel, so the long profile draws
hidden sizes from ``fuzz_cases.COMPACT_GROUPS`` (``MOE_FUZZ_COMPACT=0`` turns that off). Without
hypothesis on the machine, the same case distribution is drawn from a seeded ``random.Random`` (no
shrinking), and each case is checked on every CUDA plugin in turn.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA device", allow_module_level=True)

import fuzz_cases as fc  # noqa: E402
from builtin_eps import builtin_entry_points  # noqa: E402
from fuzz_cases import PROFILE, SEED  # noqa: E402

from sglang_moe_plugins import Registry, UserConfig  # noqa: E402
from sglang_moe_plugins.hardware import local_platform  # noqa: E402
from sglang_moe_plugins.ops import silu_mul_quant as smq  # noqa: E402
from sglang_moe_plugins.plugins.sglang_kernels.host import host_kernels_source, use_host_kernels  # noqa: E402

pytestmark = pytest.mark.gpu
EXAMPLES = int(os.environ.get("MOE_FUZZ_EXAMPLES", 150 if PROFILE == "ci" else 10_000))


def _shard() -> tuple[int, int]:
    raw = os.environ.get("MOE_FUZZ_SHARD", "0/1")
    try:
        index, count = (int(part) for part in raw.split("/"))
    except ValueError:
        raise ValueError(f"MOE_FUZZ_SHARD={raw!r}: expected 'k/W' with 0 <= k < W") from None
    if not 0 <= index < count:
        raise ValueError(f"MOE_FUZZ_SHARD={raw!r}: expected 'k/W' with 0 <= k < W")
    return index, count


SHARD_INDEX, SHARD_COUNT = _shard()
STATS: Counter = Counter()
WORST: dict[str, float] = {}


def _sglang_kernels():
    """SGLang's kernels for jit_ep / fp8_fallback where SGLang is not installed: built from the wheel's
    JIT sources (``None`` when SGLang is installed, when they cannot be built here, or MOE_FUZZ_HOST=0)."""
    if os.environ.get("MOE_FUZZ_HOST", "1") == "0" or host_kernels_source() is not None:
        return None
    from sglang_host import sglang_jit

    jit, _why_not = sglang_jit()
    return None if jit is None else jit.host_kernels()


SGLANG_KERNELS = _sglang_kernels()


def host_kernels():
    """Installs SGLang's kernels built here for the duration of one case (nothing when SGLang serves)."""
    return use_host_kernels(SGLANG_KERNELS) if SGLANG_KERNELS is not None else contextlib.nullcontext()


def _cuda_plugins():
    here = local_platform()
    registry = Registry.discover(UserConfig(), builtin_entry_points())
    with host_kernels():
        return [
            r.plugin
            for r in registry.records(smq.OP)
            if getattr(r.plugin, "available", None) is None or r.plugin.available(here)
        ]


CUDA_PLUGINS = _cuda_plugins()


#: The long profile on the GPU machine draws hidden sizes from fuzz_cases.COMPACT_GROUPS (compile time)
COMPACT = os.environ.get("MOE_FUZZ_COMPACT", "1" if PROFILE == "long" else "0") == "1"
_START = time.time()


def _write_summary() -> None:
    path = os.environ.get("MOE_FUZZ_SUMMARY")
    if path:
        with open(path, "w") as handle:
            json.dump(
                {
                    "profile": PROFILE,
                    "seed": SEED,
                    "shard": f"{SHARD_INDEX}/{SHARD_COUNT}",
                    "compact": COMPACT,
                    "device": torch.cuda.get_device_name(),
                    "seconds": round(time.time() - _START, 1),
                    "counts": dict(sorted(STATS.items())),
                    "worst": WORST,
                },
                handle,
                indent=2,
            )


@pytest.fixture(scope="module", autouse=True)
def _summary():
    yield
    _write_summary()


def check_case(plugin, case) -> None:
    with host_kernels():
        fc.check_smq_case(plugin, case, torch.device("cuda"), STATS, WORST)


if fc.HAVE_HYPOTHESIS:
    from hypothesis import given, note, seed

    @pytest.mark.parametrize("plugin", CUDA_PLUGINS, ids=[p.name for p in CUDA_PLUGINS])
    @(seed(int(SEED) * 1000 + SHARD_INDEX) if SEED is not None and SHARD_COUNT > 1 else fc.seeded)
    @fc.fuzz_settings(-(-EXAMPLES // SHARD_COUNT))
    @given(case=fc.smq_calls())
    def test_fuzz_silu_mul_quant_cuda_plugins(plugin, case):
        note(repr(case))
        check_case(plugin, case)

else:  # no hypothesis on this machine: the same cases from a seeded random.Random, no shrinking

    def test_fuzz_silu_mul_quant_cuda_plugins():
        # every CUDA plugin on each case in turn, so that an interrupted run has checked all of them
        # on the same cases
        import random

        base = int(SEED) if SEED is not None else 20261130
        for n, i in enumerate(range(SHARD_INDEX, EXAMPLES, SHARD_COUNT)):
            case = fc.draw_case(random.Random(base * 100_003 + i), compact=COMPACT)
            for plugin in CUDA_PLUGINS:
                try:
                    check_case(plugin, case)
                except Exception as exc:  # not KeyboardInterrupt: run_long_fuzz.py stops shards with SIGINT
                    raise AssertionError(f"{plugin.name}: case {i} (MOE_FUZZ_SEED={base}): {case!r}: {exc}") from exc
            if n % 250 == 249:
                _write_summary()  # progress survives a kill


def test_sglang_kernels_are_fuzzed_when_they_load():
    if SGLANG_KERNELS is not None or host_kernels_source() is not None:
        names = [p.name for p in CUDA_PLUGINS]
        assert "jit_ep" in names and "fp8_fallback" in names, names


def test_triton_is_fuzzed_when_available():
    reg = Registry.discover(UserConfig(), builtin_entry_points())
    if "triton" in reg and reg.get("triton").plugin.available(local_platform()):
        assert "triton" in [p.name for p in CUDA_PLUGINS]
