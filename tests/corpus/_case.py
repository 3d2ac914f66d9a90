"""The schema of a corpus case: a program, where it comes from, and what each tool says of it.

A :class:`Case` is one kernel program (correct, or with one seeded mistake) and its
expected verdict per tool, keyed by the tool's name (``"trace"``, ``"mosaic"``,
``"verify"``, ``"simulate"``; a new tool is a new key and a new driver in
``tests/tools/``). A verdict is :data:`OK` (or an :class:`Ok` with what the tool's
result must say), a :class:`Raises`, or :class:`Unsupported`. A tool with no key is not
run on the case.

The line a person would fix carries a ``# fix: <case name>`` comment in the kernel's
source (one line may list several cases); a :class:`Raises` with ``line=True`` asks the
error to name one of those lines as ``file.py:LINE``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

import safedma

TOOLS = ("trace", "mosaic", "verify", "simulate", "sanitize")
"""The tools with a driver in tests/tools/ (test_<tool>_corpus.py)."""

PACKAGE = Path(safedma.__file__).resolve().parent


# ====================================================================== programs


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """A mesh by shape: ``abstract()`` for the device-free tools, ``real()`` for simulate.

    ``shape=()`` with a ``tpu`` generation only names the chip (verify then runs the
    program whole); ``tpu`` is also kept on the abstract mesh of a shaped one.
    """

    shape: tuple[int, ...]
    names: tuple[str, ...]
    tpu: str | None = None

    @property
    def devices(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    def abstract(self) -> Any:
        from safedma.testing import abstract_mesh

        return abstract_mesh(self.shape, self.names, tpu=self.tpu)

    def real(self) -> Any:
        from safedma.testing import simulated_mesh

        if len(self.shape) == 1:
            return simulated_mesh(self.shape[0], self.names[0])
        return simulated_mesh(self.shape, self.names)


def ring(devices: int, axis: str = "x", *, tpu: str | None = None) -> MeshSpec:
    return MeshSpec((devices,), (axis,), tpu)


def chip(tpu: str = "v5p") -> MeshSpec:
    """No mesh axes: the program runs whole, on a chip of generation ``tpu``."""
    return MeshSpec((), (), tpu)


@dataclasses.dataclass(frozen=True)
class Program:
    """What the tools run: ``fn(*args)``.

    ``args`` are ``jax.ShapeDtypeStruct`` or arrays (values the protocol depends on).
    With a ``mesh`` of one or more axes, ``fn`` is the per-device body and ``args`` the
    global arrays, split along their leading dimension over all axes (the convention of
    ``verify`` and ``simulate``); with ``chip(...)`` or no mesh it is the whole program.
    ``values`` gives concrete arguments for the tools that execute (simulate); by
    default each ``ShapeDtypeStruct`` becomes an ``arange`` (zeros for integers).
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    mesh: MeshSpec | None = None
    invocations: int = 1
    values: Callable[[], tuple[Any, ...]] | None = None
    lower: bool = False  # the trace tool lowers to Mosaic (checks that run at lowering)

    @property
    def per_device(self) -> bool:
        return self.mesh is not None and bool(self.mesh.shape)

    @property
    def devices(self) -> int:
        return self.mesh.devices if self.mesh is not None else 1

    def concrete_args(self) -> tuple[Any, ...]:
        if self.values is not None:
            return self.values()
        return tuple(_arange(a) if isinstance(a, jax.ShapeDtypeStruct) else a for a in self.args)

    def repeated(self) -> Callable[..., Any]:
        """``fn`` applied ``invocations`` times, each call's output the next one's input."""
        if self.invocations == 1:
            return self.fn

        def again(*args: Any) -> Any:
            out = self.fn(*args)
            for _ in range(self.invocations - 1):
                out = self.fn(out)
            return out

        return again

    def whole(self) -> tuple[Callable[..., Any], tuple[Any, ...], Any]:
        """``(fn, args, mesh)`` of the whole program for lowering and tracing: a
        per-device body inside ``jax.shard_map`` over the abstract mesh, its arguments
        sharded; otherwise the program itself with its chip (or no) mesh."""
        if not self.per_device:
            assert self.mesh is None or not self.mesh.shape
            return self.repeated(), self.args, None if self.mesh is None else self.mesh.abstract()
        from jax.sharding import NamedSharding, PartitionSpec as P

        assert self.mesh is not None
        mesh = self.mesh.abstract()
        spec = P(self.mesh.names)
        mapped = jax.shard_map(
            self.repeated(), mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False
        )
        sharded = tuple(
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, spec))
            for a in self.args
        )
        return jax.jit(mapped), sharded, mesh


