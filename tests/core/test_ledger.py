"""The obligations ledger: copies started and never waited (T7), handles waited twice (T8).

These checks run while Python traces the kernel body, so they reject only
what is wrong on every path: a copy that no wait anywhere in the body can
stand for, and one handle waited twice in one straight-line block. Waits
that depend on the path or on counts are left to ``safedma.testing.verify``;
``test_control_flow.py`` has the branch and loop cases.

Every test traces a kernel (``jax.eval_shape``) and checks the safedma
exception type and the words of its message an author needs.
"""

from __future__ import annotations

import functools
import sys

import jax
import pytest
from jax.experimental import pallas as pl

import safedma
from tests.support.tracing import DMA, ENTRIES, TWO_DMA, VMEM, assert_mentions, ring, trace
from tests.support.tracing import trace_on_mesh

THIS_FILE = "test_ledger.py"
VERIFY = "safedma.testing.verify(...)"


# ------------------------------------------------- T7: copy started and never waited

_T7_FIX = ("handle.wait()", "copy.started_elsewhere().wait()")


@pytest.mark.parametrize("entry", ENTRIES)
def test_t7_local_copy_never_waited(entry: str) -> None:
    def leaky_kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sem).start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(leaky_kernel, [VMEM, DMA], entry=entry)
    assert_mentions(
        err,
        "kernel 'leaky_kernel'",
        "1 copy was started and never waited",
        "LocalCopy x_ref float32[2,8,128] -> buf float32[2,8,128]",
        "started at ",
        THIS_FILE,
        "wait() never called",
        *_T7_FIX,
    )
    assert isinstance(err.value, RuntimeError)


@pytest.mark.parametrize("entry", ENTRIES)
def test_t7_names_a_partial_body_after_its_function(entry: str) -> None:
    # Kernels with static options are passed as functools.partial; the message
    # names the function, as jax names the kernel.
    def leaky_kernel(x_ref, o_ref, buf, sem, *, times):  # type: ignore[no-untyped-def]
        for _ in range(times):
            safedma.LocalCopy(x_ref, buf, sem).start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(functools.partial(leaky_kernel, times=2), [VMEM, DMA], entry=entry)
    assert_mentions(err, "kernel 'leaky_kernel'", "2 copies were started and never waited")


def test_t7_names_the_line_of_the_start() -> None:
    line = 0

    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        nonlocal line
        copy = safedma.LocalCopy(x_ref, buf, sem)
        line = _lineno() + 1
        copy.start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, f"{THIS_FILE}:{line}")


def _lineno() -> int:
    return sys._getframe(1).f_lineno


def test_t7_one_of_two_copies_never_waited() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref.at[0], buf.at[0], sem).start().wait()
        safedma.LocalCopy(x_ref.at[1], buf.at[1], sem).start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, DMA])
    message = assert_mentions(err, "1 copy was", "x_ref.at[...] float32[8,128] -> buf.at[...]")
    assert message.count("never called") == 1


def test_t7_several_copies_never_waited_are_all_listed() -> None:
    def kernel(x_ref, o_ref, buf, sem_a, sem_b):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sem_a).start()
        safedma.LocalCopy(buf, o_ref, sem_b).start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, *TWO_DMA])
    message = assert_mentions(
        err, "2 copies were", "x_ref float32[2,8,128] -> buf", "buf float32[2,8,128] -> o_ref"
    )
    assert message.count("never called") == 2


def test_t7_copies_started_at_one_site_are_one_line_with_their_count() -> None:
    # A row loop that leaks its copies: one line for the site, with the count, not one
    # identical line per row.
    line = 0

    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        nonlocal line
        for row in range(2):
            for _ in range(8):
                line = _lineno() + 1
                safedma.LocalCopy(x_ref.at[row], buf.at[row], sem).start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, DMA])
    message = assert_mentions(
        err,
        "16 copies were started and never waited",
        f"  - 16 copies of LocalCopy x_ref.at[...] float32[8,128] -> buf.at[...] "
        f"float32[8,128], started at {__file__}:{line}: wait() never called",
    )
    assert message.count("never called") == 1, message


