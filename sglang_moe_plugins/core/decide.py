"""Which plugin runs one (op, shape, config) key, and why each other one does not: :func:`decide`.

The first enabled plugin, by descending priority, whose ``supports`` says yes. ``force`` leaves only the
forced plugin; ``[[priority_rules]]`` reorder the plugins for the shapes they match; plugins that failed
at run time for the key are skipped. :func:`decide` keeps no state and caches nothing (the dispatcher,
:class:`~.dispatcher.Selector`, decides each key once); it only asks the plugins' ``supports``.
:class:`Selection` holds the outcome and its explanation text (:func:`info_line` and
:func:`reasons_line`: the one-line forms the dispatcher logs).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..contract import as_support
from ..priority_rules import PriorityRule, rule_priorities
from .registry import PluginRecord

__all__ = [
    "HOST_FUNCTION",
    "HostFunction",
    "Candidate",
    "INFO_LINE_MAX",
    "Selection",
    "Verdict",
    "decide",
    "describe_key",
    "info_line",
    "reasons_line",
]

#: Longest INFO line of a new key's choice (the rank label comes on top).
INFO_LINE_MAX = 145


class Verdict:
    """Values of :attr:`Candidate.verdict`."""

    CHOSEN = "chosen"
    UNSUPPORTED = "unsupported"
    OUTRANKED = "outranked"
    DISABLED = "disabled"
    NOT_FORCED = "not forced"
    FAILED = "failed"
    ERROR = "error"
    #: A pure-torch reference (``Plugin.oracle``) on a CUDA call, neither forced nor allowed by ``reference_on_gpu``.
    WITHHELD = "withheld"


class HostFunction(enum.Enum):
    """What a hook keeps for a call key that SGLang's own function serves (parity, or a withheld reference)."""

    FUNCTION = "SGLang's own function"


HOST_FUNCTION = HostFunction.FUNCTION
#: The reason of a withheld reference (:attr:`Verdict.WITHHELD`).
WITHHELD_REASON = (
    "a pure-torch reference (about 1% of a kernel's speed) serves CUDA calls only when forced (force.<op>) or with "
    "reference_on_gpu = true"
)


@dataclass(frozen=True)
class Candidate:
    """One plugin's part in a selection: the verdict and the human-readable reason."""

    name: str
    priority: int
    verdict: str
    reason: str


def describe_key(value: Any) -> str:
    """``value.describe()`` where the value has one (the ops' shapes and configs), else its repr."""
    describe = getattr(value, "describe", None)
    return describe() if callable(describe) else repr(value)


@dataclass(frozen=True)
class Selection:
    """The outcome of selecting a plugin for one key. ``chosen`` is None when nothing fits."""

    op: str
    shape: Any
    config: Any
    chosen: PluginRecord | None
    candidates: tuple[Candidate, ...]

    @property
    def plugin(self) -> Any:
        return None if self.chosen is None else self.chosen.plugin

    def candidate(self, name: str) -> Candidate:
        for cand in self.candidates:
            if cand.name == name:
                return cand
        raise KeyError(f"plugin {name!r} is not a candidate of op {self.op!r}")

    def key_description(self) -> str:
        return f"{describe_key(self.shape)} [{describe_key(self.config)}]"

    def explain(self) -> str:
        """Multi-line text: what was chosen and why each other plugin was not."""
        head = f"{self.op} {self.key_description()}: "
        head += f"chose {self.chosen.name!r}" if self.chosen else "NO plugin supports this call"
        lines = [head]
        for cand in self.candidates:
            lines.append(
                f"  {'*' if cand.verdict == Verdict.CHOSEN else '-'} {cand.name} (priority {cand.priority}) {cand.verdict}: {cand.reason}"
            )
        return "\n".join(lines)


def info_line(selection: Selection, width: int = INFO_LINE_MAX) -> str:
    """A choice in one line of at most ``width`` characters: ``sglang-moe-plugins: <op> -> <plugin> for
    <key>`` (the key cut short with ``...``). Only for a selection that chose a plugin."""
    head = f"sglang-moe-plugins: {selection.op} -> {cast(PluginRecord, selection.chosen).name} for "
    key = selection.key_description()
    room = width - len(head)
    return head + (key if len(key) <= room else key[: room - 3] + "...")


