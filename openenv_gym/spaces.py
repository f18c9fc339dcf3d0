"""Gymnasium spaces for OpenEnv actions and observations.

Two jobs, both pure (no I/O):

1. **JSON Schema to spaces.** An OpenEnv server publishes the JSON Schema of its
   Pydantic action and observation models at ``GET /schema``.
   :func:`observation_space_from_schema` and :func:`action_space_from_schema`
   turn such a schema (one model's ``model_json_schema()`` output) into a
   :class:`SchemaSpace`: a Gymnasium space plus the codec that converts between
   values of that space and the JSON fields sent over the wire. When the user
   gives a space explicitly, :func:`space_codec` builds the same kind of
   :class:`SchemaSpace` around it.

2. **Exact space descriptions.** :func:`describe_space` and
   :func:`space_from_description` write a space as a JSON-able dict and read it
   back exactly, for servers that publish their spaces directly. Descriptions
   come from the network, so reading them is strict and bounded.

Mapping of schema types (``role`` is ``"observation"`` or ``"action"``):

==========================================  ==============================================
schema                                      space / value
==========================================  ==============================================
``enum`` / ``const``                        ``Discrete(len(enum))``; value = enum index
``boolean``                                 ``Discrete(2)``; ``np.int64`` 0/1, wire ``bool``
``integer`` with both bounds                ``Discrete(hi - lo + 1, start=lo)``, ``np.int64``
``integer`` with one or no bound            ``Box((), int64)``, missing bound = int64 limit
``number``                                  ``Box((), float32)`` (actions: float64), missing bound = ±inf
fixed-length ``array`` of numbers (nested)  ``Box(shape=(n, m, ...))``, float32 (actions: float64) or int64
fixed-length ``array`` of booleans          ``MultiBinary(n)`` / ``MultiBinary([n, m, ...])``
open-length ``array`` of numbers/booleans   open shape, fixed by :func:`fix_open_shapes`
``array`` of strings, objects or enums      ``Sequence`` of the item's space; value = tuple
``string``                                  :class:`UnicodeText`: any string, samples printable ASCII
``string`` with ``pattern`` ``^(a|b|c)$``   ``Discrete(3)``, as an ``enum`` of the literal choices
``object`` with ``properties``              ``Dict`` with sorted keys
free-form ``object`` / any (top level)      no space: the value goes to ``info`` (observations)
==========================================  ==============================================

Integer arrays map to an int64 ``Box`` even when both item bounds are given (not
``MultiDiscrete``), so every numeric array is a ``Box``. ``Dict`` spaces built
from schemas have their keys sorted, as Gymnasium does for plain dicts; the
schema's property order is not kept. Schema keywords that a space cannot express
(``pattern`` other than a choice of literal words, ``format``, ``multipleOf``,
``uniqueItems``) are ignored, so samples of such fields may be refused by the server.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
import string
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard, cast

import numpy as np
from gymnasium import spaces as gspaces
from gymnasium.spaces import Space
from gymnasium.spaces import utils as _space_utils
from gymnasium.vector.utils import batch_space as _batch_space

from openenv_gym._numbers import ARRAY_SPACES, cast_numbers, cast_problem, numbers_of
from openenv_gym.config import Limits
from openenv_gym.errors import OpenEnvGymError

_logger = logging.getLogger(__name__)

__all__ = [
    "SpaceMappingError",
    "FieldCodec",
    "SchemaSpace",
    "UnicodeText",
    "JsonText",
    "UnboundedInteger",
    "UnsizedSequence",
    "BoundedSequence",
    "TEXT_CHARSET",
    "TEXT_DEFAULT_MAX_LENGTH",
    "TEXT_SAMPLE_MAX_LENGTH",
    "OBSERVATION_BASE_FIELDS",
    "ACTION_BASE_FIELDS",
    "observation_space_from_schema",
    "action_space_from_schema",
    "field_space",
    "fix_open_shapes",
    "space_codec",
    "describe_space",
    "space_from_description",
]


class SpaceMappingError(OpenEnvGymError, ValueError):
    """A schema, space, value or space description that cannot be mapped.

    The message names the field (dotted path for nested fields) and the argument
    that fixes the problem, e.g. ``observation_space=`` or ``action_key=``.
    It is a :class:`ValueError` and an :class:`~openenv_gym.errors.OpenEnvGymError`.

    Attributes:
        fix: where one override fixes it, that override as Python keyword
            arguments (``"variable_fields=('legal',)"``); else ``None``.
    """

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


#: Characters of ``Text`` spaces built from ``string`` schemas: all printable
#: ASCII (letters, digits, punctuation, space, ``\t``, ``\n``, ``\r``), i.e.
#: :data:`string.printable` without the vertical tab and form feed.
#: Gymnasium's default charset is alphanumeric only, while server strings
#: usually contain spaces and punctuation.
TEXT_CHARSET: str = "".join(c for c in string.printable if c not in "\x0b\x0c")


def _sendable_text(text: str) -> bool:
    """Whether UTF-8 can encode ``text`` (no lone surrogate), as every wire format needs."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _name_key(name: str) -> str:
    return "".join(c for c in name if c.isalnum()).casefold()


def _sent_as(name: str, received: Mapping[str, Any], known: Collection[str]) -> str | None:
    """The key under which field ``name`` of the schema was sent, when it is not ``name`` itself.

    A Pydantic field with an alias (``board_size``, alias ``boardSize``) is
    named by its alias in the JSON Schema, but OpenEnv servers send
    ``model_dump()``, which names it by its Python name. The received key that
    is no field of the schema and is ``name`` up to case and ``_``/``-`` is
    taken for it; ``None`` if there is none (or more than one).
    """
    want = _name_key(name)
    found = [k for k in received if isinstance(k, str) and k not in known and _name_key(k) == want]
    return found[0] if len(found) == 1 else None


def _length_given(mask: Any, probability: Any) -> bool:
    """Whether a ``Text``/``Sequence`` sample's ``mask`` or ``probability`` fixes its length (element 0)."""
    given = mask if mask is not None else probability
    return given is not None and given[0] is not None


def _with_length(length: int, mask: Any, probability: Any) -> tuple[Any, Any]:
    """``(mask, probability)`` of such a sample, with ``length`` set in whichever is given."""
    if mask is not None:
        return (length, mask[1]), None
    if probability is not None:
        return None, (length, probability[1])
    return (length, None), None


class UnicodeText(gspaces.Text):
    """A ``Text`` space of any Unicode string: what a JSON ``string`` (a Pydantic ``str``) holds.

    Gymnasium's ``Text`` holds only strings over a finite ``charset``, so a
    ``Text`` built for a server's ``str`` field would refuse ``"café"`` or an
    LLM's curly quotes. This space holds every string of ``min_length`` to
    ``max_length`` characters that can be sent (encoded as UTF-8: no lone
    surrogates). ``charset`` is what :meth:`sample` draws from (default:
    :data:`TEXT_CHARSET`); unless given a length, samples have at most
    :data:`TEXT_SAMPLE_MAX_LENGTH` characters (or ``min_length``).
    """

    def __init__(
        self, max_length: int, *, min_length: int = 0, charset: str | None = None, seed: int | np.random.Generator | None = None
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=TEXT_CHARSET if charset is None else charset, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length and _sendable_text(x)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        cap = max(self.min_length, TEXT_SAMPLE_MAX_LENGTH)
        # (a length up to max_length, 2**31 - 1 by default, would not fit in memory)
        if self.max_length > cap and not _length_given(mask, probability):
            length = int(self.np_random.integers(self.min_length, cap + 1))
            mask, probability = _with_length(length, mask, probability)
        return super().sample(mask, probability)

    def __eq__(self, other: Any) -> bool:
        return (
            type(other) is type(self)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
            and self.character_set == other.character_set
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.min_length}, {self.max_length})"


class JsonText(UnicodeText):
    """A :class:`UnicodeText` of JSON text: a field of free-form content (``Dict[str, Any]``, ``Any``, a union of types).

    No space holds such content, so its value is its JSON text: received
    values are ``json.dumps``-ed, and actions are ``json.loads``-ed before
    sending. Samples are ``example``, JSON text the field accepts: its
    default, else ``null`` where null is allowed, else a value of its first
    type (``"{}"`` for an object, ``"0"`` for ``Union[int, str]``).
    """

    def __init__(self, max_length: int = 2**31 - 1, *, example: str = "null", seed: int | np.random.Generator | None = None) -> None:
        super().__init__(max_length, min_length=0, seed=seed)
        self.example = example

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return self.example


class BoundedSequence(gspaces.Sequence):
    """A ``Sequence`` of ``min_length`` to ``max_length`` items: a JSON ``array``
    with ``minItems``/``maxItems`` (a Pydantic list with ``min_length``/``max_length``).

    Gymnasium's ``Sequence`` has no length bounds, so its samples (a geometric
    length) would break a server's ``max_length`` and :meth:`contains` would
    let such actions through. Unless a length is asked for (``mask[0]``),
    samples have ``min_length`` to ``max_length`` items, at most
    ``min_length + 8``.
    """

    def __init__(
        self,
        feature_space: gspaces.Space[Any],
        *,
        min_length: int = 0,
        max_length: int | None = None,
        seed: int | np.random.Generator | None = None,
        stack: bool = False,
    ) -> None:
        if min_length < 0 or (max_length is not None and max_length < min_length):
            raise ValueError(f"need 0 <= min_length <= max_length, got {min_length} and {max_length}")
        super().__init__(feature_space, seed=seed, stack=stack)
        self.min_length = min_length
        self.max_length = max_length

    def sample(self, mask: Any = None, probability: Any = None) -> Any:
        if not _length_given(mask, probability):
            top = self.min_length + 8 if self.max_length is None else min(self.max_length, self.min_length + 8)
            length = int(self.np_random.integers(self.min_length, top + 1))
            mask, probability = _with_length(length, mask, probability)
        return super().sample(mask, probability)

    def contains(self, x: Any) -> bool:
        if not super().contains(x):
            return False
        n = len(x)
        return self.min_length <= n and (self.max_length is None or n <= self.max_length)

    def __eq__(self, other: Any) -> bool:
        return (
            type(other) is type(self)
            and super().__eq__(other)
            and (self.min_length, self.max_length) == (other.min_length, other.max_length)
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.feature_space}, min_length={self.min_length}, max_length={self.max_length}, stack={self.stack})"
        )


