"""Codecs: how the value of one field, or of a whole action or observation, maps to and from the JSON sent over the wire."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
from gymnasium.spaces import Space

from openenv_gym._numbers import cast_numbers, cast_problem, numbers_of

from ._base import (
    JSON_TEXT_MAX_DEPTH,
    OBSERVATION_BASE_FIELDS,
    SpaceMappingError,
    _field_error,
    _plain_json,
    _sent_as,
    _unsendable,
    plain_json,
)

#: Item kinds a ``Sequence(..., stack=True)`` can stack into one array.
_STACKABLE = frozenset({"box", "discrete", "bool", "enum", "multibinary", "multidiscrete"})


def _as_int(value: Any) -> int:
    """An integral JSON/numpy scalar as ``int``; ``TypeError`` for anything else."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    raise TypeError(f"expected an integer, got {type(value).__name__} {value!r:.60}")


def _json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: booleans differ from numbers, 1 == 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # e.g. arrays
        return False


@dataclass(frozen=True)
class FieldCodec:
    """How one field's JSON value maps to and from a value of its space.

    Attributes:
        kind: one of ``"enum"`` (``Discrete``; value = index into ``values``),
            ``"bool"`` (``Discrete(2)``; wire ``bool``), ``"discrete"``
            (``Discrete``; wire integer), ``"box"``, ``"multibinary"``,
            ``"multidiscrete"``, ``"text"``, ``"dict"`` (``children`` by key) and
            ``"tuple"`` (``children`` by position, keys ``"0"``, ``"1"``, ...) and
            ``"sequence"`` (``Sequence``: one child, ``"item"``, for every element)
            and ``"json"`` (:class:`JsonText`: free-form content as JSON text).
        path: dotted field path, used in error messages (``""`` for the root).
        role: ``"observation"`` or ``"action"``; selects the hint in errors.
        dtype: numpy dtype of array and discrete values (``None`` for text,
            dict, tuple).
        shape: shape of array values; ``None`` entries are dimensions of an
            open-length array not yet fixed by :func:`fix_open_shapes`.
        low, high: the element bounds of a schema-derived ``Box`` (``None`` =
            unbounded), used to rebuild open shapes and to fill nulls.
        values: the enum's JSON values, for ``kind == "enum"``.
        children: ``(key, codec)`` pairs of a dict or tuple, in space order.
        nullable: the schema allows ``null``; a ``null`` (or missing) value then
            decodes to the space's "zero" (see :meth:`null_value`).
        as_bool: array elements go on the wire as JSON booleans.
        reshape: arrays received are reshaped to ``shape`` (explicit spaces:
            a flat list for an ``(84, 84, 4)`` Box is accepted); otherwise the
            received nesting must have exactly ``shape``.
        has_default, default: the schema's default, used when a field is absent.
        optional: an action field the server does not require: left out of
            the message when its value says nothing (see ``to_wire``).
        shaped_by_first: an open-length array whose shape the first
            observation gave (:func:`fix_open_shapes`).
        stack: a ``Sequence(..., stack=True)`` of array items: its value is
            the items stacked into one array, ``(n, *item_shape)``.
    """

    kind: str
    path: str
    role: str = "observation"
    dtype: np.dtype | None = None
    shape: tuple[int | None, ...] = ()
    low: float | int | None = None
    high: float | int | None = None
    values: tuple[Any, ...] = ()
    children: tuple[tuple[str, FieldCodec], ...] = ()
    nullable: bool = False
    as_bool: bool = False
    reshape: bool = False
    has_default: bool = False
    default: Any = field(default=None, compare=False, hash=False)
    optional: bool = False
    shaped_by_first: bool = False
    stack: bool = False

    # -- inspection --------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """True if this codec or a child has an array dimension of unknown length."""
        return any(d is None for d in self.shape) or any(c.is_open for _, c in self.children)

    def open_paths(self) -> tuple[str, ...]:
        """Dotted paths of the open-length arrays below (and including) this codec."""
        if any(d is None for d in self.shape):
            return (self.path,)
        out: list[str] = []
        for _, child in self.children:
            out.extend(child.open_paths())
        return tuple(out)

    def _err(self, problem: str) -> SpaceMappingError:
        return _field_error(self.role, self.path, problem)

    def _check_closed(self) -> None:
        if any(d is None for d in self.shape):
            raise self._err("array of unknown length (the shape was not fixed from a first observation)")

    # -- wire -> space -----------------------------------------------------

    def from_wire(self, value: Any) -> Any:
        """Convert a received JSON value to a NEW value of this field's space.

        Returns ``np.int64`` (or the space's dtype) scalars for discrete kinds,
        fresh ``np.ndarray`` of ``dtype`` and ``shape`` for arrays (never a view
        of ``value``), ``str`` for text, a new ``dict`` / ``tuple`` for dict and
        tuple kinds. Raises :class:`SpaceMappingError` for values that do not fit.
        """
        if value is None and self.nullable:
            return self.null_value()
        try:
            return self._from_wire(value)
        except SpaceMappingError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise self._err(f"cannot convert received value: {exc}") from None

    def from_wire_rows(self, values: Any) -> np.ndarray | None:
        """:meth:`from_wire` of each of ``values`` (a list of received JSON values), stacked: ``(len(values), *shape)`` of ``dtype``.

        One numpy conversion for the whole list, for the common case of an
        array field (``box``, ``multibinary``, ``multidiscrete``) whose every
        value is a list of numbers of the field's exact shape, read exactly
        as ``dtype``. ``None`` where that does not hold (a ``None``, a value
        to reshape, a ragged list, numbers ``dtype`` cannot hold): then
        :meth:`from_wire` of each value gives each its result or its error.
        """
        if self.kind not in ("box", "multibinary", "multidiscrete") or type(values) is not list or not values:
            return None
        dtype = self.dtype
        shape = self.shape
        if dtype is None or any(d is None for d in shape):
            return None
        try:
            raw = np.asarray(values)
        except (TypeError, ValueError, OverflowError):  # (ragged, or ints numpy cannot hold)
            return None
        kind = raw.dtype.kind
        if kind not in "biuf" or (kind == "f" and dtype.kind == "u") or raw.shape != (len(values), *shape):
            return None  # (floats for unsigned ints: numbers_of's exact path, value by value)
        if cast_problem(raw, dtype) is not None:
            return None
        return cast_numbers(raw, dtype)

    def _from_wire(self, value: Any) -> Any:
        kind = self.kind
        if kind == "enum":
            for i, option in enumerate(self.values):
                if _json_equal(option, value):
                    return np.int64(i)
            raise self._err(f"received value {value!r:.80} is not one of the enum values {list(self.values)!r:.200}")
        if kind == "bool":
            i = _as_int(value)
            if i not in (0, 1):
                raise self._err(f"expected a boolean, got {value!r:.60}")
            return np.int64(i)
        if kind == "discrete":
            assert self.dtype is not None
            i = _as_int(value)
            if (self.low is not None and i < self.low) or (self.high is not None and i > self.high):
                raise self._err(f"received value {i} is outside [{self.low}, {self.high}]")
            return self.dtype.type(i)
        if kind in ("box", "multibinary", "multidiscrete"):
            self._check_closed()
            assert self.dtype is not None
            if isinstance(value, (str, bytes, Mapping)):
                raise TypeError(f"expected numbers, got {type(value).__name__}")
            shape = tuple(int(d) for d in self.shape if d is not None)
            raw = numbers_of(value, self.dtype)
            if raw.dtype.kind in "biuf":
                problem = cast_problem(raw, self.dtype)
                if problem is not None:  # (numpy would wrap or truncate: uint8 300 -> 44, 1.5 -> 1)
                    raise self._err(f"expected {problem}, got {value!r:.80}")
            arr = cast_numbers(raw, self.dtype)  # always a copy
            if arr.shape != shape:
                if self.reshape and arr.size == math.prod(shape):
                    arr = arr.reshape(shape)
                elif self.shaped_by_first:
                    error = self._err(
                        f"expected an array of shape {shape} (the first observation's), got shape {arr.shape}: "
                        f"for a list whose length varies (legal moves), pass variable_fields=({self.path!r},), "
                        "or an explicit observation_space= with a gymnasium Sequence for this field"
                    )
                    error.fix = f"variable_fields=({self.path!r},)"
                    raise error
                else:
                    raise self._err(f"expected an array of shape {shape}, got shape {arr.shape}")
            return arr
        if kind == "text":
            if not isinstance(value, str):
                raise self._err(f"expected a string, got {type(value).__name__}")
            return value
        if kind == "dict":
            if not isinstance(value, Mapping):
                raise self._err(f"expected an object, got {type(value).__name__}")
            out: dict[str, Any] = {}
            for key, child in self.children:
                if key in value:
                    out[key] = child.from_wire(value[key])
                else:
                    alias = _sent_as(key, value, {k for k, _ in self.children})
                    out[key] = child.from_wire(value[alias]) if alias is not None else child.missing()
            return out
        if kind == "tuple":
            if not isinstance(value, (list, tuple)) or len(value) != len(self.children):
                raise self._err(f"expected a list of {len(self.children)} items")
            return tuple(child.from_wire(v) for (_, child), v in zip(self.children, value))
        if kind == "sequence":
            if isinstance(value, np.ndarray) and value.ndim >= 1:
                value = list(value)  # (stacked items, sent as one array)
            if not isinstance(value, (list, tuple)):
                raise self._err(f"expected a list, got {type(value).__name__}")
            item = self.children[0][1]
            items = tuple(item.from_wire(v) for v in value)
            return self._stacked(items) if self.stack else items
        if kind == "json":
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_plain_json)
        raise self._err(f"unknown codec kind {kind!r}")  # pragma: no cover

    def _stacked(self, items: tuple) -> np.ndarray:
        """The items of a stacked sequence as one array, ``(len(items), *item_shape)``."""
        item = self.children[0][1]
        if items:
            return np.stack([np.asarray(v, dtype=item.dtype) for v in items])
        return np.zeros((0, *cast(tuple[int, ...], item.shape)), dtype=item.dtype)  # (a stacked item's shape is fixed)

    def missing(self) -> Any:
        """The value of this field when it is absent from a received object.

        Its default; else, in an observation, what a ``null`` reads as (a
        server's reset may send a bare ``Observation`` where its schema
        promises more: OpenEnv's MCP environments do).
        """
        if self.has_default:
            return self.from_wire(copy.deepcopy(self.default))
        if self.nullable or self.role == "observation":
            return self.null_value()
        raise self._err("missing from the received object")

    def null_value(self) -> Any:
        """The value a ``null`` decodes to for a nullable field.

        Enum: the index of its ``None`` value (an enum that can be null has
        one, last), else 0; bool: 0; discrete: its lowest value; box: zeros clipped
        into ``[low, high]``; multibinary: zeros (int8); text: ``""``; dict and
        tuple: the null value of every child.
        """
        kind = self.kind
        if kind == "enum":
            return np.int64(next((i for i, v in enumerate(self.values) if v is None), 0))
        if kind == "bool":
            return np.int64(0)
        if kind == "discrete":
            assert self.dtype is not None
            return self.dtype.type(self.low if self.low is not None else 0)
        if kind in ("box", "multibinary", "multidiscrete"):
            self._check_closed()
            assert self.dtype is not None
            fill: float | int = 0
            if self.low is not None and fill < self.low:
                fill = self.low
            if self.high is not None and fill > self.high:
                fill = self.high
            shape = tuple(int(d) for d in self.shape if d is not None)
            return np.full(shape, fill, dtype=self.dtype)
        if kind == "text":
            return ""
        if kind == "dict":
            return {key: child.null_value() for key, child in self.children}
        if kind == "tuple":
            return tuple(child.null_value() for _, child in self.children)
        if kind == "sequence":
            return self._stacked(()) if self.stack else ()
        if kind == "json":
            return "null"
        raise self._err(f"unknown codec kind {kind!r}")  # pragma: no cover

    # -- space -> wire -----------------------------------------------------

    def to_wire(self, value: Any, omit: bool = True) -> Any:
        """Convert a value of this field's space to a JSON-able value to send.

        Enum: ``values[index]``; bool: ``bool``; discrete: ``int``; arrays:
        nested lists (``.tolist()``; ``bool`` elements when ``as_bool``) or a
        Python scalar for shape ``()``; text: ``str``; dict: ``dict``; tuple:
        ``list``.
        """
        try:
            return self._to_wire(value, omit)
        except SpaceMappingError:
            raise
        except (TypeError, ValueError, OverflowError, KeyError) as exc:
            raise self._err(f"cannot convert value to send: {exc!r}") from None

    def _to_wire(self, value: Any, omit: bool = True) -> Any:
        kind = self.kind
        if kind == "enum":
            i = _as_int(value)
            if not 0 <= i < len(self.values):
                raise self._err(f"index {i} out of range for {len(self.values)} enum values")
            return copy.deepcopy(self.values[i])
        if kind == "bool":
            i = _as_int(value)
            if i not in (0, 1):
                raise self._err(f"expected 0 or 1, got {value!r:.60}")
            return bool(i)
        if kind == "discrete":
            return _as_int(value)
        if kind in ("box", "multibinary", "multidiscrete"):
            self._check_closed()
            assert self.dtype is not None
            arr = np.asarray(value, dtype=self.dtype)
            shape = tuple(int(d) for d in self.shape if d is not None)
            if arr.shape != shape:
                raise self._err(f"expected an array of shape {shape}, got shape {arr.shape}")
            if self.as_bool:
                arr = arr.astype(bool)
            return arr.item() if arr.shape == () else arr.tolist()
        if kind == "text":
            if not isinstance(value, str):
                raise self._err(f"expected a str, got {type(value).__name__}")
            return value
        if kind == "dict":
            if not isinstance(value, Mapping):
                raise self._err(f"expected a dict, got {type(value).__name__}")
            out: dict[str, Any] = {}
            for key, child in self.children:
                if key not in value:
                    raise child._err("missing from the value to send")
                wire = child.to_wire(value[key])  # (nested fields: always left out when unset)
                if omit and child.optional and _unset(wire, child):
                    continue  # an optional field left as it is by default: the server fills it in
                out[key] = wire
            return out
        if kind == "tuple":
            if not isinstance(value, (list, tuple)) or len(value) != len(self.children):
                raise self._err(f"expected a tuple of {len(self.children)} items")
            return [child.to_wire(v) for (_, child), v in zip(self.children, value)]
        if kind == "sequence":
            if self.stack and isinstance(value, np.ndarray) and value.ndim >= 1:
                value = list(value)
            if not isinstance(value, (list, tuple)):
                raise self._err(f"expected a tuple, got {type(value).__name__}")
            item = self.children[0][1]
            return [item.to_wire(v) for v in value]
        if kind == "json":
            if not isinstance(value, str):
                raise self._err(f"expected JSON text (a str), got {type(value).__name__}")
            try:
                parsed = json.loads(value)
            except (ValueError, RecursionError) as exc:
                raise self._err(f"not JSON text ({exc})") from None
            # (the levels around this field in an action count too: each list and object it sits in)
            problem = _unsendable(parsed, max(1, JSON_TEXT_MAX_DEPTH - self.path.count("[]") - self.path.count(".")))
            if problem:
                raise self._err(f"the JSON text {problem}: no wire format carries it")
            return parsed
        raise self._err(f"unknown codec kind {kind!r}")  # pragma: no cover


