"""Issue 30, findings 8, 9 and 10: the Prometheus export (``--enable-metrics``) and ``reset_stats()``.

8. A full filesystem under ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client writes through ``mmap``: a page it
   cannot back is a bus error) or any write error: the exporter checks the free space before each flush and stops
   with one ERROR line; hooked calls and ``stats()`` go on.
9. A missing, non-directory, unwritable or looping metrics directory: one WARNING, then no more tries, and no
   traceback at exit (the ``atexit`` flush).
10. ``reset_stats()`` zeroes the counters in place: a bound op's counter, held since its bind, keeps counting into
    ``stats()``, and the Prometheus counters keep rising (they are fed from totals that a reset never lowers).

Every case runs a fresh worker that goes through SGLang's real ``load_plugins()`` and hooked function (as
``tests/test_stats.py`` does), with the flush interval set to 0.05 s so that a run spans many flushes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_moe_plugins import Registry, Selector, UserConfig
from sglang_moe_plugins.counters import reset_stats, stats
from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.plugins.reference import ReferencePlugin

WORKER = """
    import json, logging, os, signal, sys, time, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    import sglang_moe_plugins
    import sglang_moe_plugins.metrics as metrics
    from sglang_moe_plugins.counters import reset_stats
    metrics.INTERVAL_S = 0.05  # many flushes in a short run
    if os.environ.get("FAKE_FULL"):  # the filesystem reports no free block (a full disk, without root)
        real_statvfs = os.statvfs
        def statvfs(path):
            st = real_statvfs(path)
            return os.statvfs_result((*st[:3], 0, 0, *st[5:]))
        os.statvfs = statvfs
    if os.environ.get("COUNTER_FILE_IS_DIR"):  # prometheus_client's own file cannot be opened: a real write error
        os.mkdir(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], f"counter_{os.getpid()}.db"))
    from sglang.srt.plugins import load_plugins
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    load_plugins()
    if os.environ.get("FSIZE_LIMIT"):  # no file may grow past 4 KiB: prometheus_client's 64 KiB file cannot be made
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    gateup = (torch.randn(2, 4, 512) + 0.5).to(torch.bfloat16)
    masked = torch.tensor([4, 1], dtype=torch.int32)

    def delegated():
        try:
            runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2, gemm1_alpha=1.5, gemm1_clamp_limit=7.0)
        except Exception:  # SGLang's own gpt-oss path has no CPU kernel: only the delegation matters here
            pass

    out = {}
    if os.environ.get("RESET"):
        for _ in range(3):
            runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
        delegated()
        metrics.flush_metrics()
        out["before"] = sglang_moe_plugins.stats().to_dict()
        reset_stats()
        out["reset"] = sglang_moe_plugins.stats().to_dict()
        for _ in range(2):
            runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)  # the bound op, held since its bind
        delegated()
        metrics.flush_metrics()
    else:
        for _ in range(4):  # 4 x 0.25 s: about twenty flush intervals
            for _ in range(3):
                runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
            time.sleep(0.25)
    out["after"] = sglang_moe_plugins.stats().to_dict()
    print("STATS " + json.dumps(out))
