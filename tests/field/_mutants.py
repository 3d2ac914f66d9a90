"""Mutants of real kernels, made at test time: one protocol mistake each, in the source.

Each operator finds its sites in the syntax tree of a kernel's module and changes one of
them; the mutated tree is compiled with the module's own file name, so every line keeps
its number and a checker's message can be scored on the line it names. The mutant
module is executed afresh (its functions are new objects, so no jit cache hides the
change) and handed to the kernel's driver, which builds the program from it.

The operators, each one mistake a kernel author makes:

=======================  ===========================================================
``drop_wait``            a DMA wait statement removed (``.wait()``, ``.wait_recv()``,
                         ``.wait_send()``)
``wait_send_only``       a ``.wait()`` of a copy made ``.wait_send()``: the receive side
                         is never waited
``drop_barrier``         a ``semaphore_signal`` or ``semaphore_wait`` statement removed
``off_by_one_slot``      a copy's or signal's semaphore index ``sems.at[i]`` made
                         ``sems.at[i + 1]``
``wrong_wait_slot``      the semaphore index of a wait-only descriptor (built to be
                         waited) moved to the next slot, ``(i + 1) % len``
``wrong_size_wait``      a wait-only descriptor made for half the rows it should wait
``no_modulo``            a neighbour's device id without its modulo (``(i + 1) % n`` and
                         ``lax.rem(i + 1, n)`` made ``i + 1``)
``unguarded_start``      a ``pl.when`` holding a ``.start()`` made unconditional
``prefetch_same_slot``   a ``next_slot``-style index of a started copy made the current
                         slot: the prefetch lands in the buffer being read
``shared_semaphore``     a second copy's semaphore replaced by the first copy's, in a
                         function that starts copies on two different semaphores
=======================  ===========================================================

The line to fix is the changed line; for a removed statement, the line it stood on.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import contextlib
import itertools
import linecache
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

WAITS = ("wait", "wait_recv", "wait_send")
COPY_MAKERS = ("make_async_copy", "make_async_remote_copy", "async_copy", "async_remote_copy")
SEM_ARG = {  # positional index of the semaphore arguments of each copy maker
    "make_async_copy": (2,),
    "async_copy": (2,),
    "make_async_remote_copy": (2, 3),
    "async_remote_copy": (2, 3),
}
SEM_KEYWORDS = ("sem", "send_sem", "recv_sem")
SIGNALS = ("semaphore_signal", "semaphore_wait")
REMOVALS = ("drop_wait", "drop_barrier")  # operators that delete a statement
SITES_PER_OPERATOR = 1
"""At most this many sites of each operator per module, spread over the module."""


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One change to one site: ``operator`` at ``line`` of ``path``.

    ``lines`` are the lines of the statement the change is in (first, last): a message
    that names any of them names the line to fix (a call written over several lines is
    reported at the line of whichever part jax records). A change inside a compound
    statement's header (a ``pl.when`` decorator) counts the header's own lines only.
    ``follows``: for a removed statement, the last line of the statement before it in
    its block (0 if it was the first): a message that says the missing statement
    belongs ``after FILE:follows`` names where it belongs."""

    operator: str
    path: str
    line: int
    site: int  # which site of this operator (its order in the module), for a stable id
    what: str  # the change, in words
    lines: tuple[int, int] = (0, 0)
    follows: int = 0

    @property
    def ident(self) -> str:
        return f"{self.operator}@{Path(self.path).name}:{self.line}"


# ====================================================================== site finding


def _call_name(node: ast.AST) -> str:
    """``pltpu.make_async_copy`` -> ``make_async_copy``; ``x.wait`` -> ``wait``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _is_statement_call(stmt: ast.stmt, names: tuple[str, ...]) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and _call_name(stmt.value) in names
    )


def _is_wait_statement(stmt: ast.stmt) -> bool:
    """A statement that waits a DMA: ``x.wait()`` (``_recv``, ``_send``), or a call to a
    helper that waits one (its name says ``wait``, or it is passed ``wait=True``), as
    real kernels wrap their waits in ``_wait_copy(...)`` or ``_fetch(..., wait=True)``."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    call = stmt.value
    name = _call_name(call)
    if name in WAITS:
        return True
    if name in SIGNALS:
        return False
    if "wait" in name.lower():
        return True
    return any(
        k.arg == "wait" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in call.keywords
    )


