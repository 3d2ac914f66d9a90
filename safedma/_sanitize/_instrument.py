"""Re-emit a kernel body from its jaxpr with the sanitizer's checks around every DMA and wait.

The body is traced to a jaxpr first (so raw ``pltpu`` copies, remote copies'
send and receive waits and ``pl.semaphore_wait`` are seen exactly as safedma's
own: the program is the truth), then evaluated equation by equation in the
kernel's own trace, each primitive bound again at its user's line, with:

* before each ``dma_wait`` and ``semaphore_wait``: a bounded spin on the
  semaphore's count (``pl.semaphore_read``) until it holds what the wait
  takes; the wait runs only if it got there, else the hang is recorded and
  the wait skipped, so the kernel returns instead of hanging;
* before each ``dma_start`` (and each semaphore operation): bounds checks of
  the copy windows and semaphore indices that are not static, and of the
  target device id of a remote copy or signal (:mod:`._device_ids`); a copy or
  operation out of bounds is recorded and not issued;
* at the end of each ``run_scoped`` body and at the kernel's last grid step:
  every semaphore allocated there must be back to zero; one that is not is
  recorded, then drained (a DMA one with DMA waits, :mod:`._drain`), since the
  chip halts a kernel that exits with a semaphore not at zero.

``cond`` / ``while`` / ``scan`` / ``run_scoped`` bodies are instrumented in
place (rebuilt with ``lax.switch`` / ``lax.while_loop`` / ``lax.scan`` /
``run_scoped``); calls (``pjit``, custom derivatives) are inlined when they
hold DMA or semaphore code. Only the first mistake is recorded (:mod:`._flags`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from safedma._sanitize import _jax
from safedma._sanitize._device_ids import coordinates
from safedma._sanitize._drain import drain_dma, settle
from safedma._sanitize._errors import SanitizerUnsupportedError
from safedma._sanitize._flags import (
    DEVICE_ID,
    LEFTOVER,
    MAX_VALUES,
    OUT_OF_BOUNDS,
    SEMAPHORE_INDEX,
    DEADLOCK,
    Recorder,
)
from safedma._sanitize._options import SanitizeOptions
from safedma._sanitize._sites import Site, register
from safedma._sanitize._units import Backend, amount, exact_on_chip

__all__ = ["Instrumenter", "KernelPlan", "NamedRef"]

# Primitives whose presence in a block makes the block worth instrumenting.
_SENSITIVE = frozenset(
    {
        "dma_start",
        "dma_wait",
        "semaphore_wait",
        "semaphore_signal",
        "semaphore_read",
        "run_scoped",
    }
)
# Call-like primitives: their body is inlined when it holds DMA or semaphore code.
_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat2": "jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
}


#: Polls the exit check lets pass on the chip before it reads the DMA semaphores, so a
#: copy started just before the end has landed (about 12 us at 12 ns a poll).
EXIT_SETTLE_POLLS = 1000


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """What one traced kernel is instrumented with."""

    kernel: str
    backend: Backend
    options: SanitizeOptions
    recorder: Recorder
    axes: tuple[tuple[str, int], ...]
    grid: tuple[int | None, ...]
    #: The SMEM buffer whose windows the exit drain of a DMA semaphore waits on.
    drain_buffer: Any = None


@dataclasses.dataclass(frozen=True)
class NamedRef:
    """A semaphore the exit check reads, with its name for messages."""

    ref: Any
    name: str


Expr = bool | jax.Array
"""A condition: a Python bool when static, else a traced bool."""


def _and(a: Expr, b: Expr) -> Expr:
    if a is True:
        return b
    if b is True:
        return a
    if a is False or b is False:
        return False
    return jnp.logical_and(a, b)


def _not(a: Expr) -> Expr:
    if isinstance(a, bool):
        return not a
    return jnp.logical_not(a)


def _when(condition: Expr, emit: Callable[[], None]) -> None:
    if condition is True:
        emit()
    elif condition is not False:
        pl.when(condition)(emit)


def _static(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, np.integer):
        item: Callable[[], int] = getattr(cast(object, value), "item")
        return item()
    return None


def _parts(ref: Any) -> tuple[Any, tuple[Any, ...]]:
    """A (possibly transformed) ref as ``(root ref, transforms)``."""
    transforms: list[Any] = []
    while hasattr(ref, "transforms") and hasattr(ref, "ref"):
        transforms[:0] = list(ref.transforms)
        ref = ref.ref
    return ref, tuple(transforms)


def _indexers(transforms: Sequence[Any]) -> list[Any]:
    """The NDIndexer transforms (``.at[...]``), each with its ``indices`` and the
    ``shape`` it indexes; reshapes and bitcasts between them change that shape."""
    return [t for t in transforms if hasattr(t, "indices") and hasattr(t, "shape")]


@dataclasses.dataclass
class _Check:
    ok: Expr
    code: int
    site: int
    values: list[Any]


class _View:
    """How a view of a named ref reads in a message (``sems[i]``, ``x[i:i+8]``): per
    ``.at[...]``, per index, ``("value", n)`` (static), ``("traced", k)`` (the k-th of
    :attr:`dynamic`, recorded with the mistake) or ``("slice", start, size, stride)``
    with start and size in the same form."""

    def __init__(self, transforms: Sequence[Any]) -> None:
        self.dynamic: list[Any] = []
        self.parts: tuple[tuple[Any, ...], ...] = tuple(
            tuple(self._part(index) for index in indexer.indices)
            for indexer in _indexers(transforms)
        )

    def _value(self, value: Any) -> tuple[str, int]:
        static = _static(value)
        if static is not None:
            return ("value", static)
        if getattr(value, "shape", None) != ():
            return ("value", -1)
        self.dynamic.append(value)
        return ("traced", len(self.dynamic) - 1)

    def _part(self, index: Any) -> tuple[Any, ...]:
        if hasattr(index, "start") and hasattr(index, "size"):
            stride = _static(getattr(index, "stride", 1)) or 1
            return ("slice", self._value(index.start), self._value(index.size), stride)
        return self._value(index)


class Instrumenter:
    """Evaluates a kernel body's jaxpr in the current (kernel) trace, instrumented."""

    def __init__(self, plan: KernelPlan) -> None:
        self.plan = plan
        self.recorder = plan.recorder
        interpreted = plan.backend.interpreted
        self.polls = plan.options.spin_polls(interpreted)
        self.drain = plan.options.drain_polls(interpreted)
        self._names: dict[int, str] = {}
        self._keep: list[object] = []
        self._sensitive: dict[int, bool] = {}

    # ---------------------------------------------------------------- the kernel

    def kernel(
        self,
        jaxpr: Any,
        consts: Sequence[Any],
        leaves: Sequence[Any],
        names: Sequence[str | None],
        exit_semaphores: Sequence[NamedRef],
    ) -> None:
        """The whole body: clear the flags at the first grid step, run the body, check
        the kernel's own semaphores at the last grid step."""
        for leaf, name in zip(leaves, names):
            if name is not None:
                self.name(leaf, name)
        self.recorder.where_am_i()
        self.recorder.at_first_step(self.recorder.clear)
        self.run(jaxpr, [*consts, *leaves], [])
        frames = tuple(_jax.eqn_frames(jaxpr.eqns[-1])) if jaxpr.eqns else ()
        self.recorder.at_last_step(lambda: self.exit_check(exit_semaphores, "kernel exit", frames))

    def name(self, value: object, name: str) -> None:
        self._names[id(value)] = name
        self._keep.append(value)

    def name_of(self, ref: Any) -> str:
        root, _ = _parts(ref)
        return self._names.get(id(root), "a semaphore or buffer with no parameter name")

    # ---------------------------------------------------------------- evaluation

    def run(self, jaxpr: Any, inputs: Sequence[Any], frames: Sequence[Any]) -> list[Any]:
        env: dict[Any, Any] = {}
        for var, value in zip([*jaxpr.constvars, *jaxpr.invars], inputs):
            env[var] = value

        def read(var: Any) -> Any:
            return _jax.literal_value(var) if _jax.is_literal(var) else env[var]

        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            here = [*_jax.eqn_frames(eqn), *frames]
            with _jax.user_context(eqn):
                outs = self.equation(eqn, invals, here)
            for var, value in zip(eqn.outvars, outs):
                if not _jax.is_drop_var(var):
                    env[var] = value
        return [read(v) for v in jaxpr.outvars]

    def sensitive(self, jaxpr: Any) -> bool:
        """Whether ``jaxpr`` (or a block inside it) holds DMA or semaphore code."""
        known = self._sensitive.get(id(jaxpr))
        if known is None:
            known = any(
                eqn.primitive.name in _SENSITIVE
                or any(self.sensitive(sub) for sub in _jax.sub_jaxprs(eqn.params))
                for eqn in jaxpr.eqns
            )
            self._sensitive[id(jaxpr)] = known
            self._keep.append(jaxpr)
        return known

    def equation(self, eqn: Any, invals: list[Any], frames: list[Any]) -> list[Any]:
        name = eqn.primitive.name
        rule = _RULES.get(name)
        if rule is not None:
            return rule(self, eqn, invals, frames)
        subs = _jax.sub_jaxprs(eqn.params)
        if name in _CALLS and subs and any(self.sensitive(s) for s in subs):
            body, consts = _jax.block(eqn.params[_CALLS[name]])
            return self.run(body, [*consts, *invals], frames)
        if any(self.sensitive(sub) for sub in subs):
            raise SanitizerUnsupportedError(
                f"the sanitizer cannot instrument the {name!r} equation of kernel "
                f"{self.plan.kernel} (it holds DMA or semaphore code the sanitizer would "
                "have to re-emit). Pass sanitize=False for this kernel"
                + (
                    " (with jax_use_emit_pipeline_primitive off, emit_pipeline is plain "
                    "code the sanitizer follows)"
                    if name == "emit_pipeline"
                    else ""
                )
                + "; safedma.testing.verify and simulate check it on the CPU."
            )
        return _jax.bind_default(eqn, invals)

    # ---------------------------------------------------------------- sites

    def site(
        self,
        code: int,
        operation: str,
        name: str,
        shape: Sequence[Any],
        frames: Sequence[Any],
        **detail: Any,
    ) -> int:
        return register(
            Site(
                code=code,
                kernel=self.plan.kernel,
                operation=operation,
                name=name,
                shape=tuple(int(d) if _static(d) is not None else -1 for d in shape),
                frames=tuple(frames),
                backend=self.plan.backend,
                axes=self.plan.axes,
                grid=self.plan.grid,
                detail=detail,
            )
        )

    # ---------------------------------------------------------------- bounds

    def bounds(
        self,
        ref: Any,
        role: str,
        operation: str,
        frames: Sequence[Any],
        code: int,
    ) -> list[_Check]:
        """Checks that every index of ``ref``'s views is inside the array it indexes;
        only non-static ones cost anything at run time."""
        root, transforms = _parts(ref)
        name = self.name_of(root)
        view = _View(transforms)
        checks: list[_Check] = []
        for level, indexer in enumerate(_indexers(transforms)):
            shape = tuple(indexer.shape)
            for dim, index in enumerate(indexer.indices):
                extent = _static(shape[dim]) if dim < len(shape) else None
                if extent is None:
                    continue
                stride = 1
                if hasattr(index, "start") and hasattr(index, "size"):
                    start, size = index.start, index.size
                    stride = _static(getattr(index, "stride", 1)) or 1
                    if _static(size) == 0:
                        continue
                    last = start + (size - 1) * stride
                    ok = _and(_ge(start, 0), _lt(last, extent))
                    kind, values = "slice", [start, size]
                elif getattr(index, "shape", ()) == () or _static(index) is not None:
                    ok = _and(_ge(index, 0), _lt(index, extent))
                    kind, values = "index", [index]
                else:
                    continue  # an index array (a gather): not checked
                if ok is True:
                    continue
                site = self.site(
                    code,
                    operation,
                    name,
                    getattr(root, "shape", ()),
                    frames,
                    role=role,
                    view=view.parts,
                    dim=dim,
                    extent=extent,
                    indexed_shape=shape,
                    level=level,
                    kind=kind,
                    stride=stride,
                    view_values=len(view.dynamic),
                )
                checks.append(_Check(ok, code, site, [*values, *view.dynamic]))
        return checks

    def device_ids(
        self, device_id: Any, id_type: Any, operation: str, name: str, frames: Sequence[Any]
    ) -> list[_Check]:
        """Checks that each coordinate of a remote operation's device id is inside its mesh
        axis; only traced ones cost anything at run time."""
        checks: list[_Check] = []
        for coordinate in coordinates(device_id, id_type, self.plan.axes):
            value, size = coordinate.value, coordinate.size
            ok = _and(_ge(value, 0), _lt(value, size))
            if ok is True:
                continue
            site = self.site(
                DEVICE_ID, operation, name, (), frames, axis=coordinate.axis, size=size
            )
            checks.append(_Check(ok, DEVICE_ID, site, [value]))
        return checks

    def guarded(self, checks: Sequence[_Check], emit: Callable[[], None]) -> None:
        """Record the first failing check (in order), and ``emit`` only if all pass."""
        if not checks:
            emit()
            return
        ok: Expr = True
        for check in checks:
            values = check.values

            def record(check: _Check = check, values: list[Any] = values) -> None:
                self.recorder.record(check.code, check.site, values)

            _when(_not(check.ok), record)
            ok = _and(ok, check.ok)
        _when(ok, emit)

    # ---------------------------------------------------------------- waits

    def spin(self, root: Any, transforms: Sequence[Any], needed: Any) -> jax.Array:
        """Poll the semaphore until it holds ``needed`` or the spin limit runs out; the
        last count read."""
        backend = self.plan.backend
        limit = self.recorder.spin_limit(self.polls, self.drain)
        needed = _jax.asarray(needed, jnp.int32)
        first = _jax.read_semaphore(root, transforms, backend)

        def more(carry: tuple[jax.Array, jax.Array]) -> jax.Array:
            polls, count = carry
            return jnp.logical_and(count < needed, polls < limit)

        def poll(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            polls, _ = carry
            return polls + 1, _jax.read_semaphore(root, transforms, backend)

        _, count = lax.while_loop(more, poll, (jnp.int32(0), first))
        return count

    def bounded_wait(
        self,
        sem: Any,
        needed: Any,
        operation: str,
        frames: Sequence[Any],
        wait: Callable[[], None],
        **detail: Any,
    ) -> None:
        """Spin, then ``wait`` if the count got there; else record the hang and skip it."""
        root, transforms = _parts(sem)
        view = _View(transforms)
        site = self.site(
            DEADLOCK,
            operation,
            self.name_of(root),
            getattr(root, "shape", ()),
            frames,
            view=view.parts,
            view_values=len(view.dynamic),
            polls=self.polls,
            seconds=self.plan.options.spin_seconds(self.plan.backend.interpreted),
            **detail,
        )
        checks = self.bounds(sem, "semaphore", operation, frames, SEMAPHORE_INDEX)

        def attempt() -> None:
            count = self.spin(root, transforms, needed)
            arrived = count >= needed
            _when(arrived, wait)

            def hung() -> None:
                self.recorder.spun_out(site, [count, needed, *view.dynamic][:MAX_VALUES])

            _when(jnp.logical_not(arrived), hung)

        self.guarded(checks, attempt)

    # ---------------------------------------------------------------- exit checks

    def exit_check(self, semaphores: Sequence[NamedRef], where: str, frames: Sequence[Any]) -> None:
        """Every slot of every semaphore in ``semaphores`` must read 0; one that does not
        is drained after it is recorded (a DMA one with DMA waits, :mod:`._drain`). On the chip, a copy started just before
        (and never waited) may not have begun to land: the check first lets about
        :data:`EXIT_SETTLE_POLLS` polls pass (some 12 us)."""
        dma = [n for n in semaphores if _jax.semaphore_kind(getattr(n.ref, "aval", None)) == "DMA"]
        settled: tuple[NamedRef, jax.Array] | None = None
        if dma and self.plan.backend is Backend.CHIP:
            # The last poll is the first slot's count, so the wait is kept (a pure loop
            # whose result nothing used would be dropped).
            settled = (dma[0], self._settle(dma[0].ref))
        for named in semaphores:
            first = settled[1] if settled is not None and settled[0] is named else None
            self._check_semaphore(named, where, frames, first)

    def _settle(self, ref: Any) -> jax.Array:
        """Poll the first slot of ``ref`` :data:`EXIT_SETTLE_POLLS` times; its last count."""
        root, transforms = _parts(_first_slot(ref))

        def poll(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            polls, _ = carry
            return polls + 1, _jax.read_semaphore(root, transforms, self.plan.backend)

        first = _jax.read_semaphore(root, transforms, self.plan.backend)
        _, count = lax.while_loop(
            lambda carry: carry[0] < EXIT_SETTLE_POLLS, poll, (jnp.int32(0), first)
        )
        return count

    def _check_semaphore(
        self,
        named: NamedRef,
        where: str,
        frames: Sequence[Any],
        first: jax.Array | None = None,
    ) -> None:
        """Check every slot of one semaphore; ``first``: the first slot's count, already read."""
        ref = named.ref
        kind = _jax.semaphore_kind(getattr(ref, "aval", None)) or "DMA"
        shape = tuple(int(d) for d in getattr(ref, "shape", ()))
        site = self.site(LEFTOVER, where, named.name, shape, frames, kind=kind)
        size = math.prod(shape)
        if not shape:
            self._check_slot(ref, jnp.int32(0), site, kind, first)
        elif size <= 8:
            for flat in range(size):
                index = tuple(int(i) for i in np.unravel_index(flat, shape))
                known = first if flat == 0 else None
                self._check_slot(ref.at[index], jnp.int32(flat), site, kind, known)
        else:
            if first is not None:
                self._check_slot(_first_slot(ref), jnp.int32(0), site, kind, first)

            def slot(flat: jax.Array, carry: None) -> None:
                self._check_slot(ref.at[_unravel(flat, shape)], flat, site, kind)
                return carry

            _jax.fori_loop(0 if first is None else 1, size, slot, None)

    def _check_slot(
        self, view: Any, flat: jax.Array, site: int, kind: str, count: jax.Array | None = None
    ) -> None:
        root, transforms = _parts(view)
        if count is None:
            count = _jax.read_semaphore(root, transforms, self.plan.backend)

        backend = self.plan.backend

        def leftover() -> None:
            if kind == "DMA":
                # A DMA semaphore left non-zero halts the chip's core at exit (the flags
                # are never read): record the count once it stopped changing, then drain
                # it with DMA waits.
                held = settle(root, transforms, count, backend, self.drain)
                self.recorder.record(LEFTOVER, site, [held, flat])
                buffer = self.plan.drain_buffer
                _when(held > 0, lambda: drain_dma(view, held, buffer, backend, self.drain))
                return
            self.recorder.record(LEFTOVER, site, [count, flat])
            if kind == "REGULAR":

                def drain() -> None:
                    _jax.semaphore_wait(view, count)

                _when(count > 0, drain)

        _when(count != 0, leftover)


def _first_slot(ref: Any) -> Any:
    shape = tuple(getattr(ref, "shape", ()))
    return ref.at[(0,) * len(shape)] if shape else ref


def _ge(a: Any, b: int) -> Expr:
    static = _static(a)
    if static is not None:
        return static >= b
    return cast(jax.Array, a >= b)


def _lt(a: Any, b: int) -> Expr:
    static = _static(a)
    if static is not None:
        return static < b
    return cast(jax.Array, a < b)


def _unravel(flat: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, ...]:
    index: list[jax.Array] = []
    for size in reversed(shape):
        index.append(flat % size)
        flat = flat // size
    return tuple(reversed(index))


# -------------------------------------------------------------------- rules


def _dma_start(self: Instrumenter, eqn: Any, invals: list[Any], frames: list[Any]) -> list[Any]:
    src, dst, dst_sem, src_sem, device_id = _jax.tree_unflatten(eqn.params["tree"], invals)
    remote = device_id is not None
    operation = "remote copy start" if remote else "copy start"
    checks = self.bounds(src, "source", operation, frames, OUT_OF_BOUNDS)
    checks += self.bounds(dst, "destination", operation, frames, OUT_OF_BOUNDS)
    if dst_sem is not None:
        role = "receive semaphore" if remote else "semaphore"
        checks += self.bounds(dst_sem, role, operation, frames, SEMAPHORE_INDEX)
    if src_sem is not None:
        checks += self.bounds(src_sem, "send semaphore", operation, frames, SEMAPHORE_INDEX)
    if remote:
        id_type = eqn.params.get("device_id_type")
        checks += self.device_ids(device_id, id_type, operation, self.name_of(dst), frames)

    def start() -> None:
        _jax.bind_default(eqn, invals)

    self.guarded(checks, start)
    return []


def _dma_wait(self: Instrumenter, eqn: Any, invals: list[Any], frames: list[Any]) -> list[Any]:
    src, _dst, sem, _src_sem, device_id = _jax.tree_unflatten(eqn.params["tree"], invals)
    if sem is None:  # jax 0.12's fence for SparseCore push streams: waits no semaphore
        return _jax.bind_default(eqn, invals)
    remote = device_id is not None
    send = bool(eqn.params.get("is_wait_send") or eqn.params.get("insert_dummy_device"))
    operation = "wait_send" if send else ("wait_recv" if remote else "DMA wait")
    shape = tuple(getattr(src, "shape", ()))
    dtype = getattr(src, "dtype", None)
    static = [_static(d) for d in shape]
    if dtype is None or any(d is None for d in static):
        needed, exact = 1, False  # a window of traced size: any count at all
    else:
        dims = tuple(cast(int, d) for d in static)
        itemsize = int(np.dtype(dtype).itemsize)
        needed = amount(dims, itemsize, self.plan.backend, remote)
        exact = self.plan.backend.interpreted or exact_on_chip(dims, itemsize, remote)
    self.bounded_wait(
        sem,
        needed,
        operation,
        frames,
        lambda: _discard(_jax.bind_default(eqn, invals)),
        window=tuple(s if s is not None else -1 for s in static),
        dtype=str(dtype),
        exact=exact,
        kind="DMA",
    )
    return []


def _semaphore_wait(
    self: Instrumenter, eqn: Any, invals: list[Any], frames: list[Any]
) -> list[Any]:
    args = _jax.tree_unflatten(eqn.params["args_tree"], invals)
    ref, transforms, value = args[0], tuple(args[1]), args[2]
    view = _Rebuilt(ref, transforms)
    kind = _jax.semaphore_kind(getattr(ref, "aval", None)) or "REGULAR"
    self.bounded_wait(
        view,
        value,
        "semaphore wait",
        frames,
        lambda: _discard(_jax.bind_default(eqn, invals)),
        kind=kind,
        exact=True,
    )
    return []


def _semaphore_signal(
    self: Instrumenter, eqn: Any, invals: list[Any], frames: list[Any]
) -> list[Any]:
    args = _jax.tree_unflatten(eqn.params["args_tree"], invals)
    view = _Rebuilt(args[0], tuple(args[1]))
    checks = self.bounds(view, "semaphore", "semaphore signal", frames, SEMAPHORE_INDEX)
    if len(args) > 3 and args[3] is not None:
        id_type = eqn.params.get("device_id_type")
        name = self.name_of(args[0])
        checks += self.device_ids(args[3], id_type, "remote semaphore signal", name, frames)
    self.guarded(checks, lambda: _discard(_jax.bind_default(eqn, invals)))
    return []


def _semaphore_read(
    self: Instrumenter, eqn: Any, invals: list[Any], frames: list[Any]
) -> list[Any]:
    args = _jax.tree_unflatten(eqn.params["args_tree"], invals)
    ref, transforms = args[0], tuple(args[1])
    checks = self.bounds(
        _Rebuilt(ref, transforms), "semaphore", "semaphore read", frames, SEMAPHORE_INDEX
    )
    self.guarded(checks, lambda: None)  # recorded; the read itself is harmless
    return [_jax.read_semaphore(ref, transforms, self.plan.backend)]


def _run_scoped(self: Instrumenter, eqn: Any, invals: list[Any], frames: list[Any]) -> list[Any]:
    body, _ = _jax.block(eqn.params["jaxpr"])
    n = len(eqn.invars)
    if len(body.constvars) == n:
        allocated = list(body.invars)
    elif not body.constvars and len(body.invars) >= n:
        allocated = list(body.invars[n:])
    else:
        raise SanitizerUnsupportedError(
            f"the sanitizer does not know this jax's run_scoped layout in kernel "
            f"{self.plan.kernel}; pass sanitize=False for this kernel"
        )
    arg_names = list(getattr(getattr(body, "debug_info", None), "arg_names", None) or ())
    line = _jax.eqn_frames(eqn)

    def scoped(*allocs: Any) -> list[Any]:
        semaphores: list[NamedRef] = []
        for k, (alloc, var) in enumerate(zip(allocs, allocated)):
            given = arg_names[k] if k < len(arg_names) and arg_names[k] else None
            name = given if given and "[" not in given else f"run_scoped allocation {k}"
            self.name(alloc, name)
            if _jax.semaphore_kind(var.aval) is not None:
                semaphores.append(NamedRef(alloc, name))
        outs = self.run(body, [*invals, *allocs], frames)
        self.exit_check(semaphores, "end of run_scoped", line + list(frames))
        return outs

    jaxpr, consts = _jax.trace_block(scoped, [v.aval for v in allocated], "pallas run_scoped")
    return _jax.bind_run_scoped(eqn, jaxpr, consts)


def _cond(self: Instrumenter, eqn: Any, invals: list[Any], frames: list[Any]) -> list[Any]:
    branches = [_jax.block(b) for b in eqn.params["branches"]]
    if not any(self.sensitive(b) for b, _ in branches):
        return _jax.bind_default(eqn, invals)
    index, *operands = invals

    def make(branch: Any, consts: list[Any]) -> Callable[[], list[Any]]:
        return lambda: self.run(branch, [*consts, *operands], frames)

    out = _jax.switch(index, [make(b, c) for b, c in branches])
    return list(out)


def _while(self: Instrumenter, eqn: Any, invals: list[Any], frames: list[Any]) -> list[Any]:
    params = eqn.params
    cond, cond_own = _jax.block(params["cond_jaxpr"])
    body, body_own = _jax.block(params["body_jaxpr"])
    if not (self.sensitive(cond) or self.sensitive(body)):
        return _jax.bind_default(eqn, invals)
    cn, bn = int(params["cond_nconsts"]), int(params["body_nconsts"])
    cond_consts, body_consts, init = invals[:cn], invals[cn : cn + bn], invals[cn + bn :]

    def test(carry: Iterable[Any]) -> Any:
        return self.run(cond, [*cond_own, *cond_consts, *carry], frames)[0]

    def step(carry: Iterable[Any]) -> list[Any]:
        return self.run(body, [*body_own, *body_consts, *carry], frames)

    return list(lax.while_loop(test, step, list(init)))


def _scan(self: Instrumenter, eqn: Any, invals: list[Any], frames: list[Any]) -> list[Any]:
    params = eqn.params
    body, own = _jax.block(params["jaxpr"])
    if not self.sensitive(body):
        return _jax.bind_default(eqn, invals)
    nc, ncarry = _jax.scan_counts(eqn, len(invals))
    consts, carry, xs = invals[:nc], invals[nc : nc + ncarry], invals[nc + ncarry :]

    def step(c: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        outs = self.run(body, [*own, *consts, *c, *x], frames)
        return outs[:ncarry], outs[ncarry:]

    carry_out, ys = lax.scan(
        step,
        list(carry),
        list(xs),
        length=params["length"],
        reverse=params["reverse"],
        unroll=params.get("unroll", 1),
    )
    return [*carry_out, *ys]


_RULES: dict[str, Callable[[Instrumenter, Any, list[Any], list[Any]], list[Any]]] = {
    "dma_start": _dma_start,
    "dma_wait": _dma_wait,
    "semaphore_wait": _semaphore_wait,
    "semaphore_signal": _semaphore_signal,
    "semaphore_read": _semaphore_read,
    "run_scoped": _run_scoped,
    "cond": _cond,
    "while": _while,
    "scan": _scan,
}


@dataclasses.dataclass(frozen=True)
class _Rebuilt:
    """A semaphore operand given as ``(ref, transforms)`` (``pl.semaphore_*``'s tree),
    seen like a view: ``.ref`` and ``.transforms``; ``.at`` indexes the root."""

    ref: Any
    transforms: tuple[Any, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self.ref, "shape", ()))


def _discard(_: object) -> None:
    return None
