"""Issue 12, item 1: bind once per shape key (Selector.bind -> BoundOp), the optional ``prepare``, output
checks on the first call of a key (every call under strict or debug), and the caches' cap."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import RecordingPlugin, random_call
from numerics import check_against_fp64
from policy_plugins import PreparedReference, SmqRaises

from sglang_moe_plugins import OutputValidationError, UserConfig, Verdict
from sglang_moe_plugins.config import parse_config
from sglang_moe_plugins.core import dispatcher
from sglang_moe_plugins.log import LogOnce
from sglang_moe_plugins.ops import silu_mul_quant as smq

LOGGER = "sglang_moe_plugins"


def test_bind_once_per_key_with_prepare(make_selector):
    plugin = PreparedReference()
    selector = make_selector(plugin, RecordingPlugin("other", 1))
    inputs, shape, config = random_call(e=3, n=6, d=256, seed=1)
    bound = selector.bind(smq.OP, shape, config)
    assert bound is selector.bind(smq.OP, shape, config)  # cached per key
    assert (bound.name, bound.prepared, bound.collective) == ("policy_prepared", True, False)
    for _ in range(3):
        out = selector.call(bound, inputs)
        check_against_fp64(inputs, out, shape, config)
    assert (plugin.prepares, plugin.launches, plugin.runs) == (1, 3, 0)
    selector.dispatch(smq.OP, inputs, shape, config)  # the public dispatch goes through the same bound op
    assert (plugin.prepares, plugin.launches, plugin.runs) == (1, 4, 0)
    _, shape2, config2 = random_call(e=5, seed=2)
    selector.bind(smq.OP, shape2, config2)
    assert plugin.prepares == 2  # one per key


def test_plugin_without_prepare_runs_through_run(make_selector):
    plugin = RecordingPlugin("plain", 5)
    assert not hasattr(plugin, "prepare")
    selector = make_selector(plugin)
    inputs, shape, config = random_call(seed=3)
    bound = selector.bind(smq.OP, shape, config)
    assert not bound.prepared
    for _ in range(2):
        check_against_fp64(inputs, selector.call(bound, inputs), shape, config)
    assert plugin.run_calls == 2


def test_prepare_returning_none_means_run(make_selector):
    class NonePrepare(RecordingPlugin):
        def prepare(self, shape, config):
            return None

    plugin = NonePrepare("none_prepare", 5)
    selector = make_selector(plugin)
    inputs, shape, config = random_call(seed=4)
    bound = selector.bind(smq.OP, shape, config)
    assert not bound.prepared
    check_against_fp64(inputs, selector.call(bound, inputs), shape, config)
    assert plugin.run_calls == 1


@pytest.mark.parametrize("fault", ["raises", "not-callable"])
def test_a_failing_prepare_is_a_failure_of_its_plugin(make_selector, caplog, fault):
    class BadPrepare(RecordingPlugin):
        def prepare(self, shape, config):
            if fault == "raises":
                raise RuntimeError("no kernel for this shape")
            return 42

    good = RecordingPlugin("good", 1)
    selector = make_selector(BadPrepare("bad_prepare", 10), good)
    _inputs, shape, config = random_call(seed=5)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        bound = selector.bind(smq.OP, shape, config)
    assert bound.name == "good"
    candidate = selector.explain(smq.OP, shape, config).candidate("bad_prepare")
    assert candidate.verdict == Verdict.FAILED
    assert (
        "no kernel for this shape" if fault == "raises" else "prepare() returned 42; it must return a callable"
    ) in candidate.reason
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    strict = make_selector(
        BadPrepare("bad_prepare", 10), RecordingPlugin("good", 1), config=parse_config({"strict": True})
    )
    with pytest.raises((RuntimeError, TypeError)) as info:
        strict.bind(smq.OP, shape, config)
    assert any("plugin 'bad_prepare' (prepare)" in note and "strict = true" in note for note in info.value.__notes__)


class WrongOnSecondCall(RecordingPlugin):
    """Right outputs on the first call of a key, a wrong scale layout from the second call on."""

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        if self.run_calls > 1:
            return smq.SiluMulQuantOutputs(outputs.out, outputs.scale.contiguous())
        return None


def test_outputs_are_checked_on_the_first_call_of_a_key(make_selector):
    bad = WrongOnSecondCall("wrong_later", 10)
    selector = make_selector(bad, RecordingPlugin("good", 1))
    inputs, shape, config = random_call(seed=6, layout="column_major")
    bound = selector.bind(smq.OP, shape, config)
    assert not bound.checked
    selector.call(bound, inputs)
    assert bound.checked
    second = selector.call(bound, inputs)  # not checked again: the cost is paid once per key
    assert second.scale.is_contiguous() and bad.run_calls == 2


@pytest.mark.parametrize("setting", [{"debug": True}, {"strict": True}])
def test_debug_and_strict_check_every_call(make_selector, setting):
    selector = make_selector(
        WrongOnSecondCall("wrong_later", 10), RecordingPlugin("good", 1), config=parse_config(setting)
    )
    inputs, shape, config = random_call(seed=7, layout="column_major")
    bound = selector.bind(smq.OP, shape, config)
    assert bound.check_every_call
    selector.call(bound, inputs)
    if setting.get("strict"):
        with pytest.raises(OutputValidationError, match=r"plugin 'wrong_later' returned scale.stride()"):
            selector.call(bound, inputs)
    else:  # debug: caught, and the next plugin takes the key
        out = selector.call(bound, inputs)
        check_against_fp64(inputs, out, shape, config)
        assert selector.explain(smq.OP, shape, config).candidate("wrong_later").verdict == Verdict.FAILED


def test_debug_from_the_environment():
    from sglang_moe_plugins.config import load_config

    assert load_config({"SGLANG_MOE_PLUGINS_DEBUG": "1"}).debug and not load_config({}).debug


def test_caches_are_capped_and_say_so_once(make_selector, monkeypatch, caplog):
    monkeypatch.setattr(dispatcher, "CACHE_CAP", 3)
    plugin = PreparedReference()
    selector = make_selector(plugin)
    calls = [random_call(e=1 + k, n=2, d=128, seed=k) for k in range(6)]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(2):
            for inputs, shape, config in calls:
                bound = selector.bind(smq.OP, shape, config)
                check_against_fp64(inputs, selector.call(bound, inputs), shape, config)
                selector.remember(("raw", shape), bound)
    info = selector.cache_info()
    assert (info["keys"], info["bound"], info["call_keys"]) == (3, 3, 3)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3  # one per cache: selections, bound ops, hooked-call keys
    assert all("the cap; new keys are selected and bound on every call without being cached" in w for w in warnings)
    decisions = [r for r in caplog.records if " -> policy_prepared" in r.getMessage()]
    assert len(decisions) == 3  # keys past the cap are not logged on every call
    assert plugin.prepares == 3 + 2 * 3  # keys past the cap are bound on every call


def test_bind_and_call_binds_once_and_remembers_what_ran(make_selector, monkeypatch):
    plugin = PreparedReference()
    selector = make_selector(plugin)
    inputs, shape, config = random_call(e=3, n=6, d=256, seed=11)
    out = selector.bind_and_call(smq.OP, shape, config, inputs, remember=("raw", 1))
    check_against_fp64(inputs, out, shape, config)
    assert (plugin.prepares, plugin.launches, selector.decisions) == (1, 1, 1)
    assert selector.call_cache[("raw", 1)] is selector.bind(smq.OP, shape, config)
    # A fallback on the first call: the caller's key gets the plugin that ran, not the one that failed.
    selector = make_selector(SmqRaises(), RecordingPlugin("good", 1))
    check_against_fp64(
        inputs, selector.bind_and_call(smq.OP, shape, config, inputs, remember=("raw", 2)), shape, config
    )
    assert selector.call_cache[("raw", 2)].name == "good"
    # Past the caches' cap the key is neither bound twice nor remembered (it is bound again next call).
    monkeypatch.setattr(dispatcher, "CACHE_CAP", 0)
    plugin = PreparedReference()
    selector = make_selector(plugin)
    check_against_fp64(
        inputs, selector.bind_and_call(smq.OP, shape, config, inputs, remember=("raw", 3)), shape, config
    )
    assert (plugin.prepares, selector.decisions, selector.call_cache) == (1, 1, {})


def test_log_once_set_is_bounded():
    once = LogOnce(cap=2)
    assert [once.first(k) for k in ("a", "b", "a", "c", "c")] == [True, True, False, True, True]
    assert len(once._seen) == 2


def test_user_config_hash_follows_equality():
    a = parse_config({"disable": ["x"], "options": {"p": {"sizes": [1, 2]}}, "priority": {"y": 3}})
    b = parse_config({"priority": {"y": 3}, "options": {"p": {"sizes": [1, 2]}}, "disable": ["x"]})
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert hash(UserConfig()) == hash(UserConfig()) and UserConfig() != UserConfig(strict=True)


def test_bound_op_allocates_the_host_layout(make_selector):
    selector = make_selector(PreparedReference())
    for layout in smq.SCALE_LAYOUTS:
        _inputs, shape, config = random_call(e=3, n=6, d=512, layout=layout, seed=8)
        out = selector.bind(smq.OP, shape, config).allocate(torch.device("cpu"))
        want = smq.allocate_outputs(shape, config, torch.device("cpu"))
        assert (out.scale.shape, out.scale.stride(), out.scale.dtype) == (
            want.scale.shape,
            want.scale.stride(),
            want.scale.dtype,
        )
        assert (out.out.shape, out.out.dtype) == (want.out.shape, want.out.dtype)


def test_remember_keeps_no_bound_op_of_a_plugin_marked_failed_meanwhile(make_selector):
    """A hook that bound before another thread marked the plugin failed must not cache the stale op."""
    from sglang_moe_plugins.plugins.reference import ReferencePlugin

    sel = make_selector(ReferencePlugin())
    inputs, shape, config = random_call()
    bound = sel.bind(smq.OP, shape, config)
    sel.call(bound, inputs)  # checked: may be remembered
    sel.mark_failed((smq.OP, shape, config), "reference", RuntimeError("failed on another thread"))
    sel.remember("raw-key", bound)
    assert "raw-key" not in sel.call_cache
    fresh_sel = make_selector(ReferencePlugin())
    fresh = fresh_sel.bind(smq.OP, shape, config)
    fresh_sel.call(fresh, inputs)
    fresh_sel.remember("raw-key", fresh)
    assert fresh_sel.call_cache["raw-key"] is fresh
