"""Issue 31, item 8: the package's metrics join SGLang's, and its log lines do not repeat SGLang's prefix.

SGLang labels its scheduler series with ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` (and
``dp_rank`` with a data-parallel controller) and names them ``sglang:*``. The package's three counters are
``sglang_moe_plugins_*`` (a namespace SGLang does not use) and carry the labels SGLang has for the process
(``model_name``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, ``dp_rank`` where it has one), read when the first
counts are flushed, never while a scoped SGLang override (a draft model's narrowed groups) hides the process's
own ranks. Under SGLang's log prefix (``[time DP1 PP1 TP1 EP2]``) the package's lines carry no ``[rank r/w]``.

Each case is one fresh process that does what SGLang's ``run_scheduler_process`` does on a CPU: its real
``load_plugins()``, ``publish(server_args, role="scheduler", ranks=SpawnRanks(...))``,
``configure_scheduler_process`` (the log prefix) and ``SchedulerMetricsCollector.init_new`` (SGLang's own series,
one ``sglang:cuda_graph_passes_total`` increment with SGLang's labels), then hooked calls and a delegation, with
``PROMETHEUS_MULTIPROC_DIR`` set; torch.distributed (gloo, one process) is initialised as in a server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

WORKER = """
    import json, os, sys, torch
    import torch.distributed as dist
    import sglang_moe_plugins.metrics as metrics
    metrics.INTERVAL_S = 3600.0  # only the flushes below and the one at exit
    from sglang.srt.plugins import load_plugins
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    load_plugins()  # before publish, as SGLang's run_scheduler_process does
    from prometheus_client import CollectorRegistry, multiprocess
    from sglang.srt.managers.scheduler import configure_scheduler_process
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish
    from sglang.srt.server_args import ServerArgs

    spec = json.loads(os.environ["SCHEDULER"])
    server_args = ServerArgs(model_path=os.environ["MODEL_DIR"], device="cpu", enable_metrics=True, **spec["args"])
    ranks = SpawnRanks(world_rank=spec["world_rank"], dp_rank=spec["dp_rank"], gpu_id=0)
    publish(server_args, role="scheduler", ranks=ranks)
    configure_scheduler_process(server_args, gpu_id=0)  # SGLang's log prefix: [time DPx PPx TPx EPx]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
    collector = SchedulerMetricsCollector.init_new(
        server_args=server_args, enable_priority_scheduling=False, enable_lora=False, enable_hierarchical_cache=False
    ).collector
    collector.increment_decode_cuda_graph_pass(False)  # one of SGLang's own series, with SGLang's own labels

    gateup = (torch.randn(2, 4, 512) + 0.5).to(torch.bfloat16)
    masked = torch.tensor([4, 1], dtype=torch.int32)
    for _ in range(3):
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    try:
        runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2, gemm1_alpha=1.5, gemm1_clamp_limit=7.0)
    except Exception:  # SGLang's own gpt-oss path has no CPU kernel: only the delegation matters here
        pass

    def ours():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
        return sorted({s.name for m in registry.collect() for s in m.samples if "moe_plugins" in s.name})

    out = {}
    parallel = get_parallel()
    # A scoped override, as SGLang takes for a draft model's or shared experts' narrowed groups: not this process's
    # place, so a flush inside it exports nothing yet.
    with parallel.override(
        moe_ep_size=1, moe_ep_rank=0, moe_ep_group=None, moe_dp_size=1,
        moe_tp_size=parallel.tp_size, moe_tp_rank=parallel.tp_rank,
    ):
        out["scoped_flush"] = metrics.flush_metrics()
        out["scoped_series"] = ours()
    out["flush"] = metrics.flush_metrics()
    out["series"] = ours()
    print("RESULT " + json.dumps(out))
