"""the stubs on jax's own raw kernels, branded mechanically at test time.

jax's installed ``ops/tpu`` kernel files are copied to a temporary directory,
their kernel parameters branded (tests/support/raw_kernels.py) and checked
with the stubs under mypy and pyright: no error may land on a DMA or semaphore
line (a false positive: these kernels are correct). Errors on other lines are
jax's own typing and are printed, not asserted.

A second pass annotates the same parameters the way production kernels (vLLM's,
tokamax's) do, with jax's own types: every data ref and every semaphore array
``jax.Array``. Only a single semaphore keeps its brand: a bare ``jax.Array`` where a
semaphore belongs is the stubs' S1 error (docs/stubs.md, Limits).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import raw_kernels as rk

pytestmark = pytest.mark.slow  # mypy and pyright over jax's kernels: about 3 minutes


@pytest.fixture(scope="module")
def branded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    work = tmp_path_factory.mktemp("raw_kernels")
    files, count = rk.prepare(work)
    assert len(files) >= 3 and count >= 40, (files, count)
    return work, files


# Brands a production kernel writes as jax.Array instead (a single semaphore keeps SemRef).
_AS_JAX_ARRAY = re.compile(r": (DataRef|SemArray[23]?)\b")


@pytest.fixture(scope="module")
def jax_annotated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    work = tmp_path_factory.mktemp("raw_kernels_jax_types")
    files, _ = rk.prepare(work)
    replaced = 0
    for path in files:
        text, count = _AS_JAX_ARRAY.subn(": jax.Array", path.read_text())
        assert "\nimport jax\n" in text, f"{path.name} does not import jax"
        path.write_text(text)
        replaced += count
    assert replaced >= 30, replaced
    return work, files


def test_branding_is_mechanical_and_complete() -> None:
    source = "def my_kernel(x_ref, o_ref, sems, flags_sem, bufs, n, *, k):\n    sems.at[0, 1]\n"
    text, count = rk.brand_source(source)
    assert count == 5
    assert "x_ref: DataRef" in text and "sems: SemArray2" in text and "bufs: DataRef" in text
    assert "flags_sem: SemRef" in text and "n," in text and "k)" in text


@pytest.mark.parametrize("checker", [rk.run_mypy, rk.run_pyright], ids=["mypy", "pyright"])
def test_no_error_on_a_dma_or_semaphore_line(
    checker: object, branded: tuple[Path, list[Path]]
) -> None:
    work, files = branded
    run = checker  # a function of (files, workdir, stubs)
    findings = run(files, work, rk.stubs_root())  # type: ignore[operator]
    others = [f for f in findings if not f.on_dma_line]
    print(f"\n{len(findings)} errors, {len(others)} on other lines (jax's own typing):")
    for finding in others:
        print("  ", finding.render())
    on_dma = [f.render() for f in findings if f.on_dma_line]
    assert not on_dma, "false positives of the stubs on correct jax kernels:\n" + "\n".join(on_dma)


@pytest.mark.parametrize("checker", [rk.run_mypy, rk.run_pyright], ids=["mypy", "pyright"])
def test_jax_type_annotations_give_no_error_on_a_dma_or_semaphore_line(
    checker: object, jax_annotated: tuple[Path, list[Path]]
) -> None:
    """Refs and semaphore arrays annotated ``jax.Array`` (``sems.at[i]`` is then jax's
    ``_IndexUpdateRef``): the stubs accept them, as production kernels are written.

    An error the checker also reports without the stubs is jax's own typing of such
    annotations (``ref.at[i]`` of a ``jax.Array`` has no ``reshape``), not the stubs'.
    """
    work, files = jax_annotated
    run = checker  # a function of (files, workdir, stubs)
    with_stubs = run(files, work, rk.stubs_root())  # type: ignore[operator]
    without = {(f.file, f.line, f.message) for f in run(files, work, None)}  # type: ignore[operator]
    theirs = [f for f in with_stubs if f.on_dma_line and (f.file, f.line, f.message) in without]
    on_dma = [f.render() for f in with_stubs if f.on_dma_line and f not in theirs]
    print(f"\n{len(with_stubs)} errors, {len(theirs)} on DMA lines also without the stubs:")
    for finding in theirs:
        print("  ", finding.render())
    assert not on_dma, "false positives on jax-annotated kernels:\n" + "\n".join(on_dma)


def test_the_check_can_fail(branded: tuple[Path, list[Path]]) -> None:
    """A misuse added to a branded copy is reported on its DMA line."""
    work, files = branded
    bad = work / "misuse_probe.py"
    bad.write_text(
        "from jax.experimental.pallas import tpu as pltpu\n"
        "from safedma import DataRef, SemArray\n"
        "def probe_kernel(x_ref: DataRef, o_ref: DataRef, sems: SemArray) -> None:\n"
        "    pltpu.make_async_copy(x_ref, o_ref, sems).start()\n"
    )
    try:
        for run in (rk.run_mypy, rk.run_pyright):
            found = [f for f in run([bad], work, rk.stubs_root()) if f.file == bad.name]
            assert [f.line for f in found if f.on_dma_line] == [4], [f.render() for f in found]
    finally:
        bad.unlink()
