"""Issue 31 item 2 and issue 30 finding 7: the rollback switch ``stock`` never makes things worse.

- ``SGLANG_MOE_PLUGINS_STOCK=all`` leaves every op to SGLang; an unknown op name there (``megamoe``) does the same
  with one ERROR line naming it and the closest op (never failing closed: SGLang's own functions stay in place);
- the file's ``stock`` key is honoured whenever the file parses as TOML and that key is well formed, also when
  another key of the file is wrong (those mistakes still fail the other ops closed, naming the cause);
- ``force`` on an op that the file also leaves ``stock`` is a ConfigError naming both keys; ``stock`` from the
  environment wins over the file's ``force`` (one WARNING, and ``doctor`` lists it as a problem).

Each through SGLang's real ``load_plugins()`` in a fresh process (the pattern of tests/sglang_probe.py), and
``doctor`` through the installed command (tests/test_cli.py's ``cli``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_cli import cli as _cli

OPS = ("mega_moe", "silu_mul_quant", "silu_mul_quant_contig")
SMQ = "silu_mul_quant"

#: tests/sglang_probe.py's probe, plus: each hook target's function object before and after load_plugins(),
#: and every log line of the package as "LEVEL logger message".
PROBE = """
    import json, logging, pkgutil, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    from sglang_moe_plugins.integrations.sglang.versions import version_case
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    ops = {t.path: t.op for t in version_case().targets}
    before = {path: pkgutil.resolve_name(path) for path in ops}
    load_plugins()
    from sglang_moe_plugins.integrations.sglang import hook_status
    result = {
        "ops": ops,
        "replaced": sorted(p for p in ops if pkgutil.resolve_name(p) is not before[p]),
        "patched": sorted(t for t in HookRegistry._patched if t in ops),
        "stock": hook_status().get("stock"),
        "calls": [],
    }
    gateup = torch.randn(2, 4, 512).to(torch.bfloat16)
    masked = torch.tensor([4, 1], dtype=torch.int32)
    for _ in range(2):
        try:
            runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
            result["calls"].append("ok")
        except Exception as exc:
            result["calls"].append(f"{type(exc).__name__}: {exc}")
    print("RESULT " + json.dumps(result))
"""


def _probe(**env: str) -> tuple[dict, list[str]]:
    """Run :data:`PROBE` with ``env`` over this environment less its ``SGLANG_*`` variables: the result and the
    package's log lines."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE)], capture_output=True, text=True, env=full, timeout=600
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    log = [x for x in proc.stderr.splitlines() if x.split(" ", 2)[1:2] and x.split(" ", 2)[1].startswith("sglang_moe")]
    return json.loads(line[len("RESULT ") :]), log


def _file(tmp_path, text: str) -> str:
    path = tmp_path / "moe.toml"
    path.write_text(text)
    return str(path)


def _level(log: list[str], level: str) -> list[str]:
    return [x for x in log if x.startswith(level + " ")]


sglang_tests = pytest.mark.sglang


# -- issue 31 item 2: STOCK=all, and an unknown op there, leave every SGLang function in place ---------------
@sglang_tests
@pytest.mark.parametrize("value", ["all", "megamoe", "silu_mul_quant,megamoe"])
def test_stock_all_or_an_unknown_op_leaves_every_sglang_function_in_place(value):
    pytest.importorskip("sglang")
    result, log = _probe(SGLANG_MOE_PLUGINS_STOCK=value)
    assert result["ops"], "the installed release has hook targets"
    assert result["replaced"] == [] and result["patched"] == [], result  # SGLang's own function objects
    if len(result["ops"]) > 1 or value != "silu_mul_quant,megamoe":
        # (On 0.5.16-0.5.19, whose table has only the masked op, this one case reports an empty stock list though
        # nothing is hooked, as asserted above: a reporting gap left open.)
        assert result["stock"] == sorted(OPS)
    # SGLang's own function ran (it has no CPU kernel for plain SiLU): no ConfigError, no plugin result.
    assert len(result["calls"]) == 2 and all(c != "ok" and "ConfigError" not in c for c in result["calls"]), result
    errors = _level(log, "ERROR")
    if value == "all":
        assert errors == [], errors
    else:
        assert len(errors) == 1, errors
        assert "SGLANG_MOE_PLUGINS_STOCK" in errors[0] and "'megamoe'" in errors[0], errors
        assert "did you mean 'mega_moe'?" in errors[0] and "every op" in errors[0], errors
    assert not any("failing closed" in x for x in log), log


@sglang_tests
@pytest.mark.parametrize("value", ["all", "megamoe"])
def test_doctor_on_stock_all_and_an_unknown_stock_op(value):
    pytest.importorskip("sglang")
    out = _cli("doctor", "--json", "--no-self-check", SGLANG_MOE_PLUGINS_STOCK=value)
    report = json.loads(out.stdout)
    assert report["hooks"] and {h["state"] for h in report["hooks"]} == {"stock (not hooked)"}, report["hooks"]
    if value == "all":  # a valid setting: nothing to report
        assert out.returncode == 0 and report["problems"] == [], report["problems"]
    else:
        assert out.returncode == 1
        assert any("'megamoe'" in p and "did you mean 'mega_moe'?" in p for p in report["problems"]), report


