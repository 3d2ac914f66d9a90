"""Kernel parameter names for simulate's messages, found as verify finds them.

Interpret mode knows a semaphore by a number (each kernel call numbers its semaphore
operands in order from ``_interpret_probes.FIRST_SEMAPHORE_ID``) and a buffer by a
key; neither says which parameter of the user's kernel it is. The traced program
does: each ``pallas_call``'s kernel jaxpr has its parameters (named by verify's rule,
``_verify/naming.py``), and each equation of its body a user line and the refs it
touches, followed back to the parameter they view. A message's events (a copy
started at a line, a wait at a line, a race at a line) pick the kernel that has
those lines, and the number or the access names the parameter: ``sems[1]``, ``o_ref``.

Where the program leaves a doubt (two kernels with those lines and different
parameters, a semaphore a ``run_scoped`` allocated, a ref no parameter stands for),
no name is given and the message keeps interpret mode's number: a wrong name would
send the reader to the wrong line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterable, Iterator
from typing import Any

from safedma import _raw_waits
from safedma.testing import _interpret_probes as probes
from safedma.testing._errors import Race
from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.naming import element_name, parameter_names

__all__ = ["KernelNames"]

# what each ref operand of an access is, by primitive: (role, read, write)
_DEVICE_ACCESS = {
    "get": (True, False),
    "load": (True, False),
    "swap": (False, True),
    "masked_swap": (False, True),
    "addupdate": (True, True),
}


@dataclasses.dataclass(frozen=True)
class _Access:
    """A ref a kernel equation touches, as the parameter it views."""

    name: str
    read: bool
    write: bool
    by_copy: bool  # a DMA's read of its source or write of its destination


@dataclasses.dataclass
class _Kernel:
    """One ``pallas_call`` of the program: its semaphores in interpret mode's order, and
    the parameters each of its lines touches."""

    semaphores: list[tuple[str, tuple[int, ...]]]
    lines: dict[str, list[_Access]] = dataclasses.field(default_factory=dict[str, list[_Access]])

    def semaphore(self, semaphore_id: int) -> str | None:
        offset = semaphore_id - probes.FIRST_SEMAPHORE_ID
        for name, shape in self.semaphores:
            size = 1
            for d in shape:
                size *= d
            if 0 <= offset < size:
                return element_name(name, shape, offset)
            offset -= size
        return None  # past the operands: allocated while the kernel ran (run_scoped)


class KernelNames:
    """The names of one simulated program's kernel parameters, read on first use (the
    equations' user lines need simulate's ``enclosing_lines`` context, open while a
    run is diagnosed)."""

    def __init__(self, jaxpr: Any) -> None:
        self._jaxpr = jaxpr

    @functools.cached_property
    def _kernels(self) -> list[_Kernel]:
        kernels: list[_Kernel] = []
        for eqn in _jax.all_eqns(self._jaxpr):
            if eqn.primitive.name == "pallas_call":
                with contextlib.suppress(Exception):  # only for messages
                    kernels.append(_kernel(eqn))
        return kernels

    def _candidates(self, lines: Iterable[str | None]) -> list[_Kernel]:
        """The kernels with any of ``lines``; every kernel when none has any."""
        wanted = {line for line in lines if line}
        found = [k for k in self._kernels if wanted & k.lines.keys()]
        return found or self._kernels

    def semaphore(
        self, semaphore_id: int, lines: Iterable[str | None], barrier: bool
    ) -> str | None:
        """The name of interpret mode's semaphore ``semaphore_id`` of a kernel call whose
        events happened at ``lines``; None when the program does not say."""
        if barrier:
            # interpret mode numbers the barrier semaphore by its collective_id
            return f"(collective_id={semaphore_id})"
        names = {k.semaphore(semaphore_id) for k in self._candidates(lines)}
        return _one(names)

    def buffer(self, race: Race) -> str | None:
        """The parameter whose memory ``race`` is about; None when the program does not say."""
        names: set[str | None] = set()
        by_copy = race.accessor.startswith("DMA")
        if race.location:
            names |= self._touching(race.location, race.access, by_copy)
        if not names and race.other_location:
            other = _second_access(race.report)
            names |= self._touching(race.other_location, other, None)
        return _one(names)

    def _touching(self, line: str, access: str | None, by_copy: bool | None) -> set[str | None]:
        found: set[str | None] = set()
        for kernel in self._kernels:
            for a in kernel.lines.get(line, ()):
                if by_copy is not None and a.by_copy != by_copy:
                    continue
                if access == "read" and not a.read or access == "write" and not a.write:
                    continue
                found.add(a.name)
        return found


def _one(names: set[str | None]) -> str | None:
    return next(iter(names)) if len(names) == 1 else None


def _second_access(report: str) -> str | None:
    """Whether the earlier access of interpret mode's race report read or wrote."""
    accesses = [
        line.strip()
        for line in report.splitlines()
        if line.strip().startswith(("read of", "write of"))
    ]
    return accesses[1].split(" ", 1)[0] if len(accesses) > 1 else None


