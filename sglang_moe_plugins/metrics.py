"""The counters of :mod:`.counters` in SGLang's Prometheus endpoint (``--enable-metrics``).

SGLang's scheduler processes report their metrics through prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``, set by SGLang before it starts them): each process increments ordinary
``prometheus_client`` counters, which write to files in that directory, and the HTTP server's
``MultiProcessCollector`` adds them up. A custom collector in a worker process is never scraped. So
this module does what SGLang's own CPU monitor (``sglang/srt/observability/cpu_monitor.py``) does: a
daemon thread wakes every :data:`INTERVAL_S` seconds and adds each counter's increase since the last
flush (from :func:`.counters.totals`, which ``reset_stats()`` never lowers) to a prometheus ``Counter``;
the hot path never touches prometheus_client. The last increase is flushed at exit too.

A counter never takes the process down. prometheus_client writes through ``mmap``: on a full filesystem a
page it cannot back kills the process with a bus error, so every flush first checks the directory and its
free space (:data:`MIN_FREE_BYTES`). A directory that is missing, not a directory, not writable or a
symlink loop stops the export with one WARNING; too little free space, or any error while writing, stops it
with one ERROR. Either way nothing is tried again in this process (the exit flush included) and ``stats()``
keeps counting.

Metrics, in a namespace of their own (SGLang's are ``sglang:*``):

- ``sglang_moe_plugins_calls_total{op, plugin, ...}``
- ``sglang_moe_plugins_fallbacks_total{op, plugin, ...}``
- ``sglang_moe_plugins_delegations_total{op, kind, ...}``

where ``...`` are the labels SGLang's own scheduler series carry for the process (:func:`.counters.sglang_labels`):
``model_name``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, and ``dp_rank`` with a data-parallel controller, so that
PromQL joins them ``on (model_name, tp_rank, ...)``. They are read once, at the first flush that has counts to
write (SGLang has published them by then: hooked calls run after its distributed init), and a label SGLang has not
set is left out. A flush while a scoped SGLang override (a draft model's narrowed groups) hides the process's own
ranks writes nothing; the counts wait for the next flush (at exit too: a process that never left such a scope at a
flush exports nothing, rather than series with another rank's labels).
"""

from __future__ import annotations

import atexit
import logging
import os
import stat
import threading
from typing import Any

from .counters import sglang_labels, totals
from .log import get_logger

__all__ = ["INTERVAL_S", "METRIC_NAMES", "MIN_FREE_BYTES", "start_metrics_export", "flush_metrics", "metrics_enabled"]

logger = get_logger(__name__)

#: Seconds between two flushes of the counters into prometheus_client (read when the export starts).
INTERVAL_S = 5.0
#: The least free space (bytes) under ``PROMETHEUS_MULTIPROC_DIR`` for a flush. prometheus_client's files
#: start at 64 KiB, double when full and are written through ``mmap`` (a page the filesystem cannot back is
#: a bus error); a flush writes a few pages. 8 MiB covers that, and a doubling of files up to 8 MiB.
MIN_FREE_BYTES = 8 << 20
METRIC_NAMES = (
    "sglang_moe_plugins_calls_total",
    "sglang_moe_plugins_fallbacks_total",
    "sglang_moe_plugins_delegations_total",
)
#: ``kind of counter -> (help text, label of its name)``, in the order of :data:`METRIC_NAMES`.
_METRICS = {
    "calls": ("MoE kernel calls launched, per op and plugin", "plugin"),
    "fallbacks": ("MoE calls on which the plugin failed and the next plugin ran the call", "plugin"),
    "delegations": ("Hooked MoE calls handed to SGLang's own function, per op and kind", "kind"),
}
_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

_lock = threading.Lock()
_exporter: _Exporter | None = None


def metrics_enabled() -> bool:
    """Whether SGLang's metrics run in this process (prometheus_client's multiprocess mode is on)."""
    return bool(os.environ.get(_DIR_VARIABLE))


def _directory_problem(path: str) -> str | None:
    """Why prometheus_client cannot create its files in ``path`` (None when it can)."""
    try:
        found = os.stat(path)  # follows symlinks: a missing target or a loop raises here
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    if not stat.S_ISDIR(found.st_mode):
        return "not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable"
    return None


