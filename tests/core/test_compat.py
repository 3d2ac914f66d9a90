"""safedma's use of jax internals, pinned: fails loudly if a jax release moves them.

Each product names jax internals in one module, its seam (``SEAMS`` below):
``safedma._compat`` for the typed API and the trace checks, and the seams of verify,
simulate, the Mosaic tools, the mypy plugin, the sanitizer, the suite verifier, verify_gpu
and the typed GPU layer. Only the seams import ``jax._src``;
every private name they import resolves; and what each reads while jax traces is
pinned by running it. If one of these tests fails after a jax upgrade, the seam it
names is the place to adapt.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import pytest
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

import safedma as sd
from safedma import _compat
from safedma._compat import SemaphoreKind
from safedma._private_jax import PrivateModule

HBM = pl.BlockSpec(memory_space=pl.ANY)


def test_the_features_are_probed_not_read_off_the_version() -> None:
    """What each jax in the matrix has: 0.11.2 takes barrier tags like 0.12 but lowers
    waits and (lacks) push streams like 0.10.2."""
    version = tuple(int(p) for p in jax.__version__.split(".")[:2])
    assert _compat.barrier_tags_supported() == (version >= (0, 11))
    assert _compat.waits_compare_shapes() == (version >= (0, 12))
    assert _compat.push_streams_supported() == (version >= (0, 12))


def test_brands_are_identity_at_run_time() -> None:
    marker = object()
    for brand in (
        sd.SemRef,
        sd.SemArray,
        sd.RegularSem,
        sd.RegularSemArray,
        sd.BarrierSem,
        sd.DataRef,
    ):
        assert brand(marker) is marker  # type: ignore[arg-type]


def test_ref_kinds_and_roots_inside_a_kernel() -> None:
    seen: dict[str, object] = {}

    def body(x, o, dma, dmas, reg, buf):  # type: ignore[no-untyped-def]
        view = dmas.at[1]
        seen.update(
            x=_compat.ref_kind(x),
            dma=_compat.ref_kind(dma),
            view=_compat.ref_kind(view),
            reg=_compat.ref_kind(reg),
            buf=_compat.ref_kind(buf),
            value_is_ref=_compat.is_ref(x[...]),
            view_is_ref=_compat.is_ref(view),
            root_is_array=_compat.root_of(view) is dmas,
            plain_root=_compat.root_of(x) is x,
            view_shape=tuple(view.shape),
            barrier=_compat.ref_kind(pltpu.get_barrier_semaphore()),
        )
        c = pltpu.make_async_copy(x, o, dma)
        c.start()
        c.wait()

    x = jnp.zeros((8, 128), jnp.float32)
    call = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.REGULAR(()),
            pltpu.VMEM((8, 128), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )
    jax.jit(call).trace(x)
    assert seen == dict(
        x=SemaphoreKind.DATA,
        dma=SemaphoreKind.DMA,
        view=SemaphoreKind.DMA,
        reg=SemaphoreKind.REGULAR,
        buf=SemaphoreKind.DATA,
        value_is_ref=False,
        view_is_ref=True,
        root_is_array=True,
        plain_root=True,
        view_shape=(),
        barrier=SemaphoreKind.BARRIER,
    )


def test_ref_layout_agrees_with_the_views_own_type() -> None:
    # ref_layout's fast path reads the indexer instead of the view's type; both
    # must give the same (shape, dtype) for every kind of view a kernel makes.
    pairs: list[tuple[str, object, object]] = []

    def body(x, i_ref, o, dmas, buf):  # type: ignore[no-untyped-def]
        i = i_ref[0]
        views = {
            "plain": x,
            "rows": x.at[pl.ds(8, 8)],
            "int": x.at[3],
            "strided": x.at[pl.ds(0, 4, 2)],
            "traced start": x.at[pl.ds(i, 8)],
            "int and slice": buf.at[1, pl.ds(0, 4)],
            "last dim": x.at[:, pl.ds(0, 128)],
            "nested": x.at[pl.ds(8, 16)].at[pl.ds(0, 8)],
            "sem view": dmas.at[1],
            "sem array": dmas,
            "sem slice": dmas.at[pl.ds(0, 2)],
            "bitcast": x.bitcast(jnp.int32),
            "reshape": buf.reshape(16, 128),
        }
        for name, view in views.items():
            fast = _compat.ref_layout(view)
            pairs.append((name, fast, (tuple(view.shape), view.dtype)))
        o[...] = x[...]

    x = jnp.zeros((32, 128), jnp.float32)
    call = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.SemaphoreType.DMA((3,)), pltpu.VMEM((2, 8, 128), jnp.float32)],
    )
    jax.jit(call).trace(x, jnp.zeros((1,), jnp.int32))
    assert len(pairs) == 13
    for name, fast, slow in pairs:
        assert fast == slow, name


def test_axes_in_scope_follow_the_mesh_order() -> None:
    seen: list[dict[str, int]] = []
    mesh = jax.make_mesh((2, 4), ("y", "x"), devices=jax.devices()[:8])

    def per_device(block: jax.Array) -> jax.Array:
        seen.append(dict(_compat.axes_in_scope()))
        return block

    x = jax.device_put(np.zeros((8, 8), np.float32), NamedSharding(mesh, P("y", "x")))
    jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=P("y", "x"), out_specs=P("y", "x"))
    ).trace(x)
    assert seen == [{"y": 2, "x": 4}]
    assert list(seen[0]) == ["y", "x"]
    assert dict(_compat.axes_in_scope()) == {}


# --- every seam: each product's jax internals, in its one module ----------------------

REPO_PACKAGE = Path(sd.__file__).resolve().parent

# The one module of each product that may name jax internals, and what it serves.
SEAMS = {
    "safedma._compat": "the typed API and the trace checks",
    "safedma.testing._verify.jax_internals": "verify",
    "safedma.testing._interpret_probes": "simulate",
    "safedma.testing._mosaic": "Mosaic identity and compile-only builds",
    "safedma.mypy_plugin": "the mypy plugin (the class jax.Array is reported as)",
    "safedma._sanitize._jax": "the sanitizer",
    "safedma.testing._suite._jax": "verifying every kernel a test suite runs",
    "safedma.testing._gpu.jax_seam": "verify_gpu (Pallas GPU kernels)",
    "safedma.gpu._jax_seam": "the typed Pallas GPU layer (safedma.gpu)",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _code_strings(tree: ast.AST) -> Iterator[ast.Constant]:
    """String constants of the code, docstrings left out."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node