"""

#: Two schedulers: TP4 EP4 at world rank 2 with a served model name; DP replica 1 of a TP2 PP2 server at world rank 3
#: (TP rank 1, PP rank 1) without one (SGLang names the model by its path then).
SCHEDULERS: dict[str, dict[str, Any]] = {
    "tp4-ep4": {
        "args": {"tp_size": 4, "ep_size": 4, "served_model_name": "dsv4-test"},
        "world_rank": 2,
        "dp_rank": None,
        "labels": {"model_name": "dsv4-test", "tp_rank": "2", "pp_rank": "0", "moe_ep_rank": "2"},
        "log_prefix": " TP2 EP2] ",
    },
    "dp2-pp2-tp2": {
        "args": {"tp_size": 2, "pp_size": 2, "dp_size": 2},
        "world_rank": 3,
        "dp_rank": 1,
        "labels": {"model_name": "<model>", "tp_rank": "1", "pp_rank": "1", "moe_ep_rank": "0", "dp_rank": "1"},
        "log_prefix": " DP1 PP1 TP1] ",
    },
}

NAMES = ("sglang_moe_plugins_calls_total", "sglang_moe_plugins_fallbacks_total", "sglang_moe_plugins_delegations_total")
#: SGLang's scheduler labels that the package's series share (engine_type and SGLang's extra labels are not shared).
JOIN = ("model_name", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank")

_runs: dict[str, dict[str, Any]] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(metrics_dir: Path) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(metrics_dir))
    return [(s.name, dict(s.labels), s.value) for metric in registry.collect() for s in metric.samples]


def _scheduler(case: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the case's scheduler process once per test session; its result, stderr, samples and expected labels."""
    if case in _runs:
        return _runs[case]
    pytest.importorskip("sglang")
    pytest.importorskip("prometheus_client")
    runtime_context = pytest.importorskip("sglang.srt.runtime_context")
    if not hasattr(runtime_context, "SpawnRanks"):  # the set-up does what 0.5.20+'s run_scheduler_process does
        pytest.skip("this SGLang release has no runtime_context.SpawnRanks (the scheduler set-up emulates 0.5.20+)")
    root = tmp_path_factory.mktemp(case)
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe",
                "hidden_size": 256,
                "intermediate_size": 512,
                "moe_intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "head_dim": 64,
                "num_hidden_layers": 2,
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "vocab_size": 1000,
                "max_position_embeddings": 4096,
                "torch_dtype": "bfloat16",
            }
        )
    )
    metrics_dir = root / "prometheus"
    metrics_dir.mkdir()
    spec = SCHEDULERS[case]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PROMETHEUS_"))}
    env.update(
        SCHEDULER=json.dumps({k: spec[k] for k in ("args", "world_rank", "dp_rank")}),
        MODEL_DIR=str(model),
        PORT=str(_free_port()),
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        HF_HUB_OFFLINE="1",
    )
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WORKER)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=str(root),
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, (proc.returncode, proc.stderr[-3000:])
    labels = {k: (str(model) if v == "<model>" else v) for k, v in spec["labels"].items()}
    _runs[case] = {
        "result": json.loads(line[len("RESULT ") :]),
        "stderr": proc.stderr,
        "samples": _samples(metrics_dir),
        "labels": labels,
        "log_prefix": spec["log_prefix"],
    }
    return _runs[case]


