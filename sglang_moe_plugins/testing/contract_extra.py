"""The parts of the plugin contract the first call's checks do not see, run once more per accepted case
after :func:`.execute.execute_case` passed it:

- ``no_host_sync``: ``run()`` (and a launch from ``prepare()``) reads no tensor data on the host. On CUDA
  the call runs under ``torch.cuda.set_sync_debug_mode("error")``; on CPU a watch records ``.item()``,
  ``.tolist()``, ``int()``, ``bool()``, ``.cpu()`` and ``.numpy()`` on ``masked_m``. Plugins that declare
  ``oracle = True`` (the pure-torch references, which read ``masked_m`` by design) are exempt.
- ``padding_bytes``: packed UE8M0 scales with G not a multiple of 4 hold 0 in the pad bytes of the last
  int32 of every real row (the contract's "pad bytes 0").
- ``inputs_released``: no reference to a call's input tensors is kept once it returned (weak references
  to them are dead after the caller drops them).
- ``prepare``: a launch from ``prepare()`` gives identical bits on repeated calls on identical inputs
  (for a plugin that does not declare ``deterministic = False``).

And, for information (never a failure), the speed of ``run()`` against the op's reference plugin on the
same inputs (:class:`SpeedLog`).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .case import OpConformance, SuiteCase
from .checks import Checks, error_text, is_deterministic
from .report import CaseFailure

__all__ = ["SpeedLog", "check_contract_extra", "ORACLES"]

#: The reference plugin of each op (the speed report's baseline).
ORACLES = {"silu_mul_quant": "reference", "silu_mul_quant_contig": "contig_reference", "mega_moe": "mega_reference"}
_HOST_READS = frozenset({"item", "tolist", "__bool__", "__int__", "__index__", "__float__", "numpy", "cpu"})


class _MaskedMReads(TorchFunctionMode):
    """Records host reads of one tensor (``masked_m``) while a call runs."""

    def __init__(self, watched: torch.Tensor) -> None:
        super().__init__()
        self.watched = watched
        self.reads: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in _HOST_READS and args and args[0] is self.watched:
            self.reads.append(f"masked_m.{name}()" if not name.startswith("__") else f"{name.strip('_')}(masked_m)")
        return func(*args, **(kwargs or {}))


@dataclass
class SpeedLog:
    """Per-case ratios of the plugin's run() time over the op's reference plugin's, on the same inputs."""

    ratios: list[float] = field(default_factory=list)
    oracle: Any = None

    def describe(self) -> str:
        if not self.ratios:
            return ""
        median = statistics.median(self.ratios)
        return (
            f"speed: run() took {median:.2f}x the reference's time (median over {len(self.ratios)} cases, "
            f"{min(self.ratios):.2f}x to {max(self.ratios):.2f}x; information, not a check)"
        )


def _input_tensors(inputs: Any) -> list[torch.Tensor]:
    if not dataclasses.is_dataclass(inputs):
        return []
    values = [getattr(inputs, f.name) for f in dataclasses.fields(inputs)]
    return [v for v in values if isinstance(v, torch.Tensor)]


def _call(plugin: Any, launch: Any, inputs: Any, outputs: Any, case: SuiteCase, device: torch.device) -> Any:
    returned = launch(inputs, outputs) if launch is not None else plugin.run(inputs, outputs, case.shape, case.config)
    return outputs if returned is None else returned


def _watched_call(
    plugin: Any, launch: Any, adapter: OpConformance, case: SuiteCase, device: torch.device
) -> tuple[Any, Any, list[str]]:
    """One call into poisoned outputs under the host-sync watch: (inputs, result, reads)."""
    inputs = adapter.make_inputs(case, device)
    outputs = adapter.allocate_outputs(case, inputs, device)
    adapter.poison(outputs)
    masked_m = getattr(inputs, "masked_m", None)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            result = _call(plugin, launch, inputs, outputs, case, device)
        except RuntimeError as exc:
            if "synchroniz" not in str(exc):
                raise
            return inputs, None, [f"a device synchronization ({str(exc).splitlines()[0]})"]
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.synchronize(device)
        return inputs, result, []
    if not isinstance(masked_m, torch.Tensor):
        return inputs, _call(plugin, launch, inputs, outputs, case, device), []
    watch = _MaskedMReads(masked_m)
    with watch:
        result = _call(plugin, launch, inputs, outputs, case, device)
    return inputs, result, watch.reads


