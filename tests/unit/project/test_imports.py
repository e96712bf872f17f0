"""The packages' module graph: no import circle, counting imports inside functions and under
``TYPE_CHECKING`` too (a circle closed by a deferred import is still a circle); no module longer
than a sitting's read unless its docstring says why; and no line laid out by hand against the
formatter."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = {"client": "bertserve.client", "server": "bertserve.server"}
MAX_LINES = 400
GENERATED = "DO NOT EDIT!"  # the first lines of a module protoc generated
LONG_REASON = "Over 400 lines:"  # a module longer than MAX_LINES says why in its docstring, after this


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            candidates = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        # A package's own __init__ is not followed: importing a submodule runs it, but it is not the circle.
        targets.update(c for c in candidates if c in modules and c != name and not name.startswith(c + "."))
    return targets


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circle_in_the_packages() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        graph[name] = _imports(name, path, modules)
    assert _circles(graph) == []


def test_the_finder_sees_a_circle_closed_by_a_deferred_import(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import g\n")
    modules = {"p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"}
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _circles(graph) == [["p.a", "p.b"]]


def test_no_module_is_longer_than_a_sitting_unless_it_says_why() -> None:
    long = {}
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        if GENERATED in text[:200]:
            continue  # protoc's output (bertserve.client.tei), read as its .proto, not as Python
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if len(text.splitlines()) > MAX_LINES and LONG_REASON not in docstring:
            long[name] = len(text.splitlines())
    assert long == {}, f"longer than {MAX_LINES} lines, with no '{LONG_REASON}' paragraph in the docstring"


def test_no_line_is_laid_out_against_the_formatter() -> None:
    pragmas = ("# fmt: " + "skip", "# fmt: " + "off")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("server", "client", "tests", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(pragma in line for pragma in pragmas)
    ]
    assert found == []
