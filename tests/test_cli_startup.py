"""What the command imports before it answers: ``--help`` imports no torch and no command module; a command
imports its own module only; ``list --json`` imports no torch, Triton, numpy or SGLang (measured with
``python -X importtime``, in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

COMMANDS = ("list", "explain", "doctor", "check", "bench")


#: Runs the command as ``python -m sglang_moe_plugins.cli`` does, then writes the names in ``sys.modules``
#: (every module imported, also through ``importlib.import_module``, which ``-X importtime`` does not show).
_RUN = """
import json, runpy, sys
out, sys.argv = sys.argv[1], ["sglang-moe-plugins", *sys.argv[2:]]
try:
    runpy.run_module("sglang_moe_plugins.cli", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as exc:
    code = exc.code
with open(out, "w") as f:
    json.dump(sorted(sys.modules), f)
sys.exit(code)
"""


def imports_of(
    tmp_path, *args: str, env_extra: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, set[str], list[tuple[int, str]]]:
    """Run ``sglang-moe-plugins ARGS`` in a fresh interpreter (with ``-X importtime``): the result, the modules
    it imported, and ``-X importtime``'s ``(depth, name)`` rows (for the message naming who imported what)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")} | (env_extra or {})
    out = tmp_path / "modules.json"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _RUN, str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    rows = []
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2 and "cumulative" not in line:
            field = line.split("|")[2]
            rows.append(((len(field) - len(field.lstrip()) - 1) // 2, field.strip()))
    return result, set(json.loads(out.read_text())), rows


def importer_chain(rows: list[tuple[int, str]], name: str) -> str:
    """``a <- b <- c``: the module ``name`` and the modules whose import statements imported it."""
    index = next((i for i, (_, n) in enumerate(rows) if n == name), None)
    if index is None:
        return f"{name} (by importlib, not an import statement)"
    chain, depth = [name], rows[index][0]
    for d, n in rows[index + 1 :]:
        if d < depth:
            chain.append(n)
            depth = d
    return " <- ".join(chain)


def test_help_imports_no_torch_and_no_command(tmp_path):
    result, names, rows = imports_of(tmp_path, "--help")
    assert result.returncode == 0 and "explain" in result.stdout and "bench" in result.stdout, result.stderr[-2000:]
    assert "sglang_moe_plugins" in names and rows, "module list not read"
    assert "torch" not in names, f"--help imports torch: {importer_chain(rows, 'torch')}"
    loaded = sorted(f"sglang_moe_plugins.cli.{c}" for c in COMMANDS if f"sglang_moe_plugins.cli.{c}" in names)
    assert not loaded, f"--help imports command modules: {loaded}"


@pytest.mark.parametrize(
    "command, args", [("list", ("--json",)), ("explain", ("--help",)), ("bench", ("--model", "nope"))]
)
def test_a_command_imports_its_own_module_only(tmp_path, command, args):
    result, names, _ = imports_of(tmp_path, command, *args)
    assert result.returncode in (0, 2), result.stderr[-2000:]
    assert f"sglang_moe_plugins.cli.{command}" in names
    others = sorted(
        f"sglang_moe_plugins.cli.{c}" for c in COMMANDS if c != command and f"sglang_moe_plugins.cli.{c}" in names
    )
    assert not others, f"`{command}` imports other commands' modules: {others}"


def test_list_json_imports_no_torch(tmp_path):
    """The built-in plugins' modules, the registry, the ops and the platform probe import no torch:
    ``list`` asks NVML for the GPU (hardware.local_platform). Third-party plugins are kept out
    (``SGLANG_MOE_PLUGINS_ALLOW=``): ``list`` imports their modules, and those import what they import."""
    result, names, rows = imports_of(tmp_path, "list", "--json", env_extra={"SGLANG_MOE_PLUGINS_ALLOW": ""})
    assert result.returncode == 0 and '"plugins"' in result.stdout, result.stderr[-2000:]
    assert '"mega_reference"' in result.stdout and '"triton"' in result.stdout, "the built-in plugins are listed"
    for heavy in ("torch", "triton", "numpy", "sglang", "deep_gemm"):
        assert heavy not in names, f"list --json imports {heavy}: {importer_chain(rows, heavy)}"


def test_main_runs_a_command_twice_in_one_process():
    """Importing the ``list`` command binds ``list`` in the package's namespace: ``main`` must not need the builtin."""
    code = (
        "import io, contextlib, json; from sglang_moe_plugins.cli import main\n"
        "for _ in range(2):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        assert main(['list', '--json']) == 0\n"
        "    assert json.loads(out.getvalue())['plugins']\n"
        "import sys; assert 'sglang_moe_plugins.cli.list' in sys.modules and 'sglang_moe_plugins.cli.bench' not in sys.modules\n"
        "print('OK')"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
