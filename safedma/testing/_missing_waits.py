"""Where the missing wait of a copy belongs, read from the kernel's own source.

Why: a wait that was never written (or was deleted) leaves nothing in the traced
program, so a message can name the copy nobody waited and the access that raced with
it, but not the line to fix. These shapes of source still tell where the wait goes:

* a start-or-wait helper, ``if wait: cp.wait() else: cp.start()``, whose branch for
  the other value of the flag does not wait the descriptor: the wait belongs in that
  branch;
* a descriptor that never leaves the function that starts it (not returned, stored,
  passed on or captured) and that nothing in the function waits (a wait in the other
  branch of an ``if`` around the start, on the name bound again there, does not
  count): only that function can wait it, after its start;
* descriptors kept in a list that never leaves the function (``for cp in copies:
  cp.start()``): the first loop over the list after the start waits them, or, when it
  does not, the wait belongs in its body;
* a copy started in a function whose counterpart beside it waits for nothing
  (``copy_in`` and ``wait_in``, ``zero_out_start`` and ``zero_out_end``, the
  starting function or one around it or one that calls it):
  :mod:`safedma.testing._wait_counterparts`.

Anything else (a descriptor stored in an object, made again elsewhere to be waited)
says nothing, rather than guess. Only the standard library is used.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Callable

from safedma.testing._descriptor_sites import (
    DESCRIPTOR_METHODS,
    FUNCTION_NODES,
    enclosing_function,
    own_nodes,
    parameter_names,
    parents_of,
    parsed,
    source_key,
    start_call_at,
)
from safedma.testing._wait_counterparts import (
    counterpart_note,
    destination_of,
    is_filler,
    may_wait,
    names_a_wait,
)

__all__ = ["waitless_wait_note", "where_the_wait_belongs"]

_WAITS = DESCRIPTOR_METHODS - {"start"}
# "file:line (function, ...)", as safedma's messages name a user's line
_LOCATION = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?= \(|$)")
# each "base.py:LINE in function" of a location's "called at ..." chain
_CALLER = re.compile(r"([\w.-]+\.py):(\d+) in ")


def where_the_wait_belongs(where: str) -> str:
    """A note (starting ``"; "``) on where the wait of the copy started at ``where``
    belongs, or ``""`` when the source does not tell. ``where`` is a location as
    safedma's messages write it: ``FILE:LINE (function, ..., called at BASE:LINE in
    function, BASE:LINE in function)``; the callers in the same file are read too."""
    return _read(where, _note)


def waitless_wait_note(access: str) -> str:
    """A note (starting ``"; "``) on a function named for waiting that waits nothing,
    defined before ``access`` in the function holding it or one around it or one that
    calls it (``@pl.when(is_new) def _wait_h0(): pass``): a wait deleted from it, or
    never written, is the likeliest missing wait of a copy ``access`` raced with;
    ``""`` when there is none, or more than one."""
    return _read(access, _waitless)


def _read(where: str, reader: Callable[[str, int, tuple[int, ...], int], str]) -> str:
    """``reader(file, line, callers' lines in that file, source key)`` for the location
    ``where``; ``""`` for a location that is not a file's line or a source too odd."""
    found = _LOCATION.match(where)
    if found is None:
        return ""
    file_name = found["file"]
    base = os.path.basename(file_name)
    callers = tuple(
        int(line)
        for name, line in _CALLER.findall(where.partition("called at ")[2])
        if name == base
    )
    try:
        return reader(file_name, int(found["line"]), callers, source_key(file_name))
    except (RecursionError, ValueError):  # a source too deep or odd to follow
        return ""


@functools.lru_cache(maxsize=1024)
def _waitless(file_name: str, line: int, callers: tuple[int, ...], key: int) -> str:
    tree = parsed(file_name, key)
    if tree is None:
        return ""
    base = os.path.basename(file_name)
    parents = parents_of(tree)
    lines = (line, *callers)
    holding = [
        d
        for d in ast.walk(tree)
        if isinstance(d, FUNCTION_NODES)
        and any(d.lineno <= n <= (d.end_lineno or 0) for n in lines)
    ]
    chain = sorted(holding, key=lambda d: d.lineno)
    candidates: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for function in chain:
        limit = max(n for n in lines if function.lineno <= n <= (function.end_lineno or 0))
        for node in ast.walk(function):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node is not function
                and (node.end_lineno or node.lineno) < limit
                and names_a_wait(node.name)
                and not may_wait(node, parents)
            ):
                candidates[id(node)] = node
    # a waitless function inside another (``_wait_for_buffer`` holding ``_do_wait``):
    # the innermost is the place
    inner = [
        c
        for c in candidates.values()
        if not any(
            o is not c and c.lineno <= o.lineno <= (c.end_lineno or 0) for o in candidates.values()
        )
    ]
    if len(inner) != 1:
        return ""
    waiter = inner[0]
    body = [s for s in waiter.body if not is_filler(s)]
    spot = (
        f"at its end, after {base}:{body[-1].end_lineno or body[-1].lineno}"
        if body
        else f"in its body at {base}:{waiter.body[-1].lineno}"
    )
    return (
        f"; `{waiter.name}` at {base}:{waiter.lineno}, named for waiting, waits for nothing: "
        f"if it stands for this copy's wait, the wait belongs there, {spot}"
    )