def _refuse_sample(field: str, what: str, override: str) -> SpaceMappingError:
    where = f"action field {field!r}" if field else "the action"
    return SpaceMappingError(
        f"{where} is {what}, so the library cannot sample it (a random value could be one the env refuses); "
        f"pass action_space= that says it (such as {override}), or run 'openenv-gym check URL', which finds what the env takes"
    )


class UnboundedInteger(gspaces.Box):
    """A ``Box`` of int64 integers with no bounds, which refuses to be sampled.

    The space of a required integer action field whose schema gives no range
    (``action: int``, ``tokens: list[int]``): it holds every int64, so any
    action the user gives is sent, but no sample of it is an action the env
    is sure to take (a random -1 for a move index). :meth:`sample` raises
    :class:`SpaceMappingError` naming ``action_space=`` and ``openenv-gym
    check``, which probes the range the env takes. ``field`` is the field's
    dotted path, for that message. Batches of it (``OpenEnvVectorEnv``) refuse too.
    """

    def __init__(self, shape: Sequence[int] = (), *, field: str = "", seed: int | np.random.Generator | None = None) -> None:
        super().__init__(low=-np.inf, high=np.inf, shape=tuple(shape), dtype=np.int64, seed=seed)
        self.field = field

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        raise _refuse_sample(self.field, "an integer whose schema gives no range", "gymnasium.spaces.Discrete(n) for n actions")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shape}, field={self.field!r})"


class UnsizedSequence(gspaces.Sequence):
    """A ``Sequence`` of numbers of any length, which refuses to be sampled: an action list whose schema gives no length.

    Such a list (``values: List[float]``) usually has the one length the env
    takes (its number of actuators), which the schema does not say: a
    sample of a random length would be refused by the env. Any list the user
    gives is sent. :meth:`sample` raises :class:`SpaceMappingError` naming
    ``action_space=`` (a ``Box`` of that length) and ``openenv-gym check``.
    """

    def __init__(
        self, feature_space: gspaces.Space[Any], *, field: str = "", seed: int | np.random.Generator | None = None, stack: bool = False
    ) -> None:
        super().__init__(feature_space, seed=seed, stack=stack)
        self.field = field

    def sample(self, mask: Any = None, probability: Any = None) -> Any:
        raise _refuse_sample(
            self.field, "a list of numbers whose schema gives no length", "gymnasium.spaces.Box(low, high, (n,)) for n values"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.feature_space}, field={self.field!r})"


def _batch_unbounded_integer(space: UnboundedInteger, n: int = 1) -> UnboundedInteger:
    return UnboundedInteger((n, *space.shape), field=space.field)


# (Gymnasium dispatches on the class: a batch of it would be a plain Box, whose samples are sent)
_batch_space.register(UnboundedInteger)(_batch_unbounded_integer)


def _sampleable(space: Space) -> Space:
    """``space`` with every :class:`UnboundedInteger` in it a plain int64 ``Box`` (an optional field's: the server has a default)."""
    if isinstance(space, UnboundedInteger):
        return gspaces.Box(-np.inf, np.inf, space.shape, np.int64)
    if isinstance(space, UnsizedSequence):
        return space  # (a default length would say nothing of the length the env takes)
    if isinstance(space, gspaces.Dict):
        return gspaces.Dict([(k, _sampleable(s)) for k, s in space.spaces.items()])
    if isinstance(space, gspaces.Tuple):
        return gspaces.Tuple([_sampleable(s) for s in space.spaces])
    if isinstance(space, BoundedSequence):
        return BoundedSequence(
            _sampleable(space.feature_space), min_length=space.min_length, max_length=space.max_length, stack=space.stack
        )
    if isinstance(space, gspaces.Sequence):
        return gspaces.Sequence(_sampleable(space.feature_space), stack=space.stack)
    return space


def _no_flat_text(space: UnicodeText) -> int:
    raise ValueError(
        f"{space!r} holds any string, so it has no flat form (Gymnasium flattens text to max_length "
        "indices into a finite charset); give the field a maxLength, or pass observation_space= "
        "with a Text of your own charset, to flatten it"
    )


def _flatdim_unicode_text(space: UnicodeText) -> int:
    if space.max_length > TEXT_SAMPLE_MAX_LENGTH:
        _no_flat_text(space)
    return space.max_length


def _flatten_space_unicode_text(space: UnicodeText) -> gspaces.Box:
    if space.max_length > TEXT_SAMPLE_MAX_LENGTH:
        _no_flat_text(space)
    return gspaces.Box(0, len(space.character_set), (space.max_length,), np.int32)


def _flatten_unicode_text(space: UnicodeText, x: str) -> np.ndarray:  # type: ignore[misc]  # (registered for UnicodeText only)
    if space.max_length > TEXT_SAMPLE_MAX_LENGTH or not all(c in space.character_set for c in x):
        _no_flat_text(space)
    arr = np.full(space.max_length, len(space.character_set), dtype=np.int32)
    for i, c in enumerate(x):
        arr[i] = space.character_index(c)
    return arr


# Gymnasium dispatches on the class: without these, flattening an unbounded text
# would allocate 2**31 ints, and a character outside the charset would be a KeyError.
_space_utils.flatdim.register(UnicodeText)(_flatdim_unicode_text)
_space_utils.flatten_space.register(UnicodeText)(_flatten_space_unicode_text)
_space_utils.flatten.register(UnicodeText)(_flatten_unicode_text)


#: Deepest nesting of the JSON text of a top-level action field (less by one for
#: each list or object the field sits in): the request around it adds a few
#: levels, and servers refuse messages deeper than 32 (``Limits.max_depth``).
JSON_TEXT_MAX_DEPTH = 24


def _unsendable(value: Any, max_depth: int = JSON_TEXT_MAX_DEPTH) -> str | None:
    """Why a parsed JSON value cannot be sent on every path (msgpack included), or ``None``; iterative."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        kind = type(v)
        if kind is int:
            if not -(2**63) <= v < 2**64:
                return "holds an integer outside [-2**63, 2**64)"
        elif kind is str:
            if not _sendable_text(v):
                return "holds a lone surrogate (\\ud800-\\udfff)"
        elif kind is list or kind is dict:
            if depth > max_depth:
                return f"nests deeper than {max_depth} levels (the most this field can hold)"
            stack.extend((x, depth + 1) for x in (v if kind is list else [*v.keys(), *v.values()]))
    return None


def plain_json(value: Any) -> Any:
    """``value`` with numpy arrays and scalars as lists and Python numbers, at any depth.

    The fast path stacks a column of ints into an array; a free-form value reads the same on both paths.
    """
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    return value


def _plain_json(value: Any) -> Any:
    """``json.dumps`` default: numpy arrays and scalars as lists and numbers; anything else as its ``str``."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return str(value)


#: ``max_length`` of a string field whose schema gives no ``maxLength``: no
#: limit in practice (a program, a web page); frame limits bound what is sent.
TEXT_DEFAULT_MAX_LENGTH: int = 2**31 - 1

#: Longest string :meth:`UnicodeText.sample` draws unless asked for a length.
TEXT_SAMPLE_MAX_LENGTH: int = 4096

#: Fields of every OpenEnv observation that are not part of the observation space.
OBSERVATION_BASE_FIELDS: frozenset[str] = frozenset({"done", "reward", "metadata"})

#: Fields of every OpenEnv action that are not part of the action space.
ACTION_BASE_FIELDS: frozenset[str] = frozenset({"metadata"})

_ROLES = ("observation", "action")
_MAX_DEPTH = 32  # schema / description nesting limit
_MAX_ELEMENTS = 2**31  # largest element count of one array space
#: Largest array of a space built from a peer's schema, description or first observation, in bytes (its
#: bounds are made as big): a 300-byte schema of an array of 2**31 numbers would otherwise take 16 GiB.
_MAX_ARRAY_BYTES = Limits().max_array_bytes


def _too_big(shape: Sequence[int], dtype: Any, max_bytes: int) -> bool:
    """Whether an array of ``shape`` and ``dtype`` is over ``max_bytes`` (checked before it is made)."""
    return math.prod(shape) * np.dtype(dtype).itemsize > max_bytes


_INT64 = np.iinfo(np.int64)
_ALLOWED_DTYPES = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    ]
)


def _hint(role: str) -> str:
    if role == "action":
        return "pass action_space= (to OpenEnvEnv or OpenEnvVectorEnv), or action_key= to use a single field"
    return "pass observation_space= (to OpenEnvEnv or OpenEnvVectorEnv), or obs_key= to use a single field"


def _field_error(role: str, path: str, problem: str) -> SpaceMappingError:
    where = f"{role} field '{path}'" if path else f"{role} schema"
    return SpaceMappingError(f"{where}: {problem}; {_hint(role)}")


