"""Known values of the operands of a ``shard_map`` that ``fn`` runs itself.

A function that calls its own ``shard_map`` often computes small tables before
it (expert offsets with ``jnp.arange``, routing built from the top-k indices it
was given, padded page tables). The kernels read them as scalar-prefetch or
SMEM operands, so the verifier needs their values: the program outside the
``shard_map`` is evaluated here on the known arguments, one primitive at a
time, keeping only small arrays; anything computed from an argument given as a
``jax.ShapeDtypeStruct`` stays unknown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from safedma.testing._verify import jax_internals as _jax

__all__ = ["shard_map_operands"]

_LIMIT = 1 << 16  # elements: larger arrays are never data the protocol depends on

# Primitives that only place or annotate data: their value is their input's.
_IDENTITY = frozenset(
    ("sharding_constraint", "mesh_cast", "reshard", "device_put", "pvary", "optimization_barrier")
)


def shard_map_operands(
    jaxpr: Any, consts: Sequence[object], args: Sequence[object | None]
) -> tuple[list[object | None], list[Any]] | None:
    """The value of each operand of the first ``shard_map`` in ``jaxpr`` (None where
    unknown) and its in_specs, or None when there is no ``shard_map``."""
    return _walk(jaxpr, _bind(jaxpr, consts, args))


def _bind(jaxpr: Any, consts: Sequence[object], args: Sequence[object | None]) -> dict[Any, object]:
    """The known values of ``jaxpr``'s constants and arguments (unknown ones left out)."""
    env: dict[Any, object] = {}
    for v, c in zip(jaxpr.constvars, consts):
        env[v] = _small(c)
    for v, a in zip(jaxpr.invars, args):
        if a is not None:
            env[v] = a
    return env


def _small(value: object) -> object | None:
    try:
        a = np.asarray(value)
    except Exception:
        return None
    if a.dtype.kind not in "biuf" or a.size > _LIMIT:
        return None
    return a.item() if a.shape == () else a


def _read(env: dict[Any, object], atom: Any) -> object | None:
    if _jax.is_literal(atom):
        return _small(_jax.literal_value(atom))
    return env.get(atom)


def _walk(jaxpr: Any, env: dict[Any, object]) -> tuple[list[object | None], list[Any]] | None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [_read(env, a) for a in eqn.invars]
        if name == "shard_map":
            return ins, list(eqn.params["in_specs"])
        for sub in _jax.sub_jaxprs(eqn.params):
            inner, inner_consts = _jax.jaxpr_of(sub)
            if not _has_shard_map(inner):
                continue
            return _walk(inner, _bind(inner, inner_consts, ins))
        if name in _IDENTITY and len(eqn.invars) == len(eqn.outvars):
            for v, x in zip(eqn.outvars, ins):
                if x is not None:
                    env[v] = x
            continue
        if any(x is None for x in ins) or not all(_fits(v.aval) for v in eqn.outvars):
            continue
        try:
            outs = _jax.bind_concrete_arrays(eqn, ins)
        except Exception:
            continue  # a primitive that cannot run here: its results stay unknown
        for v, x in zip(eqn.outvars, outs):
            small = _small(x)
            if small is not None:
                env[v] = small
    return None


def _fits(aval: Any) -> bool:
    shape: tuple[int, ...] | None = getattr(aval, "shape", None)
    return shape is not None and math.prod(shape) <= _LIMIT


def _has_shard_map(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            return True
        for sub in _jax.sub_jaxprs(eqn.params):
            if _has_shard_map(_jax.jaxpr_of(sub)[0]):
                return True
    return False
