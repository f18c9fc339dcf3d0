"""The kinds of field a :class:`FieldCodec` converts, each with how its values go to and from the wire.

A kind is a :class:`CodecKind` (a ``str``: ``"box"``, ``"dict"``, ...) and
one :class:`FieldKind` object in :data:`FIELD_KINDS`; a codec binds its
kind's methods once, when it is made. Adding a kind is adding both here.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from openenv_gym._numbers import cast_numbers, cast_problem, numbers_of

from ._base import JSON_TEXT_MAX_DEPTH, _plain_json, _sent_as, _unsendable

if TYPE_CHECKING:
    from ._field_codec import FieldCodec


class CodecKind(StrEnum):
    """What a :class:`FieldCodec` converts; each member is its own name as a ``str`` (``CodecKind.BOX == "box"``)."""

    ENUM = "enum"  #: ``Discrete``; value = index into ``values``
    BOOL = "bool"  #: ``Discrete(2)``; wire ``bool``
    DISCRETE = "discrete"  #: ``Discrete``; wire integer
    BOX = "box"
    MULTIBINARY = "multibinary"
    MULTIDISCRETE = "multidiscrete"
    TEXT = "text"
    DICT = "dict"  #: ``children`` by key
    TUPLE = "tuple"  #: ``children`` by position, keys ``"0"``, ``"1"``, ...
    SEQUENCE = "sequence"  #: ``Sequence``: one child, ``"item"``, for every element
    JSON = "json"  #: :class:`JsonText`: free-form content as JSON text

    def __repr__(self) -> str:  # (as the plain string it stands for: codecs print as they did)
        return repr(self.value)


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


def _unset(wire: Any, codec: FieldCodec) -> bool:
    """Whether an optional action field's wire value says nothing: its default, or empty where the default is nothing.

    (An empty text where the default is ``">"`` is what the user asks for: it is sent.)
    """
    if codec.has_default and _json_equal(wire, codec.default):
        return True
    if codec.has_default and not (codec.default is None or codec.default in ("", [], {})):
        return False
    return codec._kind.empty_is_unset and (wire is None or wire in ("", [], {}))


class FieldKind:
    """How the values of one kind of field go to and from the wire; the methods take the field's codec.

    ``from_wire`` and ``to_wire`` raise :class:`SpaceMappingError` (through
    ``codec._err``), or ``TypeError``/``ValueError``/``OverflowError`` that
    :meth:`FieldCodec.from_wire` and :meth:`FieldCodec.to_wire` name the field in.
    """

    #: Values are numpy arrays of the codec's ``dtype`` and ``shape`` (``FieldCodec.from_wire_rows`` reads many at once).
    array: ClassVar[bool] = False
    #: Items a ``Sequence(..., stack=True)`` can stack into one array.
    stackable: ClassVar[bool] = False
    #: An optional action field whose empty value (null, ``""``, ``[]``, ``{}``) says nothing, when its default is nothing.
    empty_is_unset: ClassVar[bool] = False

    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        """A received JSON value (not null, or null where the field cannot be) as a NEW value of the space."""
        raise NotImplementedError

    def null_value(self, codec: FieldCodec) -> Any:
        """The value a ``null`` decodes to."""
        raise NotImplementedError

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        """A value of the space as a JSON-able value to send; ``omit``: leave out unset optional fields of a dict."""
        raise NotImplementedError


class EnumKind(FieldKind):
    stackable = True

    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        for i, option in enumerate(codec.values):
            if _json_equal(option, value):
                return np.int64(i)
        raise codec._err(f"received value {value!r:.80} is not one of the enum values {list(codec.values)!r:.200}")

    def null_value(self, codec: FieldCodec) -> Any:
        return np.int64(next((i for i, v in enumerate(codec.values) if v is None), 0))

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        i = _as_int(value)
        if not 0 <= i < len(codec.values):
            raise codec._err(f"index {i} out of range for {len(codec.values)} enum values")
        return copy.deepcopy(codec.values[i])


class BoolKind(FieldKind):
    stackable = True

    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        i = _as_int(value)
        if i not in (0, 1):
            raise codec._err(f"expected a boolean, got {value!r:.60}")
        return np.int64(i)

    def null_value(self, codec: FieldCodec) -> Any:
        return np.int64(0)

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        i = _as_int(value)
        if i not in (0, 1):
            raise codec._err(f"expected 0 or 1, got {value!r:.60}")
        return bool(i)


class DiscreteKind(FieldKind):
    stackable = True

    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        assert codec.dtype is not None
        i = _as_int(value)
        if (codec.low is not None and i < codec.low) or (codec.high is not None and i > codec.high):
            raise codec._err(f"received value {i} is outside [{codec.low}, {codec.high}]")
        return codec.dtype.type(i)

    def null_value(self, codec: FieldCodec) -> Any:
        assert codec.dtype is not None
        return codec.dtype.type(codec.low if codec.low is not None else 0)

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        return _as_int(value)


class ArrayKind(FieldKind):
    """``box``, ``multibinary`` and ``multidiscrete``: numpy arrays of the codec's ``dtype`` and ``shape``."""

    array = True
    stackable = True

    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        codec._check_closed()
        assert codec.dtype is not None
        if isinstance(value, (str, bytes, Mapping)):
            raise TypeError(f"expected numbers, got {type(value).__name__}")
        shape = tuple(int(d) for d in codec.shape if d is not None)
        raw = numbers_of(value, codec.dtype)
        if raw.dtype.kind in "biuf":
            problem = cast_problem(raw, codec.dtype)
            if problem is not None:  # (numpy would wrap or truncate: uint8 300 -> 44, 1.5 -> 1)
                raise codec._err(f"expected {problem}, got {value!r:.80}")
        arr = cast_numbers(raw, codec.dtype)  # always a copy
        if arr.shape != shape:
            if codec.reshape and arr.size == math.prod(shape):
                arr = arr.reshape(shape)
            elif codec.shaped_by_first:
                error = codec._err(
                    f"expected an array of shape {shape} (the first observation's), got shape {arr.shape}: "
                    f"for a list whose length varies (legal moves), pass variable_fields=({codec.path!r},), "
                    "or an explicit observation_space= with a gymnasium Sequence for this field"
                )
                error.fix = f"variable_fields=({codec.path!r},)"
                raise error
            else:
                raise codec._err(f"expected an array of shape {shape}, got shape {arr.shape}")
        return arr

    def null_value(self, codec: FieldCodec) -> Any:
        codec._check_closed()
        assert codec.dtype is not None
        fill: float | int = 0
        if codec.low is not None and fill < codec.low:
            fill = codec.low
        if codec.high is not None and fill > codec.high:
            fill = codec.high
        shape = tuple(int(d) for d in codec.shape if d is not None)
        return np.full(shape, fill, dtype=codec.dtype)

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        codec._check_closed()
        assert codec.dtype is not None
        arr = np.asarray(value, dtype=codec.dtype)
        shape = tuple(int(d) for d in codec.shape if d is not None)
        if arr.shape != shape:
            raise codec._err(f"expected an array of shape {shape}, got shape {arr.shape}")
        if codec.as_bool:
            arr = arr.astype(bool)
        return arr.item() if arr.shape == () else arr.tolist()


