"""``[[priority_rules]]``: per-op, per-shape-bucket priorities (issue 15, item 2).

Parsing and validation errors (each names the entry), matching (inclusive bounds, several fields), rule
vs force vs disable, the selection's explanation, hashing, and a hooked call through SGLang's real
``load_plugins()`` that takes the rule's plugin.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import RecordingPlugin, random_call

from sglang_moe_plugins import ConfigError, Registry, UserConfig, Verdict
from sglang_moe_plugins.config import load_config, parse_config
from sglang_moe_plugins.ops import silu_mul_quant as smq
from sglang_moe_plugins.ops.mega_moe import MegaMoEShape
from sglang_moe_plugins.priority_rules import PriorityRule

SRC = "moe.toml"


def rules(*entries, **top):
    return parse_config({"priority_rules": list(entries), **top}, source=SRC)


def rule(when=None, op=smq.OP, **priority):
    entry = {"op": op, "priority": priority or {"low": 50}}
    if when is not None:
        entry["when"] = when
    return entry


def shape(e=4, n=8, d=256, group=128, topk=2):
    return smq.SiluMulQuantShape(num_experts=e, max_rows=n, hidden=d, group_size=group, topk=topk)


# -- parsing ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data, message",
    [
        ({"priority_rules": {"op": smq.OP}}, "priority_rules in moe.toml must be an array of tables"),
        ({"priority_rules": ["x"]}, "priority_rules[0] in moe.toml must be a table"),
        (
            {"priority_rules": [rule(), {**rule(), "wen": {}}]},
            "unknown key 'wen' in priority_rules[1] in moe.toml; valid keys: op, when, priority",
        ),
        ({"priority_rules": [{"priority": {"low": 1}}]}, "priority_rules[0] in moe.toml: 'op' must name an op"),
        (
            {"priority_rules": [rule(when={"hidden": 8192})]},
            "priority_rules[0] in moe.toml: bound 'hidden' must be <field>_min or <field>_max",
        ),
        (
            {"priority_rules": [rule(when={"hidden_min": "8k"})]},
            "priority_rules[0] in moe.toml: bound hidden_min must be an integer, got '8k'",
        ),
        ({"priority_rules": [rule(when={"hidden_min": 1.5})]}, "bound hidden_min must be an integer, got 1.5"),
        ({"priority_rules": [rule(when={"hidden_min": True})]}, "bound hidden_min must be an integer, got True"),
        (
            {"priority_rules": [rule(when={"hidden_min": 9, "hidden_max": 8})]},
            "priority_rules[0] in moe.toml: hidden_min = 9 is above hidden_max = 8",
        ),
        ({"priority_rules": [{"op": smq.OP}]}, "priority_rules[0] in moe.toml: 'priority' must be a non-empty table"),
        (
            {"priority_rules": [rule(low="high")]},
            "priority_rules[0] in moe.toml: priority.low must be an integer, got 'high'",
        ),
    ],
)
def test_form_errors_name_the_entry(data, message):
    with pytest.raises(ConfigError) as info:
        parse_config(data, source=SRC)
    assert message in str(info.value)


def registry(config, *plugins):
    plugins = plugins or (RecordingPlugin("low", 10), RecordingPlugin("high", 20))
    return Registry.from_plugins(plugins, config)


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            rule(op="silu_mul"),
            "unknown op 'silu_mul' in priority_rules[0] in moe.toml; valid ops: mega_moe, silu_mul_quant",
        ),
        (
            rule(when={"hiden_min": 1}),
            "unknown shape field 'hiden' in priority_rules[0] in moe.toml.when (op 'silu_mul_quant', "
            "SiluMulQuantShape); valid bounds: num_experts_min, num_experts_max, max_rows_min",
        ),
        (rule(lwo=5), "unknown plugin 'lwo' in priority_rules[0] in moe.toml.priority; valid plugins: high, low"),
        (
            rule(op="mega_moe", low=5),
            "priority_rules[0] in moe.toml.priority names plugin 'low', which implements op "
            "'silu_mul_quant', not 'mega_moe'; plugins of 'mega_moe': (none registered)",
        ),
    ],
)
def test_name_errors_name_the_entry_and_list_valid_values(entry, message):
    with pytest.raises(ConfigError) as info:
        registry(rules(entry))
    assert message in str(info.value)


def test_mega_moe_fields_are_valid_bounds():
    spec = parse_config(
        {"priority_rules": [{"op": "mega_moe", "when": {"ep_size_min": 8, "top_k_max": 9}, "priority": {"x": 1}}]}
    )
    with pytest.raises(ConfigError, match="unknown plugin 'x'"):  # the fields passed; the plugin is checked next
        registry(spec)


# -- matching --------------------------------------------------------------------------------------------
def test_bounds_are_inclusive_and_every_field_must_hold():
    (r,) = rules(rule(when={"hidden_min": 8193, "hidden_max": 14336, "max_rows_max": 768})).priority_rules
    assert r.matches(shape(d=8193, n=768)) and r.matches(shape(d=14336, n=1))
    assert not r.matches(shape(d=8192, n=8)) and not r.matches(shape(d=14337, n=8))
    assert not r.matches(shape(d=9000, n=769))
    assert r.describe_bounds() == "hidden in 8193..14336, max_rows <= 768"
    (open_rule,) = rules(rule()).priority_rules
    assert open_rule.matches(shape()) and open_rule.describe_bounds() == "every shape"
    mega = PriorityRule(0, "mega_moe", (("ep_size", 8, 8),), (("x", 1),))
    assert mega.matches(MegaMoEShape(num_experts=256, hidden=4096, intermediate=2048, top_k=8, ep_size=8))
    assert not mega.matches(MegaMoEShape(num_experts=256, hidden=4096, intermediate=2048, top_k=8, ep_size=4))
    assert mega.describe_bounds() == "ep_size == 8"


def test_rule_reorders_only_matching_keys_and_explains_it(make_selector):
    config = rules(rule(when={"hidden_min": 8193}, low=200))
    selector = make_selector(RecordingPlugin("low", 10), RecordingPlugin("high", 20), config=config)
    big = selector.select(smq.OP, shape(d=14336), random_call()[2])
    assert big.chosen.name == "low"
    low = big.candidate("low")
    assert low.priority == 200 and low.verdict == Verdict.CHOSEN
    assert low.reason == "low accepts; priority 200 from priority_rules[0] (hidden >= 8193) instead of 10"
    high = big.candidate("high")
    assert high.verdict == Verdict.OUTRANKED and "'low' (priority 200) comes first" in high.reason
    assert (
        "low (priority 200) chosen: low accepts; priority 200 from priority_rules[0] (hidden >= 8193)" in big.explain()
    )
    small = selector.select(smq.OP, shape(d=8192), random_call()[2])
    assert small.chosen.name == "high" and small.candidate("low").priority == 10
    assert "priority_rules" not in small.explain()


def test_first_matching_rule_naming_a_plugin_wins(make_selector):
    config = rules(rule(when={"max_rows_max": 768}, low=5), rule(low=300, high=10), rule(high=1))
    selector = make_selector(RecordingPlugin("low", 10), RecordingPlugin("high", 20), config=config)
    cfg = random_call()[2]
    # max_rows 768: rule 0 sets low = 5; rule 1 (the first naming high) sets high = 10; rule 2 is not used.
    sel = selector.select(smq.OP, shape(n=768), cfg)
    assert sel.chosen.name == "high" and (sel.candidate("low").priority, sel.candidate("high").priority) == (5, 10)
    assert "from priority_rules[0] (max_rows <= 768)" in sel.candidate("low").reason
    assert "from priority_rules[1] (every shape)" in sel.candidate("high").reason
    # max_rows 769: rule 0 does not match; rule 1 sets both.
    sel = selector.select(smq.OP, shape(n=769), cfg)
    assert sel.chosen.name == "low" and (sel.candidate("low").priority, sel.candidate("high").priority) == (300, 10)


def test_force_wins_over_rules_and_disabled_stays_disabled(make_selector):
    cfg = random_call()[2]
    forced = rules(rule(low=500), force={smq.OP: "high"})
    sel = make_selector(RecordingPlugin("low", 10), RecordingPlugin("high", 20), config=forced).select(
        smq.OP, shape(), cfg
    )
    assert sel.chosen.name == "high" and sel.candidate("low").verdict == Verdict.NOT_FORCED
    disabled = rules(rule(low=500), disable=["low"])
    sel = make_selector(RecordingPlugin("low", 10), RecordingPlugin("high", 20), config=disabled).select(
        smq.OP, shape(), cfg
    )
    assert sel.chosen.name == "high" and sel.candidate("low").verdict == Verdict.DISABLED
    assert "priority_rules[0]" in sel.candidate("low").reason


def test_rule_priority_applies_to_an_unsupported_plugin_without_choosing_it(make_selector):
    config = rules(rule(low=500))
    never = RecordingPlugin("low", 10, accept=lambda s, c: False)
    sel = make_selector(never, RecordingPlugin("high", 20), config=config).select(smq.OP, shape(), random_call()[2])
    assert sel.chosen.name == "high" and sel.candidate("low").verdict == Verdict.UNSUPPORTED


def test_rules_are_decided_once_per_key(make_selector):
    config = rules(rule(when={"hidden_min": 8193}, low=200))
    low = RecordingPlugin("low", 10)
    selector = make_selector(low, RecordingPlugin("high", 20), config=config)
    inputs, shp, cfg = random_call()
    for _ in range(3):
        selector.dispatch(smq.OP, inputs, shp, cfg)
    assert selector.cache_info()["decisions"] == 1 and low.supports_calls == 1


# -- the configuration value ----------------------------------------------------------------------------
def test_user_config_with_rules_is_frozen_and_hashable_by_value():
    a = rules(rule(when={"hidden_min": 8193, "max_rows_max": 10}, low=200, high=3))
    b = parse_config(
        {
            "priority_rules": [
                {"priority": {"high": 3, "low": 200}, "when": {"max_rows_max": 10, "hidden_min": 8193}, "op": smq.OP}
            ]
        },
        source=SRC,
    )
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    c = rules(rule(when={"hidden_min": 8194}, low=200, high=3))
    assert a != c
    with pytest.raises(AttributeError):
        a.priority_rules[0].op = "x"  # type: ignore[misc]
    assert isinstance(a.priority_rules, tuple)


def test_load_config_keeps_rules_from_the_file(tmp_path):
    path = tmp_path / "moe.toml"
    path.write_text(
        '[[priority_rules]]\nop = "silu_mul_quant"\nwhen = { hidden_min = 8193 }\npriority = { reference = 200 }\n'
    )
    config = load_config({"SGLANG_MOE_PLUGINS_CONFIG": str(path), "SGLANG_MOE_PLUGINS_DISABLE": "triton"})
    assert [r.describe() for r in config.priority_rules] == [
        "priority_rules[0]: silu_mul_quant where hidden >= 8193: reference = 200"
    ]
    assert "triton" in config.disable
    assert UserConfig().priority_rules == ()


# -- through SGLang's real load_plugins() and its hooked function -----------------------------------------
@pytest.mark.sglang
def test_hooked_call_takes_the_rules_plugin():
    """policy_prepared (priority 900) runs every call, except the bucket hidden >= 512 where a rule puts the
    reference (priority 0) first; the plugin that launched is counted."""
    pytest.importorskip("sglang")
    from importlib.metadata import EntryPoint

    from sglang_session import loaded_sglang

    from sglang_moe_plugins import api
    from sglang_moe_plugins.core.registry import ENTRY_POINT_GROUP

    runner = loaded_sglang()
    eps = [
        EntryPoint(
            "reference", "sglang_moe_plugins.plugins.reference.silu_mul_quant:ReferencePlugin", ENTRY_POINT_GROUP
        ),
        EntryPoint("policy_prepared", "policy_plugins:PreparedReference", ENTRY_POINT_GROUP),
    ]
    config = parse_config(
        {"priority_rules": [{"op": smq.OP, "when": {"hidden_min": 512}, "priority": {"reference": 1000}}]}
    )
    try:
        api.reload(config, entry_points=eps)
        selector = api.get_selector()
        prepared = selector.registry.get("policy_prepared").plugin
        for d, want, launches in ((256, "policy_prepared", 1), (512, "reference", 1), (384, "policy_prepared", 2)):
            gen = torch.Generator().manual_seed(d)
            gateup = (torch.randn(4, 8, 2 * d, generator=gen) * 3).to(torch.bfloat16)
            masked = torch.tensor([8, 0, 3, 5], dtype=torch.int32)
            out, _scale = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
            assert out.shape == (4, 8, d)
            sel = selector.explain(smq.OP, *smq.describe(gateup, masked, group_size=128, topk=2))
            assert sel.chosen.name == want, sel.explain()
            assert prepared.launches == launches
            if d == 512:
                assert sel.candidate("reference").reason.endswith(
                    "priority 1000 from priority_rules[0] (hidden >= 512) instead of 0"
                )
                assert sel.candidate("policy_prepared").verdict == Verdict.OUTRANKED
        assert selector.failed_plugins() == {}
    finally:
        api.reload(UserConfig())


# -- the command line -------------------------------------------------------------------------------------
def test_list_doctor_explain_show_the_rules(tmp_path):
    from test_cli import cli

    path = tmp_path / "moe.toml"
    path.write_text(
        '[[priority_rules]]\nop = "silu_mul_quant"\nwhen = { hidden_min = 512, num_experts_max = 512 }\n'
        "priority = { reference = 1000 }\n"
    )
    # This checkout's package, also when the console script was installed from another checkout.
    root = str(Path(__file__).resolve().parents[1])
    env = {"SGLANG_MOE_PLUGINS_CONFIG": str(path), "PYTHONPATH": root}
    want = "priority_rules[0]: silu_mul_quant where hidden >= 512, num_experts <= 512: reference = 1000"
    listed = cli("list", **env)
    assert listed.returncode == 0, listed.stderr
    assert f"  - {want}" in listed.stdout
    assert json.loads(cli("list", "--json", **env).stdout)["priority_rules"] == [want]
    doctor = cli("doctor", "--no-self-check", "--no-hooks", **env)
    assert f"  rule: {want}" in doctor.stdout, doctor.stdout + doctor.stderr
    data = json.loads(
        cli(
            "explain", "--experts", "512", "--hidden", "512", "--topk", "10", "--platform", "cpu", "--json", **env
        ).stdout
    )
    call = data["calls"][0]
    assert call["chosen"] == "reference" and data["priority_rules"] == [want]
    ref = next(c for c in call["candidates"] if c["name"] == "reference")
    assert ref["priority"] == 1000 and ref["reason"].endswith(
        "priority 1000 from priority_rules[0] (hidden >= 512, num_experts <= 512) instead of 0"
    )
    text = cli("explain", "--experts", "512", "--hidden", "512", "--topk", "10", "--platform", "cpu", **env).stdout
    assert f"priority rule: {want}" in text and "from priority_rules[0]" in text
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[priority_rules]]\nop = "silu_mul_quant"\nwhen = { rows_max = 768 }\npriority = { jit_ep = 300 }\n'
    )
    result = cli("list", SGLANG_MOE_PLUGINS_CONFIG=str(bad), PYTHONPATH=root)
    assert result.returncode == 2 and "unknown shape field 'rows' in priority_rules[0] in" in result.stderr
    assert "valid bounds: num_experts_min, num_experts_max, max_rows_min, max_rows_max" in result.stderr


# -- bench --write-config -----------------------------------------------------------------------------------
def test_bench_writes_a_rule_for_a_call_whose_fastest_plugin_is_not_first(monkeypatch, capsys, tmp_path):
    """Stubbed at the timer only: policy_prepared is fastest at N=4 (10 vs 20 us) and first overall; the
    reference is fastest at N=300 (20 vs 30 us): the file gets a rule for exactly that shape, which the real
    selection then follows."""
    from importlib.metadata import EntryPoint

    import sglang_moe_plugins.bench.runner as runner
    from sglang_moe_plugins import api
    from sglang_moe_plugins.cli import build_parser
    from sglang_moe_plugins.cli.bench import run_bench
    from sglang_moe_plugins.core.registry import ENTRY_POINT_GROUP

    for name in list(__import__("os").environ):
        if name.startswith("SGLANG_MOE_PLUGINS"):
            monkeypatch.delenv(name)
    eps = [
        EntryPoint(
            "reference", "sglang_moe_plugins.plugins.reference.silu_mul_quant:ReferencePlugin", ENTRY_POINT_GROUP
        ),
        EntryPoint("policy_prepared", "policy_plugins:PreparedReference", ENTRY_POINT_GROUP),
    ]
    times = {
        ("policy_prepared", 4): 10.0,
        ("reference", 4): 20.0,
        ("policy_prepared", 300): 30.0,
        ("reference", 300): 20.0,
    }

    class Timer:
        current = None

        def copy_bandwidth(self):
            return 4e12

        def time_us(self, calls):
            for call in calls:
                call()
            return times[self.current]

    timer = Timer()
    original = runner._time_plugin

    def timed(record, case, sets, t):
        timer.current = (record.name, case.shape.max_rows)
        return original(record, case, sets, t)

    monkeypatch.setattr(runner, "_time_plugin", timed)
    path = tmp_path / "priorities.toml"
    try:
        api.reload(UserConfig(), entry_points=eps)
        args = build_parser().parse_args(
            [
                "bench",
                "--experts",
                "4",
                "--hidden",
                "256",
                "--topk",
                "2",
                "--rows",
                "4,300",
                "--write-config",
                str(path),
                "--quiet",
            ]
        )
        assert run_bench(args, timer, torch.device("cpu")) == 0
        out = capsys.readouterr().out
        text = path.read_text()
        assert "# custom EP1 TP1 N=300: reference 20.00 us, policy_prepared (first in [priority]) 30.00 us" in text
        assert text.count("\n[[priority_rules]]\n") == 1
        assert "per-shape rules this measurement supports" in out and "N=300" in out
        config = load_config({"SGLANG_MOE_PLUGINS_CONFIG": str(path)})
        (r,) = config.priority_rules
        assert r.describe_bounds() == "group_size == 128, hidden == 256, max_rows == 300, num_experts == 4, topk == 2"
        assert dict(r.priority) == {"reference": max(config.priority.values()) + 10}
        selector = api.reload(config, entry_points=eps)
        cfg = random_call()[2]
        assert selector.select(smq.OP, shape(n=300), cfg).chosen.name == "reference"
        assert selector.select(smq.OP, shape(n=4), cfg).chosen.name == "policy_prepared"
        assert selector.select(smq.OP, shape(n=299), cfg).chosen.name == "policy_prepared"
    finally:
        api.reload(UserConfig())
