"""Garbage followed through vector code (R6): data loaded from a region nothing wrote.

Now a copy moves garbage instead of failing at its start (emit_pipeline
copies in output slots the body overwrites unread), and R6 is reported where garbage
leaves the kernel. A kernel that receives a staging buffer nothing wrote and then
*stores* it with vector code (``o_ref[...] = recv[...] + 1``) wrote its output from
the verifier's point of view, so a silent mistake, "a remote copy that sends a
staging buffer nothing ever wrote", passed clean whenever the receiver computed on the
data. Now a load of a region nothing wrote is followed through the primitives that
cannot mask it (moves, casts, sums, unary math) to the store, which makes the
destination garbage again; ``jnp.where`` and products are not followed (masked
padding is data). docs/verify-model.md, rule 12.

Also: garbage through loads, stores, rolls and bitcasts (masked ones not followed), a copy
of garbage overwritten unread (clean) or read (reported where it is read, naming the copy
that brought it), and garbage forwarded many times (the last two copies named).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import UnwrittenReadError, abstract_mesh, verify
from tests.support.source_lines import marker_line

F32 = jnp.float32
BLOCK = (8, 128)
RING = abstract_mesh((4,), ("x",))
X = jax.ShapeDtypeStruct((4 * BLOCK[0], BLOCK[1]), F32)

CONSUMERS: dict[str, Callable[[Any], Any]] = {
    "move": lambda v: v,
    "cast": lambda v: v.astype(jnp.bfloat16).astype(F32),
    "sum": lambda v: v + 1.0,
    "unary": lambda v: jnp.exp(-v),
    "reshape": lambda v: v.reshape(BLOCK[1], BLOCK[0]).T.reshape(BLOCK),
}
# a value that masks or mixes the loaded data: not followed (the kernel's own business)
MASKS: dict[str, Callable[[Any, Any], Any]] = {
    "where": lambda v, x: jnp.where(x > 0, 0.0, v),
    "product": lambda v, x: v * 0.0 + x,
    "dot": lambda v, x: jnp.dot(v, jnp.zeros((BLOCK[1], BLOCK[1]), F32)) + x,
}


def _receive_and_compute(
    consume: Callable[[Any, Any], Any], *, write_stage: bool
) -> Callable[[Any], Any]:
    """Each device sends its staging buffer to the right and computes its output from
    what it received (raw pltpu)."""

    def kernel(x_ref: Any, o_ref: Any, stage: Any, recv: Any, sems: Any) -> None:
        me = lax.axis_index("x")
        right = lax.rem(me + 1, lax.axis_size("x"))
        if write_stage:
            stage[...] = x_ref[...]
        copy = pltpu.make_async_remote_copy(stage, recv, sems.at[0], sems.at[1], device_id=(right,))
        copy.start()  # the remote copy
        copy.wait()
        o_ref[...] = consume(recv[...], x_ref[...])  # the store

    def body(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            scratch_shapes=[
                pltpu.VMEM(BLOCK, F32),
                pltpu.VMEM(BLOCK, F32),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        )(x)
        return out

    return body


def _run(body: Callable[[Any], Any]) -> Any:
    return verify(body, X, mesh=RING, in_specs=P("x"), out_specs=P("x"))


@pytest.mark.parametrize("name", sorted(CONSUMERS))
def test_an_unwritten_staging_buffer_consumed_by_vector_code_is_r6(name: str) -> None:
    consume = CONSUMERS[name]
    with pytest.raises(UnwrittenReadError) as caught:
        _run(_receive_and_compute(lambda v, x: consume(v), write_stage=False))
    text = str(caught.value)
    store = marker_line(__file__, "# the store")
    copy = marker_line(__file__, "# the remote copy")
    assert "R6" in text and "o_ref" in text and "device" in text, text
    assert f"the store at {__file__}:{store}" in text, text
    assert f"the copy at {__file__}:{copy}" in text and "from stage" in text, text
    # the fix names the buffer to write, not only the output block
    assert "Fix: write stage" in text, text


@pytest.mark.parametrize("name", sorted(CONSUMERS))
def test_the_same_kernels_with_the_staging_buffer_written_are_clean(name: str) -> None:
    consume = CONSUMERS[name]
    assert _run(_receive_and_compute(lambda v, x: consume(v), write_stage=True)).remote_dmas == 4


@pytest.mark.parametrize("name", sorted(MASKS))
def test_masked_or_mixed_garbage_is_not_followed(name: str) -> None:
    """jnp.where, products and contractions can make garbage irrelevant (masked
    padding); verify leaves them to the kernel (documented limit)."""
    assert _run(_receive_and_compute(MASKS[name], write_stage=False)).remote_dmas == 4


def _accumulate(*, init: bool, overwrite_last: bool = False) -> Callable[[Any], Any]:
    """Sums the input's row blocks into a VMEM accumulator over an "arbitrary" grid
    axis and writes it out at the last step."""

    def kernel(x_ref: Any, o_ref: Any, acc: Any) -> None:
        k = pl.program_id(0)
        if init:

            @pl.when(k == 0)
            def _() -> None:
                acc[...] = jnp.zeros(BLOCK, F32)

        acc[...] += x_ref[...]  # the accumulation

        @pl.when(k == pl.num_programs(0) - 1)
        def _() -> None:
            o_ref[...] = acc[...] if not overwrite_last else x_ref[...]

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
            grid=(4,),
            in_specs=[pl.BlockSpec(BLOCK, lambda k: (k, 0))],
            out_specs=pl.BlockSpec(BLOCK, lambda k: (0, 0)),
            scratch_shapes=[pltpu.VMEM(BLOCK, F32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        )(x)
        return out

    return fn


def test_an_accumulator_never_initialised_is_r6_where_it_leaves() -> None:
    with pytest.raises(UnwrittenReadError) as caught:
        verify(_accumulate(init=False), X)
    text = str(caught.value)
    line = marker_line(__file__, "# the accumulation")
    assert f"the store at {__file__}:{line}" in text and "from acc" in text, text
    assert "Fix: write acc" in text, text


@pytest.mark.parametrize("overwrite_last", [False, True])
def test_an_initialised_accumulator_and_overwritten_garbage_are_clean(
    overwrite_last: bool,
) -> None:
    verify(_accumulate(init=True), X)
    # garbage kept in scratch and never sent anywhere is nobody's business
    verify(_accumulate(init=False, overwrite_last=True), X)


def _sd_receive_and_add(*, write_stage: bool) -> Callable[[Any], Any]:
    """The same protocol through safedma's typed API."""

    def kernel(
        x_ref: sd.VmemRef,
        o_ref: sd.VmemRef,
        stage: sd.VmemRef,
        recv: sd.VmemRef,
        send_sem: sd.SemRef,
        recv_sem: sd.SemRef,
    ) -> None:
        if write_stage:
            stage[...] = x_ref[...]
        copy = sd.RemoteCopy(stage, recv, recv_sem).with_send_sem(send_sem)
        copy.to(sd.neighbour("x")).start().wait()  # the sd copy
        o_ref[...] = recv[...] + 1.0  # the sd store

    def body(x: jax.Array) -> jax.Array:
        out: jax.Array = sd.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            scratch_shapes=[
                pltpu.VMEM(BLOCK, F32),
                pltpu.VMEM(BLOCK, F32),
                pltpu.SemaphoreType.DMA,
                pltpu.SemaphoreType.DMA,
            ],
        )(x)
        return out

    return body


