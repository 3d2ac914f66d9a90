"""Where the descriptor a ``.start()`` or ``.wait()`` runs on was made, read from the
kernel's own source.

Why: a copy's equation carries the line of ``cp.start()``, but the mistake a message
is about (a wrong slot, a wrong semaphore, a wrong size) sits in the arguments of the
``make_async_copy(...)`` that built ``cp``, often lines earlier or in a list that a
``jax.tree.map(lambda c: c.start(), copies)`` starts. The jaxpr has no trace of that
line, so it is found in the source: the descriptor's name is followed back through
assignments, ``append`` into a list, ``for`` loops and lambdas over a list, in the
function that starts it and the functions around it. Only the standard library is
used; a file that cannot be read or parsed gives nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import linecache

__all__ = [
    "DESCRIPTOR_METHODS",
    "FUNCTION_NODES",
    "enclosing_function",
    "made_at",
    "own_nodes",
    "parameter_names",
    "parents_of",
    "parsed",
    "source_key",
    "start_call_at",
]

DESCRIPTOR_METHODS = frozenset({"start", "wait", "wait_recv", "wait_send"})
"""A copy descriptor's methods that start or wait it."""
FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_MAPPERS = frozenset({"map", "tree_map"})  # jax.tree.map, jax.tree_util.tree_map, map
_MAX_SITES = 3
_MAX_DEPTH = 6


@dataclasses.dataclass(frozen=True)
class _Parameter:
    """A descriptor that is a parameter of ``function``: made by its caller."""

    function: str
    position: int  # among the ``def``'s positional parameters
    name: str


def made_at(
    file_name: str, line: int, callers: tuple[tuple[str, int], ...] = ()
) -> tuple[tuple[str, int], ...]:
    """``(file, line)`` pairs (other than ``line`` itself) where the descriptor started
    or waited at ``line`` was made; empty when the call there builds its own
    descriptor or none is found. ``callers``: the lines that called the function
    holding ``line``, innermost first: a descriptor passed in as an argument is
    followed to where the caller made it."""
    try:
        files = (file_name, *(f for f, _ in callers))
        return _made_at(file_name, line, callers, tuple(source_key(f) for f in files))
    except (RecursionError, ValueError):  # a source too deep or odd to follow
        return ()


def source_key(file_name: str) -> int:
    """A key for caches of what a file's source says: its current text (an edited file,
    or one whose text the line cache holds, is read again)."""
    return hash(tuple(linecache.getlines(file_name)))


@functools.lru_cache(maxsize=4096)
def _made_at(
    file_name: str, line: int, callers: tuple[tuple[str, int], ...], keys: tuple[int, ...]
) -> tuple[tuple[str, int], ...]:
    indexed = _descriptor_calls(file_name, keys[0])
    if indexed is None:
        return ()
    tree, calls = indexed
    call = _descriptor_call(calls, line)
    if call is None:
        return ()
    assert isinstance(call.func, ast.Attribute)
    here = file_name
    sites = _sites_of(call.func.value, call, parents_of(tree), 0)
    for (caller_file, caller_line), caller_key in zip(callers, keys[1:]):
        params = [s for s in sites if isinstance(s, _Parameter)]
        if not params:
            break
        sites = [s for s in sites if not isinstance(s, _Parameter)]
        if sites:  # made here on some paths: those lines are enough
            break
        sites = _argument_sites(caller_file, caller_line, caller_key, params[0])
        here = caller_file
    found = {(here, s) for s in sites if isinstance(s, int)}
    found.discard((file_name, line))
    found.difference_update(callers)  # a descriptor made in the call itself: named already
    return tuple(sorted(found))[:_MAX_SITES]


