"""The speed structures of verify's engine compute what the plain versions computed.

Each fast path here replaces a general computation on the hot path; these tests pin
it to the general one (or to a verdict) so that speed never changes an answer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, abstract_mesh, verify
from safedma.testing._verify.model.clocks import learned


def _learned_by_sorting(clocks: list[np.ndarray], amounts: list[int], need: int) -> np.ndarray:
    """The definition: per column, sort by clock and take the clock where the sum reaches need."""
    m = np.stack(clocks)
    out = np.empty(m.shape[1], dtype=np.int64)
    for q in range(m.shape[1]):
        order = sorted(range(len(clocks)), key=lambda i: (m[i, q], i))
        total = 0
        for i in order:
            total += amounts[i]
            if total >= need:
                out[q] = m[i, q]
                break
    return out


def test_learned_matches_its_definition_on_every_shape_of_wait() -> None:
    rng = np.random.default_rng(14)
    cases = 0
    for _ in range(600):
        n = int(rng.integers(1, 6))
        width = int(rng.integers(1, 7))
        clocks = [rng.integers(0, 5, size=width).astype(np.int64) for _ in range(n)]
        amounts = [int(a) for a in rng.choice([1, 2, 4, 8], size=n)]
        need = int(rng.integers(1, sum(amounts) + 1))
        got = learned(clocks, amounts, need)
        assert np.array_equal(got, _learned_by_sorting(clocks, amounts, need)), (
            clocks,
            amounts,
            need,
        )
        cases += 1
    assert cases == 600


def test_learned_does_not_write_into_the_contributions_clocks() -> None:
    a = np.array([3, 1, 2], dtype=np.int64)
    b = np.array([1, 4, 2], dtype=np.int64)
    low = learned([a, b], [4, 4], 4)  # either copy suffices: the minimum
    high = learned([a, b], [4, 4], 8)  # both are needed: the maximum
    assert low.tolist() == [1, 1, 2] and high.tolist() == [3, 4, 2]
    assert a.tolist() == [3, 1, 2] and b.tolist() == [1, 4, 2]


def test_clock_epochs_kept_as_ints_follow_the_rows() -> None:
    from safedma.testing._verify.model.clocks import Clocks

    rng = np.random.default_rng(7)
    clocks = Clocks(5)
    sent: list[np.ndarray] = []
    for _ in range(300):
        p = int(rng.integers(0, 5))
        step = int(rng.integers(0, 3))
        if step == 0:
            sent.append(clocks.release(p))
        elif step == 1 and sent:
            clocks.acquire(p, sent[int(rng.integers(0, len(sent)))])
        else:
            clocks.barrier(sorted({p, int(rng.integers(0, 5))}))
        assert [clocks.now(q) for q in range(5)] == [int(clocks.rows[q, q]) for q in range(5)]


def test_a_view_cached_by_shape_names_the_buffer_it_is_asked_about() -> None:
    import pytest

    from safedma.testing._verify.program.compiler import view_of
    from safedma.testing._verify.program.context import RefVal
    from safedma.testing._verify.model.regions import Buffer
    from safedma.testing._verify.errors import OutOfBoundsDmaError

    a = Buffer(9001, 0, "left", (64, 128), 4, "VMEM")
    b = Buffer(9002, 1, "right", (64, 128), 4, "VMEM")
    inside = (("index", (("slice", 8, 8, 1), ("slice", 0, 128, 1))),)
    outside = (("index", (("slice", 60, 8, 1), ("slice", 0, 128, 1))),)
    va = view_of(RefVal(a, inside), "k.py:1", "the copy source", "device 0")
    vb = view_of(RefVal(b, inside), "k.py:2", "the copy source", "device 1")
    assert va.buffer is a and vb.buffer is b
    assert va.box == vb.box == ((8, 16), (0, 128)) and vb.nbytes == 8 * 128 * 4
    for buf in (a, b, a):  # an error is never cached as a view, for either buffer
        with pytest.raises(OutOfBoundsDmaError, match=buf.name):
            view_of(RefVal(buf, outside), "k.py:3", "the copy source", "device 0")


def _outcome(ctx: Any, device_id: dict[str, int]) -> int | str:
    """The device ``device_id`` names, or the error it is refused with."""
    from safedma.testing._verify.errors import VerifyKernelError
    from safedma.testing._verify.walk.ops import _target

    try:
        return _target(ctx, device_id, "DeviceIdType.MESH", "k.py:1")
    except VerifyKernelError as refused:
        return str(refused)


def test_direct_mesh_addressing_matches_the_general_rule() -> None:
    """Both ways of reading a mesh device id name the same device, and both refuse a
    coordinate outside its axis (Pallas does not wrap it around)."""
    from safedma.testing._verify.walk.engine import Engine
    from safedma.testing._verify.walk.ops import _target
    from safedma.testing._verify.program.context import Ctx

    class General(dict):  # type: ignore[type-arg]
        """Not exactly a dict: takes the general path of _target."""

    for names, sizes in ((("x",), (8,)), (("y", "x"), (4, 2)), (("a", "b", "c"), (2, 3, 2))):
        engine = Engine(names, sizes)
        checked = 0
        for p in range(engine.participants):
            ctx = Ctx(p, engine, engine.coords(p))
            for axis in names:
                for v in range(-2 * engine.devices, 2 * engine.devices):
                    fast = _outcome(ctx, {axis: v})
                    slow = _outcome(ctx, General({axis: v}))
                    assert fast == slow
                    inside = 0 <= v < engine.axis_sizes[axis]
                    assert isinstance(fast, int) == inside, (axis, v, fast)
                    checked += 1
            both = {n: (p + i) % engine.axis_sizes[n] for i, n in enumerate(names)}
            assert _target(ctx, both, "MESH", "w") == _target(ctx, General(both), "MESH", "w")
        assert checked > 0


def test_direct_windows_equal_the_general_resolution() -> None:
    from safedma.testing._verify.program.compiler import _plain_window
    from safedma.testing._verify.model.regions import Buffer, RegionError, resolve

    rng = np.random.default_rng(3)
    direct = 0
    for _ in range(400):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(n) for n in rng.integers(1, 6, size=rank))
        buf = Buffer(1, 0, "b", shape, 4, "VMEM")
        entries = []
        for extent in shape:
            start = int(rng.integers(-1, extent + 1))
            if rng.random() < 0.3:
                entries.append(("int", start, 1, 1))
            else:
                entries.append(("slice", start, int(rng.integers(0, extent + 1)), 1))
        steps = (("index", tuple(entries)),)
        fast = _plain_window(buf, steps)
        try:
            general = resolve(buf, steps)
        except RegionError:
            assert fast is None  # out of range: left to the general path's error
            continue
        if fast is not None:
            direct += 1
            assert (fast.box, fast.shape, fast.nbytes, fast.empty) == (
                general.box,
                general.shape,
                general.nbytes,
                general.empty,
            )
    assert direct > 50


def test_verify_turns_the_collector_back_on_even_after_an_error() -> None:
    import gc

    import pytest

    from safedma.testing._verify.walk.engine import collector_paused as _collector_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError), _collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a verdict")
    assert gc.isenabled()
    gc.disable()
    try:
        with _collector_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_fast_scalar_ops_compute_what_the_general_path_does() -> None:
    import jax
    import jax.numpy as jnp

    from safedma.testing._verify.program.compiler import compile_jaxpr, run_plain
    from safedma.testing._verify.program.scalars import Unknown

    def f(a: jax.Array, b: jax.Array) -> tuple[jax.Array, ...]:
        return (
            a + b,
            a * 3 - b,
            jax.lax.div(a, b),
            jax.lax.rem(a, b),
            a < b,
            -a,
            jnp.float32(a) / 2,
            jnp.int32(jnp.float32(a) / 2),
            jnp.logical_not(a == b),
        )

    closed = jax.make_jaxpr(f)(jnp.int32(0), jnp.int32(1))
    program = compile_jaxpr(closed.jaxpr, closed.consts)
    for a, b in ((7, 2), (-7, 2), (7, -3), (0, 5)):
        got = run_plain(program, [a, b], None)  # type: ignore[arg-type]
        want = [int(v) if v.dtype.kind in "iu" else v.item() for v in f(jnp.int32(a), jnp.int32(b))]
        assert got == want, (a, b, got, want)
        assert [type(v) for v in got] == [type(v) for v in want]
    unknown = Unknown("the contents of an SMEM operand")
    got = run_plain(program, [unknown, 3], None)  # type: ignore[arg-type]
    # an Unknown operand's why reaches every result, with the operation that lost it
    assert all(isinstance(v, Unknown) and unknown.why in v.why for v in got), got
    assert all("computed by `" in v.why for v in got), got


# ------------------------------------------------ history of a region rewritten by copies


def _rewritten_then_sent(x_ref: Any, o_ref: Any, sems: Any) -> None:
    """Two local copies rewrite o_ref (the second supersedes the first in o_ref's history),
    then o_ref is sent into the right neighbour's o_ref with no barrier: the neighbour may
    still be in its own local copies, so the send races with them."""
    for i in range(2):
        copy = pltpu.make_async_copy(x_ref, o_ref, sems.at[i])
        copy.start()
        copy.wait()
    me = jax.lax.axis_index("x")
    right = jax.lax.rem(me + 1, jax.lax.axis_size("x"))
    send = pltpu.make_async_remote_copy(
        x_ref, o_ref, sems.at[2], sems.at[3], device_id={"x": right}
    )
    send.start()
    send.wait_send()
    send.wait_recv()


def test_a_region_rewritten_by_a_later_copy_still_races_with_an_unordered_write() -> None:
    """The history drops a record once a later copy's write covers it; a write unordered
    with the dropped record is unordered with the later copy too, and still a race."""

    def per_device(block: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            _rewritten_then_sent,
            out_shape=jax.ShapeDtypeStruct(block.shape, block.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA((4,))],
        )(block)
        return out

    x = jax.ShapeDtypeStruct((2 * 8, 128), jnp.float32)
    with pytest.raises(RaceDetectedError, match="data race"):
        verify(per_device, x, mesh=abstract_mesh((2,), ("x",)))


def _random_waits(seed: int, general: bool) -> list[object]:
    """A random run of signals, local copies and waits on a small machine; what each step
    leaves behind. ``general``: every wait takes the general path (an empty hint entry
    for every wait number keeps it off the one-contribution direct path)."""
    from safedma.testing._verify.model.regions import Buffer, View
    from safedma.testing._verify.model.semantics import Machine

    rng = np.random.default_rng(seed)
    m = Machine(["a", "b", "c", "d"])
    if general:
        for seq in range(400):
            m.hints.by_wait[seq] = {}
    sems = [
        m.sem(Buffer(100 + i, i % 4, f"s{i}", (), 4, "SEMAPHORE", kind), 0)
        for i, kind in enumerate(["REGULAR", "DMA", "REGULAR", "DMA"])
    ]
    src = Buffer(200, 0, "src", (8, 128), 4, "VMEM")
    m.mark_written(src)
    trace: list[object] = []
    for step in range(300):
        s = sems[int(rng.integers(0, len(sems)))]
        p = int(rng.integers(0, 4))
        action = int(rng.integers(0, 3))
        if action == 0 and s.kind == "REGULAR":
            m.signal(p, s, int(rng.integers(1, 3)), f"k.py:{step}")
        elif action == 0:
            owner = s.buffer.owner
            dst = Buffer(1000 + step, owner, f"d{step}", (8, 128), 4, "VMEM")
            rows = int(rng.choice([2, 4, 8]))
            box = ((0, rows), (0, 128))
            m.dma_start(
                owner,
                owner,
                View(src, box, (rows, 128), 4),
                View(dst, box, (rows, 128), 4),
                s,
                None,
                f"k.py:{step}",
                "k",
            )
        else:
            amount = 1 if s.kind == "REGULAR" else int(rng.choice([2, 4, 8])) * 128 * 4
            done = m.try_wait(s.buffer.owner, s, amount, where=f"k.py:{step}")
            record = s.waits[-1] if done and s.waits else None
            trace.append(
                (
                    done,
                    None
                    if record is None
                    else (
                        sorted(record.used[0]),
                        None if record.used[1] is None else record.used[1].tolist(),
                    ),
                )
            )
        trace.append(
            (m.clocks.rows.tolist(), [(x.credit, [c.seq for c in x.pending]) for x in sems])
        )
    return trace


def test_the_one_contribution_wait_path_computes_what_the_general_path_does() -> None:
    """try_wait's direct path (one pending contribution, needed, no hint) against the
    general outcome(): the same verdicts, guarantees, learned clocks, credits and rows,
    including waits on the waiter's own copies (whose clock it does not acquire)."""
    direct_taken = 0
    for seed in range(25):
        fast = _random_waits(seed, general=False)
        slow = _random_waits(seed, general=True)
        assert fast == slow, seed
        direct_taken += sum(1 for t in fast if isinstance(t[0], bool) and t[0])
    assert direct_taken > 100  # the runs do complete waits
