"""The ``expert_parallel`` check: a ``mega_moe`` plugin that accepts ``ep_size > 1`` is run over ranks.

The single-process suite cannot run a collective kernel, so when the plugin accepts a drawn case with
``ep_size > 1``, the kit builds one small whole problem per claimed variant (4 experts, hidden 512,
top-k 2, 5 and 7 tokens on the two ranks), starts :data:`EP_RANKS` processes on CPU joined in a gloo
process group (:mod:`.ep_worker`), gives each rank its own tokens and its experts' weights (the
``MegaMoEInputs.ep_group`` is that group), and checks each rank's rows against the reference of the
whole problem (:data:`~.mega_moe.MEGA_TOLERANCE`).

The ranks load the plugin anew from a target string (a registered name, ``path.py:Class`` or
``module:Class``). When the kit cannot run it there (the plugin was given as an object defined where
another process cannot import it, it declines the kit's small EP problem, gloo is missing), the check
is marked "claims EP > 1; not exercised": the report is INCOMPLETE and ``check`` exits with status 4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..hardware import Platform
from ..log import get_logger
from .case import SuiteCase
from .execute import Checks, error_text, short
from .loading import LoadedPlugin

__all__ = ["EP_RANKS", "EP_TOKENS", "EP_TIMEOUT_S", "NOT_EXERCISED_NOTE", "check_expert_parallel", "ep_problem"]

logger = get_logger(__name__)

EP_RANKS = 2
#: Tokens of rank 0 and rank 1 (different, as ranks' batches are).
EP_TOKENS = (5, 7)
#: Seconds the ranks may take (start-up included) before they are stopped.
EP_TIMEOUT_S = 180.0
NOT_EXERCISED_NOTE = "claims EP > 1; not exercised"


def ep_problem(variant: str, platform: Platform, seed: int) -> dict[str, Any]:
    """The parameters of the small whole problem the ranks split (JSON-ready)."""
    return dict(
        variant=variant,
        experts=4,
        hidden=512,
        inter=512 if variant == "mxf4xmxf4" else 128,
        top_k=2,
        clamp=10.0,
        rsf=1.0,
        seed=seed,
        tokens=list(EP_TOKENS),
        world=EP_RANKS,
        cap=64,
    )


def _small_case(params: dict[str, Any], platform: Platform) -> tuple[Any, Any]:
    from ..ops import mega_moe as mm

    fmt = "fp8_e4m3_block128" if params["variant"] == "sm90_fp8" else "fp4_e2m1_ue8m0_g32"
    shape = mm.MegaMoEShape(
        params["experts"], params["hidden"], params["inter"], params["top_k"], 0, params["world"], params["cap"]
    )
    config = mm.MegaMoEConfig(
        platform,
        params["variant"],
        fmt,  # type: ignore[arg-type]  # a weight format name, checked by describe() on the ranks
        activation_clamp=params["clamp"],
        routed_scaling_factor=params["rsf"],
    )
    return shape, config


def _run_ranks(spec: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Start the ranks, wait for them (stopping stragglers), return each rank's result."""
    with tempfile.TemporaryDirectory(prefix="moe-ep-check-") as tmp:
        job = dict(
            params,
            target=spec,
            rendezvous=os.path.join(tmp, "rendezvous"),
            timeout=EP_TIMEOUT_S,
            out=[os.path.join(tmp, f"rank{r}.json") for r in range(params["world"])],
        )
        job_path = os.path.join(tmp, "job.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        logs = [open(os.path.join(tmp, f"rank{r}.log"), "w+") for r in range(params["world"])]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "sglang_moe_plugins.testing.ep_worker", job_path, str(r)],
                stdout=logs[r],
                stderr=subprocess.STDOUT,
                env=env,
            )
            for r in range(params["world"])
        ]
        deadline = time.monotonic() + EP_TIMEOUT_S + 30
        results: list[dict[str, Any]] = []
        for rank, proc in enumerate(procs):
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out = job["out"][rank]
            if os.path.exists(out):
                with open(out) as f:
                    results.append(json.load(f))
            else:
                logs[rank].seek(0)
                tail = logs[rank].read()[-1500:]
                results.append(
                    {
                        "rank": rank,
                        "error": f"rank {rank} ended (exit status {proc.returncode}) without a result "
                        f"(a collective the other rank never joined, or a crash); its output: {tail.strip()}",
                    }
                )
        for log in logs:
            log.close()
        return results


