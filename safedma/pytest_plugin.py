"""pytest plugin: simulated TPU devices on the CPU, set up before jax starts.

jax fixes the number of CPU devices once, when it creates its CPU backend, from
``XLA_FLAGS=--xla_force_host_platform_device_count=N``; a multi-device kernel
test therefore needs that variable set before any test uses jax. Installed with
safedma, this plugin does it from one line of pytest configuration::

    [tool.pytest.ini_options]
    safedma_devices = 8

and sets ``JAX_PLATFORMS`` (default ``cpu``, ini option ``safedma_platforms``)
unless it is already set, so a machine with libtpu and no TPU runs quietly.
Without ``safedma_devices`` (or ``--safedma-devices``) the plugin changes no
environment variable. Variables it set are restored when pytest finishes.

Fixtures: ``simulated_mesh_factory`` (``factory(shape, axis_names)`` ->
``jax.sharding.Mesh`` over the simulated devices) and ``simulated_devices``
(how many there are).

Verifying every kernel the suite runs: ``--safedma-verify`` (or the ini option
``safedma_verify = true``, or ``SAFEDMA_VERIFY=1`` in the environment, which wins
over the ini) runs :func:`safedma.testing.verify` on every kernel program the
tests execute, with the arguments and mesh it ran with, once per program and
argument types per session. A protocol mistake fails the test that ran the
kernel, with verify's message; a program verify cannot check is a
:class:`VerifyUnsupportedWarning` (``safedma_verify_unsupported = fail`` makes it
a failure). ``safedma_verify_timeout`` (seconds, default 30) bounds each
verification. A test that runs a broken kernel on purpose says so with
``@pytest.mark.safedma_verify_expected("LeftoverSemaphoreError")``. Without the
option, jax is left untouched.

The plugin is registered under this module's name, so ``-p
no:safedma.pytest_plugin`` turns it off, and a ``conftest.py`` may list it in
``pytest_plugins`` (as safedma's own does) without registering it twice.
Importing this module imports no jax and changes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, cast

import pytest

from safedma._arguments import environment_switch

if TYPE_CHECKING:
    from jax.sharding import Mesh

__all__ = [
    "MeshFactory",
    "VerifyUnsupportedWarning",
    "simulated_devices",
    "simulated_mesh_factory",
]

DEVICES_OPTION: Final = "safedma_devices"
#: The most CPU devices the plugin asks jax to simulate.
MAX_DEVICES: Final = 1024
PLATFORMS_OPTION: Final = "safedma_platforms"
_DEVICE_FLAG: Final = "--xla_force_host_platform_device_count"

MeshFactory = Callable[[int | Sequence[int], str | Sequence[str]], "Mesh"]

VERIFY_OPTION: Final = "safedma_verify"
VERIFY_ENVIRONMENT: Final = "SAFEDMA_VERIFY"
UNSUPPORTED_OPTION: Final = "safedma_verify_unsupported"
TIMEOUT_OPTION: Final = "safedma_verify_timeout"
EXPECTED_MARKER: Final = "safedma_verify_expected"

_configured_devices = pytest.StashKey[int]()
_saved_environment = pytest.StashKey[dict[str, str | None]]()
_VERIFY_PLUGIN: Final = "safedma-verify-every-kernel"


class VerifyUnsupportedWarning(UserWarning):
    """A kernel program a test ran that ``--safedma-verify`` could not check.

    verify does not model something it does (or ran out of time, or failed): the
    kernel was run, not proved. ``safedma_verify_unsupported = fail`` makes it a
    test failure; ``-W error::safedma.pytest_plugin.VerifyUnsupportedWarning`` too.
    """


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        DEVICES_OPTION,
        "safedma: number of CPU devices jax simulates (sets XLA_FLAGS before jax starts); "
        "unset: the plugin changes nothing",
        default="",
    )
    parser.addini(
        PLATFORMS_OPTION,
        "safedma: JAX_PLATFORMS used with safedma_devices when it is not already set "
        "(default: cpu)",
        default="cpu",
    )
    parser.getgroup("safedma").addoption(
        "--safedma-devices",
        dest=DEVICES_OPTION,
        default=None,
        metavar="N",
        help="simulate N CPU devices for jax (overrides the safedma_devices ini option)",
    )
    parser.addini(
        VERIFY_OPTION,
        "safedma: verify every kernel the tests run with safedma.testing.verify "
        f"(the environment variable {VERIFY_ENVIRONMENT} wins over this)",
        type="bool",
        default=False,
    )
    parser.addini(
        UNSUPPORTED_OPTION,
        "safedma: a kernel safedma_verify cannot check: warn (default) or fail",
        default="warn",
    )
    parser.addini(
        TIMEOUT_OPTION,
        "safedma: seconds safedma_verify may spend on one kernel program (default 30)",
        default="30",
    )
    group = parser.getgroup("safedma")
    group.addoption(
        "--safedma-verify",
        dest=VERIFY_OPTION,
        action="store_true",
        default=False,
        help="verify the DMA/semaphore protocol of every kernel the tests run; a "
        "mistake fails the test that ran it",
    )
    group.addoption(
        "--safedma-verify-unsupported",
        dest=UNSUPPORTED_OPTION,
        choices=("warn", "fail"),
        default=None,
        help="a kernel --safedma-verify cannot check: warn (default) or fail the test",
    )
    group.addoption(
        "--safedma-verify-timeout",
        dest=TIMEOUT_OPTION,
        default=None,
        metavar="SECONDS",
        help="seconds --safedma-verify may spend on one kernel program (default 30)",
    )


def _requested_devices(config: pytest.Config) -> int | None:
    # Before conftests load, the command line is parsed only into known_args_namespace.
    early = getattr(config.known_args_namespace, DEVICES_OPTION, None)
    raw = early or config.getoption(DEVICES_OPTION, default=None) or config.getini(DEVICES_OPTION)
    text = str(raw).strip()
    if not text:
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise pytest.UsageError(
            f"{DEVICES_OPTION} = {text!r}: expected a positive whole number of simulated "
            "devices, such as 8"
        )
    if count > MAX_DEVICES:
        raise pytest.UsageError(
            f"{DEVICES_OPTION} = {text!r}: at most {MAX_DEVICES} simulated devices (each is a "
            "CPU device jax creates at start-up: 1024 take about 10 s and 0.5 GB, and the "
            "time grows with the count). Simulate a smaller mesh, such as 8; "
            "safedma.testing.verify proves a kernel on a mesh of any size without devices "
            "(abstract_mesh)."
        )
    return count


def _set(saved: dict[str, str | None], name: str, value: str) -> None:
    saved.setdefault(name, os.environ.get(name))
    os.environ[name] = value


def _configure_environment(config: pytest.Config) -> None:
    if _configured_devices in config.stash:  # both hooks below call this; once is enough
        return
    count = _requested_devices(config)
    if count is None:
        return
    saved: dict[str, str | None] = {}
    flags = os.environ.get("XLA_FLAGS", "")
    if _DEVICE_FLAG not in flags:  # a count the user already set wins
        _set(saved, "XLA_FLAGS", f"{flags} {_DEVICE_FLAG}={count}".strip())
    platforms = str(config.getini(PLATFORMS_OPTION)).strip()
    if platforms and not os.environ.get("JAX_PLATFORMS"):
        _set(saved, "JAX_PLATFORMS", platforms)
    config.stash[_configured_devices] = count
    config.stash[_saved_environment] = saved


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # Before conftest.py files are imported: installed plugins get this hook.
    _configure_environment(early_config)


def pytest_configure(config: pytest.Config) -> None:
    # A plugin loaded by a conftest's pytest_plugins arrives after the hook above;
    # test modules are imported after this one.
    _configure_environment(config)
    config.addinivalue_line(
        "markers",
        f"{EXPECTED_MARKER}(*names, errors=[classes]): the test runs a kernel with these "
        "protocol mistakes on purpose (safedma.testing error names or classes; none: "
        "any); --safedma-verify reports them without failing the test",
    )
    _start_verifying(config)


def _verify_requested(config: pytest.Config) -> bool:
    if config.getoption(VERIFY_OPTION, default=False):
        return True
    if not os.environ.get(VERIFY_ENVIRONMENT, "").strip():
        return bool(config.getini(VERIFY_OPTION))
    try:
        return environment_switch(VERIFY_ENVIRONMENT, "verify every kernel the tests run")
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


def _verify_settings(config: pytest.Config) -> tuple[bool, float]:
    """(unsupported kernels fail the test, seconds per program), checked."""
    mode = str(
        config.getoption(UNSUPPORTED_OPTION, default=None) or config.getini(UNSUPPORTED_OPTION)
    ).strip()
    if mode not in ("warn", "fail"):
        raise pytest.UsageError(f"{UNSUPPORTED_OPTION} = {mode!r}: expected warn or fail")
    raw = str(config.getoption(TIMEOUT_OPTION, default=None) or config.getini(TIMEOUT_OPTION))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise pytest.UsageError(f"{TIMEOUT_OPTION} = {raw.strip()!r}: expected seconds, such as 30")
    return mode == "fail", seconds


def _start_verifying(config: pytest.Config) -> None:
    if config.pluginmanager.has_plugin(_VERIFY_PLUGIN) or not _verify_requested(config):
        return
    fail_unsupported, seconds = _verify_settings(config)
    # Only now: without the option the plugin imports no jax and registers no hooks.
    from safedma.testing._suite._plugin import VerifyEveryKernel

    plugin = VerifyEveryKernel(seconds, fail_unsupported, VerifyUnsupportedWarning)
    config.pluginmanager.register(plugin, _VERIFY_PLUGIN)
    config.add_cleanup(plugin.close)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _saved_environment not in config.stash:
        return
    for name, value in config.stash[_saved_environment].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def simulated_devices(pytestconfig: pytest.Config) -> int:
    """The number of CPU devices jax has; fails with the fix when fewer than configured."""
    import jax

    have = len(cast("list[object]", jax.devices("cpu")))  # pyright: ignore[reportUnknownMemberType]
    wanted = pytestconfig.stash.get(_configured_devices, None)
    if wanted is not None and have < wanted:
        pytest.fail(
            f"{DEVICES_OPTION} = {wanted}, but jax has {have} CPU devices: jax started before "
            "the plugin set XLA_FLAGS (something used jax while pytest was starting, or "
            "XLA_FLAGS already held a smaller --xla_force_host_platform_device_count)",
            pytrace=False,
        )
    return have


@pytest.fixture(scope="session")
def simulated_mesh_factory(simulated_devices: int) -> MeshFactory:
    """``factory(shape, axis_names)``: a mesh over the simulated CPU devices.

    ``simulated_mesh_factory((2, 4), ("x", "y"))`` is
    ``safedma.testing.simulated_mesh((2, 4), ("x", "y"))``; a mesh larger than
    the configured device count fails the test naming ``safedma_devices``.
    """
    from safedma.testing import simulated_mesh

    def factory(shape: int | Sequence[int], axis_names: str | Sequence[str]) -> Mesh:
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        needed = 1
        for d in dims:
            needed *= d
        if needed > simulated_devices:
            pytest.fail(
                f"a mesh of shape {dims} needs {needed} devices; jax has {simulated_devices}. "
                f"Set {DEVICES_OPTION} = {needed} (or more) under [tool.pytest.ini_options].",
                pytrace=False,
            )
        return simulated_mesh(shape, axis_names)

    return factory