@functools.lru_cache(maxsize=1024)
def _note(file_name: str, line: int, callers: tuple[int, ...], key: int) -> str:
    located = start_call_at(file_name, line, key)
    if located is None:
        return ""
    call, parents = located
    assert isinstance(call.func, ast.Attribute)
    descriptor = ast.unparse(call.func.value)
    base = os.path.basename(file_name)
    statement = _statement_of(call, parents)
    function = enclosing_function(call, parents)
    if statement is None or function is None:
        return ""
    return (
        _flag_branch_note(statement, function, descriptor, parents, base)
        or _local_note(call, statement, function, parents, base)
        or _list_note(call, statement, function, parents, base)
        or counterpart_note(
            _functions_of(function, callers, parents),
            parents,
            base,
            destination_of(call.func.value),
        )
    )


def _functions_of(
    function: ast.AST, callers: tuple[int, ...], parents: dict[ast.AST, ast.AST]
) -> list[ast.AST]:
    """``function``, the functions around it, then those holding each caller's line."""
    out: list[ast.AST] = []
    at: ast.AST | None = function
    while at is not None:
        out.append(at)
        at = enclosing_function(at, parents)
    defs = [n for n in parents if isinstance(n, FUNCTION_NODES)]
    for line in callers:
        holding = [d for d in defs if d.lineno <= line <= (d.end_lineno or d.lineno)]
        if holding:
            innermost = max(holding, key=lambda d: d.lineno)
            if innermost not in out:
                out.append(innermost)
    return out


def _flag_branch_note(
    statement: ast.stmt,
    function: ast.AST,
    descriptor: str,
    parents: dict[ast.AST, ast.AST],
    base: str,
) -> str:
    """The start sits in one branch of ``if <flag>:`` on a parameter of its function,
    and the other branch does not wait the descriptor."""
    branch_of = parents.get(statement)
    if not isinstance(branch_of, ast.If):
        return ""
    flag, negated = _flag(branch_of.test)
    if flag is None or flag not in parameter_names(function):
        return ""
    in_body = any(s is statement for s in branch_of.body)
    other = branch_of.orelse if in_body else branch_of.body
    if any(_waits(node, descriptor) for s in other for node in ast.walk(s)):
        return ""
    value = "false" if in_body != negated else "true"
    if other:
        return (
            f"; it is started under `if {ast.unparse(branch_of.test)}:` at "
            f"{base}:{branch_of.lineno}, and the branch at {base}:{other[0].lineno} (when "
            f"`{flag}` is {value}) does not wait for it: the wait belongs there"
        )
    return (
        f"; it is started under `if {ast.unparse(branch_of.test)}:` at "
        f"{base}:{branch_of.lineno}, and nothing waits for it when `{flag}` is {value}: "
        f"the wait belongs in an `else:` branch there"
    )


