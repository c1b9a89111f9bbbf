"""Issue 20, item 1: runtime visibility. Per-process counters per (op, plugin) (calls, fallbacks) and of
calls handed to SGLang, ``sglang_moe_plugins.stats()``, the rank label, and the same counters through
prometheus_client's real multiprocess collector over a worker process that ran SGLang's own
``load_plugins()`` and hooked function (as SGLang's metrics do with ``--enable-metrics``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import sglang_moe_plugins
from sglang_moe_plugins import Registry, Selector, UserConfig
from sglang_moe_plugins.counters import reset_stats, stats
from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import ReferencePlugin


class _Failing(ReferencePlugin):
    name = "failing_first"
    priority = 1000

    def run(self, inputs, outputs, shape, config):
        raise RuntimeError("boom")


def _call(selector: Selector, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    gateup = (torch.randn(2, 4, 512, generator=gen) + 0.5).to(torch.bfloat16)
    masked = torch.tensor([4, 1], dtype=torch.int32)
    shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
    selector.dispatch(smq.OP, smq.SiluMulQuantInputs(gateup, masked), shape, config)


def test_counters_per_plugin_with_fallbacks_and_shares():
    reset_stats()
    selector = Selector(Registry.from_plugins([ReferencePlugin(), _Failing()], UserConfig()))
    for seed in range(3):
        _call(selector, seed)
    got = {(p.op, p.plugin): (p.calls, p.fallbacks) for p in stats().plugins}
    # The failing plugin is tried once, falls back once, and is then excluded for the key.
    assert got == {("silu_mul_quant", "failing_first"): (1, 1), ("silu_mul_quant", "reference"): (3, 0)}
    current = sglang_moe_plugins.stats()
    assert current.share("silu_mul_quant") == {"failing_first": 0.25, "reference": 0.75}
    assert current.rank is None and current.world_size is None  # torch.distributed not initialised
    data = json.loads(json.dumps(current.to_dict()))
    assert data["plugins"][1] == {"op": "silu_mul_quant", "plugin": "reference", "calls": 3, "fallbacks": 0}


WORKER = """
    import json, logging, os, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if os.environ.get("WITH_GLOO"):
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["WITH_GLOO"], rank=0, world_size=1)
    from sglang.srt.plugins import load_plugins
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    load_plugins()
    gateup = (torch.randn(2, 4, 512) + 0.5).to(torch.bfloat16)
    masked = torch.tensor([4, 1], dtype=torch.int32)
    for _ in range(3):
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    try:
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2, gemm1_alpha=1.5, gemm1_clamp_limit=7.0)
    except Exception as exc:  # SGLang's own gpt-oss path has no CPU kernel: only the delegation matters here
        pass
    import sglang_moe_plugins
    print("STATS " + json.dumps(sglang_moe_plugins.stats().to_dict()))
"""


def _worker(tmp_path, **env: str) -> tuple[dict, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PROMETHEUS_"))}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WORKER)],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
        cwd=str(tmp_path),
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("STATS ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[len("STATS ") :]), proc.stderr


@pytest.mark.sglang
def test_stats_through_sglang_hooked_calls(tmp_path):
    pytest.importorskip("sglang")
    data, _ = _worker(tmp_path)
    calls = {p["plugin"]: p["calls"] for p in data["plugins"] if p["op"] == "silu_mul_quant"}
    # On CPU one plugin runs every call (the reference, or the example plugin where it is installed).
    assert list(calls.values()) == [3] and all(p["fallbacks"] == 0 for p in data["plugins"]), data
    assert data["delegations"] == {"silu_mul_quant": {"gemm1_alpha": 1}}
    assert data["share"]["silu_mul_quant"] == {next(iter(calls)): 1.0}


@pytest.mark.sglang
def test_rank_label_in_stats_and_log_lines(tmp_path):
    pytest.importorskip("sglang")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data, stderr = _worker(tmp_path, WITH_GLOO=str(port))
    assert (data["rank"], data["world_size"]) == (0, 1)
    # The package's own lines (logging.basicConfig's format: LEVEL:logger:message).
    lines = [line for line in stderr.splitlines() if line.partition(":")[2].startswith("sglang_moe_plugins")]
    assert lines and all("[rank 0/1]" in line for line in lines), [x for x in lines if "[rank 0/1]" not in x]


@pytest.mark.sglang
def test_counters_reach_prometheus_multiprocess_collector(tmp_path):
    pytest.importorskip("sglang")
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client import multiprocess

    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    _, stderr = _worker(tmp_path, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    assert "exporting sglang_moe_plugins_calls_total" in stderr
    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(metrics_dir))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for metric in registry.collect() for s in metric.samples
    }
    calls = {
        dict(labels)["plugin"]: value
        for (name, labels), value in samples.items()
        if name == "sglang_moe_plugins_calls_total" and dict(labels)["op"] == "silu_mul_quant"
    }
    assert list(calls.values()) == [3.0], samples  # flushed at the worker's exit (the thread flushes every 5 s)
    plugin = next(iter(calls))
    delegated = samples[("sglang_moe_plugins_delegations_total", (("kind", "gemm1_alpha"), ("op", "silu_mul_quant")))]
    assert delegated == 1.0
    text = prometheus_client.generate_latest(registry).decode()
    assert f'sglang_moe_plugins_calls_total{{op="silu_mul_quant",plugin="{plugin}"}} 3.0' in text


def test_info_line_says_the_choice_first_and_short_reasons_at_debug(caplog):
    import logging

    selector = Selector(
        Registry.from_plugins([ReferencePlugin(), _Failing()], UserConfig(disable=frozenset({"failing_first"})))
    )
    with caplog.at_level(logging.DEBUG, logger="sglang_moe_plugins"):
        _call(selector, 0)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(info) == 1 and info[0].startswith("sglang-moe-plugins: silu_mul_quant -> reference for E=2 N=4 D=256")
    assert len(info[0]) < 160
    assert len(debug) == 1 and "not chosen: failing_first: disabled" in debug[0]
