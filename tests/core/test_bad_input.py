"""Bad arguments to every public name fail at once, with an error that names the parameter,
the value received and the fix (docs/troubleshooting.md, "Bad arguments").

Each case calls one public function or class with one bad value and checks the error's
class, that its message shows the parameter and the value, and that it came quickly (a
bad value must not start a long trace, a simulation or jax's start-up first). The last
tests check that every public name of ``safedma``, ``safedma.testing`` and ``safedma.gpu``
has a case, or is listed, with the reason, among the names that take no argument worth
checking.
"""

from __future__ import annotations

import dataclasses
import time
from types import ModuleType
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import safedma as sd
import safedma.gpu as sdg
import safedma.testing as sdt
from safedma._arguments import environment_switch
from safedma._sanitize import _options

#: A bad argument is refused before any real work: well under this many seconds.
LIMIT_S = 10.0

F32 = jnp.float32
X = jax.ShapeDtypeStruct((8, 128), F32)


def _kernel(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...]


def _in_kernel(step: Callable[[Any, Any, Any], None]) -> Callable[[], object]:
    """Trace a kernel whose body runs ``step(buf, dma_sem, regular_sem)`` (no device, no
    lowering: only the body's checks run)."""

    def body(x_ref: Any, o_ref: Any, buf: Any, sem: Any, flag: Any) -> None:
        step(buf, sem, flag)
        o_ref[...] = x_ref[...]

    call = sd.pallas_call(
        body,
        out_shape=X,
        scratch_shapes=[sd.vmem((8, 128), F32), sd.dma_semaphore(), sd.regular_semaphore()],
    )
    return lambda: jax.eval_shape(call, X)


@dataclasses.dataclass(frozen=True)
class Case:
    """``call()`` must raise ``error`` with ``parameter`` and ``value`` in its message."""

    name: str  # the public name under test
    call: Callable[[], object]
    error: type[BaseException]
    parameter: str
    value: str


# The typed GPU layer's Tma, where this jax has Pallas Mosaic GPU (elsewhere Tma() itself
# is refused, naming the jax version).
TMA_CASES: list[Case] = [
    Case("Tma", lambda: sdg.Tma().smem(X, 5), TypeError, "name", "int 5"),
    Case("Tma", lambda: sdg.Tma().barriers(X, None), TypeError, "name", "None"),
    Case("Tma", lambda: sdg.Tma().smem(5, "x_smem"), TypeError, "ref", "int 5"),
    Case(
        "Tma",
        lambda: sdg.Tma().fori_loop("0", 2, lambda step, h: h, ()),
        sdg.LoopCarryError,
        "bounds",
        "'0'",
    ),
]


