"""The function that should wait a copy, found by the name of the function that starts it.

Why: kernels pair a starting function with a waiting one by name: ``copy_in`` and
``wait_in`` on a ``pltpu.BufferedRef`` subclass, ``start`` and ``wait`` (or
``wait_and_get_loaded``) on a descriptor object, ``zero_out_start`` and
``zero_out_end``, ``start_send_scores`` and ``wait_send_scores`` side by side in one
kernel, ``_start_copy_kernel`` and ``_wait_copy_kernel`` for two ``pallas_call``\\ s.
When that counterpart waits for nothing, or waits only for copies into other buffers,
the missing wait belongs in it. A name is paired only when exactly one counterpart
exists beside it (in its class, its module, or the function around it), and a
counterpart that calls anything that may wait for the copy is never named. Only the
standard library is used.
"""

from __future__ import annotations

import ast
import re
from typing import cast

from safedma.testing._descriptor_sites import FUNCTION_NODES, enclosing_function, parameter_names

__all__ = ["counterpart_note", "destination_of", "is_filler", "may_wait", "names_a_wait"]

# A starting function's name holds one of these words; its counterpart has a waiting
# word in its place (``copy_in`` / ``wait_in``, ``zero_out_start`` / ``zero_out_end``).
_START_WORDS = ("copy", "start", "fetch", "load", "send", "issue")
_WAIT_WORDS = ("wait", "end", "finish", "drain", "done")
# A callee or keyword with one of these words in its name may wait.
_MAY_WAIT = re.compile(r"wait|(?:^|_)(?:drain|finish|sync|barrier)(?:_|$)", re.I)
_NAMED_WAIT = re.compile(r"wait|(?:^|_)drain(?:_|$)", re.I)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_COPY_MAKERS = frozenset({"make_async_copy", "make_async_remote_copy"})
_WAIT_METHODS = frozenset({"wait", "wait_recv", "wait_send"})
_MAX_DEPTH = 3


def counterpart_note(
    functions: list[ast.AST],
    parents: dict[ast.AST, ast.AST],
    base: str,
    started_into: str | None = None,
) -> str:
    """The note for a copy started in ``functions`` (innermost first: the function that
    starts it, those around it, its callers): the first of them whose counterpart
    waits for nothing, or waits only for copies into buffers other than
    ``started_into`` (the started copy's destination, :func:`destination_of`);
    ``""`` when the first counterpart found may wait for it, or none is found."""
    for index, function in enumerate(functions):
        if not isinstance(function, _DEFS):
            continue
        waiter = _counterpart(function, parents)
        if waiter is None:
            continue
        if _may_wait(waiter, parents, _MAX_DEPTH):
            others = _waited_into(waiter, parents)
            if not others or started_into is None or started_into in others:
                return ""  # the pair is there and may wait for this copy
            return _note(
                function, waiter, waiter, base, (others, started_into), parents.get(function)
            )
        # the starting function nested in this one may have its own counterpart nested
        # in the waiter: the nearer place
        for inner in reversed(functions[:index]):
            if isinstance(inner, _DEFS):
                nested = _named_in(waiter, _counterpart_names(inner.name))
                if nested is not None and not _may_wait(nested, parents, _MAX_DEPTH):
                    return _note(function, waiter, nested, base, owner=parents.get(function))
        return _note(function, waiter, waiter, base, owner=parents.get(function))
    return ""


def destination_of(descriptor: ast.expr) -> str | None:
    """The source text of the buffer a ``make_async_copy(src, dst, sem)`` call copies
    into, without its views (``self._buffer`` for ``self._buffer.at[i]``); None for
    anything else."""
    if not (isinstance(descriptor, ast.Call) and _callee(descriptor) in _COPY_MAKERS):
        return None
    dst = next((k.value for k in descriptor.keywords if k.arg == "dst_ref"), None)
    if dst is None and len(descriptor.args) > 1:
        dst = descriptor.args[1]
    while dst is not None:
        if isinstance(dst, ast.Subscript):
            dst = dst.value
        elif isinstance(dst, ast.Attribute) and dst.attr == "at":
            dst = dst.value
        elif isinstance(dst, ast.Call) and isinstance(dst.func, ast.Attribute):
            dst = dst.func.value  # a view: ``x.reshape(...)``, ``x.bitcast(...)``
        else:
            break
    return None if dst is None else ast.unparse(dst)


