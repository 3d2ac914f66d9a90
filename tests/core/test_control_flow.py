"""Trace-time checks across control flow: branches, loops, run_scoped.

The kernel body is traced once, so safedma sees both branches of a
``lax.cond`` / ``pl.when`` and one iteration of each loop. It tells them
apart by the jax trace each is traced into (``safedma._compat``'s frame
helpers, pinned here on both jax versions) and rejects only what is wrong on
every path: a straight-line double wait, and a handle waited outside the
iteration or branch that started it (which jax cannot trace either). Waits
split across branches are accepted (``test_legitimate_patterns.py``
runs them); what depends on the path is ``safedma.testing.verify``'s job.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma
from safedma import _compat
from safedma._compat import FlowKind
from tests.support.tracing import DMA, F32, SHAPE, VMEM, assert_mentions, trace

THIS_FILE = "test_control_flow.py"


def _lineno() -> int:
    return sys._getframe(1).f_lineno


# ------------------------------------------------ the jax trace state safedma reads


def test_each_traced_block_is_its_own_frame_with_its_kind() -> None:
    seen: dict[str, tuple[object, FlowKind]] = {}

    def note(name: str) -> None:
        frame = _compat.current_frame()
        seen[name] = (frame, _compat.frame_kind(frame))

    def kernel(x_ref, o_ref, buf):  # type: ignore[no-untyped-def]
        note("body")

        @pl.when(pl.program_id(0) == 0)
        def _() -> None:
            note("when")

        jax.lax.cond(pl.program_id(0) == 0, lambda: note("cond"), lambda: None)

        def loop(i, c):  # type: ignore[no-untyped-def]
            note("fori_loop")
            return c

        jax.lax.fori_loop(0, pl.program_id(0) + 2, loop, 0)

        def while_body(c):  # type: ignore[no-untyped-def]
            note("while_loop")
            return c + 1

        jax.lax.while_loop(lambda c: c < 2, while_body, 0)
        pl.run_scoped(lambda scratch: note("run_scoped"), pltpu.VMEM((8, 128), F32))

    trace(kernel, [VMEM], entry="pl.pallas_call", grid=(2,))
    kinds = {name: kind for name, (_, kind) in seen.items()}
    assert kinds == {
        "body": FlowKind.OTHER,
        "when": FlowKind.BRANCH,
        "cond": FlowKind.BRANCH,
        "fori_loop": FlowKind.LOOP,
        "while_loop": FlowKind.LOOP,
        "run_scoped": FlowKind.ONCE,
    }
    body = seen["body"][0]
    assert len({id(frame) for frame, _ in seen.values()}) == len(seen)
    for name in ("when", "cond", "fori_loop", "while_loop", "run_scoped"):
        assert _compat.frame_parent(seen[name][0]) is body, name


def test_static_positions_of_semaphore_views() -> None:
    found: dict[str, frozenset[int] | None] = {}

    def kernel(x_ref, o_ref, sems, grid_sems):  # type: ignore[no-untyped-def]
        i = pl.program_id(0)
        found["whole"] = _compat.static_positions(sems)
        found["at[2]"] = _compat.static_positions(sems.at[2])
        found["at[ds(1,2)].at[1]"] = _compat.static_positions(sems.at[pl.ds(1, 2)].at[1])
        found["at[i]"] = _compat.static_positions(sems.at[i])
        found["at[ds(i,2)].at[0]"] = _compat.static_positions(sems.at[pl.ds(i, 2)].at[0])
        found["2d at[1, 2]"] = _compat.static_positions(grid_sems.at[1, 2])
        found["2d at[1]"] = _compat.static_positions(grid_sems.at[1])

    trace(
        kernel,
        [pltpu.SemaphoreType.DMA((4,)), pltpu.SemaphoreType.DMA((2, 3))],
        entry="pl.pallas_call",
        grid=(2,),
    )
    assert found == {
        "whole": frozenset({0, 1, 2, 3}),
        "at[2]": frozenset({2}),
        "at[ds(1,2)].at[1]": frozenset({2}),
        "at[i]": None,
        "at[ds(i,2)].at[0]": None,
        "2d at[1, 2]": frozenset({5}),
        "2d at[1]": frozenset({3, 4, 5}),
    }


# --------------------------------------------------- handles escaping their block
# Before: jax's "The kernel function ... captures constants [i32[]]. You should
# pass them as inputs", which says nothing about DMAs.


def test_handle_started_in_a_fori_loop_waited_after_it() -> None:
    line = 0

    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        nonlocal line
        handles: list[Any] = []

        def body(i, carry):  # type: ignore[no-untyped-def]
            handles.append(safedma.LocalCopy(x_ref.at[i], buf.at[i], sem).start())
            return carry

        jax.lax.fori_loop(0, SHAPE[0], body, 0)
        line = _lineno() + 1
        handles[-1].wait()

    with pytest.raises(safedma.HandleEscapedError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(
        err,
        f"{THIS_FILE}:{line}",
        "LocalCopy x_ref.at[...] float32[8,128] -> buf.at[...]",
        "inside a loop body",
        "tied to the loop iteration that started it",
        "wait the handle inside the loop body",
        "copy.started_elsewhere().wait()",
        "captures constants",
        "safedma.testing.verify(...)",
    )
    assert isinstance(err.value, ValueError)  # what jax raised for it


def test_handle_escaping_a_loop_is_caught_without_the_kernel_scope() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handles: list[Any] = []

        def body(i, carry):  # type: ignore[no-untyped-def]
            handles.append(safedma.LocalCopy(x_ref.at[i], buf.at[i], sem).start())
            return carry

        jax.lax.fori_loop(0, SHAPE[0], body, 0)
        handles[-1].wait()

    with pytest.raises(safedma.HandleEscapedError):
        trace(kernel, [VMEM, DMA], entry="pl.pallas_call")


def test_started_elsewhere_handle_made_in_a_loop_waited_after_it() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handles: list[Any] = []

        def body(i, carry):  # type: ignore[no-untyped-def]
            copy = safedma.LocalCopy(x_ref.at[i], buf.at[i], sem)
            copy.start().wait()
            handles.append(copy.started_elsewhere())
            return carry

        jax.lax.fori_loop(0, SHAPE[0], body, 0)
        handles[-1].wait()

    with pytest.raises(safedma.HandleEscapedError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, "created inside a loop body")


def test_handle_started_under_pl_when_waited_after_it() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handles: list[Any] = []

        @pl.when(pl.program_id(0) == 0)
        def _() -> None:
            handles.append(safedma.LocalCopy(x_ref, buf, sem).start())

        handles[0].wait()

    with pytest.raises(safedma.HandleEscapedError) as err:
        trace(kernel, [VMEM, DMA], grid=(2,))
    assert_mentions(
        err,
        "inside a branch (pl.when / lax.cond)",
        "Wait it inside the same branch",
        "copy.started_elsewhere().wait()",
    )


def test_remote_handle_started_in_a_loop_waited_after_it() -> None:
    from tests.support.tracing import ring, trace_on_mesh

    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        handles: list[Any] = []

        def body(i, carry):  # type: ignore[no-untyped-def]
            handles.append(ring(x_ref, o_ref, send_sem, recv_sem).start())
            return carry

        jax.lax.fori_loop(0, 2, body, 0)
        handles[-1].wait_send()

    with pytest.raises(safedma.HandleEscapedError) as err:
        trace_on_mesh(kernel, [DMA, DMA])
    message = assert_mentions(
        err,
        "wait_send() at",
        "RemoteCopy x_ref float32[2,8,128]",
        # The fix waits the same side: a suggested wait() would also wait the
        # receive side, which a ring device has already waited for its incoming copy.
        "copy.started_elsewhere().wait_send() (one per copy still in flight)",
    )
    assert "started_elsewhere().wait()" not in message, message


def test_remote_wait_of_both_sides_escaping_a_branch_names_wait() -> None:
    # handle.wait() of a remote copy waits both sides: the message names the call written
    # (not its first side) and suggests the same call on a rebuilt copy.
    from tests.support.tracing import ring, trace_on_mesh

    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        handles: list[Any] = []

        @pl.when(jax.lax.axis_index("x") == 0)
        def _() -> None:
            handles.append(ring(x_ref, o_ref, send_sem, recv_sem).start())

        handles[-1].wait()

    with pytest.raises(safedma.HandleEscapedError) as err:
        trace_on_mesh(kernel, [DMA, DMA])
    message = assert_mentions(
        err, "wait() at", "pl.when / lax.cond", "copy.started_elsewhere().wait(), describing"
    )
    assert "wait_send()" not in message, message


# ------------------------------------------ double waits: same block only


def test_double_wait_inside_one_branch() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handle = safedma.LocalCopy(x_ref, buf, sem).start()

        @pl.when(pl.program_id(0) == 0)
        def _() -> None:
            handle.wait()
            handle.wait()

    with pytest.raises(safedma.HandleWaitedTwiceError) as err:
        trace(kernel, [VMEM, DMA], grid=(2,))
    assert_mentions(err, "called twice in the same block", "Keep one of these two waits")


def test_double_wait_inside_one_loop_body() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        def body(i, carry):  # type: ignore[no-untyped-def]
            handle = safedma.LocalCopy(x_ref.at[i], buf.at[i], sem).start()
            handle.wait()
            handle.wait()
            return carry

        jax.lax.fori_loop(0, SHAPE[0], body, 0)

    with pytest.raises(safedma.HandleWaitedTwiceError):
        trace(kernel, [VMEM, DMA])


def test_run_scoped_is_straight_line() -> None:
    # A run_scoped body runs exactly once where it appears: a wait there and
    # one after it are in the same block.
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handle = safedma.LocalCopy(x_ref, buf, sem).start()
        handle.wait()

        def body(scratch):  # type: ignore[no-untyped-def]
            handle.wait()

        safedma.run_scoped(body, safedma.vmem((8, 128), F32))

    with pytest.raises(safedma.HandleWaitedTwiceError):
        trace(kernel, [VMEM, DMA])


def test_waits_in_two_branches_or_a_branch_and_after_are_left_to_verify() -> None:
    # A wait before a pl.when and again inside it is wrong only when the
    # branch runs: path-dependent, so verify's job, not a trace-time error.
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handle = safedma.LocalCopy(x_ref, buf, sem).start()
        handle.wait()

        @pl.when(pl.program_id(0) == 1)
        def _() -> None:
            handle.wait()

    trace(kernel, [VMEM, DMA], grid=(2,))


def test_copy_started_in_a_branch_and_waited_nowhere() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        jax.lax.cond(
            pl.program_id(0) == 0,
            lambda: None if safedma.LocalCopy(x_ref, buf, sem).start() else None,
            lambda: None,
        )

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        trace(kernel, [VMEM, DMA], grid=(2,))
    assert_mentions(err, "never waited anywhere in the kernel body")


def test_wait_returns_what_it_protected_in_a_branch() -> None:
    got: dict[str, object] = {}

    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handle = safedma.LocalCopy(x_ref, buf, sem).start()

        @pl.when(pl.program_id(0) == 0)
        def _() -> None:
            got["dst"] = handle.wait()

        @pl.when(pl.program_id(0) != 0)
        def _() -> None:
            got["other"] = handle.wait()

    trace(kernel, [VMEM, DMA], grid=(2,))
    assert got["dst"] is got["other"]
    assert jnp.shape(got["dst"]) == SHAPE  # type: ignore[arg-type]


# ------------------------------------- semaphores passed into a block as its arguments


def _wait_in_a_cond_given_the_semaphores(*, other_type: bool) -> Any:
    # lax.cond passes its operands to the branches as new tracers (emit_pipeline hands its
    # buffered refs to its loop and branches the same way): the branch's semaphore array is
    # the outer one under another identity.
    def kernel(x_ref, o_ref, buf, sems, others):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref.at[0], buf.at[0], sems.at[0]).start()

        def waited(given):  # type: ignore[no-untyped-def]
            safedma.LocalCopy(x_ref.at[0], buf.at[0], given.at[0]).started_elsewhere().wait()

        jax.lax.cond(pl.program_id(0) >= 0, waited, waited, others if other_type else sems)

    return kernel


def test_a_wait_on_a_semaphore_a_branch_receives_stands_for_the_outer_one() -> None:
    # This was once a T7 false alarm.
    trace(
        _wait_in_a_cond_given_the_semaphores(other_type=False),
        [VMEM, safedma.dma_semaphores(2), safedma.dma_semaphores(3)],
        grid=(2,),
    )


def test_a_wait_on_a_received_semaphore_of_another_type_is_still_t7() -> None:
    with pytest.raises(safedma.CopyNeverWaitedError):
        trace(
            _wait_in_a_cond_given_the_semaphores(other_type=True),
            [VMEM, safedma.dma_semaphores(2), safedma.dma_semaphores(3)],
            grid=(2,),
        )