CASES: list[Case] = [
    # --- scratch declarations
    Case("vmem", lambda: sd.vmem((-8, 128), F32), ValueError, "shape", "(-8, 128)"),
    Case("vmem", lambda: sd.vmem(None, F32), TypeError, "shape", "None"),
    Case("vmem", lambda: sd.vmem((8, 128), "bogus"), TypeError, "dtype", "'bogus'"),
    Case("vmem", lambda: sd.vmem((8.5, 128), F32), TypeError, "shape", "8.5"),
    Case("smem", lambda: sd.smem(("8",), jnp.int32), TypeError, "shape", "'8'"),
    Case("smem", lambda: sd.smem((8,), None), TypeError, "dtype", "None"),
    Case("dma_semaphores", lambda: sd.dma_semaphores(-1), ValueError, "length", "-1"),
    Case("dma_semaphores", lambda: sd.dma_semaphores("2"), ValueError, "length", "'2'"),
    Case("regular_semaphores", lambda: sd.regular_semaphores(0), ValueError, "length", "0"),
    Case(
        "run_scoped",
        lambda: sd.run_scoped(lambda buf: None, 5),
        TypeError,
        "scratch 1",
        "int 5",
    ),
    Case(
        "run_scoped",
        lambda: sd.run_scoped(5, sd.dma_semaphore()),
        TypeError,
        "body",
        "int 5",
    ),
    Case(
        "run_scoped",
        lambda: sd.run_scoped(lambda buf: None, buf="vmem"),
        TypeError,
        "buf",
        "'vmem'",
    ),
    # --- entry points
    Case("checked", lambda: sd.checked(5), TypeError, "body", "int 5"),
    Case("checked", lambda: sd.checked(sanitize="yes"), TypeError, "sanitize", "'yes'"),
    Case("pallas_call", lambda: sd.pallas_call(5, X), TypeError, "body", "int 5"),
    Case("pallas_call", lambda: sd.pallas_call(_kernel, 5), TypeError, "out_shape", "int 5"),
    Case(
        "pallas_call",
        lambda: sd.pallas_call(_kernel, X, scratch_shapes=[5]),
        TypeError,
        "scratch_shapes[0]",
        "int 5",
    ),
    Case(
        "pallas_call",
        lambda: sd.pallas_call(_kernel, X, sanitize="on"),
        TypeError,
        "sanitize",
        "'on'",
    ),
    Case(
        "core_kernel",
        lambda: sd.core_kernel(_kernel, X, mesh=None),
        TypeError,
        "mesh",
        "None",
    ),
    Case(
        "core_kernel",
        lambda: sd.core_kernel(5, X, mesh=None),
        TypeError,
        "body",
        "int 5",
    ),
    Case(
        "emit_pipeline",
        lambda: sd.emit_pipeline(_kernel, grid="x"),
        TypeError,
        "grid",
        "'x'",
    ),
    Case(
        "emit_pipeline",
        lambda: sd.emit_pipeline(_kernel, grid=(0,)),
        ValueError,
        "grid",
        "(0,)",
    ),
    Case("emit_pipeline", lambda: sd.emit_pipeline(5, grid=(2,)), TypeError, "body", "int 5"),
    # --- futures
    Case("start_async", lambda: sd.start_async(5, dst=X), TypeError, "body", "int 5"),
    Case("start_async", lambda: sd.start_async(_kernel, dst="x"), TypeError, "dst", "'x'"),
    Case(
        "start_async",
        lambda: sd.start_async(_kernel, 3, dst=X),
        TypeError,
        "source 0",
        "int 3",
    ),
    Case("finish_async", lambda: sd.finish_async(_kernel, "x"), TypeError, "future", "'x'"),
    Case("finish_async", lambda: sd.finish_async(5, "x"), TypeError, "body", "int 5"),
    Case("checked_futures", lambda: sd.checked_futures(5), TypeError, "fn", "int 5"),
    # --- copies, semaphores and devices (their kernel-time checks need no kernel for these)
    Case("LocalCopy", lambda: sd.LocalCopy("x", "y", "z"), sd.NotARefError, "source", "'x'"),
    Case("RemoteCopy", lambda: sd.RemoteCopy(1, 2, 3), sd.NotARefError, "source", "int 1"),
    Case("CountedCopy", lambda: sd.CountedCopy(1.5, 2, 3), sd.NotARefError, "source", "1.5"),
    Case("wait_copies", lambda: sd.wait_copies("s"), sd.NotARefError, "semaphore", "'s'"),
    Case("wait_bytes", lambda: sd.wait_bytes("s", "b"), sd.NotARefError, "semaphore", "'s'"),
    Case("wait_all_into", lambda: sd.wait_all_into("b", "s"), sd.NotARefError, "", "'b'"),
    Case("wait_counted", lambda: sd.wait_counted(7, 1), sd.NotARefError, "semaphore", "int 7"),
    Case("signal", lambda: sd.signal("s"), sd.NotARefError, "semaphore", "'s'"),
    Case("wait", lambda: sd.wait(None), sd.MissingSemaphoreError, "semaphore", "missing"),
    Case("read", lambda: sd.read(3), sd.NotARefError, "semaphore", "int 3"),
    Case("sync_copy", lambda: sd.sync_copy("a", "b"), sd.NotARefError, "source", "'a'"),
    Case("priority", lambda: sd.priority("1"), sd.PriorityError, "priority", "'1'"),
    Case("priority", lambda: sd.priority(2), sd.PriorityError, "priority", "2"),
    Case("select_ref", lambda: sd.select_ref("i", 1, 2), TypeError, "index", "'i'"),
    Case("barrier_semaphore", lambda: sd.barrier_semaphore(tag=[1]), TypeError, "tag", "[1]"),
    Case("device", lambda: sd.device(x="0"), sd.DeviceIdError, "axis 'x'", "'0'"),
    Case("device", lambda: sd.device({1: 0}), sd.DeviceIdError, "axis", "int 1"),
    Case("device", lambda: sd.device("x"), sd.DeviceIdError, "dict", "'x'"),
    Case("mesh_coords", lambda: sd.mesh_coords(0.5), sd.DeviceIdError, "coordinate 0", "0.5"),
    Case("my_index", lambda: sd.my_index(0), sd.DeviceIdError, "axis", "int 0"),
    Case("axis_size", lambda: sd.axis_size(None), sd.DeviceIdError, "axis", "None"),
    Case("neighbour", lambda: sd.neighbour(1), sd.DeviceIdError, "axis", "int 1"),
    Case("neighbour", lambda: sd.neighbour("x", 1.5), sd.DeviceIdError, "shift", "1.5"),
    Case("logical_device", lambda: sd.logical_device("3"), sd.DeviceIdError, "", "'3'"),
    # --- values inside a kernel body
    Case(
        "signal",
        _in_kernel(lambda buf, sem, flag: sd.signal(flag, "2")),
        sd.InvalidAmountError,
        "increment",
        "'2'",
    ),
    Case(
        "wait",
        _in_kernel(lambda buf, sem, flag: sd.wait(flag, 1.0)),
        sd.InvalidAmountError,
        "value",
        "1.0",
    ),
    Case(
        "wait_counted",
        _in_kernel(lambda buf, sem, flag: sd.wait_counted(flag, "n")),
        sd.InvalidAmountError,
        "count",
        "'n'",
    ),
    Case(
        "wait_copies",
        _in_kernel(lambda buf, sem, flag: sd.wait_copies(sem, "copy")),
        TypeError,
        "copy 1",
        "'copy'",
    ),
    Case(
        "select_ref",
        _in_kernel(lambda buf, sem, flag: sd.select_ref(0.5, buf, buf)),
        TypeError,
        "index",
        "0.5",
    ),
    Case(
        "LocalCopy",
        _in_kernel(lambda buf, sem, flag: sd.LocalCopy(buf, buf, sem).start(priority=3)),
        sd.PriorityError,
        "priority",
        "3",
    ),
    # --- the sanitizer's options
    Case(
        "SanitizeOptions",
        lambda: sd.SanitizeOptions(hang_after_s="10"),
        TypeError,
        "hang_after_s",
        "'10'",
    ),
    Case("SanitizeOptions", lambda: sd.SanitizeOptions(polls=0), ValueError, "polls", "0"),
    Case(
        "SanitizeOptions",
        lambda: sd.SanitizeOptions(after_error_s=-1),
        ValueError,
        "after_error_s",
        "-1",
    ),
    # --- safedma.gpu (checked before plgpu is touched: the same on every jax)
    Case("copy_gmem_to_smem", lambda: sdg.copy_gmem_to_smem(X, 5, 5), TypeError, "dst", "int 5"),
    Case("commit_smem", lambda: sdg.commit_smem(5), TypeError, "argument 1", "int 5"),
    Case("copy_smem_to_gmem", lambda: sdg.copy_smem_to_gmem(None, X), TypeError, "src", "None"),
    *(
        TMA_CASES
        if sdg.available()
        else [Case("Tma", lambda: sdg.Tma(), sd.UnsupportedByJaxError, "jax", jax.__version__)]
    ),
    # --- safedma.testing
    Case("verify", lambda: sdt.verify(5), TypeError, "fn", "int 5"),
    Case("verify_gpu", lambda: sdt.verify_gpu(5), TypeError, "fn", "int 5"),
    Case("verify", lambda: sdt.verify(_kernel, mesh="x"), TypeError, "mesh", "'x'"),
    Case(
        "verify",
        lambda: sdt.verify(_kernel, mesh=sdt.abstract_mesh((2,), ("x",)), in_specs="x"),
        TypeError,
        "in_specs",
        "'x'",
    ),
    Case("verify", lambda: sdt.verify(_kernel, invocations="2"), TypeError, "invocations", "'2'"),
    Case("verify", lambda: sdt.verify(_kernel, invocations=0), ValueError, "invocations", "0"),
    Case("verify", lambda: sdt.verify(_kernel, timeout_s="9"), TypeError, "timeout_s", "'9'"),
    Case("verify", lambda: sdt.verify(_kernel, lockstep="yes"), ValueError, "lockstep", "'yes'"),
    Case("verify", lambda: sdt.verify(_kernel, progress="no"), TypeError, "progress", "'no'"),
    Case("simulate", lambda: sdt.simulate(5), TypeError, "fn", "int 5"),
    Case("simulate_gpu", lambda: sdt.simulate_gpu(5), TypeError, "fn", "int 5"),
    Case(
        "simulate_gpu",
        lambda: sdt.simulate_gpu(_kernel, timeout_s=-1),
        ValueError,
        "timeout_s",
        "-1",
    ),
    Case(
        "simulate_gpu",
        lambda: sdt.simulate_gpu(_kernel, detect_races=None),
        TypeError,
        "detect_races",
        "None",
    ),
    Case(
        "simulate_gpu",
        lambda: sdt.simulate_gpu(_kernel, uninitialized_memory="bogus"),
        ValueError,
        "uninitialized_memory",
        "'bogus'",
    ),
    Case("simulate", lambda: sdt.simulate(_kernel, mesh="x"), TypeError, "mesh", "'x'"),
    Case(
        "simulate",
        lambda: sdt.simulate(_kernel, mesh=sdt.abstract_mesh((1,), ("x",))),
        TypeError,
        "mesh",
        "AbstractMesh",
    ),
    Case("simulate", lambda: sdt.simulate(_kernel, timeout_s=None), TypeError, "timeout_s", "None"),
    Case(
        "simulate",
        lambda: sdt.simulate(_kernel, uninitialized_memory="bogus"),
        ValueError,
        "uninitialized_memory",
        "'bogus'",
    ),
    Case(
        "abstract_mesh",
        lambda: sdt.abstract_mesh((-1,), ("x",)),
        ValueError,
        "axis_sizes",
        "(-1,)",
    ),
    Case("abstract_mesh", lambda: sdt.abstract_mesh((2,), "x"), TypeError, "axis_names", "'x'"),
    Case(
        "abstract_mesh",
        lambda: sdt.abstract_mesh((2,), ("x",), tpu="v9"),
        ValueError,
        "tpu",
        "'v9'",
    ),
    Case("simulated_mesh", lambda: sdt.simulated_mesh(-2, "x"), ValueError, "shape", "-2"),
    Case("simulated_mesh", lambda: sdt.simulated_mesh((2,), (1,)), TypeError, "axis_names", "(1,)"),
    Case("mosaic_text", lambda: sdt.mosaic_text(5), TypeError, "fn", "int 5"),
    Case("mosaic_text", lambda: sdt.mosaic_text(_kernel, X, mesh="x"), TypeError, "mesh", "'x'"),
    Case("mosaic_kernels", lambda: sdt.mosaic_kernels(None), TypeError, "fn", "None"),
    Case(
        "assert_same_mosaic",
        lambda: sdt.assert_same_mosaic(_kernel, "b"),
        TypeError,
        "fn_b",
        "'b'",
    ),
    Case("compile_for_tpu", lambda: sdt.compile_for_tpu(5), TypeError, "fn", "int 5"),
    Case(
        "compile_for_tpu",
        lambda: sdt.compile_for_tpu(_kernel, topology=8),
        TypeError,
        "topology",
        "int 8",
    ),
    Case("tpu_mesh", lambda: sdt.tpu_mesh("v6e:2x2", (0,)), ValueError, "mesh_shape", "(0,)"),
    Case(
        "tpu_mesh", lambda: sdt.tpu_mesh("v6e:2x2", axis_names="x"), TypeError, "axis_names", "'x'"
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.name}-{c.parameter}-{c.value}")
def test_a_bad_argument_is_refused_with_its_name_and_value(case: Case) -> None:
    began = time.monotonic()
    with pytest.raises(case.error) as caught:
        case.call()
    took = time.monotonic() - began
    message = str(caught.value)
    assert case.parameter in message, message
    assert case.value in message, message
    assert took < LIMIT_S, f"{case.name} took {took:.1f} s to refuse a bad argument"


# --- environment switches


@pytest.mark.parametrize("value", ["bogus", "disable", "none", "2"])
def test_an_unknown_sanitize_switch_is_an_error_listing_the_spellings(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_options.ENV_SWITCH, value)
    with pytest.raises(
        ValueError, match=rf"SAFEDMA_SANITIZE='{value}'.*1, true, yes, on.*0, false"
    ):
        _options.requested()


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), (" Yes ", True), ("off", False), ("", False)]
)
def test_sanitize_switch_spellings(value: str, on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_options.ENV_SWITCH, value)
    assert _options.requested() is on