# --------------------------------------------------------------------------
# Codecs
# --------------------------------------------------------------------------

_MISSING: Any = object()


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


# --------------------------------------------------------------------------
# JSON Schema -> space
# --------------------------------------------------------------------------


def _is_null_schema(s: Any) -> bool:
    return isinstance(s, Mapping) and (s.get("type") == "null" or s.get("const", 0) is None) and ("$ref" not in s)


def _follow_ref(ref: Any, root: Mapping[str, Any], role: str, path: str) -> Mapping[str, Any]:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise _field_error(role, path, f"unsupported $ref {ref!r:.80} (only local '#/...' references)")
    node: Any = root
    if ref not in ("#", "#/"):
        if not ref.startswith("#/"):
            raise _field_error(role, path, f"unsupported $ref {ref!r:.80}")
        for raw in ref[2:].split("/"):
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            else:
                raise _field_error(role, path, f"unresolvable $ref {ref!r:.80}")
    if not isinstance(node, Mapping):
        raise _field_error(role, path, f"$ref {ref!r:.80} does not point to a schema")
    return node


def _resolve(
    schema: Any, root: Mapping[str, Any], role: str, path: str, refs: frozenset[str]
) -> tuple[dict[str, Any], bool, frozenset[str]]:
    """Strip ``$ref``, single ``allOf`` and ``Optional`` wrappers.

    Returns the effective schema, whether ``null`` is allowed, and the set of
    references followed so far (for cycle detection).
    """
    nullable = False
    for _ in range(4 * _MAX_DEPTH):
        if not isinstance(schema, Mapping):
            raise _field_error(role, path, f"schema is not an object: {schema!r:.80}")
        s = dict(schema)
        if "$ref" in s:
            ref = s.pop("$ref")
            if not isinstance(ref, str):
                raise _field_error(role, path, f"$ref must be a string, got {ref!r:.80}")
            if ref in refs:
                raise _field_error(role, path, f"recursive schema through $ref {ref!r:.80}")
            refs = refs | {ref}
            schema = {**_follow_ref(ref, root, role, path), **s}
            continue
        if "allOf" in s:
            parts = s.pop("allOf")
            if not isinstance(parts, list) or len(parts) != 1:
                raise _field_error(role, path, "allOf with several schemas cannot be mapped")
            schema = {**_ensure_mapping(parts[0], role, path), **s}
            continue
        union_key = "anyOf" if "anyOf" in s else "oneOf" if "oneOf" in s else None
        if union_key is not None:
            options = s.pop(union_key)
            if not isinstance(options, list):
                raise _field_error(role, path, f"{union_key} is not a list")
            kept = [o for o in options if not _is_null_schema(o)]
            nullable = nullable or len(kept) < len(options)
            if not kept:
                raise _field_error(role, path, "only null is allowed")
            if len(kept) > 1:  # several types (dict | bool, a union of models): free-form content
                s.pop("type", None)
                return {**s, _ANY: True, _BRANCHES: kept}, nullable, refs
            schema = {**_ensure_mapping(kept[0], role, path), **s}
            continue
        t = s.get("type")
        if isinstance(t, list):
            kept_t = [x for x in t if x != "null"]
            nullable = nullable or len(kept_t) < len(t)
            if not kept_t:
                raise _field_error(role, path, "only null is allowed")
            if len(kept_t) > 1:
                del s["type"]
                return {**s, _ANY: True, _BRANCHES: [{"type": x} for x in kept_t]}, nullable, refs
            s["type"] = kept_t[0]
        return s, nullable, refs
    raise _field_error(role, path, "schema nesting too deep")


def _ensure_mapping(x: Any, role: str, path: str) -> Mapping[str, Any]:
    if not isinstance(x, Mapping):
        raise _field_error(role, path, f"schema is not an object: {x!r:.80}")
    return x


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not (isinstance(x, float) and math.isnan(x))


def _bounds(s: Mapping[str, Any], role: str, path: str) -> tuple[float | None, bool, float | None, bool]:
    """(low, low_exclusive, high, high_exclusive) from a numeric schema."""
    low: float | None = None
    high: float | None = None
    low_ex = high_ex = False
    lo_in, hi_in = s.get("minimum"), s.get("maximum")
    lo_ex, hi_ex = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    for name, v in (("minimum", lo_in), ("maximum", hi_in)):
        if v is not None and not _number(v):
            raise _field_error(role, path, f"{name} is not a number: {v!r:.40}")
    if lo_in is not None:
        low = lo_in
    if hi_in is not None:
        high = hi_in
    # Draft-4 style boolean exclusive bounds modify minimum/maximum.
    if lo_ex is True and low is not None:
        low_ex = True
    elif lo_ex is not None and lo_ex is not False:
        if not _number(lo_ex):
            raise _field_error(role, path, f"exclusiveMinimum is not a number: {lo_ex!r:.40}")
        if low is None or lo_ex >= low:
            low, low_ex = lo_ex, True
    if hi_ex is True and high is not None:
        high_ex = True
    elif hi_ex is not None and hi_ex is not False:
        if not _number(hi_ex):
            raise _field_error(role, path, f"exclusiveMaximum is not a number: {hi_ex!r:.40}")
        if high is None or hi_ex <= high:
            high, high_ex = hi_ex, True
    return low, low_ex, high, high_ex


#: Item kinds a ``Sequence(..., stack=True)`` can stack into one array.
_STACKABLE = frozenset({"box", "discrete", "bool", "enum", "multibinary", "multidiscrete"})

#: A whole-string pattern that is a choice of literal words: ``^(a|b)$``, ``^(?:a|b)$``, ``^a$``.
_CHOICE_PATTERN = re.compile(r"\^(?:\((?:\?:)?(?P<group>[^()]*)\)|(?P<bare>[^()|]*))\$")
#: One literal alternative: no regex syntax but escaped punctuation.
_LITERAL = re.compile(r"(?:[^\\^$.|?*+()\[\]{}]|\\[\\^$.|?*+()\[\]{}/\-])+")
_MAX_CHOICES = 1024


def _pattern_choices(pattern: Any) -> tuple[str, ...] | None:
    """The literal strings a ``pattern`` such as ``^(reveal|flag)$`` allows, or ``None`` for any other pattern."""
    if not isinstance(pattern, str):
        return None
    match = _CHOICE_PATTERN.fullmatch(pattern)
    if match is None:
        return None
    body = match.group("group") if match.group("group") is not None else match.group("bare")
    options = body.split("|")
    if not 1 <= len(options) <= _MAX_CHOICES or not all(_LITERAL.fullmatch(o) for o in options):
        return None
    choices = tuple(re.sub(r"\\(.)", r"\1", o) for o in options)
    return choices if len(set(choices)) == len(choices) else None


def _int_bounds(s: Mapping[str, Any], role: str, path: str) -> tuple[int | None, int | None]:
    """Inclusive integer bounds, clamped to the int64 range (``None`` = unbounded)."""
    low, low_ex, high, high_ex = _bounds(s, role, path)
    lo: int | None = None
    hi: int | None = None
    if low is not None and not math.isinf(low):
        lo = math.floor(low) + 1 if low_ex else math.ceil(low)
        lo = min(max(lo, int(_INT64.min)), int(_INT64.max))
    elif low is not None and low > 0:
        raise _field_error(role, path, "integer minimum is +inf")
    if high is not None and not math.isinf(high):
        hi = math.ceil(high) - 1 if high_ex else math.floor(high)
        hi = min(max(hi, int(_INT64.min)), int(_INT64.max))
    elif high is not None and high < 0:
        raise _field_error(role, path, "integer maximum is -inf")
    if lo is not None and hi is not None and lo > hi:
        raise _field_error(role, path, f"empty integer range [{lo}, {hi}]")
    return lo, hi


def _float_dtype(role: str) -> np.dtype:
    """The dtype of a ``number``: float32 in observations (Gymnasium's own), float64 in actions.

    An action's number is sent as JSON, which a server reads as a float64:
    as float64 it arrives as given (0.7, not float32's 0.699999988...), and
    a bound of the schema (``le=0.3``) is a value of the space.
    """
    return np.dtype(np.float32 if role == "observation" else np.float64)