@dataclass(frozen=True)
class SchemaSpace:
    """A Gymnasium space and how its values map to the fields of a wire object.

    Attributes:
        space: the space of the whole action or observation.
        fields: the top-level object fields the space covers, in space order
            (sorted for a ``Dict``; the one field when ``single_field`` is set).
        single_field: set when ``space`` is the space of that one field itself
            (not a ``Dict``); ``None`` when ``space`` is a ``Dict`` over ``fields``.
        codec: converts field values; the field's codec when ``single_field``
            is set, else a ``"dict"`` codec over ``fields``.
        role: ``"observation"`` or ``"action"``.
        info_fields: top-level observation fields of free-form content
            (``Dict[str, Any]``, ``Any``) that no space can hold, and fields
            only a reset observation has (OpenEnv's ``reset_observation``
            model: a task prompt, say): the envs return them in ``info``
            under their names, as received, where a reply has them.
    """

    space: Space
    fields: tuple[str, ...]
    single_field: str | None
    codec: FieldCodec
    role: str = "observation"
    info_fields: tuple[str, ...] = ()

    def unset_fields(self, wire: Mapping[str, Any]) -> set[str]:
        """The optional top-level fields of ``wire`` (a :meth:`to_wire` with ``omit=False``) that say nothing."""
        if self.single_field is not None or self.codec.kind != "dict":
            return set()
        return {key for key, child in self.codec.children if child.optional and key in wire and _unset(wire[key], child)}

    def info_of(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """The :attr:`info_fields` present and not null in a received ``payload``, as plain JSON values."""
        return {name: plain_json(payload[name]) for name in self.info_fields if payload.get(name) is not None}

    @property
    def open_fields(self) -> tuple[str, ...]:
        """Dotted paths of open-length arrays whose shape is not fixed yet."""
        return self.codec.open_paths()

    @property
    def is_open(self) -> bool:
        """True while some array shape is unknown (see :func:`fix_open_shapes`)."""
        return self.codec.is_open

    def to_wire(self, value: Any, omit: bool = True) -> dict[str, Any]:
        """A value of ``space`` as the JSON-able dict of fields to send.

        With ``single_field`` the result is ``{single_field: wire_value}``;
        otherwise ``value`` is a dict with one entry per field. ``omit``:
        leave out optional fields whose value says nothing (their default;
        empty where the default is nothing), for the server to fill in.
        """
        if self.single_field is not None:
            return {self.single_field: self.codec.to_wire(value, omit)}
        out = self.codec.to_wire(value, omit)
        if not isinstance(out, dict):  # (the JSON text of a whole action: an object, or nothing to send)
            raise _field_error(self.role, "", f"the action must be a JSON object, got {type(out).__name__}")
        return out

    def from_wire(self, payload: Mapping[str, Any]) -> Any:
        """A received dict of fields as a NEW value of ``space``.

        Fields not covered by the space (``reward``, ``metadata``, ...) are
        ignored. Arrays are fresh copies, never views of ``payload``.
        """
        if not isinstance(payload, Mapping):
            raise _field_error(self.role, "", f"expected an object of fields, got {type(payload).__name__}")
        if self.single_field is not None:
            if self.single_field in payload:
                return self.codec.from_wire(payload[self.single_field])
            alias = _sent_as(self.single_field, payload, OBSERVATION_BASE_FIELDS)
            return self.codec.from_wire(payload[alias]) if alias is not None else self.codec.missing()
        return self.codec.from_wire(payload)

    def allow_missing(self, names: Collection[str]) -> "SchemaSpace":
        """The same space, where the top-level fields ``names`` may be absent (read as null).

        For servers whose reset observation model lacks fields of the step one
        (OpenEnv's ``reset_observation``): a reset then has their "zero".
        """
        names = set(names)
        if self.single_field is not None:
            if self.single_field not in names:
                return self
            return replace(self, codec=replace(self.codec, nullable=True))
        children = tuple((key, replace(child, nullable=True) if key in names else child) for key, child in self.codec.children)
        return replace(self, codec=replace(self.codec, children=children))


def _unset(wire: Any, codec: "FieldCodec") -> bool:
    """Whether an optional action field's wire value says nothing: its default, or empty where the default is nothing.

    (An empty text where the default is ``">"`` is what the user asks for: it is sent.)
    """
    if codec.has_default and _json_equal(wire, codec.default):
        return True
    if codec.has_default and not (codec.default is None or codec.default in ("", [], {})):
        return False
    return codec.kind in ("text", "json", "sequence") and (wire is None or wire in ("", [], {}))
