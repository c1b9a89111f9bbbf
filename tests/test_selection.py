"""Selection: priority order, reasons, cache, logging once, runtime fallback, strict, force."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from conftest import RecordingPlugin, random_call

from sglang_moe_plugins import NoPluginAvailableError, OutputValidationError, Registry, Selector, Support, Verdict
from sglang_moe_plugins.config import parse_config
from sglang_moe_plugins.ops import silu_mul_quant as smq


def test_first_supported_by_priority_with_reasons(make_selector):
    big = RecordingPlugin("big_only", 30, accept=lambda s, c: s.num_experts > 100)
    mid = RecordingPlugin("mid", 20)
    low = RecordingPlugin("low", 10)
    selector = make_selector(low, big, mid)
    _, shape, config = random_call(e=4)
    sel = selector.select(smq.OP, shape, config)
    assert sel.chosen.name == "mid"
    assert [(c.name, c.verdict) for c in sel.candidates] == [
        ("big_only", Verdict.UNSUPPORTED),
        ("mid", Verdict.CHOSEN),
        ("low", Verdict.OUTRANKED),
    ]
    assert sel.candidate("big_only").reason == "big_only rejects E=4"
    assert "comes first" in sel.candidate("low").reason
    text = sel.explain()
    assert "chose 'mid'" in text and "big_only (priority 30) unsupported: big_only rejects E=4" in text


def test_cache_decides_each_key_once_and_logs_once(make_selector, caplog):
    plugin = RecordingPlugin("only", 1)
    selector = make_selector(plugin)
    _, shape, config = random_call()
    with caplog.at_level(logging.INFO, logger="sglang_moe_plugins"):
        for _ in range(5):
            selector.select(smq.OP, shape, config)
        _, shape2, config2 = random_call(e=5)
        selector.select(smq.OP, shape2, config2)
    assert plugin.supports_calls == 2
    assert selector.cache_info()["decisions"] == 2
    assert sum("-> only" in r.message for r in caplog.records) == 2


def test_concurrent_selection_is_consistent_and_computed_once(make_selector, caplog):
    plugin = RecordingPlugin("only", 1)
    selector = make_selector(plugin)
    keys = [random_call(e=e)[1:] for e in (2, 3, 4, 5)]
    results: list[str] = []
    barrier = threading.Barrier(16)

    def work(i: int) -> None:
        barrier.wait()
        shape, config = keys[i % 4]
        for _ in range(50):
            results.append(selector.select(smq.OP, shape, config).chosen.name)

    with caplog.at_level(logging.INFO, logger="sglang_moe_plugins"):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert set(results) == {"only"} and len(results) == 800
    assert plugin.supports_calls == 4
    assert sum("-> only" in r.message for r in caplog.records) == 4


def test_no_plugin_error_lists_every_plugin_and_reason(make_selector):
    selector = make_selector(
        RecordingPlugin("a", 2, accept=lambda s, c: False), RecordingPlugin("b", 1, accept=lambda s, c: False)
    )
    _, shape, config = random_call(e=3)
    with pytest.raises(NoPluginAvailableError) as info:
        selector.select(smq.OP, shape, config)
    message = str(info.value)
    assert "no enabled plugin of op 'silu_mul_quant' supports E=3" in message
    assert "- a: unsupported: a rejects E=3" in message and "- b: unsupported: b rejects E=3" in message
    assert selector.explain(smq.OP, shape, config).chosen is None


def test_runtime_fallback_logs_once_and_remembers(make_selector, caplog):
    bad = RecordingPlugin("bad", 10, fail=RuntimeError("kernel exploded"))
    good = RecordingPlugin("good", 5)
    selector = make_selector(bad, good)
    inputs, shape, config = random_call()
    with caplog.at_level(logging.INFO, logger="sglang_moe_plugins"):
        for _ in range(3):
            out = selector.dispatch(smq.OP, inputs, shape, config)
    assert bad.run_calls == 1 and good.run_calls == 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "kernel exploded" in errors[0].getMessage() and errors[0].exc_info is not None
    sel = selector.explain(smq.OP, shape, config)
    assert sel.chosen.name == "good" and sel.candidate("bad").verdict == Verdict.FAILED
    assert "RuntimeError at run time: kernel exploded" in sel.candidate("bad").reason
    ref = smq.allocate_outputs(shape, config, torch.device("cpu"))
    from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference

    silu_mul_quant_reference(inputs, ref, shape, config)
    real = smq.real_rows(inputs.masked_m, shape.max_rows)
    assert torch.equal(out.out[real].view(torch.uint8), ref.out[real].view(torch.uint8))


def test_strict_reraises(make_selector):
    bad = RecordingPlugin("bad", 10, fail=RuntimeError("kernel exploded"))
    selector = make_selector(bad, RecordingPlugin("good", 5), config=parse_config({"strict": True}))
    inputs, shape, config = random_call()
    with pytest.raises(RuntimeError, match="kernel exploded"):
        selector.dispatch(smq.OP, inputs, shape, config)


def test_wrong_outputs_count_as_failure(make_selector):
    class WrongLayout(RecordingPlugin):
        def run(self, inputs, outputs, shape, config):
            self.run_calls += 1
            return smq.SiluMulQuantOutputs(outputs.out, outputs.scale.contiguous().float()[..., :1])

    wrong = WrongLayout("wrong", 10)
    selector = make_selector(wrong, RecordingPlugin("good", 5))
    inputs, shape, config = random_call()
    selector.dispatch(smq.OP, inputs, shape, config)
    reason = selector.explain(smq.OP, shape, config).candidate("wrong").reason
    assert "OutputValidationError" in reason and "plugin 'wrong' returned scale.shape" in reason
    strict = make_selector(WrongLayout("wrong", 10), config=parse_config({"strict": True}))
    with pytest.raises(OutputValidationError):
        strict.dispatch(smq.OP, inputs, shape, config)


def test_supports_that_raises_is_an_error_verdict(make_selector):
    def boom(shape, config):
        raise ValueError("bad table")

    selector = make_selector(RecordingPlugin("boom", 10, accept=boom), RecordingPlugin("good", 1))
    _, shape, config = random_call()
    sel = selector.select(smq.OP, shape, config)
    assert sel.chosen.name == "good"
    assert sel.candidate("boom").verdict == Verdict.ERROR and "ValueError: bad table" in sel.candidate("boom").reason


def test_supports_must_return_support(make_selector):
    class ReturnsBool(RecordingPlugin):
        def supports(self, shape, config):
            return True

    selector = make_selector(ReturnsBool("boolish", 10), RecordingPlugin("good", 1))
    _, shape, config = random_call()
    sel = selector.select(smq.OP, shape, config)
    assert "it must return sglang_moe_plugins.Support" in sel.candidate("boolish").reason


def test_disable_and_force(make_selector):
    a, b = RecordingPlugin("a", 10), RecordingPlugin("b", 5, accept=lambda s, c: s.num_experts < 4)
    _, shape, config = random_call(e=4)
    sel = make_selector(a, b, config=parse_config({"disable": ["a"]})).explain(smq.OP, shape, config)
    assert sel.chosen is None and sel.candidate("a").verdict == Verdict.DISABLED
    forced = make_selector(
        RecordingPlugin("a", 10), RecordingPlugin("b", 5), config=parse_config({"force": {"silu_mul_quant": "b"}})
    )
    sel = forced.select(smq.OP, shape, config)
    assert sel.chosen.name == "b" and sel.candidate("a").verdict == Verdict.NOT_FORCED
    forced_unsupported = make_selector(
        a, RecordingPlugin("b", 5, accept=lambda s, c: False), config=parse_config({"force": {"silu_mul_quant": "b"}})
    )
    with pytest.raises(
        NoPluginAvailableError,
        match=r"^the forced plugin 'b' \(force.silu_mul_quant in the configuration\) "
        r"cannot run silu_mul_quant E=4 .*: unsupported: b rejects E=4; the call is not handed",
    ) as info:
        forced_unsupported.select(smq.OP, shape, config)
    assert info.value.forced == "b" and info.value.rejections == (("b", "unsupported: b rejects E=4"),)


def test_forced_plugin_failure_is_not_hidden(make_selector):
    selector = make_selector(
        RecordingPlugin("good", 10),
        RecordingPlugin("bad", 5, fail=RuntimeError("boom")),
        config=parse_config({"force": {"silu_mul_quant": "bad"}}),
    )
    inputs, shape, config = random_call()
    with pytest.raises(RuntimeError, match="boom"):
        selector.dispatch(smq.OP, inputs, shape, config)


def test_unknown_op():
    selector = Selector(Registry.from_plugins([]))
    with pytest.raises(KeyError, match="known ops"):
        selector.select("softmax", None, None)


def test_support_requires_reason():
    with pytest.raises(ValueError, match="non-empty"):
        Support(True, "")
    assert not Support.no("x") and Support.yes()
    assert Support.all_of(Support.yes(), Support.no("second"), Support.no("third")).reason == "second"


def test_decide_depends_only_on_its_arguments():
    from sglang_moe_plugins.config import UserConfig
    from sglang_moe_plugins.core.decide import decide

    a, b = RecordingPlugin("a", 5), RecordingPlugin("b", 1)
    records = Registry.from_plugins([a, b], UserConfig()).records(smq.OP)
    _, shape, config = random_call(seed=1)
    errors = []

    def run(force=None, failed=None, strict=False):
        return decide(
            smq.OP,
            records,
            (),
            force,
            failed or {},
            shape,
            config,
            strict=strict,
            collective=False,
            on_error=lambda plugin, exc: errors.append((plugin, str(exc))),
        )

    first = run()
    assert first == run() and first.chosen.name == "a"  # nothing cached: asked again, same answer
    assert a.supports_calls == 2
    failed = run(failed={"a": "raised RuntimeError at run time: boom"})
    assert failed.chosen.name == "b"
    assert (failed.candidate("a").verdict, failed.candidate("a").reason) == (
        Verdict.FAILED,
        "raised RuntimeError at run time: boom",
    )
    assert run(force="b").candidate("a").verdict == Verdict.NOT_FORCED
    a.supports = lambda shape, config: 1 / 0  # a broken supports(): reported, not raised, unless strict
    assert run().candidate("a").verdict == Verdict.ERROR and errors == [("a", "division by zero")]
    with pytest.raises(ZeroDivisionError) as info:
        run(strict=True)
    assert any("plugin 'a' (supports)" in note and "strict = true" in note for note in info.value.__notes__)


def test_as_support_is_public_and_names_the_plugin():
    from sglang_moe_plugins.contract import __all__ as contract_all, as_support

    class Duck:
        reason = "a duck-typed yes"

        def __bool__(self):
            return True

    assert "as_support" in contract_all
    no = Support.no("E too large")
    assert as_support(no, "p") is no
    assert as_support(Duck(), "p") == Support(True, "a duck-typed yes")
    with pytest.raises(
        TypeError, match=r"plugin 'p': supports\(\) returned True; it must return sglang_moe_plugins.Support"
    ):
        as_support(True, "p")