def test_a_bad_hang_bound_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_options.ENV_SWITCH, "1")
    monkeypatch.setenv(_options.ENV_HANG, "soon")
    with pytest.raises(ValueError, match="SAFEDMA_SANITIZE_HANG_S='soon'.*seconds"):
        _options.requested()


def test_environment_switch_reads_a_given_mapping() -> None:
    assert environment_switch("S", "x", {"S": "TRUE"}) is True
    assert environment_switch("S", "x", {}) is False
    with pytest.raises(ValueError, match="S='maybe'"):
        environment_switch("S", "x", {"S": "maybe"})


# --- public names: module paths, dir(), and the sweep's coverage


def _public(module: Any) -> dict[str, object]:
    return {name: getattr(module, name) for name in module.__all__}


def test_public_classes_print_with_the_public_module_path() -> None:
    for module in (sd, sdt):
        for name, value in _public(module).items():
            if isinstance(value, type) and getattr(sd, name, None) is not value:
                assert value.__module__ == module.__name__, (name, value.__module__)
            elif isinstance(value, type):  # safedma's own, re-exported by safedma.testing
                assert value.__module__ == "safedma", (name, value.__module__)
    assert repr(sd.DeviceIdError) == "<class 'safedma.DeviceIdError'>"
    assert repr(sdt.SemaphoreIndexError) == "<class 'safedma.testing.SemaphoreIndexError'>"
    for name, value in _public(sdg).items():
        if isinstance(value, type) and issubclass(value, BaseException):
            home = "safedma" if getattr(sd, name, None) is value else "safedma.gpu"
            assert value.__module__ == home, (name, value.__module__)


