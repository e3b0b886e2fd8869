"""The house's plan, held against the code: the import contracts in pyproject.toml
([tool.importlinter]: surfaces over services over reads over the domain, REST and MCP and the
dashboard independent, a pure client and pure framework mappings), no import cycle between any
two modules, and rooms and functions of a size a reader takes in. docs/architecture.md describes
the same plan in words."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memory_app", "agentmemory_site")
MODULE_MAX_LINES = 620
FUNCTION_MAX_LINES = 80


def _sources():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def test_the_import_contracts_hold():
    sys.path.insert(0, str(ROOT))
    try:
        assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
    finally:
        sys.path.remove(str(ROOT))


def _cycles(graph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return groups


def test_no_two_modules_import_each_other_even_through_others():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert _cycles(graph) == []


def test_modules_stay_under_the_size_a_reader_takes_in():
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in _sources()}
    assert {name: n for name, n in sizes.items() if n > MODULE_MAX_LINES} == {}


def test_long_functions_say_why_they_stay_whole():
    """A function over the limit carries a comment right above its `def` saying why."""
    unexplained = []
    for path in _sources():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.end_lineno - node.lineno + 1 <= FUNCTION_MAX_LINES:
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if not lines[first - 2].lstrip().startswith("#"):
                unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert unexplained == []


def test_docs_architecture_names_every_room():
    """Every module and package of memory_app has its paragraph in docs/architecture.md."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    rooms = {
        path.stem if path.is_file() else path.name
        for path in (ROOT / "memory_app").iterdir()
        if (path.suffix == ".py" or (path / "__init__.py").exists()) and path.stem != "__init__"
    }
    assert sorted(room for room in rooms if f"`{room}`" not in page) == []