def _pad_bytes(result: Any, case: SuiteCase, adapter: OpConformance, inputs: Any) -> str | None:
    """None, or where a pad byte of the last packed UE8M0 word of a real row is not 0."""
    config, shape = case.config, case.shape
    groups = getattr(shape, "num_groups", 0)
    if getattr(config, "scale_layout", "") != "ue8m0_packed" or not groups or groups % 4 == 0:
        return None
    real = getattr(adapter, "real_outputs", None)
    pairs = dict(real(inputs, result, case)) if callable(real) else {"scale": getattr(result, "scale", None)}
    scale = pairs.get("scale")
    if not isinstance(scale, torch.Tensor) or scale.numel() == 0:
        return None
    words = -(-groups // 4)
    flat = torch.empty(scale.shape, dtype=scale.dtype, device=scale.device).copy_(scale).reshape(-1, words)
    pad = flat[:, -1:].contiguous().view(torch.uint8).reshape(-1, 4)[:, groups % 4 :].cpu()
    if not bool(pad.any()):
        return None
    row, byte = (int(i) for i in pad.nonzero()[0])
    value = int(pad[row, byte])
    return (
        f"packed UE8M0 scale: pad byte {groups % 4 + byte} of the last int32 word of real row {row} is {value:#04x}; "
        f"the contract requires 0 in the pad bytes (G = {groups}, not a multiple of 4)"
    )


def check_contract_extra(
    plugin: Any,
    adapter: OpConformance,
    case: SuiteCase,
    device: torch.device,
    checks: Checks,
    speed: SpeedLog,
    repeats: int = 2,
) -> list[CaseFailure]:
    """The checks of the module docstring on one case whose first calls passed; returns the failures."""
    failures: list[CaseFailure] = []
    name = getattr(plugin, "name", "?")
    exempt = bool(getattr(plugin, "oracle", False))
    try:
        inputs, result, reads = _watched_call(plugin, None, adapter, case, device)
    except Exception as exc:  # noqa: BLE001 - the first calls passed; report, do not crash the suite
        return [checks.fail("run_no_crash", case, f"run() raised {error_text(exc)} on a repeated call")]
    if reads and not exempt:
        failures.append(
            checks.fail(
                "no_host_sync",
                case,
                f"run() of plugin {name!r} read tensor data on the host: {', '.join(dict.fromkeys(reads))}; "
                "a host sync on every call (and no CUDA graph capture): decide from the shape and config, "
                "and read masked_m on the device",
            )
        )
    else:
        checks.ok("no_host_sync")
    if result is not None and repeats > 2 and is_deterministic(plugin):
        failures += _more_repeats(plugin, adapter, case, device, checks, inputs, result, repeats)
    problem = _pad_bytes(result, case, adapter, inputs) if result is not None else None
    if problem:
        failures.append(checks.fail("padding_bytes", case, problem))
    else:
        checks.ok("padding_bytes")
    refs = [weakref.ref(t) for t in _input_tensors(inputs)]
    del inputs, result
    gc.collect()
    kept = sum(ref() is not None for ref in refs)
    if kept:
        failures.append(
            checks.fail(
                "inputs_released",
                case,
                f"plugin {name!r} keeps a reference to {kept} of the call's {len(refs)} input tensor(s) after "
                "run() returned: a call's tensors must not outlive it (memory held, and stale data reused later)",
            )
        )
    else:
        checks.ok("inputs_released")
    failures += _launch_repeats(plugin, adapter, case, device, checks)
    _time_against_oracle(plugin, adapter, case, device, speed)
    return failures


def _more_repeats(
    plugin: Any,
    adapter: OpConformance,
    case: SuiteCase,
    device: torch.device,
    checks: Checks,
    inputs: Any,
    first: Any,
    repeats: int,
) -> list[CaseFailure]:
    """``repeats - 2`` more run() calls on identical inputs give the bits of the call before them
    (``--repeats``; the first two calls are compared by :mod:`.execute`)."""
    from .execute import _real_differs

    for extra in range(1, repeats - 1):
        again = adapter.make_inputs(case, device)
        outputs = adapter.allocate_outputs(case, again, device)
        adapter.poison(outputs)
        try:
            got = _call(plugin, None, again, outputs, case, device)
        except Exception as exc:  # noqa: BLE001
            return [
                checks.fail("deterministic", case, f"run() raised {error_text(exc)} on a repeat (--repeats {repeats})")
            ]
        differs = _real_differs(adapter, inputs, first, got, case)
        if differs:
            return [
                checks.fail(
                    "deterministic",
                    case,
                    f"run() on identical inputs wrote different {differs} in real rows on extra repeat {extra} of "
                    f"{repeats - 2} (--repeats {repeats}; compared bit for bit); a plugin whose results vary "
                    "between calls must declare deterministic = False",
                )
            ]
    checks.ok("deterministic")
    return []


def _launch_repeats(
    plugin: Any, adapter: OpConformance, case: SuiteCase, device: torch.device, checks: Checks
) -> list[CaseFailure]:
    """A launch from prepare() called three times on identical inputs gives identical bits each time."""
    if not callable(getattr(plugin, "prepare", None)) or not is_deterministic(plugin):
        return []
    try:
        launch = plugin.prepare(case.shape, case.config)
        if launch is None:
            return []
        got = []
        for _ in range(3):
            inputs = adapter.make_inputs(case, device)
            outputs = adapter.allocate_outputs(case, inputs, device)
            adapter.poison(outputs)
            got.append((inputs, _call(plugin, launch, inputs, outputs, case, device)))
    except Exception as exc:  # noqa: BLE001
        return [checks.fail("prepare", case, f"a repeated call of the launch from prepare() raised {error_text(exc)}")]
    from .execute import _real_differs

    for index in (1, 2):
        differs = _real_differs(adapter, got[0][0], got[0][1], got[index][1], case)
        if differs:
            return [
                checks.fail(
                    "prepare",
                    case,
                    f"the launch from prepare() wrote different {differs} on call {index + 1} than on call 1 on "
                    "identical inputs (compared bit for bit): a prepared launch must give the same bits every call",
                )
            ]
    return []  # the prepare check was counted once for this case by .execute


def _time_against_oracle(
    plugin: Any, adapter: OpConformance, case: SuiteCase, device: torch.device, speed: SpeedLog
) -> None:
    if speed.oracle is None:
        from .loading import load_plugin

        try:
            speed.oracle = load_plugin(ORACLES[adapter.op]).plugin
        except Exception:  # noqa: BLE001 - no baseline: no speed report
            speed.oracle = False
    if not speed.oracle or speed.oracle is plugin or type(speed.oracle) is type(plugin):
        return
    timings = []
    for target in (plugin, speed.oracle):
        inputs = adapter.make_inputs(case, device)
        outputs = adapter.allocate_outputs(case, inputs, device)
        try:
            start = time.perf_counter()
            target.run(inputs, outputs, case.shape, case.config)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001 - information only
            return
        timings.append(time.perf_counter() - start)
    if timings[1] > 0:
        speed.ratios.append(timings[0] / timings[1])
