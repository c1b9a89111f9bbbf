"""SGLang integration: the ``sglang.srt.plugins`` entry point ``moe_plugins`` and its hooks.

SGLang's ``load_plugins()`` calls :func:`register` once per process. It registers AROUND hooks through
SGLang's ``HookRegistry`` on the host functions of the version table below, and nothing else:

- ``_varlen_deep_gemm_silu_mul_quant`` (op ``silu_mul_quant``),
- ``run_mega_routed_experts`` (op ``mega_moe``).

The version table and the rule for releases it does not list live in :mod:`.sglang_versions`
(re-exported here): a known release's targets are hooked when they resolve with the table's
parameters; a newer release when all its targets match the newest release's (one warning); otherwise
one warning says why, ``doctor`` shows it, and SGLang runs unchanged.

Failure policy (docs/reliability.md): invalid arguments raise InvalidArgumentError, a call no plugin
can run (a forced plugin that cannot run it included) raises NoPluginAvailableError; only the calls
the ops do not model by design go to SGLang's original function, logged once per kind
(``gemm1_alpha`` / ``gemm1_clamp_limit``, ``masked_m=None``, MegaMoE calls the adapter leaves to SGLang).
An invalid configuration installs hooks that raise the configuration error (``on_config_error = "closed"``,
the default), or no hooks at all (``"stock"``); ops named in ``stock`` are never hooked.

The ``silu_mul_quant`` hook binds once per shape key: a call whose raw arguments (tensor shapes, dtypes,
devices, contiguity, flags and their types, the host's UE8M0 mode) were seen before goes straight to
its bound op (no argument checks, no selection), since every check that does not read tensor data is
decided by those arguments.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from ..log import get_logger
from .. import api
from ..config import ON_CONFIG_ERROR_ENV, STOCK_ENV, config_error_policy
from ..errors import ConfigError, MoEPluginsError
from ..metrics import start_metrics_export
from ..counters import EventCounter, counter
from ..ops import silu_mul_quant as smq
from .sglang_versions import (
    KNOWN_TARGETS,
    HookTarget,
    TargetCheck,
    VersionCase,
    active_target,
    check_targets,
    set_active_targets,
    sglang_version,
    version_case,
)

__all__ = [
    "HookTarget",
    "TargetCheck",
    "KNOWN_TARGETS",
    "VersionCase",
    "register",
    "check_targets",
    "version_case",
    "sglang_version",
    "hook_status",
    "silu_mul_quant_hook",
    "mega_moe_hook",
    "refresh_host_state",
]

logger = get_logger(__name__)


_state_lock = threading.Lock()
_last_checks: tuple[TargetCheck, ...] = ()
_registered = False
#: Ops left unhooked by ``stock`` (or, with ``on_config_error = stock`` and an invalid config, every op).
_stock: frozenset[str] = frozenset()
_calls: dict[str, EventCounter] = {"silu_mul_quant": EventCounter(), "mega_moe": EventCounter()}
#: Kinds of unmodelled calls already logged (a fixed, small set: never argument values).
_delegations_logged: set[str] = set()


_HOOKS: dict[str, Callable[..., Any]] = {}


def register() -> None:
    """Entry point ``sglang.srt.plugins: moe_plugins``, run by SGLang's ``load_plugins()``. Never raises
    into SGLang's loader.

    A configuration that cannot be applied (an invalid file, key or value; under strict, a plugin that
    cannot be registered; any other error while the plugins are loaded) **fails closed** by default:
    the hooks are installed and every hooked call raises that error, so a server's warm-up stops at once
    with the cause. ``on_config_error = "stock"`` (or ``SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR=stock``)
    turns the package off instead: one ERROR line, no hooks, SGLang runs its own code. Ops named in
    ``stock`` (``SGLANG_MOE_PLUGINS_STOCK``) are not hooked at all (with an invalid configuration, the
    environment variable still counts).
    """
    global _last_checks, _registered, _stock
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    failing = None
    try:
        selector = api.get_selector()  # validates the user config now, not on the first MoE call
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - ConfigError, a strict registry, or anything else start-up raised
        what = "invalid configuration: " if isinstance(exc, ConfigError) else (
            "" if isinstance(exc, MoEPluginsError) else f"start-up failed with {type(exc).__name__}: ")
        if config_error_policy() == "stock":
            logger.error("sglang-moe-plugins is NOT active (on_config_error = stock): %s%s; SGLang runs its own code",
                         what, exc)
            with _state_lock:
                _registered = True
                _stock = frozenset(_HOOKS)
            return
        logger.error(
            "sglang-moe-plugins: %s%s; failing closed: the hooks are installed and every hooked call raises this %s "
            "(fix the configuration, or set %s=stock to let SGLang run its own code)",
            what, exc, type(exc).__name__, ON_CONFIG_ERROR_ENV,
        )
        failing = {op: _failing_hook(op, exc) for op in _HOOKS}
        stock = frozenset(n.strip() for n in os.environ.get(STOCK_ENV, "").split(",") if n.strip())
    else:
        config = selector.registry.config
        stock = config.stock
        for note in config.notes:
            logger.log(logging.WARNING if note.startswith("legacy") else logging.INFO, "sglang-moe-plugins: %s", note)
    case = version_case()
    with _state_lock:
        _last_checks = case.checks
        _stock = frozenset(stock)
    if case.case != "known":  # one warning for the release as a whole (newer, refused, mismatch, unsupported)
        logger.warning("sglang-moe-plugins: %s", case.message)
    hooked = []
    for check, target in zip(case.checks, case.targets or (None,) * len(case.checks)):
        if not check.ok or target is None or not case.hooks:
            if case.case == "known":
                logger.warning("sglang-moe-plugins: not hooking %s: %s", check.path, check.reason)
            continue
        if check.op in stock:
            logger.warning("sglang-moe-plugins: not hooking %s: op %s is stock (SGLang's own function runs it)",
                           check.path, check.op)
            continue
        hook = target.hook_function() if failing is None else failing[check.op]
        HookRegistry.register(check.path, hook, HookType.AROUND)
        hooked.append(target)
        logger.info("sglang-moe-plugins: hooked %s (op %s)", check.path, check.op)
    set_active_targets(tuple(hooked))
    _registered = True
    if hooked:
        start_metrics_export()  # only when SGLang runs with --enable-metrics (PROMETHEUS_MULTIPROC_DIR)


def _failing_hook(op: str, error: BaseException) -> Callable[..., Any]:
    def failing(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        _count(op)
        raise error.with_traceback(None)

    failing.__name__ = f"{op}_hook_failing_closed"
    return failing


def hook_status() -> dict[str, Any]:
    """What :func:`register` decided in this process, and how often each hook ran."""
    with _state_lock:
        return {
            "registered": _registered,
            "targets": [c.__dict__ for c in _last_checks],
            "calls": {op: counter.value for op, counter in _calls.items() if counter.value},
            "stock": sorted(_stock),
        }


def _count(op: str) -> None:
    _calls[op].hit()


def _delegate(op: str, kind: str, detail: str, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Hand an unmodelled call to SGLang's original function; counted, and logged once per ``kind``."""
    counter("delegations", op, kind).hit()
    if kind not in _delegations_logged:
        with _state_lock:
            first = kind not in _delegations_logged
            _delegations_logged.add(kind)
        if first:
            logger.info("sglang-moe-plugins: %s calls with %s are not modelled: handed to SGLang's original function "
                        "(logged once)", op, detail)
    return original(*args, **kwargs)


