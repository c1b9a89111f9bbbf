"""Issue 14: the version table against every listed SGLang release's source, and the rule for other releases.

The source checks download each release's wheel (``pip download --no-deps``, no install) into a cache
reused between runs (``SGLANG_MOE_PLUGINS_WHEEL_CACHE``, else ``$XDG_CACHE_HOME/sglang-moe-plugins/wheels``,
else ``~/.cache/...``) and read it with ``ast``: nothing of the release is imported. A release whose
wheel cannot be downloaded is skipped with the reason.
"""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import subprocess
import sys
import textwrap
import zipfile
from types import SimpleNamespace

import pytest
import torch

from sglang_moe_plugins import api
from sglang_moe_plugins.integrations.sglang import versions as sv
from sglang_moe_plugins.integrations.sglang.versions import KNOWN_TARGETS, MegaHost, SmqHost

RUNNER = "sglang/srt/layers/moe/moe_runner/deep_gemm.py"
MEGA = "sglang/srt/layers/moe/mega_moe.py"
MEGA_SM90 = "sglang/srt/layers/moe/mega_moe_sm90.py"
RELEASES = sorted(KNOWN_TARGETS, key=sv._release_key)
BEFORE_TABLE = "0.5.15.post1"  # the release before the table: its target has 6 parameters


def _cache_dir() -> pathlib.Path:
    explicit = os.environ.get("SGLANG_MOE_PLUGINS_WHEEL_CACHE")
    if explicit:
        return pathlib.Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "sglang-moe-plugins" / "wheels"