def reasons_line(selection: Selection) -> str:
    """A choice in one line with its reasons: the chosen plugin's, and every other plugin's verdict and
    reason. Only for a selection that chose a plugin."""
    chosen = cast(PluginRecord, selection.chosen).name
    others = "; ".join(
        f"{c.name}: {c.verdict} ({c.reason})" for c in selection.candidates if c.verdict != Verdict.CHOSEN
    )
    return (
        f"sglang-moe-plugins: {selection.op} {selection.key_description()} -> {chosen} "
        f"({selection.candidate(chosen).reason}){f'; not chosen: {others}' if others else ''}"
    )


def decide(
    op: str,
    records: Sequence[PluginRecord],
    rules: Sequence[PriorityRule],
    force: str | None,
    failed: Mapping[str, str],
    shape: Any,
    config: Any,
    *,
    strict: bool,
    collective: bool,
    on_error: Callable[[str, Exception], None],
    reference_on_gpu: bool = True,
) -> Selection:
    """The selection for one key of ``op``.

    ``records``: the op's plugins by descending priority; ``rules``: the ``[[priority_rules]]``;
    ``force``: the plugin forced for the op, or None; ``failed``: plugin name -> why it failed at run
    time for this key. A ``supports`` that raises makes its plugin a candidate with verdict ``error``
    and is reported to ``on_error(plugin, exc)``; under ``strict``, or when the op is ``collective``
    (every rank must choose the same kernel), it is re-raised with a note naming the plugin. Without
    ``reference_on_gpu``, a plugin marked ``oracle`` (the pure-torch references) that supports a CUDA call no
    plugin before it serves is ``withheld`` (unless it is the forced one); its ``supports`` is still asked, so an
    unsupported or outranked reference gets that verdict instead.
    """
    candidates: list[Candidate] = []
    chosen: PluginRecord | None = None
    # [[priority_rules]]: the first matching rule naming a plugin sets its priority for this key.
    ruled = rule_priorities(rules, op, shape)
    platform = getattr(config, "platform", None)
    withhold = not reference_on_gpu and getattr(platform, "device_type", None) == "cuda"
    notes: dict[str, str] = {}
    if ruled:
        for record in records:
            if record.name in ruled:
                prio, rule = ruled[record.name]
                notes[record.name] = (
                    f"priority {prio} from {rule.label} ({rule.describe_bounds()}) instead of {record.priority}"
                )
        records = tuple(sorted(records, key=lambda r: (-ruled.get(r.name, (r.priority,))[0], r.name)))
        records = tuple(dataclasses.replace(r, priority=ruled[r.name][0]) if r.name in ruled else r for r in records)
    for record in records:
        if force is not None and record.name != force:
            candidates.append(Candidate(record.name, record.priority, Verdict.NOT_FORCED, f"force.{op} = {force!r}"))
            continue
        if not record.enabled:
            candidates.append(Candidate(record.name, record.priority, Verdict.DISABLED, record.status))
            continue
        if record.name in failed:
            candidates.append(Candidate(record.name, record.priority, Verdict.FAILED, failed[record.name]))
            continue
        try:
            support = as_support(record.plugin.supports(shape, config), record.name)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take selection down
            if strict or collective:
                why = "strict = true" if strict else f"op {op!r} is collective: no per-rank fallback"
                exc.add_note(
                    f"sglang-moe-plugins: raised by plugin {record.name!r} (supports) on op {op!r}; "
                    f"not falling back: {why}"
                )
                raise
            on_error(record.name, exc)
            candidates.append(
                Candidate(record.name, record.priority, Verdict.ERROR, f"supports() raised {type(exc).__name__}: {exc}")
            )
            continue
        if not support:
            candidates.append(Candidate(record.name, record.priority, Verdict.UNSUPPORTED, support.reason))
        elif chosen is None and withhold and force is None and getattr(record.plugin, "oracle", False) is True:
            # Only a reference that would serve the call is withheld: an unsupported or outranked one says so.
            candidates.append(Candidate(record.name, record.priority, Verdict.WITHHELD, WITHHELD_REASON))
        elif chosen is None:
            chosen = record
            candidates.append(Candidate(record.name, record.priority, Verdict.CHOSEN, support.reason))
        else:
            candidates.append(
                Candidate(
                    record.name,
                    record.priority,
                    Verdict.OUTRANKED,
                    f"supported, but {chosen.name!r} (priority {chosen.priority}) comes first",
                )
            )
    if notes:
        candidates = [
            dataclasses.replace(c, reason=f"{c.reason}; {notes[c.name]}") if c.name in notes else c for c in candidates
        ]
    return Selection(op, shape, config, chosen, tuple(candidates))
