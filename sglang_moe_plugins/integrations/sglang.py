"""SGLang integration: the ``sglang.srt.plugins`` entry point ``moe_plugins`` and its hooks.

SGLang's ``load_plugins()`` calls :func:`register` once per process. It registers AROUND hooks through
SGLang's ``HookRegistry`` on the host functions of the version table below, and nothing else:

- ``_varlen_deep_gemm_silu_mul_quant`` (op ``silu_mul_quant``),
- ``run_mega_routed_experts`` (op ``mega_moe``).

A target is hooked only when the installed SGLang version is in :data:`KNOWN_TARGETS` and the target
resolves with the expected parameters; otherwise one warning says why, ``doctor`` shows it, and
SGLang runs unchanged. Calls our ops do not model (e.g. ``gemm1_alpha``) go to the original function.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .. import api
from ..errors import ConfigError, InvalidArgumentError, MoEPluginsError, NoPluginAvailableError
from ..ops import silu_mul_quant as smq

__all__ = [
    "HookTarget",
    "TargetCheck",
    "KNOWN_TARGETS",
    "register",
    "check_targets",
    "hook_status",
    "silu_mul_quant_hook",
    "mega_moe_hook",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HookTarget:
    """A host function we hook: dotted path, op, and the parameter names we rely on, in order."""

    path: str
    op: str
    parameters: tuple[str, ...]


_SMQ_PARAMS = (
    "gateup_output", "masked_m", "group_size", "topk", "swiglu_limit", "swizzle",
    "gemm1_alpha", "gemm1_clamp_limit", "num_real_tokens", "silu_mul_keep_fp32",
)
_MEGA_PARAMS = (
    "experts", "hidden_states", "topk_ids", "topk_weights", "hidden_size", "intermediate_size", "top_k",
    "num_tokens", "activation_clamp", "routed_scaling_factor", "activation", "num_shared_experts",
    "shared_l1_weights", "shared_l2_weights", "routing_in_buffer",
)

#: SGLang versions whose hook targets and signatures are known, checked against the released wheels.
KNOWN_TARGETS: dict[str, tuple[HookTarget, ...]] = {
    "0.5.23": (
        HookTarget("sglang.srt.layers.moe.moe_runner.deep_gemm._varlen_deep_gemm_silu_mul_quant", "silu_mul_quant", _SMQ_PARAMS),
        HookTarget("sglang.srt.layers.moe.mega_moe.run_mega_routed_experts", "mega_moe", _MEGA_PARAMS),
    ),
}


@dataclass(frozen=True)
class TargetCheck:
    """Whether a target can be hooked here, and why (shown by ``doctor``)."""

    path: str
    op: str
    ok: bool
    reason: str


_state_lock = threading.Lock()
_last_checks: tuple[TargetCheck, ...] = ()
_registered = False
_calls: dict[str, int] = {}
_delegations_logged: set[str] = set()


def sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _resolve(path: str) -> Any:
    module_path, attr = path.rsplit(".", 1)
    module = importlib.import_module(module_path)
    return getattr(module, attr)


def check_targets(version: str | None = None, table: Mapping[str, tuple[HookTarget, ...]] | None = None) -> tuple[TargetCheck, ...]:
    """Check every known target for the installed SGLang (imports the target modules)."""
    table = KNOWN_TARGETS if table is None else table
    version = sglang_version() if version is None else version
    if version is None:
        return (TargetCheck("sglang", "*", False, "sglang is not installed"),)
    if version not in table:
        known = ", ".join(sorted(table)) or "(none)"
        return (TargetCheck("sglang", "*", False, f"sglang {version} is not in the version table (known: {known}); no hooks"),)
    checks = []
    for target in table[version]:
        try:
            fn = _resolve(target.path)
        except Exception as exc:  # noqa: BLE001 - a missing target must never break start-up
            checks.append(TargetCheck(target.path, target.op, False, f"cannot resolve: {type(exc).__name__}: {exc}"))
            continue
        try:
            params = tuple(inspect.signature(fn).parameters)
        except (TypeError, ValueError) as exc:
            checks.append(TargetCheck(target.path, target.op, False, f"no inspectable signature: {exc}"))
            continue
        if params != target.parameters:
            checks.append(TargetCheck(target.path, target.op, False, f"signature differs: expected {target.parameters}, found {params}"))
            continue
        checks.append(TargetCheck(target.path, target.op, True, f"sglang {version}: signature matches"))
    return tuple(checks)


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
    checks = check_targets()
    with _state_lock:
        _last_checks = checks
    for check in checks:
        if not check.ok:
            logger.warning("sglang-moe-plugins: not hooking %s: %s", check.path, check.reason)
            continue
        HookRegistry.register(check.path, _HOOKS[check.op], HookType.AROUND)
        logger.info("sglang-moe-plugins: hooked %s (op %s)", check.path, check.op)
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
    dsv4_branch = p["swiglu_limit"] is not None or p["swizzle"] or p["silu_mul_keep_fp32"]
    # The layout the host itself returns on this call's branch.
    layout = "ue8m0_packed" if _scale_ue8m0() else ("row_major" if dsv4_branch else "column_major")
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
