"""The one-block ring harness of the mistake pairs: kernels of one device's ``BLOCK`` on a
ring along ``"x"``, each mistake written as a bug and its fix, in raw pltpu and in
safedma (four cases per :class:`Pair`).

Every kernel has the same operands: ``x_ref`` and ``o_ref`` are one device's rows of a
``(rows * devices, 128)`` float32 array (``BLOCK``: two ``CHUNK``-row chunks of 4 KiB),
in HBM (or ``x_ref`` in VMEM), followed by the pair's scratch. A body takes ``bug``:
the pair binds ``bug=True`` for the bug and ``bug=False`` for the fix, so the two differ
in nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._case import OK, Case, Ok, Program, Raises, Verdict, ring

CHUNK = 8
AXIS = "x"
RING = 4
BLOCK = (2 * CHUNK, 128)
F32 = jnp.float32
HBM = pl.BlockSpec(memory_space=pl.ANY)
VMEM_BLOCK = pl.BlockSpec(memory_space=pltpu.VMEM)
Kernel = Callable[..., None]
Scratch = Callable[[], list[Any]]


# ====================================================================== helpers of the bodies


def neighbour(shift: int) -> dict[str, Any]:
    """The device ``shift`` places along the ring (a raw pltpu dict device id)."""
    me = lax.axis_index(AXIS)
    n = lax.axis_size(AXIS)
    return {AXIS: (me + shift + n) % n}


def first(x_ref: Any) -> Any:
    return x_ref.at[pl.ds(0, CHUNK)]


def second(x_ref: Any) -> Any:
    return x_ref.at[pl.ds(CHUNK, CHUNK)]


def write_out(res: Any, o_ref: Any, sem: Any) -> None:
    c = pltpu.make_async_copy(res, o_ref, sem)
    c.start()
    c.wait()


def send_right(src: Any, dst: Any, send: Any, recv: Any) -> None:
    """Copy ``src`` into the right neighbour's ``dst`` and wait both ends (raw pltpu)."""
    right = neighbour(1)
    c = pltpu.make_async_remote_copy(
        src, dst, send, recv, device_id=right
    )  # fix: r6_unwritten_staging r10_one_round
    c.start()  # fix: r6_unwritten_staging r10_one_round
    c.wait()


def read_chunks(
    wait_first: Callable[[], object], wait_second: Callable[[], object], bufs: Any, res: Any
) -> None:
    """Wait chunk 0 and read it, then chunk 1: the reads a wrong wait leaves unguarded."""
    wait_first()  # fix: r7_wrong_slot r9_shared_sem early_wait
    res[pl.ds(0, CHUNK)] = bufs[0] * 2.0  # fix: r7_wrong_slot r9_shared_sem early_wait
    wait_second()
    res[pl.ds(CHUNK, CHUNK)] = bufs[1] * 2.0


def dma(n: int = 1) -> list[Any]:
    return [pltpu.SemaphoreType.DMA(()) for _ in range(n)]


def chunks() -> Any:
    return pltpu.VMEM((2, CHUNK, BLOCK[1]), F32)


def block() -> Any:
    return pltpu.VMEM(BLOCK, F32)


# ====================================================================== programs


def kernel_call(
    kernel: Kernel,
    scratch: Scratch,
    *,
    name: str,
    safedma: bool,
    x_in_vmem: bool = False,
    collective_id: int | None = None,
) -> Callable[[jax.Array], jax.Array]:
    """``kernel(x_ref, o_ref, *scratch)`` as a per-device function of one block
    (``sd.pallas_call`` for safedma, else ``pl.pallas_call``)."""
    in_spec = VMEM_BLOCK if x_in_vmem else HBM
    extra: dict[str, Any] = {}
    if collective_id is not None:
        extra["compiler_params"] = pltpu.CompilerParams(collective_id=collective_id)

    def per_device(x: jax.Array) -> jax.Array:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        if safedma:
            return sd.pallas_call(
                kernel,
                out,
                in_specs=[in_spec],
                out_specs=HBM,
                scratch_shapes=scratch(),
                name=name,
                **extra,
            )(x)
        result: jax.Array = pl.pallas_call(
            kernel,
            out_shape=out,
            in_specs=[in_spec],
            out_specs=HBM,
            scratch_shapes=scratch(),
            name=name,
            **extra,
        )(x)
        return result

    return per_device


# ====================================================================== pairs