def _arange(spec: jax.ShapeDtypeStruct) -> Any:
    import jax.numpy as jnp

    size = int(np.prod(spec.shape))
    if jnp.issubdtype(spec.dtype, jnp.integer):
        return jnp.zeros(spec.shape, spec.dtype)
    return jnp.arange(size, dtype=jnp.float32).reshape(spec.shape).astype(spec.dtype)


# ====================================================================== verdicts


@dataclasses.dataclass(frozen=True)
class Ok:
    """The tool accepts the program.

    ``report``: for verify, fields of the report and their values (``devices`` is
    checked against the program's mesh whatever is given here); for sanitize,
    ``{"checks": 0}`` when nothing in the program is instrumented. ``check``: called with
    the tool's result (verify's report, simulate's outputs) and the program, for what a
    field comparison cannot say.
    """

    report: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    check: Callable[[Any, Program], None] | None = None


OK = Ok()

NOTHING_TO_CHECK = Ok(report={"checks": 0})
"""The sanitizer's verdict on a correct program with no DMA or semaphore of its own (a
BlockSpec grid's copies are made when it is lowered): it runs clean through the
sanitized call and gives its unsanitized outputs, with no check put in."""


@dataclasses.dataclass(frozen=True)
class Raises:
    """The tool raises ``error`` (a regex one of the error's class names must match; with
    ``exact``, the error's own class name), an instance of ``kind`` if given, and its
    message says everything below.

    ``says``: substrings; ``matches``: regexes; ``one_of``: groups of words, one word of
    each group named as a whole word (a device ``x=2``, a parameter name); ``absent``:
    substrings the message must not contain; ``check``: called with the error, for what
    the fields cannot say (lines found at run time, counts); ``line``: the
    message names the case's ``# fix:`` line (or, with ``frame=True``, the traceback
    passes through it).
    """

    error: str
    says: tuple[str, ...] = ()
    matches: tuple[str, ...] = ()
    one_of: tuple[tuple[str, ...], ...] = ()
    absent: tuple[str, ...] = ()
    line: bool = True
    frame: bool = False
    exact: bool = False
    kind: str | None = None
    check: Callable[[BaseException], None] | None = None


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """The tool refuses the program, saying why (``reason``, a regex); never a verdict."""

    reason: str


Verdict = Ok | Raises | Unsupported


# ====================================================================== cases


@dataclasses.dataclass(frozen=True)
class Case:
    """One program of the corpus.

    ``name``: stable, unique, the pytest id and the ``# fix:`` marker; ``pattern``: the
    DMA pattern family (the module it lives in); ``provenance``: where the protocol comes
    from, in user terms; ``build``: makes the program (called by each driver, so nothing
    is traced at import); ``expect``: tool -> verdict; ``twin``: the hand-written raw
    pltpu program with the same Mosaic (for the ``mosaic`` tool); ``sources``: the files
    holding ``# fix:`` lines (default: the file ``build`` is defined in); ``fix``: the
    name in that marker (default: the case's name; the bug and the fix of one mistake,
    and its spellings, share it); ``slow``: the tools whose run of this case is in the
    slow lane (``-m slow``); ``tags``: free words to select cases by (``pltpu``,
    ``safedma``, ``bug``, a catalogue row such as ``R7``).
    """

    name: str
    pattern: str
    provenance: str
    build: Callable[[], Program]
    expect: Mapping[str, Verdict]
    twin: Callable[[], Program] | None = None
    sources: tuple[Path, ...] = ()
    fix: str | None = None
    slow: tuple[str, ...] = ()
    tags: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = set(self.expect) - set(TOOLS)
        assert not unknown, (
            f"{self.name}: no driver for {sorted(unknown)} (tests/corpus/_case.py TOOLS)"
        )
        if "mosaic" in self.expect:
            assert self.twin is not None, f"{self.name}: a mosaic verdict needs a twin"

    @property
    def marker(self) -> str:
        return self.fix or self.name

    @property
    def files(self) -> tuple[Path, ...]:
        if self.sources:
            return self.sources
        build = self.build
        while isinstance(build, functools.partial):
            build = build.func
        return (Path(inspect.getsourcefile(build) or ""),)

    def fix_lines(self) -> list[tuple[Path, tuple[int, ...]]]:
        """Each file's lines marked ``# fix:`` for this case (at least one line in all)."""
        found = [(f, marked_lines(f, self.marker)) for f in self.files]
        found = [(f, lines) for f, lines in found if lines]
        if not found:
            raise LookupError(f"no '# fix: {self.marker}' line in {[str(f) for f in self.files]}")
        return found


