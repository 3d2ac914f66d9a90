"""safedma's modules import one another without cycles, and verify's passes stack in order.

The import graph is read from the source with ``ast``: every ``import`` and ``from ...
import`` statement of a module counts, wherever it stands: at module level, inside a
function (an import deferred to call time still ties the two modules together), and
under ``if TYPE_CHECKING:`` (a type-only import is still a dependency of the design,
and a cycle through one is what a function-level import or a string annotation
usually hides). ``from package import name`` depends on the submodule ``name`` when
there is one, else on the package's ``__init__``.

Not counted: the import of a module's parent packages that Python performs before the
module itself runs. Every submodule would otherwise depend on its package's
``__init__``, and any package whose ``__init__`` re-exports its modules (as
``safedma.testing._verify`` does) would be a cycle; what can go wrong there, a module
reading a name from an ``__init__`` that is still running, is an explicit ``from
package import name`` and is counted. Also not counted: ``importlib.import_module``
with a computed name (``safedma.__getattr__``'s lazy names), which ``ast`` cannot
resolve.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import safedma

ROOT = Path(safedma.__file__).resolve().parent

# verify's passes, bottom first: each imports only those before it (docs in
# safedma/testing/_verify/__init__.py). The first three are single modules.
VERIFY = "safedma.testing._verify"
PASSES = ("jax_internals", "errors", "naming", "model", "program", "walk", "lockstep", "face")

Edges = dict[str, dict[str, int]]  # module -> {imported module: line of the first import}


def _modules(root: Path, package: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((package, *parts))] = path
    return found


def _imports(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """(dotted name, line) of everything ``tree`` imports, a name imported ``from`` a
    module given as ``module.name``."""
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def import_graph(root: Path, package: str) -> Edges:
    """Each module of ``package`` (its source under ``root``) and the modules of the
    same package it imports."""
    modules = _modules(root, package)
    graph: Edges = {m: {} for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, line in _imports(tree, module, path.name == "__init__.py"):
            target = name
            while target and target not in modules:
                target = target.rpartition(".")[0]  # a name inside a module: the module
            if target and target != module:
                graph[module].setdefault(target, line)
    return graph


def cycles(graph: Edges) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module
    (or a module importing itself), as the modules in import order, first repeated."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_in(graph, set(c), c[0]) for c in components]


def _cycle_in(graph: Edges, component: set[str], start: str) -> list[str]:
    """A shortest cycle from ``start`` back to itself inside ``component`` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in component and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is on no cycle")  # pragma: no cover


def describe(graph: Edges, cycle: list[str], root: Path, package: str) -> str:
    modules = _modules(root, package)
    steps = [
        f"  {a} imports {b} ({modules[a].relative_to(root.parent)}:{graph[a][b]})"
        for a, b in zip(cycle, cycle[1:])
    ]
    return "import cycle " + " -> ".join(cycle) + ":\n" + "\n".join(steps)


GRAPH = import_graph(ROOT, "safedma")


def test_the_import_graph_sees_every_kind_of_import() -> None:
    """The reader finds module-level, function-level and TYPE_CHECKING imports, so the
    cycle test below cannot pass on a graph with edges missing."""
    api = GRAPH[f"{VERIFY}.face.api"]
    assert f"{VERIFY}.walk.engine" in api  # from X import name: the module X
    assert f"{VERIFY}.walk.ops" in api  # from package import module: the module
    assert "safedma._version" in GRAPH["safedma"]
    assert "safedma._copies" in GRAPH["safedma"]  # under TYPE_CHECKING
    assert "safedma.testing" in GRAPH["safedma.pytest_plugin"]  # inside a function
    total = sum(len(targets) for targets in GRAPH.values())
    assert total > 250, total


def test_safedma_has_no_import_cycle() -> None:
    found = cycles(GRAPH)
    assert not found, "\n".join(describe(GRAPH, c, ROOT, "safedma") for c in found)


def test_a_cycle_is_named_with_each_import_and_its_line(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n"
    )
    (pkg / "d.py").write_text("from pkg import a\n")  # on no cycle
    graph = import_graph(pkg, "pkg")
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    text = describe(graph, found[0], pkg, "pkg")
    assert "import cycle pkg.a -> pkg.sub.b -> pkg.c -> pkg.a" in text
    assert "pkg.sub.b imports pkg.c (pkg/sub/b.py:2)" in text
    assert "pkg.c imports pkg.a (pkg/c.py:3)" in text


def _pass_of(module: str) -> str | None:
    if not module.startswith(VERIFY + "."):
        return None
    return module[len(VERIFY) + 1 :].split(".")[0]


@pytest.mark.parametrize("layer", PASSES)
def test_each_verify_pass_imports_only_the_passes_below_it(layer: str) -> None:
    below = set(PASSES[: PASSES.index(layer)])
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _pass_of(module) == layer
        for target in targets
        if (other := _pass_of(target)) is not None and other != layer and other not in below
    )
    assert not wrong, "\n".join(wrong)


def test_every_verify_module_belongs_to_a_pass() -> None:
    stray = [m for m in GRAPH if m != VERIFY and _pass_of(m) not in (None, *PASSES)]
    assert not stray, stray
