"""SGLang integration: the ``sglang.srt.plugins`` entry point ``moe_plugins`` and its hooks.

SGLang's ``load_plugins()`` calls :func:`register` once per process. It registers AROUND hooks through
SGLang's ``HookRegistry`` on the host functions of the version table below, and nothing else:

- ``_varlen_deep_gemm_silu_mul_quant`` (op ``silu_mul_quant``),
- ``run_mega_routed_experts`` (op ``mega_moe``).

The version table and the rule for releases it does not list live in :mod:`.sglang_versions`
(re-exported here): a known release's targets are hooked when they resolve with the table's
parameters; a newer release when all its targets match the newest release's (one warning); otherwise
one warning says why, ``doctor`` shows it, and SGLang runs unchanged. Calls our ops do not model (e.g. ``gemm1_alpha``) go to the original function.
"""

from __future__ import annotations

import inspect
import logging
import threading
from typing import Any, Callable

from .. import api
from ..errors import ConfigError, InvalidArgumentError, MoEPluginsError, NoPluginAvailableError
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
]

logger = logging.getLogger(__name__)


_SMQ_PARAMS = (
    "gateup_output", "masked_m", "group_size", "topk", "swiglu_limit", "swizzle",
    "gemm1_alpha", "gemm1_clamp_limit", "num_real_tokens", "silu_mul_keep_fp32",
)


_state_lock = threading.Lock()
_last_checks: tuple[TargetCheck, ...] = ()
_registered = False
_calls: dict[str, int] = {}
_delegations_logged: set[str] = set()


_HOOKS: dict[str, Callable[..., Any]] = {}


def register() -> None:
    """Entry point ``sglang.srt.plugins: moe_plugins``, run by SGLang's ``load_plugins()``."""
    global _last_checks, _registered
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    try:
        selector = api.get_selector()  # validates the user config now, not on the first MoE call
    except ConfigError as exc:
        logger.error("sglang-moe-plugins is NOT active: invalid configuration: %s", exc)
        raise
    except MoEPluginsError as exc:  # strict mode: a plugin that cannot be registered
        logger.error("sglang-moe-plugins is NOT active: %s", exc)
        raise
    for note in selector.registry.config.notes:
        logger.log(logging.WARNING if note.startswith("legacy") else logging.INFO, "sglang-moe-plugins: %s", note)
    case = version_case()
    with _state_lock:
        _last_checks = case.checks
    if case.case != "known":  # one warning for the release as a whole (newer, refused, mismatch, unsupported)
        logger.warning("sglang-moe-plugins: %s", case.message)
    hooked = []
    for check, target in zip(case.checks, case.targets or (None,) * len(case.checks)):
        if not check.ok or target is None or not case.hooks:
            if case.case == "known":
                logger.warning("sglang-moe-plugins: not hooking %s: %s", check.path, check.reason)
            continue
        HookRegistry.register(check.path, target.hook_function(), HookType.AROUND)
        hooked.append(target)
        logger.info("sglang-moe-plugins: hooked %s (op %s)", check.path, check.op)
    set_active_targets(tuple(hooked))
    _registered = True


def hook_status() -> dict[str, Any]:
    """What :func:`register` decided in this process, and how often each hook ran."""
    with _state_lock:
        return {
            "registered": _registered,
            "targets": [c.__dict__ for c in _last_checks],
            "calls": dict(_calls),
        }


def _count(op: str) -> None:
    with _state_lock:
        _calls[op] = _calls.get(op, 0) + 1


def _delegate(op: str, why: str, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    if why not in _delegations_logged:
        _delegations_logged.add(why)
        logger.info("sglang-moe-plugins: %s call handed to SGLang's original function: %s", op, why)
    return original(*args, **kwargs)


_SMQ_SIGNATURE = inspect.Signature(
    [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in _SMQ_PARAMS[:4]]
    + [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        for name, default in zip(_SMQ_PARAMS[4:], (None, False, None, None, None, False))
    ]
)


def _scale_ue8m0() -> bool:
    from sglang.srt.layers import deep_gemm_wrapper

    return bool(deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0)


def silu_mul_quant_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of ``_varlen_deep_gemm_silu_mul_quant``: same arguments, same return value."""
    _count(smq.OP)
    a = _SMQ_SIGNATURE.bind(*args, **kwargs)
    a.apply_defaults()
    p = a.arguments
    if p["gemm1_alpha"] is not None or p["gemm1_clamp_limit"] is not None:
        return _delegate(smq.OP, "gemm1_alpha / gemm1_clamp_limit (gpt-oss activation) is not modelled", original, args, kwargs)
    if p["masked_m"] is None:
        return _delegate(smq.OP, "masked_m is None", original, args, kwargs)
    # The layout the host itself returns on this call's branch, per release (sglang_versions.SmqHost).
    layout = active_target(smq.OP).host.scale_layout(p, _scale_ue8m0())
    try:
        shape, config = smq.describe(
            p["gateup_output"], p["masked_m"], group_size=p["group_size"], topk=p["topk"],
            swiglu_limit=p["swiglu_limit"], swizzle=p["swizzle"], scale_layout=layout,
            keep_fp32=p["silu_mul_keep_fp32"],
        )
    except InvalidArgumentError as exc:
        return _delegate(smq.OP, str(exc), original, args, kwargs)
    inputs = smq.SiluMulQuantInputs(p["gateup_output"], p["masked_m"], p["num_real_tokens"], gateup_writable=True)
    selector = api.get_selector()
    try:
        outputs = selector.dispatch(smq.OP, inputs, shape, config)
    except NoPluginAvailableError as exc:
        if selector.strict:
            raise
        return _delegate(smq.OP, f"no enabled plugin supports it ({exc.rejections})", original, args, kwargs)
    return outputs.out, outputs.scale


def mega_moe_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of ``run_mega_routed_experts``: same arguments, same return value."""
    _count("mega_moe")
    try:
        from . import mega_adapter
    except ImportError as exc:
        return _delegate("mega_moe", f"mega adapter unavailable: {exc}", original, args, kwargs)
    call = mega_adapter.build_call(*args, **kwargs)
    if call is None:
        return _delegate("mega_moe", "call not modelled by the mega_moe op", original, args, kwargs)
    selector = api.get_selector()
    try:
        outputs = selector.dispatch("mega_moe", call.inputs, call.shape, call.config, outputs=call.allocate_outputs())
    except NoPluginAvailableError as exc:
        if selector.strict:
            raise
        return _delegate("mega_moe", f"no enabled plugin supports it ({exc.rejections})", original, args, kwargs)
    return call.result(outputs)


_HOOKS.update({"silu_mul_quant": silu_mul_quant_hook, "mega_moe": mega_moe_hook})