# ====================================================================== checks


@functools.cache
def marked_lines(path: Path, name: str) -> tuple[int, ...]:
    """Line numbers of ``path`` carrying ``# fix: <name>`` (one of the names listed); none
    is an empty tuple."""
    pattern = re.compile(rf"#\s*fix:(?:\s+\S+)*?\s+{re.escape(name)}(?:\s+\S+)*\s*$")
    lines = path.read_text(encoding="utf-8").splitlines()
    return tuple(i + 1 for i, line in enumerate(lines) if pattern.search(line))


def names_line(message: str, path: Path, lines: Sequence[int]) -> bool:
    """Whether ``message`` names ``path`` at one of ``lines`` (``file.py:LINE`` or
    ``"file.py", line LINE``)."""
    alternatives = "|".join(str(n) for n in lines)
    pattern = rf"{re.escape(path.name)}\"?(?::|, line )(?:{alternatives})\b"
    return re.search(pattern, message) is not None


_LOCATION = re.compile(r"(?P<path>[^\s\"'(),]+\.py)\"?(?::|, line )\d+")


def library_lines(message: str) -> list[str]:
    """The ``file.py:LINE`` locations in ``message`` that are inside the installed
    safedma package (whatever the checkout's folder is called)."""
    found = []
    for match in _LOCATION.finditer(message):
        path = Path(match.group("path"))
        try:
            inside = path.resolve().is_relative_to(PACKAGE)
        except OSError:
            inside = False
        if inside:
            found.append(match.group(0))
    return found


def class_names(error: BaseException) -> list[str]:
    return [k.__name__ for k in type(error).__mro__]


def problems(error: BaseException, verdict: Raises, case: Case) -> list[str]:
    """Everything ``error`` fails to say that ``verdict`` asks for (empty when right)."""
    message = str(error)
    found: list[str] = []
    names = [type(error).__name__] if verdict.exact else class_names(error)
    if not any(re.search(verdict.error, n) for n in names):
        found.append(f"class {type(error).__name__} does not match {verdict.error!r}")
    if verdict.kind and verdict.kind not in class_names(error):
        found.append(f"{type(error).__name__} is not a {verdict.kind}")
    found += [f"does not say {s!r}" for s in verdict.says if s not in message]
    found += [f"does not match {m!r}" for m in verdict.matches if not re.search(m, message)]
    found += [f"says {s!r}" for s in verdict.absent if s in message]
    for group in verdict.one_of:
        if not any(re.search(rf"\b{re.escape(w)}\b", message) for w in group):
            found.append(f"names none of {group}")
    if verdict.line:
        marked = case.fix_lines()
        frames = traceback.extract_tb(error.__traceback__) if verdict.frame else []
        named = any(names_line(message, path, lines) for path, lines in marked) or any(
            Path(f.filename).resolve() == path.resolve() and f.lineno in lines
            for f in frames
            for path, lines in marked
        )
        if not named:
            where = ", ".join(f"{p.name}:{list(lines)}" for p, lines in marked)
            found.append(f"the user's line ({where}) is not named")
    if verdict.check is not None and not found:
        try:
            verdict.check(error)
        except AssertionError as failed:
            found.append(f"check {verdict.check.__name__}: {failed}")
    inside = library_lines(message)
    if inside:
        found.append(f"names a line inside safedma as the location: {inside}")
    return found
