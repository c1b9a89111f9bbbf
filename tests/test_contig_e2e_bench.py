"""``benchmarks/contig_e2e.py``'s configurations against SGLang 0.5.23's own functions (CPU).

The benchmark copies three rules of ``sglang/srt/layers/moe/moe_runner/deep_gemm.py`` (the layout guard, the compact
row count, the masked layout's memory estimate); each is checked here against the real function on every catalog
model and parallelism and on values around each of the guard's branches. Also: the configurations the benchmark
derives (which are guard-refused), its CPU ``--list``, its markdown, and the import shim's refusal to shadow a real
SGLang.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import SimpleNamespace

import pytest
import torch

from sglang_moe_plugins.bench import contig_e2e_cases as cases
from sglang_moe_plugins.catalog import load_catalog

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dg(request: pytest.FixtureRequest):
    """SGLang 0.5.23's ``deep_gemm.py`` runner module, with the a2a backend read as 'not MegaMoE'."""
    pytest.importorskip("sglang")
    from importlib.metadata import version

    if version("sglang") != "0.5.23":
        pytest.skip(f"the benchmark copies SGLang 0.5.23's rules; installed: {version('sglang')}")
    import sglang.srt.layers.moe.moe_runner.deep_gemm as module

    saved = module.get_moe_a2a_backend
    module.get_moe_a2a_backend = lambda: SimpleNamespace(is_megamoe=lambda: False)
    request.addfinalizer(lambda: setattr(module, "get_moe_a2a_backend", saved))
    return module


def _settings():
    for model in load_catalog():
        for tp, ep, e, d in cases._parallel(model):
            yield model, tp, ep, e, d


def test_guard_matches_sglang(dg) -> None:
    checked = 0
    grid = [(m.swiglu_limit, d, e, 128) for m, _, _, e, d in _settings()]
    grid += [
        (10.0, d, e, g)
        for d in (256, 384, 512, 768, 1024, 2048, 2560)
        for e in (8, 32, 64, 128, 256)
        for g in (32, 64, 128)
    ]
    grid += [(None, 256, 256, 64), (7.0, None, 8, 128)]
    for limit, d, e, group in grid:
        runner = SimpleNamespace(swiglu_limit=limit, intermediate_size_per_partition=d, num_local_experts=e)
        quant = SimpleNamespace(block_shape=[128, group])
        assert cases.masked_activation_unsupported_reason(
            limit, d, e, group
        ) == dg._masked_activation_unsupported_reason(runner, quant), (limit, d, e, group)
        checked += 1
    assert checked > 100


def test_guard_refused_configs(dg) -> None:
    derived = cases.derive_cases()
    refused = {c.label for c in derived if c.guard_reason is not None}
    expected = set()
    for model, tp, ep, e, d in _settings():
        if model.gpt_oss_activation:
            continue
        runner = SimpleNamespace(
            swiglu_limit=model.swiglu_limit, intermediate_size_per_partition=d, num_local_experts=e
        )
        if dg._masked_activation_unsupported_reason(runner, SimpleNamespace(block_shape=[128, 128])) is not None:
            expected.add(f"{model.short_name} " + (f"EP{ep}" if ep > 1 else f"TP{tp}"))
    assert refused == expected
    assert refused == {f"DeepSeek-V4-{m} TP{t}" for m in ("Flash", "Pro") for t in (2, 4, 8)}
    for c in derived:
        assert (c.stock_layout == "compact") == (c.guard_reason is not None or c.mode == "deepep_normal"), c.label
    flash_tp4 = next(c for c in derived if c.label == "DeepSeek-V4-Flash TP4")
    assert (flash_tp4.local_experts, flash_tp4.inter, flash_tp4.hidden, flash_tp4.topk) == (256, 512, 4096, 6)
    deepep = [c for c in derived if c.mode == "deepep_normal"]
    assert {c.model for c in deepep} == set(cases.DEEPEP_MODELS)
    assert all(c.ep == 8 and c.tokens == cases.PREFILL_TOKENS for c in deepep)


def test_compact_rows_match_sglang(dg) -> None:
    for assignments in (0, 1, 6, 96, 127, 128, 129, 384, 1536, 12288, 98304, 131072):
        for experts in (16, 32, 48, 256, 384):
            for block in (32, 64, 128):
                assert cases.compact_all_tokens(assignments, experts, block) == dg._get_compact_all_tokens(
                    assignments, experts, block
                )
    # DeepSeek-V4-Flash TP4 decode, block 128 (HOST-FACTS): 768 / 12288 / 32896 / 34048 rows
    assert [cases.compact_all_tokens(t * 6, 256) for t in (1, 16, 64, 256)] == [768, 12288, 32896, 34048]


