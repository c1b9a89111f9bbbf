"""A stand-in for ``sglang_moe_plugins.log.LogOnce`` (same interface) until that class lands in log.py;
then every import of this module becomes ``from ...log import LogOnce`` and this module goes."""

from __future__ import annotations

import threading
from typing import Hashable

__all__ = ["LogOnce"]


class LogOnce:
    """Thread-safe "first time?" over a capped set of keys: ``if once.first(key): logger.warning(...)``.
    Past the cap every new key counts as new (a message is repeated rather than lost)."""

    __slots__ = ("_seen", "_lock", "_cap")

    def __init__(self, cap: int = 4096) -> None:
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
