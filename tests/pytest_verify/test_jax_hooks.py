"""The hook into jax: in place only between install and close, and what it records."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing._suite import _jax
from safedma.testing._suite._session import SuiteSession


def _entry_points() -> tuple[object, object, object]:
    pxla = _jax._pxla.loaded()  # the module itself: the proxy keeps what it read first
    return (
        pxla.lower_sharding_computation,
        pxla.MeshComputation.__dict__["compile"],
        pxla.ExecuteReplicated.__dict__["__call__"],
    )


def _copy_kernel(x_hbm, o_ref, buf, sem):  # type: ignore[no-untyped-def]
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...]


def _run(x: jax.Array) -> jax.Array:
    return pl.pallas_call(
        _copy_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
        interpret=pltpu.InterpretParams(),
    )(x)


def test_close_puts_jax_back_as_it_was() -> None:
    before = _entry_points()
    session = SuiteSession(timeout_s=60)
    session.install()
    try:
        during = _entry_points()
        assert all(a is not b for a, b in zip(before, during))
    finally:
        session.close()
    assert _entry_points() == before


def test_a_run_is_filed_under_the_test_phase_that_ran_it() -> None:
    session = SuiteSession(timeout_s=60)
    session.install()
    try:
        session.begin("t::one", "call")
        jax.block_until_ready(jax.jit(_run)(jnp.ones((8, 128))))
        session.begin("t::two", "call")
        jax.block_until_ready(jnp.ones(3) + 1)  # no kernel: nothing filed
    finally:
        session.close()
    (verdict,) = session.take("t::one", "call")
    assert verdict.kind == "clean"
    assert verdict.program == "_run"
    assert verdict.kernels[0].startswith("_copy_kernel (called at ")
    assert session.take("t::two", "call") == []


def test_a_program_with_no_kernel_is_not_recorded() -> None:
    assert not _jax.calls_a_kernel(jax.make_jaxpr(lambda x: x * 2)(1.0))
    assert _jax.calls_a_kernel(jax.make_jaxpr(jax.jit(_run))(jnp.ones((8, 128))))
