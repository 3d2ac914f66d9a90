"""DMA futures under verify: a copy left in flight between two calls is checked across
them.

* a future whose destination is a VMEM-resident output: Pallas copies nothing out of it
  while the copy is in flight;
* a chunked copy as a future (``distributed/kv_transfer.py``): a ``pl.loop`` over a chunk
  count from SMEM starts every chunk on one semaphore the call returns, a second call
  rebuilds and waits each; an XLA operation reading the array between them is checked.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import LeftoverSemaphoreError, RaceDetectedError, abstract_mesh, verify
from tests.support.source_lines import marker_line

F32 = jnp.float32
HERE = r"test_futures\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
X = jax.ShapeDtypeStruct((8, 128), F32)


# ------------------------------------------------- DMA future into a VMEM output


def _future_into_vmem(*, wait: bool, touch: bool) -> Any:
    """Start a copy of ``x`` into a VMEM-resident output; a second call waits for it."""

    def start_kernel(x_ref: Any, x_alias: Any, o_ref: Any, sem: Any) -> None:
        del x_alias
        pltpu.make_async_copy(x_ref, o_ref, sem).start()
        if touch:
            o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)  # while the copy writes it

    def done_kernel(x_ref: Any, o_ref: Any, sem: Any, o_alias: Any) -> None:
        del o_alias
        if wait:
            pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    def fn(x: Any) -> Any:
        x, out, sem = pl.pallas_call(
            start_kernel,
            out_shape=(
                jax.ShapeDtypeStruct(x.shape, x.dtype),
                pltpu.VMEM(x.shape, x.dtype),
                pltpu.SemaphoreType.DMA(()),
            ),
            in_specs=[ANY],
            out_specs=(ANY, VMEM, SEM),
            input_output_aliases={0: 0},
        )(x)
        return pl.pallas_call(
            done_kernel,
            out_shape=pltpu.VMEM(x.shape, x.dtype),
            in_specs=[ANY, VMEM, SEM],
            out_specs=VMEM,
            input_output_aliases={1: 0},
        )(x, out, sem)

    return fn


def test_a_future_into_a_vmem_output_is_not_copied_out_while_in_flight() -> None:
    report = verify(_future_into_vmem(wait=True, touch=False), X)
    assert (report.dmas, report.waits) == (1, 1)


def test_a_future_into_a_vmem_output_never_waited_is_caught() -> None:
    # the second call returns the buffer the copy may still write
    with pytest.raises((RaceDetectedError, LeftoverSemaphoreError), match=HERE):
        verify(_future_into_vmem(wait=False, touch=False), X)


def test_a_store_into_a_vmem_output_in_flight_is_caught() -> None:
    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_future_into_vmem(wait=True, touch=True), X)


HBM = pl.BlockSpec(memory_space=pltpu.HBM)


def _at(marker: str) -> str:
    """``path:line`` of the line carrying ``# <- marker`` in this file (as messages print it)."""
    return f"{__file__}:{marker_line(__file__, f'# <- {marker}')}"


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# --------------------------------------------------- a chunked copy as a DMA future


def _start_kernel(
    n: Any, so: Any, do: Any, sz: Any, src: Any, dep: Any, dst: Any, *rest: Any
) -> None:
    sem = rest[-1]

    @pl.loop(0, n[0])
    def _(i: Any) -> None:
        c = pltpu.make_async_copy(src.at[pl.ds(so[i], sz[i])], dst.at[pl.ds(do[i], sz[i])], sem)
        c.start()  # <- chunk start


def _wait_kernel(
    n: Any,
    so: Any,
    do: Any,
    sz: Any,
    src: Any,
    dep: Any,
    dst: Any,
    sem: Any,
    out: Any,
    *,
    short: bool,
) -> None:
    @pl.loop(0, n[0] - 1 if short else n[0])
    def _(i: Any) -> None:
        pltpu.make_async_copy(src.at[pl.ds(so[i], sz[i])], dst.at[pl.ds(do[i], sz[i])], sem).wait()


