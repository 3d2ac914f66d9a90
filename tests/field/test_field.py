"""Every driven kernel of the field lane: verify and the trace-time checks on the real
package's kernel, against the verdicts results.json holds and the readings its driver
gives."""

from __future__ import annotations

import pytest

from tests.field import _results
from tests.field._kernel import FieldKernel
from tests.field._lane import lane_kernels, original_verdicts

READING_KINDS = ("true bug:", "by design:", "false alarm:", "unsupported:")


@pytest.mark.parametrize("kernel", lane_kernels(), ids=lambda k: k.name)
def test_field_kernel(kernel: FieldKernel) -> None:
    verdicts = original_verdicts(kernel)
    record = {
        "package": kernel.package,
        "module": kernel.module,
        "source": kernel.source,
        **{tool: verdict.record() for tool, verdict in verdicts.items()},
        "readings": dict(kernel.readings),
    }
    _results.write("kernels", kernel.name, record)

    for tool, verdict in verdicts.items():
        assert verdict.outcome != "crash", (
            f"{tool} crashed on {kernel.name}: {verdict.error}: {verdict.message}"
        )
        reading = kernel.readings.get(tool, "")
        # simulate's refusals are jax's interpreter's limits (a ref view, a gather): the
        # message says which; verify's refusals and every finding are read.
        needs_reading = verdict.outcome == "finding" or (
            verdict.outcome == "unsupported" and tool != "simulate"
        )
        if needs_reading:
            assert reading.startswith(READING_KINDS), (
                f"{tool} says of {kernel.name}: {verdict.error}: {verdict.headline}\n"
                "read it against the kernel and give the driver a reading "
                f"(one of {', '.join(READING_KINDS)} and why)"
            )
            assert not reading.startswith("false alarm:"), (
                f"{tool}: a false alarm on {kernel.name}: {reading}"
            )
        else:
            assert not reading, (
                f"{kernel.name} has a {tool} reading but {tool} now says nothing: {reading}"
            )

    expected = _results.committed()["kernels"].get(kernel.name)
    assert expected is not None, f"{kernel.name} is not in results.json yet: ./dev field --record"
    for tool, verdict in verdicts.items():
        want = expected.get(tool, {})
        got = verdict.record()
        assert (got["outcome"], got.get("error")) == (want.get("outcome"), want.get("error")), (
            f"{tool} on {kernel.name}: results.json says {want}, this run {got}"
        )
