"""Nested structures of tensors: lists, tuples (and namedtuples) and dicts, as tf.nest sees them.

Everything else is a leaf, including distributed values and variables. Dict keys are visited in
sorted order (insertion order when the keys do not sort), the same order in every replica.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def is_nested(x: Any) -> bool:
    return isinstance(x, (list, tuple, dict))


def _keys(d: dict) -> list:
    try:
        return sorted(d)
    except TypeError:
        return list(d)


def flatten(structure: Any) -> list[Any]:
    """The leaves of ``structure``, depth first."""
    out: list[Any] = []
    _flatten_into(structure, out)
    return out


def _flatten_into(s: Any, out: list[Any]) -> None:
    if isinstance(s, dict):
        for k in _keys(s):
            _flatten_into(s[k], out)
    elif isinstance(s, (list, tuple)):
        for item in s:
            _flatten_into(item, out)
    else:
        out.append(s)


def pack_sequence_as(structure: Any, flat: list[Any]) -> Any:
    """Rebuilds ``structure`` with the leaves taken in order from ``flat``."""
    it = iter(flat)
    result = _pack(structure, it)
    if next(it, _SENTINEL) is not _SENTINEL:
        raise ValueError("pack_sequence_as: more leaves than the structure has")
    return result


_SENTINEL = object()


def _pack(s: Any, it: Iterator[Any]) -> Any:
    if isinstance(s, dict):
        packed = {k: _pack(s[k], it) for k in _keys(s)}
        out = {k: packed[k] for k in s}
        if type(s) is dict:
            return out
        try:
            return type(s)(out)
        except TypeError:
            return out
    if isinstance(s, (list, tuple)):
        items = [_pack(item, it) for item in s]
        if isinstance(s, tuple) and hasattr(s, "_fields"):  # namedtuple
            return type(s)(*items)
        return type(s)(items)
    leaf = next(it, _SENTINEL)
    if leaf is _SENTINEL:
        raise ValueError("pack_sequence_as: fewer leaves than the structure has")
    return leaf


def assert_same_structure(a: Any, b: Any, what: str = "values") -> None:
    if not _same(a, b):
        raise ValueError(
            f"{what} do not have the same nested structure: {_describe(a)} vs {_describe(b)}"
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and set(a) == set(b)
            and all(_same(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b))
        )
    return True


def _describe(s: Any) -> str:
    if isinstance(s, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(s[k])}" for k in _keys(s)) + "}"
    if isinstance(s, (list, tuple)):
        inner = ", ".join(_describe(x) for x in s)
        return f"[{inner}]" if isinstance(s, list) else f"({inner})"
    return "."


def map_structure(fn: Callable[..., Any], *structures: Any) -> Any:
    """Applies ``fn`` leaf-wise to structures of the same shape."""
    first = structures[0]
    for other in structures[1:]:
        assert_same_structure(first, other)
    flats = [flatten(s) for s in structures]
    return pack_sequence_as(first, [fn(*leaves) for leaves in zip(*flats)])
