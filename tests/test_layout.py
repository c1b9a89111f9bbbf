"""Issue 19: the package's shape. No import circle among its modules (module-level imports, read with
``ast``: a function-level import is a deliberate lazy one and ``if TYPE_CHECKING:`` blocks never run), and
no module over the project's size guideline."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "sglang_moe_plugins"
MAX_LINES = 400


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(tree: ast.Module):
    """Import nodes executed when the module is imported: the body, and the branches of top-level
    ``try``/``if`` statements (not functions, classes' methods, or ``if TYPE_CHECKING:``)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [n for h in node.handlers for n in h.body]
        elif isinstance(node, ast.ClassDef):
            stack += [n for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.If, ast.Try))]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _top_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_graph_reader_sees_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    graph = _graph()
    assert "sglang_moe_plugins.errors" in graph["sglang_moe_plugins.config"]  # a known edge is read


def test_no_import_circle():
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_module_over_the_size_guideline():
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
