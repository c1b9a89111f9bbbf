"""SGLang's ``_get_mega_moe_symm_buffer`` gets only the keywords its release takes.

The stand-in host functions have each release's real signature: the ``def`` of the release's wheel
(``sglang/srt/layers/moe/mega_moe.py``, read as in tests/test_sglang_releases.py) with the body
replaced by a recorder, so a keyword the release does not take raises ``TypeError`` as it would there.
"""

from __future__ import annotations

import ast
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_moe_plugins.errors import KernelNotAvailableError
from sglang_moe_plugins.plugins.deep_gemm import sglang_host as host_mod

sys.path.insert(0, __import__("os").path.dirname(__file__))
from test_sglang_releases import MEGA, _function

SIZES = (8, 64, 2, 512, 256)
OFFERED = dict(num_shared_experts=0, mma_type="mxf4xmxf4", activation="swiglu")


def _stand_in(release: str) -> tuple[Any, list]:
    fn = _function(release, MEGA, "_get_mega_moe_symm_buffer")
    if fn is None:
        pytest.skip(f"sglang {release} has no _get_mega_moe_symm_buffer")
    fn.returns = None
    for arg in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs):
        arg.annotation = None
    fn.decorator_list = []
    fn.body = ast.parse("seen.append(dict(locals())); return 'buffer'").body
    namespace: dict[str, Any] = {"seen": []}
    exec(compile(ast.fix_missing_locations(ast.Module([fn], [])), f"<sglang {release}>", "exec"), namespace)
    return namespace["_get_mega_moe_symm_buffer"], namespace["seen"]


class _Api:
    def takes(self, function: str, parameter: str) -> bool:
        return True


@pytest.mark.parametrize(
    "release, keywords",
    [
        ("0.5.21", {"mma_type"}),
        ("0.5.22", {"num_shared_experts", "mma_type"}),
        ("0.5.23", {"num_shared_experts", "mma_type", "activation"}),
    ],
)
def test_host_buffer_gets_only_its_release_keywords(
    release: str, keywords: set, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_fn, seen = _stand_in(release)
    if len(keywords) < len(OFFERED):  # the stand-in is strict: passing all three fails on that release
        with pytest.raises(TypeError):
            host_fn("group", *SIZES, **OFFERED)
    context = object()
    monkeypatch.setitem(
        sys.modules,
        host_mod._SGLANG_HOST_MODULE,
        SimpleNamespace(_get_mega_moe_symm_buffer=host_fn, _configure_mega_moe_deep_gemm_num_sms=context),
    )
    get_buffer, got_context = host_mod.host_helpers(_Api())
    assert got_context is context and get_buffer is not None
    assert get_buffer.keywords == keywords
    assert get_buffer("group", *SIZES, **OFFERED) == "buffer"
    call = seen[-1]
    assert (call["num_experts"], call["num_max_tokens_per_rank"], call["num_topk"], call["hidden"]) == SIZES[:4]
    assert call["mma_type"] == "mxf4xmxf4"
    if "num_shared_experts" in keywords:
        get_buffer("group", *SIZES, **{**OFFERED, "num_shared_experts": 1})
        assert seen[-1]["num_shared_experts"] == 1
    else:
        with pytest.raises(KernelNotAvailableError, match="num_shared_experts"):
            get_buffer("group", *SIZES, **{**OFFERED, "num_shared_experts": 1})


def test_signature_is_read_once_per_function(monkeypatch: pytest.MonkeyPatch) -> None:
    host_fn, _ = _stand_in("0.5.22")
    monkeypatch.setitem(sys.modules, host_mod._SGLANG_HOST_MODULE, SimpleNamespace(_get_mega_moe_symm_buffer=host_fn))
    host_mod._host_buffer_keywords.cache_clear()
    for _ in range(3):
        host_mod.host_helpers(_Api())
    info = host_mod._host_buffer_keywords.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_no_host_buffer_without_mma_type(monkeypatch: pytest.MonkeyPatch) -> None:
    def old_helper(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden):  # type: ignore[no-untyped-def]
        return "buffer"

    monkeypatch.setitem(
        sys.modules, host_mod._SGLANG_HOST_MODULE, SimpleNamespace(_get_mega_moe_symm_buffer=old_helper)
    )
    assert host_mod.host_helpers(_Api())[0] is None