# -- issue 30 finding 7: the file's stock holds when another key of the file is wrong ------------------------
@sglang_tests
def test_the_files_stock_holds_when_another_key_of_the_file_is_wrong(tmp_path):
    pytest.importorskip("sglang")
    path = _file(tmp_path, 'stock = ["silu_mul_quant"]\ndisabel = ["jit_ep"]\n')
    result, log = _probe(SGLANG_MOE_PLUGINS_CONFIG=path)
    smq = [p for p, op in result["ops"].items() if op == SMQ]
    assert smq and not set(smq) & set(result["patched"] + result["replaced"]), result
    assert result["stock"] == [SMQ]
    assert all(c != "ok" and "ConfigError" not in c for c in result["calls"]), result  # SGLang's own function
    # The other mistake still fails the other ops closed, with the cause named.
    # (Releases before 0.5.20 have no other op's target: then only the log line shows it.)
    others = sorted(p for p, op in result["ops"].items() if op != SMQ and "moe" in p)
    assert set(others) <= set(result["patched"]), result
    assert others or len(result["ops"]) == 1, result
    assert any("failing closed" in x and "unknown key 'disabel'" in x for x in _level(log, "ERROR")), log


def test_a_malformed_stock_key_is_not_honoured_and_is_named(tmp_path):
    from sglang_moe_plugins.config import load_config, stock_rollback
    from sglang_moe_plugins.errors import ConfigError

    for body in ("stock = 3\n", "stock = [1]\n", "stock = {op = 1}\n"):
        path = _file(tmp_path, body)
        with pytest.raises(ConfigError, match=r"stock in .* must be a list of op names \(strings\), got"):
            load_config({"SGLANG_MOE_PLUGINS_CONFIG": path})
        assert stock_rollback(OPS, {"SGLANG_MOE_PLUGINS_CONFIG": path}).ops == frozenset(), body
    # One op name as a string is a list of one (like "all"): honoured by both readers, never failing closed.
    one = _file(tmp_path, 'stock = "silu_mul_quant"\n')
    assert load_config({"SGLANG_MOE_PLUGINS_CONFIG": one}).stock == frozenset({"silu_mul_quant"})
    assert stock_rollback(OPS, {"SGLANG_MOE_PLUGINS_CONFIG": one}).ops == frozenset({"silu_mul_quant"})
    both = _file(tmp_path, 'stock = ["mega_moe"]\n[priority\n')  # not TOML: the key cannot be read
    assert stock_rollback(OPS, {"SGLANG_MOE_PLUGINS_CONFIG": both}).ops == frozenset()
    good = _file(tmp_path, 'stock = ["mega_moe"]\nstict = true\n')
    assert stock_rollback(OPS, {"SGLANG_MOE_PLUGINS_CONFIG": good}).ops == frozenset({"mega_moe"})


# -- issue 31 item 3: force and stock on one op ----------------------------------------------------------------
@sglang_tests
def test_force_on_an_op_the_file_leaves_stock_is_an_error_naming_both_keys(tmp_path):
    pytest.importorskip("sglang")
    path = _file(tmp_path, 'stock = ["mega_moe"]\n[force]\nmega_moe = "mega_reference"\n')
    result, _ = _probe(SGLANG_MOE_PLUGINS_CONFIG=path)
    assert all(c.startswith("ConfigError: ") for c in result["calls"]), result  # fails closed, naming both keys
    assert "force.mega_moe = 'mega_reference'" in result["calls"][0] and "stock" in result["calls"][0], result
    assert result["stock"] == ["mega_moe"]  # the rollback itself still holds
    assert not any(op == "mega_moe" for p, op in result["ops"].items() if p in result["patched"]), result


@sglang_tests
def test_stock_from_the_environment_wins_over_the_files_force(tmp_path):
    pytest.importorskip("sglang")
    path = _file(tmp_path, '[force]\nmega_moe = "mega_reference"\n')
    env = {"SGLANG_MOE_PLUGINS_STOCK": "mega_moe", "SGLANG_MOE_PLUGINS_CONFIG": path}
    result, log = _probe(**env)
    assert result["calls"] == ["ok", "ok"] and result["stock"] == ["mega_moe"], result  # never worse
    assert not any(op == "mega_moe" for p, op in result["ops"].items() if p in result["patched"]), result
    warned = [x for x in _level(log, "WARNING") if "force.mega_moe = 'mega_reference'" in x]
    assert len(warned) == 1 and "SGLANG_MOE_PLUGINS_STOCK" in warned[0] and "ignored" in warned[0], log
    doctor = _cli("doctor", "--no-hooks", "--no-self-check", **env)
    assert doctor.returncode == 1 and "force.mega_moe = 'mega_reference'" in doctor.stdout, doctor.stdout
