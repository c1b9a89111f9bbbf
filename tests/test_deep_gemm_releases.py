"""Every sgl-deep-gemm release from 0.1.4 to 0.2.5: API detection and the plugins' calls, against the real wheels.

Each release's wheel is downloaded once (``pip download --no-deps``, about 5 MB each, cached in
``$SGLANG_MOE_PLUGINS_WHEEL_CACHE`` or the temp directory) and only its Python sources are read, with
``ast``: no import, no GPU, no CUDA library loaded. A release whose wheel cannot be downloaded is
skipped, saying so. Two checks per release:

- detection (:func:`api_from_source_dir`) gives the API recorded in :data:`RELEASES` (read by hand
  from the same sources; docs/deep-gemm-releases.md is the table);
- the three DeepGEMM plugins, run on CPU against a stand-in ``deep_gemm`` whose functions are that
  release's real signatures (parameters and defaults, bodies replaced by a recorder), make calls that
  bind to them, and decline what the release cannot do, with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import pathlib
import subprocess
import sys
import tempfile
import types
import zipfile
from typing import Any, NamedTuple

import pytest
import torch
from _mega_cases import API_LEGACY, API_MMA_TYPE, make_problem

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.plugins.deep_gemm import api as dga, launch as launch_mod, plugin as mdg


class Expected(NamedTuple):
    flavour: str
    refuses_legacy_env: bool
    shared_experts: bool  # num_shared_experts + shared weights + get_block_m_for_mega_moe
    buffer_shared: bool  # get_symm_buffer_for_mega_moe(num_shared_experts=...)
    sm90_pre_dispatch: bool  # deep_gemm.mega_moe_pre_dispatch_sm90
    num_tokens_bound: bool  # fp8_mega_moe(num_tokens_bound=...)


_OLD = Expected("legacy_env", False, False, False, True, False)
_NEW = Expected("mma_type", True, True, True, True, False)
#: What each release's sources say (docs/deep-gemm-releases.md). SGLang pins: 0.5.16 -> 0.1.4.post1,
#: 0.5.17 -> 0.1.5.post1, 0.5.18 -> 0.1.5.post3, 0.5.19 -> 0.1.7, 0.5.20/21 -> 0.2.0, 0.5.22 -> 0.2.2,
#: 0.5.23 -> 0.2.3.post2.
RELEASES: dict[str, Expected] = {
    "0.1.4": _OLD._replace(sm90_pre_dispatch=False),
    "0.1.4.post1": _OLD,
    "0.1.5": _OLD,
    "0.1.5.post1": _OLD,
    "0.1.5.post2": _OLD,
    "0.1.5.post3": _OLD,
    "0.1.6": _OLD._replace(buffer_shared=True),  # sized for shared experts, but no get_block_m_for_mega_moe yet
    "0.1.7": _NEW,
    "0.2.0": _NEW,
    "0.2.1": _NEW,
    "0.2.1.post1": _NEW,
    "0.2.2": _NEW,
    "0.2.3": _NEW,
    "0.2.3.post1": _NEW,
    "0.2.3.post2": _NEW,
    "0.2.5": _NEW._replace(num_tokens_bound=True),
}

CACHE = pathlib.Path(
    os.environ.get("SGLANG_MOE_PLUGINS_WHEEL_CACHE")
    or pathlib.Path(tempfile.gettempdir()) / "sglang-moe-plugins-wheels"
)


def _sources(version: str) -> pathlib.Path:
    """The release's ``deep_gemm`` directory (Python sources and VERSION only), downloading it once."""
    root = CACHE / f"sgl-deep-gemm-{version}"
    package = root / "src" / "deep_gemm"
    if (package / "__init__.py").exists():
        return package
    wheels = root / "wheel"
    if not list(wheels.glob("*.whl")):
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "--platform",
            "manylinux2014_x86_64",
            f"sgl-deep-gemm=={version}",
            "-d",
            str(wheels),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot download sgl-deep-gemm=={version}: {exc}")
        if proc.returncode != 0 or not list(wheels.glob("*.whl")):
            pytest.skip(
                f"cannot download sgl-deep-gemm=={version} (pip download exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
            )
    (wheel,) = list(wheels.glob("*.whl"))[:1]
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("deep_gemm/") and (name.endswith(".py") or name == "deep_gemm/VERSION"):
                z.extract(name, root / "src")
    return package


