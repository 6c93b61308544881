"""Check a carried NamedTuple against its jaxtyping shape annotations (the legend, enforced).

The library annotates ``LoopState``, ``DecodeOutput``, the round tuples, ``KVCache`` and
``DrafterContext`` with jaxtyping shapes (``Int[Array, "B O"]``) under ``TYPE_CHECKING`` only:
jaxtyping is not a runtime dependency. ``check_shapes`` resolves those annotations here and
checks every field, recursively, with each letter bound to one size across the whole tree.
"""

from __future__ import annotations

import sys
import types
import typing

import jax
import jax.numpy as jnp
import jaxtyping

_NAMES = {n: getattr(jaxtyping, n) for n in ("Array", "Bool", "Float", "Int", "Key", "Shaped")}


def _hints(cls) -> dict:
    module = vars(sys.modules[cls.__module__])
    return typing.get_type_hints(cls, globalns={**module, **_NAMES})


def _is_namedtuple_type(t) -> bool:
    return isinstance(t, type) and issubclass(t, tuple) and hasattr(t, "_fields")


def _check(value, hint, where: str, errors: list):
    if hint is typing.Any:
        return
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(hint)
        if value is None:
            if type(None) not in options:
                errors.append(f"{where}: None, expected {hint}")
            return
        options = [o for o in options if o is not type(None)]
        if len(options) == 1:
            return _check(value, options[0], where, errors)
        if not any(_matches(value, o) for o in options):
            errors.append(f"{where}: {_describe(value)} matches none of {options}")
        return
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple):
            errors.append(f"{where}: {_describe(value)}, expected a tuple")
            return
        items = zip(value, args) if args[-1:] != (Ellipsis,) else ((v, args[0]) for v in value)
        for i, (v, h) in enumerate(items):
            _check(v, h, f"{where}[{i}]", errors)
        return
    if _is_namedtuple_type(hint):
        if not isinstance(value, hint):
            errors.append(f"{where}: {_describe(value)}, expected {hint.__name__}")
            return
        _fields_in_scope(value, hint, where, errors)
        return
    if not isinstance(value, hint):
        errors.append(f"{where}: {_describe(value)} is not {hint}")


def _matches(value, hint) -> bool:
    errors: list = []
    _check(value, hint, "", errors)
    return not errors


def _describe(x) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{x.dtype}{list(x.shape)}"
    return type(x).__name__


_PINNED: dict[str, int] = {}


@jaxtyping.jaxtyped(typechecker=None)
def _fields_in_scope(value, cls, where: str, errors: list):
    """The fields of one NamedTuple, with letters bound within it (a nested tuple, e.g. the
    drafter context inside the loop state, has its own ``S``, ``K``, ``D``); the pinned
    letters hold everywhere."""
    for letter, n in _PINNED.items():
        isinstance(jnp.zeros((n,)), jaxtyping.Shaped[jax.Array, f" {letter}"])
    for name, h in _hints(cls).items():
        _check(getattr(value, name), h, f"{where}.{name}", errors)


def check_shapes(tree, **sizes: int) -> None:
    """Raise ``AssertionError`` naming every field of ``tree`` (a NamedTuple) whose shape or
    dtype breaks its annotation. Within one tuple each letter binds one size; ``sizes`` pins
    letters (``B=2``) in every nested tuple too."""
    errors: list[str] = []
    _PINNED.clear()
    _PINNED.update(sizes)
    try:
        _check(tree, type(tree), type(tree).__name__, errors)
    finally:
        _PINNED.clear()
    assert not errors, "shape check failed:\n  " + "\n  ".join(errors)