@dataclasses.dataclass(frozen=True)
class Pair:
    """One mistake as a bug and its fix (``kind="false_alarm"``: a correct kernel the
    trace-time checks once rejected, and its broken twin), in both spellings.

    ``scratch`` is the pltpu form, used by both; ``verify``: the verdict on the bug;
    ``simulate_bug``: what simulate says of the bug today (``"clean"``: it passes it;
    ``None``: it depends on the schedule, so nothing is pinned); ``trace_bug``: the
    trace-time error that already stops the safedma bug; ``sanitize_bug``: what the
    on-chip sanitizer reports of the bug (None: a mistake it cannot see, such as a race,
    so the bug gets no ``sanitize`` verdict; every fix gets ``OK``).
    """

    name: str
    row: str  # the catalogue row (docs/catalogue.md)
    kind: str  # "silent" (simulate passes the bug), "leak", "false_alarm"
    scratch: Scratch
    safedma: Kernel
    pltpu: Kernel
    verify: Raises
    provenance: str = "written for this suite"
    x_in_vmem: bool = False
    collective_id: int | None = None
    invocations: int = 1
    rows: int = BLOCK[0]
    simulate_bug: str | None = "clean"
    trace_bug: Raises | None = None
    # The trace-time error that stops the raw pltpu bug (its body under sd.checked).
    trace_raw_bug: Raises | None = None
    devices: int = RING
    slow_simulate: bool = False  # even the pltpu spelling's simulations are slow
    sanitize_bug: Raises | None = None

    @property
    def variants(self) -> tuple[str, str]:
        return ("bug", "ok") if self.kind == "false_alarm" else ("bug", "fix")

    def program(self, flavour: str, variant: str) -> Program:
        body = self.safedma if flavour == "safedma" else self.pltpu
        kernel = functools.partial(body, bug=variant == "bug")
        per_device = kernel_call(
            kernel,
            self.scratch,
            name=f"{self.name}_{variant}",
            safedma=flavour == "safedma",
            x_in_vmem=self.x_in_vmem,
            collective_id=self.collective_id,
        )
        spec = jax.ShapeDtypeStruct((self.rows * self.devices, BLOCK[1]), F32)
        return Program(per_device, (spec,), ring(self.devices, AXIS), invocations=self.invocations)

    def cases(self, pattern: str) -> list[Case]:
        out = []
        for variant in self.variants:
            for flavour in ("pltpu", "safedma"):
                out.append(self._case(pattern, flavour, variant))
        return out

    def _case(self, pattern: str, flavour: str, variant: str) -> Case:
        bug = variant == "bug"
        expect: dict[str, Verdict] = {}
        slow: list[str] = []
        if bug:
            caught = self.trace_bug if flavour == "safedma" else None
            expect["verify"] = caught if caught is not None else self.verify
            if caught is not None:
                expect["trace"] = caught
                # sanitize=True traces the body with the same checks first.
                expect["sanitize"] = caught
            elif flavour == "pltpu" and self.trace_raw_bug is not None:
                expect["trace"] = self.trace_raw_bug
                # The sanitizer sends raw calls through sd.pallas_call: the same check first.
                expect["sanitize"] = self.trace_raw_bug
            else:
                if self.sanitize_bug is not None:
                    expect["sanitize"] = self.sanitize_bug
                if self.simulate_bug is not None:
                    expect["simulate"] = (
                        OK
                        if self.simulate_bug == "clean"
                        else Raises(self.simulate_bug, exact=True)
                    )
                    if flavour == "safedma" or self.slow_simulate:
                        slow.append("simulate")
        else:
            expect["verify"] = Ok(report={"devices": self.devices})
            expect["trace"] = OK  # the raw twin under sd.checked too
            expect["simulate"] = OK
            expect["sanitize"] = OK
            if self.kind == "silent" or flavour == "safedma" or self.slow_simulate:
                slow.append("simulate")
        if flavour == "safedma" and self.kind != "silent" and "simulate" in expect:
            del expect["simulate"]  # the raw spelling is simulated; the run is the same
            slow = [t for t in slow if t != "simulate"]
        return Case(
            name=f"{self.name}-{variant}-{flavour}",
            pattern=pattern,
            provenance=self.provenance,
            build=functools.partial(self.program, flavour, variant),
            expect=expect,
            sources=(
                _source(self.safedma if flavour == "safedma" else self.pltpu),
                _source(read_chunks),
            ),
            fix=self.name,
            slow=tuple(slow),
            tags=frozenset({"pair", self.kind, self.row, flavour, variant}),
        )


def _source(body: Kernel) -> Any:
    import inspect
    from pathlib import Path

    return Path(inspect.getsourcefile(body) or "")


ALL = tuple(f"x={i}" for i in range(RING))
RACE = r"^RaceDetectedError$"
LEFTOVER = r"^LeftoverSemaphoreError$"


def caught(
    classes: str, message: str, devices: tuple[str, ...], names: tuple[str, ...], fix: str
) -> Raises:
    """verify's verdict on a pair's bug: a SimulationError of ``classes`` whose message
    describes the mistake, names one of ``devices`` and of the kernel parameters
    ``names``, the user's ``# fix:`` line and the advice ``fix``."""
    return Raises(classes, matches=(message, fix), one_of=(devices, names), kind="SimulationError")


def sanitized(
    classes: str, devices: tuple[str, ...], names: tuple[str, ...], *, line: bool = True
) -> Raises:
    """The sanitizer's verdict on a bug: its error ``classes`` (the class itself), from
    the sanitizer, naming a device that makes the mistake as ``(x=N)``, the semaphore by
    one of the kernel's parameter ``names``, and (with ``line``) the user's ``# fix:``
    line (a wait or a copy; a semaphore left non-zero at exit has no line of its own)."""
    import re

    return Raises(
        classes,
        exact=True,
        matches=(r"^\[safedma sanitizer\]", "|".join(rf"\({re.escape(d)}\)" for d in devices)),
        one_of=(names,),
        line=line,
    )
