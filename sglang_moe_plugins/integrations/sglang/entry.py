"""SGLang integration: the ``sglang.srt.plugins`` entry point ``moe_plugins``, its fail-closed hooks,
:func:`hook_status`, and what every hook shares (call counters, delegation to SGLang's function).

SGLang's ``load_plugins()`` calls :func:`register` once per process. It registers the server arguments and reads the
rollback switches there; the configuration, and the AROUND hooks through SGLang's ``HookRegistry`` on the host functions
of the version table below, come when SGLang first imports its MoE runner (:data:`RUNNER_MODULES`, :mod:`.deferred`), so
a process that never runs a MoE layer never imports that stack; where the runner is already imported, at once. Nothing
else is hooked:

- ``_varlen_deep_gemm_silu_mul_quant`` (op ``silu_mul_quant``),
- ``run_mega_routed_experts`` (op ``mega_moe``),
- ``DeepGemmRunnerCore._run_contiguous_gemm`` and ``silu_and_mul_contig_post_quant`` (op ``silu_mul_quant_contig``,
  the compact runner's activation step, :mod:`.contig`).

The version table and the rule for releases it does not list live in :mod:`.versions`: a known
release's targets are hooked when they resolve with the table's parameters; a newer release when all
its targets match the newest release's (one warning); otherwise one warning says why, ``doctor`` shows
it, and SGLang runs unchanged. The hooks themselves live in :mod:`.silu_mul_quant` and :mod:`.mega_moe`
(the table names them as ``module:function``).

Failure policy (docs/reliability.md): invalid arguments raise InvalidArgumentError, a call no plugin
can run (a forced plugin that cannot run it included) raises NoPluginAvailableError; only the calls
the ops do not model by design go to SGLang's original function, logged once per kind
(``gemm1_alpha`` / ``gemm1_clamp_limit``, ``masked_m=None``, MegaMoE calls the adapter leaves to SGLang).
An invalid configuration installs hooks that raise the configuration error (``on_config_error = "closed"``,
the default), or no hooks at all (``"stock"``); ops named in ``stock`` are never hooked, from every source that
can be read (the environment always, the file's key when the file parses; :func:`..config.stock_rollback`), and
``all`` or an unknown op there hooks nothing (an unknown op is one ERROR line, never failing closed).
"""

from __future__ import annotations

import contextvars
import copy
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from ... import api
from ...config import ON_CONFIG_ERROR_ENV, STOCK_ENV, config_error_policy, stock_rollback, unknown_env_warnings
from ...counters import EventCounter, counter
from ...errors import ConfigError, MoEPluginsError
from ...log import LogOnce, get_logger
from ...metrics import start_metrics_export
from .deferred import PendingHooks, when_imported
from .versions import TargetCheck, set_active_targets, version_case

__all__ = ["OPS", "CALLS", "register", "hook_status", "hooked_ops", "delegate", "delegate_withheld"]

logger = get_logger(__name__)


_state_lock = threading.Lock()
_last_checks: tuple[TargetCheck, ...] = ()
_registered = False
#: The modules whose first import hooks the targets, while none has been imported (:mod:`.deferred`), and the finder.
_pending: tuple[str, ...] = ()
_finder: PendingHooks | None = None
#: SGLang's modules that hold the hook targets of every op: the first of them to be imported triggers the hooking.
RUNNER_MODULES = ("sglang.srt.layers.moe.moe_runner.deep_gemm", "sglang.srt.layers.moe.mega_moe")
#: Ops left unhooked by ``stock`` (or, with ``on_config_error = stock`` and an invalid config, every op).
_stock: frozenset[str] = frozenset()
#: Ops whose hooks (not failing closed) are installed in this process.
_hooked: frozenset[str] = frozenset()
#: The ops this integration hooks.
OPS: tuple[str, ...] = ("silu_mul_quant", "mega_moe", "silu_mul_quant_contig")
#: How often each hook ran (:func:`hook_status`); the hooks bind ``CALLS[op].hit`` once, at import.
CALLS: dict[str, EventCounter] = {op: EventCounter() for op in OPS}
#: Kinds of unmodelled calls already logged (a fixed, small set: never argument values).
_delegations_logged = LogOnce(cap=64)


