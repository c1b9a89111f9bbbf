"""The targeted mutants of :mod:`run_mutants` and the tests each module's mutants run against.

A mutant replaces ``old`` by ``new`` (first occurrence) on the one line of ``file`` that holds ``anchor``;
line numbers are found at run time, so the list survives edits elsewhere in a file (an anchor that is gone
or ambiguous stops the run).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    name: str
    tests: list[str]
    sglang: bool = False  # the tests import SGLang: the runner imports it once before forking


@dataclass(frozen=True)
class Mutant:
    id: str
    group: str
    file: str
    anchor: str
    old: str
    new: str
    note: str


TESTS: dict[str, Group] = {
    g.name: g
    for g in (
        Group("config", ["tests/test_config.py"]),
        Group("core", ["tests/test_selection.py", "tests/test_registry.py", "tests/test_binding.py"]),
        Group("registry", ["tests/test_registry.py", "tests/test_selection.py", "tests/test_startup_safety.py",
                           "-k", "not sglang_ and not list_and_doctor and not doctor_flags"]),
        Group("mega", ["tests/test_mega_adapter.py", "tests/test_mega_plan_key.py"]),
        Group("versions", ["tests/test_sglang_releases.py", "-k", "simulated"], sglang=True),
        Group("smq", ["tests/test_sglang_integration.py", "-k",
                      "gemm1_alpha or invalid_call or positional or load_plugins_applies"], sglang=True),
        Group("entry", ["tests/test_config_fail_closed.py", "-k", "stock"], sglang=True),
    )
}

C = "sglang_moe_plugins/config.py"
D = "sglang_moe_plugins/core/decide.py"
P = "sglang_moe_plugins/core/dispatcher.py"
R = "sglang_moe_plugins/core/registry.py"
B = "sglang_moe_plugins/core/bound.py"
MP = "sglang_moe_plugins/integrations/sglang/mega_plan.py"
MM = "sglang_moe_plugins/integrations/sglang/mega_moe.py"
V = "sglang_moe_plugins/integrations/sglang/versions.py"
S = "sglang_moe_plugins/integrations/sglang/silu_mul_quant.py"
E = "sglang_moe_plugins/integrations/sglang/entry.py"


def m(id: str, group: str, file: str, anchor: str, old: str, new: str, note: str) -> Mutant:
    return Mutant(id, group, file, anchor, old, new, note)


MUTANTS: list[Mutant] = [
    # -- config parsing -----------------------------------------------------------------------------------
    m("config-unknown-key", "config", C, "if unknown:", "if unknown:", "if False:", "unknown top-level key accepted"),
    m("config-strict-type", "config", C, 'raise ConfigError(f"strict{where} must be true', "raise ConfigError", "pass  # ",
      "non-bool strict accepted"),
    m("config-strict-default", "config", C, 'strict = data.get("strict", False)', "False", "True", "strict on by default"),
    m("config-debug-type", "config", C, "if not isinstance(debug, bool):", "if not", "if", "bool debug refused"),
    m("config-priority-bool", "config", C, "if isinstance(value, bool) or not isinstance(value, int):",
      "isinstance(value, bool) or ", "", "priority = true accepted as 1"),
    m("config-int64-low", "config", C, "if not _INT64[0] <= value <= _INT64[1]:", "_INT64[0] <=", "_INT64[0] <",
      "lowest int64 priority refused"),
    m("config-int64-high", "config", C, "if not _INT64[0] <= value <= _INT64[1]:", "<= _INT64[1]", "< _INT64[1]",
      "highest int64 priority refused"),
    m("config-int64-const", "config", C, "_INT64 = (-(1 << 63), (1 << 63) - 1)", "(1 << 63) - 1)", "(1 << 64) - 1)",
      "priority past int64 accepted"),
    m("config-force-type", "config", C, "if not isinstance(force, dict) or not all(isinstance(v, str)",
      "or not all(isinstance(v, str) for v in force.values())", "", "non-string force value accepted"),
    m("config-options-type", "config", C, "if not isinstance(options, dict) or not all(isinstance(v, dict)",
      "not isinstance(options, dict) or ", "", "[options] that is not a table: crash instead of ConfigError"),
    m("config-string-list-empty", "config", C, "if not isinstance(value, list) or not all(isinstance(v, str) and v",
      "isinstance(v, str) and v ", "isinstance(v, str) ", "empty plugin name accepted in a list"),
    m("config-policy-check", "config", C, "if value not in ON_CONFIG_ERROR_CHOICES:", "not in", "in",
      "on_config_error check inverted"),
    m("config-masked-check", "config", C, "if value not in MASKED_LAYOUT_CHOICES:", "if value not in", "if False and value not in",
      "masked_layout value unchecked"),
    m("config-env-true", "config", C, "if value in _TRUE:", "if value in _TRUE:", "if value in _FALSE:",
      "env flag true-words read from the false set"),
    m("config-env-raise", "config", C, 'is not a boolean; use one of', "raise ConfigError", "return None  # ",
      "invalid boolean env value ignored"),
    m("config-strict-env", "config", C, "if _env_flag(env, STRICT_ENV):", "if _env_flag", "if not _env_flag",
      "SGLANG_MOE_PLUGINS_STRICT inverted"),
    m("config-debug-env", "config", C, "if _env_flag(env, DEBUG_ENV):", "if _env_flag", "if not _env_flag",
      "SGLANG_MOE_PLUGINS_DEBUG inverted"),
    m("config-disable-env", "config", C, "        disable.add(name)", "disable.add(name)", "pass",
      "SGLANG_MOE_PLUGINS_DISABLE ignored"),
    m("config-stock-env", "config", C, "        stock.add(op)", "stock.add(op)", "pass", "SGLANG_MOE_PLUGINS_STOCK ignored"),
    m("config-allow-env", "config", C, "allow = frozenset(_names(env[ALLOW_ENV]))", "frozenset(_names(env[ALLOW_ENV]))",
      "config.allow", "SGLANG_MOE_PLUGINS_ALLOW ignored"),
    m("config-on-error-env", "config", C, "if env.get(ON_CONFIG_ERROR_ENV, \"\").strip():", "if env", "if not env",
      "on_config_error env override inverted"),
    m("config-names-strip", "config", C, 'return [n.strip() for n in raw.split(",") if n.strip()]', "if n.strip()", "",
      "empty names kept in comma lists"),
    m("config-force-unknown-op", "config", C, 'raise ConfigError(f"unknown op {op!r} in force{where}', "raise ConfigError",
      "pass  # ", "force of an unknown op accepted"),
    m("config-force-wrong-op", "config", C, "if plugins[name] != op:", "!=", "==", "force naming another op's plugin"),
    m("config-force-disabled", "config", C, "            if name in self.disable:", "if name in", "if name not in",
      "forced plugin that is disabled"),
    m("config-both", "config", C, "        if both:", "if both:", "if False:", "plugin both enabled and disabled accepted"),
    m("config-unknown-plugin", "config", C, "                if name not in plugins:", "not in", "in",
      "unknown plugin names accepted, known refused"),
    # -- selection (decide) -------------------------------------------------------------------------------
    m("decide-force", "core", D, "if force is not None and record.name != force:", "!= force", "== force",
      "force keeps every plugin but the forced one"),
    m("decide-force-none", "core", D, "if force is not None and record.name != force:", "force is not None and ", "",
      "unforced op: everything 'not forced'"),
    m("decide-enabled", "core", D, "if not record.enabled:", "if not record.enabled:", "if False:",
      "disabled plugins run"),
    m("decide-failed", "core", D, "if record.name in failed:", "in failed", "not in failed", "failed plugins chosen again"),
    m("decide-strict-raise", "core", D, "if strict or collective:", "strict or collective", "collective",
      "strict ignored for a raising supports()"),
    m("decide-collective-raise", "core", D, "if strict or collective:", "strict or collective", "strict",
      "collective ignored for a raising supports()"),
    m("decide-support-not", "core", D, "        if not support:", "if not support:", "if support:",
      "supports() verdict inverted"),
    m("decide-first-chosen", "core", D, "elif chosen is None:", "elif chosen is None:", "elif True:",
      "the last supported plugin wins, not the first"),
    m("decide-rule-order", "core", D, "records = tuple(sorted(records, key=lambda r: (-ruled.get(",
      "(-ruled.get", "(ruled.get", "priority rules sort ascending"),
    m("decide-rule-prio", "core", D, "records = tuple(dataclasses.replace(r, priority=ruled[r.name][0])",
      "priority=ruled[r.name][0]", "priority=r.priority", "rule priority not shown on the candidate"),
    m("decide-info-cut", "core", D, 'return head + (key if len(key) <= room else', "<= room", "< room",
      "INFO line cut one character early (logging)"),
    m("decide-info-max", "core", D, "INFO_LINE_MAX = 145", "145", "245", "INFO lines may be longer"),
    # -- dispatcher (failure policy) -----------------------------------------------------------------------
    m("disp-collective", "core", P, "        if collective:", "if collective:", "if False:",
      "collective op falls back per rank"),
    m("disp-strict", "core", P, "        elif self.strict:", "elif self.strict:", "elif False:",
      "strict does not re-raise a run failure"),
    m("disp-forced", "core", P, "elif self.registry.config.force.get(op) == plugin:", "== plugin", "!= plugin",
      "a forced plugin's failure falls back"),
    m("disp-capturing", "core", P, "        elif capturing:", "elif capturing:", "elif False:",
      "fallback inside CUDA graph capture"),
    m("disp-why-raise", "core", P, "        if why is not None:", "is not None", "is None", "re-raise decision inverted"),
    m("disp-written", "core", P, "        if written:", "if written:", "if False:",
      "a plugin that may have written an input falls back"),
    m("disp-mark-failed", "core", P, "        self.mark_failed(key, plugin, exc)", "self.mark_failed(key, plugin, exc)",
      "pass", "a failed plugin is not excluded"),
    m("disp-validate-first", "core", P, "if first.pending or bound.check_every_call:", "first.pending or ", "",
      "first call's outputs not validated"),
    m("disp-pending-reset", "core", P, "                first.pending = False", "first.pending = False", "pass",
      "every call validated (performance only)"),
    m("disp-wrong-type", "core", P, "if type(returned) is not bound.output_type:", "is not", "is",
      "a plugin returning the wrong type accepted"),
    m("disp-select-raise", "core", P, "raise NoPluginAvailableError(op, selection.key_description(), rejections",
      "raise NoPluginAvailableError(", "return selection; NoPluginAvailableError(", "no plugin: no NoPluginAvailableError"),
    m("disp-forced-rejections", "core", P, "rejections = [(c.name, f\"{c.verdict}: {c.reason}\") for c in selection.candidates if c.name == forced]",
      "if c.name == forced", "", "forced op's error lists every plugin"),
    m("disp-cache-cap", "core", P, "        if len(cache) < CACHE_CAP:", "<", ">=", "the caches never fill"),
    m("disp-outputs-check", "core", P, "        if outputs is not None:\n", "is not None", "is None",
      "caller's outputs not checked before a plugin runs"),
    m("disp-failed-dup", "core", P, "if plugin in failed:  # another thread", "if plugin in failed:", "if False:",
      "a second failure record of the same plugin (concurrency)"),
    m("bound-marked", "core", B, "if not marked:", "if not marked:", "if False:", "no writable inputs: declared names read"),
    m("bound-undeclared", "core", B, "    if declared is None:", "if declared is None:", "if False:",
      "undeclared writes: none assumed"),
    m("bound-filter", "core", B, "return tuple(name for name in marked if name in names)", "if name in names",
      "if name not in names", "declared writes inverted"),
    m("bound-checked", "core", B, "return not self._first.pending", "return not", "return", "checked inverted"),
    # -- registry ------------------------------------------------------------------------------------------
    m("reg-sort", "registry", R, "self._records = tuple(sorted(records, key=lambda r: (r.op, -r.priority, r.name)))",
      "-r.priority", "r.priority", "records lowest priority first"),
    m("reg-disable", "registry", R, "            if name in config.disable:", "if name in config.disable:", "if False:",
      "disable ignored"),
    m("reg-enable", "registry", R, "elif name in config.enable:", "elif name in config.enable:", "elif False:",
      "enable of an off-by-default plugin ignored"),
    m("reg-default-off", "registry", R, "elif attrs.enabled_by_default:", "elif attrs.enabled_by_default:", "elif True:",
      "off-by-default plugins enabled"),
    m("reg-priority", "registry", R, "            if name in config.priority:", "if name in", "if name not in",
      "user priority ignored"),
    m("reg-strict", "registry", R, "if config.strict and problems:", "config.strict and ", "",
      "problems always fatal"),
    m("reg-strict2", "registry", R, "if config.strict and problems:", "config.strict and problems", "False",
      "strict does not fail on a broken plugin"),
    m("reg-dup-name", "registry", R, "if attrs.name in accepted:", "if attrs.name in accepted:", "if False:",
      "duplicate plugin names accepted"),
    m("reg-ep-name", "registry", R, "if info is not None and attrs.name != info.name:", "!=", "==",
      "entry-point name must differ from the plugin name"),
    m("reg-name-re", "registry", R, "if not isinstance(name, str) or not _NAME_RE.match(name):",
      " or not _NAME_RE.match(name)", "", "any plugin name accepted"),
    m("reg-op-known", "registry", R, "    if op not in OPS:", "not in", "in", "unknown ops accepted"),
    m("reg-prio-int", "registry", R, "if isinstance(priority, bool) or not isinstance(priority, int):",
      "isinstance(priority, bool) or ", "", "priority = True accepted"),
    m("reg-contract", "registry", R, "    if version != CONTRACT_VERSION:", "!=", "==", "contract version check inverted"),
    m("reg-option-unknown", "registry", R, "        if key not in defaults:", "not in", "in", "unknown options accepted"),
    m("reg-reserved", "registry", R, "if not info.builtin and info.name in reserved:", "not info.builtin and ", "",
      "built-ins refused as reserved"),
    m("reg-outrank", "registry", R, "            if record.priority > top.priority:", ">", "<",
      "outranking notice inverted"),
    m("reg-disabled-builtin", "registry", R, "if info.name in config.disable:  # a disabled built-in", "if info.name in",
      "if info.name not in", "disabled built-in that cannot import: problem reported"),
    # -- MegaMoE plans -------------------------------------------------------------------------------------
    m("plan-cap", "mega", MP, "full = len(PLANS) >= MAX_PLANS", ">=", ">", "cache holds one plan more than the cap"),
    m("plan-cap-off", "mega", MP, "full = len(PLANS) >= MAX_PLANS", "len(PLANS) >= MAX_PLANS", "False",
      "plan cache unbounded"),
    m("plan-clear", "mega", MP, "            PLANS.clear()", "PLANS.clear()", "pass", "full cache not cleared"),
    m("plan-forget", "mega", MP, "if plan is not None and plan.watch[0] is ref:", "is ref", "is not ref",
      "a freed layer's plan kept (another's dropped)"),
    m("plan-forget-pop", "mega", MP, "        PLANS.pop(key, None)", "PLANS.pop(key, None)", "pass",
      "freed layers' plans never leave the cache"),
    m("plan-store", "mega", MP, "        PLANS[key] = plan", "PLANS[key] = plan", "pass", "plans never cached"),
    m("plan-max", "mega", MP, "MAX_PLANS = 4096", "4096", "4", "cap of 4 plans"),
    m("mega-hit-experts", "mega", MM, "if (watch[0]() is experts and a is watch[1]()", "watch[0]() is experts and ", "",
      "a plan hit without checking the experts object"),
    m("mega-hit-weights", "mega", MM, "if (watch[0]() is experts and a is watch[1]()", "a is watch[1]()", "True",
      "a plan hit with rebuilt l1 weights"),
    m("mega-hit-tokens", "mega", MM, 'and width == hidden and kwargs["num_tokens"] == tokens and tokens <= cap',
      "tokens <= cap", "True", "a batch past the token cap hits the plan"),
    m("mega-hit-topk", "mega", MM, "hit = (topk_ids.shape == (tokens, top_k) and", "topk_ids.shape == (tokens, top_k) and", "",
      "topk_ids shape not checked on a hit"),
    m("mega-rsf-key", "mega", MM, 'get("activation_clamp"), get("routed_scaling_factor", 1.0)',
      'get("routed_scaling_factor", 1.0)', "None", "routed_scaling_factor not in the plan key"),
    m("mega-plan-only", "mega", MM, "return plan if plan_only else DELEGATE", "plan if plan_only else DELEGATE",
      "DELEGATE if plan_only else plan", "plan_only result inverted"),
    m("mega-y-rows", "mega", MM, "if outputs.y.shape[0] < (tokens or 1):", "<", ">", "a short y from a plugin accepted"),
    # -- version cases -------------------------------------------------------------------------------------
    m("ver-local", "versions", V, 'public = version.split("+", 1)[0]', 'version.split("+", 1)[0]', "version",
      "0.5.23+cu129 not treated as 0.5.23"),
    m("ver-newer-cmp", "versions", V, "if newest is None or _release_key(public) <= _release_key(newest):", "<=", "<",
      "a release equal to the newest by key... treated as newer"),
    m("ver-newer-cmp2", "versions", V, "if newest is None or _release_key(public) <= _release_key(newest):", "<=", ">=",
      "older releases hooked as newer"),
    m("ver-mismatch", "versions", V, "    if not all(c.ok for c in checks):", "if not all", "if all",
      "changed signatures hooked on a newer release"),
    m("ver-require", "versions", V, "    if _require_known(environ):", "if _require_known", "if not _require_known",
      "REQUIRE_KNOWN inverted"),
    m("ver-require-words", "versions", V, 'in {"1", "true", "yes", "on"}', '"1", ', "", "REQUIRE_KNOWN=1 not understood"),
    m("ver-rank-rc", "versions", V, 'rank = {"dev": -4, "a": -3, "b": -2, "rc": -1, None: 0, "post": 1}',
      '"rc": -1', '"rc": 1', "release candidates sort after the release"),
    m("ver-pad", "versions", V, "release = release + (0,) * (4 - len(release))", "(0,) * (4 - len(release))", "()",
      "0.5 and 0.5.0 sort differently"),
    m("ver-sig", "versions", V, "    if params != target.parameters:", "!=", "==", "signature check inverted"),
    m("ver-hooks-newer", "versions", V, 'return VersionCase("newer", version, newest, True, message, checks, targets)',
      "newest, True,", "newest, False,", "a newer matching release is not hooked"),
    # -- silu_mul_quant hook (delegation) ------------------------------------------------------------------
    m("smq-alpha", "smq", S, "if alpha is not None or clamp is not None:", "alpha is not None or ", "",
      "gemm1_alpha calls run the op"),
    m("smq-masked-none", "smq", S, "    if m is None:", "if m is None:", "if False:", "masked_m=None runs the op"),
    m("smq-ue8m0", "smq", S, '        return "ue8m0_packed"', '"ue8m0_packed"', '"column_major"',
      "UE8M0 host: unpacked scales"),
    m("smq-layout", "smq", S, 'return "row_major" if dsv4_branch else "column_major"', "if dsv4_branch", "if not dsv4_branch",
      "DSV4 branch layout swapped"),
    # -- entry (stock switch, fail closed) -----------------------------------------------------------------
    m("entry-stock", "entry", E, "        if check.op in stock:", "if check.op in stock:", "if False:",
      "stock ops hooked anyway"),
    m("entry-stock-env", "entry", E, 'stock = frozenset(n.strip() for n in os.environ.get(STOCK_ENV, "")',
      'os.environ.get(STOCK_ENV, "")', '""', "invalid config: STOCK env ignored"),
    m("entry-policy", "entry", E, 'if config_error_policy() == "stock":', '== "stock"', '!= "stock"',
      "on_config_error policy inverted"),
]

#: Wider test sets for the survivors of the fast subsets (a second pass: slower, some through SGLang).
TESTS.update(
    {
        g.name: g
        for g in (
            Group("config+", ["tests/test_config_fail_closed.py", "tests/test_cli.py", "-k",
                              "new_settings or bad_values or int64 or env_value or unknown_stock or bom or non_regular "
                              "or policy_is_read or not_installed or config"]),
            Group("core+", ["tests/test_priority_rules.py", "tests/test_concurrency.py", "tests/test_stats.py",
                            "tests/test_failure_policy.py", "tests/test_fault_paths.py"], sglang=True),
            Group("survivors", ["tests/test_mutation_survivors.py"]),
            # test_startup_safety's entry-point tests read the installed distribution's entry points, which
            # may name modules a HEAD copy lacks (the checkout's uncommitted plugins): left out of this set.
            Group("registry-", ["tests/test_registry.py", "tests/test_selection.py"]),
            # test_mega_plan_key alone took 110 s on the shared cores, and the adapter's file past 120 s under
            # load: the plan mutants run the adapter's plan tests only
            Group("mega-", ["tests/test_mega_adapter.py", "-k", "bound or planned or cap or rebuilt or plan"]),
        )
    }
)