@pytest.mark.parametrize("version", list(RELEASES))
def test_detection_reads_each_release(version: str) -> None:
    want = RELEASES[version]
    api = dga.api_from_source_dir(_sources(version), environ={})
    assert api.version == version
    assert (api.flavour, api.refuses_legacy_env, api.shared_experts) == (
        want.flavour,
        want.refuses_legacy_env,
        want.shared_experts,
    )
    assert api.takes("get_symm_buffer_for_mega_moe", "num_shared_experts") == want.buffer_shared
    assert api.has("mega_moe_pre_dispatch_sm90") == want.sm90_pre_dispatch
    assert api.takes("fp8_mega_moe", "num_tokens_bound") == want.num_tokens_bound
    assert {
        "get_symm_buffer_for_mega_moe",
        "fp8_fp4_mega_moe",
        "fp8_mega_moe",
        "mega_moe_pre_dispatch",
    } <= api.functions
    assert api.mma_types == (("fp8xfp4", "mxf4xmxf4", "nvfp4xnvfp4") if want.flavour == "mma_type" else ("fp8xfp4",))
    # FP4 activations: by use_fp4_acts (and the DG_USE_* variables) up to 0.1.6, by mma_type from 0.1.7
    fp4_by = "mma_type" if want.flavour == "mma_type" else "use_fp4_acts"
    assert api.takes("mega_moe_pre_dispatch", fp4_by)


@pytest.mark.parametrize("version,recorded", [("0.1.5.post1", API_LEGACY), ("0.2.3.post2", API_MMA_TYPE)])
def test_the_test_records_are_the_real_releases(version: str, recorded: dga.DeepGemmApi) -> None:
    api = dga.api_from_source_dir(_sources(version), environ={})
    assert dataclasses.replace(api, origin=None) == recorded


# -- a stand-in deep_gemm with the release's real signatures ---------------------------------------


def _definitions(package: pathlib.Path) -> dict[str, ast.FunctionDef]:
    """The FunctionDef of each MEGA_FUNCTIONS entry, resolved as api_from_source_dir resolves it."""
    top = ast.parse((package / "__init__.py").read_text())
    mega = ast.parse((package / "mega" / "__init__.py").read_text())
    top_defs = {n.name: n for n in top.body if isinstance(n, ast.FunctionDef)}
    mega_defs = {n.name: n for n in mega.body if isinstance(n, ast.FunctionDef)}
    exported = {
        a.asname or a.name
        for n in ast.walk(top)
        if isinstance(n, ast.ImportFrom) and n.module == "mega"
        for a in n.names
    }
    found = {}
    for name in dga.MEGA_FUNCTIONS:
        if name in top_defs:
            found[name] = top_defs[name]
        elif name in exported and name in mega_defs:
            found[name] = mega_defs[name]
    return found


def _stand_in(package: pathlib.Path, record: Any) -> types.ModuleType:
    module = types.ModuleType("deep_gemm")
    for name, node in _definitions(package).items():
        args = node.args
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None:
                a.annotation = None
        node.decorator_list, node.returns = [], None
        node.body = [
            ast.Return(
                ast.Call(
                    ast.Name("__record__", ast.Load()),
                    [ast.Constant(name), ast.Call(ast.Name("locals", ast.Load()), [], [])],
                    [],
                )
            )
        ]
        code = compile(ast.fix_missing_locations(ast.Module([node], [])), f"<sgl-deep-gemm {name}>", "exec")
        namespace: dict[str, Any] = {"__record__": record}
        exec(code, namespace)  # noqa: S102 - the release's signature, with a recording body
        setattr(module, name, namespace[name])
    module.get_num_sms = lambda: 132
    module.set_num_sms = lambda n: None
    return module


