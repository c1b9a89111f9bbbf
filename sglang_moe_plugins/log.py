"""The package's loggers: every line says whose it is, once, with SGLang's prefix or the package's rank label.

In an SGLang server process SGLang's own log format already names the rank (``[time DP1 PP1 TP2 EP2] ...``, set by
its scheduler once its ranks are published), so the package's lines carry nothing more. Elsewhere (a process of
one's own with torch.distributed initialised) :data:`RANK_FILTER` rewrites the ``sglang-moe-plugins:`` prefix to
``sglang-moe-plugins [rank R/W]:`` (or prepends ``[rank R/W]``), so that every rank's line says whose it is.

Each module takes its logger from :func:`get_logger`, which adds :data:`RANK_FILTER` to it. The filter runs only
for records that logger emits (never on a call's hot path: the package logs once per shape key or event).

:class:`LogOnce` is the package's one "log this once" mechanism: a thread-safe, capped set of keys.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable

from .counters import process_rank, sglang_labels

__all__ = ["LOG_ONCE_CAP", "LogOnce", "PREFIX", "RANK_FILTER", "get_logger", "rank_label"]

PREFIX = "sglang-moe-plugins"
#: Most keys a :class:`LogOnce` remembers unless told otherwise.
LOG_ONCE_CAP = 4096


_under_sglang = False


def _sglang_names_ranks() -> bool:
    """Whether SGLang has ranks for this process (its log prefix names them); once True, True for good."""
    global _under_sglang
    if not _under_sglang:
        found = sglang_labels()
        _under_sglang = found.scoped or any(name != "model_name" for name in found.labels)
    return _under_sglang


def rank_label() -> str:
    """``"[rank R/W]"`` when torch.distributed is initialised outside an SGLang server process (whose own log
    prefix names the ranks), else ``""``."""
    rank, world = process_rank()
    return "" if rank is None or _sglang_names_ranks() else f"[rank {rank}/{world}]"


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        label = rank_label()
        if label and not getattr(record, "_moe_rank", False):
            msg = record.msg
            if isinstance(msg, str) and msg.startswith(PREFIX):
                record.msg = f"{PREFIX} {label}{msg[len(PREFIX) :]}"
            else:
                record.msg = f"{label} {msg}"
            record._moe_rank = True  # a record passes each logger's filter once
        return True


RANK_FILTER = _RankFilter()


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with :data:`RANK_FILTER` (added once)."""
    logger = logging.getLogger(name)
    if RANK_FILTER not in logger.filters:
        logger.addFilter(RANK_FILTER)
    return logger


class LogOnce:
    """Thread-safe "first time?" over a capped set of keys: ``if once.first(key): logger.warning(...)``.

    Past the cap every new key counts as new (a message is repeated rather than lost, and memory stays
    bounded when keys change on every call).
    """

    __slots__ = ("_cap", "_lock", "_seen")

    def __init__(self, cap: int = LOG_ONCE_CAP) -> None:
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()
        self._cap = cap

    def first(self, key: Hashable) -> bool:
        """True the first time ``key`` is seen (and every time once the cap is reached), else False."""
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) < self._cap:
                self._seen.add(key)
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)
