"""``sglang-moe-plugins bench`` on CPU: arguments, output formats and --write-config, with the GPU timing
stubbed at the timer boundary only (the real registry, selection, plugins and allocations run). The real
timing runs on a GPU (the last test; skipped without CUDA)."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_moe_plugins import api
from sglang_moe_plugins.bench.provenance import COMMIT_ENV, run_info, source_commit, write_result
from sglang_moe_plugins.bench.report import rank_plugins
from sglang_moe_plugins.bench.runner import Measurement, call_bytes
from sglang_moe_plugins.cli import build_parser
from sglang_moe_plugins.cli.bench import run_bench
from sglang_moe_plugins.config import load_config
from sglang_moe_plugins.core.registry import Registry
from sglang_moe_plugins.ops import silu_mul_quant as smq


class StubTimer:
    """The GPU boundary replaced: runs every call once (so the plugins really run) and returns a fixed
    time per plugin, read from the launch closure's plugin."""

    def __init__(self, times_us: dict[str, float], bandwidth: float = 4e12):
        self.times_us = times_us
        self.bandwidth = bandwidth
        self.calls = 0

    def copy_bandwidth(self) -> float:
        return self.bandwidth

    def time_us(self, calls):
        for call in calls:
            call()
        self.calls += 1
        return self.times_us[self.current]


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith("SGLANG_MOE_PLUGINS"):
            monkeypatch.delenv(name)
    api.reload()
    yield
    api.reload()


def _run(argv, timer, monkeypatch, capsys):
    import sglang_moe_plugins.bench.runner as runner

    original = runner._time_plugin

    def timed(record, case, sets, t):  # tell the stub which plugin it times (the boundary stays the timer)
        timer.current = record.name
        return original(record, case, sets, t)

    monkeypatch.setattr(runner, "_time_plugin", timed)
    args = build_parser().parse_args(["bench", *argv])
    code = run_bench(args, timer, torch.device("cpu"))
    return code, capsys.readouterr()


SHAPE = ["--experts", "4", "--hidden", "256", "--topk", "2", "--rows", "4,300"]


def test_table_times_every_supporting_plugin_and_says_why_the_others_are_not(monkeypatch, capsys):
    names = [r.name for r in api.get_registry().records("silu_mul_quant")]
    timer = StubTimer({n: 10.0 + i for i, n in enumerate(names)})
    code, out = _run(SHAPE, timer, monkeypatch, capsys)
    assert code == 0
    table = out.out
    assert (
        "custom EP1 TP1 N=4" in table and "decode" in table and "custom EP1 TP1 N=300" in table and "prefill" in table
    )
    assert "jit_ep: unavailable: requires a CUDA device" in table  # no time without its kernels, with the reason
    assert "reference" in table and "priorities this measurement supports:" in table
    timed = [n for n in names if n in ("reference", "example_torch")]
    assert timer.calls == 2 * len(timed)
    # progress on stderr, one line per plugin and call
    assert out.err.count("[") >= 2 * len(names) and f"[{2 * len(names)}/{2 * len(names)}]" in out.err


def test_json_is_typed_and_records_the_run(monkeypatch, capsys):
    timer = StubTimer({"reference": 20.0, "example_torch": 10.0})
    code, out = _run([*SHAPE, "--json", "--quiet"], timer, monkeypatch, capsys)
    assert code == 0 and out.err == ""
    data = json.loads(out.out)
    assert data["op"] == "silu_mul_quant" and data["copy_bandwidth_Bps"] == 4e12
    assert set(data["run"]) >= {"commit", "device", "driver", "torch", "triton", "sglang", "sgl_deep_gemm"}
    ref = next(r for r in data["results"] if r["plugin"] == "reference" and r["case"] == "custom EP1 TP1 N=300")
    shape = smq.SiluMulQuantShape(4, 300, 256, 128, 2)
    config = smq.SiluMulQuantConfig(swiglu_limit=None, scale_layout="column_major")
    floor_us = call_bytes(shape, config, 4 * 300) / 4e12 * 1e6
    assert ref["status"] == "timed" and ref["us"] == 20.0 and ref["frac"] == pytest.approx(floor_us / 20.0)
    jit = next(r for r in data["results"] if r["plugin"] == "jit_ep")
    assert jit["us"] is None and jit["frac"] is None and jit["status"] == "unavailable"
    assert data["calls"][0]["config"]["swizzle"] is False and data["calls"][0]["phase"] == "decode"


def test_write_config_is_a_priority_table_the_config_loader_accepts(monkeypatch, capsys, tmp_path):
    names = {r.name for r in api.get_registry().records("silu_mul_quant")}
    timer = StubTimer({"reference": 5.0, "example_torch": 50.0})  # the reference wins here
    path = tmp_path / "priorities.toml"
    code, out = _run(
        [*SHAPE, "--write-config", str(path), "--out", str(tmp_path / "res"), "--quiet"], timer, monkeypatch, capsys
    )
    assert code == 0 and f"config: {path}" in out.out
    config = load_config({"SGLANG_MOE_PLUGINS_CONFIG": str(path)})
    assert set(config.priority) == names  # a complete [priority] table for the op
    assert max(config.priority, key=config.priority.get) == "reference"
    if "example_torch" in names:
        assert config.priority["example_torch"] == min(config.priority.values())  # timed, never fastest: last
    assert config.priority["triton"] > config.priority.get("example_torch", -1)  # not timed: kept above losers
    # and the real selection follows it
    registry = Registry.discover(config)
    assert registry.records("silu_mul_quant")[0].name == "reference"
    saved = json.loads((tmp_path / "res" / "bench.json").read_text())
    assert saved["priorities"][0]["plugin"] == "reference"
    assert (tmp_path / "res" / "bench.md").read_text().startswith("```")