def _started_here(stmt: ast.AST) -> ast.Call | None:
    """In ``async_copy(...).wait()`` or ``desc.start().wait()``, the call that starts."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
            if _call_name(func.value) in ("async_copy", "async_remote_copy", "start"):
                return func.value
    return None


def _sem_args(call: ast.Call) -> Iterator[ast.expr]:
    """The semaphore argument expressions of a copy maker or a signal/wait call."""
    name = _call_name(call)
    positions = SEM_ARG.get(name, (0,) if name in SIGNALS else ())
    for position in positions:
        if position < len(call.args):
            yield call.args[position]
    for keyword in call.keywords:
        if keyword.arg in SEM_KEYWORDS or (name in SIGNALS and keyword.arg == "sem_or_view"):
            yield keyword.value


def _indexed(node: ast.expr) -> ast.Subscript | None:
    """``sems.at[i]`` or ``sems[i]``: the subscript, else None."""
    return node if isinstance(node, ast.Subscript) else None


def _wait_only(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> bool:
    """A copy maker whose descriptor is waited right away (``make_async_copy(...).wait()``)."""
    parent = parents.get(call)
    return isinstance(parent, ast.Attribute) and parent.attr in WAITS


def _is_mod_of_sum(node: ast.AST) -> ast.expr | None:
    """``(a + b) % n`` or ``lax.rem(a + b, n)`` (or ``-``): the ``a + b``, else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = node.left
    elif (
        isinstance(node, ast.Call)
        and _call_name(node) in ("rem", "mod", "remainder")
        and len(node.args) == 2
    ):
        left = node.args[0]
    else:
        return None
    if isinstance(left, ast.BinOp) and isinstance(left.op, (ast.Add, ast.Sub)):
        return left
    return None


