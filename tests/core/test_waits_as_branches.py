"""A wait passed to ``pl.when`` / ``lax.cond`` as a branch, as raw pltpu code does.

safedma's waits give back the buffer they protected. Passed as the branch
itself (``pl.when(c)(handle.wait)``) a wait returns nothing to jax, so the
raw-pltpu idiom keeps working; a ``lambda: handle.wait()`` branch returns the
buffer, which jax's cond refuses, and the kernel scope says so with the fix.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import safedma as sd

ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
Kernel = Callable[[sd.DataRef, sd.DataRef, sd.SemRef], None]


def run(kernel: Kernel) -> jax.Array:
    call = sd.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
        grid=(1,),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[sd.dma_semaphore()],
        interpret=True,
    )
    return call(X)


def test_pl_when_with_the_bound_wait_runs() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
        handle = sd.LocalCopy(x_ref, o_ref, sem).start()
        pl.when(pl.program_id(0) == 0)(handle.wait)

    np.testing.assert_array_equal(np.asarray(run(kernel)), np.asarray(X))


def test_lax_cond_with_the_bound_wait_in_both_branches_runs() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
        handle = sd.LocalCopy(x_ref, o_ref, sem).start()
        jax.lax.cond(pl.program_id(0) == 0, handle.wait, handle.wait)

    np.testing.assert_array_equal(np.asarray(run(kernel)), np.asarray(X))


def test_a_wait_called_by_user_code_still_gives_the_buffer_back() -> None:
    given: list[object] = []

    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
        given.append(sd.LocalCopy(x_ref, o_ref, sem).start().wait())
        given.append(o_ref)

    run(kernel)
    assert given[0] is given[1]


def test_a_lambda_branch_returning_the_buffer_names_the_line_and_the_fix() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
        handle = sd.LocalCopy(x_ref, o_ref, sem).start()
        pl.when(pl.program_id(0) == 0)(lambda: handle.wait())  # the line reported

    with pytest.raises(sd.BranchReturnedRefError) as caught:
        run(kernel)
    message = str(caught.value)
    line = kernel.__code__.co_firstlineno + 2
    assert f"test_waits_as_branches.py:{line} returned a ref" in message
    assert "pl.when(c)(handle.wait)" in message
    assert isinstance(caught.value, ValueError)  # jax's own error class, still caught alike


def test_other_value_errors_pass_through_unchanged() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
        raise ValueError("the user's own error")

    with pytest.raises(ValueError, match="^the user's own error") as caught:
        run(kernel)
    assert type(caught.value) is ValueError


def test_a_remote_wait_passed_as_a_branch_verifies_clean() -> None:
    from safedma.testing import abstract_mesh, verify

    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, send: sd.SemRef, recv: sd.SemRef) -> None:
        copy = sd.RemoteCopy(x_ref, o_ref, recv).with_send_sem(send).to(sd.neighbour("x"))
        handle = copy.start()
        jax.lax.cond(sd.my_index("x") >= 0, handle.wait, handle.wait)

    def per_device(x: jax.Array) -> jax.Array:
        call = sd.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore()],
        )
        return call(x)

    report = verify(
        per_device, jnp.zeros((2 * 8, 128), jnp.float32), mesh=abstract_mesh((2,), ("x",))
    )
    assert report.dmas == 2
