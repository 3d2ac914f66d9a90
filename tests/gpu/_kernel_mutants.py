"""Mutants of jax's own Pallas GPU kernels, made in memory from the installed source.

Each operator finds its sites in the syntax tree of one kernel module (never in
jax's pipeline helpers, which are not the kernel's code) and changes one of them.
The change is spliced into the module's text so every other line keeps its number;
that text is compiled with the module's real file name and executed as a fresh
module object (new functions, so no jit cache hides the change), and
:func:`source_shown` puts it in Python's line cache while a checker runs, so what
the checker quotes is what the mutant says.

=============================  =====================================================
``drop_commit_smem``           a ``plgpu.commit_smem()`` statement removed
``drop_wait_smem_to_gmem``     a ``plgpu.wait_smem_to_gmem(...)`` statement removed
``wait_smem_to_gmem_n_plus_1`` its ``n`` one larger: one store fewer is waited
``drop_barrier_wait``          a ``plgpu.barrier_wait(...)`` statement removed
``drop_barrier_arrive``        a ``plgpu.barrier_arrive(...)`` statement removed
``num_arrivals_plus_1``        a ``plgpu.Barrier(...)``'s ``num_arrivals`` one larger
                               (absent, it is 1: ``num_arrivals=2`` is added)
``barrier_slot_plus_1``        ``b.at[i]`` of a barrier (a name that says ``barrier``)
                               made ``b.at[i + 1]``, with no modulo
=============================  =====================================================

A removed statement leaves a ``pass`` on its first line. The line to fix is the
changed statement's lines; for a removed statement, any line of the statement
before or after it in its block (for a compound neighbour, its header: decorators to
the line before its body).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

from tests.field._mutants import run_as_module, source_path, text_shown
from tests.gpu._jax_kernels import JaxWithDevices, f32

OPERATORS = (
    "drop_commit_smem",
    "drop_wait_smem_to_gmem",
    "wait_smem_to_gmem_n_plus_1",
    "drop_barrier_wait",
    "drop_barrier_arrive",
    "num_arrivals_plus_1",
    "barrier_slot_plus_1",
)
_DROPPED_CALL = {
    "drop_commit_smem": "commit_smem",
    "drop_wait_smem_to_gmem": "wait_smem_to_gmem",
    "drop_barrier_wait": "barrier_wait",
    "drop_barrier_arrive": "barrier_arrive",
}


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One change at ``line`` of ``module``'s file: ``old`` (a span of the text) made ``new``.

    ``lines`` (first, last): the lines a message must name to name the line to fix;
    ``neighbours``: for a removed statement, the (first, last) lines of the statements
    before and after it in its block."""

    operator: str
    module: str
    line: int
    span: tuple[int, int, int, int]  # first line, column, last line, end column
    new: str
    lines: tuple[int, int]
    neighbours: tuple[tuple[int, int], ...] = ()

    @property
    def ident(self) -> str:
        return f"{self.operator}@{self.line}"

    @property
    def removes(self) -> bool:
        return self.operator in _DROPPED_CALL


def _call_name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _span(node: ast.AST) -> tuple[int, int, int, int]:
    end_line, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
    assert end_line is not None and end_col is not None
    return (node.lineno, node.col_offset, end_line, end_col)  # type: ignore[attr-defined]


