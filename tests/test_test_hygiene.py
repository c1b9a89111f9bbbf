"""No test swallows an import error: a test whose import fails must fail (or skip by name), not pass.

Flagged: an ``import`` statement, ``importlib.import_module(...)`` or ``__import__(...)`` call inside a
``try`` whose handler catches everything (bare ``except``, ``Exception``, ``BaseException``) or an import
error (``ImportError``, ``ModuleNotFoundError``), unless the handler re-raises unconditionally (a ``raise``
among its top-level statements); and the same calls under ``contextlib.suppress`` of those exceptions.
``pytest.importorskip`` is the way to skip on a missing optional dependency. The exceptions to the rule
are listed in :data:`ALLOWED`, each with its reason; a stale entry fails.
"""

from __future__ import annotations

import ast
import dataclasses
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SWALLOWING = frozenset({"Exception", "BaseException", "ImportError", "ModuleNotFoundError"})


@dataclass(frozen=True)
class Hit:
    """One swallowed import: the file (relative to the repository), the enclosing function (dotted
    qualname, ``<module>`` at top level), the module(s) imported, and the line of the ``try``."""

    path: str
    scope: str
    modules: tuple[str, ...]
    line: int

    @property
    def key(self) -> tuple[str, str, tuple[str, ...]]:
        return self.path, self.scope, self.modules


#: (path, scope, imported modules) -> why this swallowing is right. Line numbers are not part of the key.
ALLOWED: dict[tuple[str, str, tuple[str, ...]], str] = {
    (
        "tests/fuzz_cases.py",
        "<module>",
        ("hypothesis",),
    ): "hypothesis is optional (absent on the GPU image): HAVE_HYPOTHESIS records it, the fuzz tests skip on it",
    (
        "tests/gpu/mega_sm90_common.py",
        "env_ok",
        ("deep_gemm",),
    ): "returns the import error's text as the reason the SM90 GPU tests skip; deep_gemm is GPU-only",
    (
        "tests/gpu/sglang_host.py",
        "sglang_jit",
        ("tvm_ffi",),
    ): "returns 'tvm-ffi is not importable' as the reason the GPU host-kernel tests skip; tvm_ffi is optional",
    (
        "tests/gpu/test_mega_deepgemm_sm90.py",
        "_install_parallel_state",
        ("sglang.srt.runtime_context",),
    ): "SGLang's absence is the branch: without it the test installs the one-rank parallel state itself",
    (
        "tests/gpu/test_contig_triton_gpu.py",
        "sglang",
        ("sglang_host", "tvm_ffi"),
    ): "returns None (the GPU comparison with SGLang's JIT kernels then skips) when tvm-ffi is absent; note it "
    "also hides a broken tests/gpu/sglang_host import: narrower would be importorskip('tvm_ffi')",
    (
        "tests/test_smq_exp_kernel.py",
        "compile_exp",
        ("triton.backends.compiler", "triton.compiler"),
    ): "pytest.skip naming the ImportError: Triton releases without ASTSource/GPUTarget (triton itself is "
    "importorskip'd at the top)",
    (
        "tests/test_triton_specialisation.py",
        "specialise",
        ("triton.backends.compiler", "triton.compiler", "triton.runtime.jit"),
    ): "pytest.skip naming the ImportError: Triton releases without the argument binder this test compares with",
}


def _names(node: ast.expr | None) -> set[str]:
    """The exception names a handler's type catches (``Exception``, ``builtins.ImportError``, tuples)."""
    if node is None:
        return {"BaseException"}
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def _imports(nodes: list[ast.stmt]) -> list[str]:
    """The modules imported by ``nodes`` as they run (not inside functions they only define)."""
    found: list[str] = []
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__"):
                arg = node.args[0] if node.args else None
                found.append(arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "<dynamic>")
        stack.extend(ast.iter_child_nodes(node))
    return found


def _reraises(handler: ast.ExceptHandler) -> bool:
    return any(isinstance(stmt, ast.Raise) for stmt in handler.body)


def _suppressed(item: ast.withitem) -> bool:
    call = item.context_expr
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "suppress" and any(_names(a) & SWALLOWING for a in call.args)


def swallowed_imports(source: str, path: str, strings: bool = True) -> list[Hit]:
    """Every import in ``source`` whose failure a handler (or ``suppress``) swallows; with ``strings``, also
    in the programs its string constants hold (scope ``...<string>``)."""
    hits: list[Hit] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                [*scope, child.name]
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                else scope
            )
            guarded: list[ast.stmt] | None = None
            if isinstance(child, (ast.Try, getattr(ast, "TryStar", ast.Try))):
                if any(_names(h.type) & SWALLOWING and not _reraises(h) for h in child.handlers):
                    guarded = child.body
            elif isinstance(child, (ast.With, ast.AsyncWith)) and any(_suppressed(i) for i in child.items):
                guarded = child.body
            if guarded is not None:
                modules = _imports(guarded)
                if modules:
                    hits.append(Hit(path, ".".join(scope) or "<module>", tuple(sorted(set(modules))), child.lineno))
            embedded = _embedded_code(child) if strings else None
            if embedded is not None:  # code a test runs in a subprocess (``python -c``): checked as well
                for h in swallowed_imports(embedded, path, strings=False):
                    inside = [] if h.scope == "<module>" else [h.scope]
                    hits.append(
                        dataclasses.replace(h, scope=".".join([*scope, "<string>", *inside]), line=child.lineno)
                    )
            visit(child, inner)

    visit(ast.parse(source, filename=path), [])
    return hits


