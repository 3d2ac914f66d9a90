"""A race reported by simulate names the user's line of BOTH accesses.

jax names the earlier access of a race only by the frame it formatted when
the access was recorded (the first frame outside jax).  For a copy built with
safedma that frame is safedma's own ``start``, so the message named the later
access alone; for a copy a kernel's helper starts, it is the helper's line.
Each kernel here has a raw-pltpu twin, which must read the same.
"""

from __future__ import annotations

from typing import Any

import jax
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh

import safedma as sd
from safedma.testing import RaceDetectedError, simulate, verify
from tests.support import dma_helpers
from tests.support.simulation import BLOCK, F32, dma, example, hbm_call, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


def _race(call: Any, **kwargs: Any) -> str:
    with pytest.raises(RaceDetectedError) as caught:
        simulate(call, example(kwargs.pop("shape", BLOCK)), **kwargs)
    return str(caught.value)


def _vmem_out(kernel: Any) -> Any:
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM(BLOCK, F32), *dma(1)],
    )


# --------------------- a copy, then a read of its destination before its wait


def _sd_then_read(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
    fetch = sd.LocalCopy(x_ref, buf, sem).start()  # the fetch
    o_ref[...] = buf[...]  # read in flight
    fetch.wait()


def _raw_then_read(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
    fetch = pltpu.make_async_copy(x_ref, buf, sem)
    fetch.start()  # the fetch
    o_ref[...] = buf[...]  # read in flight
    fetch.wait()


@pytest.mark.parametrize(
    "kernel",
    [_sd_then_read, sd.checked(_sd_then_read), _raw_then_read],
    ids=["sd", "sd-checked", "raw"],
)
def test_a_read_racing_a_copy_names_the_read_and_the_copys_start(kernel: Any) -> None:
    body = getattr(kernel, "__wrapped__", kernel)
    message = _race(_vmem_out(kernel))
    assert f"at {line_of(body, '# read in flight')} " in message, message
    assert f"(the copy or access at {line_of(body, '# the fetch')} " in message, message
    assert "safedma/_copies.py" not in message, message


# --------------------- two copies: the second reads what the first still writes


def _sd_two_copies(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
    fetch = sd.LocalCopy(x_ref, buf, sem).start()  # the fetch
    sd.LocalCopy(buf, o_ref, out_sem).start().wait()  # the copy out
    fetch.wait()


def _raw_two_copies(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
    fetch = pltpu.make_async_copy(x_ref, buf, sem)
    fetch.start()  # the fetch
    out = pltpu.make_async_copy(buf, o_ref, out_sem)
    out.start()  # the copy out
    out.wait()
    fetch.wait()


@pytest.mark.parametrize("kernel", [_sd_two_copies, _raw_two_copies], ids=["sd", "raw"])
def test_two_racing_copies_name_both_starts(kernel: Any) -> None:
    message = _race(hbm_call(kernel, [pltpu.VMEM(BLOCK, F32), *dma(2)]))
    assert f"at {line_of(kernel, '# the copy out')} " in message, message
    assert f"(the copy or access at {line_of(kernel, '# the fetch')} " in message, message
    # jax's own report names the user's lines too
    report = message.split("Interpret mode's report:", 1)[-1]
    assert line_of(kernel, "# the fetch") in report, message


# --------------------- the earlier copy started by a helper: the helper and its caller


def _sd_fetch(src: Any, dst: Any, sem: Any) -> Any:
    return sd.LocalCopy(src, dst, sem).start()  # the helper's start


def _raw_fetch(src: Any, dst: Any, sem: Any) -> Any:
    copy = pltpu.make_async_copy(src, dst, sem)
    copy.start()  # the helper's start
    return copy


def _sd_kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
    first = _sd_fetch(x_ref, buf, sem)  # the helper's caller
    pltpu.sync_copy(buf, o_ref)  # the copy out
    first.wait()


def _raw_kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
    first = _raw_fetch(x_ref, buf, sem)  # the helper's caller
    pltpu.sync_copy(buf, o_ref)  # the copy out
    first.wait()


@pytest.mark.parametrize(
    ("fetch", "kernel"), [(_sd_fetch, _sd_kernel), (_raw_fetch, _raw_kernel)], ids=["sd", "raw"]
)
def test_a_copy_started_by_a_helper_names_the_helper_and_its_caller(
    fetch: Any, kernel: Any
) -> None:
    message = _race(hbm_call(kernel, [pltpu.VMEM(BLOCK, F32), *dma(2)]))
    helper = line_of(fetch, "# the helper's start")
    caller = line_of(kernel, "# the helper's caller").rsplit(":", 1)[1]
    # a raw descriptor made on the line above its start is named as well
    made = (
        ""
        if fetch is _sd_fetch
        else f", descriptor made at test_simulate_race_lines.py:{int(helper.rsplit(':', 1)[1]) - 1}"
    )
    called = (
        f"({fetch.__name__}{made}, called at test_simulate_race_lines.py:{caller} "
        f"in {kernel.__name__})"
    )
    assert f"(the copy or access at {helper} {called})" in message, message
    assert f"at {line_of(kernel, '# the copy out')} " in message, message


# --------------------- a remote copy racing the receiver's own write


def _sd_remote(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    copy = sd.RemoteCopy(x_ref, o_ref, recv).with_send_sem(send).to(sd.neighbour("x"))
    o_ref[...] = x_ref[...] * 0.0  # no barrier before the neighbour's copy lands
    copy.start().wait()  # the remote copy


def _raw_remote(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    right = {"x": jax.lax.rem(jax.lax.axis_index("x") + 1, 4)}
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=right)
    o_ref[...] = x_ref[...] * 0.0  # no barrier before the neighbour's copy lands
    copy.start()  # the remote copy
    copy.wait_send()
    copy.wait_recv()


@pytest.mark.parametrize("kernel", [_sd_remote, _raw_remote], ids=["sd", "raw"])
def test_a_remote_copy_racing_the_receivers_write_names_both_lines(
    kernel: Any, mesh4: Mesh
) -> None:
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=dma(2),
    )
    message = _race(call, mesh=mesh4, shape=(4 * BLOCK[0], BLOCK[1]))
    write = line_of(kernel, "# no barrier")
    start = line_of(kernel, "# the remote copy")
    # whichever of the two the schedule ran first, both lines are named
    assert f"at {write} " in message or f"at {start} " in message, message
    assert write in message and start in message, message


# --------------------- the same line as verify: a helper of another module, in its loop


def _filled_by_helper(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
    dma_helpers.fill_rows(buf, x_ref, sem, 2)  # the helper's call
    o_ref[...] = buf[pl.ds(0, BLOCK[0]), :]  # read before the rows are drained
    dma_helpers.drain_rows(buf, x_ref, sem, 2)


def _filled_call() -> Any:
    return pl.pallas_call(
        _filled_by_helper,
        out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((2 * BLOCK[0], BLOCK[1]), F32), *dma(1)],
    )


def test_a_copy_in_another_modules_loop_helper_is_named_as_verify_names_it() -> None:
    # The copy is started in a fori_loop body of a helper module: its own frames
    # end at the loop's trace, so only the frames around it name the kernel line.
    message = _race(_filled_call())
    with pytest.raises(RaceDetectedError) as verified:
        verify(_filled_call(), jax.ShapeDtypeStruct(BLOCK, F32))
    call = line_of(_filled_by_helper, "# the helper's call")
    helper = f"dma_helpers.py:{_line_in(dma_helpers.fill_rows, '.start()')} "
    named = f"(fill_rows.<locals>.body, called at {call} in _filled_by_helper)"
    assert helper + named in message, message
    assert helper + named in str(verified.value), str(verified.value)
    assert f"at {line_of(_filled_by_helper, '# read before')} " in message, message


def _line_in(fn: Any, text: str) -> str:
    return line_of(fn, text).rsplit(":", 1)[1]
