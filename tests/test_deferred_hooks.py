"""Start-up cost only where MoE runs: the package hooks SGLang's MoE targets when SGLang imports its MoE runner, not in
``load_plugins()`` (``integrations/sglang/deferred.py``).

- Through SGLang's real ``load_plugins()`` in a fresh process: nothing of the MoE runner is imported and nothing is
  hooked until SGLang imports it; then every target of the release is hooked, ``run_mega_routed_experts`` included,
  although SGLang imports the runner from inside ``sglang.srt.layers.quantization.fp8`` (resolving the MegaMoE target
  there, mid-chain, fails: the hooking waits for the outermost import), and the hooked function serves calls.
- The watcher itself on a package of this test's own: fired once, after the outermost import completes; a callback
  that raises is logged, never raised into the import; the original loader is back; the finder is gone.
- The measurement before and after: ``benchmarks/results/load_plugins_cost_cpu.md``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_moe_plugins.integrations.sglang.deferred import PendingHooks, when_imported

PROBE = """
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    load_plugins()
    from sglang_moe_plugins.integrations.sglang import hook_status
    result = {
        "moe_modules_before": sorted(m for m in sys.modules if m.startswith("sglang.srt.layers.moe")),
        "patched_before": sorted(t for t in HookRegistry._patched if "moe" in t),
        "pending_before": hook_status()["pending"],
        "finders_before": [type(f).__name__ for f in sys.meta_path],
    }
    import sglang.srt.layers.quantization.fp8  # imports the runner mid-chain, as a model's quantization does
    import torch
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    result.update(
        patched=sorted(HookRegistry._patched),
        pending=hook_status()["pending"],
        finders=[type(f).__name__ for f in sys.meta_path],
        loader=type(runner.__loader__).__name__,
        sources=sorted({
            getattr(source, "plugin_name", None) or "unknown"
            for target, hooks in HookRegistry._hooks.items() if "moe" in target for _type, _hook, source in hooks
        }),
    )
    out, scale = runner._varlen_deep_gemm_silu_mul_quant(
        torch.randn(2, 4, 512).to(torch.bfloat16), torch.tensor([4, 1], dtype=torch.int32), 128, 2
    )
    result["call"] = list(out.shape)
    print("RESULT " + json.dumps(result))