def test_masked_bytes_match_sglang(dg) -> None:
    for c in cases.derive_cases():
        runner = SimpleNamespace(num_local_experts=c.local_experts)
        quant = SimpleNamespace(
            w13_weight=torch.empty((c.local_experts, c.gateup, c.hidden), dtype=torch.float8_e4m3fn, device="meta"),
            w2_weight=torch.empty((c.local_experts, c.hidden, c.inter), dtype=torch.float8_e4m3fn, device="meta"),
            block_shape=[128, 128],
            use_mxfp8=False,
        )
        for t in c.tokens:
            hidden = torch.empty((t, c.hidden), dtype=torch.bfloat16, device="meta")
            assert c.masked_bytes(t) == dg._estimate_masked_standard_layout_peak_bytes(runner, quant, hidden), c.label


def test_filter_and_list(capsys: pytest.CaptureFixture[str]) -> None:
    derived = cases.derive_cases()
    quick = cases.filter_cases(derived, "V4-Flash TP4,V3", quick=True)
    assert [c.label for c in quick] == ["DeepSeek-V4-Flash TP4", "DeepSeek-V3 EP8 deepep"]
    assert quick[0].tokens == (16, 2048) and quick[1].tokens == (2048,)
    assert cases.filter_cases(derived, "no such model") == []
    assert [c.label for c in cases.filter_cases(derived, "deepseek-v4-flash ep8|,V4-Pro TP")] == [
        "DeepSeek-V4-Pro TP2",
        "DeepSeek-V4-Pro TP4",
        "DeepSeek-V4-Pro TP8",
    ]
    assert [c.label for c in cases.filter_cases(derived, "deepseek-v4-flash ep8 deepep|")] == [
        "DeepSeek-V4-Flash EP8 deepep"
    ]
    spec = importlib.util.spec_from_file_location("contig_e2e_script", ROOT / "benchmarks/contig_e2e.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--out", "/nonexistent", "--list", "--only", "Pro TP8"]) == 0
    assert capsys.readouterr().out.startswith("DeepSeek-V4-Pro TP8: E_local=384 D=384 K=7168")
    doc = {
        "run_info": {"device": "X", "commit": "abc"},
        "date": "d",
        "numerics_tokens": 128,
        "failures": [],
        "results": [
            {
                "case": "A TP2",
                "tokens": 16,
                "stock_layout": "compact",
                "compact_rows": 12288,
                "layer_us": {"stock_compact": 100.0, "package_compact": 50.0, "masked_package": 25.0},
                "act_us": {"stock_compact": 20.0},
                "masked_extra_bytes": 2**30,
                "notes": {"x": "y"},
                "rel_l2": {"stock_compact": 0.03, "package_compact": "RuntimeError: boom"},
            }
        ],
    }
    md = script.markdown(doc)
    assert "| A TP2 | 16 | compact | 12288 | 100.0 (20%) | 50.0 (0%) | 2.00 | 25.0 (0%) | 4.00 | - | 1.0 |" in md
    assert "3.00e-02 | fail | - | - |" in md and "- A TP2 T=16: x: y" in md


def test_shim_refuses_real_sglang() -> None:
    pytest.importorskip("sglang")
    from sglang_moe_plugins.bench import sglang_moe_host

    with pytest.raises(RuntimeError, match="sglang"):
        sglang_moe_host.load(str(ROOT / ".device/sgl_py"), lambda *a, **k: None)


def test_shim_sources_are_sglangs() -> None:
    """The files the shim loads on the GPU machine are the installed 0.5.23's, byte for byte."""
    pytest.importorskip("sglang")
    from sglang_moe_plugins.bench import sglang_moe_host

    copied = ROOT / ".device/sgl_py"
    if not copied.is_dir():
        pytest.skip(".device/sgl_py absent (copied on a developer machine for the device call)")
    site = pathlib.Path(importlib.util.find_spec("sglang").origin).parent.parent
    for rel in sglang_moe_host.SOURCES:
        assert (copied / rel).read_bytes() == (site / rel).read_bytes(), rel
    assert "sglang" in sys.modules