def _local_note(
    call: ast.Call,
    statement: ast.stmt,
    function: ast.AST,
    parents: dict[ast.AST, ast.AST],
    base: str,
) -> str:
    """The descriptor is a name bound in the starting function that never leaves it.
    A wait in the other branch of an ``if`` around the start (a name bound again
    there) never runs with it."""
    name = _started_name(call)
    if name is None:
        return ""
    if name in parameter_names(function) or not _bound_here(name, function):
        return ""
    own = own_nodes(function)
    methods = {
        id(node.func.value): node.func.attr
        for node in own
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in DESCRIPTOR_METHODS
    }
    for node in own:
        if isinstance(node, FUNCTION_NODES) and _mentions(node, name):
            return ""  # captured by a nested function or lambda: it may wait it
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            if _rebound_in_other_branch(node, statement, parents):
                continue
            method = methods.get(id(node))
            if method is None:
                return ""  # returned, stored, passed on: it may be waited elsewhere
            if method in _WAITS:
                return ""  # waited here (on another path): not a missing wait
    end = statement.end_lineno or statement.lineno
    where = getattr(function, "name", "the function")
    return (
        f"; its descriptor `{name}` never leaves {where} and nothing there waits it: the "
        f"wait belongs in {where}, after {base}:{end}"
    )


def _list_note(
    call: ast.Call,
    statement: ast.stmt,
    function: ast.AST,
    parents: dict[ast.AST, ast.AST],
    base: str,
) -> str:
    """The descriptor is kept in a list bound in the starting function (``for cp in
    copies: cp.start()``, or ``copies.append(cp)``) that never leaves it: the first loop
    over the list after the start is where its items are waited."""
    name = _started_name(call)
    if name is None:
        return ""
    listed = _list_holding(name, statement, function, parents)
    if listed is None or not _stays_local(listed, function):
        return ""
    end = statement.end_lineno or statement.lineno
    outer = _outermost_loop(statement, function, parents)
    after = (outer.end_lineno or outer.lineno) if outer is not None else end
    loops = sorted(
        (
            node
            for node in ast.walk(function)
            if isinstance(node, ast.For)
            and isinstance(node.iter, ast.Name)
            and node.iter.id == listed
            and node.lineno > after
        ),
        key=lambda node: node.lineno,
    )
    where = getattr(function, "name", "the function")
    if not loops:
        return (
            f"; it is kept in `{listed}`, which never leaves {where}, and nothing there "
            f"waits the copies in it: wait them (`for cp in {listed}: cp.wait()`) after "
            f"{base}:{after}, before their buffers are used"
        )
    loop = loops[0]
    item = loop.target.id if isinstance(loop.target, ast.Name) else None
    if item is None or any(_mentions(s, item) for s in loop.body):
        return ""  # the loop uses its items: it may wait them
    return (
        f"; it is kept in `{listed}`, which never leaves {where}, and the loop over "
        f"`{listed}` at {base}:{loop.lineno} does not wait its copies: the wait belongs in "
        f"its body at {base}:{loop.body[0].lineno}"
    )


def _started_name(call: ast.Call) -> str | None:
    """``cp`` in ``cp.start()``; None when the started descriptor is no plain name."""
    target = call.func.value if isinstance(call.func, ast.Attribute) else None
    return target.id if isinstance(target, ast.Name) else None


def _list_holding(
    name: str, statement: ast.stmt, function: ast.AST, parents: dict[ast.AST, ast.AST]
) -> str | None:
    """The list ``name`` was taken from (``for name in L``) or put in (``L.append(name)``)
    in ``function``'s own body, or None."""
    at: ast.AST | None = parents.get(statement)
    while at is not None and at is not function:
        if (
            isinstance(at, ast.For)
            and isinstance(at.target, ast.Name)
            and at.target.id == name
            and isinstance(at.iter, ast.Name)
        ):
            return at.iter.id
        at = parents.get(at)
    for node in own_nodes(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and isinstance(node.func.value, ast.Name)
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == name
            and _same_block(node, statement, parents)
        ):
            return node.func.value.id
    return None


