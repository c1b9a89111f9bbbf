"""Run tests of this checkout against the package of an older revision: does each test fail there?

A red team's finding is fixed when its test passes here and fails on the code the finding was made on. This script
extracts that revision's tree (``git archive``) into a temporary directory, puts it first on ``PYTHONPATH`` (so
``import sglang_moe_plugins``, SGLang's ``load_plugins()`` and every subprocess the tests start get the old package;
the tests' own helpers stay this checkout's), runs the given tests there with pytest's JUnit report, and writes one
row per test: passed, failed, or an error, with the first line of the failure.

    python tests/run_against_revision.py --rev 503300d --out tests/redteam_runs/round2-against-503300d \\
        tests/test_redteam2_*.py

The result is ``<out>.json`` and ``<out>.md``; the tests run once more on this checkout in the same call (the
``here`` column), so a test that fails on both is visible as such.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: What a row on the old revision can and cannot prove (written into every result).
CAVEAT = (
    "Read a failure's first line before counting it: the installed distribution's metadata (entry points) is this "
    "checkout's, so an entry point added after the old revision fails to import there (`ModuleNotFoundError: "
    "sglang_moe_plugins...`), and a test that imports a helper added since fails with `ImportError`; both show the "
    "old code lacks the thing tested, not how it misbehaves."
)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def _extract(rev: str, into: pathlib.Path) -> None:
    archive = into / "tree.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), rev], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    archive.unlink()


def _first_line(case: ET.Element) -> tuple[str, str]:
    for kind in ("failure", "error"):
        node = case.find(kind)
        if node is not None:
            text = (node.get("message") or node.text or "").strip().splitlines()
            return kind, (text[0] if text else "")[:300]
    if case.find("skipped") is not None:
        node = case.find("skipped")
        return "skipped", ((node.get("message") or "") if node is not None else "")[:300]
    return "passed", ""


def _run(tests: list[str], package_root: pathlib.Path | None, report: pathlib.Path) -> dict[str, tuple[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_MOE_PLUGINS_")}
    paths = [str(ROOT / "tests")]
    if package_root is not None:
        paths.insert(0, str(package_root))
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH", "")])])
    # -P: the working directory (this checkout) is not put first on sys.path; PYTHONPATH decides the package.
    # The working directory is a temporary one: a subprocess started with `python -m` puts its working directory
    # first on sys.path, which would be this checkout.
    cmd = [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={ROOT}"]
    cmd += ["-c", str(ROOT / "pyproject.toml"), f"--junitxml={report}", *(str(ROOT / t) for t in tests)]
    subprocess.run(cmd, cwd=report.parent, env=env, capture_output=True, text=True)
    outcome: dict[str, tuple[str, str]] = {}
    if not report.exists():
        return outcome
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name')}"
        outcome[name] = _first_line(case)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the revision whose package the tests run against")
    parser.add_argument("--out", required=True, help="result path without suffix (.json and .md are written)")
    parser.add_argument("tests", nargs="+", help="test files or node ids, relative to the repository root")
    args = parser.parse_args(argv)
    rev = _git("rev-parse", "--short", args.rev)
    with tempfile.TemporaryDirectory(prefix=f"against-{rev}-") as tmp:
        work = pathlib.Path(tmp)
        _extract(rev, work)
        before = _run(args.tests, work / "tree", work / "before.xml")
        here = _run(args.tests, None, work / "here.xml")
    rows = [
        {"test": name, "against": before.get(name, ("not collected", "")), "here": here.get(name, ("absent", ""))}
        for name in sorted(set(before) | set(here))
    ]
    meta = {
        "revision": rev,
        "checkout": _git("rev-parse", "--short", "HEAD") + ("+dirty" if _git("status", "--porcelain") else ""),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "command": "python tests/run_against_revision.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    failing_before = sum(r["against"][0] in ("failed", "failure", "error", "not collected") for r in rows)
    passing_here = sum(r["here"][0] == "passed" for r in rows)
    lines = [
        f"# Tests of {meta['checkout']} against the package of {rev}",
        "",
        f"{meta['date']}, Python {meta['python']}. Command: `{meta['command']}`.",
        "",
        f"{len(rows)} tests: {failing_before} fail (or do not run) on {rev}; {passing_here} pass on this checkout.",
        "",
        CAVEAT,
        "",
        f"| test | on {rev} | first line | here |",
        "|---|---|---|---|",
    ]
    for row in rows:
        kind, line = row["against"]
        cell = line.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{row['test']}` | {kind} | {cell} | {row['here'][0]} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"{out}.md: {failing_before} of {len(rows)} fail on {rev}, {passing_here} pass here")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