def test_rank_orders_winners_then_untimed_then_losers():
    results = [
        Measurement("a", "fast", 1, "timed", 1.0, 0.9, ""),
        Measurement("a", "slow", 1, "timed", 2.0, 0.4, ""),
        Measurement("b", "fast", 1, "timed", 3.0, 0.9, ""),
        Measurement("b", "other", 1, "timed", 2.9, 0.9, ""),
        Measurement("c", "fast", 1, "timed", 1.0, 0.9, ""),
        Measurement("c", "other", 1, "timed", 1.5, 0.6, ""),
        Measurement("a", "absent", 1, "unavailable", None, None, "no GPU"),
    ]
    ranking = rank_plugins(results, {"fast": 1, "slow": 1, "other": 1, "absent": 100, "off": 5})
    assert [n for n, _, _ in ranking] == ["fast", "other", "absent", "off", "slow"]
    assert [p for _, p, _ in ranking] == [50, 40, 30, 20, 10]


def test_plot_needs_matplotlib_says_so(monkeypatch, capsys, tmp_path):
    import importlib.util

    from sglang_moe_plugins.cli.util import UsageError

    if importlib.util.find_spec("matplotlib") is not None:
        timer = StubTimer({"reference": 5.0, "example_torch": 6.0})
        code, _ = _run([*SHAPE, "--plot", str(tmp_path / "p.png"), "--quiet"], timer, monkeypatch, capsys)
        assert code == 0 and (tmp_path / "p.png").stat().st_size > 0
        return
    with pytest.raises(
        UsageError, match=r"--plot: needs matplotlib, which is not installed here \(pip install matplotlib\)"
    ):
        _run([*SHAPE, "--plot", str(tmp_path / "p.png")], StubTimer({}), monkeypatch, capsys)


def test_commit_is_recorded(monkeypatch):
    commit = source_commit()
    assert commit and (not commit.startswith("unknown") or COMMIT_ENV in commit)
    monkeypatch.setenv(COMMIT_ENV, "abc123")
    assert run_info()["commit"] == "abc123"


def test_a_written_result_records_its_provenance_beside_the_results(monkeypatch, tmp_path):
    monkeypatch.setenv(COMMIT_ENV, "abc123")
    path = write_result(
        tmp_path, "smq_experiment", [{"case": "x", "us": 1.5}], device_name="NVIDIA H200", copy_TBps=4.2
    )
    assert (
        path.parent == tmp_path and path.name.startswith("smq_experiment_") and path.name.endswith("_NVIDIA-H200.json")
    )
    data = json.loads(path.read_text())
    assert data["device"] == "NVIDIA H200" and data["run"]["commit"] == "abc123" and data["copy_TBps"] == 4.2
    assert data["results"] == [{"case": "x", "us": 1.5}] and data["torch"] == torch.__version__
    assert data["date"] in path.name
    with pytest.raises(ValueError, match=r"extra keys \['device', 'run'\] would replace the provenance"):
        write_result(tmp_path, "x", [], device_name="NVIDIA H200", device="other", run={})


@pytest.mark.gpu
def test_bench_on_the_gpu(tmp_path, capsys):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from sglang_moe_plugins.bench.timing import CudaGraphTimer

    args = build_parser().parse_args(
        [
            "bench",
            "--model",
            "Qwen3-30B-A3B",
            "--rows",
            "64",
            "--json",
            "--quiet",
            "--write-config",
            str(tmp_path / "p.toml"),
        ]
    )
    assert run_bench(args, CudaGraphTimer(), torch.device("cuda", torch.cuda.current_device())) == 0
    data = json.loads(capsys.readouterr().out)
    triton = next(r for r in data["results"] if r["plugin"] == "triton")
    assert triton["status"] == "timed" and 0 < triton["us"] < 1e4 and 0 < triton["frac"] <= 1.2
    assert load_config({"SGLANG_MOE_PLUGINS_CONFIG": str(tmp_path / "p.toml")}).priority


def test_bit_identical_needs_every_real_value_and_scale_equal_and_written():
    from sglang_moe_plugins.bench.smq_measure import bit_identical, compare
    from sglang_moe_plugins.ops.silu_mul_quant import allocate_outputs, describe
    from sglang_moe_plugins.testing.case import poison

    x = torch.randn(3, 4, 256).to(torch.bfloat16)
    m = torch.tensor([4, 1, 2], dtype=torch.int32)
    shape, config = describe(x, m, group_size=128, topk=2, swiglu_limit=None, scale_layout="row_major")
    ref = allocate_outputs(shape, config, x.device)
    ref.out.view(torch.uint8).copy_(torch.randint(0, 0x7E, ref.out.shape, dtype=torch.uint8))
    ref.scale.copy_(torch.rand(ref.scale.shape) + 0.5)

    def copy():
        got = allocate_outputs(shape, config, x.device)
        poison(got)
        got.out.copy_(ref.out)
        got.scale.copy_(ref.scale)
        return got

    assert bit_identical(compare(ref, copy(), m, 4, False))
    value = copy()
    value.out.view(torch.uint8)[1, 0, 5] ^= 1  # a real row (expert 1 holds one)
    assert not bit_identical(compare(ref, value, m, 4, False))
    scale = copy()
    scale.scale[2, 1, 0] *= 1.0000001  # the second real row of expert 2
    assert not bit_identical(compare(ref, scale, m, 4, False))
    unwritten = copy()
    poison(unwritten)
    assert not bit_identical(compare(ref, unwritten, m, 4, False))
    padding = copy()
    padding.out.view(torch.uint8)[1, 3, 0] ^= 1  # a padding row: not compared
    assert bit_identical(compare(ref, padding, m, 4, False))
