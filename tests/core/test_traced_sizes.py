"""Copies whose size is traced (read from SMEM or computed): checked as jax lowers them,
without false alarms and without missing a static size opposite a traced one.

* T1 on a descriptor that is only waited (jax 0.10.2's wait does not compare shapes; 0.12's
  does: ``_compat.waits_compare_shapes``);
* a copy whose size is read from SMEM once per side;
* copies of a length read from SMEM (possibly 0), each handle waited.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma import _compat
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.source_lines import line_in, raising_lines

ANY = pl.BlockSpec(memory_space=pl.ANY)
STEPS, ROWS, LANES = 4, 8, 128
X = jax.ShapeDtypeStruct((STEPS * ROWS, LANES), jnp.float32)
SAFE, RAW = True, False


def _v5p() -> Any:
    """A device-free mesh naming the TPU generation (jax 0.12 asks for one to lower)."""
    return abstract_mesh((1,), ("x",), tpu="v5p")


# --- T1 on a descriptor only waited --------------------------------------------------------


SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
N = jax.ShapeDtypeStruct((1,), jnp.int32)


def _wait_only(safe: bool, seed: str = "") -> Any:
    """A copy of the first ``ROWS`` rows into ``buf`` (both sizes static), waited through a
    descriptor that names the source window with the row count read from SMEM (a traced
    size opposite ``buf``'s static one: the same byte count at run time). Seed
    ``started``: the copy is *started* with that descriptor."""

    def kernel(n_ref: Any, x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        window = x_hbm.at[pl.ds(0, n_ref[0])]
        if safe:
            start = sd.LocalCopy(x_hbm.at[pl.ds(0, ROWS)], buf, sem)
            if seed == "started":
                start = sd.LocalCopy(window, buf, sem)
            start.start()  # START
            sd.LocalCopy(window, buf, sem).started_elsewhere().wait()  # WAIT ONLY
        else:
            pltpu.make_async_copy(x_hbm.at[pl.ds(0, ROWS)], buf, sem).start()
            pltpu.make_async_copy(window, buf, sem).wait()
        o_hbm[...] = buf[...]

    entry: Any = sd.pallas_call if safe else pl.pallas_call
    return entry(
        kernel,
        in_specs=[SMEM, ANY],
        out_specs=pl.BlockSpec((ROWS, LANES), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((ROWS, LANES), jnp.float32),
        grid=(1,),
        scratch_shapes=[pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA(())],
    )


def test_a_wait_only_descriptor_with_a_traced_size_is_checked_as_its_jax_lowers_it() -> None:
    # Formerly, T1 on jax 0.10.2, whose wait (tpu.wait_dma2) lowers it; jax 0.12's
    # wait (tpu.wait_dma) is verified like a start and rejects it, raw too.
    if _compat.waits_compare_shapes():
        with pytest.raises(Exception, match="DMA source and target shape mismatch"):
            mosaic_text(_wait_only(RAW), N, X, mesh=_v5p())
        with pytest.raises(sd.CopyShapeMismatchError) as err:
            mosaic_text(_wait_only(SAFE), N, X, mesh=_v5p())
        assert line_in(_wait_only, "# WAIT ONLY") in raising_lines(err, __file__)
    else:
        assert_same_mosaic(_wait_only(SAFE), _wait_only(RAW), N, X, mesh=_v5p())


def test_a_start_with_a_traced_size_opposite_a_static_one_is_t1_at_the_start() -> None:
    with pytest.raises(sd.CopyShapeMismatchError, match=r"\(\?, 128\) and \(8, 128\)") as err:
        mosaic_text(_wait_only(SAFE, "started"), N, X, mesh=_v5p())
    assert "slice the destination with the same traced size" in str(err.value)
    # Built (jax 0.12, where a wait would fail too) or started (jax 0.10.2): the user's line.
    line = "sd.LocalCopy(window" if _compat.waits_compare_shapes() else "# START"
    assert line_in(_wait_only, line) in raising_lines(err, __file__)


# --- copies of a length read from SMEM, each handle waited ------------------------------


def _ragged(
    lens_ref: sd.DataRef, x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef
) -> None:
    handles: list[sd.LocalHandle] = []
    for i in range(buf.shape[0]):
        n = lens_ref[i]
        handles.append(sd.LocalCopy(x_hbm.at[i, pl.ds(0, n)], buf.at[i, pl.ds(0, n)], sem).start())
    for h in handles:
        h.wait()
    for i in range(buf.shape[0]):
        n = lens_ref[i]
        handles.append(sd.LocalCopy(buf.at[i, pl.ds(0, n)], o_hbm.at[i, pl.ds(0, n)], sem).start())
    for h in handles[buf.shape[0] :]:
        h.wait()


def _ragged_raw(lens_ref: Any, x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    copies = []
    for i in range(buf.shape[0]):
        n = lens_ref[i]
        c = pltpu.make_async_copy(x_hbm.at[i, pl.ds(0, n)], buf.at[i, pl.ds(0, n)], sem)
        c.start()
        copies.append(c)
    for c in copies:
        c.wait()
    copies.clear()
    for i in range(buf.shape[0]):
        n = lens_ref[i]
        c = pltpu.make_async_copy(buf.at[i, pl.ds(0, n)], o_hbm.at[i, pl.ds(0, n)], sem)
        c.start()
        copies.append(c)
    for c in copies:
        c.wait()


def _ragged_call(body: Any, entry: Any, **extra: Any) -> Any:
    def run(lens: jax.Array, x: jax.Array) -> Any:
        return entry(
            body,
            [jax.ShapeDtypeStruct(x.shape, x.dtype)],
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(1,),
                in_specs=[ANY],
                out_specs=[ANY],
                scratch_shapes=[sd.vmem(x.shape, x.dtype), sd.dma_semaphore()],
            ),
            **extra,
        )(lens, x)[0]

    return run


# The ragged copies fill each page only up to its length and the test reads only that
# part: the rest of the output is never written, which verify reports (R6).
@pytest.mark.safedma_verify_expected("UnwrittenReadError")
def test_copies_of_smem_lengths_match_raw_and_run() -> None:
    lens = jax.ShapeDtypeStruct((4,), jnp.int32)
    x = jax.ShapeDtypeStruct((4, 16, 128), jnp.float32)
    assert_same_mosaic(
        _ragged_call(_ragged, sd.pallas_call), _ragged_call(_ragged_raw, pl.pallas_call), lens, x
    )
    run = _ragged_call(_ragged, sd.pallas_call, interpret=pltpu.InterpretParams())
    values = jnp.arange(4 * 16 * 128, dtype=jnp.float32).reshape(4, 16, 128)
    out = run(jnp.array([16, 0, 8, 16], jnp.int32), values)
    np.testing.assert_array_equal(out[0], values[0])
    np.testing.assert_array_equal(out[2, :8], values[2, :8])


# --- a copy whose size is read from SMEM once per side --------------------------------


def _two_reads(
    data: sd.DataRef,
    where: sd.DataRef,
    size: sd.DataRef,
    array: sd.DataRef,
    out: sd.DataRef,
    sem: sd.SemRef,
) -> None:
    del array
    src = data.at[pl.ds(0, size[0])]  # two reads of size[0]: two tracers, equal at run time
    sd.LocalCopy(src, out.at[pl.ds(where[0], size[0])], sem).start().wait()


def _two_reads_raw(data: Any, where: Any, size: Any, array: Any, out: Any, sem: Any) -> None:
    del array
    src = data.at[pl.ds(0, size[0])]
    copy = pltpu.make_async_copy(src, out.at[pl.ds(where[0], size[0])], sem)
    copy.start()
    copy.wait()


def _dynamic_call(body: Any, entry: Any) -> Any:
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    return entry(
        body,
        jax.ShapeDtypeStruct((256, 128), jnp.int32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), smem, smem, ANY],
        out_specs=ANY,
        scratch_shapes=[sd.dma_semaphore()],
        input_output_aliases={3: 0},
    )


def test_dynamic_sizes_read_per_side_match_raw() -> None:
    args = (
        jax.ShapeDtypeStruct((8, 128), jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((256, 128), jnp.int32),
    )
    assert_same_mosaic(
        _dynamic_call(_two_reads, sd.pallas_call),
        _dynamic_call(_two_reads_raw, pl.pallas_call),
        *args,
    )


def test_a_static_size_mismatch_next_to_a_traced_size_is_still_caught() -> None:
    def narrow(
        data: sd.DataRef,
        where: sd.DataRef,
        size: sd.DataRef,
        array: sd.DataRef,
        out: sd.DataRef,
        sem: sd.SemRef,
    ) -> None:
        del array, where
        dst = out.at[pl.ds(0, size[0]), pl.ds(0, 64)]  # 64 lanes for a 128-lane source
        sd.LocalCopy(data.at[pl.ds(0, size[0])], dst, sem).start().wait()

    def rank(
        data: sd.DataRef,
        where: sd.DataRef,
        size: sd.DataRef,
        array: sd.DataRef,
        out: sd.DataRef,
        sem: sd.SemRef,
    ) -> None:
        del array, where
        sd.LocalCopy(data.at[pl.ds(0, size[0])], out.at[0], sem).start().wait()

    args = (
        jax.ShapeDtypeStruct((8, 128), jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((256, 128), jnp.int32),
    )
    with pytest.raises(sd.CopyShapeMismatchError, match=r"different shapes \(.*128\) and \(.*64\)"):
        jax.eval_shape(_dynamic_call(narrow, sd.pallas_call), *args)
    with pytest.raises(sd.CopyShapeMismatchError, match=r"and \(128,\)"):
        jax.eval_shape(_dynamic_call(rank, sd.pallas_call), *args)
