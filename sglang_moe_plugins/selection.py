"""Selection: the first enabled plugin, by descending priority, whose ``supports`` says yes.

Each (op, shape, config) key is decided once (thread-safe), cached and logged once at INFO, with the
reason of every plugin not chosen. At run time a plugin that raises, or returns outputs that do not
match the op's contract, is logged once with the traceback, remembered as failed for that key, and
the next plugin runs; with ``strict`` the error is re-raised instead. During CUDA graph capture a
failure is re-raised and not remembered (a fallback cannot be captured after a failed attempt).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from typing import Any, Hashable

import torch

from .contract import Support
from .errors import InvalidArgumentError, MoEPluginsError, NoPluginAvailableError, OutputValidationError
from .ops import get_op
from .registry import PluginRecord, Registry

__all__ = ["Candidate", "Selection", "Selector", "Verdict"]

logger = logging.getLogger(__name__)


class Verdict:
    """Values of :attr:`Candidate.verdict`."""

    CHOSEN = "chosen"
    UNSUPPORTED = "unsupported"
    OUTRANKED = "outranked"
    DISABLED = "disabled"
    NOT_FORCED = "not forced"
    FAILED = "failed"
    ERROR = "error"


@dataclass(frozen=True)
class Candidate:
    """One plugin's part in a selection: the verdict and the human-readable reason."""

    name: str
    priority: int
    verdict: str
    reason: str


@dataclass(frozen=True)
class Selection:
    """The outcome of selecting a plugin for one key. ``chosen`` is None when nothing fits."""

    op: str
    shape: Any
    config: Any
    chosen: PluginRecord | None
    candidates: tuple[Candidate, ...]

    @property
    def plugin(self) -> Any:
        return None if self.chosen is None else self.chosen.plugin

    def candidate(self, name: str) -> Candidate:
        for cand in self.candidates:
            if cand.name == name:
                return cand
        raise KeyError(f"plugin {name!r} is not a candidate of op {self.op!r}")

    def key_description(self) -> str:
        return f"{_describe(self.shape)} [{_describe(self.config)}]"

    def explain(self) -> str:
        """Multi-line text: what was chosen and why each other plugin was not."""
        head = f"{self.op} {self.key_description()}: "
        head += f"chose {self.chosen.name!r}" if self.chosen else "NO plugin supports this call"
        lines = [head]
        for cand in self.candidates:
            lines.append(f"  {'*' if cand.verdict == Verdict.CHOSEN else '-'} {cand.name} (priority {cand.priority}) {cand.verdict}: {cand.reason}")
        return "\n".join(lines)


def _describe(value: Any) -> str:
    describe = getattr(value, "describe", None)
    return describe() if callable(describe) else repr(value)


def _as_support(answer: Any, plugin: str) -> Support:
    if isinstance(answer, Support):
        return answer
    reason = getattr(answer, "reason", None)
    if isinstance(reason, str) and reason:
        return Support(bool(answer), reason)
    raise TypeError(f"plugin {plugin!r}: supports() returned {answer!r}; it must return sglang_moe_plugins.Support")


def _inputs_device(inputs: Any) -> torch.device:
    device = getattr(inputs, "device", None)
    if isinstance(device, torch.device):
        return device
    for field in dataclasses.fields(inputs):
        value = getattr(inputs, field.name)
        if isinstance(value, torch.Tensor):
            return value.device
    raise TypeError(f"cannot tell the device of {type(inputs).__name__}: it holds no tensor")


