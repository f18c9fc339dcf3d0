"""Codecs: how the value of one field, or of a whole action or observation, maps to and from the JSON sent over the wire."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from gymnasium.spaces import Space

from openenv_gym._numbers import cast_numbers, cast_problem

from ._base import OBSERVATION_BASE_FIELDS, SpaceMappingError, _field_error, _sent_as, plain_json
from ._kinds import FIELD_KINDS, CodecKind, FieldKind, _unset


@dataclass(frozen=True)
class FieldCodec:
    """How one field's JSON value maps to and from a value of its space.

    Attributes:
        kind: a :class:`CodecKind` (given as one or as its string), one of
            ``"enum"`` (``Discrete``; value = index into ``values``),
            ``"bool"`` (``Discrete(2)``; wire ``bool``), ``"discrete"``
            (``Discrete``; wire integer), ``"box"``, ``"multibinary"``,
            ``"multidiscrete"``, ``"text"``, ``"dict"`` (``children`` by key) and
            ``"tuple"`` (``children`` by position, keys ``"0"``, ``"1"``, ...) and
            ``"sequence"`` (``Sequence``: one child, ``"item"``, for every element)
            and ``"json"`` (:class:`JsonText`: free-form content as JSON text).
            How each converts is its :class:`FieldKind` in ``FIELD_KINDS``.
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
    # The kind's conversions, bound once here rather than looked up on every value.
    _kind: FieldKind = field(init=False, repr=False, compare=False)
    _decode: Callable[[FieldCodec, Any], Any] = field(init=False, repr=False, compare=False)
    _encode: Callable[[FieldCodec, Any, bool], Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            kind = CodecKind(self.kind)
        except ValueError:
            raise self._err(f"unknown codec kind {self.kind!r}") from None
        ops = FIELD_KINDS[kind]
        object.__setattr__(self, "kind", kind)  # (frozen: set once, as __init__ does)
        object.__setattr__(self, "_kind", ops)
        object.__setattr__(self, "_decode", ops.from_wire)
        object.__setattr__(self, "_encode", ops.to_wire)

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
            return self._decode(self, value)
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
        if not self._kind.array or type(values) is not list or not values:
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
        return self._kind.null_value(self)

    # -- space -> wire -----------------------------------------------------

    def to_wire(self, value: Any, omit: bool = True) -> Any:
        """Convert a value of this field's space to a JSON-able value to send.

        Enum: ``values[index]``; bool: ``bool``; discrete: ``int``; arrays:
        nested lists (``.tolist()``; ``bool`` elements when ``as_bool``) or a
        Python scalar for shape ``()``; text: ``str``; dict: ``dict``; tuple:
        ``list``.
        """
        try:
            return self._encode(self, value, omit)
        except SpaceMappingError:
            raise
        except (TypeError, ValueError, OverflowError, KeyError) as exc:
            raise self._err(f"cannot convert value to send: {exc!r}") from None


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
        if self.single_field is not None or self.codec.kind != CodecKind.DICT:
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