def _functions_with_remote_traffic(tree: ast.Module) -> list[ast.AST]:
    """Function bodies that start remote copies or send signals (device ids live there)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = {_call_name(n) for n in ast.walk(node) if isinstance(n, ast.Call)}
            if names & {"make_async_remote_copy", "async_remote_copy", "semaphore_signal"}:
                found.append(node)
    return found


def _statement_lines(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> tuple[int, int]:
    """The lines of the simple statement holding ``node`` (``node``'s own lines where it
    is a statement, or sits in a compound statement's header)."""
    at = node
    while not isinstance(at, ast.stmt) and at in parents:
        at = parents[at]
    compound = (
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.If,
        ast.For,
        ast.While,
        ast.With,
    )
    if not isinstance(at, ast.stmt) or (isinstance(at, compound) and at is not node):
        at = node
    first = int(getattr(at, "lineno", 0))
    return first, int(getattr(at, "end_lineno", None) or first)


def _follows(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> int:
    """The last line of the statement before the one holding ``node`` in its block, or
    0 when it is the first."""
    at = node
    while not isinstance(at, ast.stmt) and at in parents:
        at = parents[at]
    block = parents.get(at)
    for _, value in ast.iter_fields(block) if block is not None else ():
        if isinstance(value, list) and any(v is at for v in value):
            index = next(i for i, v in enumerate(value) if v is at)
            before = value[index - 1] if index > 0 else None
            return int(getattr(before, "end_lineno", 0) or 0) if before is not None else 0
    return 0


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


SiteChange = Callable[[ast.AST], None]
"""Changes the (copied) tree in place at one site, found again by its position."""


def _sites(tree: ast.Module) -> dict[str, list[tuple[ast.AST, str]]]:
    """Every site of every operator: the node to change and the change in words."""
    parents = _parents(tree)
    sites: dict[str, list[tuple[ast.AST, str]]] = {op: [] for op in OPERATORS}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    remote_calls = {
        n
        for f in _functions_with_remote_traffic(tree)
        for n in ast.walk(f)
        if isinstance(n, ast.Call)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            if _is_wait_statement(node):
                sites["drop_wait"].append((node, f"`{ast.unparse(node)}` removed"))
            if _is_statement_call(node, SIGNALS):
                sites["drop_barrier"].append((node, f"`{ast.unparse(node)}` removed"))
    for call in calls:
        name = _call_name(call)
        if (
            name == "wait"
            and not call.args
            and isinstance(call.func, ast.Attribute)
            and call in remote_calls
        ):
            sites["wait_send_only"].append((call, "`.wait()` made `.wait_send()`"))
        if name in COPY_MAKERS or name == "semaphore_signal":
            for arg in _sem_args(call):
                if _indexed(arg) is not None:
                    sites["off_by_one_slot"].append((arg, f"`{ast.unparse(arg)}`: index + 1"))
        if name in ("make_async_copy", "make_async_remote_copy") and _wait_only(call, parents):
            for arg in _sem_args(call):
                if _indexed(arg) is not None:
                    sites["wrong_wait_slot"].append((arg, f"`{ast.unparse(arg)}`: the next slot"))
            if len(call.args) >= 2:
                sites["wrong_size_wait"].append(
                    (call, "the wait's descriptor covers half the rows")
                )
    for function in _functions_with_remote_traffic(tree):
        for node in ast.walk(function):
            if _is_mod_of_sum(node) is not None:
                sites["no_modulo"].append((node, f"`{ast.unparse(node)}` without its modulo"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef,)):
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and _call_name(decorator) == "when"
                    and decorator.args
                    and any(
                        _call_name(c) == "start" for c in ast.walk(node) if isinstance(c, ast.Call)
                    )
                ):
                    sites["unguarded_start"].append(
                        (
                            decorator,
                            f"`pl.when({ast.unparse(decorator.args[0])})` made `pl.when(True)`",
                        )
                    )
    for call in calls:
        if _call_name(call) in COPY_MAKERS:
            for name_node in ast.walk(call):
                if (
                    isinstance(name_node, ast.Name)
                    and name_node.id.startswith("next")
                    and "slot" in name_node.id
                ):
                    sites["prefetch_same_slot"].append(
                        (name_node, f"`{name_node.id}` made the current slot")
                    )
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        makers = [
            c
            for c in ast.walk(function)
            if isinstance(c, ast.Call) and _call_name(c) in COPY_MAKERS
        ]
        sems = [(c, next(_sem_args(c), None)) for c in makers]
        sems = [(c, s) for c, s in sems if s is not None]
        for (first, first_sem), (second, second_sem) in itertools.combinations(sems, 2):
            if ast.unparse(first_sem) != ast.unparse(second_sem) and second.lineno != first.lineno:
                sites["shared_semaphore"].append(
                    (
                        second_sem,
                        f"`{ast.unparse(second_sem)}` replaced by `{ast.unparse(first_sem)}` (line {first.lineno})",
                    )
                )
                break
    return sites


# ====================================================================== changes


def _replace_in_parent(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    parent, field, index = _slot_of(tree, old)
    if index is None:
        setattr(parent, field, new)
    else:
        getattr(parent, field)[index] = new


def _expr(text: str, at: ast.AST) -> ast.expr:
    node = ast.parse(text, mode="eval").body
    for child in ast.walk(node):
        ast.copy_location(child, at)
    return node


def _change(operator: str, tree: ast.Module, node: ast.AST) -> None:
    if operator == "drop_wait" and _started_here(node) is not None:
        # ``async_copy(...).wait()`` starts the copy too: keep the start, drop the wait
        started = _started_here(node)
        _replace_in_parent(tree, node, ast.copy_location(ast.Expr(started), node))
    elif operator in ("drop_wait", "drop_barrier"):
        _replace_in_parent(tree, node, ast.copy_location(ast.Pass(), node))
    elif operator == "wait_send_only":
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        node.func.attr = "wait_send"
    elif operator in ("off_by_one_slot", "wrong_wait_slot"):
        assert isinstance(node, ast.Subscript)
        index = node.slice
        parts = list(index.elts) if isinstance(index, ast.Tuple) else [index]
        base = ast.unparse(node.value)
        array = base[: -len(".at")] if base.endswith(".at") else base
        first = ast.unparse(parts[0])
        length = f"({array}.shape[0] if hasattr({array}, 'shape') else len({array}))"
        text = f"({first}) + 1" if operator == "off_by_one_slot" else f"(({first}) + 1) % {length}"
        parts[0] = _expr(text, parts[0])
        node.slice = (
            ast.copy_location(ast.Tuple(parts, ast.Load()), index) if len(parts) > 1 else parts[0]
        )
    elif operator == "wrong_size_wait":
        assert isinstance(node, ast.Call)
        for k in (0, 1):
            arg = node.args[k]
            text = f"({ast.unparse(arg)}).at[: max(1, ({ast.unparse(arg)}).shape[0] // 2)]"
            node.args[k] = _expr(text, arg)
    elif operator == "no_modulo":
        summed = _is_mod_of_sum(node)
        assert summed is not None
        _replace_in_parent(tree, node, summed)
    elif operator == "unguarded_start":
        assert isinstance(node, ast.Call)
        node.args[0] = _expr("True", node.args[0])
    elif operator == "prefetch_same_slot":
        assert isinstance(node, ast.Name)
        current = node.id[len("next") :].lstrip("_") or "slot"
        node.id = current
    elif operator == "shared_semaphore":
        assert isinstance(node, ast.expr)
        raise AssertionError("shared_semaphore is changed by _change_shared")
    else:  # pragma: no cover - a new operator without its change
        raise AssertionError(operator)


OPERATORS = (
    "drop_wait",
    "wait_send_only",
    "drop_barrier",
    "off_by_one_slot",
    "wrong_wait_slot",
    "wrong_size_wait",
    "no_modulo",
    "unguarded_start",
    "prefetch_same_slot",
    "shared_semaphore",
)


# ====================================================================== the face


def source_path(module_name: str) -> Path:
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module_name)
    return Path(spec.origin)


def _spread(items: list[tuple[ast.AST, str]], count: int) -> list[int]:
    """Indices of ``count`` items spread evenly over ``items`` (first and last included)."""
    if len(items) <= count:
        return list(range(len(items)))
    if count == 1:
        return [0]
    step = (len(items) - 1) / (count - 1)
    return sorted({round(k * step) for k in range(count)})


def _ordered(sites: list[tuple[ast.AST, str]]) -> list[tuple[ast.AST, str]]:
    """Sites in source order (a mutant names its site by its place in this order)."""
    return sorted(sites, key=lambda s: (getattr(s[0], "lineno", 0), getattr(s[0], "col_offset", 0)))


def mutants_of(module_name: str, per_operator: int = SITES_PER_OPERATOR) -> list[Mutant]:
    """The mutants of one module: up to ``per_operator`` sites of each operator."""
    path = source_path(module_name)
    tree = ast.parse(path.read_text(), str(path))
    found: list[Mutant] = []
    seen: set[str] = set()
    parents = _parents(tree)
    for operator, sites in _sites(tree).items():
        sites = _ordered(sites)
        for k in _spread(sites, per_operator):
            node, what = sites[k]
            line = int(getattr(node, "lineno", 0))
            lines = _statement_lines(node, parents)
            follows = _follows(node, parents) if operator in REMOVALS else 0
            mutant = Mutant(operator, str(path), line, k, what, lines, follows)
            if mutant.ident not in seen:
                seen.add(mutant.ident)
                found.append(mutant)
    return found


def mutated_tree(module_name: str, mutant: Mutant) -> ast.Module:
    """``module_name``'s syntax tree with ``mutant`` applied."""
    path = source_path(module_name)
    tree = ast.parse(path.read_text(), str(path))
    node, _ = _ordered(_sites(tree)[mutant.operator])[mutant.site]
    if mutant.operator == "shared_semaphore":
        _change_shared(tree, node, mutant.what)
    else:
        _change(mutant.operator, tree, node)
    return ast.fix_missing_locations(tree)


def mutated_source(module_name: str, mutant: Mutant) -> str:
    """``module_name``'s text with ``mutant`` applied, every other line where it was: the
    file a user with this mistake would have, for what reads the source (the checkers
    quote a kernel's lines and read its statements; a removed wait leaves a ``pass``)."""
    path = source_path(module_name)
    text = path.read_text()
    tree = ast.parse(text, str(path))
    node, _ = _ordered(_sites(tree)[mutant.operator])[mutant.site]
    assert isinstance(node, (ast.expr, ast.stmt))
    first, col, last, end_col = node.lineno, node.col_offset, node.end_lineno, node.end_col_offset
    assert last is not None and end_col is not None
    parent, field, index = _slot_of(tree, node)
    if mutant.operator == "shared_semaphore":
        _change_shared(tree, node, mutant.what)
    else:
        _change(mutant.operator, tree, node)
    now = getattr(parent, field)
    replacement = now[index] if index is not None else now
    new = ast.unparse(replacement)
    if isinstance(replacement, ast.expr):
        new = f"({new})"  # the same precedence wherever it stands
    lines = [line.encode() for line in text.splitlines(keepends=True)]
    head, tail = lines[first - 1][:col], lines[last - 1][end_col:]
    joined = head + new.replace("\n", " ").encode() + tail
    spliced = [*lines[: first - 1], joined, *([b"\n"] * (last - first)), *lines[last:]]
    return b"".join(spliced).decode()


def _slot_of(tree: ast.AST, node: ast.AST) -> tuple[ast.AST, str, int | None]:
    """Where ``node`` hangs in ``tree``: its parent, the field and the index in it."""
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is node:
                return parent, field, None
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is node:
                        return parent, field, i
    raise LookupError("site not found in its tree")


@contextlib.contextmanager
def source_shown(module_name: str, mutant: Mutant) -> Iterator[None]:
    """While inside, Python's line cache holds the mutant's text for the module's file
    (the checkers read a kernel's source through it), then the file's own again."""
    with text_shown(source_path(module_name), mutated_source(module_name, mutant)):
        yield


@contextlib.contextmanager
def text_shown(path: Path, text: str) -> Iterator[None]:
    """While inside, Python's line cache holds ``text`` for the file ``path``, then what
    it held before."""
    name = str(path)
    saved = linecache.cache.get(name)
    # mtime None: linecache.checkcache keeps the entry (as for a module's loader source)
    linecache.cache[name] = (len(text), None, text.splitlines(keepends=True), name)
    try:
        yield
    finally:
        if saved is None:
            linecache.cache.pop(name, None)
        else:
            linecache.cache[name] = saved


def mutated_module(module_name: str, mutant: Mutant) -> types.ModuleType:
    """A fresh module object executing ``module_name``'s source with ``mutant`` applied."""
    code = compile(mutated_tree(module_name, mutant), str(source_path(module_name)), "exec")
    return run_as_module(module_name, code)


def run_as_module(module_name: str, code: types.CodeType) -> types.ModuleType:
    """A new module object named ``module_name`` (its file, spec and package those of the
    installed module) that ran ``code``: the installed module is left as it was."""
    path = source_path(module_name)
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    module.__spec__ = importlib.util.find_spec(module_name)
    module.__package__ = module_name.rpartition(".")[0]
    # The module is registered under its name while it runs (dataclasses and typing look
    # a class's module up there), then the original is put back.
    original = sys.modules.get(module_name)
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)  # the package's own code, at most one site changed
    finally:
        if original is not None:
            sys.modules[module_name] = original
        else:
            sys.modules.pop(module_name, None)
    return module


def _change_shared(tree: ast.Module, node: ast.AST, what: str) -> None:
    replacement = what.split(" replaced by `", 1)[1].split("`", 1)[0]
    _replace_in_parent(tree, node, _expr(replacement, node))