def test_t7_distinct_sites_stay_distinct_lines_in_start_order() -> None:
    # Same buffers at two lines, and two buffers at one line: three sites, three lines,
    # in the order the copies were first started; each with its own count.
    lines: list[int] = []

    def kernel(x_ref, o_ref, buf, sem_a, sem_b):  # type: ignore[no-untyped-def]
        for _ in range(3):
            lines.append(_lineno() + 1)
            safedma.LocalCopy(x_ref, buf, sem_a).start()
        lines.append(_lineno() + 1)
        safedma.LocalCopy(x_ref, buf, sem_a).start()
        for src, dst in ((x_ref, buf), (buf, o_ref), (buf, o_ref)):
            lines.append(_lineno() + 1)
            safedma.LocalCopy(src, dst, sem_b).start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, *TWO_DMA])
    message = assert_mentions(err, "7 copies were started and never waited")
    listed = [row for row in message.splitlines() if row.startswith("  - ")]
    first, second, third = lines[0], lines[3], lines[4]
    assert listed == [
        f"  - 3 copies of LocalCopy x_ref float32[2,8,128] -> buf float32[2,8,128], "
        f"started at {__file__}:{first}: wait() never called",
        f"  - LocalCopy x_ref float32[2,8,128] -> buf float32[2,8,128], "
        f"started at {__file__}:{second}: wait() never called",
        f"  - LocalCopy x_ref float32[2,8,128] -> buf float32[2,8,128], "
        f"started at {__file__}:{third}: wait() never called",
        f"  - 2 copies of LocalCopy buf float32[2,8,128] -> o_ref float32[2,8,128], "
        f"started at {__file__}:{third}: wait() never called",
    ], message


def test_t7_copies_from_one_helper_called_at_two_lines_stay_two_lines() -> None:
    # The same helper line reached from two calls is two sites (the call chain differs).
    def fetch(x_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sem).start()

    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        for _ in range(2):
            fetch(x_ref, buf, sem)
        fetch(x_ref, buf, sem)

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, DMA])
    listed = [row for row in str(err.value).splitlines() if row.startswith("  - ")]
    assert len(listed) == 2, listed
    assert listed[0].startswith("  - 2 copies of LocalCopy"), listed
    assert listed[1].startswith("  - LocalCopy"), listed
    assert all("(called from " in row for row in listed), listed


def test_t7_names_refs_inside_pytree_arguments_by_their_path() -> None:
    # A scratch entry that is a tuple (or a dataclass, a dict) is one kernel argument: its
    # refs are named by their path in it, as the body reads them.
    def kernel(x_ref, o_ref, bufs, sems):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, bufs[1], sems["b"]).start()

    scratch = [(VMEM, VMEM), {"a": DMA, "b": DMA}]
    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, scratch)
    assert_mentions(err, "LocalCopy x_ref float32[2,8,128] -> bufs[1] float32[2,8,128]")


def test_t7_copy_started_under_pl_when_never_waited() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        @pl.when(pl.program_id(0) == 0)
        def _() -> None:
            safedma.LocalCopy(x_ref, buf, sem).start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, DMA], grid=(2,))
    assert_mentions(err, "x_ref float32[2,8,128] -> buf", "wait() never called")


def test_t7_copy_started_in_a_loop_never_waited() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        def body(i, carry):  # type: ignore[no-untyped-def]
            safedma.LocalCopy(x_ref.at[i], buf.at[i], sem).start()
            return carry

        jax.lax.fori_loop(0, 2, body, 0)

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, "x_ref.at[...] float32[8,128] -> buf.at[...] float32[8,128]")


def test_t7_copy_started_in_run_scoped_never_waited() -> None:
    def kernel(x_ref, o_ref):  # type: ignore[no-untyped-def]
        def body(buf, sem):  # type: ignore[no-untyped-def]
            safedma.LocalCopy(x_ref, buf, sem).start()

        safedma.run_scoped(body, VMEM, DMA)

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel)
    assert_mentions(
        err, "LocalCopy x_ref float32[2,8,128] -> float32[2,8,128]", "wait() never called"
    )


def test_t7_wait_on_another_semaphore_does_not_discharge() -> None:
    def kernel(x_ref, o_ref, buf, sem_a, sem_b):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sem_a).start()
        safedma.LocalCopy(x_ref, buf, sem_b).started_elsewhere().wait()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, *TWO_DMA])
    assert_mentions(err, "1 copy was", "wait() never called")


def test_t7_remote_copy_receive_side_never_waited() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, send_sem, recv_sem).start().wait_send()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    message = assert_mentions(
        err,
        "RemoteCopy x_ref float32[2,8,128] -> o_ref float32[2,8,128]",
        "wait_recv() never called",
        # The fix names the receive side's waits, not a local wait().
        "handle.wait_recv()",
        "copy.incoming().wait_recv() on the receiving device",
    )
    assert "wait_send() never called" not in message
    assert "handle.wait()" not in message and "wait_send()" not in message, message


def test_t7_remote_copy_send_side_never_waited() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, send_sem, recv_sem).start().wait_recv()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, "wait_send() never called")


@pytest.mark.parametrize("entry", ENTRIES)
def test_t7_remote_copy_never_waited(entry: str) -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, send_sem, recv_sem).start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace_on_mesh(kernel, TWO_DMA, entry=entry)
    assert_mentions(
        err,
        "wait_send() and wait_recv() never called",
        # Neither side waited: the fix names the one call that waits both.
        "handle.wait() (both sides) or handle.wait_send() / handle.wait_recv()",
        "copy.started_elsewhere().wait() for both sides",
    )


