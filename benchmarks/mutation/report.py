"""Write the mutation run's Markdown report from its JSON (run_mutants.py) and :data:`HANDLED`.

python benchmarks/mutation/report.py benchmarks/mutation/results-2026-12-03.json > benchmarks/mutation/results-2026-12-03.md
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

COMMIT = "1462b1736a7efa312eb22c4b3090dfde57810030"
SURVIVORS_FILE = "tests/test_mutation_survivors.py"

#: Survivors of the first pass: how each is handled. "kill: <test>" (a test of SURVIVORS_FILE that kills it,
#: re-run in the survivors pass) or "harmless: <why>".
HANDLED: dict[str, str] = {
    "config-strict-default": "kill: `test_strict_and_debug_are_off_unless_asked`",
    "config-debug-env": "kill: `test_strict_and_debug_are_off_unless_asked`",
    "config-priority-bool": "kill: `test_a_boolean_priority_is_refused`",
    "config-int64-low": "kill: `test_priority_accepts_exactly_the_int64_range`",
    "config-int64-high": "kill: `test_priority_accepts_exactly_the_int64_range`",
    "config-int64-const": "kill: `test_priority_accepts_exactly_the_int64_range`",
    "config-force-type": "kill: `test_malformed_values_are_config_errors_naming_the_key`",
    "config-options-type": "kill: `test_malformed_values_are_config_errors_naming_the_key`",
    "config-string-list-empty": "kill: `test_malformed_values_are_config_errors_naming_the_key`",
    "config-masked-check": "kill: `test_malformed_values_are_config_errors_naming_the_key`, "
    "`test_masked_layout_from_the_environment_is_checked`",
    "config-allow-env": "kill: `test_allow_from_the_environment_replaces_the_files_list`",
    "decide-collective-raise": "kill: `test_a_raising_supports_is_reraised_for_a_collective_op`",
    "decide-rule-order": "kill: `test_priority_rules_reorder_and_show_the_ruled_priority`",
    "decide-rule-prio": "kill: `test_priority_rules_reorder_and_show_the_ruled_priority`",
    "decide-info-cut": "harmless: logging only (where the one-line INFO message is cut)",
    "decide-info-max": "harmless: logging only (the INFO line's length limit)",
    "disp-collective": "kill: `test_run_failures_that_must_not_fall_back_raise[collective]`",
    "disp-capturing": "kill: `test_run_failures_that_must_not_fall_back_raise[capturing]`",
    "disp-written": "kill: `test_run_failures_that_must_not_fall_back_raise[written]`",
    "disp-failed-dup": "harmless: reached only when two threads fail on one key at once; the later reason "
    "replaces the earlier and the key is decided again, with the same outcome",
    "bound-marked": "harmless: equivalent mutant (with nothing marked, every later path returns the empty tuple)",
    "bound-undeclared": "harmless: equivalent mutant (set(None) raises TypeError, caught: the same 'marked' result)",
    "bound-filter": "kill: `test_inputs_maybe_written_keeps_only_the_declared_writes`",
    "reg-priority": "kill: `test_a_user_priority_is_named_in_the_status`",
    "reg-strict2": "kill: `test_strict_refuses_an_entry_point_that_cannot_be_loaded` (test_startup_safety also "
    "covers it, but was left out of the registry set: see mutants.py)",
    "reg-name-re": "kill: `test_plugin_attributes_are_validated[Bad Name!-1-...]`",
    "reg-prio-int": "kill: `test_plugin_attributes_are_validated[fine-True-...]`",
    "plan-max": "kill: `test_the_plan_cap_holds_a_large_models_layers`",
    "mega-hit-experts": "harmless: the plan key holds id(experts), and a freed experts object's plans leave the "
    "cache by its weak-reference callback before its id can be reused: the identity check is a "
    "second guard",
    "mega-hit-tokens": "kill: `test_a_planned_layer_still_refuses_a_batch_past_the_token_cap`",
    "mega-hit-weights": "kill: `test_a_weight_replaced_in_place_is_planned_again`",
    "mega-rsf-key": "kill: `test_a_new_routed_scaling_factor_is_a_new_plan`",
    "mega-y-rows": "not killed here: a plugin's short y on a later call is tested through SGLang's hooked "
    "function by tests/test_fault_paths.py::test_mega_too_few_rows_on_a_later_call_is_an_error_under_strict, outside this run's plan subset",
    "reg-outrank": "not killed here: the outranking notice (a WARNING and doctor's line) is tested by "
    "tests/test_startup_safety.py::test_a_third_party_plugin_outranking_the_builtins_is_named_once, "
    "left out of this run's registry set (its entry points did not match the HEAD copy)",
}


def render(data: dict) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mutants import MUTANTS

    groups = {m.id: m.group for m in MUTANTS}
    rows = data["mutants"]
    for r in rows:
        r["group"] = r.get("group") or groups[r["id"]]
    for r in rows:
        if r.get("earlier", "").startswith("baseline-failed"):
            r["earlier"] = ""  # that group's baseline failed; the run against the smaller group is its first pass
    first = Counter((r["earlier"].split(" ")[0] if r.get("earlier") else r["status"]) for r in rows)
    killed_first = first["killed"] + first["timeout"]
    survived_first = [r for r in rows if (r.get("earlier") or r["status"]).startswith("survived")]
    handled = [r for r in survived_first if r["id"] in HANDLED]
    rerun = Counter(r["status"] for r in survived_first if r.get("earlier"))
    harmless = sum(HANDLED.get(r["id"], "").startswith("harmless") for r in survived_first)
    lines = [
        "# Targeted mutation testing, 2026-12-03 (issue 32, item 1)",
        "",
        f"- Commit: `{COMMIT}` (a `git archive` copy in /tmp/mut-base; the checkout's files were never edited).",
        "- Tool: `benchmarks/mutation/run_mutants.py` (targeted textual mutants listed in `mutants.py`; one at a",
        "  time; one forked pytest child per mutant, `-x -q -p no:cacheprovider`, a 90-200 s timeout). mutmut was not",
        "  used: it mutates in place over a whole tree and runs the whole suite per mutant, far too slow on two",
        "  shared cores (the suite's SGLang tests alone take several minutes).",
        "- Scope: `sglang_moe_plugins/config.py`, `core/`, `integrations/sglang/` (failure policy, selection, config",
        "  parsing, version cases, stock switch, delegation, the MegaMoE plan cache).",
        "",
        f"**{len(rows)} mutants: {killed_first} killed by the module's tests, {len(survived_first)} survived; "
        f"{len(handled)} of the survivors handled** (a new test in `{SURVIVORS_FILE}` that kills it, re-run below, "
        "or why it is harmless).",
        f"Survivors re-run against their new tests: {rerun['killed']} killed, {rerun['survived']} survived; "
        f"{harmless} harmless (equivalent or logging-only); "
        f"{len(survived_first) - harmless - sum(rerun.values())} left to an existing test outside this run's subset "
        "(named; not re-run here).",
        "",
        "| id | file:line | change | first pass | survivor handled |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        outcome = r.get("earlier") or f"{r['status']} ({r.get('group', '')})"
        note = ""
        if outcome.startswith("survived"):
            note = HANDLED.get(r["id"], "**not handled**")
            if r.get("earlier"):
                note += f"; re-run against {r['group']}: **{r['status']}**"
        change = f"`{r['before'][:70]}` -> `{r['after'][:70]}`".replace("|", "\\|")
        lines.append(
            f"| {r['id']} | {r['file'].removeprefix('sglang_moe_plugins/')}:{r['line']} | {change} "
            f"({r['note']}) | {outcome} | {note} |"
        )
    missing = [m for m in MUTANTS if m.id not in {r["id"] for r in rows}]
    if missing:
        lines += [
            "",
            f"Not run ({len(missing)} of the {len(MUTANTS)} listed; their groups import SGLang and run its "
            "tests through subprocesses, more than this session's time on two shared cores allowed): "
            + ", ".join(f"`{m.id}`" for m in missing)
            + ".",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())), end="")
