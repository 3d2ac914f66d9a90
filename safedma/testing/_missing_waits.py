"""Where the missing wait of a copy belongs, read from the kernel's own source.

Why: a wait that was never written (or was deleted) leaves nothing in the traced
program, so a message can name the copy nobody waited and the access that raced with
it, but not the line to fix. Two shapes of source still tell where the wait goes:

* a start-or-wait helper, ``if wait: cp.wait() else: cp.start()``, whose branch for
  the other value of the flag does not wait the descriptor: the wait belongs in that
  branch;
* a descriptor that never leaves the function that starts it (not returned, stored,
  passed on or captured) and that nothing in the function waits: only that function
  can wait it, after its start;
* a copy started in a method of a class whose counterpart method (``copy_in`` and
  ``wait_in``, ``start`` and ``wait``: the starting method's name with ``wait`` for
  ``copy``, ``start``, ``fetch``, ``load`` or ``send``) waits for nothing: the wait
  belongs in that method, before its ``return`` or at its end. This is the shape of
  ``pltpu.BufferedRef`` subclasses and of descriptor objects with ``start``/``wait``.

Anything else (a descriptor kept in a list or an object, made again elsewhere to be
waited) says nothing, rather than guess. Only the standard library is used.
"""

from __future__ import annotations

import ast
import functools
import os
import re

from safedma.testing._descriptor_sites import (
    DESCRIPTOR_METHODS,
    FUNCTION_NODES,
    enclosing_function,
    own_nodes,
    parameter_names,
    source_key,
    start_call_at,
)

__all__ = ["where_the_wait_belongs"]

_WAITS = DESCRIPTOR_METHODS - {"start"}
# "file:line (function, ...)", as safedma's messages name a user's line
_LOCATION = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?= \(|$)")


def where_the_wait_belongs(where: str) -> str:
    """A note (starting ``"; "``) on where the wait of the copy started at ``where``
    belongs, or ``""`` when the source does not tell."""
    found = _LOCATION.match(where)
    if found is None:
        return ""
    try:
        return _note(found["file"], int(found["line"]), source_key(found["file"]))
    except (RecursionError, ValueError):  # a source too deep or odd to follow
        return ""


@functools.lru_cache(maxsize=1024)
def _note(file_name: str, line: int, key: int) -> str:
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
        or _local_note(call, statement, function, base)
        or _counterpart_note(function, parents, base)
    )


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


def _local_note(call: ast.Call, statement: ast.stmt, function: ast.AST, base: str) -> str:
    """The descriptor is a name bound in the starting function that never leaves it."""
    target = call.func.value if isinstance(call.func, ast.Attribute) else None
    if not isinstance(target, ast.Name):
        return ""
    name = target.id
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


# In a starting method's name, the word its waiting counterpart has ``wait`` for.
_START_WORDS = ("copy", "start", "fetch", "load", "send")


def _counterpart_note(function: ast.AST, parents: dict[ast.AST, ast.AST], base: str) -> str:
    """The copy is started in a method whose counterpart in the same class waits nothing."""
    method: ast.AST | None = function
    while method is not None and not isinstance(parents.get(method), ast.ClassDef):
        method = enclosing_function(method, parents)
    owner = parents.get(method) if method is not None else None
    if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ""
    if not isinstance(owner, ast.ClassDef):
        return ""
    names = {
        method.name.replace(word, "wait", 1) for word in _START_WORDS if word in method.name
    } - {method.name}
    counterparts = [
        node
        for node in owner.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names
    ]
    if len(counterparts) != 1:
        return ""
    waiter = counterparts[0]
    if _may_wait(waiter, owner, depth=2):
        return ""
    where = f"`{owner.name}.{waiter.name}` at {base}:{waiter.lineno}"
    started = f"; it is started in `{owner.name}.{method.name}`, and its counterpart {where}"
    body = [s for s in waiter.body if not _is_filler(s)]
    if body and isinstance(body[-1], ast.Return):
        place = f"before its return at {base}:{body[-1].lineno}"
        if len(body) > 1:
            place = f"after {base}:{_end(body[-2])}, " + place
    elif body:
        place = f"at its end, after {base}:{_end(body[-1])}"
    else:
        first = waiter.body[-1]
        place = f"in its body at {base}:{first.lineno}"
    return f"{started} waits for nothing: the wait belongs in `{waiter.name}`, {place}"


def _may_wait(function: ast.AST, owner: ast.ClassDef, depth: int) -> bool:
    """Whether ``function`` may wait: it calls anything whose name says wait (a
    descriptor's ``wait``, ``semaphore_wait``, a helper), or a method of ``self`` that
    ``owner`` does not define (inherited: unknown) or whose body may wait."""
    methods = {
        node.name: node
        for node in owner.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if "wait" in str(name):
            return True
        on_self = isinstance(func, ast.Attribute) and (
            (isinstance(func.value, ast.Name) and func.value.id == "self")
            or (isinstance(func.value, ast.Call) and getattr(func.value.func, "id", "") == "super")
        )
        if on_self:
            called = methods.get(str(name))
            if called is None or depth == 0 or _may_wait(called, owner, depth - 1):
                return True
    return False


def _is_filler(statement: ast.stmt) -> bool:
    """``pass``, ``...``, a docstring, a ``del``: no place for a wait to follow."""
    if isinstance(statement, (ast.Pass, ast.Delete)):
        return True
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _end(statement: ast.stmt) -> int:
    return statement.end_lineno or statement.lineno


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