def _note(
    started: ast.AST,
    waiter: ast.AST,
    place: ast.AST,
    base: str,
    only: tuple[tuple[str, ...], str] | None = None,
    owner: ast.AST | None = None,
) -> str:
    """``only``: the buffers the waiter waits for and the one it leaves out; the
    missing wait then goes at its start, beside the others."""
    assert isinstance(started, _DEFS) and isinstance(waiter, _DEFS)
    assert isinstance(place, _DEFS)
    prefix = f"{owner.name}." if isinstance(owner, ast.ClassDef) else ""
    where = f"`{prefix}{waiter.name}` at {base}:{waiter.lineno}"
    body = [s for s in place.body if not is_filler(s)]
    if only is not None and body:
        ahead = place.body[: place.body.index(body[0])]
        head = _end(ahead[-1]) if ahead else body[0].lineno - 1
        spot = f"at its start, after {base}:{head}"
        others = " and ".join(f"`{b}`" for b in only[0])
        waits = f"waits only for copies into {others}, none into `{only[1]}`"
    else:
        waits = "waits for nothing"
        if body and isinstance(body[-1], ast.Return):
            spot = f"before its return at {base}:{body[-1].lineno}"
            if len(body) > 1:
                spot = f"after {base}:{_end(body[-2])}, " + spot
        elif body:
            spot = f"at its end, after {base}:{_end(body[-1])}"
        else:
            spot = f"in its body at {base}:{place.body[-1].lineno}"
    return (
        f"; it is started in `{prefix}{started.name}`, and its counterpart {where} "
        f"{waits}: the wait belongs in `{place.name}`, {spot}"
    )


def _counterpart_names(name: str) -> set[str]:
    tokens = name.split("_")
    found: set[str] = set()
    for index, token in enumerate(tokens):
        if token.lower() in _START_WORDS:
            for wait in _WAIT_WORDS:
                found.add("_".join([*tokens[:index], wait, *tokens[index + 1 :]]))
    found.discard(name)
    return found