"""


@pytest.mark.sglang
def test_load_plugins_hooks_nothing_until_sglang_imports_its_moe_runner():
    pytest.importorskip("sglang")
    from sglang_moe_plugins.integrations.sglang.entry import RUNNER_MODULES
    from sglang_moe_plugins.integrations.sglang.versions import version_case

    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE)], capture_output=True, text=True, env=env, timeout=300
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    result = json.loads(line[len("RESULT ") :])
    assert result["moe_modules_before"] == [] and result["patched_before"] == [], result
    assert result["pending_before"] == list(RUNNER_MODULES) and "PendingHooks" in result["finders_before"], result
    targets = {t.path for t in version_case().targets}
    assert targets and targets <= set(result["patched"]), sorted(targets - set(result["patched"]))
    assert result["pending"] == [] and "PendingHooks" not in result["finders"], result
    assert result["loader"] == "SourceFileLoader", result  # the module keeps its own loader
    assert result["call"] == [2, 4, 256]  # served: E=2, N=4, D=256
    assert result["sources"] == ["moe_plugins"], (
        result
    )  # SGLang attributes the hooks to this plugin, as in load_plugins
    starts = [x for x in proc.stderr.splitlines() if " on SGLang " in x and "hooked:" in x]
    assert len(starts) == 1, proc.stderr[-3000:]


def _package(tmp_path, name: str) -> None:
    """``name.outer`` imports ``name.watched`` first and defines VALUE after it: ``outer`` is partly initialised
    while ``watched`` executes."""
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "watched.py").write_text("WATCHED = True\n")
    (root / "outer.py").write_text(f"from {name} import watched\nVALUE = 42\n")
    (root / "other.py").write_text("OTHER = 1\n")


def _drop(name: str, finder: PendingHooks | None) -> None:
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]
    if finder is not None:
        finder.remove()


def test_the_callback_waits_for_the_outermost_import_and_runs_once(tmp_path, monkeypatch):
    name = "dfp_waits"
    _package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def callback(trigger):  # reads the module that imported the watched one: complete only after its import
        seen.append((trigger, sys.modules[f"{name}.outer"].VALUE))

    finder = when_imported((f"{name}.watched",), callback, prefix=f"{name}.")
    try:
        assert finder is not None and finder in sys.meta_path
        import importlib

        importlib.import_module(f"{name}.other")
        assert seen == []  # not a watched module
        outer = importlib.import_module(f"{name}.outer")
        assert seen == [(f"{name}.watched", 42)], seen
        assert finder not in sys.meta_path and finder.done
        assert type(outer.__loader__).__name__ == "SourceFileLoader"
        assert type(sys.modules[f"{name}.watched"].__spec__.loader).__name__ == "SourceFileLoader"
        importlib.reload(outer)
        assert len(seen) == 1  # once per process
        # Already imported: at once.
        again = []
        assert when_imported((f"{name}.watched",), again.append, prefix=f"{name}.") is None
        assert again == [f"{name}.watched"]
    finally:
        _drop(name, finder)


def test_a_callback_that_raises_is_logged_never_raised_into_the_import(tmp_path, monkeypatch, caplog):
    name = "dfp_raises"
    _package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))

    def callback(trigger):
        raise RuntimeError("boom")

    finder = when_imported((f"{name}.watched",), callback, prefix=f"{name}.")
    try:
        import importlib

        with caplog.at_level(logging.ERROR, logger="sglang_moe_plugins"):
            module = importlib.import_module(f"{name}.watched")
        assert module.WATCHED is True
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and f"hooking on the import of {name}.watched failed" in errors[0].getMessage()
        assert errors[0].exc_info and "boom" in str(errors[0].exc_info[1])
        assert finder is not None and finder not in sys.meta_path
    finally:
        _drop(name, finder)


OTHER_PLUGIN_PROBE = """
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    load_plugins()  # this package waits for the runner
    seen = []
    def other(original, *args, **kwargs):  # another plugin's AROUND hook, registered and applied after load_plugins()
        seen.append(1)
        return original(*args, **kwargs)
    HookRegistry.register({target!r}, other, HookType.AROUND)
    HookRegistry.apply_hooks()  # {how}
    import torch
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    from sglang_moe_plugins.integrations.sglang.entry import hooked_ops
    def depth(fn):
        n = 0
        while hasattr(fn, "__wrapped__"):
            fn, n = fn.__wrapped__, n + 1
        return n
    call = runner._varlen_deep_gemm_silu_mul_quant
    out, scale = call(torch.randn(2, 4, 512).to(torch.bfloat16), torch.tensor([4, 1], dtype=torch.int32), 128, 2)
    print("RESULT " + json.dumps({{
        "smq_depth": depth(call), "other_calls": len(seen), "hooked": sorted(hooked_ops()),
        "guard_depth": depth(getattr(runner, "_masked_activation_unsupported_reason", None)),  # 0.5.20 on
    }}))