def _float_bounds(s: Mapping[str, Any], role: str, path: str) -> tuple[float | None, float | None]:
    """Bounds of a ``number`` in its dtype (:func:`_float_dtype`).

    Actions: rounded inwards, so that every sample satisfies the schema
    (exact, but for exclusive bounds and integers beyond 2**53).
    Observations: rounded outwards (exclusive bounds taken as closed),
    so that every value the server may send, read as float32, is in the space
    (``ge=0.7`` holds ``float32(0.7)``, which is below 0.7).
    """
    low, low_ex, high, high_ex = _bounds(s, role, path)
    dtype = _float_dtype(role)
    ftype, fmax = dtype.type, float(np.finfo(dtype).max)
    lo: float | None = None
    hi: float | None = None
    outward = role == "observation"
    down, up = ftype(-np.inf), ftype(np.inf)
    with np.errstate(over="ignore"):
        if low is not None and low > -fmax:
            f = ftype(low)
            if outward:
                if float(f) > low:
                    f = np.nextafter(f, down)
            elif float(f) < low or (low_ex and float(f) <= low):
                f = np.nextafter(f, up)
            lo = float(f)
        if high is not None and high < fmax:
            f = ftype(high)
            if outward:
                if float(f) < high:
                    f = np.nextafter(f, up)
            elif float(f) > high or (high_ex and float(f) >= high):
                f = np.nextafter(f, down)
            hi = float(f)
    if lo is not None and math.isinf(lo):
        raise _field_error(role, path, f"number minimum {low!r} is beyond the {dtype.name} range")
    if hi is not None and math.isinf(hi):
        raise _field_error(role, path, f"number maximum {high!r} is beyond the {dtype.name} range")
    if lo is not None and hi is not None and lo > hi:
        raise _field_error(role, path, f"empty number range [{low}, {high}]")
    return lo, hi


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
    has_default = "default" in s
    common: dict[str, Any] = {
        "path": path,
        "role": role,
        "nullable": nullable,
        "has_default": has_default,
        "default": s.get("default"),
    }

    # An enum that can be null (itself, or in an observation through an Optional model around it) has
    # null as one more value, its last: a null reads as that, not as the first value (MCP's `error: null`).
    null_too = nullable or (_null_parent and role == "observation")
    if "enum" in s or "const" in s:
        values = s["enum"] if "enum" in s else [s["const"]]
        if not isinstance(values, list) or not values:
            raise _field_error(role, path, "enum is empty or not a list")
        return _enum_field(values, null_too, common)

    t = s.get("type")
    if t is None and isinstance(s.get("properties"), Mapping):
        t = "object"

    if t == "boolean":
        return gspaces.Discrete(2), FieldCodec(kind="bool", dtype=np.dtype(np.int64), **common)

    if t == "integer":
        lo, hi = _int_bounds(s, role, path)
        if lo is not None and hi is not None and hi - lo + 1 <= int(_INT64.max):
            codec = FieldCodec(kind="discrete", dtype=np.dtype(np.int64), low=lo, high=hi, **common)
            return gspaces.Discrete(hi - lo + 1, start=lo), codec
        # An action's integer with no range at all: any int64 is sent, none is sampled (see UnboundedInteger).
        box = (
            UnboundedInteger(field=path)
            if role == "action" and lo is None and hi is None
            else _make_box(lo, hi, (), np.dtype(np.int64), role, path)
        )
        return box, FieldCodec(kind="box", dtype=box.dtype, shape=(), low=lo, high=hi, **common)

    if t == "number":
        flo, fhi = _float_bounds(s, role, path)
        box = _make_box(flo, fhi, (), _float_dtype(role), role, path)
        return box, FieldCodec(kind="box", dtype=box.dtype, shape=(), low=flo, high=fhi, **common)

    if t == "string":
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
        return text, FieldCodec(kind="text", **common)

    if t == "array":
        if _sequence_items(s, root, role, path, refs) or (
            ("[]" in path or role == "action" or path in variable) and _open_length(s) and isinstance(s.get("items"), Mapping)
        ):
            # (an open-length array inside a list's items, or in an action, has no first observation to take its shape from)
            # A list of strings, objects or enum values (chat messages, legal moves): a Sequence.
            if _depth >= _MAX_DEPTH:
                raise _field_error(role, path, f"nested deeper than {_MAX_DEPTH} levels")
            item_space, item_codec = field_space(
                s["items"],
                root,
                f"{path}[]",
                role,
                exclude=exclude,
                variable=variable,
                max_array_bytes=max_array_bytes,
                _refs=refs,
                _depth=_depth + 1,
            )
            codec = FieldCodec(kind="sequence", children=(("item", item_codec),), **common)
            if role == "action" and "maxItems" not in s and not _sequence_items(s, root, role, path, refs):
                return UnsizedSequence(item_space, field=path), codec  # (numbers, of a length the schema does not say)
            if role == "action" and ("minItems" in s or "maxItems" in s):  # (observations are not held to them, as with text)
                lo_n, hi_n = _length_bounds(s, "minItems", "maxItems", role, path)
                return BoundedSequence(item_space, min_length=lo_n, max_length=hi_n), codec
            return gspaces.Sequence(item_space, stack=False), codec
        return _array_field(s, root, path, role, refs, _depth, common, max_array_bytes)

    if _is_free(s):
        # Free-form content (Dict[str, Any], Any, a union of types): its JSON text.
        space: Space = JsonText(TEXT_DEFAULT_MAX_LENGTH, example=_free_example({**s, "type": t} if t else s, nullable))
        return space, FieldCodec(kind="json", **common)

    if t == "object":
        props = s.get("properties")
        if not isinstance(props, Mapping):  # ("items" beside "object", or properties that are no map)
            raise _field_error(role, path, f"object 'properties' must be a map, got {props!r:.40}")
        required = _required(s)
        children: list[tuple[str, Space, FieldCodec]] = []
        excluded = set(exclude)
        for name, sub in props.items():
            sub_path = f"{path}.{name}" if path else str(name)
            if sub_path in excluded:
                continue
            try:
                sp, cd = field_space(
                    sub,
                    root,
                    sub_path,
                    role,
                    exclude=exclude,
                    variable=variable,
                    max_array_bytes=max_array_bytes,
                    _refs=refs,
                    _depth=_depth + 1,
                    _null_parent=null_too,
                )
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
        codec = FieldCodec(kind="dict", children=tuple((k, cd) for k, _, cd in children), **common)
        return space, codec

    if t == "null":
        raise _field_error(role, path, "a field that is always null cannot be mapped")
    raise _field_error(role, path, f"schema type {t!r:.40} cannot be mapped")


def _enum_field(values: list[Any], null_too: bool, common: dict[str, Any]) -> tuple[Space, FieldCodec]:
    """``Discrete`` over ``values`` (and ``None`` last, with ``null_too``, unless it is one of them already)."""
    if null_too and not any(v is None for v in values):
        values = [*values, None]
    codec = FieldCodec(kind="enum", values=tuple(values), dtype=np.dtype(np.int64), **common)
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


