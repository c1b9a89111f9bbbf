"""Issue 7.5: every expert-parallel rank selects the same plugin for the same call.

Real processes (2 and 4) joined by torch.distributed (gloo, CPU), each going through SGLang's real
``load_plugins()`` and hooked ``_varlen_deep_gemm_silu_mul_quant`` with rank-specific data of the same
shapes (tests/rank_worker.py); the chosen plugins, read from ``api.get_selector().explain``, are gathered
with ``all_gather_object`` and must be identical. The worker also records the documented hazard: the
failed-plugin memory is per process, so a data-dependent run-time failure on one rank makes that rank
alone fall back (choices diverge); under ``strict`` that rank raises instead.
The NCCL variant for the 2-GPU machine is tests/gpu/test_ranks_nccl.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

WORKER = pathlib.Path(__file__).resolve().with_name("rank_worker.py")


def launch_ranks(
    world: int, tmp: pathlib.Path, *, backend: str = "gloo", no_sglang: bool = False, timeout: int = 240
) -> list[dict]:
    """Start ``world`` worker processes, wait for all, return their rank{R}.json results."""
    out = tmp / "out"
    out.mkdir()
    init = f"file://{tmp / 'rendezvous'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, str(WORKER), "--world", str(world), "--init", init, "--out", str(out), "--backend", backend]
    if no_sglang:
        cmd.append("--no-sglang")
    procs = [
        subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for r in range(world)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{log[-4000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def check_same_choice(results: list[dict]) -> None:
    world = len(results)
    for res in results:
        assert res["identical"], json.dumps(res["gathered"], indent=1)
        assert res["gathered"] == [results[0]["choices"]] * world
        assert all(c["chosen"] for c in res["choices"])
        assert res["real_rows_checked"] > 0
    # Different data on every rank, yet one plugin per call everywhere.
    assert len({json.dumps(r["choices"]) for r in results}) == 1


def check_hazard(results: list[dict]) -> None:
    for res in results:
        hazard, strict = res["hazard"], res["hazard_strict"]
        for rank in range(len(results)):
            if rank == 1:  # the only rank whose data makes the plugin fail
                assert hazard[rank] == {"outcome": "ok", "chosen_after": "reference"}
                assert strict[rank]["outcome"].startswith("raised: rank 1: too many rows")
            else:
                assert hazard[rank] == {"outcome": "ok", "chosen_after": "fails_on_rank_one"}
                assert strict[rank]["outcome"] == "ok"


@pytest.mark.sglang
@pytest.mark.parametrize("world", [2, 4])
def test_same_plugin_on_every_rank_gloo(world, tmp_path):
    pytest.importorskip("sglang")
    results = launch_ranks(world, tmp_path)
    assert results[0]["via"] == "SGLang's hooked _varlen_deep_gemm_silu_mul_quant"
    check_same_choice(results)
    check_hazard(results)
