"""``scratch_shapes`` checked against the kernel's scratch parameters, in order.

jax hands the scratch to the kernel's last parameters in the order ``scratch_shapes``
lists it. Listed in another order, a semaphore lands in a parameter the body uses as a
buffer (or the reverse), and the first copy fails with a message about the copy
("Cannot signal on a non-()-shaped semaphore", "Data and semaphore arguments are
swapped"), not about ``scratch_shapes``. What a parameter expects comes from its
annotation (safedma's ``SemRef``, ``DataRef`` ...), checked before the body runs, or,
once the body has failed, from its name (``sem``, ``send_sems``, ``buf``).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from typing import cast

from safedma import _compat
from safedma._compat import SemaphoreKind
from safedma._errors import ScratchOrderError

__all__ = ["check_annotations", "check_names"]

_SEMAPHORE_TYPES = frozenset(
    {
        "SemRef",
        "SemArray",
        "SemArray2",
        "SemArray3",
        "SemArray4",
        "RegularSem",
        "RegularSemArray",
        "RegularSemArray2",
        "BarrierSem",
    }
)
_DATA_TYPES = frozenset({"DataRef"})
_SEMAPHORE_WORDS = frozenset({"sem", "sems", "semaphore", "semaphores"})
_DATA_WORDS = frozenset({"buf", "bufs", "buffer", "buffers", "scratch", "vmem", "smem", "acc"})

_SEMAPHORE, _DATA = "a semaphore", "a data buffer"


def _by_annotation(parameter: inspect.Parameter) -> str | None:
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        return None
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    found = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(text).split("[")[0])
    last = found[-1] if found else ""
    if last in _SEMAPHORE_TYPES:
        return _SEMAPHORE
    if last in _DATA_TYPES:
        return _DATA
    return None


def _by_name(parameter: inspect.Parameter) -> str | None:
    words = set(re.split(r"[_0-9]+", parameter.name.lower())) - {""}
    semaphore, data = bool(words & _SEMAPHORE_WORDS), bool(words & _DATA_WORDS)
    if semaphore == data:
        return None
    return _SEMAPHORE if semaphore else _DATA


def _given(ref: object) -> str | None:
    if not _compat.is_ref(ref):
        return None
    return _DATA if _compat.ref_kind(ref) is SemaphoreKind.DATA else _SEMAPHORE


def _describe(ref: object) -> str:
    kind = _compat.ref_kind(ref)
    shape = tuple(int(d) for d in getattr(ref, "shape", ()))
    if kind is not SemaphoreKind.DATA:
        return f"a {kind.value}" + (f" array {shape}" if shape else "")
    space = str(_compat.memory_space_of(ref) or "").rsplit(".", 1)[-1].upper()
    dtype = getattr(ref, "dtype", "")
    return f"a {space + ' ' if space else ''}{dtype}{list(shape)} buffer"


def _scratch_parameters(
    signature: inspect.Signature, args: Sequence[object], count: int
) -> list[tuple[inspect.Parameter, object, int]]:
    """(parameter, the ref it received, its index in scratch_shapes) for the trailing
    ``count`` positional arguments; none where the signature does not say."""
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if count <= 0 or len(positional) != len(args) or count > len(args):
        return []
    first = len(args) - count
    if not all(_compat.is_ref(a) for a in args[first:]):
        return []  # scratch given as pytrees: the count is of leaves, not parameters
    return [(positional[first + k], args[first + k], k) for k in range(count)]


def _check(
    kernel: str,
    body: object,
    signature: inspect.Signature,
    args: Sequence[object],
    count: int,
    expects: Callable[[inspect.Parameter], str | None],
    why: str,
) -> None:
    found = _scratch_parameters(signature, args, count)
    wrong: list[str] = []
    for parameter, ref, index in found:
        expected = expects(parameter)
        given = _given(ref)
        if expected is None or given is None or expected == given:
            continue
        wrong.append(
            f"parameter {parameter.name} ({why} {expected}) received scratch_shapes[{index}], "
            f"{_describe(ref)}"
        )
    if not wrong:
        return
    names = ", ".join(p.name for p, _, _ in found)
    order = ", ".join(f"{p.name}: {_describe(ref)}" for p, ref, _ in found)
    reordered = _reordered([(expects(p), _given(ref)) for p, ref, _ in found])
    fix = (
        f"scratch_shapes=[{', '.join(f'scratch_shapes[{k}]' for k in reordered)}]"
        if reordered is not None
        else "reorder scratch_shapes to match the parameters (or the parameters to match it)"
    )
    raise ScratchOrderError(
        f"kernel {kernel!r}{_defined_at(body)}: scratch_shapes is not in the order of the kernel's scratch "
        f"parameters ({names}): " + "; ".join(wrong) + ". jax hands scratch to the "
        "kernel's last parameters in the order scratch_shapes lists it. Fix: "
        f"{fix}. What each parameter received: {order}."
    )


def _defined_at(body: object) -> str:
    while isinstance(body, functools.partial):
        body = cast("functools.partial[object]", body).func
    code = getattr(body, "__code__", None)
    if code is None:
        return ""
    return f" (defined at {code.co_filename}:{code.co_firstlineno})"


def _reordered(kinds: Sequence[tuple[str | None, str | None]]) -> list[int] | None:
    """scratch_shapes' indices in the order the parameters expect (``kinds``: expected and
    given per parameter), when each expectation can be met by a distinct entry."""
    unused = list(range(len(kinds)))
    order: list[int] = []
    for expected, given in kinds:
        want = expected or given
        pick = next((k for k in unused if kinds[k][1] == want), None)
        if pick is None:
            return None
        unused.remove(pick)
        order.append(pick)
    return order


def check_annotations(
    kernel: str,
    body: object,
    signature: inspect.Signature | None,
    args: Sequence[object],
    count: int,
) -> None:
    """Before the body runs: a scratch parameter annotated as a semaphore that received a
    data buffer, or the reverse."""
    if signature is not None:
        _check(kernel, body, signature, args, count, _by_annotation, "annotated as")


def check_names(
    kernel: str,
    body: object,
    signature: inspect.Signature | None,
    args: Sequence[object],
    count: int,
    failure: Exception,
) -> None:
    """After the body raised ``failure``: a scratch parameter whose name says a semaphore
    that received a data buffer, or the reverse (the likely cause), raised from it."""
    if signature is None:
        return
    try:
        _check(kernel, body, signature, args, count, _by_name, "its name says")
    except ScratchOrderError as error:
        raise error from failure
