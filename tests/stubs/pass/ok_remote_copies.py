"""Pass: raw pltpu remote copies with every device-id form, both sides' waits."""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemArray, SemRef


def ring_permute(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    c = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id={"x": (me + 1) % n})
    c.start()
    c.wait()


def mesh_coords_and_flat_ids(
    x_ref: DataRef, o_ref: DataRef, send_sems: SemArray, recv_sems: SemArray
) -> None:
    row = jax.lax.axis_index("row")
    col = jax.lax.axis_index("col")
    by_coords = pltpu.make_async_remote_copy(
        x_ref, o_ref, send_sems.at[0], recv_sems.at[0], device_id=(row, (col + 1) % 4)
    )
    by_flat_id = pltpu.make_async_remote_copy(
        x_ref, o_ref, send_sems.at[1], recv_sems.at[1], device_id=0
    )
    by_dict = pltpu.make_async_remote_copy(
        x_ref, o_ref, send_sems.at[2], recv_sems.at[2], device_id={"row": row, "col": 0}
    )
    for c in (by_coords, by_flat_id, by_dict):
        c.start()
    for c in (by_coords, by_flat_id, by_dict):
        c.wait_send()
        c.wait_recv()


def sender_and_receiver_sides(
    x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef
) -> None:
    """The sender waits its send; the receiver waits the copy another device started."""
    me = jax.lax.axis_index("x")
    to_right = pltpu.async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=(me + 1) % 4)
    to_right.wait_send()
    from_left = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=(me + 3) % 4)
    from_left.wait_recv()


def remote_into_vmem(x_ref: DataRef, vmem_buf: DataRef, sems: SemArray) -> None:
    me = jax.lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(
        x_ref.at[pl.ds(0, 8)], vmem_buf, sems.at[0], sems.at[1], device_id={"x": (me + 1) % 4}
    )
    copy.start()
    copy.wait()
