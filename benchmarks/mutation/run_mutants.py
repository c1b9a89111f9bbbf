"""Targeted mutation testing of the package's decision code (issue 32): apply one mutant at a time to a
plain copy of the repository (never the checkout's own files), run the tests that cover its module, and
record whether a test failed (killed) or all passed (survived).

    python benchmarks/mutation/run_mutants.py --copy /tmp/mut-base --out benchmarks/mutation/results.json [--only ID...]

``--copy`` is a plain copy of the tree to mutate (``git archive HEAD | tar -x -C /tmp/mut-base``); the
runner must import the package from it (``PYTHONPATH=/tmp/mut-base``; checked). One mutant runs at a time:
the runner imports torch (and, for the groups that need it, SGLang) once, then forks one child per mutant
that runs ``pytest -x`` on the module's tests, so no mutant pays the interpreter's start-up. A child that
runs past the timeout is killed and counted as killed (``timeout``). The mutants are in :mod:`mutants`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, TESTS, Mutant


@dataclass
class Result:
    id: str
    file: str
    line: int
    before: str
    after: str
    note: str
    status: str  # killed | survived | timeout | baseline-failed
    seconds: float
    tail: str
    group: str = ""
    earlier: str = ""  # a previous run's outcome against another group (a survivor's second pass)


def locate(source: str, mutant: Mutant) -> tuple[int, str]:
    """The 1-based line holding ``mutant.anchor`` (it must occur on exactly one line, with ``old`` in it)."""
    lines = source.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if mutant.anchor in line]
    if len(found) != 1:
        raise SystemExit(f"{mutant.id}: anchor {mutant.anchor!r} found on {len(found)} lines of {mutant.file}")
    line = lines[found[0]]
    if line.count(mutant.old) < 1:
        raise SystemExit(f"{mutant.id}: {mutant.old!r} not in line {found[0] + 1}: {line!r}")
    return found[0] + 1, line


def apply(source: str, mutant: Mutant) -> tuple[str, int, str, str]:
    number, line = locate(source, mutant)
    new = line.replace(mutant.old, mutant.new, 1)
    lines = source.splitlines(keepends=True)
    lines[number - 1] = new
    return "".join(lines), number, line.strip(), new.strip()


def run_tests(copy: Path, tests: list[str], timeout: float, log: Path) -> tuple[str, float]:
    """Fork a child that runs pytest in ``copy``; 'passed', 'failed' or 'timeout', and the seconds taken."""
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: fresh imports of the (mutated) package, the parent's torch
        try:
            os.setsid()
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(copy)
            import pytest

            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests])
        except BaseException:  # noqa: BLE001 - the child reports through its exit status only
            import traceback

            traceback.print_exc()
            code = 99
        os._exit(int(code))
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return ("passed" if code == 0 else "failed"), time.monotonic() - start
        if time.monotonic() - start > timeout:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - start
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copy", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--group", default=None, help="run every selected mutant against this group of TESTS instead")
    args = parser.parse_args()
    copy = args.copy.resolve()
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True
    import importlib.util

    spec = importlib.util.find_spec("sglang_moe_plugins")
    assert spec is not None and Path(spec.origin).resolve().is_relative_to(copy), (
        f"the package imports from {spec and spec.origin}, not from {copy}: set PYTHONPATH={copy}"
    )
    import torch  # noqa: F401 - imported once, shared by every forked child

    mutants = [m for m in MUTANTS if args.only is None or m.id in args.only]
    if any(TESTS[args.group or m.group].sglang for m in mutants):
        import sglang.srt.layers.moe.moe_runner.deep_gemm  # noqa: F401 - imported once as well
    assert "sglang_moe_plugins" not in sys.modules, "the runner must not import the package itself"
    results: list[Result] = []
    previous = json.loads(args.out.read_text()) if args.out.exists() and args.only else {"mutants": []}
    log = Path(f"/tmp/mutant-{os.getpid()}.log")
    baseline_ok: dict[str, bool] = {}
    for mutant in mutants:
        group = TESTS[args.group or mutant.group]
        if group.name not in baseline_ok and not args.no_baseline:
            status, seconds = run_tests(copy, group.tests, args.timeout, log)
            baseline_ok[group.name] = status == "passed"
            print(f"baseline {group.name}: {status} in {seconds:.0f}s", flush=True)
            if status != "passed":
                print(log.read_text()[-2000:], flush=True)
        path = copy / mutant.file
        original = path.read_text()
        mutated, number, before, after = apply(original, mutant)
        if not baseline_ok.get(group.name, True):
            results.append(
                Result(mutant.id, mutant.file, number, before, after, mutant.note, "baseline-failed", 0, "", group.name)
            )
            continue
        try:
            path.write_text(mutated)
            status, seconds = run_tests(copy, group.tests, args.timeout, log)
        finally:
            path.write_text(original)
        state = {"failed": "killed", "passed": "survived", "timeout": "timeout"}[status]
        tail = [ln for ln in log.read_text().splitlines() if ln.startswith(("FAILED", "ERROR"))][:1]
        earlier = next(
            (
                f"{r['status']} ({r.get('group') or mutant.group})"
                for r in previous["mutants"]
                if r["id"] == mutant.id and (r.get("group") or mutant.group) != group.name
            ),
            "",
        )
        results.append(
            Result(
                mutant.id,
                mutant.file,
                number,
                before,
                after,
                mutant.note,
                state,
                round(seconds, 1),
                tail[0][:300] if tail else "",
                group.name,
                earlier,
            )
        )
        print(f"{mutant.id:28s} {state:9s} {seconds:6.1f}s  {mutant.file}:{number}  {mutant.note}", flush=True)
        done = {x.id for x in results}
        keep = [r for r in previous["mutants"] if r["id"] not in done]
        args.out.write_text(json.dumps({"mutants": keep + [asdict(r) for r in results]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
