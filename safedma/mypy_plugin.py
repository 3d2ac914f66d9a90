"""A mypy plugin that names safedma mistakes in the user's words.

Enable it with one line of mypy configuration::

    [tool.mypy]
    plugins = ["safedma.mypy_plugin"]

Without it every mistake below is still a mypy error; the plugin adds (or, for a
missing operation, replaces) the message with a sentence that says what is
wrong and what to do:

* ``start()`` / ``started_elsewhere()`` / ``incoming()`` on a ``RemoteCopy``
  that lacks its send semaphore or target device (next to mypy's "Invalid self
  argument" [misc]);
* an operation a safedma object does not have (``wait_send()`` on a local
  handle, ``wait()`` on a copy description, ...): the same sentence the
  run-time check raises, instead of "has no attribute" [attr-defined];
* a ``jax.Array`` (a semaphore's or a ref's *value*) where a semaphore or a
  data ref belongs (next to mypy's [arg-type]).

The added sentences have their own error codes, sub-codes of the one mypy uses
without the plugin, so an existing ``# type: ignore[misc]`` / ``[arg-type]``
still covers the line; the replaced one keeps mypy's ``[attr-defined]``. The
plugin never makes mypy accept code it would otherwise reject.

This module must not import jax: mypy loads it into its own process. It imports
only ``safedma._messages`` (the sentences it shares with the run-time checks),
and importing that runs ``safedma/__init__``, whose names load lazily, so no jax
(``tests/packaging/test_import_hygiene.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mypy.errorcodes import ARG_TYPE, ATTR_DEFINED, MISC, ErrorCode
from mypy.nodes import Decorator, FuncDef, OverloadedFuncDef
from mypy.options import Options
from mypy.plugin import (
    AttributeContext,
    ClassDefContext,
    FunctionContext,
    FunctionSigContext,
    MethodContext,
    MethodSigContext,
    Plugin,
)
from mypy.plugins.common import add_attribute_to_class
from mypy.types import (
    AnyType,
    CallableType,
    FunctionLike,
    Instance,
    Type,
    TypeOfAny,
    UnionType,
    get_proper_type,
)

from safedma import _messages

__all__ = [
    "INCOMPLETE_COPY",
    "MISSING_OPERATIONS",
    "NO_SUCH_OPERATION",
    "VALUE_FOR_REF",
    "SafeDmaPlugin",
    "missing_operation_message",
    "plugin",
]

INCOMPLETE_COPY = ErrorCode(
    "safedma-incomplete-copy",
    "A RemoteCopy is started or waited before it has a send semaphore and a target device",
    "safedma",
    sub_code_of=MISC,
)
# A missing operation keeps mypy's own code: the plugin's sentence replaces mypy's
# "has no attribute" message, and a parent code covering only a sub-code would be an
# "unused type: ignore" under --strict (--warn-unused-ignores).
NO_SUCH_OPERATION = ATTR_DEFINED
VALUE_FOR_REF = ErrorCode(
    "safedma-value-for-ref",
    "A jax.Array value passed where a semaphore or a data ref belongs",
    "safedma",
    sub_code_of=ARG_TYPE,
)

_COPIES = "safedma._copies"
_REMOTE_COPY = f"{_COPIES}.RemoteCopy"
_GIVEN = f"{_COPIES}.Given"
_MISSING = f"{_COPIES}.Missing"

# --- RemoteCopy started or waited half configured ------------------------------------

_NEEDS_BOTH = ("start", "started_elsewhere", "incoming")


def _incomplete_copy_message(has_send_sem: bool, has_device: bool, method: str) -> str:
    call = f".{method}()"
    if has_send_sem:
        return (
            f"RemoteCopy has a send semaphore but no target device: call .to(device) before {call}"
        )
    if has_device:
        return (
            "RemoteCopy has a target device but no send semaphore: call .with_send_sem(sem) "
            f"before {call}"
        )
    return (
        "RemoteCopy has no send semaphore and no target device: call "
        f".with_send_sem(sem).to(device) before {call} (for a copy on this device, use LocalCopy)"
    )


def _state(arg: Type) -> bool | None:
    """True for Given, False for Missing, None for anything else (Any, a type variable)."""
    proper = get_proper_type(arg)
    if isinstance(proper, Instance):
        if proper.type.fullname == _GIVEN:
            return True
        if proper.type.fullname == _MISSING:
            return False
    return None


def _check_remote_copy_complete(method: str) -> Callable[[MethodSigContext], FunctionLike]:
    def hook(ctx: MethodSigContext) -> FunctionLike:
        receiver = ctx.type
        if isinstance(receiver, Instance) and len(receiver.args) == 2:
            send_sem, device = (_state(arg) for arg in receiver.args)
            if send_sem is not None and device is not None and not (send_sem and device):
                ctx.api.fail(
                    _incomplete_copy_message(send_sem, device, method),
                    ctx.context,
                    code=INCOMPLETE_COPY,
                )
        return ctx.default_signature

    return hook


# --- Operations a copy or handle does not have ---------------------------------------
# The same sentences the run-time check raises for unchecked code (WrongOperationError,
# "<Class> has no <name>(): <hint>"): both read them from safedma._messages.

MISSING_OPERATIONS: Mapping[str, Mapping[str, str]] = {
    f"{_COPIES}.{class_name}": operations
    for class_name, operations in _messages.MISSING_OPERATIONS.items()
}


def missing_operation_message(class_fullname: str, name: str) -> str:
    return _messages.missing_operation(class_fullname.rsplit(".", 1)[-1], name)


def _defined_in_body(ctx: ClassDefContext) -> set[str]:
    names: set[str] = set()
    for statement in ctx.cls.defs.body:
        if isinstance(statement, (FuncDef, OverloadedFuncDef)):
            names.add(statement.name)
        elif isinstance(statement, Decorator):
            names.add(statement.func.name)
    return names


def _add_missing_operations(ctx: ClassDefContext) -> None:
    """Give the class a placeholder attribute per missing operation, so that using one
    reaches the attribute hook below (mypy calls no hook for an attribute that does
    not exist). Each access is still an error, only with a readable message."""
    operations = MISSING_OPERATIONS[ctx.cls.info.fullname]
    taken = _defined_in_body(ctx) | set(ctx.cls.info.names)
    for name in operations:
        if name not in taken:
            add_attribute_to_class(ctx.api, ctx.cls, name, AnyType(TypeOfAny.special_form))


def _report_missing_operation(class_fullname: str, name: str) -> Callable[[AttributeContext], Type]:
    def hook(ctx: AttributeContext) -> Type:
        ctx.api.fail(
            missing_operation_message(class_fullname, name), ctx.context, code=NO_SUCH_OPERATION
        )
        return AnyType(TypeOfAny.from_error)

    return hook


# --- A value where a semaphore or a data ref belongs ---------------------------------

_ARRAY_TYPES = frozenset({"jax.Array", "jax._src.basearray.Array"})
_SEMAPHORE_BRANDS = frozenset(
    {"safedma._refs.SemRef", "safedma._refs.RegularSem", "safedma._refs.BarrierSem"}
)
_DATA_REF = "safedma._refs.DataRef"
# Every safedma call that takes a semaphore or a data ref; formal types come from
# the signature mypy checks the call against.
_TAKES_REFS_FUNCTIONS = frozenset(
    {
        f"{_COPIES}.LocalCopy",
        _REMOTE_COPY,
        "safedma._semaphores.signal",
        "safedma._semaphores.wait",
        "safedma._semaphores.read",
    }
)
_TAKES_REFS_METHODS = frozenset({f"{_REMOTE_COPY}.with_send_sem"})


def _brands(formal: Type) -> list[str]:
    proper = get_proper_type(formal)
    items = proper.items if isinstance(proper, UnionType) else [proper]
    found: list[str] = []
    for item in items:
        item = get_proper_type(item)
        if isinstance(item, Instance) and (
            item.type.fullname in _SEMAPHORE_BRANDS or item.type.fullname == _DATA_REF
        ):
            found.append(item.type.name)
    return found


def _is_array(actual: Type) -> bool:
    proper = get_proper_type(actual)
    return isinstance(proper, Instance) and proper.type.fullname in _ARRAY_TYPES


def _value_for_ref_message(callee: str, parameter: str | None, brands: list[str]) -> str:
    where = f'Argument "{parameter}" to {callee}' if parameter else f"An argument to {callee}"
    if brands == ["DataRef"]:
        return (
            f"{where} is an array value (a jax.Array, as x[...] reads) where a data ref belongs: "
            "pass the ref, or a view of it with x.at[...]"
        )
    expected = " or ".join(b for b in brands if b != "DataRef")
    return (
        f"{where} is a semaphore's value (a jax.Array, as pl.semaphore_read or safedma.read "
        f"return) where the semaphore belongs: pass the {expected} itself"
    )


class _ValueForRefCheck:
    """Reports a jax.Array passed for a brand.

    The formal types are known before the call is checked (signature hook), the
    actual types after (function/method hook); the first hook notes the
    signature for the second.
    """

    def __init__(self) -> None:
        self._signatures: dict[int, CallableType] = {}

    def note_signature(self, ctx: FunctionSigContext | MethodSigContext) -> CallableType:
        self._signatures[id(ctx.context)] = ctx.default_signature
        return ctx.default_signature

    def check(self, callee: str) -> Callable[[FunctionContext | MethodContext], Type]:
        def hook(ctx: FunctionContext | MethodContext) -> Type:
            signature = self._signatures.pop(id(ctx.context), None)
            if signature is None or len(signature.arg_types) != len(ctx.arg_types):
                return ctx.default_return_type
            for formal, parameter, actuals in zip(
                signature.arg_types, ctx.callee_arg_names, ctx.arg_types
            ):
                brands = _brands(formal)
                if brands and any(_is_array(actual) for actual in actuals):
                    ctx.api.fail(
                        _value_for_ref_message(callee, parameter, brands),
                        ctx.context,
                        code=VALUE_FOR_REF,
                    )
            return ctx.default_return_type

        return hook


def _display_name(fullname: str) -> str:
    """``"safedma._copies.RemoteCopy.with_send_sem"`` -> ``'"with_send_sem" of "RemoteCopy"'``."""
    parts = fullname.split(".")
    if fullname in _TAKES_REFS_METHODS:
        return f'"{parts[-1]}" of "{parts[-2]}"'
    return f'"{parts[-1]}"'


class SafeDmaPlugin(Plugin):
    """The hooks; see the module docstring for what each one reports."""

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self._values = _ValueForRefCheck()

    def get_customize_class_mro_hook(
        self, fullname: str
    ) -> Callable[[ClassDefContext], None] | None:
        return _add_missing_operations if fullname in MISSING_OPERATIONS else None

    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        class_fullname, _, name = fullname.rpartition(".")
        if name in MISSING_OPERATIONS.get(class_fullname, {}):
            return _report_missing_operation(class_fullname, name)
        return None

    def get_method_signature_hook(
        self, fullname: str
    ) -> Callable[[MethodSigContext], FunctionLike] | None:
        class_fullname, _, method = fullname.rpartition(".")
        if class_fullname == _REMOTE_COPY and method in _NEEDS_BOTH:
            return _check_remote_copy_complete(method)
        if fullname in _TAKES_REFS_METHODS:
            return self._values.note_signature
        return None

    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        if fullname in _TAKES_REFS_METHODS:
            return self._values.check(_display_name(fullname))
        return None

    def get_function_signature_hook(
        self, fullname: str
    ) -> Callable[[FunctionSigContext], FunctionLike] | None:
        return self._values.note_signature if fullname in _TAKES_REFS_FUNCTIONS else None

    def get_function_hook(self, fullname: str) -> Callable[[FunctionContext], Type] | None:
        if fullname in _TAKES_REFS_FUNCTIONS:
            return self._values.check(_display_name(fullname))
        return None


def plugin(version: str) -> type[SafeDmaPlugin]:
    """mypy's entry point: the plugin class for this mypy version."""
    del version  # the hooks used exist in every mypy the dev dependencies allow (>= 1.15)
    return SafeDmaPlugin