def _same_block(call: ast.AST, statement: ast.stmt, parents: dict[ast.AST, ast.AST]) -> bool:
    """The statement holding ``call`` sits in the block that holds ``statement``."""
    holder = parents.get(call)
    return holder is not None and parents.get(holder) is parents.get(statement)


# A list's uses that keep its items in the function: iterating it, filling it, its size.
_LIST_METHODS = frozenset({"append", "extend", "clear"})


def _stays_local(listed: str, function: ast.AST) -> bool:
    """``listed`` is bound in ``function`` to a new list, and every use of it iterates,
    fills or measures it (nothing returns, stores or passes it on)."""
    if listed in parameter_names(function) or not _bound_here(listed, function):
        return False
    uses = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and node.id == listed and isinstance(node.ctx, ast.Load)
    ]
    every = {id(node): node for node in ast.walk(function)}
    parent_of = {id(c): p for p in every.values() for c in ast.iter_child_nodes(p)}
    for use in uses:
        up = parent_of.get(id(use))
        if isinstance(up, ast.For) and up.iter is use:
            continue
        if isinstance(up, ast.Attribute) and up.attr in _LIST_METHODS:
            continue
        if isinstance(up, ast.Call) and getattr(up.func, "id", "") == "len":
            continue
        return False
    return True


def _outermost_loop(
    statement: ast.stmt, function: ast.AST, parents: dict[ast.AST, ast.AST]
) -> ast.stmt | None:
    """The outermost ``for`` / ``while`` around ``statement`` inside ``function``."""
    found: ast.stmt | None = None
    at: ast.AST | None = parents.get(statement)
    while at is not None and at is not function:
        if isinstance(at, (ast.For, ast.While)):
            found = at
        at = parents.get(at)
    return found


def _rebound_in_other_branch(
    use: ast.Name, start: ast.stmt, parents: dict[ast.AST, ast.AST]
) -> bool:
    """``use`` sits in the other branch of an ``if`` around ``start`` and its name is
    bound again in that branch (``for cp in copies: cp.wait()``): another descriptor,
    never the one started in this call."""
    branch_of: dict[int, bool] = {}
    for child, at in _ancestry(start, parents):
        if isinstance(at, ast.If) and child is not at.test:
            branch_of.setdefault(id(at), any(s is child for s in at.body))
    for child, at in _ancestry(use, parents):
        if isinstance(at, ast.If) and child is not at.test and id(at) in branch_of:
            in_body = any(s is child for s in at.body)
            if in_body == branch_of[id(at)]:
                return False
            branch = at.body if in_body else at.orelse
            return any(_binds(node, use.id) for s in branch for node in ast.walk(s))
    return False


def _ancestry(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[tuple[ast.AST, ast.AST]]:
    """``(child, parent)`` pairs from ``node`` up to the module."""
    out: list[tuple[ast.AST, ast.AST]] = []
    at = parents.get(node)
    while at is not None:
        out.append((node, at))
        node, at = at, parents.get(at)
    return out


def _binds(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.For):
        return any(isinstance(t, ast.Name) and t.id == name for t in ast.walk(node.target))
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    return isinstance(node, ast.NamedExpr) and node.target.id == name


def _flag(test: ast.expr) -> tuple[str | None, bool]:
    if isinstance(test, ast.Name):
        return test.id, False
    if (
        isinstance(test, ast.UnaryOp)
        and isinstance(test.op, ast.Not)
        and isinstance(test.operand, ast.Name)
    ):
        return test.operand.id, True
    return None, False


def _waits(node: ast.AST | None, descriptor: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _WAITS
        and ast.unparse(node.func.value) == descriptor
    )


def _statement_of(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.stmt | None:
    at: ast.AST | None = node
    while at is not None and not isinstance(at, ast.stmt):
        at = parents.get(at)
    return at if isinstance(at, ast.stmt) else None


def _bound_here(name: str, function: ast.AST) -> bool:
    """``name`` is bound by a plain assignment in ``function``'s own body."""
    for node in own_nodes(function):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == name and node.value is not None:
                return True
    return False


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))
