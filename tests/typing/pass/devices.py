"""Pass: typed device ids: safedma.device(...), mesh_coords(...), neighbour(...),
used by remote copies and remote signals. Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from typing import assert_type

import safedma
from safedma import DataRef, Device, RegularSem, SemRef


def pick_devices(
    x_ref: DataRef, o_ref: DataRef, send: SemRef, recv: SemRef, flag: RegularSem
) -> None:
    """Runs on a 2-D mesh with axes ("x", "y")."""
    # Static ids; the axes left out of device(...) are this device's own.
    zero = safedma.device(x=0)
    assert_type(zero, Device)
    assert_type(safedma.device({"x": 0}), Device)
    assert_type(safedma.device({"x": 0}, y=1), Device)
    assert_type(safedma.mesh_coords(0, 0), Device)

    me_x = safedma.my_index("x")
    me_y = safedma.my_index("y")
    nx = safedma.axis_size("x")
    ny = safedma.axis_size("y")

    # Traced ids that permute the devices, so that every device sends one copy and
    # receives one: each copy can then be waited on both sides.
    mirrored = safedma.device(x=(nx - 1) - me_x)
    traced_dict = safedma.device({"x": (me_x + 1) % nx, "y": me_y})
    coords = safedma.mesh_coords(me_x, (me_y + 1) % ny)
    along_y = safedma.neighbour("y", 2)
    assert_type(
        coords.pltpu_device_id,
        tuple[int | jax.Array, ...] | dict[str | tuple[str, ...], int | jax.Array],
    )

    # Row k of the target's output belongs to the k-th permutation: no two copies
    # ever write the same rows.
    for k, target in enumerate((mirrored, traced_dict, coords, along_y)):
        copy = safedma.RemoteCopy(x_ref.at[k], o_ref.at[k], recv).with_send_sem(send)
        copy.to(target).start().wait()

    # Everyone reports to device x=0 (in its own column); it waits for all of them.
    safedma.signal(flag, device=zero)

    @pl.when(me_x == 0)
    def _gather() -> None:
        safedma.wait(flag, nx)
