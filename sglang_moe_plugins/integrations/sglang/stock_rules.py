"""Whether stock SGLang's masked activation (``_varlen_deep_gemm_silu_mul_quant``) serves a call or crashes, per
release: the rule ``parity = true`` follows (its hook hands every call the release serves to SGLang's own function)
and ``explain`` reports (:func:`..cli.layout_view.stock_masked`).

What the releases do, read from the wheels (docs/host-notes.md):

- 0.5.16 (no argument sends a call to the DSV4 JIT kernel, :attr:`.version_table.SmqHost.jit_arguments` empty): a call
  whose shape fits (``N % 4 == 0``, ``G % 4 == 0``, ``D // 8 >= E``) runs the JIT kernel, which has its own limits
  (:func:`jit_limit`); any other runs a Triton kernel, except with ``swiglu_limit``, which asserts.
- 0.5.17 and later: a call that sets one of ``jit_arguments`` (``swiglu_limit``, ``swizzle``; ``silu_mul_keep_fp32``
  from 0.5.21) asserts that the shape fits, then runs the JIT kernel; any other runs ``per_token_group_quant``.
"""

from __future__ import annotations

__all__ = ["jit_limit", "masked_stock_crash"]


def jit_limit(experts: int, hidden: int, group_size: int) -> str | None:
    """The DSV4 JIT kernel's own limit a shape breaks (its .cuh, as plugin ``jit_ep`` reads them), if any."""
    from ...plugins.sglang_kernels.jit_ep import MAX_EXPERTS, MAX_HIDDEN

    if hidden % 256:
        return f"D ({hidden}) must be a multiple of 256"
    if hidden > MAX_HIDDEN:
        return f"D ({hidden}) must be <= {MAX_HIDDEN}"
    if experts > MAX_EXPERTS:
        return f"E ({experts}) must be <= {MAX_EXPERTS}"
    if group_size not in (32, 128):
        return f"group_size ({group_size}) must be 32 or 128"
    return None


def masked_stock_crash(
    jit_arguments: tuple[str, ...],
    *,
    experts: int,
    rows: int,
    hidden: int,
    group_size: int,
    swiglu_limit: float | None,
    swizzle: bool = False,
    keep_fp32: bool = False,
) -> str | None:
    """Why the release's masked activation crashes on this call (E experts, N = ``rows``, D, group), or None when it
    serves it. ``jit_arguments``: the release's (:class:`.version_table.SmqHost`)."""
    groups = hidden // group_size if group_size > 0 else 0
    fits = rows % 4 == 0 and groups % 4 == 0 and hidden // 8 >= experts
    shape = f"N={rows} G={groups} D={hidden} E={experts}"
    if not jit_arguments:  # 0.5.16: by shape
        if fits:
            limit = jit_limit(experts, hidden, group_size)
            return None if limit is None else f"outside the DSV4 JIT kernel's limits: {limit}"
        return (
            f"swiglu_limit needs the DSV4 JIT kernel, which {shape} does not fit" if swiglu_limit is not None else None
        )
    values = {"swiglu_limit": swiglu_limit, "swizzle": swizzle, "silu_mul_keep_fp32": keep_fp32}
    if all(values.get(name) in (None, False) for name in jit_arguments):
        return None  # per_token_group_quant
    if not fits:
        return f"AssertionError: the DSV4 JIT activation requires N % 4 == 0, G % 4 == 0 and D // 8 >= E, got {shape}"
    limit = jit_limit(experts, hidden, group_size)
    return None if limit is None else f"outside the DSV4 JIT kernel's limits: {limit}"
