"""Run-time stand-ins for the private brand bases.

The type checker reads ``_brand_bases.pyi``, where these classes have typed
``.at`` views and deliberately lack everything a semaphore must not offer. At
run time nothing is ever an instance of them: the brands in ``refs.py`` are
``NewType`` identity functions, and values are the plain Pallas refs.
"""

# Listed so that checkers know refs.py imports them (pyright reports unused private classes).
__all__ = [
    "_DmaSemaphore",
    "_DmaSemaphoreArray",
    "_DmaSemaphoreArray2",
    "_DmaSemaphoreArray3",
    "_DmaSemaphoreArray4",
    "_RegularSemaphore",
    "_RegularSemaphoreArray",
    "_RegularSemaphoreArray2",
    "_BarrierSemaphore",
    "_DataRef",
]


class _DmaSemaphore:
    __slots__ = ()


class _DmaSemaphoreArray:
    __slots__ = ()


class _DmaSemaphoreArray2:
    __slots__ = ()


class _DmaSemaphoreArray3:
    __slots__ = ()


class _DmaSemaphoreArray4:
    __slots__ = ()


class _RegularSemaphore:
    __slots__ = ()


class _RegularSemaphoreArray:
    __slots__ = ()


class _RegularSemaphoreArray2:
    __slots__ = ()


class _BarrierSemaphore:
    __slots__ = ()


class _DataRef:
    __slots__ = ()
