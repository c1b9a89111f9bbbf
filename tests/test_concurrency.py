"""Issue 7.4: selection from 16 threads at once, through the public API and SGLang's hooked function.

On the same key and on different keys: every thread gets the same plugin for a key, each key is decided
once (``Selector.cache_info()["decisions"]``) and logged once, results equal the single-threaded ones,
and a plugin that fails at run time under contention is logged once and excluded once.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from conftest import RecordingPlugin, random_call

from sglang_moe_plugins import Verdict, api
from sglang_moe_plugins.config import UserConfig
from sglang_moe_plugins.ops import silu_mul_quant as smq

THREADS = 16
LOGGER = "sglang_moe_plugins"


def run_threads(work, count: int = THREADS) -> list:
    """Run ``work(i)`` in ``count`` threads released together; re-raise the first error."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


def decision_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER) and " -> " in r.getMessage()]


def same_bytes(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> bool:
    return torch.equal(
        a.view(torch.uint8)[real] if a.dtype == torch.float8_e4m3fn else a[real],
        b.view(torch.uint8)[real] if b.dtype == torch.float8_e4m3fn else b[real],
    )


@pytest.fixture
def fresh_selector():
    """A fresh process-wide selector (default configuration), restored afterwards."""
    selector = api.reload(UserConfig())
    yield selector
    api.reload(UserConfig())


@pytest.mark.parametrize("keys", [1, 4], ids=["same-key", "four-keys"])
def test_public_select_and_dispatch_from_16_threads(fresh_selector, keys, caplog):
    calls = [random_call(e=2 + k, n=4 + k, seed=k) for k in range(keys)]
    expected = []
    for inputs, shape, config in calls:  # single-threaded answers, computed outside the selector
        from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference

        ref = smq.allocate_outputs(shape, config, torch.device("cpu"))
        silu_mul_quant_reference(inputs, ref, shape, config)
        expected.append(ref)

    def work(i: int):
        inputs, shape, config = calls[i % keys]
        names = {api.select(smq.OP, shape, config).chosen.name for _ in range(50)}
        out = api.dispatch(smq.OP, inputs, shape, config)
        return i % keys, names, out

    with caplog.at_level(logging.INFO, logger=LOGGER):
        results = run_threads(work)
    from numerics import check_against_fp64

    for k in range(keys):
        inputs, shape, config = calls[k]
        real = smq.real_rows(inputs.masked_m, shape.max_rows)
        chosen = {name for key, names, _ in results if key == k for name in names}
        assert len(chosen) == 1  # one plugin for the key, in every thread, every time
        outs = [out for key, _, out in results if key == k]
        for out in outs:  # every thread got the same bytes, and they are right
            assert same_bytes(out.out, outs[0].out, real) and same_bytes(out.scale, outs[0].scale, real)
            check_against_fp64(inputs, out, shape, config)
            if chosen == {"reference"}:
                assert same_bytes(out.out, expected[k].out, real) and same_bytes(out.scale, expected[k].scale, real)
    assert fresh_selector.cache_info()["decisions"] == keys
    assert len(decision_lines(caplog)) == keys


def test_failure_under_contention_is_logged_once_and_excluded_once(make_selector, caplog):
    """16 threads hit a plugin that fails at run time on the same key at the same moment."""

    class SlowFailing(RecordingPlugin):
        def run(self, inputs, outputs, shape, config):
            self.run_calls += 1
            time.sleep(0.05)  # every thread is inside run() before the first failure is recorded
            raise RuntimeError("kernel exploded")

    bad, good = SlowFailing("bad", 10), RecordingPlugin("good", 5)
    selector = make_selector(bad, good)
    inputs, shape, config = random_call()

    with caplog.at_level(logging.INFO, logger=LOGGER):
        outs = run_threads(lambda i: selector.dispatch(smq.OP, inputs, shape, config))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert good.run_calls == THREADS
    real = smq.real_rows(inputs.masked_m, shape.max_rows)
    for out in outs:
        assert same_bytes(out.out, outs[0].out, real) and same_bytes(out.scale, outs[0].scale, real)
    assert selector.explain(smq.OP, shape, config).candidate("bad").verdict == Verdict.FAILED
    assert list(selector.failed_plugins().values()) == [
        {"bad": selector.explain(smq.OP, shape, config).candidate("bad").reason}
    ]
    # After the failure: one decision for the first selection, one after the plugin was excluded.
    assert selector.cache_info()["decisions"] == 2


@pytest.mark.sglang
@pytest.mark.parametrize("keys", [1, 4], ids=["same-key", "four-keys"])
def test_sglang_hooked_function_from_16_threads(fresh_selector, keys, caplog):
    pytest.importorskip("sglang")
    from sglang_session import loaded_sglang

    runner = loaded_sglang()
    hooked = runner._varlen_deep_gemm_silu_mul_quant
    assert getattr(hooked, "__wrapped__", None) is not None, "the hook is not applied"
    data = []
    for i in range(THREADS):  # per-thread data; shapes by key (N differs)
        k = i % keys
        gen = torch.Generator().manual_seed(100 + i)
        n = 6 + 2 * k
        gateup = (torch.randn(4, n, 1024, generator=gen) * 4).to(torch.bfloat16)
        masked = torch.randint(0, n + 1, (4,), generator=gen, dtype=torch.int32)
        data.append((gateup, masked))
    expected = [hooked(g, m, 128, 2) for g, m in data]  # single-threaded, same selector
    api.reload(UserConfig())  # cold cache again for the threaded run
    selector = api.get_selector()

    with caplog.at_level(logging.INFO, logger=LOGGER):  # 3 calls per thread: the first binds, the others hit
        got = run_threads(lambda i: [hooked(*data[i], 128, 2) for _ in range(3)])
    for (g, m), calls, (want_out, want_scale) in zip(data, got, expected):
        real = smq.real_rows(m, g.shape[1])
        for out, scale in calls:
            assert same_bytes(out, want_out, real) and torch.equal(scale[real], want_scale[real])
    info = selector.cache_info()
    assert (info["decisions"], info["bound"], info["call_keys"]) == (keys, keys, keys)
    assert len(decision_lines(caplog)) == keys
    names = set()
    for g, m in data:
        shape, config = smq.describe(g, m, group_size=128, topk=2)
        names.add((shape.max_rows, selector.explain(smq.OP, shape, config).chosen.name))
    assert len(names) == keys  # one plugin per key, whatever the thread