def test_the_safedma_twin_is_r6_and_its_fix_clean() -> None:
    with pytest.raises(UnwrittenReadError) as caught:
        _run(_sd_receive_and_add(write_stage=False))
    text = str(caught.value)
    assert f"the store at {__file__}:{marker_line(__file__, '# the sd store')}" in text, text
    assert f"the copy at {__file__}:{marker_line(__file__, '# the sd copy')}" in text, text
    assert _run(_sd_receive_and_add(write_stage=True)).remote_dmas == 4


# * Misses of the garbage rule (docs/verify-model.md, rule 12): ``pltpu.load`` and
#   ``pltpu.store`` (``pl.store``) bind masked_load / masked_swap, which were never
#   followed, nor were ``pltpu.roll`` and ``pltpu.bitcast``; without a mask they move
#   every element like ``ref[...]``. A masked one is still not followed: only some
#   elements move, and the masked ones are the kernel's padding.
I32 = jnp.int32


GARBAGE_PATHS: dict[str, Callable[[Any, Any], None]] = {
    "pltpu.load": lambda scratch, o_ref: o_ref.__setitem__(..., pltpu.load(scratch) + 1),
    "pltpu.store": lambda scratch, o_ref: pltpu.store(o_ref, scratch[...] + 1),
    "pltpu.roll": lambda scratch, o_ref: o_ref.__setitem__(
        ..., pltpu.roll(scratch[...], shift=3, axis=1)
    ),
    "pltpu.bitcast": lambda scratch, o_ref: o_ref.__setitem__(
        ..., pltpu.bitcast(pltpu.bitcast(scratch[...], I32), F32)
    ),
}


MASKED_PATHS: dict[str, Callable[[Any, Any], None]] = {
    "pltpu.load(mask)": lambda scratch, o_ref: o_ref.__setitem__(
        ..., pltpu.load(scratch, mask=lax.broadcasted_iota(I32, (8, 128), 0) < 0)
    ),
    "pltpu.store(mask)": lambda scratch, o_ref: (
        o_ref.__setitem__(..., jnp.zeros((8, 128), F32)),
        pltpu.store(o_ref, scratch[...], mask=lax.broadcasted_iota(I32, (8, 128), 0) < 0),
    ),
}