def _private_imports(tree: ast.AST) -> Iterator[tuple[str, str | None, str]]:
    """(private module, name imported from it or None, local name) of each import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full.startswith("jax._src"):
                    yield node.module, alias.name, alias.asname or alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("jax._src"):
                    yield alias.name, None, alias.asname or alias.name


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at import: the module's own, and those of its ``if`` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _module_level(node.body)
            yield from _module_level(node.orelse)


def _lazy_modules(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(local name, private module) of each module-level ``name = PrivateModule("...")``
    (a module that one supported jax lacks is bound in the function that needs it)."""
    for node in _module_level(tree.body):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        if call.func.id != "PrivateModule" or not call.args:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if isinstance(call.args[0], ast.Constant):
            for target in targets:
                if isinstance(target, ast.Name):
                    yield target.id, str(call.args[0].value)


def _names_jax_internals(tree: ast.AST) -> bool:
    return any(True for _ in _private_imports(tree)) or any(
        str(c.value).startswith("jax._src") for c in _code_strings(tree)
    )


def test_only_the_seams_name_jax_internals() -> None:
    """A module that imports ``jax._src`` (or names a module of it) is one of the seams:
    a jax release that moves a private name then breaks one known module per product."""
    naming = set()
    for path in sorted(REPO_PACKAGE.rglob("*.py")):
        if "stubs" in path.relative_to(REPO_PACKAGE).parts:
            continue
        if _names_jax_internals(ast.parse(path.read_text(encoding="utf-8"))):
            naming.add(_module_name(path))
    assert naming == set(SEAMS)


@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_every_private_name_a_seam_reads_from_jax_exists(seam: str) -> None:
    """Each ``from jax._src... import x as y`` of the seam resolves, so does every
    attribute the seam reads off such a module (``y.name``), and every private module it
    looks up by a literal name."""
    module = importlib.import_module(seam)
    tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
    bound: dict[str, object] = {}
    for private, name, local in _private_imports(tree):
        owner = importlib.import_module(private)
        if name is None:
            bound[local] = owner
            continue
        value = getattr(owner, name, None)
        if value is None:
            value = importlib.import_module(f"{private}.{name}")
        bound[local] = value
    # modules bound lazily (safedma._private_jax.PrivateModule): ``y = PrivateModule("...")``
    for local, private in _lazy_modules(tree):
        bound.setdefault(local, importlib.import_module(private))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            holder = bound.get(node.value.id)
            if holder is not None and node.attr not in vars(PrivateModule):
                assert hasattr(holder, node.attr), f"{seam}: {node.value.id}.{node.attr}"
    # modules looked up by name at run time (safedma.testing._private.private_module)
    from safedma.testing._private import private_module

    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "private_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            private_module(str(node.args[0].value))  # PrivateJaxApiError if it moved