def _chunked(n: Any, so: Any, do: Any, sz: Any, src: Any, dep: Any, dst: Any, *, seed: str) -> Any:
    sem_spec = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
    dst, sem = pl.pallas_call(
        _start_kernel,
        out_shape=(jax.ShapeDtypeStruct(dst.shape, F32), pltpu.SemaphoreType.DMA(())),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(1,), in_specs=[HBM] * 3, out_specs=(HBM, sem_spec)
        ),
        input_output_aliases={6: 0},
        compiler_params=pltpu.CompilerParams(has_side_effects=True),
    )(n, so, do, sz, src, dep, dst)
    early = None
    if seed == "read_in_flight":
        early = dst[0:8] * 2.0  # <- chunk early read
    if seed == "read_untouched":
        early = dst[56:64] * 2.0  # rows no chunk writes
    if seed in ("dynamic_untouched", "dynamic_in_flight"):
        row = lax.axis_index("x") * 0 + (56 if seed == "dynamic_untouched" else 20)
        early = lax.dynamic_slice_in_dim(dst, row, 8) * 2.0  # <- chunk dynamic read
    out = pl.pallas_call(  # <- chunk wait call
        functools.partial(_wait_kernel, short=seed == "one_short"),
        out_shape=jax.ShapeDtypeStruct(dst.shape, F32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(1,), in_specs=[HBM] * 3 + [sem_spec], out_specs=HBM
        ),
        input_output_aliases={6: 0},
        compiler_params=pltpu.CompilerParams(has_side_effects=True),
    )(n, so, do, sz, src, dep, dst, sem)
    if seed == "read_after_wait":
        early = out[0:8] * 2.0
    return out if early is None else (out, early)


def _verify_chunked(seed: str = "", devices: tuple[int, ...] = (2,), overlap: bool = False) -> Any:
    count = int(np.prod(devices))
    names = ("x", "y")[: len(devices)]
    dests = [16, 0, 8 if overlap else 40, 24]
    two = seed.startswith(("read_", "dynamic_"))
    return verify(
        functools.partial(_chunked, seed=seed),
        jnp.array([4], jnp.int32),
        jnp.array([0, 8, 24, 40], jnp.int32),
        jnp.array(dests, jnp.int32),
        jnp.array([8, 16, 8, 16], jnp.int32),
        _s(64 * count, 128),
        _s(8 * count, 128),
        _s(64 * count, 128),
        mesh=abstract_mesh(devices, names),
        in_specs=(P(),) * 4 + (P(names),) * 3,
        out_specs=(P(names), P(names)) if two else P(names),
    )


@pytest.mark.parametrize("devices", [(1,), (2,), (4,), (2, 2)])
def test_chunked_copy_future_is_clean(devices: tuple[int, ...]) -> None:
    assert _verify_chunked(devices=devices).dmas == 4 * int(np.prod(devices))


@pytest.mark.parametrize("seed", ["read_untouched", "read_after_wait", "dynamic_untouched"])
def test_reading_a_futures_array_where_no_copy_is_in_flight_is_clean(seed: str) -> None:
    assert _verify_chunked(seed).dmas == 8


def test_reading_a_futures_array_before_its_wait_is_a_race_at_the_users_line() -> None:
    """an XLA operation on the array the start call returned, between the two
    calls, reads rows a chunk is still writing; it was not checked at all."""
    with pytest.raises(RaceDetectedError) as err:
        _verify_chunked("read_in_flight")
    text = str(err.value)
    assert f"slice at {_at('chunk early read')} (" in text, text
    assert "reads it outside any kernel while the copy" in text, text
    assert "read what the kernel that waits the copy returns" in text, text
    assert f"the copy started at {_at('chunk start')}" in text and "device 1 (x=1)" in text, text


def test_a_dynamic_slice_of_a_futures_array_reads_its_window() -> None:
    """Rows 20:28 (from a start computed per device) overlap the chunk into 16:24."""
    with pytest.raises(RaceDetectedError) as err:
        _verify_chunked("dynamic_in_flight")
    text = str(err.value)
    assert "dst[20:28, 0:128]" in text, text
    assert f"dynamic_slice at {_at('chunk dynamic read')} (" in text, text


def test_a_chunk_left_unwaited_is_reported_at_the_wait_calls_return() -> None:
    with pytest.raises(RaceDetectedError) as err:
        _verify_chunked("one_short")
    text = str(err.value)
    assert f"returns it at the end of kernel _wait_kernel ({_at('chunk wait call')}" in text, text
    assert _at("chunk start") in text and "released by whichever land first" in text, text


def test_overlapping_chunks_are_a_race_naming_the_start() -> None:
    with pytest.raises(RaceDetectedError) as err:
        _verify_chunked(overlap=True)
    text = str(err.value)
    assert "dst[8:16, 0:128]" in text and _at("chunk start") in text, text