"""


@pytest.mark.sglang
@pytest.mark.parametrize(
    "case",
    [
        "same target, applied while SGLang's apply_hooks() imports the runner",
        "another target, applied before the runner is imported",
    ],
)
def test_another_plugins_hooks_are_applied_once_and_ours_never_silently_lost(case):
    """A hook of another plugin on one of this package's targets. While SGLang's ``apply_hooks()`` resolves it (and so
    imports the runner, which starts this package's hooking), both hooks are applied once each, not twice. A target
    another plugin hooked before the runner was imported (the compact activation lives outside it) cannot take this
    package's hook any more (SGLang applies a target once): one ERROR names it and its op stays SGLang's."""
    pytest.importorskip("sglang")
    from sglang_moe_plugins.integrations.sglang.version_table import CONTIG_RUNNER_TARGET, GUARD_TARGET, SMQ_TARGET
    from sglang_moe_plugins.integrations.sglang.versions import version_case

    same = case.startswith("same")
    contig = [
        t.path for t in version_case().targets if t.op == "silu_mul_quant_contig" and t.path != CONTIG_RUNNER_TARGET
    ]
    if not same and not contig:
        pytest.skip("this SGLang release has no compact activation target")
    code = OTHER_PLUGIN_PROBE.format(
        target=SMQ_TARGET if same else contig[0],
        how="imports the runner" if same else "imports only the activation's module",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    result = json.loads(line[len("RESULT ") :])
    errors = [x for x in proc.stderr.splitlines() if x.startswith("ERROR") and "another plugin's hooks" in x]
    if same:
        # each hook once (ours outermost: it serves the call without calling the other's, as any AROUND may)
        assert result["smq_depth"] == 2 and result["other_calls"] == 0, result
        has_guard = any(t.path == GUARD_TARGET for t in version_case().targets)  # the guard came in 0.5.20
        assert result["guard_depth"] == (1 if has_guard else 0), result
        assert "silu_mul_quant" in result["hooked"] and errors == [], (result, errors)
    else:
        assert result["smq_depth"] == 1 and result["other_calls"] == 0, result
        assert "silu_mul_quant_contig" not in result["hooked"], result
        assert len(errors) == 1 and contig[0] in errors[0] and "silu_mul_quant_contig" in errors[0], errors


def test_the_callback_runs_outside_the_lock_so_a_reentrant_fire_never_deadlocks(tmp_path, monkeypatch):
    """The callback imports modules; a re-entrant ``fire`` (or another thread's import reaching ``fire``) while it runs
    must return, not wait forever on the finder's lock."""
    import threading

    name = "dfp_reentrant"
    _package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def callback(trigger):
        seen.append(trigger)
        finder.fire("again")  # ignored: the finder has fired

    finder = when_imported((f"{name}.watched",), callback, prefix=f"{name}.")
    try:
        import importlib

        worker = threading.Thread(target=importlib.import_module, args=(f"{name}.outer",), daemon=True)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "fire() deadlocked on its own lock"
        assert seen == [f"{name}.watched"], seen
    finally:
        _drop(name, finder)


def test_the_callback_runs_when_the_outer_import_raises_after_the_watched_module(tmp_path, monkeypatch):
    name = "dfp_outer_raises"
    _package(tmp_path, name)
    (tmp_path / name / "broken.py").write_text(f"from {name} import watched\nraise ImportError('later')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = when_imported((f"{name}.watched",), seen.append, prefix=f"{name}.")
    try:
        import importlib

        with pytest.raises(ImportError, match="later"):
            importlib.import_module(f"{name}.broken")
        assert f"{name}.watched" in sys.modules  # imported, and SGLang may go on to use it
        assert seen == [f"{name}.watched"] and finder is not None and finder.done, seen
    finally:
        _drop(name, finder)


def test_a_watched_module_imported_by_a_finder_ahead_fires_on_the_next_import(tmp_path, monkeypatch):
    """A finder put ahead of this one after it was installed answers the watched module itself (its loader is never
    wrapped): the callback runs on the next import under the prefix."""
    import importlib
    import importlib.machinery

    name = "dfp_ahead"
    _package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = when_imported((f"{name}.watched",), seen.append, prefix=f"{name}.")

    class Ahead:
        def find_spec(self, fullname, path, target=None):
            if fullname == f"{name}.watched":
                return importlib.machinery.PathFinder.find_spec(fullname, path, target)
            return None

    ahead = Ahead()
    sys.meta_path.insert(0, ahead)
    try:
        importlib.import_module(f"{name}.watched")
        assert seen == []  # never saw it
        importlib.import_module(f"{name}.other")
        assert seen == [f"{name}.watched"] and finder is not None and finder.done, seen
    finally:
        sys.meta_path.remove(ahead)
        _drop(name, finder)


LATER_PLUGIN_PROBE = """
    import json, sys
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType, _current_plugin_source
    from sglang_moe_plugins.integrations.sglang.version_table import SMQ_TARGET
    load_plugins()  # this package waits for the runner
    seen = []
    def other(original, *args, **kwargs):
        seen.append(1)
        return original(*args, **kwargs)
    # A later plugin's function, as load_plugins() runs it: it imports the runner, then hooks one of our targets.
    token = _current_plugin_source.set(HookSource(plugin_name="later", dist_name="later-dist"))
    import sglang.srt.layers.moe.moe_runner.deep_gemm as runner
    HookRegistry.register(SMQ_TARGET, other, HookType.AROUND)
    _current_plugin_source.reset(token)
    HookRegistry.apply_hooks()  # what load_plugins() does after the plugins' functions
    def depth(fn):
        n = 0
        while hasattr(fn, "__wrapped__"):
            fn, n = fn.__wrapped__, n + 1
        return n
    from sglang_moe_plugins.integrations.sglang.entry import hooked_ops
    print("RESULT " + json.dumps({"smq_depth": depth(runner._varlen_deep_gemm_silu_mul_quant),
                                  "hooked": sorted(hooked_ops())}))
"""


@pytest.mark.sglang
def test_a_runner_imported_by_a_later_plugin_inside_load_plugins_keeps_that_plugins_hook():
    """Hooking triggered inside ``load_plugins()`` (a later plugin's function imports the runner) only registers: were
    the targets applied at once, SGLang's ``apply_hooks()`` would skip them afterwards and silently drop the later
    plugin's hook on the same target."""
    pytest.importorskip("sglang")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LATER_PLUGIN_PROBE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    result = json.loads(line[len("RESULT ") :])
    assert result["smq_depth"] == 2, result  # ours and the later plugin's, each applied once
    assert "silu_mul_quant" in result["hooked"], result