def _length_bounds(s: Mapping[str, Any], low: str, high: str, role: str, path: str) -> tuple[int, int | None]:
    """``(s[low] or 0, s[high] or None)``: a ``minLength``/``maxLength`` (or ``minItems``/``maxItems``) pair, checked."""
    lo, hi = s.get(low, 0), s.get(high)
    for name, v in ((low, lo), (high, hi)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise _field_error(role, path, f"{name} is not a non-negative integer")
    if hi is not None and lo > hi:
        raise _field_error(role, path, f"{low} {lo} > {high} {hi}")
    return lo, hi


def _open_length(s: Mapping[str, Any]) -> bool:
    """Whether the array ``s`` has no fixed length (no ``minItems == maxItems``, no ``prefixItems``)."""
    lo, hi = s.get("minItems"), s.get("maxItems")
    fixed = isinstance(lo, int) and not isinstance(lo, bool) and lo == hi
    return not fixed and not s.get("prefixItems")


#: Marks a resolved schema of free-form content (a union of several types).
_ANY = "x-openenv-gym-any"
#: The union's non-null schemas, for an example of its values.
_BRANCHES = "x-openenv-gym-branches"

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


def _is_free(s: Mapping[str, Any]) -> bool:
    """Whether a resolved schema is free-form content: an object without ``properties``, no type, or a union."""
    if s.get(_ANY):
        return True
    if any(key in s for key in ("enum", "const", "properties", "items", "prefixItems")):
        return False
    return s.get("type") in ("object", None)


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
    known = [d for d in shape if d is not None]
    if math.prod(known) > _MAX_ELEMENTS or _too_big(known, dtype, max_array_bytes):
        raise _field_error(
            role, path, f"array of {math.prod(known)} {dtype.name} elements is over {max_array_bytes} bytes (Limits.max_array_bytes)"
        )
    codec = FieldCodec(
        kind="multibinary" if etype == "boolean" else "box",
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


def _top_properties(schema: Any, role: str) -> tuple[dict[str, Any], Mapping[str, Any], set[str]]:
    if not isinstance(schema, Mapping):
        raise _field_error(role, "", f"expected a JSON schema object, got {type(schema).__name__}")
    s, _, _ = _resolve(schema, schema, role, "", frozenset())
    props = s.get("properties")
    if not isinstance(props, Mapping):
        raise _field_error(role, "", "schema has no 'properties'")
    return dict(s), props, _required(s)


def _required(s: Mapping[str, Any]) -> set[str]:
    """The names an object schema lists as required (what is not a name in it is ignored)."""
    required = s.get("required")
    return {name for name in required if isinstance(name, str)} if isinstance(required, list) else set()


def _observation_candidates(props: Mapping[str, Any], truncated_key: str | None, exclude: Collection[str]) -> list[str]:
    excluded = set(OBSERVATION_BASE_FIELDS) | set(exclude)
    if truncated_key is not None:
        excluded.add(truncated_key)
    return [str(k) for k in props if k not in excluded]


def _action_candidates(props: Mapping[str, Any], required: set[str]) -> tuple[list[str], list[str]]:
    """The action fields a space covers, and the required ones among them.

    Every field but ``metadata`` and optional tags: an optional field that
    allows one value only (the ``type: Literal["call_tool"]`` of a tool call)
    says nothing, so the server fills it in.
    """
    names = [str(k) for k, prop in props.items() if k not in ACTION_BASE_FIELDS and (k in required or not _tag(prop))]
    return names, [k for k in names if k in required]


def _tag(prop: Any) -> bool:
    if not isinstance(prop, Mapping):
        return False
    values = prop.get("enum")
    return "const" in prop or (isinstance(values, list) and len(values) == 1)


def _unset(wire: Any, codec: "FieldCodec") -> bool:
    """Whether an optional action field's wire value says nothing: its default, or empty where the default is nothing.

    (An empty text where the default is ``">"`` is what the user asks for: it is sent.)
    """
    if codec.has_default and _json_equal(wire, codec.default):
        return True
    if codec.has_default and not (codec.default is None or codec.default in ("", [], {})):
        return False
    return codec.kind in ("text", "json", "sequence") and (wire is None or wire in ("", [], {}))


def observation_space_from_schema(
    schema: Mapping[str, Any],
    *,
    obs_key: str | None = None,
    truncated_key: str | None = None,
    exclude: Collection[str] = (),
    variable: Collection[str] = (),
    max_array_bytes: int = _MAX_ARRAY_BYTES,
) -> SchemaSpace:
    """The observation space of an observation model's JSON schema.

    ``done``, ``reward``, ``metadata``, ``truncated_key`` and ``exclude`` (top
    level names or dotted nested paths) are left out. With ``obs_key`` the space
    is that field's space; with exactly one field left, that field's space
    itself (not a one-key ``Dict``); otherwise a ``Dict`` over the fields.
    ``variable`` names open-length numeric arrays whose length varies (dotted
    paths): ``Sequence`` spaces. Top-level fields of free-form content (``Dict[str, Any]``, ``Any``) are
    left out of the space too, as :attr:`SchemaSpace.info_fields`, unless
    nothing else is left. Open-length arrays stay open until :func:`fix_open_shapes`.
    No array of the space is over ``max_array_bytes`` (``Limits.max_array_bytes``).

    Raises:
        SpaceMappingError: a field cannot be mapped (message names the field
            and ``observation_space=`` / ``obs_key=``).
    """
    role = "observation"
    top, props, _ = _top_properties(schema, role)
    variable = (variable,) if isinstance(variable, str) else tuple(variable or ())
    sspace = _observation_space(schema, top, props, role, obs_key, truncated_key, exclude, variable, max_array_bytes)
    if variable:
        paths = _codec_paths(sspace.codec)
        wrong = [v for v in variable if not (v in paths and paths[v].kind == "sequence")]
        if wrong:
            raise SpaceMappingError(
                f"variable_fields {wrong}: not lists of numbers of open length in the observation "
                f"(its fields: {sorted(p for p in paths if p)})"
            )
    return sspace


def _codec_paths(codec: FieldCodec) -> dict[str, FieldCodec]:
    """Every codec below ``codec`` (included), by its dotted path."""
    out: dict[str, FieldCodec] = {}
    stack = [codec]
    while stack:
        c = stack.pop()
        out.setdefault(c.path, c)
        stack.extend(child for _, child in c.children)
    return out


def _observation_space(
    schema: Mapping[str, Any],
    top: dict[str, Any],
    props: Mapping[str, Any],
    role: str,
    obs_key: str | None,
    truncated_key: str | None,
    exclude: Collection[str],
    variable: tuple[str, ...],
    max_array_bytes: int = _MAX_ARRAY_BYTES,
) -> SchemaSpace:
    """:func:`observation_space_from_schema` once the schema's top level is read."""
    if obs_key is not None:
        if obs_key not in props:
            raise SpaceMappingError(
                f"observation schema has no field {obs_key!r} (fields: {sorted(props)}); "
                "fix obs_key= or pass observation_space= (to OpenEnvEnv or OpenEnvVectorEnv)"
            )
        sp, cd = field_space(props[obs_key], schema, obs_key, role, exclude=exclude, variable=variable, max_array_bytes=max_array_bytes)
        return SchemaSpace(sp, (obs_key,), obs_key, cd, role)
    names = _observation_candidates(props, truncated_key, exclude)
    free = tuple(n for n in names if _free_form(props[n], schema))
    unmapped = _unmappable(schema, props, [n for n in names if n not in free], role, exclude, variable, max_array_bytes)
    if unmapped and len(free) + len(unmapped) < len(names):
        # A field no space can hold (a tuple of a float and a str) goes in info, as free-form ones do:
        # the rest of the env stays usable, without a hand-written observation_space.
        for exc in unmapped.values():
            _logger.warning("%s (meanwhile it goes in info, as received)", exc)
        free += tuple(unmapped)
    if free and len(free) < len(names):  # (nothing but free-form fields: the error below names one)
        names = [n for n in names if n not in free]
    else:
        free = ()
    if len(names) == 1:
        name = names[0]
        sp, cd = field_space(props[name], schema, name, role, exclude=exclude, variable=variable, max_array_bytes=max_array_bytes)
        return SchemaSpace(sp, (name,), name, cd, role, free)
    sub = {**top, "properties": {k: props[k] for k in names}}
    sp, cd = field_space(sub, schema, "", role, exclude=exclude, variable=variable, max_array_bytes=max_array_bytes)
    return SchemaSpace(sp, tuple(k for k, _ in cd.children), None, cd, role, free)


def _unmappable(
    schema: Mapping[str, Any],
    props: Mapping[str, Any],
    names: Sequence[str],
    role: str,
    exclude: Collection[str],
    variable: tuple[str, ...],
    max_array_bytes: int = _MAX_ARRAY_BYTES,
) -> dict[str, SpaceMappingError]:
    """The top-level fields among ``names`` that no space can hold, with why."""
    out: dict[str, SpaceMappingError] = {}
    for name in names:
        try:
            field_space(props[name], schema, name, role, exclude=exclude, variable=variable, max_array_bytes=max_array_bytes)
        except SpaceMappingError as exc:
            out[name] = exc
    return out


def _free_form(schema: Any, root: Mapping[str, Any]) -> bool:
    """Whether a field holds free-form content: an object without ``properties`` (``Dict[str, Any]``) or anything (``Any``)."""
    try:
        s, _, _ = _resolve(schema, root, "observation", "", frozenset())
    except SpaceMappingError:
        return False
    return _is_free(s)


def _numeric_items(s: Any, root: Mapping[str, Any]) -> bool:
    """Whether ``s`` is a number, an integer, a boolean or a (nested) array of them."""
    for _ in range(_MAX_DEPTH):
        try:
            r, _, _ = _resolve(s, root, "observation", "", frozenset())
        except SpaceMappingError:
            return False
        if "enum" in r or "const" in r or r.get(_ANY):
            return False
        t = r.get("type")
        if t in ("number", "integer", "boolean"):
            return True
        if t != "array" or r.get("prefixItems") or not isinstance(r.get("items"), Mapping):
            return False
        s = r["items"]
    return False


def numeric_maps(schema: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The top-level fields of an observation schema that are maps of numbers (``Dict[str, List[float]]``), with their value schema.

    Such a field is free-form to the schema (no ``properties``), but its
    values are numbers or lists of numbers: from a first observation it can
    be a ``Dict`` of ``Box`` es (see :func:`with_map_keys`).
    """
    try:
        _, props, _ = _top_properties(schema, "observation")
    except SpaceMappingError:
        return {}
    out: dict[str, Mapping[str, Any]] = {}
    for name, prop in props.items():
        if name in OBSERVATION_BASE_FIELDS or not isinstance(name, str):
            continue
        try:
            s, _, _ = _resolve(prop, schema, "observation", name, frozenset())
        except SpaceMappingError:
            continue
        values = s.get("additionalProperties")
        if s.get("type") == "object" and not s.get("properties") and isinstance(values, Mapping) and _numeric_items(values, schema):
            out[name] = values
    return out


def with_map_keys(schema: Mapping[str, Any], keys: Mapping[str, Collection[str]]) -> dict[str, Any]:
    """``schema`` with each map field named in ``keys`` (see :func:`numeric_maps`) an object of those keys, all required."""
    maps = numeric_maps(schema)
    props = dict(schema.get("properties") or {})
    for name, names in keys.items():
        props[name] = {"type": "object", "properties": {k: maps[name] for k in names}, "required": sorted(names)}
    return {**schema, "properties": props}


def empty_open_arrays(sspace: SchemaSpace, payload: Mapping[str, Any]) -> tuple[str, ...]:
    """The open-length arrays of ``sspace`` (dotted paths) whose value in ``payload`` is an empty list.

    No shape taken from an empty list could hold a later value: such a
    field is better a ``Sequence`` (``variable=``).
    """
    out: list[str] = []
    stack: list[tuple[FieldCodec, Any]] = []
    if sspace.single_field is not None:
        stack.append((sspace.codec, payload.get(sspace.single_field) if isinstance(payload, Mapping) else None))
    else:
        stack.append((sspace.codec, payload))
    while stack:
        codec, value = stack.pop()
        if codec.kind in ("box", "multibinary") and codec.shape and codec.shape[0] is None:
            if isinstance(value, (list, tuple)) and not value:
                out.append(codec.path)
        elif codec.kind == "dict" and isinstance(value, Mapping):
            stack.extend((child, value.get(key)) for key, child in codec.children)
    return tuple(sorted(out))


def integer_list(schema: Mapping[str, Any], name: str) -> bool:
    """Whether ``name`` is a top-level field of ``schema`` that holds a list of integers (``List[int]``)."""
    props = schema.get("properties")
    if not isinstance(props, Mapping) or name not in props:
        return False
    try:
        s, _, _ = _resolve(props[name], schema, "observation", name, frozenset())
        if s.get("type") != "array" or not isinstance(s.get("items"), Mapping):
            return False
        item, _, _ = _resolve(s["items"], schema, "observation", name, frozenset())
    except SpaceMappingError:
        return False
    return item.get("type") == "integer" and "enum" not in item and "const" not in item


def action_space_from_schema(
    schema: Mapping[str, Any], *, action_key: str | None = None, max_array_bytes: int = _MAX_ARRAY_BYTES
) -> SchemaSpace:
    """The action space of an action model's JSON schema.

    A schema that is a union of several models (``oneOf``, a tagged union)
    maps, as a whole, to :class:`JsonText`: the action's JSON object.
    ``metadata`` is left out, and so are optional tags (fields that allow one
    value only; see :func:`_action_candidates`). With ``action_key`` the space
    is that field's space. Otherwise, if one field remains, that field's space
    alone (``to_wire(v)`` returns ``{field: wire(v)}``); else a ``Dict`` over
    the fields. Optional fields that cannot be mapped are left out of it,
    required ones raise. An optional field sent as its default, or as an empty
    text, list or map, is left out of the message: the server fills it in.

    Raises:
        SpaceMappingError: a field cannot be mapped (message names the field
            and ``action_space=`` / ``action_key=``).
    """
    role = "action"
    try:
        top, props, required = _top_properties(schema, role)
    except SpaceMappingError:
        if action_key is None and _is_union(schema):
            # One of several action models (a tagged union): the whole action as JSON text.
            return SchemaSpace(JsonText(example="{}"), (), None, FieldCodec(kind="json", path="", role=role), role)
        raise
    if action_key is not None:
        if action_key not in props:
            raise SpaceMappingError(
                f"action schema has no field {action_key!r} (fields: {sorted(props)}); fix action_key= or pass action_space= to OpenEnvEnv"
            )
        sp, cd = field_space(props[action_key], schema, action_key, role, max_array_bytes=max_array_bytes)
        return SchemaSpace(sp, (action_key,), action_key, cd, role)
    names, req = _action_candidates(props, required)
    single = names[0] if len(names) == 1 else None
    if single is not None:
        sp, cd = field_space(props[single], schema, single, role, max_array_bytes=max_array_bytes)
        if single not in required:
            sp = _sampleable(sp)  # (the server has a default for it)
        return SchemaSpace(sp, (single,), single, cd, role)
    sub = {**top, "properties": {k: props[k] for k in names}}
    sp, cd = field_space(sub, schema, "", role, max_array_bytes=max_array_bytes)
    return SchemaSpace(sp, tuple(k for k, _ in cd.children), None, cd, role)


def _is_union(schema: Any) -> bool:
    try:
        s, _, _ = _resolve(schema, schema, "action", "", frozenset())
    except SpaceMappingError:
        return False
    return bool(s.get(_ANY))


def _nested_shape(value: Any, ndim: int) -> tuple[int, ...] | None:
    """Shape of a rectangular nesting of ``ndim`` lists, or ``None``."""
    if isinstance(value, np.ndarray):
        return tuple(value.shape) if value.ndim == ndim else None
    shape: list[int] = []
    level: list[Any] = [value]
    for _ in range(ndim):
        if not all(isinstance(v, (list, tuple)) for v in level):
            return None
        lengths = {len(v) for v in level}
        if len(lengths) != 1:
            return None
        n = lengths.pop()
        shape.append(n)
        level = [x for v in level for x in v]
        if n == 0:
            break
    if len(shape) != ndim:
        shape.extend([0] * (ndim - len(shape)))
    elif any(isinstance(v, (list, tuple)) for v in level):
        return None
    return tuple(shape)


def _fix(space: Space, codec: FieldCodec, value: Any, present: bool, max_bytes: int = _MAX_ARRAY_BYTES) -> tuple[Space, FieldCodec]:
    if not codec.is_open:
        return space, codec
    if codec.kind in ("box", "multibinary"):
        if not present or value is None:
            raise codec._err("array of unknown length, and the first observation has no value for it")
        shape = _nested_shape(value, len(codec.shape))
        if shape is None:
            raise codec._err(f"array of unknown length, and the first observation's value is not a {len(codec.shape)}-dimensional array")
        for want, got in zip(codec.shape, shape):
            if want is not None and want != got:
                raise codec._err(f"expected shape {codec.shape}, got {shape}")
        if math.prod(shape) > _MAX_ELEMENTS or _too_big(shape, codec.dtype, max_bytes):
            raise codec._err(f"array of shape {shape} is over {max_bytes} bytes (Limits.max_array_bytes)")
        etype = "boolean" if codec.kind == "multibinary" else ("integer" if codec.dtype == np.dtype(np.int64) else "number")
        new_space = _array_space((etype, codec.low, codec.high), shape, codec.role, codec.path)
        return new_space, replace(codec, shape=shape, shaped_by_first=True)
    if codec.kind == "dict":
        assert isinstance(space, gspaces.Dict)
        sub = value if isinstance(value, Mapping) else {}
        pairs: list[tuple[str, Space]] = []
        kids: list[tuple[str, FieldCodec]] = []
        for key, child in codec.children:
            sp, cd = _fix(space[key], child, sub.get(key), key in sub, max_bytes)
            pairs.append((key, sp))
            kids.append((key, cd))
        return gspaces.Dict(pairs), replace(codec, children=tuple(kids))
    return space, codec  # pragma: no cover


def fix_open_shapes(sspace: SchemaSpace, payload: Mapping[str, Any], *, max_array_bytes: int = _MAX_ARRAY_BYTES) -> SchemaSpace:
    """Fix open-length array shapes from a first (reset) observation payload.

    Each open array takes the shape of its received value (nested lists give
    multi-dimensional shapes; dimensions the schema fixed must agree). Returns
    ``sspace`` itself when nothing is open, else a new :class:`SchemaSpace`.

    A top-level open array that is null (or absent) in the payload leaves
    the space and joins :attr:`SchemaSpace.info_fields`, unless it is the
    only field.

    Raises:
        SpaceMappingError: the payload has no (rectangular) value for an open
            field; the message names it and ``observation_space=``.
    """
    if not sspace.is_open:
        return sspace
    if not isinstance(payload, Mapping):
        raise _field_error(sspace.role, "", "expected an object of observation fields")
    if sspace.single_field is None and sspace.codec.kind == "dict":
        # An open array that is null in the first observation (a screenshot not taken yet) has no
        # shape to take: it travels in info, as received, rather than failing the whole env.
        unshaped = tuple(
            key
            for key, child in sspace.codec.children
            if child.kind in ("box", "multibinary") and any(d is None for d in child.shape) and payload.get(key) is None
        )
        if unshaped and len(unshaped) < len(sspace.codec.children):
            _logger.warning("observation fields %s have no value in the first observation: they go to info", list(unshaped))
            kids = tuple((k, c) for k, c in sspace.codec.children if k not in unshaped)
            sspace = replace(
                sspace,
                space=gspaces.Dict([(k, sspace.space[k]) for k, _ in kids]),  # type: ignore[index]  # (a Dict here)
                fields=tuple(k for k, _ in kids),
                codec=replace(sspace.codec, children=kids),
                info_fields=sspace.info_fields + unshaped,
            )
    if sspace.single_field is not None:
        key = sspace.single_field
        sp, cd = _fix(sspace.space, sspace.codec, payload.get(key), key in payload, max_array_bytes)
    else:
        sp, cd = _fix(sspace.space, sspace.codec, payload, True, max_array_bytes)
    return replace(sspace, space=sp, codec=cd)


# --------------------------------------------------------------------------
# Explicit spaces
# --------------------------------------------------------------------------


def _explicit_codec(
    space: Space,
    path: str,
    role: str,
    sub_schema: Mapping[str, Any] | None,
    root: Mapping[str, Any] | None,
) -> FieldCodec:
    """Codec for a user-given space; prefers the schema's codec when it maps to the same space."""
    if sub_schema is not None and root is not None:
        try:
            derived, codec = field_space(sub_schema, root, path, role)
        except SpaceMappingError:
            derived, codec = None, None
        if codec is not None and not codec.is_open and derived == space:
            return codec
    array_kinds = (
        (gspaces.Box, "box"),
        (gspaces.MultiBinary, "multibinary"),
        (gspaces.MultiDiscrete, "multidiscrete"),
    )
    for cls, kind in array_kinds:
        if isinstance(space, cls):
            return FieldCodec(kind=kind, path=path, role=role, dtype=space.dtype, shape=space.shape, reshape=True)
    if isinstance(space, gspaces.Discrete):
        start = int(space.start)
        return FieldCodec(kind="discrete", path=path, role=role, dtype=space.dtype, low=start, high=start + int(space.n) - 1)
    if isinstance(space, JsonText):
        return FieldCodec(kind="json", path=path, role=role)
    if isinstance(space, gspaces.Text):
        return FieldCodec(kind="text", path=path, role=role)
    if isinstance(space, gspaces.Sequence):
        items: Mapping[str, Any] | None = None
        if sub_schema is not None and root is not None:
            try:
                resolved, _, _ = _resolve(sub_schema, root, role, path, frozenset())
                items = resolved.get("items") if isinstance(resolved.get("items"), Mapping) else None
            except SpaceMappingError:
                items = None
        item = _explicit_codec(space.feature_space, f"{path}[]", role, items, root)
        if space.stack and item.kind not in _STACKABLE:
            raise _field_error(
                role, path, f"a stacked Sequence of {type(space.feature_space).__name__} is not supported (stack=True needs array items)"
            )
        return FieldCodec(kind="sequence", path=path, role=role, children=(("item", item),), stack=bool(space.stack))
    if isinstance(space, gspaces.Dict):
        props: Mapping[str, Any] = {}
        if sub_schema is not None and root is not None:
            try:
                resolved, _, _ = _resolve(sub_schema, root, role, path, frozenset())
                p = resolved.get("properties")
                props = p if isinstance(p, Mapping) else {}
            except SpaceMappingError:
                props = {}
        kids = []
        for key, sub in space.spaces.items():
            if not isinstance(key, str):
                raise _field_error(role, path, f"Dict key {key!r} is not a string")
            sub_path = f"{path}.{key}" if path else key
            kids.append((key, _explicit_codec(sub, sub_path, role, props.get(key), root)))
        return FieldCodec(kind="dict", path=path, role=role, children=tuple(kids))
    if isinstance(space, gspaces.Tuple):
        kids = [(str(i), _explicit_codec(sub, f"{path}.{i}" if path else str(i), role, None, None)) for i, sub in enumerate(space.spaces)]
        return FieldCodec(kind="tuple", path=path, role=role, children=tuple(kids))
    raise _field_error(role, path, f"{type(space).__name__} spaces are not supported")


def space_codec(
    space: Space,
    *,
    role: str = "observation",
    schema: Mapping[str, Any] | None = None,
    key: str | None = None,
    truncated_key: str | None = None,
    exclude: Collection[str] = (),
) -> SchemaSpace:
    """Wrap an explicit ``observation_space=`` / ``action_space=`` in a :class:`SchemaSpace`.

    The field(s) the space covers:

    * ``key`` (the user's ``obs_key=`` / ``action_key=``) given: that field.
    * a ``Dict`` space: its keys are the fields; except when the schema is
      given, the keys are not all top-level fields and the schema has a single
      candidate field, which the ``Dict`` then describes.
    * otherwise the schema's single field: for observations the one left after
      leaving out ``done``/``reward``/``metadata``/``truncated_key``/``exclude``;
      for actions the one non-``metadata`` field or the one required field.

    Values convert as: Box ``np.array(v, dtype).reshape(shape)`` (a copy),
    Discrete a scalar of its dtype (``np.int64`` by default), MultiBinary /
    MultiDiscrete ``np.array(v, dtype)``, Text ``str``, Dict / Tuple per item;
    to the wire as ``.tolist()`` / ``int`` / ``str``. Where the schema maps a
    field to a space equal to the given one, the schema's codec is used (so
    enums and booleans keep their wire values).

    Raises:
        SpaceMappingError: the covered field is ambiguous (names ``obs_key=`` /
            ``action_key=``) or the space type is not supported.
    """
    if role not in _ROLES:
        raise ValueError(f"role must be 'observation' or 'action', got {role!r}")
    if not isinstance(space, Space):
        raise TypeError(f"expected a gymnasium Space, got {type(space).__name__}")
    key_arg = "obs_key=" if role == "observation" else "action_key="
    props: Mapping[str, Any] = {}
    candidates: list[str] = []
    free: tuple[str, ...] = ()
    required: set[str] = set()
    if schema is not None:
        _, props, required = _top_properties(schema, role)
        if role == "observation":
            candidates = _observation_candidates(props, truncated_key, exclude)
            free = tuple(n for n in candidates if _free_form(props[n], schema))
            if free and len(free) < len(candidates):
                candidates = [n for n in candidates if n not in free]
            else:
                free = ()
        else:
            names, req = _action_candidates(props, required)
            candidates = names if len(names) == 1 else req if len(req) == 1 else names
    root = schema

    single: str | None = key
    if single is None and isinstance(space, gspaces.Dict):
        keys = [str(k) for k in space.spaces]
        if schema is not None and not all(k in props for k in keys) and len(candidates) == 1:
            single = candidates[0]
        else:
            sub = {
                "type": "object",
                "properties": {k: props[k] for k in keys if k in props},
                "required": [k for k in keys if k in required],
            }
            codec = _explicit_codec(space, "", role, sub if props else None, root)
            return SchemaSpace(space, tuple(keys), None, codec, role, tuple(n for n in free if n not in keys))
    if single is None:
        if schema is None:
            raise SpaceMappingError(
                f"{role} space {type(space).__name__} is not a Dict and no schema is known to name its field; pass {key_arg}"
            )
        if len(candidates) != 1:
            raise SpaceMappingError(
                f"{role} space {type(space).__name__} is not a Dict and the schema has "
                f"{len(candidates)} candidate fields {candidates}; pass {key_arg} to say which"
            )
        single = candidates[0]
    codec = _explicit_codec(space, single, role, props.get(single), root)
    return SchemaSpace(space, (single,), single, codec, role, tuple(n for n in free if n != single))


# --------------------------------------------------------------------------
# Exact descriptions
# --------------------------------------------------------------------------


def _desc_error(problem: str) -> SpaceMappingError:
    return SpaceMappingError(f"invalid space description: {problem}")


def _encode_float(x: float) -> float | str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _unflatten(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """Nested lists of ``shape`` from a row-major flat list (a bare leaf for ``()``)."""
    if not shape:
        return flat[0]

    def build(offset: int, dims: tuple[int, ...]) -> list[Any]:
        if len(dims) == 1:
            return flat[offset : offset + dims[0]]
        stride = math.prod(dims[1:])
        return [build(offset + i * stride, dims[1:]) for i in range(dims[0])]

    return build(0, shape)


def _encode_bounds(arr: np.ndarray, bounded: np.ndarray, sign: str) -> Any:
    flat = arr.ravel().tolist()
    mask = bounded.ravel().tolist()
    if arr.dtype.kind == "f":
        leaves = [_encode_float(float(v)) for v in flat]
    elif arr.dtype.kind == "b":
        leaves = [bool(v) for v in flat]
    else:
        leaves = [int(v) if m else sign for v, m in zip(flat, mask)]
    return _unflatten(leaves, arr.shape)


def describe_space(space: Space) -> dict[str, Any]:
    """An exact JSON-able description of ``space`` (``{"type": "Box", ...}``).

    Formats: ``Box`` (``dtype`` name, ``shape`` list, ``low``/``high`` nested
    lists; non-finite floats as ``"inf"``, ``"-inf"``, ``"nan"``; unbounded
    integer elements as ``"-inf"``/``"inf"``), ``Discrete`` (``n``, ``start``,
    ``dtype``), ``MultiDiscrete`` (``nvec``, ``start`` nested lists, ``dtype``),
    ``MultiBinary`` (``n``: int or list), ``Text`` (``min_length``,
    ``max_length``, ``charset`` string in the space's order), ``Dict``
    (``keys`` list in order and ``spaces`` list), ``Tuple`` (``spaces`` list),
    ``Sequence`` (``feature_space``, ``stack`` bool).
    ``space_from_description(describe_space(s)) == s``.
    """
    return _describe(space, 0)


def _describe(space: Space, depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise _desc_error(f"spaces nested deeper than {_MAX_DEPTH} levels")
    if isinstance(space, gspaces.Box):
        return {
            "type": "Box",
            "dtype": space.dtype.name,
            "shape": list(space.shape),
            "low": _encode_bounds(space.low, space.bounded_below, "-inf"),
            "high": _encode_bounds(space.high, space.bounded_above, "inf"),
        }
    if isinstance(space, gspaces.Discrete):
        return {
            "type": "Discrete",
            "n": int(space.n),
            "start": int(space.start),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gspaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gspaces.MultiBinary):
        n = space.n
        return {
            "type": "MultiBinary",
            "n": int(n) if isinstance(n, (int, np.integer)) else [int(x) for x in n],
        }
    if isinstance(space, gspaces.Text):
        return {
            "type": "UnicodeText" if isinstance(space, UnicodeText) else "Text",
            "min_length": int(space.min_length),
            "max_length": int(space.max_length),
            "charset": "".join(space.character_list),
        }
    if isinstance(space, gspaces.Dict):
        keys = list(space.spaces)
        if not all(isinstance(k, str) for k in keys):
            raise _desc_error("Dict keys must be strings")
        return {
            "type": "Dict",
            "keys": keys,
            "spaces": [_describe(space.spaces[k], depth + 1) for k in keys],
        }
    if isinstance(space, gspaces.Tuple):
        return {"type": "Tuple", "spaces": [_describe(s, depth + 1) for s in space.spaces]}
    if isinstance(space, gspaces.Sequence):
        if space.stack and not isinstance(space.feature_space, ARRAY_SPACES):
            raise _desc_error(
                f"a stacked Sequence of {type(space.feature_space).__name__} cannot be described (stack=True needs array items)"
            )
        return {"type": "Sequence", "feature_space": _describe(space.feature_space, depth + 1), "stack": bool(space.stack)}
    raise _desc_error(f"{type(space).__name__} spaces cannot be described")


_DESC_KEYS: dict[str, frozenset[str]] = {
    "Box": frozenset({"type", "dtype", "shape", "low", "high"}),
    "Discrete": frozenset({"type", "n", "start", "dtype"}),
    "MultiDiscrete": frozenset({"type", "nvec", "start", "dtype"}),
    "MultiBinary": frozenset({"type", "n"}),
    "Text": frozenset({"type", "min_length", "max_length", "charset"}),
    "UnicodeText": frozenset({"type", "min_length", "max_length", "charset"}),
    "Dict": frozenset({"type", "keys", "spaces"}),
    "Tuple": frozenset({"type", "spaces"}),
    "Sequence": frozenset({"type", "feature_space", "stack"}),
}


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _get_int(desc: Mapping[str, Any], key: str, minimum: int | None = None) -> int:
    v = desc.get(key)
    if not _is_int(v):
        raise _desc_error(f"{desc.get('type')}.{key} must be an integer, got {v!r:.40}")
    if minimum is not None and v < minimum:
        raise _desc_error(f"{desc.get('type')}.{key} must be >= {minimum}, got {v}")
    return int(v)


def _get_dtype(desc: Mapping[str, Any], integer_only: bool = False) -> np.dtype:
    name = desc.get("dtype")
    if not isinstance(name, str) or name not in _ALLOWED_DTYPES:
        raise _desc_error(f"{desc.get('type')}.dtype {name!r:.40} is not an allowed dtype")
    dtype = np.dtype(name)
    if integer_only and dtype.kind not in "iu":
        raise _desc_error(f"{desc.get('type')}.dtype must be an integer dtype, got {name}")
    return dtype


def _get_shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > _MAX_DEPTH:
        raise _desc_error(f"{what} must be a list of at most {_MAX_DEPTH} integers")
    if not all(_is_int(d) and d >= 0 for d in value):
        raise _desc_error(f"{what} must hold non-negative integers, got {value!r:.80}")
    if math.prod(value) > _MAX_ELEMENTS:
        raise _desc_error(f"{what} {value} has more than 2**31 elements")
    return tuple(int(d) for d in value)


def _flatten(value: Any, shape: tuple[int, ...], what: str) -> list[Any]:
    """Leaves of a nested list that must have exactly ``shape``."""
    level = [value]
    for d in shape:
        nxt: list[Any] = []
        for v in level:
            if not isinstance(v, list) or len(v) != d:
                raise _desc_error(f"{what} does not have shape {list(shape)}")
            nxt.extend(v)
        level = nxt
    if any(isinstance(v, (list, dict)) for v in level):
        raise _desc_error(f"{what} does not have shape {list(shape)}")
    return level


def _decode_bounds(value: Any, shape: tuple[int, ...], dtype: np.dtype, sign: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(array of dtype, bounded mask) from a nested list of encoded bounds."""
    leaves = _flatten(value, shape, what)
    mask = [True] * len(leaves)
    out: list[Any] = []
    if dtype.kind == "f":
        specials = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
        for v in leaves:
            if isinstance(v, str) and v in specials:
                out.append(specials[v])
            elif _number(v) or (isinstance(v, float) and math.isnan(v)):
                out.append(float(v))
            else:
                raise _desc_error(f"{what} holds {v!r:.40}, not a number")
        with np.errstate(over="ignore"):
            arr = np.array(out, dtype=dtype).reshape(shape)
        if np.any(np.isinf(arr) & np.isfinite(np.array(out, dtype=np.float64).reshape(shape))):
            raise _desc_error(f"{what} holds values beyond the {dtype.name} range")
        return arr, np.array(mask, dtype=bool).reshape(shape)
    if dtype.kind == "b":
        if not all(isinstance(v, bool) for v in leaves):
            raise _desc_error(f"{what} of a bool Box must hold booleans")
        arr = np.array(leaves, dtype=bool).reshape(shape)
        return arr, np.array(mask, dtype=bool).reshape(shape)
    info = np.iinfo(dtype)
    for i, v in enumerate(leaves):
        if v == sign and dtype.kind == "i":
            out.append(int(info.min) if sign == "-inf" else int(info.max))
            mask[i] = False
        elif _is_int(v) and info.min <= v <= info.max:
            out.append(v)
        else:
            raise _desc_error(f"{what} holds {v!r:.40}, not a {dtype.name} value")
    return np.array(out, dtype=dtype).reshape(shape), np.array(mask, dtype=bool).reshape(shape)


def _decode_int_array(value: Any, dtype: np.dtype, what: str) -> np.ndarray:
    shape: list[int] = []
    probe = value
    while isinstance(probe, list):
        if len(shape) >= _MAX_DEPTH:
            raise _desc_error(f"{what} nested deeper than {_MAX_DEPTH} levels")
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    dims = _get_shape(shape, what)
    leaves = _flatten(value, dims, what)
    info = np.iinfo(dtype)
    if not all(_is_int(v) and info.min <= v <= info.max for v in leaves):
        raise _desc_error(f"{what} must hold {dtype.name} integers")
    return np.array(leaves, dtype=dtype).reshape(dims)


def space_from_description(desc: Mapping[str, Any], *, max_array_bytes: int = _MAX_ARRAY_BYTES) -> Space:
    """The space a :func:`describe_space` description stands for.

    The input may come from the network: it is validated strictly (known
    ``type`` and keys only, allowed dtypes only, non-negative sizes, at most 32
    levels of nesting, at most ``max_array_bytes`` per array space, checked
    before it is made, bounds given as full nested lists). Nothing is evaluated.

    Raises:
        SpaceMappingError: the description is invalid.
    """
    return _from_desc(desc, 0, max_array_bytes)


def _from_desc(desc: Any, depth: int, max_bytes: int = _MAX_ARRAY_BYTES) -> Space:
    if depth > _MAX_DEPTH:
        raise _desc_error(f"spaces nested deeper than {_MAX_DEPTH} levels")
    if not isinstance(desc, Mapping):
        raise _desc_error(f"expected an object, got {type(desc).__name__}")
    kind = desc.get("type")
    if not isinstance(kind, str) or kind not in _DESC_KEYS:
        raise _desc_error(f"unknown space type {kind!r:.40}")
    extra = set(desc) - _DESC_KEYS[kind]
    missing = _DESC_KEYS[kind] - set(desc)
    if extra or missing:
        raise _desc_error(f"{kind} has unknown keys {sorted(map(str, extra))} / misses {sorted(missing)}")
    try:
        if kind == "Box":
            dtype = _get_dtype(desc)
            shape = _get_shape(desc["shape"], "Box.shape")
            if _too_big(shape, dtype, max_bytes):
                raise _desc_error(f"Box.shape {list(shape)} of {dtype.name} is over {max_bytes} bytes (Limits.max_array_bytes)")
            low, low_mask = _decode_bounds(desc["low"], shape, dtype, "-inf", "Box.low")
            high, high_mask = _decode_bounds(desc["high"], shape, dtype, "inf", "Box.high")
            box = gspaces.Box(low=low, high=high, shape=shape, dtype=dtype)
            if dtype.kind == "i":
                box.bounded_below = low_mask
                box.bounded_above = high_mask
            return box
        if kind == "Discrete":
            dtype = _get_dtype(desc, integer_only=True)
            n = _get_int(desc, "n", minimum=1)
            start = _get_int(desc, "start")
            info = np.iinfo(dtype)
            if not (info.min <= start and n <= info.max and start + n - 1 <= info.max):
                raise _desc_error(f"Discrete n={n}, start={start} do not fit {dtype.name}")
            return gspaces.Discrete(n, start=start, dtype=dtype)
        if kind == "MultiDiscrete":
            dtype = _get_dtype(desc, integer_only=True)
            nvec = _decode_int_array(desc["nvec"], dtype, "MultiDiscrete.nvec")
            starts = _decode_int_array(desc["start"], dtype, "MultiDiscrete.start")
            if starts.shape != nvec.shape:
                raise _desc_error("MultiDiscrete.start and nvec differ in shape")
            if not (nvec > 0).all():
                raise _desc_error("MultiDiscrete.nvec must be positive")
            return gspaces.MultiDiscrete(nvec, dtype=dtype, start=starts)
        if kind == "MultiBinary":
            n = desc["n"]
            if _is_int(n):
                if n < 1 or n > min(_MAX_ELEMENTS, max_bytes):
                    raise _desc_error(f"MultiBinary.n must be in [1, {min(_MAX_ELEMENTS, max_bytes)}] (Limits.max_array_bytes), got {n}")
                return gspaces.MultiBinary(int(n))
            dims = _get_shape(n, "MultiBinary.n")
            if _too_big(dims, np.int8, max_bytes):
                raise _desc_error(f"MultiBinary.n {list(dims)} is over {max_bytes} bytes (Limits.max_array_bytes)")
            if any(d == 0 for d in dims):
                raise _desc_error("MultiBinary.n must hold positive integers")
            return gspaces.MultiBinary(list(dims))
        if kind in ("Text", "UnicodeText"):
            min_len = _get_int(desc, "min_length", minimum=0)
            max_len = _get_int(desc, "max_length", minimum=min_len)
            if max_len > _MAX_ELEMENTS:
                raise _desc_error("Text.max_length larger than 2**31")
            charset = desc["charset"]
            if not isinstance(charset, str):
                raise _desc_error("Text.charset must be a string")
            if kind == "UnicodeText":
                return UnicodeText(max_len, min_length=min_len, charset=charset)
            return gspaces.Text(max_length=max_len, min_length=min_len, charset=charset)
        if kind == "Dict":
            keys, subs = desc["keys"], desc["spaces"]
            if not isinstance(keys, list) or not isinstance(subs, list) or len(keys) != len(subs):
                raise _desc_error("Dict.keys and Dict.spaces must be lists of equal length")
            if not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
                raise _desc_error("Dict.keys must be distinct strings")
            return gspaces.Dict([(k, _from_desc(s, depth + 1, max_bytes)) for k, s in zip(keys, subs)])
        if kind == "Sequence":
            if not isinstance(desc["stack"], bool):
                raise _desc_error("Sequence.stack must be a boolean")
            feature = _from_desc(desc["feature_space"], depth + 1, max_bytes)
            if desc["stack"] and not isinstance(feature, ARRAY_SPACES):
                # (and each stacked level would copy the ones inside it: nested, they cost 2**depth)
                raise _desc_error(f"a stacked Sequence needs array items, got {type(feature).__name__}")
            return gspaces.Sequence(feature, stack=desc["stack"])
        # Tuple
        subs = desc["spaces"]
        if not isinstance(subs, list):
            raise _desc_error("Tuple.spaces must be a list")
        return gspaces.Tuple([_from_desc(s, depth + 1, max_bytes) for s in subs])
    except SpaceMappingError:
        raise
    except (ValueError, TypeError, OverflowError, AssertionError) as exc:
        raise _desc_error(f"{kind}: {exc}") from None
