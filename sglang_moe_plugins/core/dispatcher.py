"""The dispatcher: :class:`Selector` decides, binds and runs plugins, and applies the failure policy.

Each (op, shape, config) key is decided once (:func:`.decide.decide`; thread-safe), cached and logged
once at INFO (the reason of every plugin not chosen at DEBUG). :meth:`Selector.bind` then turns the
choice into a :class:`~.bound.BoundOp`: the plugin, the op's output allocator for the key and the
plugin's launch (``prepare(shape, config)`` when it has one, else ``run``), all worked out once per key.
A call of a bound op allocates, launches and, on the first call of the key (every call under ``strict``
or ``debug``), checks the outputs. The selector is the one cache of bound ops: by key, and by a caller's
own key of raw call arguments (:attr:`Selector.call_cache`, filled by :meth:`Selector.remember` and
:meth:`Selector.bind_and_call`; the SGLang hooks use it).

Failures at run time (docs/reliability.md): a plugin that raises (``SystemExit`` included; not
``KeyboardInterrupt``), or returns outputs that do not match the op's contract (a result of another type
than the op's outputs, or returned outputs on another device than the inputs, is checked on every call), is
logged once with the traceback, remembered as failed for that key, and the next plugin runs. The error
is re-raised instead, and nothing is remembered, when ``strict`` is set, when the plugin is forced,
when the op is collective (every rank must run the same kernel: no per-rank fallback), and inside CUDA
graph capture (a fallback cannot be captured after a failed attempt). When the plugin may have written
an input the host marked writable (``writes_inputs``, trusted as :mod:`.bound` says), the call raises too
(the next plugin would read damaged data), and the plugin is remembered as failed, so the key's later calls
run the next plugin.

Every cache is capped at :data:`CACHE_CAP` keys (one WARNING when a cap is reached): past it, calls
are still selected and bound, without being cached, so that shapes that change on every call cannot
grow memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, cast

from ..counters import counter
from ..errors import MoEPluginsError, NoPluginAvailableError
from ..lazy import lazy_module
from ..log import LogOnce, get_logger
from ..ops import get_op
from .bound import (
    FAILED_THEN,
    PASS_THROUGH,
    BoundOp,
    Distrusted,
    _capturing,
    _inputs_device,
    _wrong_result,
    as_plugin_error,
    check_given_outputs,
    check_returned_device,
    make_bound,
    maybe_written,
    snapshot_writes,
    written_note,
)
from .decide import HOST_FUNCTION, Candidate, HostFunction, Selection, Verdict, decide, info_line, reasons_line
from .registry import PluginRecord, Registry

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = ["BoundOp", "CACHE_CAP", "Candidate", "HOST_FUNCTION", "Selection", "Selector", "Verdict"]

logger = get_logger(__name__)
#: Most keys kept by each cache of a selector (selections, bound ops, the hooks' argument keys).
CACHE_CAP = 4096


class Selector:
    """Selects, binds and runs plugins of a :class:`Registry`. Safe to share between threads."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self._lock = threading.RLock()
        self._cache: dict[Hashable, Selection] = {}
        self._bound: dict[Hashable, BoundOp] = {}
        #: Bound ops by a caller's own key of raw call arguments (the SGLang hooks); see :meth:`remember`. A key
        #: that SGLang's own function serves holds HOST_FUNCTION (:meth:`remember_host`).
        self.call_cache: dict[Hashable, BoundOp | HostFunction] = {}
        self._failed: dict[Hashable, dict[str, str]] = {}
        self._distrusted = Distrusted()  # plugins seen writing an input their writes_inputs leaves out
        self._errors_logged = LogOnce()
        self._caps_logged = LogOnce()
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
                self.decisions += 1
                if self._fits("selections", self._cache):
                    self._cache[key] = selection
                    self._log(selection)
            return selection

    def select(self, op: str, shape: Any, config: Any) -> Selection:
        """Like :meth:`explain`, but raises NoPluginAvailableError when no plugin fits (naming the forced
        plugin and its reason when the op is forced)."""
        selection = self.explain(op, shape, config)
        if selection.chosen is None:
            forced = self.registry.config.force.get(op)
            rejections = [(c.name, f"{c.verdict}: {c.reason}") for c in selection.candidates]
            if forced is not None:
                rejections = [(c.name, f"{c.verdict}: {c.reason}") for c in selection.candidates if c.name == forced]
            withheld = forced is None and any(c.verdict == Verdict.WITHHELD for c in selection.candidates)
            raise NoPluginAvailableError(
                op, selection.key_description(), rejections, forced=forced, to_host=withheld and not self.strict
            )
        return selection

    def _fits(self, what: str, cache: dict[Any, Any]) -> bool:
        """Whether ``cache`` may take one more key; logs once per cache when the cap is reached."""
        if len(cache) < CACHE_CAP:
            return True
        if self._caps_logged.first(what):
            logger.warning(
                "sglang-moe-plugins: %d %s cached, the cap; new keys are selected and bound on every call without "
                "being cached (and without their INFO line). Do the call shapes change on every call?",
                CACHE_CAP,
                what,
            )
        return False

    def _decide(self, op: str, shape: Any, config: Any, failed: dict[str, str]) -> Selection:
        collective = get_op(op).collective  # KeyError listing the known ops
        config_ = self.registry.config
        key = (op, shape, config)

        def on_error(plugin: str, exc: Exception) -> None:
            self._log_error_once(key, plugin, f"plugin {plugin!r}: supports() raised", exc)

        return decide(
            op,
            self.registry.records(op),
            config_.priority_rules,
            config_.force.get(op),
            failed,
            shape,
            config,
            strict=config_.strict,
            collective=collective,
            on_error=on_error,
            reference_on_gpu=config_.reference_on_gpu,
        )

    def _log(self, selection: Selection) -> None:
        if selection.chosen is None:
            logger.warning("sglang-moe-plugins: %s", selection.explain())
            return
        # INFO: the choice first, one short line per key (under 160 characters); the reasons at DEBUG
        # (``explain`` gives them too).
        logger.info("%s", info_line(selection))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s", reasons_line(selection))

    def _log_error_once(self, key: Hashable, plugin: str, message: str, exc: BaseException) -> None:
        if self._errors_logged.first((key, plugin)):  # several threads may fail on the same key at once: one line
            logger.error("sglang-moe-plugins: %s: %s: %s", message, type(exc).__name__, exc, exc_info=exc)

    # -- binding ------------------------------------------------------------------------------
    def bind(self, op: str, shape: Any, config: Any) -> BoundOp:
        """The op bound for this key: plugin, output allocator, launch. Cached per key.

        Raises NoPluginAvailableError when no plugin fits. A ``prepare`` that raises is a run-time
        failure of its plugin (the policy of :meth:`call`).
        """
        key = (op, shape, config)
        bound = self._bound.get(key)
        if bound is not None:
            return bound
        with self._lock:
            while True:
                bound = self._bound.get(key)
                if bound is not None:
                    return bound
                record = cast(PluginRecord, self.select(op, shape, config).chosen)  # select() raises when none
                try:
                    bound = self._make_bound(op, shape, config, record)
                except PASS_THROUGH:
                    raise
                except BaseException as exc:  # noqa: BLE001 - the failure policy decides (SystemExit included)
                    error = as_plugin_error(exc, record.name, op, "prepare")
                    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
                    self._on_failure(
                        key, record.name, error, capturing=capturing, collective=get_op(op).collective, stage="prepare"
                    )
                    counter("fallbacks", op, record.name).hit()
                    continue
                if self._fits("bound ops", self._bound):
                    self._bound[key] = bound
                return bound

    def _make_bound(self, op: str, shape: Any, config: Any, record: PluginRecord) -> BoundOp:
        every_call = bool(self.registry.config.strict or self.registry.config.debug)  # check every call's outputs
        return make_bound(get_op(op), record, shape, config, every_call, counter("calls", op, record.name).hit)

    def remember(self, key: Hashable, bound: BoundOp) -> None:
        """Keep ``bound`` under a caller's own ``key`` (e.g. the raw arguments of a hooked call), once its
        outputs were checked. The cache is dropped whenever a plugin is marked failed."""
        with self._lock:  # a plugin marked failed meanwhile has dropped its bound op: keep nothing stale
            current = self._bound.get((bound.op, bound.shape, bound.config)) is bound
            if current and bound.checked and self._fits("hooked-call keys", self.call_cache):
                self.call_cache[key] = bound

    def remember_host(self, key: Hashable) -> None:
        """Keep under a caller's ``key`` that SGLang's own function serves its calls (:data:`HOST_FUNCTION`)."""
        with self._lock:
            if self._fits("hooked-call keys", self.call_cache):
                self.call_cache[key] = HOST_FUNCTION

    def bind_and_call(
        self,
        op: str,
        shape: Any,
        config: Any,
        inputs: Any,
        outputs: Any = None,
        device: torch.device | None = None,
        *,
        remember: Hashable | None = None,
    ) -> Any:
        """``call(bind(op, shape, config), inputs, outputs, device)``, for a caller's first call of a key.

        With ``remember``: once the call returns, keep the key's bound op under that key of the caller
        (:meth:`remember`), i.e. the one that ran, after any fallback, and only when it is cached (a
        key past the cache's cap is bound again on its next call) and its outputs were checked."""
        outputs = self.call(self.bind(op, shape, config), inputs, outputs, device)
        if remember is not None:
            with self._lock:
                bound = self._bound.get((op, shape, config))
                if bound is not None and bound.checked and self._fits("hooked-call keys", self.call_cache):
                    self.call_cache[remember] = bound
        return outputs

    # -- running ------------------------------------------------------------------------------
    def call(self, bound: BoundOp, inputs: Any, outputs: Any = None, device: torch.device | None = None) -> Any:
        """Run a bound op and return its outputs: allocate them (unless given), launch, and check them on
        the key's first call (every call under strict or debug). On a failure, the policy in the module
        docstring: re-raise, or mark the plugin failed for the key and run the next one."""
        given = outputs
        bound.hit()  # stats(): calls per (op, plugin); one C call
        if outputs is None:
            outputs = bound.allocate(device if device is not None else _inputs_device(inputs))
        if bound._first.pending or bound.check_every_call:
            return self._checked_call(bound, inputs, outputs, given, device)
        try:  # the warm path
            returned = bound.launch(inputs, outputs)
            if returned is not None:
                if type(returned) is not bound.output_type:  # every call: one identity test
                    raise _wrong_result(bound, returned)
                if returned is not outputs:  # the plugin's own outputs: their device, on every such call
                    check_returned_device(bound, returned, inputs)
                outputs = returned
            return outputs
        except PASS_THROUGH:
            raise
        except BaseException as exc:  # noqa: BLE001 - the failure policy decides (SystemExit included)
            self._failed_call(bound, inputs, exc, None)
        return self.call(self.bind(bound.op, bound.shape, bound.config), inputs, given, device)

    def _checked_call(self, bound: BoundOp, inputs: Any, outputs: Any, given: Any, device: torch.device | None) -> Any:
        """:meth:`call`, its outputs checked (a key's first call, or strict/debug); on a key's first call also a
        third party's promise to leave writable inputs alone."""
        first = bound._first
        snapshot = None
        if first.pending and bound.writable_inputs and not bound.trusted_writes and not _capturing(inputs):
            snapshot = snapshot_writes(bound, inputs)
        try:
            returned = bound.launch(inputs, outputs)
            if returned is not None:
                if type(returned) is not bound.output_type:
                    raise _wrong_result(bound, returned)
                outputs = returned
            bound.validate(outputs, bound.shape, bound.config, bound.record.name, inputs=inputs)
        except PASS_THROUGH:
            raise
        except BaseException as exc:  # noqa: BLE001 - the failure policy decides (SystemExit included)
            self._failed_call(bound, inputs, exc, snapshot)
            return self.call(self.bind(bound.op, bound.shape, bound.config), inputs, given, device)
        if snapshot is not None and self._distrusted.seen(bound, snapshot, inputs) == ():
            first.writes_verified = True  # the declaration held on a call that marked inputs writable
        first.pending = False
        return outputs

    def _failed_call(self, bound: BoundOp, inputs: Any, exc: BaseException, snapshot: Any) -> None:
        """The failure policy for a failed launch or check of ``bound``: raises, or returns for a fallback."""
        seen = self._distrusted.seen(bound, snapshot, inputs, log=False)
        written, why = maybe_written(bound, inputs, seen, self._distrusted.get(bound.name))
        self._on_failure(
            (bound.op, bound.shape, bound.config),
            bound.name,
            as_plugin_error(exc, bound.name, bound.op, "run"),
            capturing=_capturing(inputs),
            collective=bound.collective,
            stage="run",
            written=written,
            why_written=why,
        )
        counter("fallbacks", bound.op, bound.name).hit()  # not re-raised: this call falls back

    def dispatch(self, op: str, inputs: Any, shape: Any, config: Any, outputs: Any = None) -> Any:
        """Select, bind and run; on a plugin failure, fall back to the next one (unless strict, forced,
        collective or capturing)."""
        if outputs is not None:  # the caller's error, before any plugin runs (no plugin is excluded for it)
            check_given_outputs(get_op(op), outputs, shape, config, inputs)
        return self.call(self.bind(op, shape, config), inputs, outputs)

    def _on_failure(
        self,
        key: Hashable,
        plugin: str,
        exc: Exception,
        *,
        capturing: bool,
        collective: bool,
        stage: str,
        written: tuple[str, ...] = (),
        why_written: str = "",
    ) -> None:
        """Re-raise ``exc`` (with a note naming the plugin), or mark ``plugin`` failed for ``key``.

        ``written``: inputs of the call the plugin may have modified (marked writable by the host), and
        ``why_written`` why its writes_inputs did not rule them out. The call then raises (the next plugin
        would read damaged data); the plugin is still marked failed, so that the key's later calls, with
        fresh inputs, run the next plugin."""
        op = key[0] if isinstance(key, tuple) and key else "?"
        why = None
        if collective:
            why = f"op {op!r} is collective: every rank must run the same kernel, so there is no per-rank fallback"
        elif self.strict:
            why = "strict = true"
        elif self.registry.config.force.get(op) == plugin:
            why = f"force.{op} = {plugin!r}"
        elif capturing:
            # Inside CUDA graph capture a fallback would be recorded into the graph after a failed
            # attempt, and a failure caused by capture must not exclude the plugin from eager calls.
            why = "inside CUDA graph capture (select before capturing: run the call once eagerly)"
            self._log_error_once(
                ("cuda graph capture", key),
                plugin,
                f"plugin {plugin!r} failed on {op} during CUDA graph capture; no fallback inside capture",
                exc,
            )
        if why is not None:
            exc.add_note(
                f"sglang-moe-plugins: raised by plugin {plugin!r} ({stage}) on op {op!r}; not falling back: {why}"
            )
            raise exc
        if written:
            exc.add_note(written_note(plugin, stage, op, written, why_written))
            self.mark_failed(key, plugin, exc, fallback=False)
            raise exc
        self.mark_failed(key, plugin, exc)

    def mark_failed(self, key: Hashable, plugin: str, exc: BaseException, fallback: bool = True) -> None:
        """Exclude ``plugin`` for ``key`` from now on (logged once with the traceback). ``fallback``:
        whether the failed call itself goes on with the next plugin (False: it raises)."""
        reason = f"raised {type(exc).__name__} at run time: {exc}"
        if isinstance(exc, MoEPluginsError):
            reason = f"{type(exc).__name__}: {exc}"
        op = key[0] if isinstance(key, tuple) and key else "?"
        with self._lock:
            if key not in self._failed and not self._fits("failed keys", self._failed):
                self._failed.clear()  # past the cap: forget old failures (each is found again, and logged once)
            failed = self._failed.setdefault(key, {})
            if plugin in failed:  # another thread recorded this failure already; keep its new selection
                return
            failed[plugin] = reason
            self._cache.pop(key, None)
            self._bound.pop(key, None)
            self.call_cache.clear()  # a failure is rare: drop every raw-argument key rather than search them
        self._log_error_once(key, plugin, f"plugin {plugin!r} failed on {op}; {FAILED_THEN[fallback]}", exc)

    def failed_plugins(self) -> dict[Hashable, dict[str, str]]:
        with self._lock:
            return {k: dict(v) for k, v in self._failed.items()}

    def cache_info(self) -> dict[str, int]:
        with self._lock:
            return {
                "keys": len(self._cache),
                "decisions": self.decisions,
                "failed_keys": len(self._failed),
                "bound": len(self._bound),
                "call_keys": len(self.call_cache),
            }
