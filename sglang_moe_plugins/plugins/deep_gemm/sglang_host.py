"""What the DeepGEMM MegaMoE plugins read from SGLang, the host process: nothing else in the package looks
SGLang up for them.

- :func:`host_helpers`: SGLang's cached symmetric buffer (``_get_mega_moe_symm_buffer``) and SM
  reservation (``_configure_mega_moe_deep_gemm_num_sms``), looked up in ``sys.modules`` when the process
  already loaded SGLang's MegaMoE module (never imported from here);
- :func:`sglang_jit_pre_dispatch`: SGLang's JIT ``mega_moe_pre_dispatch`` kernel (imported when a
  launch is built for ``pre_dispatch="host"`` of ``mega_w4a8``);
- :func:`sglang_installed`: whether SGLang can be imported (found, not imported).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from ...errors import KernelNotAvailableError
from ...signatures import accepted_keywords
from .api import DeepGemmApi

__all__ = ["HOST_BUFFER_KEYWORDS", "host_helpers", "sglang_installed", "sglang_jit_pre_dispatch"]

_SGLANG_HOST_MODULE = "sglang.srt.layers.moe.mega_moe"

#: The keywords build_launch offers SGLang's ``_get_mega_moe_symm_buffer`` (after the group and five sizes).
HOST_BUFFER_KEYWORDS = ("num_shared_experts", "mma_type", "activation")


def sglang_installed() -> bool:
    """Whether ``sglang`` can be imported (``importlib.util.find_spec``; nothing is imported)."""
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        return False


def sglang_jit_pre_dispatch() -> Callable[..., None]:
    """SGLang's JIT ``mega_moe_pre_dispatch`` (``sglang.kernels.ops.moe.dsv4``), imported on this call."""
    from sglang.kernels.ops.moe.dsv4 import mega_moe_pre_dispatch  # noqa: PLC0415 - the host's kernel, on first use

    return mega_moe_pre_dispatch


@functools.lru_cache(maxsize=16)
def _host_buffer_keywords(function: Callable[..., Any]) -> frozenset[str] | None:
    """The keywords of :data:`HOST_BUFFER_KEYWORDS` that ``function`` takes (its signature, read once per
    function): 0.5.21 takes ``mma_type`` only, 0.5.22 adds ``num_shared_experts``, 0.5.23 ``activation``.
    None when the signature cannot be read."""
    return accepted_keywords(function, HOST_BUFFER_KEYWORDS)


def _host_buffer(get_buffer: Callable[..., Any], keywords: frozenset[str]) -> Callable[..., Any]:
    """``get_buffer`` called with only the keywords its release takes. A layer with shared experts on a
    release whose helper has no ``num_shared_experts`` raises :class:`KernelNotAvailableError` (its buffer
    would have no shared-expert activations)."""

    def host_buffer(group: Any, *sizes: int, **offered: Any) -> Any:
        if offered.get("num_shared_experts", 0) and "num_shared_experts" not in keywords:
            raise KernelNotAvailableError(
                f"SGLang's _get_mega_moe_symm_buffer takes no num_shared_experts on this release; "
                f"num_shared_experts={offered['num_shared_experts']} needs it"
            )
        return get_buffer(group, *sizes, **{k: v for k, v in offered.items() if k in keywords})

    host_buffer.keywords = keywords  # type: ignore[attr-defined]  # for tests
    return host_buffer


def host_helpers(api: DeepGemmApi) -> tuple[Callable[..., Any] | None, Callable[[Any], Any] | None]:
    """SGLang's ``(_get_mega_moe_symm_buffer, _configure_mega_moe_deep_gemm_num_sms)`` when the process
    already loaded SGLang's MegaMoE module (never imported from here). The buffer helper is wrapped to
    pass only the keywords the host's signature has (read once per process), and used only when the
    installed deep_gemm takes ``mma_type``."""
    host = sys.modules.get(_SGLANG_HOST_MODULE)
    if host is None:
        return None, None
    context = getattr(host, "_configure_mega_moe_deep_gemm_num_sms", None)
    get_buffer = getattr(host, "_get_mega_moe_symm_buffer", None)
    if get_buffer is None or not api.takes("get_symm_buffer_for_mega_moe", "mma_type"):
        return None, context
    keywords = _host_buffer_keywords(get_buffer)
    if keywords is None or "mma_type" not in keywords:
        return None, context
    return _host_buffer(get_buffer, keywords), context
