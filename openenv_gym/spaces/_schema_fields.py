"""One field's JSON Schema to its Gymnasium space and its :class:`FieldCodec`."""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from gymnasium import spaces as gspaces
from gymnasium.spaces import Space

from ._base import (
    _MAX_ARRAY_BYTES,
    _MAX_DEPTH,
    _MAX_ELEMENTS,
    _ROLES,
    TEXT_DEFAULT_MAX_LENGTH,
    SpaceMappingError,
    _field_error,
    _is_int,
    _too_big,
)
from ._classes import BoundedSequence, JsonText, UnboundedInteger, UnicodeText, UnsizedSequence, _sampleable
from ._field_codec import FieldCodec
from ._kinds import CodecKind
from ._schema_nodes import (
    _BRANCHES,
    _INT64,
    _float_bounds,
    _float_dtype,
    _int_bounds,
    _is_free,
    _length_bounds,
    _open_length,
    _pattern_choices,
    _required,
    _resolve,
)


def _make_box(
    low: float | int | None,
    high: float | int | None,
    shape: tuple[int, ...],
    dtype: np.dtype,
    role: str,
    path: str,
) -> gspaces.Box:
    lo: float | int = -np.inf if low is None else low
    hi: float | int = np.inf if high is None else high
    try:
        return gspaces.Box(low=lo, high=hi, shape=shape, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _field_error(role, path, f"cannot build Box: {exc}") from None


def _array_space(
    element: tuple[str, float | int | None, float | int | None],
    shape: tuple[int | None, ...],
    role: str,
    path: str,
) -> Space:
    """The space of an array of ``element`` = (type, low, high) with a closed shape."""
    etype, lo, hi = element
    dims = tuple(int(d) for d in shape if d is not None)
    if etype == "boolean":
        if any(d == 0 for d in dims):
            raise _field_error(role, path, "boolean array of length 0 cannot be mapped")
        return gspaces.MultiBinary(list(dims) if len(dims) != 1 else dims[0])
    dtype = np.dtype(np.int64) if etype == "integer" else _float_dtype(role)
    return _make_box(lo, hi, dims, dtype, role, path)


@dataclass(frozen=True)
class _Walk:
    """What every field of one :func:`field_space` walk shares, down to the deepest."""

    root: Mapping[str, Any]
    role: str
    exclude: Collection[str]
    variable: Collection[str]
    max_array_bytes: int

    def field(self, schema: Any, path: str, refs: frozenset[str], depth: int, null_parent: bool = False) -> tuple[Space, FieldCodec]:
        """:func:`field_space` of a field nested at ``depth``."""
        return field_space(
            schema,
            self.root,
            path,
            self.role,
            exclude=self.exclude,
            variable=self.variable,
            max_array_bytes=self.max_array_bytes,
            _refs=refs,
            _depth=depth,
            _null_parent=null_parent,
        )


def field_space(
    schema: Mapping[str, Any],
    root: Mapping[str, Any],
    path: str,
    role: str,
    *,
    exclude: Collection[str] = (),
    variable: Collection[str] = (),
    max_array_bytes: int = _MAX_ARRAY_BYTES,
    _refs: frozenset[str] = frozenset(),
    _depth: int = 0,
    _null_parent: bool = False,
) -> tuple[Space, FieldCodec]:
    """Map one field's JSON schema to its space and codec.

    Args:
        schema: the field's schema (may use ``$ref``, ``anyOf`` with null, ...).
        root: the document ``$ref`` pointers resolve against (the model schema
            holding ``$defs``).
        path: dotted field path, for error messages.
        role: ``"observation"`` or ``"action"``.
        exclude: dotted paths of nested fields to leave out.
        variable: dotted paths of open-length numeric arrays whose length
            varies (legal moves): a ``Sequence`` of numbers, not a ``Box``
            shaped by the first observation.
        max_array_bytes: the largest array a space may have, in bytes
            (``Limits.max_array_bytes``): its bounds are made as big.

    Returns:
        ``(space, codec)``. For an open-length observation array the space is a
        placeholder (unknown dimensions as 0) until :func:`fix_open_shapes`.

    Raises:
        SpaceMappingError: the field cannot be mapped; the message names the
            field and the argument that fixes it.
    """
    if role not in _ROLES:
        raise ValueError(f"role must be 'observation' or 'action', got {role!r}")
    if _depth > _MAX_DEPTH:
        raise _field_error(role, path, f"schema nested deeper than {_MAX_DEPTH} levels")
    s, nullable, refs = _resolve(schema, root, role, path, _refs)
    common: dict[str, Any] = {"path": path, "role": role, "nullable": nullable, "has_default": "default" in s, "default": s.get("default")}
    # An enum that can be null (itself, or in an observation through an Optional model around it) has
    # null as one more value, its last: a null reads as that, not as the first value (MCP's `error: null`).
    null_too = nullable or (_null_parent and role == "observation")
    walk = _Walk(root, role, exclude, variable, max_array_bytes)
    t = s.get("type")
    if t is None and isinstance(s.get("properties"), Mapping):
        t = "object"
    if "enum" in s or "const" in s:
        values = s["enum"] if "enum" in s else [s["const"]]
        if not isinstance(values, list) or not values:
            raise _field_error(role, path, "enum is empty or not a list")
        return _enum_field(values, null_too, common)
    if t == "boolean":
        return gspaces.Discrete(2), FieldCodec(kind=CodecKind.BOOL, dtype=np.dtype(np.int64), **common)
    if t == "integer":
        return _integer_field(s, path, role, common)
    if t == "number":
        flo, fhi = _float_bounds(s, role, path)
        box = _make_box(flo, fhi, (), _float_dtype(role), role, path)
        return box, FieldCodec(kind=CodecKind.BOX, dtype=box.dtype, shape=(), low=flo, high=fhi, **common)
    if t == "string":
        return _string_field(s, path, role, null_too, common)
    if t == "array":
        return _list_field(s, path, walk, refs, _depth, common)
    if _is_free(s):
        # Free-form content (Dict[str, Any], Any, a union of types): its JSON text.
        space: Space = JsonText(TEXT_DEFAULT_MAX_LENGTH, example=_free_example({**s, "type": t} if t else s, nullable))
        return space, FieldCodec(kind=CodecKind.JSON, **common)
    if t == "object":
        return _object_field(s, path, walk, refs, _depth, null_too, common)
    if t == "null":
        raise _field_error(role, path, "a field that is always null cannot be mapped")
    raise _field_error(role, path, f"schema type {t!r:.40} cannot be mapped")


def _integer_field(s: Mapping[str, Any], path: str, role: str, common: dict[str, Any]) -> tuple[Space, FieldCodec]:
    """``Discrete`` where both bounds are given (and the range fits int64), else an int64 ``Box``."""
    lo, hi = _int_bounds(s, role, path)
    if lo is not None and hi is not None and hi - lo + 1 <= int(_INT64.max):
        codec = FieldCodec(kind=CodecKind.DISCRETE, dtype=np.dtype(np.int64), low=lo, high=hi, **common)
        return gspaces.Discrete(hi - lo + 1, start=lo), codec
    # An action's integer with no range at all: any int64 is sent, none is sampled (see UnboundedInteger).
    box = (
        UnboundedInteger(field=path)
        if role == "action" and lo is None and hi is None
        else _make_box(lo, hi, (), np.dtype(np.int64), role, path)
    )
    return box, FieldCodec(kind=CodecKind.BOX, dtype=box.dtype, shape=(), low=lo, high=hi, **common)


def _string_field(s: Mapping[str, Any], path: str, role: str, null_too: bool, common: dict[str, Any]) -> tuple[Space, FieldCodec]:
    """A choice of literal words (``pattern`` ``^(a|b)$``) as an enum, any other string as :class:`UnicodeText`."""
    choices = _pattern_choices(s.get("pattern"))
    default = s.get("default")
    if isinstance(default, str) and choices is not None and default not in choices:
        choices = None  # (pydantic does not hold a default to its pattern: the server may send it)
    if choices is not None:  # "^(reveal|flag)$": as Literal["reveal", "flag"]
        return _enum_field(list(choices), null_too, common)
    min_len, max_len = _length_bounds(s, "minLength", "maxLength", role, path)
    if max_len is None:
        max_len = max(TEXT_DEFAULT_MAX_LENGTH, min_len)
    if role == "observation":
        # A null (Optional, or inside an Optional model) is read as "": observations
        # are not held to minLength.
        min_len = 0
    text = UnicodeText(max_len, min_length=min_len)
    return text, FieldCodec(kind=CodecKind.TEXT, **common)


def _list_field(
    s: Mapping[str, Any], path: str, walk: _Walk, refs: frozenset[str], depth: int, common: dict[str, Any]
) -> tuple[Space, FieldCodec]:
    """An ``array``: a ``Sequence`` of its items, or an array space of numbers or booleans (:func:`_array_field`)."""
    role = walk.role
    of_items = _sequence_items(s, walk.root, role, path, refs)
    # (an open-length array inside a list's items, or in an action, has no first observation to take its shape from)
    open_numbers = ("[]" in path or role == "action" or path in walk.variable) and _open_length(s) and isinstance(s.get("items"), Mapping)
    if not (of_items or open_numbers):
        return _array_field(s, walk.root, path, role, refs, depth, common, walk.max_array_bytes)
    # A list of strings, objects or enum values (chat messages, legal moves): a Sequence.
    if depth >= _MAX_DEPTH:
        raise _field_error(role, path, f"nested deeper than {_MAX_DEPTH} levels")
    item_space, item_codec = walk.field(s["items"], f"{path}[]", refs, depth + 1)
    codec = FieldCodec(kind=CodecKind.SEQUENCE, children=(("item", item_codec),), **common)
    if role == "action" and "maxItems" not in s and not of_items:
        return UnsizedSequence(item_space, field=path), codec  # (numbers, of a length the schema does not say)
    if role == "action" and ("minItems" in s or "maxItems" in s):  # (observations are not held to them, as with text)
        lo_n, hi_n = _length_bounds(s, "minItems", "maxItems", role, path)
        return BoundedSequence(item_space, min_length=lo_n, max_length=hi_n), codec
    return gspaces.Sequence(item_space, stack=False), codec


def _object_field(
    s: Mapping[str, Any], path: str, walk: _Walk, refs: frozenset[str], depth: int, null_too: bool, common: dict[str, Any]
) -> tuple[Space, FieldCodec]:
    """An ``object`` with ``properties``: a ``Dict`` of its fields, keys sorted; optional action fields that cannot be mapped left out."""
    role = walk.role
    props = s.get("properties")
    if not isinstance(props, Mapping):  # ("items" beside "object", or properties that are no map)
        raise _field_error(role, path, f"object 'properties' must be a map, got {props!r:.40}")
    required = _required(s)
    children: list[tuple[str, Space, FieldCodec]] = []
    excluded = set(walk.exclude)
    for name, sub in props.items():
        sub_path = f"{path}.{name}" if path else str(name)
        if sub_path in excluded:
            continue
        try:
            sp, cd = walk.field(sub, sub_path, refs, depth + 1, null_parent=null_too)
        except SpaceMappingError:
            # An optional action field the server can fill with its default.
            if role == "action" and name not in required:
                continue
            raise
        if role == "action" and name not in required:
            sp, cd = _sampleable(sp), replace(cd, optional=True)  # (the server has a default for it)
        children.append((str(name), sp, cd))
    children.sort(key=lambda c: c[0])
    space = gspaces.Dict([(k, sp) for k, sp, _ in children])
    codec = FieldCodec(kind=CodecKind.DICT, children=tuple((k, cd) for k, _, cd in children), **common)
    return space, codec


def _enum_field(values: list[Any], null_too: bool, common: dict[str, Any]) -> tuple[Space, FieldCodec]:
    """``Discrete`` over ``values`` (and ``None`` last, with ``null_too``, unless it is one of them already)."""
    if null_too and not any(v is None for v in values):
        values = [*values, None]
    codec = FieldCodec(kind=CodecKind.ENUM, values=tuple(values), dtype=np.dtype(np.int64), **common)
    return gspaces.Discrete(len(values)), codec


def _sequence_items(s: Mapping[str, Any], root: Mapping[str, Any], role: str, path: str, refs: frozenset[str]) -> bool:
    """Whether the array ``s`` holds strings, objects or enum values (innermost, through nested lists)."""
    cur: Mapping[str, Any] = s
    for _ in range(_MAX_DEPTH):
        items = cur.get("items")
        if cur.get("prefixItems") or not isinstance(items, Mapping):
            return False
        cur, _, refs = _resolve(items, root, role, path, refs)
        if "enum" in cur or "const" in cur:
            return True
        etype = cur.get("type")
        if etype != "array":
            return etype in ("string", "object", None) or _is_free(cur)
    return False


#: JSON text of a value of each JSON type, for examples of free-form fields.
_EXAMPLES = {"integer": "0", "number": "0", "boolean": "false", "string": '""', "array": "[]", "object": "{}"}


def _free_example(s: Mapping[str, Any], nullable: bool) -> str:
    """JSON text a free-form field accepts: its default, else null if allowed, else a value of its first type."""
    if "default" in s:
        try:
            return json.dumps(s["default"], allow_nan=False)
        except (TypeError, ValueError):
            pass
    if nullable:
        return "null"
    branches = s.get(_BRANCHES) or [s]
    first = branches[0] if isinstance(branches[0], Mapping) else {}
    if "const" in first:
        return json.dumps(first["const"])
    if isinstance(first.get("enum"), list) and first["enum"]:
        return json.dumps(first["enum"][0])
    t = first.get("type")
    if t in ("integer", "number") and isinstance(first.get("minimum"), (int, float)) and not isinstance(first.get("minimum"), bool):
        return json.dumps(first["minimum"])
    if "$ref" in first or "properties" in first:
        return "{}"
    return _EXAMPLES.get(t, "null") if isinstance(t, str) else "null"


def _array_field(
    s: Mapping[str, Any],
    root: Mapping[str, Any],
    path: str,
    role: str,
    refs: frozenset[str],
    depth: int,
    common: dict[str, Any],
    max_array_bytes: int = _MAX_ARRAY_BYTES,
) -> tuple[Space, FieldCodec]:
    """Map a (possibly nested) array of numbers or booleans, of at most ``max_array_bytes`` where its length is fixed."""
    shape, cur = _array_shape(s, root, path, role, refs, depth)
    etype, lo, hi, dtype = _element_type(cur, role, path)
    known = [d for d in shape if d is not None]
    if math.prod(known) > _MAX_ELEMENTS or _too_big(known, dtype, max_array_bytes):
        raise _field_error(
            role, path, f"array of {math.prod(known)} {dtype.name} elements is over {max_array_bytes} bytes (Limits.max_array_bytes)"
        )
    codec = FieldCodec(
        kind=CodecKind.MULTIBINARY if etype == "boolean" else CodecKind.BOX,
        dtype=dtype,
        shape=tuple(shape),
        low=lo,
        high=hi,
        as_bool=etype == "boolean",
        **common,
    )
    if None in shape:
        if role == "action":
            raise _field_error(role, path, "array of unknown length (no minItems == maxItems)")
        placeholder = tuple(0 if d is None else d for d in shape)
        return _make_box(lo, hi, placeholder, dtype, role, path), codec
    return _array_space((etype, lo, hi), tuple(shape), role, path), codec


def _array_shape(
    s: Mapping[str, Any], root: Mapping[str, Any], path: str, role: str, refs: frozenset[str], depth: int
) -> tuple[list[int | None], Mapping[str, Any]]:
    """The shape of a (possibly nested) array (``None`` for a dimension of open length), and its element schema."""
    shape: list[int | None] = []
    cur: Mapping[str, Any] = s
    while True:
        if len(shape) >= _MAX_DEPTH or depth + len(shape) > _MAX_DEPTH:
            raise _field_error(role, path, f"array nested deeper than {_MAX_DEPTH} levels")
        lo_n, hi_n = cur.get("minItems"), cur.get("maxItems")
        prefix = cur.get("prefixItems")
        items = cur.get("items")
        if isinstance(prefix, list) and prefix and (items is None or items is False):
            # A fixed-length tuple (Tuple[float, float]): needs one element schema.
            resolved = [_resolve(p, root, role, path, refs)[0] for p in prefix]
            first = resolved[0]
            if any(_elem_key(r) != _elem_key(first) for r in resolved):
                raise _field_error(role, path, "tuple items of different types or bounds cannot be mapped")
            shape.append(len(prefix))
            cur = first
            etype = first.get("type")
            if etype == "array":
                continue
            break
        shape.append(lo_n if _is_int(lo_n) and lo_n == hi_n and lo_n >= 0 else None)
        if not isinstance(items, Mapping):
            raise _field_error(role, path, "array without an item schema cannot be mapped")
        cur, item_nullable, refs = _resolve(items, root, role, path, refs)
        del item_nullable  # null elements are rejected when received
        if "enum" in cur or "const" in cur:
            raise _field_error(role, path, "array of enum values cannot be mapped")
        if cur.get("type") != "array":
            break
    return shape, cur


def _element_type(cur: Mapping[str, Any], role: str, path: str) -> tuple[str, float | int | None, float | int | None, np.dtype]:
    """``(type, low, high, dtype)`` of an array's elements: numbers, integers or booleans (int8 0/1)."""
    etype = cur.get("type")
    if etype not in ("number", "integer", "boolean"):
        raise _field_error(
            role,
            path,
            f"array of {etype or 'untyped'} items cannot be mapped (only numbers and booleans)",
        )
    lo: float | int | None
    hi: float | int | None
    if etype == "integer":
        lo, hi = _int_bounds(cur, role, path)
        dtype: np.dtype = np.dtype(np.int64)
    elif etype == "number":
        lo, hi = _float_bounds(cur, role, path)
        dtype = _float_dtype(role)
    else:
        lo, hi, dtype = 0, 1, np.dtype(np.int8)
    return etype, lo, hi, dtype


def _elem_key(s: Mapping[str, Any]) -> tuple[Any, ...]:
    keys = (
        "type",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minItems",
        "maxItems",
        "items",
    )
    return tuple(repr(s.get(k)) for k in keys)