# ------------------------------------------------ T8: waited twice / more than started


def _wait_twice(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
    handle = safedma.LocalCopy(x_ref, buf, sem).start()
    handle.wait()
    handle.wait()


@pytest.mark.parametrize("entry", ENTRIES)
def test_t8_local_handle_waited_twice(entry: str) -> None:
    with pytest.raises(safedma.HandleWaitedTwiceError) as err:
        trace(_wait_twice, [VMEM, DMA], entry=entry)
    message = assert_mentions(
        err,
        "wait() on the handle of LocalCopy x_ref float32[2,8,128] -> buf float32[2,8,128]",
        "called twice",
        "first at",
        "again at",
        "hangs",
        "Keep one of these two waits",
    )
    assert message.count(THIS_FILE) == 3  # where it was started, first and second wait
    assert isinstance(err.value, RuntimeError)


def test_t8_handle_waited_twice_is_caught_without_the_kernel_scope() -> None:
    # Checked per handle, so it holds in a plain pl.pallas_call too (without the
    # scope, the refs' parameter names and the start site are unknown).
    with pytest.raises(safedma.HandleWaitedTwiceError) as err:
        trace(_wait_twice, [VMEM, DMA], entry="pl.pallas_call")
    message = assert_mentions(
        err,
        "LocalCopy float32[2,8,128] -> float32[2,8,128]",
        "called twice",
        "Keep one of these two waits",
    )
    assert message.count(THIS_FILE) == 2


def test_t8_started_elsewhere_handle_waited_twice() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handle = safedma.LocalCopy(x_ref, buf, sem).started_elsewhere()
        handle.wait()
        handle.wait()

    with pytest.raises(safedma.HandleWaitedTwiceError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, "(started elsewhere)", "called twice", "Keep one of these two waits")


def test_t8_remote_wait_then_wait_recv() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        handle = ring(x_ref, o_ref, send_sem, recv_sem).start()
        handle.wait()  # both sides
        handle.wait_recv()

    with pytest.raises(safedma.HandleWaitedTwiceError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(
        err,
        "wait_recv() on the handle of RemoteCopy x_ref float32[2,8,128]",
        "called twice",
        "Keep one of these two waits",
    )


def test_t8_remote_wait_send_twice() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        handle = ring(x_ref, o_ref, send_sem, recv_sem).start()
        handle.wait_send()
        handle.wait_send()
        handle.wait_recv()

    with pytest.raises(safedma.HandleWaitedTwiceError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, "wait_send() on the handle of RemoteCopy", "called twice")


def test_t8_remote_wait_of_both_sides_twice_names_wait() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        handle = ring(x_ref, o_ref, send_sem, recv_sem).start()
        handle.wait()
        handle.wait()

    with pytest.raises(safedma.HandleWaitedTwiceError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, "wait() on the handle of RemoteCopy", "called twice")


def test_t8_incoming_handle_waited_twice() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        handle = ring(x_ref, o_ref, send_sem, recv_sem).incoming()
        handle.wait_recv()
        handle.wait_recv()

    with pytest.raises(safedma.HandleWaitedTwiceError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, "wait_recv() on the handle of RemoteCopy", "(started elsewhere)")


# ------------------------------------------- per semaphore slot, not per array


def test_t7_started_elsewhere_on_another_slot_does_not_discharge() -> None:
    # A started_elsewhere() wait on sems.at[0] never stands for a copy on sems.at[1].
    def kernel(x_ref, o_ref, buf, sems):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref.at[0], buf.at[0], sems.at[0]).start().wait()
        safedma.LocalCopy(x_ref.at[1], buf.at[1], sems.at[1]).start()  # leaked
        safedma.LocalCopy(x_ref.at[0], buf.at[0], sems.at[0]).started_elsewhere().wait()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, safedma.dma_semaphores(2)])
    message = assert_mentions(
        err,
        "1 copy was",
        "x_ref.at[...] float32[8,128] -> buf.at[...]",
        "same semaphore slot",
        VERIFY,
    )
    assert message.count("never called") == 1


def test_t7_slots_are_compared_through_sliced_views() -> None:
    # sems.at[pl.ds(2, 2)].at[1] is slot 3: a wait there covers a copy on sems.at[3] only.
    def kernel(x_ref, o_ref, buf, sems):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sems.at[3]).start()
        safedma.LocalCopy(x_ref, buf, sems.at[pl.ds(2, 2)].at[1]).started_elsewhere().wait()
        safedma.LocalCopy(x_ref, buf, sems.at[2]).start()
        safedma.LocalCopy(x_ref, buf, sems.at[pl.ds(0, 2)].at[1]).started_elsewhere().wait()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, safedma.dma_semaphores(4)])
    assert_mentions(err, "1 copy was")


