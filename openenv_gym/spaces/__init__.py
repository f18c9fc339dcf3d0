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

from ._base import (
    ACTION_BASE_FIELDS,
    OBSERVATION_BASE_FIELDS,
    TEXT_CHARSET,
    TEXT_DEFAULT_MAX_LENGTH,
    TEXT_SAMPLE_MAX_LENGTH,
    SpaceMappingError,
)
from ._base import (
    JSON_TEXT_MAX_DEPTH as JSON_TEXT_MAX_DEPTH,
)
from ._base import (
    plain_json as plain_json,
)
from ._classes import BoundedSequence, JsonText, UnboundedInteger, UnicodeText, UnsizedSequence
from ._descriptions import describe_space, space_from_description
from ._explicit import space_codec
from ._field_codec import FieldCodec, SchemaSpace
from ._from_schema import (
    action_space_from_schema,
    fix_open_shapes,
    observation_space_from_schema,
)
from ._from_schema import (
    empty_open_arrays as empty_open_arrays,
)
from ._from_schema import (
    integer_list as integer_list,
)
from ._from_schema import (
    numeric_maps as numeric_maps,
)
from ._from_schema import (
    with_map_keys as with_map_keys,
)
from ._kinds import CodecKind
from ._schema_fields import field_space

# (JSON_TEXT_MAX_DEPTH, plain_json, empty_open_arrays, integer_list, numeric_maps and with_map_keys:
# not in __all__, imported by the rest of openenv_gym from here)

__all__ = [
    "SpaceMappingError",
    "FieldCodec",
    "CodecKind",
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