def _embedded_code(node: ast.AST) -> str | None:
    """A string constant that is a Python program with a ``try`` (``textwrap.dedent`` applied), else None."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and "try:" in node.value):
        return None
    code = textwrap.dedent(node.value)
    try:
        ast.parse(code)
    except SyntaxError:
        return None
    return code


def checked_files() -> list[Path]:
    """Every Python file under ``tests/`` and ``examples/*/tests/``."""
    return sorted({*ROOT.glob("tests/**/*.py"), *ROOT.glob("examples/*/tests/**/*.py")})


#: Files whose string constants are not checked as programs, and why.
STRINGS_NOT_CHECKED: dict[str, str] = {
    "tests/test_test_hygiene.py": "its string constants are the checker's own samples of swallowed imports",
}


def hits_in(files: list[Path]) -> list[Hit]:
    hits = []
    for path in files:
        name = path.relative_to(ROOT).as_posix()
        hits += swallowed_imports(path.read_text(encoding="utf-8"), name, strings=name not in STRINGS_NOT_CHECKED)
    return hits


def check(hits: list[Hit]) -> None:
    """AssertionError naming every hit not in :data:`ALLOWED`, and every entry of it that matches nothing."""
    unexplained = [h for h in hits if h.key not in ALLOWED]
    assert not unexplained, (
        "imports whose failure is swallowed (use pytest.importorskip, re-raise, or list in "
        f"ALLOWED with a reason): {unexplained}"
    )
    stale = set(ALLOWED) - {h.key for h in hits}
    assert not stale, f"ALLOWED entries that match nothing: {sorted(stale)}"


def test_no_test_swallows_an_import_error() -> None:
    check(hits_in(checked_files()))
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_walk_sees_the_example_plugins_tests() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in checked_files()}
    assert {"tests/conftest.py", "tests/test_test_hygiene.py", "tests/gpu/sglang_host.py"} <= names
    assert any(n.startswith("examples/") and "/tests/" in n for n in names)


FLAGGED: dict[str, tuple[str, tuple[str, ...]]] = {
    "bare": ("try:\n    import sglang\nexcept:\n    pass\n", ("sglang",)),
    "exception": (
        "def f():\n    try:\n        import deep_gemm\n    except Exception:\n        return None\n",
        ("deep_gemm",),
    ),
    "module-not-found": (
        "try:\n    import a.b as c\nexcept ModuleNotFoundError as e:\n    if 'x' in str(e):\n        raise\n",
        ("a.b",),
    ),
    "import-error-tuple": (
        "try:\n    from pkg import thing\nexcept (ValueError, ImportError):\n    thing = None\n",
        ("pkg",),
    ),
    "import-module": (
        "import importlib\nfor n in ('x',):\n    try:\n        importlib.import_module('p.' + n)\n"
        "    except ImportError:\n        continue\n",
        ("<dynamic>",),
    ),
    "dunder-import": ("try:\n    __import__('x')\nexcept BaseException:\n    pass\n", ("x",)),
    "in-class": (
        "class T:\n    def test(self):\n        try:\n            import x\n        except Exception:\n"
        "            pass\n",
        ("x",),
    ),
    "nested-block": ("try:\n    if True:\n        import x\nexcept ImportError:\n    x = None\n", ("x",)),
    # what tests/test_import_hygiene.py ran in a subprocess until issue 32: a swallow inside a string
    "embedded": (
        'import subprocess, sys, textwrap\ncode = textwrap.dedent(\n    """\n    import importlib\n'
        "    for name in ('triton',):\n        try:\n            importlib.import_module('p.' + name)\n"
        "        except ModuleNotFoundError as exc:\n            if 'p' not in str(exc):\n"
        '                raise\n    """\n)\nsubprocess.run([sys.executable, \'-c\', code])\n',
        ("<dynamic>",),
    ),
    "suppress": ("import contextlib\nwith contextlib.suppress(ImportError):\n    import x\n", ("x",)),
}

PASSING = {
    "reraise": "try:\n    import x\nexcept ImportError as e:\n    raise RuntimeError('x is required') from e\n",
    "bare-reraise": "try:\n    import x\nexcept Exception:\n    log()\n    raise\n",
    "narrow": "try:\n    import x\nexcept AttributeError:\n    pass\n",
    "no-import": "try:\n    f()\nexcept Exception:\n    pass\n",
    "importorskip": "import pytest\nx = pytest.importorskip('x')\n",
    "defined-only": "try:\n    def f():\n        import x\nexcept ImportError:\n    pass\n",
}


@pytest.mark.parametrize("name", sorted(FLAGGED))
def test_the_checker_flags_an_injected_swallow(name: str) -> None:
    source, modules = FLAGGED[name]
    hits = swallowed_imports(source, "sample.py")
    assert [h.modules for h in hits] == [modules]


@pytest.mark.parametrize("name", sorted(PASSING))
def test_the_checker_passes_what_is_not_a_swallow(name: str) -> None:
    assert swallowed_imports(PASSING[name], "sample.py") == []


def test_the_repository_check_fails_on_an_injected_file() -> None:
    """Injected fault: one more test file that swallows an import; the repository check fails on it, and
    an allow-list entry whose swallow was fixed fails as stale."""
    hits = hits_in(checked_files())
    injected = swallowed_imports(FLAGGED["exception"][0], "tests/test_injected.py")
    with pytest.raises(AssertionError, match=r"path='tests/test_injected\.py', scope='f', modules=\('deep_gemm',\)"):
        check(hits + injected)
    with pytest.raises(AssertionError, match="ALLOWED entries that match nothing"):
        check(hits[1:])