def _statement_lines(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> tuple[int, int]:
    """The lines of the simple statement holding ``node``; a node in a compound
    statement's header (a decorator's call) counts its own lines."""
    at = node
    while not isinstance(at, ast.stmt):
        at = parents[at]
    if hasattr(at, "body"):
        at = node
    first, _, last, _ = _span(at)
    return first, last


def _neighbours(stmt: ast.stmt, parents: dict[ast.AST, ast.AST]) -> tuple[tuple[int, int], ...]:
    block = parents[stmt]
    for _, value in ast.iter_fields(block):
        if isinstance(value, list) and any(v is stmt for v in value):
            i = next(i for i, v in enumerate(value) if v is stmt)
            near = [value[j] for j in (i - 1, i + 1) if 0 <= j < len(value)]
            return tuple(_own_lines(s) for s in near)
    return ()


def _own_lines(stmt: ast.stmt) -> tuple[int, int]:
    """A simple statement's lines; a compound one's header (decorators to the line
    before its body): a line inside its body is not the line of the statement."""
    first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
    body = getattr(stmt, "body", None)
    if body:
        return first, max(first, body[0].lineno - 1)
    return first, _span(stmt)[2]


def _plus_one(node: ast.expr, text: str) -> str:
    return f"({ast.get_source_segment(text, node)}) + 1"


def mutants_of(module_name: str) -> list[Mutant]:
    """Every site of every operator in the module, in operator then line order."""
    text = source_path(module_name).read_text()
    tree = ast.parse(text)
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    found: list[Mutant] = []

    def add(operator: str, node: ast.AST, new: str, **extra: object) -> None:
        lines = _statement_lines(node, parents)
        found.append(Mutant(operator, module_name, node.lineno, _span(node), new, lines, **extra))  # type: ignore[attr-defined, arg-type]

    for operator, name in _DROPPED_CALL.items():
        for stmt in ast.walk(tree):
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Call)
                and _call_name(stmt.value) == name
            ):
                add(operator, stmt, "pass", neighbours=_neighbours(stmt, parents))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    for call in calls:
        if _call_name(call) == "wait_smem_to_gmem":
            n = call.args[0] if call.args else next(k.value for k in call.keywords if k.arg == "n")
            add("wait_smem_to_gmem_n_plus_1", n, _plus_one(n, text))
    for call in calls:
        if _call_name(call) == "Barrier":
            given = next((k.value for k in call.keywords if k.arg == "num_arrivals"), None)
            if given is not None:
                add("num_arrivals_plus_1", given, _plus_one(given, text))
            else:
                segment = ast.get_source_segment(text, call)
                assert segment is not None and segment.endswith(")")
                inside = segment[segment.index("(") + 1 : -1].strip()
                add(
                    "num_arrivals_plus_1",
                    call,
                    segment[:-1] + (", " if inside else "") + "num_arrivals=2)",
                )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "at"
            and "barrier" in ast.unparse(node.value.value).lower()
        ):
            add("barrier_slot_plus_1", node.slice, _plus_one(node.slice, text))
    order = {op: i for i, op in enumerate(OPERATORS)}
    return sorted(found, key=lambda m: (order[m.operator], m.span))


def mutated_source(mutant: Mutant) -> str:
    """The module's text with the change spliced in, every other line where it was."""
    text = source_path(mutant.module).read_text()
    lines = text.splitlines(keepends=True)
    first, col, last, end_col = mutant.span
    head, tail = lines[first - 1][:col], lines[last - 1][end_col:]
    joined = head + mutant.new.replace("\n", " ") + tail
    return "".join([*lines[: first - 1], joined, *(["\n"] * (last - first)), *lines[last:]])


@contextlib.contextmanager
def source_shown(mutant: Mutant) -> Iterator[None]:
    """While inside, Python's line cache holds the mutant's text for the module's file."""
    with text_shown(source_path(mutant.module), mutated_source(mutant)):
        yield


def mutated_module(mutant: Mutant) -> types.ModuleType:
    """A fresh module object running the mutant's text, compiled with the real file name."""
    return fresh_module(mutant.module, mutated_source(mutant))


def fresh_module(module_name: str, text: str | None = None) -> types.ModuleType:
    """A new module object running ``text`` (the installed source if None) under the
    module's real file name: stand-ins set on it leave jax's own module untouched."""
    path = source_path(module_name)
    code = compile(path.read_text() if text is None else text, str(path), "exec")
    return run_as_module(module_name, code)  # jax's own code, at most one site changed


def names_line(message: str, mutant: Mutant) -> bool:
    """The message names ``FILE:LINE`` for a line to fix (see the module's docstring)."""
    base = re.escape(source_path(mutant.module).name)
    named = [int(n) for n in re.findall(rf"\b{base}:(\d+)\b", message)]
    spans = (mutant.lines, *mutant.neighbours) if mutant.removes else (mutant.lines,)
    return any(first <= n <= last for n in named for first, last in spans)


# ====================================================================== drivers


