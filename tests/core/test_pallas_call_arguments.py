"""``safedma.pallas_call`` takes what ``pl.pallas_call`` takes, so porting a kernel changes
no call site: every ``out_shape`` (an array as a shape, a tuple, a list, a dict), returned
as jax returns it, and only the options given, jax's defaults otherwise."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.support.tracing import trace

ANY = pl.BlockSpec(memory_space=pl.ANY)


def _two(
    x_ref: sd.DataRef, s_ref: sd.DataRef, o_ref: sd.DataRef, t_ref: sd.DataRef, sem: sd.SemRef
) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).start().wait()
    sd.LocalCopy(s_ref, t_ref, sem).start().wait()


def _two_dict(
    x_ref: sd.DataRef, s_ref: sd.DataRef, outs: dict[str, sd.DataRef], sem: sd.SemRef
) -> None:
    _two(x_ref, s_ref, outs["o"], outs["t"], sem)  # jax passes a dict of outputs as one dict


def _outputs(out_shape: Any, out_specs: Any) -> Any:
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    s = -x
    call = sd.pallas_call(
        _two_dict if isinstance(out_shape, dict) else _two,
        out_shape,
        in_specs=[ANY, ANY],
        out_specs=out_specs,
        scratch_shapes=[sd.dma_semaphore()],
        interpret=pltpu.InterpretParams(),
        debug=False,
        metadata={"origin": "production"},
    )
    return call(x, s), x, s


def test_out_shape_structures_are_jax_s() -> None:
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    as_list, a, b = _outputs([x, x], [ANY, ANY])
    assert isinstance(as_list, tuple) and len(as_list) == 2  # jax's own behaviour
    np.testing.assert_array_equal(as_list[1], b)
    as_tuple, a, b = _outputs((a, b), (ANY, ANY))  # arrays as their own shapes
    assert isinstance(as_tuple, tuple)
    np.testing.assert_array_equal(as_tuple[0], a)
    as_dict, a, b = _outputs({"o": x, "t": x}, {"o": ANY, "t": ANY})
    assert set(as_dict) == {"o", "t"}
    np.testing.assert_array_equal(as_dict["t"], b)


def test_trace_helper_still_reaches_pallas_call() -> None:
    # The options declaration passes only what was given (jax's defaults otherwise).
    trace(lambda x_ref, o_ref: None)