def register() -> None:
    """Entry point ``sglang.srt.plugins: moe_plugins``, run by SGLang's ``load_plugins()``. Never raises
    into SGLang's loader.

    A configuration that cannot be applied (an invalid file, key or value; under strict, a plugin that
    cannot be registered; any other error while the plugins are loaded) **fails closed** by default:
    the hooks are installed and every hooked call raises that error, so a server's warm-up stops at once
    with the cause. ``on_config_error = "stock"`` (or ``SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR=stock``)
    turns the package off instead: one ERROR line, no hooks, SGLang runs its own code. Ops named in
    ``stock`` (``SGLANG_MOE_PLUGINS_STOCK``, or the file's key) are not hooked at all, also with an invalid
    configuration; ``all``, or an op name that does not exist (one ERROR line), leaves every op to SGLang.
    """
    global _registered, _stock, _pending
    from .server_args import register_server_args

    register_server_args()  # the --moe-plugins-* server arguments, whatever the configuration says (never raises)

    for warning in unknown_env_warnings():
        logger.warning("sglang-moe-plugins: %s", warning)
    rollback = stock_rollback(OPS)  # honoured whatever else the configuration says: never worse than SGLang's code
    stock = rollback.ops
    every = stock >= frozenset(OPS)
    if rollback.errors:
        logger.error(
            "sglang-moe-plugins: stock names an op that does not exist, so every op is left to SGLang, as with %s=all: "
            "nothing is hooked and SGLang runs its own code (an unknown op in stock never fails closed): %s",
            STOCK_ENV,
            " / ".join(rollback.errors),
        )
    elif every:
        logger.warning("sglang-moe-plugins: every op is stock: nothing is hooked, SGLang runs its own code")
    with _state_lock:
        _stock = frozenset(stock)
        _registered = True
    # The configuration is applied, and the targets' modules (SGLang's MoE runner stack) imported, only in a process
    # that imports the runner itself (.deferred): the launcher, detokenizer and DP controller never do.
    deferred = not any(name in sys.modules for name in RUNNER_MODULES)
    global _finder
    if _finder is not None:  # a second register() in one process: its own reading of the switches replaces the first
        _finder.remove()
    # In load_plugins()'s context (its current plugin: SGLang attributes the hooks registered later to this package).
    context = contextvars.copy_context()

    def start(trigger: str) -> None:
        global _pending
        # Triggered inside load_plugins() (another plugin's function imported the runner): register only, SGLang's
        # apply_hooks() at the end of load_plugins() applies every plugin's hooks, later plugins' included.
        apply = deferred and not _inside_load_plugins()
        try:
            context.run(_start, rollback, deferred, apply, trigger)
        finally:
            with _state_lock:
                _pending = ()

    with _state_lock:
        _pending = RUNNER_MODULES  # before the finder is in place: a thread importing the runner now clears it
    _finder = when_imported(RUNNER_MODULES, start)
    if _finder is not None:
        logger.debug("sglang-moe-plugins: hooks deferred until SGLang imports %s", " or ".join(RUNNER_MODULES))


def _inside_load_plugins() -> bool:
    """Whether SGLang's ``load_plugins()`` is running a plugin's function in this context (its hooks not applied yet)."""
    try:
        from sglang.srt.plugins.hook_registry import _current_plugin_source
    except ImportError:  # a release without it: the hooks of load_plugins() were applied, as before
        return False
    return _current_plugin_source.get() is not None


def _start(rollback: Any, deferred: bool, apply: bool, trigger: str) -> None:
    """Apply the configuration (failing closed, or the package off, when it is invalid) and hook the targets."""
    global _stock, _pending
    stock = rollback.ops
    every = stock >= frozenset(OPS)
    failing = None
    config = None
    try:
        if not every:  # with every op stock nothing is hooked, and the plugins are not loaded
            config = api.get_selector().registry.config  # validates the user config now, not on the first MoE call
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - ConfigError, a strict registry, or anything else start-up raised
        what = (
            "invalid configuration: "
            if isinstance(exc, ConfigError)
            else ("" if isinstance(exc, MoEPluginsError) else f"start-up failed with {type(exc).__name__}: ")
        )
        if config_error_policy() == "stock":
            logger.error(
                "sglang-moe-plugins is NOT active (on_config_error = stock): %s%s; SGLang runs its own code", what, exc
            )
            with _state_lock:
                _stock = frozenset(OPS)
                _pending = ()
            return
        logger.error(
            "sglang-moe-plugins: %s%s; failing closed: the hooks are installed and every hooked call raises this %s "
            "(fix the configuration, or set %s=stock to let SGLang run its own code)",
            what,
            exc,
            type(exc).__name__,
            ON_CONFIG_ERROR_ENV,
        )
        failing = {op: _failing_hook(op, exc) for op in OPS}
    else:
        for note in config.notes if config is not None else ():
            logger.log(logging.WARNING if note.startswith("legacy") else logging.INFO, "sglang-moe-plugins: %s", note)
        for warning in config.warnings if config is not None else ():
            logger.warning("sglang-moe-plugins: %s", warning)
    _hook_targets(rollback, stock, failing, deferred, apply, trigger)