def _buffer(args: dict[str, Any], variant: str) -> types.SimpleNamespace:
    """Views shaped as sgl-deep-gemm slices its buffer for ``variant``."""
    rows, hidden, top_k = args["num_max_tokens_per_rank"], args["hidden"], args["num_topk"]
    sm90, fp4 = variant == "sm90_fp8", variant == "mxf4xmxf4"
    return types.SimpleNamespace(
        x=torch.zeros((rows, hidden // 2), dtype=torch.int8)
        if fp4
        else torch.zeros((rows, hidden), dtype=torch.float8_e4m3fn),
        x_sf=torch.zeros((rows, hidden // 128), dtype=torch.float32)
        if sm90
        else torch.zeros((rows, hidden // 128), dtype=torch.int32),
        topk_idx=torch.zeros((rows, top_k), dtype=torch.int64),
        topk_weights=torch.zeros((rows, top_k)),
        shared_l1_acts_sf=torch.as_strided(
            torch.zeros(256 * hidden // 128, dtype=torch.int32), (256, hidden // 128), (1, 256)
        ),
        group=args["group"],
        num_experts=args["num_experts"],
        num_max_tokens_per_rank=rows,
        num_topk=top_k,
    )


@functools.cache
def _problem(variant: str, shared: bool):
    """One problem per variant for every release (building it costs more than running the plugins)."""
    return make_problem(variant, shared=shared, inter=512, seed=7, tokens=5, rsf=1.5)


class _Group:
    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


_CASES = [  # plugin, variant, platform, shared experts, pre_dispatch
    (mdg.MegaW4A8Plugin, "fp8xfp4", Platform.cuda(10, 0), False, "torch"),
    (mdg.MegaW4A8Plugin, "fp8xfp4", Platform.cuda(10, 0), True, "torch"),
    (mdg.MegaW4A4Plugin, "mxf4xmxf4", Platform.cuda(10, 0), False, "host"),
    (mdg.MegaSm90Fp8Plugin, "sm90_fp8", Platform.cuda(9, 0), False, "host"),
    (mdg.MegaSm90Fp8Plugin, "sm90_fp8", Platform.cuda(9, 0), False, "torch"),
]


@pytest.mark.parametrize("version", list(RELEASES))
def test_plugins_call_only_what_each_release_takes(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    package = _sources(version)
    api = dga.api_from_source_dir(package, environ={})
    calls: list[tuple[str, dict[str, Any]]] = []
    current: dict[str, str] = {}

    def record(name: str, args: dict[str, Any]) -> Any:
        calls.append((name, dict(args)))
        if name == "get_symm_buffer_for_mega_moe":
            return _buffer(args, current["variant"])
        if name == "get_block_m_for_mega_moe":
            return 64
        if name in ("fp8_fp4_mega_moe", "fp8_mega_moe"):
            args["y"].fill_(1.0)
        return None

    fake = _stand_in(package, record)
    monkeypatch.setattr(launch_mod, "load_deep_gemm", lambda: fake)
    monkeypatch.setattr(launch_mod, "host_helpers", lambda api: (None, None))
    monkeypatch.setattr(launch_mod, "_buffers", {})
    ran = []
    for cls, variant, platform, shared, pre in _CASES:
        plugin = cls(api)
        plugin.options = {"pre_dispatch": pre}
        problem = _problem(variant, shared)
        config = dataclasses.replace(problem.config, platform=platform)
        verdict = plugin.supports(problem.shape, config)
        label = f"{plugin.name} shared={shared} pre_dispatch={pre}"
        expected = RELEASES[version]
        if variant == "mxf4xmxf4" and expected.flavour != "mma_type":
            assert not verdict and "DG_USE_FP4_ACTS" in verdict.reason, label
            continue
        if shared and not expected.shared_experts:
            assert not verdict and "num_shared_experts" in verdict.reason and version in verdict.reason, label
            continue
        if variant == "sm90_fp8" and pre == "host" and not expected.sm90_pre_dispatch:
            assert not verdict and "mega_moe_pre_dispatch_sm90" in verdict.reason, label
            continue
        assert verdict, f"{label}: {verdict.reason}"
        calls.clear()
        current["variant"] = variant
        inputs = dataclasses.replace(problem.inputs, ep_group=_Group())
        outputs = mm.allocate_outputs(problem.shape, config, inputs.device, num_tokens=inputs.num_tokens)
        plugin.run(inputs, outputs, problem.shape, config)  # a TypeError here: an argument the release does not take
        names = [n for n, _ in calls]
        assert (
            names[0] == "get_symm_buffer_for_mega_moe"
            and names[-1] == mdg.VARIANTS[[v.name for v in mdg.VARIANTS].index(plugin.name)].kernel
        ), label
        buffer_args = calls[0][1]
        assert buffer_args["mma_type"] == ("mxf4xmxf4" if variant == "mxf4xmxf4" else "fp8xfp4"), label
        if expected.buffer_shared:
            assert buffer_args["num_shared_experts"] == (1 if shared else 0), label
        kernel_args = calls[-1][1]
        assert (kernel_args.get("shared_l1_weights") is not None) == shared, label
        assert bool((outputs.y == 1.0).all()), label
        ran.append(label)
    assert ran  # every release runs W4A8 and SM90 at least