def start_call_at(
    file_name: str, line: int, key: int
) -> tuple[ast.Call, dict[ast.AST, ast.AST]] | None:
    """The ``X.start()`` call at ``line`` of ``file_name`` (whose ``source_key`` is
    ``key``) and its tree's parents, or None when there is none (a helper that starts
    inside its own call, an unreadable file)."""
    indexed = _descriptor_calls(file_name, key)
    if indexed is None:
        return None
    tree, calls = indexed
    call = _descriptor_call(calls, line)
    if call is None or not isinstance(call.func, ast.Attribute) or call.func.attr != "start":
        return None
    return call, parents_of(tree)


def _argument_sites(
    file_name: str, line: int, key: int, param: _Parameter
) -> list[int | _Parameter]:
    """Where the argument passed for ``param`` at the call on ``line`` was made (``key``:
    the file's ``source_key``)."""
    tree = parsed(file_name, key)
    if tree is None:
        return []
    parents = parents_of(tree)
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and node.lineno <= line <= (node.end_lineno or node.lineno)
            and _callee(node) == param.function
        ):
            continue
        for keyword in node.keywords:
            if keyword.arg == param.name:
                return _sites_of(keyword.value, node, parents, 1)
        # a method called on an object binds ``self`` first
        position = param.position - (1 if isinstance(node.func, ast.Attribute) else 0)
        if 0 <= position < len(node.args) and not isinstance(node.args[position], ast.Starred):
            return _sites_of(node.args[position], node, parents, 1)
    return []


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


@functools.lru_cache(maxsize=256)
def parsed(file_name: str, key: int) -> ast.Module | None:
    """The module's syntax tree (``key``, from ``source_key``, ties the cache to the
    file's current text)."""
    lines = linecache.getlines(file_name)
    if not lines:
        return None
    try:
        return ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        return None


# parents of each node, for the few trees in use (a helper's file and its caller's)
_PARENTS: dict[int, tuple[ast.Module, dict[ast.AST, ast.AST]]] = {}