class TextKind(FieldKind):
    empty_is_unset = True

    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        if not isinstance(value, str):
            raise codec._err(f"expected a string, got {type(value).__name__}")
        return value

    def null_value(self, codec: FieldCodec) -> Any:
        return ""

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        if not isinstance(value, str):
            raise codec._err(f"expected a str, got {type(value).__name__}")
        return value


class DictKind(FieldKind):
    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise codec._err(f"expected an object, got {type(value).__name__}")
        out: dict[str, Any] = {}
        for key, child in codec.children:
            if key in value:
                out[key] = child.from_wire(value[key])
            else:
                alias = _sent_as(key, value, {k for k, _ in codec.children})
                out[key] = child.from_wire(value[alias]) if alias is not None else child.missing()
        return out

    def null_value(self, codec: FieldCodec) -> Any:
        return {key: child.null_value() for key, child in codec.children}

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        if not isinstance(value, Mapping):
            raise codec._err(f"expected a dict, got {type(value).__name__}")
        out: dict[str, Any] = {}
        for key, child in codec.children:
            if key not in value:
                raise child._err("missing from the value to send")
            wire = child.to_wire(value[key])  # (nested fields: always left out when unset)
            if omit and child.optional and _unset(wire, child):
                continue  # an optional field left as it is by default: the server fills it in
            out[key] = wire
        return out


