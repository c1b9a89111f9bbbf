"""The operators' parity mode, the withheld reference on CUDA and the start-up line, through SGLang's real
``load_plugins()`` and its hooked ``_varlen_deep_gemm_silu_mul_quant`` in fresh processes.

- ``parity = true`` (``SGLANG_MOE_PLUGINS_PARITY=1``): every masked call that the installed release serves goes to
  SGLang's own function (what it returns or raises is exactly what the unhooked function does); the package's
  plugins run only the calls SGLang's own code crashes on; the compact step and MegaMoE are left unhooked, and so
  are the masked-layout guard and policy.
- ``reference_on_gpu``: the pure-torch references never serve a CUDA call unless forced or allowed (decide()).
- One start-up line per process: the version, the release, the hooked and stock ops and the config file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_moe_plugins.contract import Support

sglang_tests = pytest.mark.sglang

PROBE = """
    import inspect, json, logging, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    load_plugins()
    from sglang_moe_plugins import counters
    from sglang_moe_plugins.integrations.sglang import hook_status
    from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference
    from sglang_moe_plugins.ops import silu_mul_quant as smq

    hooked = runner._varlen_deep_gemm_silu_mul_quant
    stock = inspect.unwrap(hooked)

    def outcome(fn, *args, **kwargs):
        try:
            out, scale = fn(*args, **kwargs)
        except Exception as exc:
            return {"raises": f"{type(exc).__name__}: {exc}"}
        return {"out": out.view(torch.uint8).flatten().tolist()[:64], "scale": scale.flatten().tolist()[:16],
                "shape": list(out.shape)}

    torch.manual_seed(0)
    result = {"patched": sorted(t for t in HookRegistry._patched if "moe" in t), "stock": hook_status().get("stock"),
              "cases": {}}
    cases = {
        # (E, N, D, limit): plain SiLU (every release serves it), and a clamped call whose D // 8 < E (SGLang's
        # own asserts raise before any kernel on every release: the crash the package exists for)
        "plain": (2, 4, 512, None),
        "crash": (256, 8, 512, 10.0),
    }
    for name, (e, n, d, limit) in cases.items():
        gateup = (torch.rand(e, n, 2 * d) * 4 - 2 + 0.01).to(torch.bfloat16)
        masked = torch.randint(1, n + 1, (e,), dtype=torch.int32)
        kwargs = {} if limit is None else {"swiglu_limit": limit}
        before = counters.totals()
        got = [outcome(hooked, gateup, masked, 128, 2, **kwargs) for _ in range(2)]  # cold, then warm
        after = counters.totals()
        delta = {"/".join(k): v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        want = outcome(stock, gateup, masked, 128, 2, **kwargs)
        # The package's own answer for the same call (the reference's numerics on CPU), where SGLang's crashes.
        shape, config = smq.describe(gateup, masked, group_size=128, topk=2, swiglu_limit=limit,
                                     scale_layout="row_major" if limit is not None else "column_major")
        outputs = smq.allocate_outputs(shape, config, gateup.device)
        outputs.out.view(torch.uint8).fill_(0x7F)
        silu_mul_quant_reference(smq.SiluMulQuantInputs(gateup, masked, None, True), outputs, shape, config)
        package = {"out": outputs.out.view(torch.uint8).flatten().tolist()[:64]}
        result["cases"][name] = {"hooked": got, "stock": want, "package": package, "counters": delta}
    print("RESULT " + json.dumps(result))
"""

SMQ = "sglang.srt.layers.moe.moe_runner.deep_gemm._varlen_deep_gemm_silu_mul_quant"
GUARD = "sglang.srt.layers.moe.moe_runner.deep_gemm._masked_activation_unsupported_reason"


def _probe(**env: str) -> tuple[dict, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE)], capture_output=True, text=True, env=full, timeout=300
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[len("RESULT ") :]), proc.stderr


def _plugin_calls(delta: dict) -> int:
    """Calls counted for the masked op's plugins (reference, or an installed CPU plugin such as the example's), when
    nothing else was counted; -1 otherwise."""
    if not delta or not all(k.startswith("calls/silu_mul_quant/") for k in delta):
        return -1
    return sum(delta.values())


def _release() -> str:
    from sglang_moe_plugins.integrations.sglang.versions import sglang_version

    release = sglang_version()
    if release is None:
        pytest.skip("SGLang is not installed")
    return release


@sglang_tests
def test_parity_hands_every_call_sglang_serves_to_its_own_function_and_serves_only_its_crashes():
    release = _release()
    result, log = _probe(SGLANG_MOE_PLUGINS_PARITY="1")
    # Only the masked function is hooked: the compact step, MegaMoE and the layout guard stay SGLang's own.
    assert SMQ in result["patched"] and GUARD not in result["patched"], result["patched"]
    assert all("mega_moe" not in p and "contig" not in p for p in result["patched"]), result["patched"]
    assert result["stock"] == ["mega_moe", "silu_mul_quant_contig"], result["stock"]

    plain = result["cases"]["plain"]
    # What SGLang's own function does with the call (on this CPU its kernel cannot run: it raises), exactly.
    assert plain["hooked"] == [plain["stock"], plain["stock"]], plain
    assert plain["counters"] == {"delegations/silu_mul_quant/parity": 1, "delegations/silu_mul_quant/host": 1}, plain
    crash = result["cases"]["crash"]
    assert crash["stock"]["raises"].startswith("AssertionError"), crash["stock"]  # SGLang's own code crashes
    assert crash["hooked"][0] == crash["hooked"][1] and "raises" not in crash["hooked"][0], crash["hooked"]
    assert crash["hooked"][0]["out"] == crash["package"]["out"], "the package's plugin serves the crash shape"
    assert _plugin_calls(crash["counters"]) == 2, crash["counters"]  # a plugin's calls, no delegation
    # One start-up line: version, release, hooked and stock ops, parity, config file.
    from sglang_moe_plugins._version import __version__

    line = f"sglang-moe-plugins {__version__} on SGLang {release}: hooked: silu_mul_quant; "
    starts = [x for x in log.splitlines() if line in x]
    assert len(starts) == 1 and starts[0].startswith("INFO "), log[-3000:]
    assert "stock: mega_moe, silu_mul_quant_contig (parity); config: none" in starts[0], starts[0]
    assert not [x for x in log.splitlines() if x.startswith("WARNING sglang_moe_plugins")], log[-3000:]


@sglang_tests
def test_without_parity_the_package_serves_the_call_sglang_would_serve():
    _release()
    result, log = _probe()
    plain = result["cases"]["plain"]
    assert plain["hooked"][0] == plain["hooked"][1] and "raises" not in plain["hooked"][0], plain
    assert plain["hooked"][0]["out"] == plain["package"]["out"]
    assert _plugin_calls(plain["counters"]) == 2, plain["counters"]
    assert sum("sglang-moe-plugins 0." in x and " on SGLang " in x for x in log.splitlines()) == 1, log[-3000:]


@sglang_tests
def test_parity_from_the_file_and_the_server_argument_name_the_force_they_contradict(tmp_path):
    from sglang_moe_plugins.config import load_config
    from sglang_moe_plugins.errors import ConfigError

    path = tmp_path / "moe.toml"
    path.write_text('parity = true\n[force]\nmega_moe = "mega_reference"\n')
    config = load_config({"SGLANG_MOE_PLUGINS_CONFIG": str(path)})
    assert config.parity and config.masked_layout == "sglang"
    with pytest.raises(
        ConfigError, match=r"force.mega_moe = 'mega_reference'.*contradicts stock \(left to SGLang by parity"
    ):
        config.check_names({"mega_reference": "mega_moe"}, ("mega_moe", "silu_mul_quant", "silu_mul_quant_contig"))
    path.write_text("parity = 1\n")
    with pytest.raises(ConfigError, match=r"parity in .* must be true or false, got 1"):
        load_config({"SGLANG_MOE_PLUGINS_CONFIG": str(path)})
    from sglang_moe_plugins.config import stock_rollback

    ops = ("mega_moe", "silu_mul_quant", "silu_mul_quant_contig")
    assert stock_rollback(ops, {"SGLANG_MOE_PLUGINS_PARITY": "maybe"}).parity  # an invalid value still rolls back
    assert stock_rollback(ops, {"SGLANG_MOE_PLUGINS_PARITY": "0"}).ops == frozenset()
    from sglang_moe_plugins.integrations.sglang.server_args import SWITCHES

    assert {s.flag: s.env for s in SWITCHES}["--moe-plugins-parity"] == "SGLANG_MOE_PLUGINS_PARITY"


def test_the_reference_is_withheld_from_cuda_calls_unless_forced_or_allowed():
    """decide() on an sm90 key: the pure-torch reference is never the silent answer on a GPU."""
    from sglang_moe_plugins.config import UserConfig
    from sglang_moe_plugins.core.decide import Verdict
    from sglang_moe_plugins.core.dispatcher import Selector
    from sglang_moe_plugins.core.registry import Registry
    from sglang_moe_plugins.errors import NoPluginAvailableError
    from sglang_moe_plugins.hardware import Platform
    from sglang_moe_plugins.ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape

    shape = SiluMulQuantShape(8, 16, 512, 128, 2)
    config = SiluMulQuantConfig(Platform.cuda(9, 0), None, False, "column_major")
    from sglang_moe_plugins.plugins.reference import ReferencePlugin

    def selection(**settings):  # the reference alone: as with triton, fp8_fallback and jit_ep disabled
        return Selector(Registry.from_plugins([ReferencePlugin()], UserConfig(**settings)))

    selector = selection()
    with pytest.raises(NoPluginAvailableError) as info:
        selector.select("silu_mul_quant", shape, config)
    assert info.value.to_host and selector.explain("silu_mul_quant", shape, config).candidate("reference").verdict == (
        Verdict.WITHHELD
    )
    assert "withheld from CUDA calls (reference_on_gpu = false): SGLang's own function runs the call" in str(info.value)
    strict = selection(strict=True)
    with pytest.raises(NoPluginAvailableError, match="under strict the call fails") as info:
        strict.select("silu_mul_quant", shape, config)
    assert not info.value.to_host
    assert selection(reference_on_gpu=True).select("silu_mul_quant", shape, config).chosen.name == "reference"
    forced = selection(force={"silu_mul_quant": "reference"})
    assert forced.select("silu_mul_quant", shape, config).chosen.name == "reference"
    cpu = SiluMulQuantConfig(Platform.cpu(), None, False, "column_major")
    assert selector.select("silu_mul_quant", shape, cpu).chosen.name == "reference"  # CPU: its home


def test_only_a_reference_that_would_serve_the_call_is_withheld():
    """An unsupported reference says why it cannot take the call, an outranked one that a kernel comes first:
    ``withheld`` (and the hand-back to SGLang's function) only where the reference is what would run."""
    from sglang_moe_plugins.config import UserConfig
    from sglang_moe_plugins.core.decide import Verdict
    from sglang_moe_plugins.core.dispatcher import Selector
    from sglang_moe_plugins.core.registry import Registry
    from sglang_moe_plugins.errors import NoPluginAvailableError
    from sglang_moe_plugins.hardware import Platform
    from sglang_moe_plugins.ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape
    from sglang_moe_plugins.plugins.reference import ReferencePlugin

    class Kernel(ReferencePlugin):  # a kernel for E <= 8 only, ahead of the reference
        name, priority, oracle = "small_kernel", 50, False

        def supports(self, shape, config):
            return Support.yes("E <= 8") if shape.num_experts <= 8 else Support.no(f"E={shape.num_experts} > 8")

    class NarrowReference(ReferencePlugin):  # an oracle that does not take E > 16
        name, priority = "narrow_reference", 1

        def supports(self, shape, config):
            return Support.yes() if shape.num_experts <= 16 else Support.no(f"E={shape.num_experts} > 16")

    selector = Selector(Registry.from_plugins([Kernel(), NarrowReference()], UserConfig()))
    config = SiluMulQuantConfig(Platform.cuda(9, 0), None, False, "column_major")

    def verdicts(experts):
        selection = selector.explain("silu_mul_quant", SiluMulQuantShape(experts, 16, 512, 128, 2), config)
        return [(c.name, c.verdict) for c in selection.candidates]

    assert verdicts(8) == [("small_kernel", Verdict.CHOSEN), ("narrow_reference", Verdict.OUTRANKED)]
    assert verdicts(12) == [("small_kernel", Verdict.UNSUPPORTED), ("narrow_reference", Verdict.WITHHELD)]
    assert verdicts(32) == [("small_kernel", Verdict.UNSUPPORTED), ("narrow_reference", Verdict.UNSUPPORTED)]

    # A withheld reference ranked first does not end the search: the kernel after it serves the call.
    class FirstReference(NarrowReference):
        name, priority = "first_reference", 100

    ahead = Selector(Registry.from_plugins([Kernel(), FirstReference()], UserConfig()))
    selection = ahead.explain("silu_mul_quant", SiluMulQuantShape(8, 16, 512, 128, 2), config)
    assert [(c.name, c.verdict) for c in selection.candidates] == [
        ("first_reference", Verdict.WITHHELD),
        ("small_kernel", Verdict.CHOSEN),
    ]
    with pytest.raises(NoPluginAvailableError) as info:  # nothing would run it: an error, not a hand-back
        selector.select("silu_mul_quant", SiluMulQuantShape(32, 16, 512, 128, 2), config)
    assert not info.value.to_host and "E=32 > 16" in str(info.value)


@sglang_tests
def test_explain_says_what_parity_runs():
    """``explain`` under parity: SGLang's own function where stock serves, the plugin where stock crashes, and the
    compact step and MegaMoE stock."""
    _release()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["SGLANG_MOE_PLUGINS_PARITY"] = "1"

    def calls(*args: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "sglang_moe_plugins", "explain", "--model", "DeepSeek-V4-Flash", *args, "--rows",
             "128", "--platform", "sm90", "--json"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        return {c["op"]: c for c in json.loads(proc.stdout)["calls"]}

    served = calls("--ep", "8")["silu_mul_quant"]  # E=32 D=2048: the DSV4 JIT kernel takes it
    assert served["outcome"].startswith("SGLang's own function runs it (parity") and served["chosen"] is None, served
    crash = calls("--tp", "4")
    assert crash["silu_mul_quant"]["chosen"] and crash["silu_mul_quant"]["stock"]["raises"], crash["silu_mul_quant"]
    for op in ("silu_mul_quant_contig", "mega_moe"):
        assert crash[op]["outcome"].startswith("stock SGLang runs it (op"), crash[op]


@pytest.mark.parametrize("release", ["0.5.16", "0.5.19", "0.5.20", "0.5.23"])
def test_the_parity_rule_and_explains_stock_column_agree(release):
    """The runtime rule (stock_rules) and explain's stock outcome (layout_view) crash on exactly the same calls,
    release by release, over a grid that crosses every limit (N % 4, G % 4, D // 8 >= E, the JIT kernel's D and E)."""
    from sglang_moe_plugins.cli.layout_view import stock_masked
    from sglang_moe_plugins.integrations.sglang.stock_rules import masked_stock_crash
    from sglang_moe_plugins.integrations.sglang.version_table import KNOWN_TARGETS

    host = next(t.host for t in KNOWN_TARGETS[release] if t.op == "silu_mul_quant")
    seen = set()
    for experts in (1, 8, 32, 64, 65, 256, 384):
        for hidden in (128, 384, 512, 1536, 2048, 7168, 8192, 9216):
            for rows in (1, 6, 8, 128):
                for group in (128, 32):
                    for limit in (None, 10.0):
                        if hidden % group:
                            continue
                        rule = masked_stock_crash(
                            host.jit_arguments, experts=experts, rows=rows, hidden=hidden, group_size=group,
                            swiglu_limit=limit,
                        )  # fmt: skip
                        view = stock_masked(
                            release,
                            experts=experts,
                            rows=rows,
                            hidden=hidden,
                            group_size=group,
                            clamped=limit is not None,
                        )
                        assert (rule is not None) == view.raises, (experts, hidden, rows, group, limit, rule, view)
                        seen.add(view.raises)
    assert seen == {True, False}