class _Exporter:
    def __init__(self) -> None:
        from prometheus_client import Counter  # noqa: PLC0415 - only with --enable-metrics

        self._counter_type = Counter
        #: ``kind -> (prometheus Counter, label of its name)``, made at the first flush with counts (the labels known)
        self.metrics: dict[str, tuple[Any, str]] = {}
        #: SGLang's labels of this process, fixed with the counters.
        self.labels: dict[str, str] = {}
        self._sent: dict[tuple[str, str, str], int] = {}
        self._flush_lock = threading.Lock()
        self.stopped = False

    def _make(self) -> bool:
        """Make the counters with SGLang's labels of this process; False while a scoped override hides them."""
        found = sglang_labels()
        if found.scoped:
            return False
        self.labels = dict(found.labels)
        for (kind, (text, name_label)), name in zip(_METRICS.items(), METRIC_NAMES, strict=True):
            labelnames = ["op", name_label, *self.labels]
            self.metrics[kind] = (
                self._counter_type(name.removesuffix("_total"), text, labelnames=labelnames),
                name_label,
            )
        logger.info(
            "sglang-moe-plugins: metrics labelled %s",
            ", ".join(f"{k}={v!r}" for k, v in self.labels.items()) or "op and plugin/kind only (no SGLang labels)",
        )
        return True

    def _stop(self, level: int, message: str, *args: Any) -> None:
        self.stopped = True
        logger.log(
            level,
            "sglang-moe-plugins: " + message + "; not tried again in this process (stats() keeps counting)",
            *args,
        )

    def _write(self) -> None:
        # totals never go down: a reset_stats() leaves the Prometheus counters rising
        rising = [(key, value) for key, value in totals().items() if value > self._sent.get(key, 0)]
        if not rising or (not self.metrics and not self._make()):
            return  # nothing to write, or SGLang's labels hidden by a scope for now: the counts wait
        for key, value in rising:
            kind, op, name = key
            metric, name_label = self.metrics[kind]
            metric.labels(op=op, **{name_label: name}, **self.labels).inc(value - self._sent.get(key, 0))
            self._sent[key] = value

    def flush(self) -> bool:
        """Write the increase since the last flush; False (and no more tries) once the export has stopped."""
        with self._flush_lock:
            if self.stopped:
                return False
            path = os.environ.get(_DIR_VARIABLE, "")
            problem = _directory_problem(path)
            if problem is not None:
                self._stop(logging.WARNING, "metrics not exported: %s=%r: %s", _DIR_VARIABLE, path, problem)
                return False
            try:
                found = os.statvfs(path)
                free = found.f_bavail * found.f_frsize
                if free < MIN_FREE_BYTES:
                    self._stop(
                        logging.ERROR,
                        "metrics export stopped: %.1f MiB free under %s=%r, below the %d MiB a flush needs "
                        "(prometheus_client writes through mmap: a full disk is a bus error)",
                        free / (1 << 20),
                        _DIR_VARIABLE,
                        path,
                        MIN_FREE_BYTES >> 20,
                    )
                    return False
                self._write()
            except Exception as exc:  # noqa: BLE001 - a counter must never take the server down
                self._stop(
                    logging.ERROR,
                    "metrics export stopped: writing under %s=%r failed: %s: %s",
                    _DIR_VARIABLE,
                    path,
                    type(exc).__name__,
                    exc,
                )
                return False
            return True

    def run(self, interval: float) -> None:
        event = threading.Event()
        while not event.wait(interval) and self.flush():
            pass


def start_metrics_export(interval: float | None = None) -> bool:
    """Start the flushing thread once per process when SGLang's metrics are on (every ``interval`` seconds,
    :data:`INTERVAL_S` by default); True when it runs."""
    global _exporter
    if not metrics_enabled():
        return False
    seconds = INTERVAL_S if interval is None else interval
    with _lock:
        if _exporter is not None:
            return True
        try:
            exporter = _Exporter()
        except Exception as exc:  # noqa: BLE001 - prometheus_client missing or refusing: no metrics, say so
            logger.warning("sglang-moe-plugins: metrics not exported: %s: %s", type(exc).__name__, exc)
            return False
        _exporter = exporter
    threading.Thread(target=exporter.run, args=(seconds,), name="sglang-moe-plugins-metrics", daemon=True).start()
    atexit.register(flush_metrics)
    logger.info(
        "sglang-moe-plugins: exporting %s through prometheus_client (multiprocess mode, every %g s)",
        ", ".join(METRIC_NAMES),
        seconds,
    )
    return True


def flush_metrics() -> bool:
    """Add the counters' increase since the last flush to the Prometheus counters now; False when the export
    is off or has stopped (never raises: a failure stops the export with one log line, see the module doc)."""
    exporter = _exporter
    return exporter is not None and exporter.flush()