def _wheel(release: str) -> pathlib.Path:
    folder = _cache_dir() / release
    found = sorted(folder.glob(f"sglang-{release}-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={release}", "-d", str(folder)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        found = sorted(folder.glob(f"sglang-{release}-*.whl"))
        if proc.returncode != 0 or not found:
            pytest.skip(
                f"cannot download sglang=={release}: pip exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
            )
    return found[-1]


_sources: dict[tuple[str, str], str | None] = {}


def _source(release: str, member: str) -> str | None:
    key = (release, member)
    if key not in _sources:
        with zipfile.ZipFile(_wheel(release)) as whl:
            _sources[key] = whl.read(member).decode() if member in whl.namelist() else None
    return _sources[key]


def _function(release: str, member: str, name: str) -> ast.FunctionDef | None:
    source = _source(release, member)
    if source is None:
        return None
    return next((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _parameters(fn: ast.FunctionDef) -> tuple[str, ...]:
    a = fn.args
    return tuple(p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs))


def _target(release: str, op: str) -> sv.HookTarget | None:
    return next((t for t in KNOWN_TARGETS[release] if t.op == op), None)


def _module_and_name(path: str) -> tuple[str, str]:
    module, name = path.rsplit(".", 1)
    return module.replace(".", "/") + ".py", name


# --- the table against each release's source ---------------------------------------------------


@pytest.mark.parametrize("release", RELEASES)
def test_targets_present_with_the_tables_parameters(release: str) -> None:
    for target in KNOWN_TARGETS[release]:
        if target.op == "silu_mul_quant_contig":  # a method and a re-exported kernel: test_sglang_releases_contig.py
            continue
        member, name = _module_and_name(target.path)
        fn = _function(release, member, name)
        assert fn is not None, f"sglang {release}: {target.path} is missing"
        assert _parameters(fn) == target.parameters, f"sglang {release}: {target.path}"
    if _target(release, "mega_moe") is None:  # the table hooks no MegaMoE here: the release has none
        assert _function(release, MEGA, "run_mega_routed_experts") is None


def test_the_release_before_the_table_lacks_the_target() -> None:
    fn = _function(BEFORE_TABLE, RUNNER, "_varlen_deep_gemm_silu_mul_quant")
    assert fn is not None and "gemm1_alpha" not in _parameters(fn)


def _jit_condition(host: SmqHost) -> str:
    return " or ".join(f"{n} is not None" if n == "swiglu_limit" else n for n in host.jit_arguments)


@pytest.mark.parametrize("release", RELEASES)
def test_silu_mul_quant_branches_the_hook_relies_on(release: str) -> None:
    """The DSV4 JIT branch's condition and asserts, and the scale layout of every other call."""
    target = _target(release, "silu_mul_quant")
    host = target.host
    assert isinstance(host, SmqHost)
    fn = _function(release, RUNNER, "_varlen_deep_gemm_silu_mul_quant")
    ifs = [n for n in ast.walk(fn) if isinstance(n, ast.If)]
    # gemm1_alpha (not modelled: the hook hands it to SGLang) is decided before anything the table models.
    first_alpha = next(n for n in ifs if "gemm1_alpha" in ast.unparse(n.test))
    assert "gemm1_alpha is not None" in ast.unparse(first_alpha.test)
    if host.jit_arguments:
        (jit,) = [n for n in ifs if ast.unparse(n.test) == _jit_condition(host)]
        body = "\n".join(ast.unparse(s) for s in jit.body)
        assert "assert N % 4 == 0 and G % 4 == 0 and (D // 8 >= E)" in body
        assert "silu_and_mul_masked_post_quant(" in body and "transposed=packed_ue8m0" in body
        assert "(E, G // 4, N) if packed_ue8m0 else (E, N, G)" in body  # row-major fp32 or packed int32
        assert "down_input_scale.transpose(-1, -2)" in body
    last = fn.body[-1]
    if host.default_layout == "column_major":
        # Every other call: per_token_group_quant with column-major (TMA-aligned) scales.
        assert isinstance(last, ast.Return) and isinstance(last.value, ast.Call)
        call = last.value
        assert ast.unparse(call.func) == "per_token_group_quant"
        keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
        assert keywords["column_major_scales"] == "True" and keywords["fuse_silu_and_mul"] == "True"
        assert keywords["masked_m"] == "masked_m"
        assert keywords["scale_ue8m0"] == "deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0"
    else:
        # 0.5.16: no per_token_group_quant; the JIT kernel when the shape fits (env default on), else the
        # Triton kernel; both allocate row-major [E, N, G] fp32 scales (packed only on the JIT branch).
        assert host.default_layout == "row_major"
        text = ast.unparse(fn)
        assert "per_token_group_quant(" not in text.replace("sglang_per_token_group_quant_8bit(", "")
        assert "if N % 4 != 0 or G % 4 != 0 or D // 8 < E:\n        use_jit_ep_activation = False" in text
        allocations = [
            ast.unparse(n.value.args[0])
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign)
            and ast.unparse(n.targets[0]) == "down_input_scale"
            and ast.unparse(n.value.func) == "torch.empty"
        ]
        assert allocations and set(allocations) <= {"(E, N, G)", "(E, G // 4, N) if packed_ue8m0 else (E, N, G)"}


@pytest.mark.parametrize("release", [r for r in RELEASES if _target(r, "mega_moe") is not None])
def test_mega_moe_host_behaviour(release: str) -> None:
    host = _target(release, "mega_moe").host
    assert isinstance(host, MegaHost)
    fn = ast.unparse(_function(release, MEGA, "run_mega_routed_experts"))
    on_output = "y.mul_(routed_scaling_factor)" in fn
    on_weights = "topk_weights_in = topk_weights_in * routed_scaling_factor" in fn
    assert (on_output, on_weights) == (host.scaling_on_output, not host.scaling_on_output)
    # SM90: the factor goes to DeepGEMM's pre-dispatch (on the weights) in every release.
    assert "routed_scaling_factor=routed_scaling_factor" in fn and "run_sm90_mega_routed(" in fn
    sm90 = ast.unparse(_function(release, MEGA_SM90, "run_sm90_mega_routed"))
    assert "routed_scaling_factor=routed_scaling_factor" in sm90 and "mega_moe_pre_dispatch_sm90(" in sm90
    mma = ast.unparse(_function(release, MEGA, "_mega_moe_mma_type"))
    assert ("get_exec()" in mma) == host.mma_type_from_host
    assert ("experts._mega_moe_w4a4" in mma) == (not host.mma_type_from_host)
    buffer = _function(release, MEGA, "_get_mega_moe_symm_buffer")
    assert _parameters(buffer)[6:] == host.buffer_keywords
    # One adapter for every release, driven by the release's parameters: the keywords it takes are a
    # subset of the newest release's (no mega gate, no activation before 0.5.23).
    from sglang_moe_plugins.integrations.sglang import mega_moe

    params = _parameters(_function(release, MEGA, "run_mega_routed_experts"))
    assert set(params[4:]) <= mega_moe.KNOWN_KWARGS and _target(release, "mega_moe").parameters == params
    assert _target(release, "mega_moe").hook == "sglang_moe_plugins.integrations.sglang.mega_moe:mega_moe_hook"


# --- the host records ----------------------------------------------------------------------------


def test_scale_layout_per_release() -> None:
    from sglang_moe_plugins.integrations.sglang.silu_mul_quant import release_scale_layout as layout

    plain, limit, keep = {}, {"swiglu_limit": 10.0}, {"silu_mul_keep_fp32": True}
    h16, h19, h23 = (_target(r, "silu_mul_quant").host for r in ("0.5.16", "0.5.19", "0.5.23"))
    assert [layout(h16, a, False) for a in (plain, limit, keep)] == ["row_major"] * 3
    assert [layout(h19, a, False) for a in (plain, limit, keep)] == ["column_major", "row_major", "column_major"]
    assert [layout(h23, a, False) for a in (plain, limit, keep)] == ["column_major", "row_major", "row_major"]
    assert {layout(h, a, True) for h in (h16, h19, h23) for a in (plain, limit)} == {"ue8m0_packed"}


# --- the rule for releases outside the table ---------------------------------------------------------


def test_version_cases_simulated() -> None:
    pytest.importorskip("sglang")
    installed = sv.sglang_version()
    entry = KNOWN_TARGETS[installed]
    table = {"0.5.1": entry}
    newer = sv.version_case(installed, table, environ={})
    assert newer.case == "newer" and newer.hooks and all(c.ok for c in newer.checks)
    assert f"sglang {installed} is newer than the tested releases (known: 0.5.1)" in newer.message
    refused = sv.version_case(installed, table, environ={sv.REQUIRE_KNOWN_ENV: "1"})
    assert refused.case == "newer-refused" and not refused.hooks and not any(c.ok for c in refused.checks)
    changed = (
        sv.HookTarget(entry[0].path, entry[0].op, entry[0].parameters[:-1], entry[0].hook, entry[0].host),
        *entry[1:],
    )
    mismatch = sv.version_case(installed, {"0.5.1": changed}, environ={})
    assert mismatch.case == "newer-mismatch" and not mismatch.hooks and not any(c.ok for c in mismatch.checks)
    assert "signature differs" in mismatch.message
    older = sv.version_case(installed, {"99.0": entry}, environ={})
    assert older.case == "unsupported" and not older.hooks
    between = sv.version_case("0.5.20.post1", environ={})
    assert between.case == "unsupported" and "not in the version table" in between.message
    known = sv.version_case(installed, environ={sv.REQUIRE_KNOWN_ENV: "1"})
    assert known.case == "known" and all(c.ok for c in known.checks)


def test_release_ordering() -> None:
    key = sv._release_key
    assert (
        key("0.5.9")
        < key("0.5.16")
        < key("0.5.23")
        < key("0.5.23.post1")
        < key("0.5.24rc0")
        < key("0.5.24")
        < key("0.6")
    )


#: The table as it would be if the installed release were its newest (a no-op on 0.5.23): "0.5.99" is then
#: a newer release with the installed release's signatures, on whichever release the tests run.
TRUNCATE = (
    "installed = sv.sglang_version(); "
    "[sv.KNOWN_TARGETS.pop(r) for r in list(sv.KNOWN_TARGETS) if sv._release_key(r) > sv._release_key(installed)]"
)

PROBE = """
    import logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
    from sglang_moe_plugins.integrations.sglang import versions as sv
    {truncate}
    sv.sglang_version = lambda: "0.5.99"
    {pre}
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    load_plugins()
    import sglang.srt.layers.moe.moe_runner.deep_gemm  # the MoE targets are hooked when SGLang imports its runner
    print("PATCHED", sorted(t for t in HookRegistry._patched if "moe" in t))
"""


def _probe(pre: str = "", **env: str) -> str:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full_env.update(env)
    code = textwrap.dedent(PROBE).format(truncate=TRUNCATE, pre=pre)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.sglang
def test_newer_release_is_hooked_through_load_plugins_with_one_warning() -> None:
    pytest.importorskip("sglang")
    from sglang_session import hooked_targets

    out = _probe()
    warnings = [line for line in out.splitlines() if line.startswith("WARNING sglang_moe_plugins")]
    assert len(warnings) == 1 and "sglang 0.5.99 is newer than the tested releases" in warnings[0], out
    assert f"PATCHED {sorted(t for t in hooked_targets() if 'moe' in t)}" in out  # the probe lists moe targets


@pytest.mark.sglang
def test_newer_release_refused_when_a_known_release_is_required() -> None:
    pytest.importorskip("sglang")
    out = _probe(**{sv.REQUIRE_KNOWN_ENV: "1"})
    warnings = [line for line in out.splitlines() if line.startswith("WARNING sglang_moe_plugins")]
    assert len(warnings) == 1 and f"{sv.REQUIRE_KNOWN_ENV}=1 requires a known release; no hooks" in warnings[0], out
    assert "PATCHED []" in out


@pytest.mark.sglang
def test_newer_release_with_a_changed_signature_is_not_hooked() -> None:
    pytest.importorskip("sglang")
    pre = """
    newest = max(sv.KNOWN_TARGETS, key=sv._release_key)
    t = sv.KNOWN_TARGETS[newest][0]
    sv.KNOWN_TARGETS[newest] = (sv.HookTarget(t.path, t.op, t.parameters + ("extra",), t.hook, t.host), *sv.KNOWN_TARGETS[newest][1:])
    """
    out = _probe(textwrap.dedent(pre))
    warnings = [line for line in out.splitlines() if line.startswith("WARNING sglang_moe_plugins")]
    assert (
        len(warnings) == 1 and "is newer than the version table" in warnings[0] and "signature differs" in warnings[0]
    ), out
    assert "PATCHED []" in out


# --- 0.5.21 / 0.5.22 MegaMoE adapter (CPU, through the mega_reference plugin) -------------------------


def _old_host(parameters: tuple[str, ...]):
    """A function with exactly the old host's parameter list (what the hook binds against)."""
    calls = []
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in parameters[:4]]
    defaults = {
        "activation_clamp": None,
        "routed_scaling_factor": 1.0,
        "num_shared_experts": 0,
        "shared_l1_weights": None,
        "shared_l2_weights": None,
    }
    params += [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(n, inspect.Parameter.empty))
        for n in parameters[4:]
    ]

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "original"

    original.__signature__ = inspect.Signature(params)
    return original, calls