# -- silu_mul_quant ---------------------------------------------------------------------------------
def _smq_arguments(gateup_output, masked_m, group_size, topk, swiglu_limit=None, swizzle=False, gemm1_alpha=None,
                   gemm1_clamp_limit=None, num_real_tokens=None, silu_mul_keep_fp32=False):  # noqa: ANN001, ANN202
    """The host function's parameters (SGLang 0.5.23; 0.5.16-0.5.20 lack the last one, and never pass it),
    bound by the interpreter itself: positional or keyword, with the host's defaults."""
    return (gateup_output, masked_m, group_size, topk, swiglu_limit, swizzle, gemm1_alpha, gemm1_clamp_limit,
            num_real_tokens, silu_mul_keep_fp32)


_host_ue8m0: bool | None = None


def _scale_ue8m0() -> bool:
    """SGLang's DeepGEMM UE8M0 scale mode, read on the first call and kept (see refresh_host_state)."""
    global _host_ue8m0
    if _host_ue8m0 is None:
        try:
            from sglang.srt.layers import deep_gemm_wrapper
        except ImportError:  # outside SGLang (benchmarks, tests): fp32 scales
            _host_ue8m0 = False
        else:
            _host_ue8m0 = bool(deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0)
    return _host_ue8m0


def refresh_host_state() -> None:
    """Read SGLang's UE8M0 mode again on the next call (it is read once: SGLang sets it at start-up)."""
    global _host_ue8m0
    _host_ue8m0 = None


_smq_calls = _calls[smq.OP].hit


