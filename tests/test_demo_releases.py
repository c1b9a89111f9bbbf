"""Issue #31 item 7: the demo (``python -m sglang_moe_plugins.demo``) on every SGLang release CI covers.

Each test runs the demo as a user does, in a fresh interpreter: this one (``.venv``, sglang 0.5.23 in CI) and
the interpreter of each older release ``./dev.sh`` builds (``.venv-sglang-<release>`` for each of its
``$OLD_SGLANG``: 0.5.19 and 0.5.20), skipped with the reason where that environment is missing. The demo must
say what it does case by case as it goes, run each case its release has (no ``silu_mul_keep_fp32`` before
0.5.21: the release's ``_varlen_deep_gemm_silu_mul_quant`` has no such parameter) and pass; a case that fails
is named.

Marked ``sglang`` (they drive real SGLang through its ``load_plugins()``), but ``./dev.sh``'s older-release
passes (``-m sglang`` in each ``.venv-sglang-*``) leave this file out: its run on ``.venv`` already starts the
demo in each of those environments, so CI runs the demo once per release. The failing demo runs in this process.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
from sglang_session import default_selector, loaded_sglang  # noqa: F401 - default_selector: the fixture, autouse

from sglang_moe_plugins.demo import CRASH_CASES

pytestmark = pytest.mark.sglang

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The release that added ``silu_mul_keep_fp32`` to ``_varlen_deep_gemm_silu_mul_quant`` (read from the wheels:
#: 0.5.19 and 0.5.20 have no such parameter, nor any other use of the name under ``sglang/srt``).
KEEP_FP32_FROM = (0, 5, 21)


def _old_releases() -> list[str]:
    """``./dev.sh``'s ``$OLD_SGLANG``: the environment's value when set (empty: none), else dev.sh's default."""
    if "OLD_SGLANG" in os.environ:
        return os.environ["OLD_SGLANG"].split()
    match = re.search(r"^OLD_SGLANG=\$\{OLD_SGLANG-([^}]*)\}", (ROOT / "dev.sh").read_text(), re.MULTILINE)
    assert match, "dev.sh no longer sets OLD_SGLANG's default as ${OLD_SGLANG-...}"
    return match.group(1).split()


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", release.split("+")[0])[:3])


def _env(**extra: str) -> dict[str, str]:
    """The user's environment without SGLang's or this package's settings (the demo's defaults), plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")} | extra


def run_demo(python: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "sglang_moe_plugins.demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=900,
    )


def _interpreters() -> list:
    here = pytest.param(sys.executable, version("sglang"), id=f"this-interpreter-sglang-{version('sglang')}")
    old = [
        pytest.param(str(ROOT / f".venv-sglang-{r}" / "bin" / "python"), r, id=f"sglang-{r}") for r in _old_releases()
    ]
    return [here, *old]


@pytest.mark.parametrize("python, release", _interpreters())
def test_demo_passes_and_reports_each_case(python: str, release: str) -> None:
    if not os.path.exists(python):
        pytest.skip(f"{python} is missing: `./dev.sh setup` builds it (OLD_SGLANG={' '.join(_old_releases())!r})")
    if python != sys.executable and os.path.realpath(os.path.dirname(os.path.dirname(python))) == os.path.realpath(
        sys.prefix
    ):
        pytest.skip(f"{python} is this interpreter: its run is the this-interpreter case")
    result = run_demo(python)
    out = result.stdout
    detail = f"exit {result.returncode}\n--- stdout (tail)\n{out[-4000:]}\n--- stderr (tail)\n{result.stderr[-4000:]}"
    assert result.returncode == 0, detail
    assert f"installed sglang {release}" in out, detail
    total = len(CRASH_CASES)
    applicable = 0
    for i, case in enumerate(CRASH_CASES, 1):
        # Said before the case runs, then its outcome on a line of its own.
        start = out.find(f"case {i}/{total}: {case.label}\n")
        assert start >= 0, f"no line announcing case {i} ({case.label!r})\n{detail}"
        if case.keep_fp32 and _key(release) < KEEP_FP32_FROM:
            verdict = f"case {i}/{total}: not run on sglang {release}: "
            assert "silu_mul_keep_fp32" in out[out.find(verdict) :].splitlines()[0], detail
        else:
            verdict = f"case {i}/{total}: OK"
            applicable += 1
        assert out.find(verdict, start) > start, f"no line {verdict!r} after case {i} ({case.label!r})\n{detail}"
    assert "FAILED" not in out, detail
    assert re.search(rf"^demo OK on sglang {re.escape(release)}: {applicable} cases? checked", out, re.MULTILINE), (
        detail
    )


def test_demo_names_the_case_that_fails(capsys) -> None:
    """No plugin that runs on a CPU (both disabled): every hooked call raises NoPluginAvailableError, and the demo
    names each case with its error, goes on to the next one and exits 1.

    In this process, through SGLang's real ``load_plugins()`` and hooked function (the suite's other SGLang tests
    load them here already), with the configuration read from the environment variable a user would set: a
    fresh interpreter would cost CI another SGLang import."""
    loaded_sglang()
    from sglang_moe_plugins import api, demo

    api.reload(env={"SGLANG_MOE_PLUGINS_DISABLE": "reference,example_torch"})
    code = demo.main([])
    captured = capsys.readouterr()
    out = captured.out
    detail = f"exit {code}\n--- stdout (tail)\n{out[-4000:]}\n--- stderr (tail)\n{captured.err[-2000:]}"
    assert code == 1, detail
    total = len(CRASH_CASES)
    for i, case in enumerate(CRASH_CASES, 1):
        assert f"case {i}/{total}: {case.label}\n" in out, detail  # announced before it ran
        line = next((x for x in out.splitlines() if x.startswith(f"case {i}/{total} FAILED")), None)
        if line is None and case.keep_fp32 and f"case {i}/{total}: not run on sglang" in out:
            continue  # a release without silu_mul_keep_fp32 (this file run from an older release's interpreter)
        assert line is not None, f"no failure line for case {i}\n{detail}"
        assert case.label in line and "NoPluginAvailableError" in line, line
    assert re.search(r"^demo FAILED on sglang \S+: case 1/", out, re.MULTILINE), detail
