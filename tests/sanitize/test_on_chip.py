"""The sanitizer on a real TPU (marked ``tpu``; skipped, with the reason, without one).

Run on a TPU machine with ``python -m pytest -m tpu tests/sanitize/test_on_chip.py``.
Every case runs in a process of its own (``tests/sanitize/chip_cases.py``) with
``JAX_PLATFORMS=tpu,cpu`` (the host callback needs the CPU) under a timeout: a hang the
sanitizer let through, or a chip left unusable, fails that case and never holds the
chip or the session. This process never opens the TPU itself (one process at a time
may hold it), so the platform is also asked of a subprocess.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.sanitize.chip_cases import CASES

REPO = Path(__file__).resolve().parents[2]
#: A case gets this long, start-up (about 15 s on a TPU host) and compile included.
TIMEOUT_S = 240
pytestmark = pytest.mark.tpu


def _run(case: str, platforms: str = "tpu,cpu") -> dict[str, Any]:
    env = dict(os.environ, JAX_PLATFORMS=platforms)
    env.pop("XLA_FLAGS", None)  # no simulated CPU devices next to the chip
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.sanitize.chip_cases", case],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(
            f"chip case {case!r} did not finish in {TIMEOUT_S} s: a hang the sanitizer "
            "did not bound (the process was killed)"
        )
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        pytest.fail(
            f"chip case {case!r} printed no result (exit {process.returncode}):\n{err[-4000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr"] = err[-4000:]
    return result


@functools.cache
def _platform() -> str:
    return str(_run("platform").get("platform"))


@pytest.fixture
def chip() -> None:
    platform = _platform()
    if platform != "tpu":
        pytest.skip(
            f"needs a TPU: jax.devices()[0].platform is {platform!r} in a subprocess with "
            "JAX_PLATFORMS=tpu,cpu"
        )


@pytest.mark.usefixtures("chip")
@pytest.mark.parametrize("case", [c for c in CASES if c != "no_cpu_platform"])
def test_on_the_chip(case: str) -> None:
    result = _run(case)
    assert result.get("ok"), f"{case}: {result.get('detail')}\n{result['stderr']}"
    print(f"{case} ({result['seconds']} s): {result['detail']}")


@pytest.mark.usefixtures("chip")
def test_without_the_cpu_platform_the_jit_path_says_what_it_needs() -> None:
    result = _run("no_cpu_platform", platforms="tpu")
    assert result.get("ok"), f"{result.get('detail')}\n{result['stderr']}"