def _scratch_to_output(path: Callable[[Any, Any], None], *, write: bool) -> Callable[[Any], Any]:
    def kernel(x_ref: Any, o_ref: Any, scratch: Any) -> None:
        if write:
            scratch[...] = x_ref[...]
        path(scratch, o_ref)  # the garbage path

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), F32),
            scratch_shapes=[pltpu.VMEM((8, 128), F32)],
        )(x)
        return out

    return fn


SMALL = jax.ShapeDtypeStruct((8, 128), F32)


@pytest.mark.parametrize("name", sorted(GARBAGE_PATHS))
def test_garbage_through_load_store_roll_bitcast_is_r6(name: str) -> None:
    with pytest.raises(UnwrittenReadError) as caught:
        verify(_scratch_to_output(GARBAGE_PATHS[name], write=False), SMALL)
    text = str(caught.value)
    assert "R6" in text and "scratch" in text, text
    assert (
        f"called at test_garbage_flow.py:{marker_line(__file__, '# the garbage path')}" in text
    ), text


@pytest.mark.parametrize("name", sorted(GARBAGE_PATHS))
def test_the_same_paths_from_written_scratch_are_clean(name: str) -> None:
    assert verify(_scratch_to_output(GARBAGE_PATHS[name], write=True), SMALL).kernels


@pytest.mark.parametrize("name", sorted(MASKED_PATHS))
def test_masked_loads_and_stores_are_not_followed(name: str) -> None:
    assert verify(_scratch_to_output(MASKED_PATHS[name], write=False), SMALL).kernels


HERE = r"test_garbage_flow\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ------------------------------------------------ a copy of a source nothing wrote


def _staged(after: str) -> Any:
    """Copy a staging buffer nothing wrote into ``buf``, then ``after`` with ``buf``.

    ``overwrite``: write all of ``buf`` before copying it out (the copied garbage is
    never used: clean). ``read``: copy ``buf`` out (R6 at the kernel's return, naming
    both copies). ``over_written``: ``buf`` was written first, and the garbage lands on
    it before it is copied out (R6 too).
    """

    def kernel(x_hbm: Any, o_hbm: Any, stage: Any, buf: Any, sem: Any) -> None:
        if after == "over_written":
            pltpu.sync_copy(x_hbm, buf)
        c = pltpu.make_async_copy(stage, buf, sem)  # stage: nothing wrote it
        c.start()
        c.wait()
        if after == "overwrite":
            pltpu.sync_copy(x_hbm, buf)
        pltpu.sync_copy(buf, o_hbm)

    return pl.pallas_call(
        kernel,
        out_shape=_s(16, 128),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.VMEM((16, 128), F32), pltpu.VMEM((16, 128), F32)]
        + [pltpu.SemaphoreType.DMA],
    )


def test_a_copy_of_garbage_that_is_overwritten_unread_is_clean() -> None:
    assert verify(_staged("overwrite"), _s(16, 128)).dmas == 3


@pytest.mark.parametrize("after", ["read", "over_written"])
def test_garbage_a_copy_brought_is_reported_where_it_is_read(after: str) -> None:
    with pytest.raises(UnwrittenReadError) as err:
        verify(_staged(after), _s(16, 128))
    text = str(err.value)
    assert "the kernel returns output o_hbm[0:16, 0:128]" in text, text
    # handed to verify bare (no user frame around the call): the kernel's own line
    assert re.search(rf"returns output o_hbm\[0:16, 0:128\] at \S*{HERE} \(kernel\)", text), text
    assert re.search(rf"the copy at \S*{HERE}.*filled it from buf\[0:16, 0:128\]", text), text
    assert "filled it from stage[0:16, 0:128], which nothing wrote" in text, text


def test_garbage_forwarded_many_times_names_the_last_two_copies_only() -> None:
    """A note per hop would grow with every copy of a ring forwarding padding."""

    def kernel(x_hbm: Any, o_hbm: Any, bufs: Any, sem: Any) -> None:
        for hop in range(5):  # bufs[0] (never written) -> bufs[1] -> ... -> bufs[5]
            pltpu.sync_copy(bufs.at[hop], bufs.at[hop + 1])
        pltpu.sync_copy(bufs.at[5], o_hbm)
        del x_hbm, sem

    call = pl.pallas_call(
        kernel,
        out_shape=_s(8, 128),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.VMEM((6, 8, 128), F32), pltpu.SemaphoreType.DMA],
    )
    with pytest.raises(UnwrittenReadError) as err:
        verify(call, _s(8, 128))
    assert str(err.value).count("the copy at") == 2, err.value