def test_a_traced_slot_may_stand_for_any_slot() -> None:
    # Conservative where the index is traced: no error.
    def kernel(x_ref, o_ref, buf, sems):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sems.at[1]).start()
        slot = pl.program_id(0) % 2
        safedma.LocalCopy(x_ref, buf, sems.at[slot]).started_elsewhere().wait()

    trace(kernel, [VMEM, safedma.dma_semaphores(2)], grid=(2,))


def test_a_static_started_elsewhere_wait_on_the_right_slot_passes() -> None:
    def kernel(x_ref, o_ref, buf, sems):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref.at[0], buf.at[0], sems.at[0]).start()
        safedma.LocalCopy(x_ref.at[1], buf.at[1], sems.at[1]).start()
        safedma.LocalCopy(x_ref.at[1], buf.at[1], sems.at[1]).started_elsewhere().wait()
        safedma.LocalCopy(x_ref.at[0], buf.at[0], sems.at[0]).started_elsewhere().wait()

    trace(kernel, [VMEM, safedma.dma_semaphores(2)])


def test_t7_remote_receive_slot_is_per_slot_too() -> None:
    def kernel(x_ref, o_ref, send_sems, recv_sems):  # type: ignore[no-untyped-def]
        def copy(slot):  # type: ignore[no-untyped-def]
            return (
                safedma.RemoteCopy(x_ref.at[slot], o_ref.at[slot], recv_sems.at[slot])
                .with_send_sem(send_sems.at[slot])
                .to(safedma.neighbour("x"))
            )

        copy(1).start().wait_send()
        copy(0).incoming().wait_recv()  # slot 0: cannot be the receive of slot 1's copy

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace_on_mesh(kernel, [safedma.dma_semaphores(2), safedma.dma_semaphores(2)])
    assert_mentions(err, "wait_recv() never called")


# ------------------------------------ handles in lists, dicts and helper objects


class _Inflight:
    """A helper object holding handles, as production kernels do."""

    def __init__(self) -> None:
        self.handles: dict[str, safedma.LocalHandle] = {}


def test_handles_kept_in_a_list_are_tracked_like_locals() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handles = [safedma.LocalCopy(x_ref.at[i], buf.at[i], sem).start() for i in range(2)]
        handles[0].wait()
        # handles[1] is never waited

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, "1 copy was", "x_ref.at[...] float32[8,128] -> buf.at[...]")


def test_handles_kept_in_a_list_and_all_waited_pass() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handles = [safedma.LocalCopy(x_ref.at[i], buf.at[i], sem).start() for i in range(2)]
        for handle in handles:
            handle.wait()

    trace(kernel, [VMEM, DMA])


def test_handle_in_a_helper_object_waited_twice() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        inflight = _Inflight()
        inflight.handles["in"] = safedma.LocalCopy(x_ref, buf, sem).start()
        inflight.handles["in"].wait()
        inflight.handles["in"].wait()

    with pytest.raises(safedma.HandleWaitedTwiceError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, "called twice in the same block")


def test_handle_in_a_dict_never_waited() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        inflight = {"in": safedma.LocalCopy(x_ref, buf, sem).start()}
        del inflight

    with pytest.raises(safedma.CopyNeverWaitedError):
        trace(kernel, [VMEM, DMA])


# ------------------------------------------------ left to verify (count-dependent)


def _wait_twice_through_elsewhere(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
    copy = safedma.LocalCopy(x_ref, buf, sem)
    copy.start().wait()
    copy.started_elsewhere().wait()  # in a grid kernel this could be the previous step's


def _elsewhere_without_a_start(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
    safedma.LocalCopy(x_ref, buf, sem).started_elsewhere().wait()  # e.g. a DMA future


def _started_once_waited_in_a_loop(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
    handle = safedma.LocalCopy(x_ref, buf, sem).start()

    def body(i, carry):  # type: ignore[no-untyped-def]
        handle.wait()  # right for a trip count of 1
        return carry

    jax.lax.fori_loop(0, 2, body, 0)


@pytest.mark.parametrize(
    "kernel",
    [
        _wait_twice_through_elsewhere,
        _elsewhere_without_a_start,
        _started_once_waited_in_a_loop,
    ],
)
def test_counts_are_left_to_verify(kernel: object) -> None:
    """Whether more is waited than started depends on counts the trace cannot see.

    A started_elsewhere() wait may be for a copy from an earlier grid step, a
    DMA future from another pallas_call, or raw pltpu code; a wait in a loop
    runs as often as the loop. These trace cleanly; verify counts them.
    """
    trace(kernel, [VMEM, DMA], grid=(2,))  # type: ignore[arg-type]
