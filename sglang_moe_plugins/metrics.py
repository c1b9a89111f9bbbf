"""The counters of :mod:`.counters` in SGLang's Prometheus endpoint (``--enable-metrics``).

SGLang's scheduler processes report their metrics through prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``, set by SGLang before it starts them): each process increments ordinary
``prometheus_client`` counters, which write to files in that directory, and the HTTP server's
``MultiProcessCollector`` adds them up. A custom collector in a worker process is never scraped. So
this module does what SGLang's own CPU monitor (``sglang/srt/observability/cpu_monitor.py``) does: a
daemon thread wakes every :data:`INTERVAL_S` seconds and adds each counter's increase since the last
flush to a prometheus ``Counter``; the hot path never touches prometheus_client. The last increase is
flushed at exit too.

Metrics (labels ``op``, ``plugin`` or ``kind``, and ``rank``: torch.distributed's rank, ``""`` when not
initialised):

- ``sglang:moe_plugins_calls_total{op, plugin, rank}``
- ``sglang:moe_plugins_fallbacks_total{op, plugin, rank}``
- ``sglang:moe_plugins_delegations_total{op, kind, rank}``
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from .counters import stats
from .log import get_logger

__all__ = ["INTERVAL_S", "METRIC_NAMES", "start_metrics_export", "flush_metrics", "metrics_enabled"]

logger = get_logger(__name__)

#: Seconds between two flushes of the counters into prometheus_client.
INTERVAL_S = 5.0
METRIC_NAMES = (
    "sglang:moe_plugins_calls_total",
    "sglang:moe_plugins_fallbacks_total",
    "sglang:moe_plugins_delegations_total",
)

_lock = threading.Lock()
_exporter: _Exporter | None = None


def metrics_enabled() -> bool:
    """Whether SGLang's metrics run in this process (prometheus_client's multiprocess mode is on)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class _Exporter:
    def __init__(self) -> None:
        from prometheus_client import Counter  # noqa: PLC0415 - only with --enable-metrics

        self.calls = Counter(
            METRIC_NAMES[0].removesuffix("_total"),
            "MoE kernel calls launched, per op and plugin",
            labelnames=["op", "plugin", "rank"],
        )
        self.fallbacks = Counter(
            METRIC_NAMES[1].removesuffix("_total"),
            "MoE calls on which the plugin failed and the next plugin ran the call",
            labelnames=["op", "plugin", "rank"],
        )
        self.delegations = Counter(
            METRIC_NAMES[2].removesuffix("_total"),
            "Hooked MoE calls handed to SGLang's own function, per op and kind",
            labelnames=["op", "kind", "rank"],
        )
        self._sent: dict[tuple[str, ...], int] = {}
        self._flush_lock = threading.Lock()

    def _add(self, metric: Any, key: tuple[str, ...], labels: dict[str, str], value: int) -> None:
        delta = value - self._sent.get(key, 0)
        if delta > 0:
            metric.labels(**labels).inc(delta)
            self._sent[key] = value

    def flush(self) -> None:
        with self._flush_lock:
            current = stats()
            rank = "" if current.rank is None else str(current.rank)
            for p in current.plugins:
                labels = {"op": p.op, "plugin": p.plugin, "rank": rank}
                self._add(self.calls, ("calls", p.op, p.plugin), labels, p.calls)
                self._add(self.fallbacks, ("fallbacks", p.op, p.plugin), labels, p.fallbacks)
            for op, kinds in current.delegations.items():
                for kind, value in kinds.items():
                    self._add(
                        self.delegations, ("delegations", op, kind), {"op": op, "kind": kind, "rank": rank}, value
                    )

    def run(self, interval: float) -> None:
        event = threading.Event()
        while not event.wait(interval):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - metrics must never take the server down
                logger.warning("sglang-moe-plugins: metrics flush failed: %s: %s", type(exc).__name__, exc)


def start_metrics_export(interval: float = INTERVAL_S) -> bool:
    """Start the flushing thread once per process when SGLang's metrics are on; True when it runs."""
    global _exporter
    if not metrics_enabled():
        return False
    with _lock:
        if _exporter is not None:
            return True
        try:
            exporter = _Exporter()
        except Exception as exc:  # noqa: BLE001 - prometheus_client missing or refusing: no metrics, say so
            logger.warning("sglang-moe-plugins: metrics not exported: %s: %s", type(exc).__name__, exc)
            return False
        _exporter = exporter
    threading.Thread(target=exporter.run, args=(interval,), name="sglang-moe-plugins-metrics", daemon=True).start()
    atexit.register(flush_metrics)
    logger.info(
        "sglang-moe-plugins: exporting %s through prometheus_client (multiprocess mode, every %.0f s)",
        ", ".join(METRIC_NAMES),
        interval,
    )
    return True


def flush_metrics() -> None:
    """Add the counters' increase since the last flush to the Prometheus counters now (no-op when off)."""
    exporter = _exporter
    if exporter is not None:
        exporter.flush()