@dataclasses.dataclass(frozen=True)
class Run:
    """A kernel call built from a (possibly mutated) module: ``fn(*args)`` should give
    ``want`` (float32, to ``rtol``/``atol``)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    want: Any


def ragged_dot(mod: types.ModuleType) -> Run:
    import jax
    import jax.numpy as jnp
    import numpy as np

    key_l, key_r = jax.random.split(jax.random.PRNGKey(0))
    lhs = jax.random.normal(key_l, (128, 128), jnp.float16)
    rhs = jax.random.normal(key_r, (2, 128, 128), jnp.float16)
    sizes = jnp.array([64, 64], jnp.int32)

    def fn(lhs: Any, rhs: Any, sizes: Any) -> Any:
        return mod.ragged_dot(
            lhs, rhs, group_sizes=sizes, block_m=64, block_n=64, block_k=64,
            max_concurrent_steps=2, grid_block_n=1,
        )  # fmt: skip

    want = np.concatenate([f32(lhs[:64]) @ f32(rhs[0]), f32(lhs[64:]) @ f32(rhs[1])])
    return Run(fn, (lhs, rhs, sizes), want)


def hopper_matmul(mod: types.ModuleType) -> Run:
    """With ``c`` given, so the epilogue's copy-in barrier (``c_barrier``) is used; one
    SM, so one block runs both output tiles in turn; three epilogue tiles per tile on
    two slots, so each store wait matters (with an even count, the next tile's first
    slot is never the one still being stored, and the wait before the epilogue is moot)."""
    import jax
    import jax.numpy as jnp

    setattr(mod, "get_num_sms", lambda: 1)
    config = mod.TuningConfig(
        tile_m=192, tile_n=64, tile_k=64, max_concurrent_steps=2, epi_tile_m=64, epi_tile_n=64
    )
    key_a, key_b, key_c = jax.random.split(jax.random.PRNGKey(1), 3)
    a = jax.random.normal(key_a, (384, 128), jnp.float16)
    b = jax.random.normal(key_b, (128, 128), jnp.float16)
    c = jax.random.normal(key_c, (384, 128), jnp.float16)
    want = f32(a) @ f32(b) + f32(c)
    return Run(lambda a, b, c: mod.matmul(a, b, c, config), (a, b, c), want)


def transposed_ragged_dot(mod: types.ModuleType) -> Run:
    import jax
    import jax.numpy as jnp
    import numpy as np

    setattr(mod, "jax", JaxWithDevices(2))
    key_l, key_r = jax.random.split(jax.random.PRNGKey(2))
    lhs = jax.random.normal(key_l, (256, 128), jnp.float16)
    rhs = jax.random.normal(key_r, (256, 128), jnp.float16)
    sizes = jnp.array([96, 160], jnp.int32)

    def fn(lhs: Any, rhs: Any, sizes: Any) -> Any:
        return mod.transposed_ragged_dot(
            lhs, rhs, group_sizes=sizes, block_m=64, block_n=64, block_k=64,
            max_concurrent_steps=2, grid_block_n=1,
        )  # fmt: skip

    want = np.stack([f32(lhs[:96]).T @ f32(rhs[:96]), f32(lhs[96:]).T @ f32(rhs[96:])])
    return Run(fn, (lhs, rhs, sizes), want)


def hopper_mixed_type_matmul(mod: types.ModuleType) -> Run:
    import jax
    import jax.numpy as jnp

    device = types.SimpleNamespace(core_count=2)
    setattr(mod, "backend", types.SimpleNamespace(get_default_device=lambda: device))
    config = mod.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    key_a, key_b = jax.random.split(jax.random.PRNGKey(3))
    a = jax.random.randint(key_a, (256, 256), -8, 8, jnp.int8)
    b = jax.random.normal(key_b, (256, 256), jnp.bfloat16)

    def fn(a: Any, b: Any) -> Any:
        return mod.mixed_matmul_kernel(a, b, out_dtype=jnp.bfloat16, config=config)

    return Run(fn, (a, b), f32(a) @ f32(b))


def blackwell_matmul(mod: types.ModuleType) -> Run:
    import jax
    import jax.numpy as jnp

    config = mod.TuningConfig(
        tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2, collective=False
    )
    key_a, key_b = jax.random.split(jax.random.PRNGKey(4))
    a = jax.random.normal(key_a, (256, 256), jnp.float16)
    b = jax.random.normal(key_b, (256, 256), jnp.float16)
    return Run(lambda a, b: mod.matmul_kernel(a, b, config), (a, b), f32(a) @ f32(b))


def blackwell_ragged_dot(mod: types.ModuleType) -> Run:
    """``collective=True``: without it the kernel asks for a cluster axis it never makes."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu

    setattr(mod, "jax", JaxWithDevices(4))
    config = mod.TuningConfig(
        tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2, collective=True,
        grid_tile_width=1, grid_minor_dim=blackwell_matmul_mgpu.MatmulDimension.N,
    )  # fmt: skip
    key_a, key_b = jax.random.split(jax.random.PRNGKey(5))
    a = jax.random.normal(key_a, (256, 256), jnp.float16)
    b = jax.random.normal(key_b, (2, 256, 256), jnp.float16)
    sizes = jnp.array([128, 128], jnp.int32)
    want = np.concatenate([f32(a[:128]) @ f32(b[0]), f32(a[128:]) @ f32(b[1])])
    return Run(lambda a, b, s: mod.ragged_dot_kernel(a, b, s, config), (a, b, sizes), want)