def _capturing(inputs: Any) -> bool:
    """Whether the call's CUDA stream is being captured into a graph (False off CUDA)."""
    try:
        device = _inputs_device(inputs)
    except TypeError:
        return False
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class Selector:
    """Selects and runs plugins of a :class:`Registry`. Safe to share between threads."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self._lock = threading.RLock()
        self._cache: dict[Hashable, Selection] = {}
        self._failed: dict[Hashable, dict[str, str]] = {}
        self._logged_errors: set[tuple[Hashable, str]] = set()
        self.decisions = 0  # how many keys were decided (not served from cache); for tests and stats

    @property
    def strict(self) -> bool:
        return self.registry.config.strict

    # -- selection ----------------------------------------------------------------------------
    def explain(self, op: str, shape: Any, config: Any) -> Selection:
        """The selection for this key, with a reason for every plugin; never raises for 'none fits'."""
        key = (op, shape, config)
        with self._lock:
            selection = self._cache.get(key)
            if selection is None:
                selection = self._decide(op, shape, config, self._failed.get(key, {}))
                self._cache[key] = selection
                self.decisions += 1
                self._log(selection)
            return selection

    def select(self, op: str, shape: Any, config: Any) -> Selection:
        """Like :meth:`explain`, but raises NoPluginAvailableError when no plugin fits."""
        selection = self.explain(op, shape, config)
        if selection.chosen is None:
            forced = self.registry.config.force.get(op)
            hint = f"(force.{op} = {forced!r} is set in the configuration)" if forced else ""
            rejections = [(c.name, f"{c.verdict}: {c.reason}") for c in selection.candidates]
            raise NoPluginAvailableError(op, selection.key_description(), rejections, hint)
        return selection

    def _decide(self, op: str, shape: Any, config: Any, failed: dict[str, str]) -> Selection:
        get_op(op)  # KeyError listing the known ops
        forced = self.registry.config.force.get(op)
        candidates: list[Candidate] = []
        chosen: PluginRecord | None = None
        for record in self.registry.records(op):
            if forced is not None and record.name != forced:
                candidates.append(Candidate(record.name, record.priority, Verdict.NOT_FORCED, f"force.{op} = {forced!r}"))
                continue
            if not record.enabled:
                candidates.append(Candidate(record.name, record.priority, Verdict.DISABLED, record.status))
                continue
            if record.name in failed:
                candidates.append(Candidate(record.name, record.priority, Verdict.FAILED, failed[record.name]))
                continue
            try:
                support = _as_support(record.plugin.supports(shape, config), record.name)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not take selection down
                if self.strict:
                    raise
                self._log_error_once((op, shape, config), record.name, f"plugin {record.name!r}: supports() raised", exc)
                candidates.append(Candidate(record.name, record.priority, Verdict.ERROR, f"supports() raised {type(exc).__name__}: {exc}"))
                continue
            if not support:
                candidates.append(Candidate(record.name, record.priority, Verdict.UNSUPPORTED, support.reason))
            elif chosen is None:
                chosen = record
                candidates.append(Candidate(record.name, record.priority, Verdict.CHOSEN, support.reason))
            else:
                candidates.append(
                    Candidate(record.name, record.priority, Verdict.OUTRANKED, f"supported, but {chosen.name!r} (priority {chosen.priority}) comes first")
                )
        return Selection(op, shape, config, chosen, tuple(candidates))

    def _log(self, selection: Selection) -> None:
        if selection.chosen is None:
            logger.warning("sglang-moe-plugins: %s", selection.explain())
            return
        others = "; ".join(f"{c.name}: {c.verdict} ({c.reason})" for c in selection.candidates if c.verdict != Verdict.CHOSEN)
        logger.info(
            "sglang-moe-plugins: %s %s -> %s (%s)%s",
            selection.op,
            selection.key_description(),
            selection.chosen.name,
            selection.candidate(selection.chosen.name).reason,
            f"; not chosen: {others}" if others else "",
        )

    def _log_error_once(self, key: Hashable, plugin: str, message: str, exc: BaseException) -> None:
        with self._lock:  # several threads may fail on the same key at once: one line
            if (key, plugin) in self._logged_errors:
                return
            self._logged_errors.add((key, plugin))
        logger.error("sglang-moe-plugins: %s: %s: %s", message, type(exc).__name__, exc, exc_info=exc)

    # -- running ------------------------------------------------------------------------------
    def dispatch(self, op: str, inputs: Any, shape: Any, config: Any, outputs: Any = None) -> Any:
        """Select and run; on a plugin failure, fall back to the next one (unless strict or forced)."""
        spec = get_op(op)
        key = (op, shape, config)
        if outputs is None:
            outputs = spec.allocate_outputs(shape, config, _inputs_device(inputs))
        else:
            # The caller's outputs are checked before any plugin runs: a wrong buffer is the caller's
            # error and must not be counted as a plugin failure (which would exclude the plugin).
            try:
                spec.validate_outputs(outputs, shape, config)
            except OutputValidationError as exc:
                raise InvalidArgumentError(
                    op, "outputs", type(outputs).__name__, f"buffers as the op's allocate_outputs() makes them ({exc})"
                ) from None
        while True:
            record = self.select(op, shape, config).chosen
            try:
                returned = record.plugin.run(inputs, outputs, shape, config)
                result = outputs if returned is None else returned
                spec.validate_outputs(result, shape, config, record.name)
                return result
            except Exception as exc:  # noqa: BLE001 - fall back to the next plugin
                if self.strict or self.registry.config.force.get(op) == record.name:
                    raise
                if _capturing(inputs):
                    # Inside CUDA graph capture a fallback would be recorded into the graph after a
                    # failed attempt, and a failure caused by capture must not exclude the plugin from
                    # eager calls: re-raise, remember nothing.
                    self._log_error_once(
                        ("cuda graph capture", key), record.name,
                        f"plugin {record.name!r} failed on {op} during CUDA graph capture; no fallback inside capture "
                        "(select before capturing: run the call once eagerly)", exc,
                    )
                    raise
                self.mark_failed(key, record.name, exc)

    def mark_failed(self, key: Hashable, plugin: str, exc: BaseException) -> None:
        """Exclude ``plugin`` for ``key`` from now on (logged once with the traceback)."""
        reason = f"raised {type(exc).__name__} at run time: {exc}"
        if isinstance(exc, MoEPluginsError):
            reason = f"{type(exc).__name__}: {exc}"
        op = key[0] if isinstance(key, tuple) and key else "?"
        with self._lock:
            failed = self._failed.setdefault(key, {})
            if plugin in failed:  # another thread recorded this failure already; keep its new selection
                return
            failed[plugin] = reason
            self._cache.pop(key, None)
        self._log_error_once(key, plugin, f"plugin {plugin!r} failed on {op}; falling back to the next plugin", exc)

    def failed_plugins(self) -> dict[Hashable, dict[str, str]]:
        with self._lock:
            return {k: dict(v) for k, v in self._failed.items()}

    def cache_info(self) -> dict[str, int]:
        with self._lock:
            return {"keys": len(self._cache), "decisions": self.decisions, "failed_keys": len(self._failed)}