"""


def _worker(tmp_path: Path, metrics_dir: Path, **env: str) -> tuple[dict, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PROMETHEUS_"))}
    full.update(env, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WORKER)],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
        cwd=str(tmp_path),
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("STATS ")), None)
    assert proc.returncode == 0 and line, (proc.returncode, proc.stderr[-3000:])
    return json.loads(line[len("STATS ") :]), proc.stderr


def _package_lines(stderr: str, *levels: str) -> list[str]:
    """The package's own log lines at ``levels`` (logging.basicConfig's format: LEVEL:logger:message)."""
    return [
        line
        for line in stderr.splitlines()
        if line.partition(":")[0] in levels and line.partition(":")[2].startswith("sglang_moe_plugins")
    ]


def _calls(data: dict) -> int:
    return sum(p["calls"] for p in data["plugins"] if p["op"] == "silu_mul_quant")


def _samples(metrics_dir: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(metrics_dir))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name.startswith("sglang_moe_plugins_")
    }


def _bad_dir(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "prometheus"
    if kind == "file":
        path.write_text("not a directory")
    elif kind == "loop":
        path.symlink_to(path)  # a symlink to itself: ELOOP
    elif kind == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        path.mkdir(mode=0o555)
    return path  # "missing": nothing there


@pytest.mark.sglang
def test_good_directory_exports_without_warnings(tmp_path):
    """The baseline of the cases below: a writable directory, twenty flushes, no warning, every call exported."""
    pytest.importorskip("sglang")
    pytest.importorskip("prometheus_client")
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    data, stderr = _worker(tmp_path, metrics_dir)
    assert _calls(data["after"]) == 12
    assert _package_lines(stderr, "WARNING", "ERROR") == [] and "Traceback" not in stderr, stderr[-3000:]
    calls = [v for (name, _), v in _samples(metrics_dir).items() if name == "sglang_moe_plugins_calls_total"]
    assert calls == [12.0]


@pytest.mark.sglang
@pytest.mark.parametrize("kind", ["missing", "file", "loop", "read-only"])
def test_bad_metrics_directory_one_warning_then_silence(tmp_path, kind):
    """Finding 9: one WARNING naming the directory over twenty flush intervals, none at exit, no traceback; the
    hooked calls and stats() are unaffected."""
    pytest.importorskip("sglang")
    pytest.importorskip("prometheus_client")
    metrics_dir = _bad_dir(tmp_path, kind)
    data, stderr = _worker(tmp_path, metrics_dir)
    assert _calls(data["after"]) == 12
    lines = _package_lines(stderr, "WARNING", "ERROR", "CRITICAL")
    assert len(lines) == 1 and lines[0].startswith("WARNING:sglang_moe_plugins.metrics:"), stderr[-3000:]
    assert str(metrics_dir) in lines[0] and "not exported" in lines[0]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]


@pytest.mark.sglang
@pytest.mark.parametrize("fault", ["FAKE_FULL", "COUNTER_FILE_IS_DIR", "FSIZE_LIMIT"])
def test_full_filesystem_or_write_error_one_error_then_silence(tmp_path, fault):
    """Finding 8: no free space (os.statvfs reports none: nothing is written, so no mmap page can fault), or a
    real write error (prometheus_client's file is a directory; a file-size limit below its first 64 KiB): one
    ERROR line over twenty flush intervals, nothing at exit, no traceback; the hooked calls and stats() go on."""
    pytest.importorskip("sglang")
    pytest.importorskip("prometheus_client")
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    data, stderr = _worker(tmp_path, metrics_dir, **{fault: "1"})
    assert _calls(data["after"]) == 12
    lines = _package_lines(stderr, "WARNING", "ERROR", "CRITICAL")
    assert len(lines) == 1 and lines[0].startswith("ERROR:sglang_moe_plugins.metrics:"), stderr[-3000:]
    assert "stopped" in lines[0] and "stats()" in lines[0]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    if fault == "FAKE_FULL":
        assert "free" in lines[0]
        assert _samples(metrics_dir) == {}  # refused before writing anything


@pytest.mark.sglang
def test_reset_stats_keeps_counting_bound_ops_and_prometheus_monotonic(tmp_path):
    """Finding 10 through a real hooked call: 3 calls and a delegation, reset_stats(), 2 calls and a delegation
    on the op bound before the reset. stats() shows the 2 and the 1; Prometheus shows 5 and 2 (never lower)."""
    pytest.importorskip("sglang")
    pytest.importorskip("prometheus_client")
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    data, stderr = _worker(tmp_path, metrics_dir, RESET="1")
    assert _calls(data["before"]) == 3 and data["before"]["delegations"] == {"silu_mul_quant": {"gemm1_alpha": 1}}
    assert data["reset"]["plugins"] == [] and data["reset"]["delegations"] == {}
    assert _calls(data["after"]) == 2, data["after"]
    assert data["after"]["delegations"] == {"silu_mul_quant": {"gemm1_alpha": 1}}
    samples = _samples(metrics_dir)
    calls = [v for (name, _), v in samples.items() if name == "sglang_moe_plugins_calls_total"]
    assert calls == [5.0], samples
    delegated = ("sglang_moe_plugins_delegations_total", (("kind", "gemm1_alpha"), ("op", "silu_mul_quant")))
    assert samples[delegated] == 2.0
    assert _package_lines(stderr, "WARNING", "ERROR") == [], stderr[-3000:]


def _call(selector: Selector, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    gateup = (torch.randn(2, 4, 512, generator=gen) + 0.5).to(torch.bfloat16)
    masked = torch.tensor([4, 1], dtype=torch.int32)
    shape, config = smq.describe(gateup, masked, group_size=128, topk=2)
    selector.dispatch(smq.OP, smq.SiluMulQuantInputs(gateup, masked), shape, config)


def test_reset_stats_in_place_and_totals_monotonic():
    """Finding 10 in process: the selector's bound op keeps counting into stats() after a reset, and totals()
    (what the exporter reads) never goes down."""
    from sglang_moe_plugins.counters import totals  # new with the fix: imported here so the other tests run before it

    selector = Selector(Registry.from_plugins([ReferencePlugin()], UserConfig()))
    _call(selector, 0)
    key = ("calls", smq.OP, "reference")
    before = totals()[key]
    reset_stats()
    assert [p for p in stats().plugins if p.op == smq.OP] == []
    _call(selector, 1)
    _call(selector, 2)
    got = {(p.op, p.plugin): (p.calls, p.fallbacks) for p in stats().plugins}
    assert got == {(smq.OP, "reference"): (2, 0)}
    assert totals()[key] == before + 2