@pytest.fixture(params=sorted(SCHEDULERS))
def scheduler(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _scheduler(request.param, tmp_path_factory)


def _ours(run: dict[str, Any]) -> list[tuple[str, dict[str, str], float]]:
    return [s for s in run["samples"] if "moe_plugins" in s[0]]


@pytest.mark.sglang
def test_metric_names_outside_sglangs_namespace(scheduler):
    """The counters are ``sglang_moe_plugins_*``, never under SGLang's ``sglang:``; the names are METRIC_NAMES."""
    from sglang_moe_plugins.metrics import METRIC_NAMES

    assert METRIC_NAMES == NAMES
    names = {name for name, _, _ in _ours(scheduler)}
    assert names == {"sglang_moe_plugins_calls_total", "sglang_moe_plugins_delegations_total"}, names
    assert not any(name.startswith("sglang:") for name in names)


@pytest.mark.sglang
def test_series_carry_sglangs_labels(scheduler):
    """model_name, tp_rank, pp_rank, moe_ep_rank (and dp_rank with a DP controller) as SGLang published them for the
    process; no global torch.distributed ``rank``."""
    expected = scheduler["labels"]
    series = {(name, tuple(sorted(labels.items()))): value for name, labels, value in _ours(scheduler)}
    calls = [(labels, v) for name, labels, v in _ours(scheduler) if name == "sglang_moe_plugins_calls_total"]
    assert len(calls) == 1, series
    labels, value = calls[0]
    assert value == 3.0
    plugin = labels["plugin"]
    assert labels == {"op": "silu_mul_quant", "plugin": plugin, **expected}, labels
    delegated = (
        "sglang_moe_plugins_delegations_total",
        tuple(sorted({"op": "silu_mul_quant", "kind": "gemm1_alpha", **expected}.items())),
    )
    assert series.get(delegated) == 1.0, series


@pytest.mark.sglang
def test_series_join_sglangs_own_series(scheduler):
    """``on (model_name, tp_rank, pp_rank, moe_ep_rank[, dp_rank])`` matches SGLang's own series of the same process
    (``sglang:cuda_graph_passes_total``, written by SGLang's SchedulerMetricsCollector with its labels)."""
    theirs = [labels for name, labels, _ in scheduler["samples"] if name == "sglang:cuda_graph_passes_total"]
    assert len(theirs) == 1, scheduler["samples"]
    shared = [k for k in JOIN if k in theirs[0]]
    assert set(shared) >= {"model_name", "tp_rank", "pp_rank", "moe_ep_rank"}
    key = {k: theirs[0][k] for k in shared}
    for name, labels, _ in _ours(scheduler):
        assert {k: labels.get(k) for k in shared} == key, (name, labels, theirs[0])
        assert set(labels) - {"op", "plugin", "kind"} == set(shared), (name, labels, theirs[0])


@pytest.mark.sglang
def test_flush_inside_a_scoped_override_waits(scheduler):
    """A flush while SGLang's parallel context is overridden for a scope exports nothing (the process's own ranks are
    hidden); the next one exports with the published ranks."""
    result = scheduler["result"]
    assert result["scoped_flush"] is True and result["flush"] is True, result
    assert result["scoped_series"] == [], result
    assert set(result["series"]) == {"sglang_moe_plugins_calls_total", "sglang_moe_plugins_delegations_total"}


@pytest.mark.sglang
def test_log_lines_under_sglangs_prefix_carry_no_rank_label(scheduler):
    """Under SGLang's ``[time TPx EPy]`` prefix the package's lines add no ``[rank r/w]`` (torch.distributed is
    initialised, so before the fix they did)."""
    lines = [line for line in scheduler["stderr"].splitlines() if "sglang-moe-plugins" in line]
    assert lines, scheduler["stderr"][-3000:]
    assert not [line for line in lines if "[rank" in line], lines
    choice = [line for line in lines if "silu_mul_quant ->" in line]
    assert choice and all(scheduler["log_prefix"] + "sglang-moe-plugins: " in line for line in choice), lines


def test_no_sglang_labels_outside_sglang():
    """In a process where SGLang published nothing (this one), no SGLang label is made up."""
    from sglang_moe_plugins.counters import sglang_labels

    assert sglang_labels().labels == {}


def test_releases_without_a_runtime_context_read_the_groups(monkeypatch):
    """Before SGLang's runtime context, the ranks come from ``parallel_state``'s groups once they exist, and not while
    SGLang has patched them for a scope (a stand-in module: no such release is installed here)."""
    import types

    from sglang_moe_plugins.counters import sglang_labels

    state = types.SimpleNamespace(
        model_parallel_is_initialized=lambda: True,
        get_tensor_model_parallel_rank=lambda: 3,
        get_pipeline_model_parallel_rank=lambda: 0,
        get_moe_expert_parallel_rank=lambda: 1,
        _TP_STATE_PATCHED=False,
        _PP_STATE_PATCHED=False,
    )
    monkeypatch.delitem(sys.modules, "sglang.srt.runtime_context", raising=False)
    monkeypatch.setitem(sys.modules, "sglang.srt.distributed.parallel_state", state)
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", types.SimpleNamespace())  # no model name: left out
    found = sglang_labels()
    assert dict(found.labels) == {"tp_rank": "3", "pp_rank": "0", "moe_ep_rank": "1"} and not found.scoped
    state._TP_STATE_PATCHED = True
    assert sglang_labels().scoped and dict(sglang_labels().labels) == {}
    state.model_parallel_is_initialized = lambda: False
    assert dict(sglang_labels().labels) == {} and not sglang_labels().scoped