def check_expert_parallel(
    plugin: Any,
    loaded: LoadedPlugin,
    adapter: Any,
    accepted: Sequence[SuiteCase],
    checks: Checks,
    options: Any,
    platform: Platform,
    device: torch.device,
) -> None:
    """Record the ``expert_parallel`` check (see the module docstring)."""
    if getattr(adapter, "op", None) != "mega_moe":
        checks.ok("expert_parallel")
        checks.notes["expert_parallel"] = (
            f"not applicable: op {getattr(adapter, 'op', '?')} has no expert-parallel group"
        )
        return
    claims = [c for c in accepted if getattr(c.shape, "ep_size", 1) > 1]
    cpu = Platform.cpu()
    seed = int(options.seed or 0)
    small: dict[str, tuple[dict[str, Any], Any, Any, Any]] = {}
    from ..ops.mega_moe import VARIANTS

    for variant in VARIANTS:  # the kit's own EP problem is asked about too: a plugin claims EP > 1 by accepting either
        params = ep_problem(variant, cpu, seed)
        shape, config = _small_case(params, cpu)
        try:
            answer = plugin.supports(shape, config)
        except Exception as exc:  # noqa: BLE001
            checks.fail(
                "expert_parallel",
                None,
                f"supports() raised {error_text(exc)} for {shape.describe()} [{config.describe()}]",
            )
            return
        small[variant] = (params, shape, config, answer)
    claimed = sorted({c.config.variant for c in claims} | {v for v, item in small.items() if item[3]})
    if not claimed:
        checks.ok("expert_parallel")
        checks.notes["expert_parallel"] = "the plugin accepts no case with ep_size > 1"
        return
    example = (
        f"it accepts {claims[0].label} ({short(claims[0])})"
        if claims
        else f"it accepts {small[claimed[0]][1].describe()} [{small[claimed[0]][2].describe()}]"
    )
    spec = loaded.spec
    if spec is None:
        checks.not_exercised(
            "expert_parallel",
            f"{NOT_EXERCISED_NOTE}: {example}, but it was given as an object another process "
            "cannot load; check it by name, path.py:Class or module:Class",
        )
        return
    exercised: list[str] = []
    for variant in claimed:
        params, shape, config, answer = small[variant]
        if not answer:
            checks.not_exercised(
                "expert_parallel",
                f"{NOT_EXERCISED_NOTE}: {example}, but it declines the kit's CPU problem "
                f"{shape.describe()} [{config.describe()}]: {getattr(answer, 'reason', '')}",
            )
            return
        case = SuiteCase(
            f"EP={EP_RANKS} over gloo ranks {variant}",
            "edge",
            shape,
            config,
            f"T={'+'.join(map(str, EP_TOKENS))} random",
            params["seed"],
            note="each rank's rows against the whole problem's reference",
        )
        results = _run_ranks(spec, params)
        declined = [r for r in results if r.get("declined")]
        if declined:
            checks.not_exercised(
                "expert_parallel", f"{NOT_EXERCISED_NOTE}: rank {declined[0]['rank']}: {declined[0]['declined']}"
            )
            return
        errors = [r for r in results if r.get("error")]
        if errors:
            checks.fail(
                "expert_parallel",
                case,
                f"accepts ep_size={EP_RANKS}, but over {EP_RANKS} gloo ranks on CPU rank "
                f"{errors[0]['rank']}: {errors[0]['error']}",
            )
            return
        checks.ok("expert_parallel")
        exercised.append(variant)
    checks.notes["expert_parallel"] = (
        f"run over {EP_RANKS} gloo ranks on CPU ({', '.join(exercised)}; tokens {EP_TOKENS}); "
        "each rank's rows within the tolerance of the whole problem's reference"
    )
