"""Which kernel is being traced: its parameter names and its compiler configuration.

``safedma.checked`` opens a :func:`kernel_scope` each time a body is traced,
so messages can name refs by their kernel parameters; ``safedma.pallas_call``
(and ``safedma.core_kernel``) opens a :func:`kernel_config` around the call,
so checks inside the body can see what only the call knows (the
``collective_id``). Both are context variables: nested and concurrent traces
each see their own.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Generator, Mapping

from safedma import _compat

__all__ = [
    "KernelConfig",
    "KernelScope",
    "current_config",
    "current_scope",
    "entry_config",
    "kernel_config",
    "kernel_scope",
]


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """What the surrounding ``safedma.pallas_call`` knows about the kernel."""

    collective_id: int | None
    # Known to run on TensorCores (sd.pallas_call; sd.core_kernel over TensorCore meshes):
    # no DMA accumulate there (T5). False: not known (a SparseCore mesh, a raw entry).
    tensor_core: bool = False


@dataclasses.dataclass(eq=False)
class KernelScope:
    """The kernel body being traced: its name and the names of its refs."""

    kernel_name: str
    names: dict[int, str]
    config: KernelConfig | None
    keep_alive: list[object] = dataclasses.field(default_factory=list[object])
    # The body this one is traced inside (an emit_pipeline body inside its kernel): a ref
    # the inner body closes over keeps the name the outer body gave it.
    enclosing: KernelScope | None = None

    def name_of(self, ref: object) -> str | None:
        name = self.names.get(id(_compat.root_of(ref)))
        if name is None and self.enclosing is not None:
            return self.enclosing.name_of(ref)
        return name


_current: contextvars.ContextVar[KernelScope | None] = contextvars.ContextVar(
    "safedma_kernel_scope", default=None
)
_config: contextvars.ContextVar[KernelConfig | None] = contextvars.ContextVar(
    "safedma_kernel_config", default=None
)


def current_scope() -> KernelScope | None:
    return _current.get()


def current_config() -> KernelConfig | None:
    """The configuration of the kernel being traced, if a safedma entry point knows it."""
    scope = _current.get()
    return scope.config if scope is not None else _config.get()


def entry_config() -> KernelConfig | None:
    """The configuration a safedma entry point set around the call being traced."""
    return _config.get()


@contextlib.contextmanager
def kernel_config(config: KernelConfig) -> Generator[None, None, None]:
    """Make ``config`` visible to the kernel bodies traced inside this block."""
    token = _config.set(config)
    try:
        yield
    finally:
        _config.reset(token)


@contextlib.contextmanager
def kernel_scope(
    kernel_name: str, named_refs: Mapping[str, object]
) -> Generator[KernelScope, None, None]:
    """Name the refs of one kernel body while it is traced."""
    scope = KernelScope(
        kernel_name=kernel_name,
        names={id(_compat.root_of(ref)): name for name, ref in named_refs.items()},
        config=_config.get(),
        # ids name refs only while the refs live: keep them for the whole trace.
        keep_alive=list(named_refs.values()),
        enclosing=_current.get(),
    )
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)