class TupleKind(FieldKind):
    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) != len(codec.children):
            raise codec._err(f"expected a list of {len(codec.children)} items")
        return tuple(child.from_wire(v) for (_, child), v in zip(codec.children, value))

    def null_value(self, codec: FieldCodec) -> Any:
        return tuple(child.null_value() for _, child in codec.children)

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) != len(codec.children):
            raise codec._err(f"expected a tuple of {len(codec.children)} items")
        return [child.to_wire(v) for (_, child), v in zip(codec.children, value)]


def _stacked(codec: FieldCodec, items: tuple) -> np.ndarray:
    """The items of a stacked sequence as one array, ``(len(items), *item_shape)``."""
    item = codec.children[0][1]
    if items:
        return np.stack([np.asarray(v, dtype=item.dtype) for v in items])
    return np.zeros((0, *cast(tuple[int, ...], item.shape)), dtype=item.dtype)  # (a stacked item's shape is fixed)


class SequenceKind(FieldKind):
    empty_is_unset = True

    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.ndim >= 1:
            value = list(value)  # (stacked items, sent as one array)
        if not isinstance(value, (list, tuple)):
            raise codec._err(f"expected a list, got {type(value).__name__}")
        item = codec.children[0][1]
        items = tuple(item.from_wire(v) for v in value)
        return _stacked(codec, items) if codec.stack else items

    def null_value(self, codec: FieldCodec) -> Any:
        return _stacked(codec, ()) if codec.stack else ()

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        if codec.stack and isinstance(value, np.ndarray) and value.ndim >= 1:
            value = list(value)
        if not isinstance(value, (list, tuple)):
            raise codec._err(f"expected a tuple, got {type(value).__name__}")
        item = codec.children[0][1]
        return [item.to_wire(v) for v in value]


class JsonKind(FieldKind):
    empty_is_unset = True

    def from_wire(self, codec: FieldCodec, value: Any) -> Any:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_plain_json)

    def null_value(self, codec: FieldCodec) -> Any:
        return "null"

    def to_wire(self, codec: FieldCodec, value: Any, omit: bool) -> Any:
        if not isinstance(value, str):
            raise codec._err(f"expected JSON text (a str), got {type(value).__name__}")
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise codec._err(f"not JSON text ({exc})") from None
        # (the levels around this field in an action count too: each list and object it sits in)
        problem = _unsendable(parsed, max(1, JSON_TEXT_MAX_DEPTH - codec.path.count("[]") - codec.path.count(".")))
        if problem:
            raise codec._err(f"the JSON text {problem}: no wire format carries it")
        return parsed


#: Every kind of field, with how its values convert (keyed by :class:`CodecKind`, a ``str``).
FIELD_KINDS: dict[str, FieldKind] = {
    CodecKind.ENUM: EnumKind(),
    CodecKind.BOOL: BoolKind(),
    CodecKind.DISCRETE: DiscreteKind(),
    CodecKind.BOX: ArrayKind(),
    CodecKind.MULTIBINARY: ArrayKind(),
    CodecKind.MULTIDISCRETE: ArrayKind(),
    CodecKind.TEXT: TextKind(),
    CodecKind.DICT: DictKind(),
    CodecKind.TUPLE: TupleKind(),
    CodecKind.SEQUENCE: SequenceKind(),
    CodecKind.JSON: JsonKind(),
}