def test_dir_lists_the_public_names_only() -> None:
    for module in (sd, sdt):
        extra = set(dir(module)) - set(module.__all__) - {"__version__"}
        # A public subpackage already imported (safedma.testing) is listed too.
        assert all(isinstance(getattr(module, name), ModuleType) for name in extra), extra
        assert set(module.__all__) <= set(dir(module))


# Public names with no case above, and why.
TAKE_NOTHING_TO_CHECK = {
    # No arguments.
    "dma_semaphore": "takes no argument",
    "regular_semaphore": "takes no argument",
    "sanitizer_errors": "a context manager that takes no argument",
    # Types for annotations (brands, aliases, protocols, typed dicts, state markers): the
    # type checker checks their use; calling a brand is the identity.
    **dict.fromkeys(
        [
            "BarrierSem",
            "DataIndex",
            "DataRef",
            "Index",
            "RegularSem",
            "RegularSemArray",
            "RegularSemArray2",
            "SemArray",
            "SemArray2",
            "SemArray3",
            "SemArray4",
            "SemRef",
            "Scratch",
            "KernelCall",
            "PallasCallOptions",
            "CoreKernelOptions",
            "Given",
            "Missing",
        ],
        "a type for annotations",
    ),
    # Built by safedma and handed to the user (handles, futures, reports, results).
    **dict.fromkeys(
        [
            "Handle",
            "LocalHandle",
            "RemoteHandle",
            "IncomingHandle",
            "CountedHandle",
            "DmaFuture",
            "Device",
            "VerifyReport",
            "GpuVerifyReport",
            "TpuCompileReport",
            "MosaicKernel",
            "LeftoverSemaphore",
            "Race",
            "StuckWait",
            "StuckBarrierWait",
        ],
        "built by safedma, not by the user",
    ),
    # safedma.gpu: annotations for a kernel's refs, things the layer builds and hands
    # back (buffers, barriers, handles, loop steps), and a probe without arguments.
    **dict.fromkeys(["BarrierRef", "GmemIndex", "GmemRef", "SmemRef"], "a type for annotations"),
    **dict.fromkeys(
        [
            "Barrier",
            "Barriers",
            "LoadHandle",
            "Slot",
            "SmemArray",
            "SmemBuffer",
            "Step",
            "StoreHandle",
            "WrittenSmem",
        ],
        "built by safedma.gpu, not by the user",
    ),
    "available": "takes no argument",
    # Constants.
    "KERNEL_PLACEHOLDER": "a constant",
    "TPU_GENERATIONS": "a constant",
}


def test_every_public_name_is_swept_or_listed_with_a_reason() -> None:
    swept = {case.name for case in CASES}
    for module in (sd, sdt, sdg):
        for name, value in _public(module).items():
            if isinstance(value, type) and issubclass(value, BaseException):
                continue  # error classes take a message
            assert name in swept or name in TAKE_NOTHING_TO_CHECK, (
                f"{module.__name__}.{name} has no bad-input case and no reason to have none"
            )
    stale = (swept | set(TAKE_NOTHING_TO_CHECK)) - set(sd.__all__) - set(sdt.__all__)
    stale -= set(sdg.__all__)
    assert not stale, stale