def _hook_targets(
    rollback: Any, stock: frozenset[str], failing: dict[str, Any] | None, deferred: bool, apply: bool, trigger: str
) -> None:
    """Check the release's targets and register the hooks with SGLang's HookRegistry (``deferred``: on the import of
    ``trigger``; ``apply``: applied at once, since SGLang's ``load_plugins()`` has already applied its hooks)."""
    global _last_checks, _hooked, _pending
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    every = stock >= frozenset(OPS)
    case = version_case()
    with _state_lock:
        _last_checks = case.checks
        _pending = ()
    if case.case != "known":  # one warning for the release as a whole (newer, refused, mismatch, unsupported)
        logger.warning("sglang-moe-plugins: %s", case.message)
    ready = []  # (check, target, hook) of every target that may be hooked
    for check, target in zip(case.checks, case.targets or (None,) * len(case.checks)):
        if not check.ok or target is None or not case.hooks:
            if case.case == "known":
                logger.warning("sglang-moe-plugins: not hooking %s: %s", check.path, check.reason)
            continue
        if check.op in stock:
            if every:
                continue  # said once above
            logger.log(
                logging.INFO if rollback.parity else logging.WARNING,  # parity asks for it: no warning
                "sglang-moe-plugins: not hooking %s: op %s is stock (SGLang's own function runs it)",
                check.path,
                check.op,
            )
            continue
        if failing is not None and target.hook.endswith(
            (":contig_kernel_hook", ":masked_guard_hook", ":masked_policy_hook")
        ):
            continue  # failing closed: the op's main hook raises first; these stay SGLang's own functions
        if rollback.parity and target.hook.endswith((":masked_guard_hook", ":masked_policy_hook")):
            logger.info("sglang-moe-plugins: not hooking %s: parity (SGLang's guard decides the layout)", check.path)
            continue
        try:
            hook = target.hook_function() if failing is None else failing[check.op]
        except Exception as exc:  # noqa: BLE001 - a hook that cannot be imported must never break start-up
            logger.warning(
                "sglang-moe-plugins: not hooking %s: its hook %s cannot be imported: %s: %s",
                check.path,
                target.hook,
                type(exc).__name__,
                exc,
            )
            continue
        if deferred and check.path in getattr(HookRegistry, "_patched", ()):
            # SGLang applies a target's hooks once: another plugin's, applied in load_plugins(), would leave this
            # package's hook registered but never applied. Say so, and leave the op to SGLang.
            logger.error(
                "sglang-moe-plugins: not hooking %s: another plugin's hooks were applied to it before SGLang imported "
                "its MoE runner, and SGLang applies a target's hooks only once; op %s runs SGLang's own code",
                check.path,
                check.op,
            )
            continue
        ready.append((check, target, hook))
    ready = _with_requirements(ready, failing is not None)
    hooked = []
    for check, target, hook in ready:
        HookRegistry.register(check.path, hook, HookType.AROUND)
        hooked.append(target)
        logger.debug("sglang-moe-plugins: hooked %s (op %s)", check.path, check.op)
    if apply:  # load_plugins() applied its hooks before the runner was imported
        failed = _apply_own(HookRegistry, {t.path for t in hooked}, {id(hook) for _, _, hook in ready})
        hooked = [t for t in hooked if t.path not in failed]  # only what runs: the start-up line, hooked_ops()
    set_active_targets(tuple(hooked))
    if failing is None:
        _hooked = frozenset(t.op for t in hooked)
    logger.info("%s", _startup_line(case.version, hooked, stock, rollback.parity, failing is not None))
    if hooked:
        start_metrics_export()  # only when SGLang runs with --enable-metrics (PROMETHEUS_MULTIPROC_DIR)