@pytest.mark.parametrize("release", ["0.5.21", "0.5.22"])
def test_old_mega_adapter_runs_the_op_as_the_release_does(release: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sglang.srt.layers.moe.mega_moe")
    from _mega_cases import make_problem

    from sglang_moe_plugins.integrations.sglang import mega_moe as mega

    target = _target(release, "mega_moe")
    monkeypatch.setattr(sv, "_active", {"mega_moe": target})
    monkeypatch.setattr(mega, "_ep_group", lambda: None)
    mega.reset()
    problem = make_problem("fp8xfp4", rsf=2.5, seed=14)
    i, s, c = problem.inputs, problem.shape, problem.config
    experts = SimpleNamespace(
        _mega_moe_weights_built=True,
        _mega_moe_nvfp4=False,
        _mega_moe_w4a4=False,
        _mega_moe_sm90_fp8_weights=False,
        num_experts=s.num_experts,
        moe_ep_size=1,
        mega_l1_weights=i.l1_weights,
        mega_l2_weights=i.l2_weights,
    )
    original, calls = _old_host(target.parameters)
    kwargs = dict(
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        top_k=s.top_k,
        num_tokens=i.num_tokens,
        activation_clamp=c.activation_clamp,
        routed_scaling_factor=2.5,
    )
    y = mega.mega_moe_hook(original, experts, i.hidden_states, i.topk_ids, i.topk_weights, **kwargs)
    assert not calls and isinstance(y, torch.Tensor) and y.shape == (i.num_tokens, s.hidden)
    behaviour = target.host
    call = mega.build_call(experts, i.hidden_states, i.topk_ids, i.topk_weights, **kwargs)
    assert call.config.routed_scaling_factor == (1.0 if behaviour.scaling_on_output else 2.5)
    assert call.output_scale == (2.5 if behaviour.scaling_on_output else 1.0)
    from sglang_moe_plugins import api

    unscaled = mega.build_call(
        experts, i.hidden_states, i.topk_ids, i.topk_weights, **{**kwargs, "routed_scaling_factor": 1.0}
    )
    base = (
        api.get_selector()
        .dispatch("mega_moe", unscaled.inputs, unscaled.shape, unscaled.config, outputs=unscaled.allocate_outputs())
        .y[: i.num_tokens]
        .float()
    )
    if behaviour.scaling_on_output:  # 0.5.21: y.mul_(rsf) on the bf16 output, exactly
        assert torch.equal(y, (base.to(torch.bfloat16) * 2.5).to(torch.bfloat16))
    else:  # 0.5.22: the top-k weights carry the factor (as 0.5.23): the op's own result, unchanged
        again = api.get_selector().dispatch(
            "mega_moe", call.inputs, call.shape, call.config, outputs=call.allocate_outputs()
        )
        assert torch.equal(y, again.y[: i.num_tokens]) and not torch.equal(y, (base * 2.5).to(torch.bfloat16))
    # NVFP4 experts are not modelled: the original runs, unchanged.
    nvfp4 = SimpleNamespace(**{**vars(experts), "_mega_moe_nvfp4": True})
    assert mega.mega_moe_hook(original, nvfp4, i.hidden_states, i.topk_ids, i.topk_weights, **kwargs) == "original"
    assert len(calls) == 1
    # A keyword the release does not take (0.5.23's routing_in_buffer) is not modelled: the original gets it.
    assert (
        mega.mega_moe_hook(
            original, experts, i.hidden_states, i.topk_ids, i.topk_weights, **kwargs, routing_in_buffer=False
        )
        == "original"
    )
    assert len(calls) == 2 and calls[-1][1]["routing_in_buffer"] is False
    mega.reset()


DOCTOR = """
    import contextlib, io, json, os
    from sglang_moe_plugins.integrations.sglang import versions as sv
    from sglang_moe_plugins.cli import main
    {truncate}
    real = sv.sglang_version
    for version, require in ((None, ""), ("0.5.99", ""), ("0.5.99", "1")):
        sv.sglang_version = (lambda: version) if version else real
        os.environ[sv.REQUIRE_KNOWN_ENV] = require
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["doctor", "--json", "--no-self-check"])
        print("REPORT " + json.dumps(json.loads(out.getvalue())))
"""


@pytest.mark.sglang
def test_doctor_reports_the_case() -> None:
    """doctor (one process, three situations): the installed release, a newer one, a newer one refused."""
    import json

    pytest.importorskip("sglang")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    code = textwrap.dedent(DOCTOR).format(truncate=TRUNCATE)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    known, newer, refused = (json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("REPORT "))
    assert (
        known["sglang release"]["case"] == "known" and known["sglang release"]["table_release"] == sv.sglang_version()
    )
    assert all(h["state"] == "would hook" for h in known["hooks"])
    assert newer["sglang release"]["case"] == "newer" and "0.5.99" in newer["sglang release"]["message"]
    assert newer["hooks"] and all(h["state"] == "would hook" for h in newer["hooks"])
    assert refused["sglang release"]["case"] == "newer-refused"
    assert all(h["state"] == "NOT hooked" for h in refused["hooks"]) and refused["problems"]


@pytest.mark.sglang
@pytest.mark.parametrize("release, strides", [("0.5.16", (24, 4, 1)), ("0.5.19", (32, 1, 8))])
def test_hooked_function_returns_the_layout_of_the_table_entry(
    release: str, strides, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through real load_plugins(): the hook takes the scale layout from the release's record (0.5.16: row-major)."""
    pytest.importorskip("sglang")
    from sglang_session import loaded_sglang

    runner = loaded_sglang()
    monkeypatch.setattr(sv, "_active", {"silu_mul_quant": _target(release, "silu_mul_quant")})
    # The release is fixed for a process, so the hook's raw-argument keys do not hold it: start from an
    # empty call cache when the test switches releases inside one process.
    monkeypatch.setattr(api.current_selector(), "call_cache", {})
    gen = torch.Generator().manual_seed(16)
    gateup = (torch.randn(2, 6, 2 * 512, generator=gen) * 4).to(torch.bfloat16)
    masked = torch.tensor([6, 3], dtype=torch.int32)
    out, scale = runner._varlen_deep_gemm_silu_mul_quant(gateup, masked, 128, 2)
    assert out.shape == (2, 6, 512) and scale.shape == (2, 6, 4) and scale.stride() == strides
    assert torch.isfinite(scale[0]).all() and (scale[0] > 0).all()


def test_a_local_build_of_a_listed_release_is_that_release() -> None:
    """``0.5.23+cu129`` (a local build) gets 0.5.23's table entry, not "unsupported"."""
    case = sv.version_case("0.5.19+local.build", environ={})
    assert case.table_release == "0.5.19" and case.case in ("known",), case.message