def _counterpart(function: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    """The one function beside ``function`` (in its class, module or enclosing function)
    named as its waiting counterpart, or with more words after that name
    (``wait_and_get_loaded`` for ``start``)."""
    assert isinstance(function, _DEFS)
    names = _counterpart_names(function.name)
    if not names:
        return None
    scope = parents.get(function)
    exact = _named_in(scope, names)
    if exact is not None:
        return exact
    longer = [
        node
        for node in _defs_of(_body_of(scope))
        if isinstance(node, _DEFS) and any(node.name.startswith(n + "_") for n in names)
    ]
    return longer[0] if len(longer) == 1 else None


def _named_in(scope: ast.AST | None, names: set[str]) -> ast.AST | None:
    found = [
        node for node in _defs_of(_body_of(scope)) if isinstance(node, _DEFS) and node.name in names
    ]
    return found[0] if len(found) == 1 else None


def _body_of(scope: ast.AST | None) -> list[ast.stmt]:
    body: object = getattr(scope, "body", None)
    if not isinstance(body, list):
        return []
    return [s for s in cast("list[object]", body) if isinstance(s, ast.stmt)]


def _defs_of(body: list[ast.stmt]) -> list[ast.AST]:
    """The functions defined in ``body``, also under ``if`` / ``with`` / ``try``."""
    out: list[ast.AST] = []
    for statement in body:
        if isinstance(statement, _DEFS):
            out.append(statement)
        elif not isinstance(statement, (ast.ClassDef, *FUNCTION_NODES)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner: object = getattr(statement, field, None)
                if isinstance(inner, list):
                    items = cast("list[object]", inner)
                    out += _defs_of([s for s in items if isinstance(s, ast.stmt)])
    return out


def _waited_into(function: ast.AST, parents: dict[ast.AST, ast.AST]) -> tuple[str, ...]:
    """The buffers ``function``'s waits name, when every call in it that may wait is a
    wait on a descriptor made in place (``make_async_copy(b, b, sem).wait()``);
    ``()`` when anything else in it may wait."""
    found: dict[str, None] = {}
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _WAIT_METHODS:
            into = destination_of(func.value)
            if into is None:
                return ()
            found[into] = None
        elif _call_may_wait(node, function, parents, _MAX_DEPTH):
            return ()
    return tuple(found)


def may_wait(function: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``function`` calls anything that may wait (:func:`_call_may_wait`)."""
    return _may_wait(function, parents, _MAX_DEPTH)


def names_a_wait(name: str) -> bool:
    """Whether a function's name says it waits (``wait_in``, ``_wait_h0``, ``drain``;
    not a ``barrier`` or ``sync`` helper, which may only signal)."""
    return bool(_NAMED_WAIT.search(name))


def _may_wait(function: ast.AST, parents: dict[ast.AST, ast.AST], depth: int) -> bool:
    """Whether ``function`` may wait: a call in it may (:func:`_call_may_wait`)."""
    return any(
        isinstance(node, ast.Call) and _call_may_wait(node, function, parents, depth)
        for node in ast.walk(function)
    )


def _call_may_wait(
    node: ast.Call, function: ast.AST, parents: dict[ast.AST, ast.AST], depth: int
) -> bool:
    """Whether the call ``node`` in ``function`` may wait: its name says it may (a
    descriptor's ``wait``, ``semaphore_wait``, a draining helper), it has a
    ``wait=``-like keyword not literally false, it calls a function passed in or held
    in a variable (unknown), a method of ``self`` its class does not define
    (inherited: unknown), or a function beside it whose body may wait."""
    func = node.func
    if _MAY_WAIT.search(_callee(node)):
        return True
    if isinstance(func, ast.Name) and func.id in _parameters_around(function, parents):
        return True  # a function the caller handed in: unknown
    if any(_MAY_WAIT.search(k.arg or "") and _truthy(k.value) for k in node.keywords):
        return True  # ``fetch(..., wait=True)``
    called = _resolve(func, function, parents)
    if called is None and isinstance(func, ast.Name) and _assigned(func.id, function, parents):
        return True  # a function held in a variable: unknown
    if called is _UNKNOWN:
        return True
    if isinstance(called, _DEFS) and called is not function:
        return depth == 0 or _may_wait(called, parents, depth - 1)
    return False


_UNKNOWN = ast.Pass()  # a callee that may be anything


def _assigned(name: str, at: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``name`` is bound by an assignment in a scope around ``at`` (a function held in
    a variable, chosen at trace time), not by an import or a ``def``."""
    scope: ast.AST | None = at
    while scope is not None:
        if isinstance(scope, (*FUNCTION_NODES, ast.Module)):
            for node in ast.walk(scope):
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets
                ):
                    return True
        scope = parents.get(scope)
    return False


def _truthy(value: ast.expr) -> bool:
    """Anything but a literal false (``False``, ``None``, ``0``)."""
    return not (isinstance(value, ast.Constant) and not value.value)


def _resolve(func: ast.expr, at: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    """The ``def`` a call's function names (a function in scope, a method of ``self``),
    :data:`_UNKNOWN` for a method of ``self`` its class does not define, or None for
    anything else (a library function)."""
    on_self = isinstance(func, ast.Attribute) and (
        (isinstance(func.value, ast.Name) and func.value.id == "self")
        or (isinstance(func.value, ast.Call) and getattr(func.value.func, "id", "") == "super")
    )
    if on_self:
        assert isinstance(func, ast.Attribute)
        scope = enclosing_function(at, parents) if not isinstance(at, _DEFS) else at
        while scope is not None and not isinstance(parents.get(scope), ast.ClassDef):
            scope = enclosing_function(scope, parents)
        owner = parents.get(scope) if scope is not None else None
        if not isinstance(owner, ast.ClassDef):
            return _UNKNOWN
        found = _named_in(owner, {func.attr})
        return _UNKNOWN if found is None else found
    if not isinstance(func, ast.Name):
        return None
    around: ast.AST | None = at
    while around is not None:
        found = _named_in(around, {func.id})
        if found is not None:
            return found
        around = parents.get(around)
    return None


def _callee(call: ast.Call) -> str:
    func = call.func
    return str(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))


def _parameters_around(function: ast.AST, parents: dict[ast.AST, ast.AST]) -> set[str]:
    """The parameters of ``function`` and of the functions around it, but ``self``."""
    names: set[str] = set()
    scope: ast.AST | None = function
    while scope is not None:
        names |= parameter_names(scope)
        scope = enclosing_function(scope, parents)
    return names - {"self", "cls"}


def is_filler(statement: ast.stmt) -> bool:
    """``pass``, ``...``, a docstring, a ``del``: no place for a wait to follow."""
    if isinstance(statement, (ast.Pass, ast.Delete)):
        return True
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _end(statement: ast.stmt) -> int:
    return statement.end_lineno or statement.lineno
