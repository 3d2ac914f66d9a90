"""What every participant needs to know about one ``pallas_call``: operands, grid, names.

Why its own module: the block rules (``blocks``, ``block_garbage``) and the lockstep
path read a kernel's description, and the per-device run of a kernel (``kernels``)
uses them; the description itself depends on none of them.
"""

from __future__ import annotations

import linecache
from typing import Any

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.naming import parameter_names
from safedma.testing._verify.program.compiler import compile_jaxpr, location

__all__ = ["KernelDesc", "body_end"]


class KernelDesc:
    """What every participant needs to know about one ``pallas_call`` equation."""

    def __init__(self, eqn: Any) -> None:
        kp = _jax.kernel_params(eqn)
        self.params = kp
        jaxpr, consts = _jax.jaxpr_of(kp["jaxpr"])
        self.jaxpr = jaxpr
        # Refs the kernel closes over (a stateful pallas_call inside run_state) are
        # the kernel jaxpr's constvars, fed by the equation's first operands.
        operands = int(kp["num_dynamic_grid_bounds"]) + int(kp["num_index_operands"])
        extra = len(eqn.invars) - operands - int(kp["num_inputs"])
        self.n_consts = extra if extra > 0 and extra == len(jaxpr.constvars) else 0
        self.body = compile_jaxpr(
            jaxpr, consts, consts_are_args=self.n_consts > 0, kernel_body=True
        )
        self.where = location(eqn)
        self.ends_at = body_end(_jax.kernel_def_line(eqn))
        self.avals: list[Any] = [v.aval for v in jaxpr.invars]
        roles = (
            ("scalar-prefetch operand", int(kp["num_index_operands"])),
            ("input", int(kp["num_inputs"])),
            ("output", int(kp["num_outputs"])),
            ("scratch", int(kp["num_scratch"])),
        )
        self.param_names, self.param_named = parameter_names(
            _jax.kernel_param_names(jaxpr), self.avals, roles
        )
        self.name = kp["name"] or "kernel"
        self.n_index = int(kp["num_index_operands"])
        self.n_in = int(kp["num_inputs"])
        self.n_out = int(kp["num_outputs"])
        self.n_scratch = int(kp["num_scratch"])
        self.grid: tuple[int, ...] = tuple(int(g) for g in kp["grid"])  # -1: dynamic
        self.index_maps = [compile_jaxpr(*_jax.jaxpr_of(b["index_map"])) for b in kp["blocks"]]
        self.blocks = kp["blocks"]
        self.aliases = {int(o): int(i) for i, o in kp["aliases"]}
        self.barrier = kp["collective_id"] is None and not kp["skip_device_barrier"]
        self.collective_id = kp["collective_id"]
        self.n_dynamic = int(kp["num_dynamic_grid_bounds"])
        self.core_axes = _jax.core_mesh_axes(kp["mesh"])
        self.semantics: tuple[str, ...] = tuple(kp["semantics"])
        vmapped = set(kp["vmapped_dims"])
        # program_id axis -> grid dimension (jax.vmap adds dimensions the kernel skips)
        self.grid_axes: tuple[int, ...] | None = (
            tuple(d for d in range(len(self.grid)) if d not in vmapped) if vmapped else None
        )
        self.out_read: list[tuple[tuple[tuple[int, int], ...], ...] | None] = []
        self.out_dropped: list[bool] = []  # outputs the program never reads
        self.out_read_by: list[str] = []  # the operation that reads each output ("")


def body_end(defined_at: str | None) -> str | None:
    """``file:line`` of the last line of the kernel function's body, from where it is
    defined (``file:line (name)``); None when the source cannot be read.

    Why: a wait missing before the kernel ends belongs at the end of the body, a line
    the jaxpr does not record (a body that forgot its wait may hold no equation at all).
    """
    if defined_at is None:
        return None
    where = defined_at.split(" (", 1)[0]
    path, _, line = where.rpartition(":")
    if not line.isdigit():
        return None
    lines = linecache.getlines(path)
    # the ``def`` line (the recorded one may be a decorator's)
    defs = (i for i in range(int(line) - 1, len(lines)) if lines[i].lstrip().startswith("def "))
    start = next(defs, None)
    if start is None:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    last = start
    for i in range(start + 1, len(lines)):
        text = lines[i].strip()
        if not text:
            continue
        if len(lines[i]) - len(lines[i].lstrip()) <= indent:
            break
        if not text.startswith("#"):
            last = i
    return f"{path}:{last + 1}" if last > start else None
