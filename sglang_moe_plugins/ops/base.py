"""What every op module provides to the registry, the selector and the conformance kit."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BF16_MIN_NORMAL",
    "SWIGLU_LIMIT_ALLOWED",
    "OpSpec",
    "activation_describe",
    "check_activation",
    "check_output_devices",
    "finite_float",
]

#: bf16's smallest normal number. A clamp limit below it rounds to 0 (or a subnormal that kernels
#: flush to 0) in bf16, which zeroes every output: such limits are invalid arguments.
BF16_MIN_NORMAL = 2.0**-126


def finite_float(value: object) -> float | None:
    """``value`` as a finite Python float; None for bools, non-numbers, NaN, +-Inf and ints too large
    for a float (``float(10**400)`` raises OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        result = float(value)
    except OverflowError:
        return None
    return result if math.isfinite(result) else None


SWIGLU_LIMIT_ALLOWED = "None or a finite number >= 2**-126 (bf16's smallest normal) that fits a float"


def check_activation(op: str, swiglu_limit: object, swizzle: object, keep_fp32: object) -> float | None:
    """The SwiGLU arguments the activation ops share, checked: ``swizzle`` and ``keep_fp32`` true or false, the
    clamp limit None or a finite float of at least bf16's smallest normal. Returns the limit as a float."""
    from ..errors import InvalidArgumentError

    for flag, value in (("swizzle", swizzle), ("keep_fp32", keep_fp32)):
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise InvalidArgumentError(op, flag, value, "True or False")
    if swiglu_limit is None:
        return None
    limit = finite_float(swiglu_limit)
    if limit is None or not limit >= BF16_MIN_NORMAL:
        raise InvalidArgumentError(op, "swiglu_limit", swiglu_limit, SWIGLU_LIMIT_ALLOWED)
    return limit


def activation_describe(
    platform: object, scale_layout: str, swiglu_limit: float | None, swizzle: bool, keep_fp32: bool
) -> str:
    """One line for an activation op's config: platform, scale layout and the flags that are set."""
    parts = [str(platform), f"scales={scale_layout}"]
    if swiglu_limit is not None:
        parts.append(f"swiglu_limit={swiglu_limit:g}")
    if swizzle:
        parts.append("swizzle")
    if keep_fp32:
        parts.append("keep_fp32")
    return " ".join(parts)


def check_output_devices(
    fail: Callable[[str, object, object], Exception],
    tensors: Sequence[tuple[str, Any]],
    inputs_device: Any,
    platform: Any,
    source: str,
) -> None:
    """Part of an op's ``validate_outputs``: every output tensor on the device of the call's inputs
    (``inputs_device``, the device of ``source``), or, without the call's inputs, on a device of the config's
    platform's type (outputs on the meta device, or on the CPU for a CUDA call, are never the host's). Raises
    ``fail(what, got, want)``."""
    for name, tensor in tensors:
        device = tensor.device
        if inputs_device is not None:
            if device != inputs_device:
                raise fail(f"{name}.device", device, f"the device of {source} ({inputs_device})")
        elif device.type != platform.device_type:
            raise fail(f"{name}.device", device, f"a {platform.device_type} device (the call's platform: {platform})")


@dataclass(frozen=True)
class OpSpec:
    """Describes one op: how its outputs are made and checked, and how the selector treats failures."""

    name: str
    #: ``allocate_outputs(shape, config, device) -> outputs``
    allocate_outputs: Callable[..., Any]
    #: ``validate_outputs(outputs, shape, config, plugin=None, inputs=None) -> None``; raises
    #: OutputValidationError. With ``inputs`` it also checks what depends on the call, not on the shape
    #: key: every output on the inputs' device (without ``inputs``: on a device of the config's platform's
    #: type; :func:`check_output_devices`), mega_moe's ``y`` with at least ``max(num_tokens, 1)`` rows.
    validate_outputs: Callable[..., None]
    #: ``output_allocator(shape, config) -> (device -> outputs)``: sizes, strides and dtypes worked out
    #: once per shape key, so that a call only allocates. None: ``allocate_outputs`` on every call.
    output_allocator: Callable[..., Callable[[Any], Any]] | None = None
    #: Every rank runs the op's kernel together (a collective): a plugin that fails at run time is
    #: never replaced by another plugin on one rank only; the error is raised on that rank.
    collective: bool = False
    #: The op's shape dataclass (its integer fields are what ``[[priority_rules]]`` bounds match on).
    shape_type: type | None = None
    #: The op's outputs dataclass: a plugin's ``run``/launch returns None or an object of exactly this
    #: type (checked on every call).
    output_type: type | None = None
    #: ``(input field, flag field)`` pairs: inputs a host may mark writable (the flag is true), which a
    #: plugin may then overwrite. A plugin that fails after it may have written one is never followed
    #: by another plugin on the same call (docs/reliability.md).
    writable_inputs: tuple[tuple[str, str], ...] = ()
    #: ``"module:attr"`` of the conformance kit's adapter factory of the op (called with no arguments; an
    #: :class:`~sglang_moe_plugins.testing.OpConformance`), imported only when the suite runs. None: the
    #: suite looks for ``conformance`` or ``cases_for_model`` in the op module.
    conformance: str | None = None
