"""Benchmark 1 as a test: every registered kernel stays identical to its pltpu twin.

Runs the identity benchmark (benchmarks/identity.py) over the kernel registry
(benchmarks/kernels.py): the Mosaic module and the generated TPU code size of
each safedma kernel must equal its hand-written twin's, on v6e:2x2 here and
on the whole topology matrix in the slow test. Also checks that the registry
covers every kernel of the project, that a real difference is reported as a
failure with a diff, and that benchmarks 2 and 3 compare like with like (their
safedma and pltpu kernels lower to the same Mosaic).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.support import kernels_safedma  # noqa: E402

from benchmarks import identity  # noqa: E402
from benchmarks.kernels import CASES, Built, registry  # noqa: E402
from safedma.testing import abstract_mesh, assert_same_mosaic  # noqa: E402

BUILT, MISSING = registry()
IDS = [b.case.name for b in BUILT]


def _library_modules() -> set[str]:
    # Private modules (_preconditions, _typed_jax, ...) are the kernels' helpers, not kernels.
    return {
        p.stem
        for p in (Path(__file__).resolve().parents[2] / "safedma" / "kernels").glob("*.py")
        if not p.stem.startswith("_")
    }


def test_registry_covers_every_kernel_of_the_project() -> None:
    core = {
        name
        for name, fn in vars(kernels_safedma).items()
        if inspect.isfunction(fn) and fn.__module__ == "kernels_safedma"
    }
    names = {c.name for c in CASES}
    assert core <= names, (
        f"tests/kernels_safedma.py kernels missing from the registry: "
        f"{sorted(core - names)} (add one KernelCase to benchmarks/kernels.py)"
    )
    built = {b.case.source for b in BUILT}
    not_built = sorted(m for m in _library_modules() if f"safedma/kernels/{m}.py" not in built)
    reasons = {m.source: m.reason for m in MISSING}
    assert not not_built, (
        "safedma/kernels modules with no working registry entry: "
        + "; ".join(
            f"{m}: {reasons.get(f'safedma/kernels/{m}.py', 'no KernelCase in benchmarks/kernels.py')}"
            for m in not_built
        )
        + " (see benchmarks/README.md, 'Adding a kernel')"
    )


@pytest.mark.parametrize("built", BUILT, ids=IDS)
def test_identical_to_its_twin_on_v6e(built: Built) -> None:
    result = identity.run_case(built, ["v6e:2x2"])
    assert result.mosaic and result.code_size, result
    assert result.ok, "\n\n".join(result.errors + result.diffs)
    assert all(c["ratio"] == 1 for c in result.code_size.values())


@pytest.mark.slow
@pytest.mark.parametrize("built", BUILT, ids=IDS)
def test_identical_to_its_twin_on_every_topology(built: Built) -> None:
    topologies = list(identity.TOPOLOGIES)
    if built.case.collective:
        topologies += list(identity.COLLECTIVE_TOPOLOGIES)
    result = identity.run_case(built, topologies)
    assert set(result.code_size) == set(topologies), result.errors
    assert result.ok, "\n\n".join(result.errors + result.diffs)


def test_a_different_kernel_is_reported_with_a_diff() -> None:
    """Not vacuous: a twin with another body fails, and the failure carries the diff."""
    scale = next(b for b in BUILT if b.case.name == "scale_copy")
    other = next(b for b in BUILT if b.case.name == "double_buffered")
    result = identity.run_case(Built(scale.case, scale.safedma, other.twin), ["v6e:2x2"])
    assert not result.ok
    assert not result.mosaic[4]["identical"]
    assert any("enqueue_dma" in d and "\n-" in d and "\n+" in d for d in result.diffs)


def test_overhead_benchmark_pairs_lower_alike() -> None:
    """Benchmark 2 times the same program written two ways."""
    from benchmarks import overhead_kernels as k

    assert_same_mosaic(k.make_straight_safedma(), k.make_straight_pltpu(), k.STRAIGHT_INPUT)
    assert_same_mosaic(k.make_loop_safedma(), k.make_loop_pltpu(), k.LOOP_INPUT)
    mesh = abstract_mesh((4,), ("x",))
    x = jax.ShapeDtypeStruct(
        (4 * k.REMOTE_BLOCK[0], k.COLS), jnp.float32, sharding=NamedSharding(mesh, P("x"))
    )

    def mapped(f: Callable[..., object]) -> Callable[..., object]:
        return jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)

    assert_same_mosaic(mapped(k.make_remote_safedma()), mapped(k.make_remote_pltpu()), x)


def test_typecheck_benchmark_files_lower_alike() -> None:
    """Benchmark 3 type-checks the same kernels written two ways."""
    from benchmarks.typecheck_files import kernels_pltpu as b
    from benchmarks.typecheck_files import kernels_safedma as a

    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    assert_same_mosaic(a.add_stream, b.add_stream, x, x)
    pages = jax.ShapeDtypeStruct((16, 8, 128), jnp.float32)
    assert_same_mosaic(a.gather, b.gather, pages, jax.ShapeDtypeStruct((4,), jnp.int32))
    mesh = abstract_mesh((4,), ("x",))
    xs = jax.ShapeDtypeStruct((32, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    assert_same_mosaic(
        jax.shard_map(a.all_gather, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False),
        jax.shard_map(b.all_gather, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False),
        xs,
    )
