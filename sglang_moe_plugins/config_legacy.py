"""SGLang's older switches, translated into this package's configuration (never forwarded to DeepGEMM)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

__all__ = [
    "LEGACY_JIT_EP",
    "LEGACY_FP4_ACTS",
    "LEGACY_MXF4_KIND",
    "LEGACY_ENV",
    "LEGACY_W4A4_PRIORITY",
    "translate_legacy",
]

LEGACY_JIT_EP = "SGLANG_OPT_USE_JIT_EP_ACTIVATION"
LEGACY_FP4_ACTS = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS"
LEGACY_MXF4_KIND = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_MXF4_KIND"
LEGACY_ENV = (LEGACY_JIT_EP, LEGACY_FP4_ACTS, LEGACY_MXF4_KIND)
#: Priority given to mega_w4a4 when a legacy FP4-activation switch asks for it.
LEGACY_W4A4_PRIORITY = 1000


def translate_legacy(
    env: Mapping[str, str],
    env_flag: Callable[[Mapping[str, str], str], bool | None],
    disable: set[str],
    enable: set[str],
    priority: dict[str, int],
    provenance: dict[str, str],
    notes: list[str],
) -> None:
    """Apply the legacy switches of ``env`` to the configuration being built (in place), with a note each."""
    if env_flag(env, LEGACY_JIT_EP) is False and "jit_ep" not in enable:
        disable.add("jit_ep")
        provenance.setdefault("disable:jit_ep", f"disabled by legacy {LEGACY_JIT_EP}=0")
        notes.append(f"legacy {LEGACY_JIT_EP}=0 translated to: disable jit_ep")
    for legacy in (LEGACY_FP4_ACTS, LEGACY_MXF4_KIND):
        if env_flag(env, legacy) and "mega_w4a4" not in priority:
            priority["mega_w4a4"] = LEGACY_W4A4_PRIORITY
            provenance["priority:mega_w4a4"] = f"set by legacy {legacy}=1"
            notes.append(
                f"legacy {legacy}=1 translated to: priority.mega_w4a4 = {LEGACY_W4A4_PRIORITY} "
                "(prefer W4A4 MegaMoE; not forwarded to DeepGEMM, whose 0.2.x releases refuse DG_USE_* variables). "
                "W4A4 also needs the expert weights built for it (SGLang's --enable-w4a4-mxfp4-megamoe): the variant "
                "follows the weights, so with W4A8 weights mega_w4a8 still runs"
            )