def parents_of(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    kept = _PARENTS.get(id(tree))
    if kept is not None and kept[0] is tree:
        return kept[1]
    if len(_PARENTS) >= 8:
        _PARENTS.clear()
    found = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    _PARENTS[id(tree)] = (tree, found)
    return found


@functools.lru_cache(maxsize=256)
def _descriptor_calls(file_name: str, key: int) -> tuple[ast.Module, tuple[ast.Call, ...]] | None:
    """The file's tree and every ``X.start()`` / ``X.wait*()`` call in it (one walk per
    file: every equation's location asks about its own line)."""
    tree = parsed(file_name, key)
    if tree is None:
        return None
    calls = tuple(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in DESCRIPTOR_METHODS
    )
    return tree, calls


def _descriptor_call(calls: tuple[ast.Call, ...], line: int) -> ast.Call | None:
    """The innermost of ``calls`` spanning ``line``."""
    best: ast.Call | None = None
    for node in calls:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            span = (node.end_lineno or node.lineno) - node.lineno
            if best is None or span < (best.end_lineno or best.lineno) - best.lineno:
                best = node
    return best


def _sites_of(
    expr: ast.expr, at: ast.AST, parents: dict[ast.AST, ast.AST], depth: int
) -> list[int | _Parameter]:
    """Lines that made the descriptor(s) ``expr`` (used at node ``at``) stands for."""
    if depth > _MAX_DEPTH:
        return []
    if isinstance(expr, ast.Call):
        return [expr.lineno]
    if isinstance(expr, ast.Subscript):  # copies[i]: whatever went into copies
        return _sites_of(expr.value, at, parents, depth + 1)
    if isinstance(expr, ast.Name):
        return _name_sites(expr.id, at, parents, depth)
    return []  # an attribute (self.copy) or anything else: made elsewhere


def _name_sites(
    name: str, at: ast.AST, parents: dict[ast.AST, ast.AST], depth: int
) -> list[int | _Parameter]:
    scope = enclosing_function(at, parents)
    before = getattr(at, "lineno", 0)
    while scope is not None:
        if isinstance(scope, ast.Lambda):
            if name in parameter_names(scope):
                source = _mapped_over(scope, parents)
                return [] if source is None else _sites_of(source, scope, parents, depth + 1)
        else:
            loop = _loop_over(name, scope, before)
            if loop is not None:
                return _sites_of(loop.iter, loop, parents, depth + 1)
            assigned = _last_assignment(name, scope, before)
            if assigned is not None:
                target, value = assigned
                if isinstance(value, (ast.List, ast.Tuple, ast.ListComp)) or _empty_call(value):
                    return _appended(name, scope, target, before, parents, depth)
                return _sites_of(value, target, parents, depth + 1)
            if name in parameter_names(scope):
                return [_parameter(scope, name)]  # made by the caller
        before = 1 << 30  # an outer function: anything it binds before the call
        scope = enclosing_function(scope, parents)
    return []


def _parameter(fn: ast.AST, name: str) -> _Parameter:
    args = getattr(fn, "args", None)
    positional = [*args.posonlyargs, *args.args] if isinstance(args, ast.arguments) else []
    names = [a.arg for a in positional]
    position = names.index(name) if name in names else -1
    return _Parameter(str(getattr(fn, "name", "")), position, name)


def enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    at = parents.get(node)
    while at is not None and not isinstance(at, FUNCTION_NODES):
        at = parents.get(at)
    return at


def parameter_names(fn: ast.AST) -> set[str]:
    args = getattr(fn, "args", None)
    if not isinstance(args, ast.arguments):
        return set()
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return {a.arg for a in every}


def own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of ``scope``'s body, not those of functions defined in it."""
    out: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        out.append(node)
        if not isinstance(node, FUNCTION_NODES):
            stack.extend(ast.iter_child_nodes(node))
    return out


def _mapped_over(fn: ast.Lambda, parents: dict[ast.AST, ast.AST]) -> ast.expr | None:
    """``X`` in ``jax.tree.map(lambda c: c.start(), X)`` (or ``map``)."""
    call = parents.get(fn)
    if not isinstance(call, ast.Call) or not call.args or call.args[0] is not fn:
        return None
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name in _MAPPERS and len(call.args) > 1:
        return call.args[1]
    return None


def _loop_over(name: str, scope: ast.AST, before: int) -> ast.For | None:
    for node in own_nodes(scope):
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and node.lineno <= before <= (node.end_lineno or node.lineno)
        ):
            return node
    return None


def _last_assignment(name: str, scope: ast.AST, before: int) -> tuple[ast.stmt, ast.expr] | None:
    best: tuple[ast.stmt, ast.expr] | None = None
    for node in own_nodes(scope):
        value: ast.expr | None = None
        if not isinstance(node, ast.stmt):
            continue
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = node.value
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            value = node.value
        if value is not None and node.lineno < before:
            if best is None or node.lineno > best[0].lineno:
                best = (node, value)
    return best


def _empty_call(value: ast.expr) -> bool:
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in ("list", "tuple")
        and not value.args
    )


def _appended(
    name: str,
    scope: ast.AST,
    start: ast.AST,
    before: int,
    parents: dict[ast.AST, ast.AST],
    depth: int,
) -> list[int | _Parameter]:
    """What ``name.append(x)`` / ``name.extend([...])`` / the literal put in the list."""
    literal = getattr(start, "value", None)
    found: list[int | _Parameter] = []
    if isinstance(literal, (ast.List, ast.Tuple)):
        for item in literal.elts:
            found += _sites_of(item, start, parents, depth + 1)
    elif isinstance(literal, ast.ListComp):
        found += _sites_of(literal.elt, literal, parents, depth + 1)
    for node in own_nodes(scope):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
            and node.args
            and getattr(start, "lineno", 0) <= node.lineno < before
        ):
            found += _sites_of(node.args[0], node, parents, depth + 1)
    return found