def _apply_own(registry: Any, paths: set[str], hooks: set[int]) -> set[str]:
    """Apply this package's deferred hooks, and no other plugin's: a target whose hooks are all this package's is
    applied here; one that also has another plugin's hooks, not applied yet, is left to SGLang's ``apply_hooks()``,
    which is then in progress (it imported the runner) and applies the target with every hook registered on it.
    Calling ``apply_hooks()`` from inside that one would apply the target it is resolving twice. Returns the paths
    whose hooks could not be applied (each logged)."""
    apply_target = getattr(registry, "_apply_target", None)
    patched = getattr(registry, "_patched", None)
    if apply_target is None or not isinstance(patched, set):  # a registry without these: its public call
        registry.apply_hooks()
        return set()
    failed = set()
    for path in sorted(paths):
        registered = registry._hooks.get(path, [])
        if path in patched or any(id(hook) not in hooks for _, hook, _ in registered):
            continue
        try:
            apply_target(path, registered)
            patched.add(path)
        except Exception:  # noqa: BLE001 - as SGLang's apply_hooks(): one target's failure never stops the others
            logger.exception("sglang-moe-plugins: applying the hook to %s failed; SGLang runs its own code", path)
            failed.add(path)
    return failed


def _startup_line(release: str | None, hooked: list[Any], stock: frozenset[str], parity: bool, failing: bool) -> str:
    """The process's one start-up line: the package version, the SGLang release, hooked and stock ops, the file."""
    from ..._version import __version__
    from ...config_file import config_path

    ops = sorted({t.op for t in hooked})
    state = "FAILING CLOSED (every hooked call raises the configuration error)" if failing else "hooked"
    return (
        f"sglang-moe-plugins {__version__} on SGLang {release or '(unknown)'}: {state}: {', '.join(ops) or 'none'}; "
        f"stock: {', '.join(sorted(stock)) or 'none'}{' (parity)' if parity else ''}; "
        f"config: {config_path(os.environ) or 'none'}"
    )


def _with_requirements(ready: list[tuple[Any, Any, Any]], failing: bool) -> list[tuple[Any, Any, Any]]:
    """``ready`` less every target whose required targets (``HookTarget.requires``) are not in it, repeated until
    nothing changes; one warning per target left out. Failing closed, only the ops' main hooks are installed and
    nothing is required."""
    if failing:
        return ready
    while True:
        paths = {check.path for check, _target, _hook in ready}
        kept = [item for item in ready if all(p in paths for p in item[1].requires)]
        for check, target, _hook in ready:
            if not all(p in paths for p in target.requires):
                missing = ", ".join(p for p in target.requires if p not in paths)
                logger.warning("sglang-moe-plugins: not hooking %s: it needs %s hooked too", check.path, missing)
        if len(kept) == len(ready):
            return kept
        ready = kept


def _failing_hook(op: str, error: BaseException) -> Callable[..., Any]:
    def failing(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        CALLS[op].hit()
        # A fresh copy per call: one shared instance would carry the last call's traceback (and its
        # tensors), and concurrent raises would overwrite each other's.
        try:
            fresh = copy.copy(error)
        except Exception:  # noqa: BLE001 - an exception that cannot be copied: raise the original
            fresh = error
        raise fresh.with_traceback(None) from None

    failing.__name__ = f"{op}_hook_failing_closed"
    return failing


def hooked_ops() -> frozenset[str]:
    """The ops whose hooks serve calls in this process (registered, not stock, not failing closed)."""
    return _hooked


def hook_status() -> dict[str, Any]:
    """What :func:`register` decided in this process, and how often each hook ran."""
    with _state_lock:
        return {
            "registered": _registered,
            "targets": [c.__dict__ for c in _last_checks],
            "calls": {op: counter.value for op, counter in CALLS.items() if counter.value},
            "stock": sorted(_stock),
            "pending": list(_pending),
        }


def delegate(op: str, kind: str, detail: str, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Hand an unmodelled call to SGLang's original function; counted, and logged once per ``kind``."""
    counter("delegations", op, kind).hit()
    if _delegations_logged.first(kind):
        logger.info(
            "sglang-moe-plugins: %s calls with %s are not modelled: handed to SGLang's original function (logged once)",
            op,
            detail,
        )
    return original(*args, **kwargs)


def delegate_withheld(op: str, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """:func:`delegate` for a CUDA call that only the withheld pure-torch reference could run (kind ``withheld``)."""
    return delegate(op, "withheld", "only the withheld pure-torch reference", original, args, kwargs)
