"""The codebase's shape: imports form no circle and point down the layers (docs/architecture.md), every module
opens with a docstring, and a module over MAX_LINES lines says in its docstring why it is one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engine", "experiments", "storage")
MAX_LINES = 500
LONG_REASON = "Over 500 lines:"  # the docstring phrase that gives a long module's reason
# what each package may import of the project (the leaf imports nothing of it; storage knows no JAX)
ALLOWED = {"engine": {"engine"}, "storage": {"storage"}, "experiments": {"experiments", "engine", "storage"},
           "app": {"app", "experiments", "engine", "storage"}}


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(project modules, top-level outside modules) that a module imports, `from pkg import mod` resolved to mod."""
    tree, package = ast.parse(path.read_text()), name if path.name == "__init__.py" else name.rpartition(".")[0]
    project, outside = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            (project if t.split(".")[0] in PACKAGES else outside).add(t if t.split(".")[0] in PACKAGES else
                                                                     t.split(".")[0])
    return {t for t in project if t in known and t != name}, outside


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                on.discard(w)
                comp.append(w)
            on.discard(v)
            if comp:
                found.append(sorted([v, *comp]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


KNOWN = modules()
GRAPH = {name: imports_of(name, path, KNOWN) for name, path in KNOWN.items()}


def test_cycles_finds_a_circle_and_passes_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle():
    graph = {name: deps for name, (deps, _) in GRAPH.items()}
    assert cycles(graph) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_down_the_layers(package):
    upward = {name: sorted(d for d in deps if d.split(".")[0] not in ALLOWED[package])
              for name, (deps, _) in GRAPH.items() if name.split(".")[0] == package}
    assert not {k: v for k, v in upward.items() if v}
    if package == "storage":
        assert not {name for name, (_, outside) in GRAPH.items() if name.startswith("storage")
                    and outside & {"jax", "jaxlib", "numpy", "engine"}}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_every_module_opens_with_its_job_and_long_ones_say_why(name):
    path = KNOWN[name]
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path.relative_to(REPO)} has no docstring saying its job"
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES or LONG_REASON in doc, f"{path.relative_to(REPO)}: {n} lines and no '{LONG_REASON}' reason"