def _kernel(eqn: Any) -> _Kernel:
    params = _jax.kernel_params(eqn)
    body, _ = _jax.jaxpr_of(params["jaxpr"])
    avals = [v.aval for v in body.invars]
    n_index, n_in, n_out = (
        int(params["num_index_operands"]),
        int(params["num_inputs"]),
        int(params["num_outputs"]),
    )
    roles = (
        ("scalar-prefetch operand", n_index),
        ("input", n_in),
        ("output", n_out),
        ("scratch", int(params["num_scratch"])),
    )
    names, _ = parameter_names(_jax.kernel_param_names(body), avals, roles)
    # jax's interpreter gives semaphores, in operand order, to each operand after the
    # scalar-prefetch ones whose memory space is SEMAPHORE (a block operand's space is
    # its block's)
    semaphores: list[tuple[str, tuple[int, ...]]] = []
    blocks = params["blocks"]
    for k in range(n_index, len(avals)):
        j = k - n_index
        space = blocks[j]["space"] if j < n_in + n_out else _jax.memory_space(avals[k])
        if space == "SEMAPHORE":
            semaphores.append((names[k], _jax.aval_shape(avals[k])))
    kernel = _Kernel(semaphores)
    roots: dict[Any, str] = {v: names[k] for k, v in enumerate(body.invars)}
    _read_lines(body, roots, kernel)
    return kernel


def _read_lines(jaxpr: Any, roots: dict[Any, str], kernel: _Kernel) -> None:
    """Record, per user line, the parameters the equations of ``jaxpr`` touch (``roots``:
    each variable that views a parameter, by the parameter's name)."""
    for eqn in jaxpr.eqns:
        line = probes.user_location(eqn.source_info)
        if line:
            accesses = list(_accesses(eqn, roots))
            if accesses:
                kernel.lines.setdefault(line, []).extend(accesses)
        blocks = (
            _raw_waits.block_inputs(eqn) if any(True for _ in _jax.sub_jaxprs(eqn.params)) else None
        )
        for sub, positions in blocks or ():
            inner: dict[Any, str] = {}
            for i, var in enumerate([*sub.constvars, *sub.invars]):
                k = positions[i] if i < len(positions) else -1
                outer = eqn.invars[k] if 0 <= k < len(eqn.invars) else None
                if outer is not None and not _jax.is_literal(outer) and outer in roots:
                    inner[var] = roots[outer]
            _read_lines(sub, inner, kernel)


def _accesses(eqn: Any, roots: dict[Any, str]) -> Iterator[_Access]:
    name = eqn.primitive.name
    if name in _DEVICE_ACCESS:
        read, write = _DEVICE_ACCESS[name]
        root = _root(eqn.invars[0], roots)
        if root is not None:
            yield _Access(root, read, write, by_copy=False)
    elif name == "dma_start":
        src, dst, _, _, _ = _jax.unflatten(eqn.params["tree"], eqn.invars)
        for ref, read in ((src, True), (dst, False)):
            root = _root(ref, roots)
            if root is not None:
                yield _Access(root, read, not read, by_copy=True)


def _root(ref: Any, roots: dict[Any, str]) -> str | None:
    base, _ = _jax.split_transformed(ref)
    if _jax.is_literal(base) or isinstance(base, (tuple, list)):
        return None
    try:
        return roots.get(base)
    except TypeError:  # an unhashable operand
        return None