def silu_mul_quant_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of ``_varlen_deep_gemm_silu_mul_quant``: same arguments, same return value."""
    _smq_calls()
    try:
        g, m, group_size, topk, limit, swizzle, alpha, clamp, real_tokens, keep = _smq_arguments(*args, **kwargs)
    except TypeError:  # not a valid call of the host function: let the host say so
        return original(*args, **kwargs)
    if alpha is not None or clamp is not None:
        return _delegate(smq.OP, "gemm1_alpha", "gemm1_alpha / gemm1_clamp_limit (the gpt-oss activation)", original, args, kwargs)
    if m is None:
        return _delegate(smq.OP, "masked_m=None", "masked_m=None", original, args, kwargs)
    ue8m0 = _host_ue8m0 if _host_ue8m0 is not None else _scale_ue8m0()
    selector = api.current_selector()
    try:
        # Everything describe() checks that does not read tensor data; types too (True == 1 == 1.0).
        key = (g.shape, g.dtype, g.device, g.is_contiguous(), m.shape, m.dtype, m.device, m.is_contiguous(),
               group_size, group_size.__class__, topk, topk.__class__, limit, limit.__class__, swizzle,
               swizzle.__class__, keep, keep.__class__, ue8m0)
        bound = selector.call_cache.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable arguments: describe() says what is wrong
        key = bound = None
    if bound is not None:
        outputs = selector.call(bound, smq.SiluMulQuantInputs(g, m, real_tokens, True), device=key[2])
        return outputs.out, outputs.scale
    # First call of this key (or past the cache's cap): check, select, bind. Raises InvalidArgumentError
    # for invalid arguments and NoPluginAvailableError when no plugin can run the call.
    # The layout the host itself returns on this call's branch, per release (sglang_versions.SmqHost).
    layout = active_target(smq.OP).host.scale_layout(
        {"swiglu_limit": limit, "swizzle": swizzle, "silu_mul_keep_fp32": keep}, ue8m0
    )
    shape, config = smq.describe(g, m, group_size=group_size, topk=topk, swiglu_limit=limit, swizzle=swizzle,
                                 scale_layout=layout, keep_fp32=keep)
    outputs = selector.call(selector.bind(smq.OP, shape, config), smq.SiluMulQuantInputs(g, m, real_tokens, True))
    if key is not None:
        selector.remember(key, selector.bind(smq.OP, shape, config))
    return outputs.out, outputs.scale


# -- mega_moe ---------------------------------------------------------------------------------------
_mega_calls = _calls["mega_moe"].hit
_mega_adapter: Any = None


def mega_moe_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of ``run_mega_routed_experts``: same arguments, same return value."""
    _mega_calls()
    global _mega_adapter
    adapter = _mega_adapter
    if adapter is None:
        try:
            from . import mega_adapter as adapter
        except ImportError as exc:
            return _delegate("mega_moe", "mega adapter", f"the mega adapter unavailable ({exc})", original, args, kwargs)
        _mega_adapter = adapter
    try:
        experts, hidden_states, topk_ids, topk_weights = args
    except ValueError:  # not the four positional arguments: build_call decides
        call = adapter.build_call(*args, **kwargs)
        if call is None:
            return _delegate("mega_moe", "mega unmodelled", "arguments the mega_moe op does not model", original, args, kwargs)
        plan, hidden_states, topk_ids, topk_weights = call.plan, call.inputs.hidden_states, call.inputs.topk_ids, call.inputs.topk_weights
    else:
        plan = adapter.plan_for(experts, hidden_states, topk_ids, topk_weights, kwargs)
        if plan is None:  # the adapter logs the precise reason once
            return _delegate("mega_moe", "mega unmodelled", "arguments the mega_moe op does not model", original, args, kwargs)
    # Bound once per plan (layer and flags) and selector: a repeated call does no selection, no shape
    # hashing, no output revalidation. NoPluginAvailableError propagates: never handed to SGLang
    # silently; MegaMoE is collective, so a plugin error is raised on this rank (no per-rank fallback).
    selector = api.current_selector()
    cached = plan.cache.get("bound")
    if cached is None or cached[0] is not selector:
        cached = plan.cache["bound"] = (selector, selector.bind("mega_moe", plan.shape, plan.config))
    num_tokens = hidden_states.shape[0]
    outputs = selector.call(cached[1], adapter.inputs_for(plan, hidden_states, topk_ids, topk_weights),
                            adapter.allocate(plan, num_tokens))
    return adapter.result(outputs, num_tokens)


_HOOKS.update({"silu_mul_quant": silu_mul_quant_hook, "mega_moe": mega_moe_hook})