def test_the_typed_api_seam_reads_a_body_being_traced() -> None:
    """What the raw-wait analysis (safedma/_raw_waits.py) reads through the seam: the
    equations traced so far, their operand tracers, a tracer's trace and jaxpr variable,
    the jaxprs of a branch, who emitted an equation, semaphore variables."""
    seen: dict[str, object] = {}
    here = str(Path(__file__).resolve())

    def body(x, flag, o, sem):  # type: ignore[no-untyped-def]
        frame = _compat.current_frame()
        before = _compat.traced_so_far(frame)
        copy = pltpu.make_async_copy(x, o, sem)
        copy.start()

        @pl.when(flag[0] == 0)
        def _() -> None:
            copy.wait()

        eqns = _compat.traced_eqns(frame, before)
        start = next(e for e in eqns if e.primitive.name == "dma_start")
        branch = next(e for e in eqns if e.primitive.name == "cond")
        inner = [j for j in _compat.sub_jaxprs(branch.params)]
        wait = next(e for j in inner for e in j.eqns if e.primitive.name == "dma_wait")
        seen.update(
            counted=_compat.traced_so_far(frame) - before == len(eqns),
            operands=any(t is sem for t in _compat.operand_tracers(start)),
            trace=_compat.trace_of(sem) is not None and _compat.trace_of(3) is None,
            var=_compat.jaxpr_var_of(sem) is not None,
            jaxprs=bool(inner) and all(_compat.is_jaxpr(j) for j in inner),
            emitted=_compat.emitted_from(start, lambda f: str(Path(f).resolve()) == here),
            semaphore_var=sum(_compat.is_semaphore_var(v) for v in wait.invars),
            view_base=_compat.view_base(sem.at[()]) is sem,
            entry=_compat.enclosing_entry()[0],
        )
        o[...] = x[...]

    x = jnp.zeros((8, 128), jnp.float32)
    call = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM, pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )
    jax.jit(call).trace(x, jnp.zeros((1,), jnp.int32))
    assert seen == dict(
        counted=True,
        operands=True,
        trace=True,
        var=True,
        jaxprs=True,
        emitted=True,
        semaphore_var=1,
        view_base=True,
        entry="pallas_call",
    )


def _kernel_eqn() -> object:
    def kernel(x_ref, o_ref, copy_sem):  # type: ignore[no-untyped-def]
        c = pltpu.make_async_copy(x_ref, o_ref, copy_sem)
        c.start()
        c.wait()

    x = jnp.zeros((8, 128), jnp.float32)
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        compiler_params=pltpu.CompilerParams(collective_id=7),
    )
    jaxpr = jax.make_jaxpr(call)(x).jaxpr
    return next(e for e in jaxpr.eqns if e.primitive.name == "pallas_call")


def test_the_verify_seam_reads_a_pallas_call() -> None:
    from safedma.testing._user_frames import traceback_frames, user_frame_of
    from safedma.testing._verify import jax_internals as jx

    eqn: Any = _kernel_eqn()
    params = jx.kernel_params(eqn)
    body, _ = jx.jaxpr_of(params["jaxpr"])
    avals = [v.aval for v in body.invars]
    assert (params["num_inputs"], params["num_outputs"], params["num_scratch"]) == (1, 1, 1)
    assert params["collective_id"] == 7
    assert [b["space"] for b in params["blocks"]] == ["ANY", "ANY"]
    assert jx.kernel_param_names(body) == ("x_ref", "o_ref", "copy_sem")
    assert [jx.semaphore_kind(a) for a in avals] == [None, None, "DMA"]
    start = next(e for e in body.eqns if e.primitive.name == "dma_start")
    assert "test_compat.py" in (user_frame_of(traceback_frames(start.source_info)) or "")


def test_the_simulate_seam_finds_every_name_it_patches() -> None:
    from safedma.testing import _interpret_probes as probes

    for probe in probes._PROBES:
        if probe.only_if():
            probes._target(probe)  # PrivateJaxApiError naming the name if jax moved it
    probes._check_signatures()


def test_the_mosaic_seam_opens_its_mlir_context() -> None:
    from jax.extend.mlir import ir

    from safedma.testing._mosaic import mosaic_ir_context

    with mosaic_ir_context() as ctx:
        assert isinstance(ctx, ir.Context)
        assert ctx.allow_unregistered_dialects


def test_the_mypy_plugin_names_the_class_jax_array_is() -> None:
    """mypy reports ``jax.Array`` by where jax's stubs define it (``jax._src.basearray``);
    the plugin recognises an array by those names."""
    from safedma import mypy_plugin

    for name in mypy_plugin._ARRAY_TYPES:
        module, _, attr = name.rpartition(".")
        assert getattr(importlib.import_module(module), attr) is jax.Array, name
