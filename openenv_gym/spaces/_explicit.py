"""A space the user gives (``observation_space=``, ``action_space=``) wrapped in a :class:`SchemaSpace`."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gymnasium import spaces as gspaces
from gymnasium.spaces import Space

from ._base import _ROLES, SpaceMappingError, _field_error
from ._classes import JsonText
from ._field_codec import FieldCodec, SchemaSpace
from ._from_schema import _action_candidates, _free_form, _observation_candidates, _top_properties
from ._kinds import FIELD_KINDS, CodecKind
from ._schema_fields import field_space
from ._schema_nodes import _resolve


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
        (gspaces.Box, CodecKind.BOX),
        (gspaces.MultiBinary, CodecKind.MULTIBINARY),
        (gspaces.MultiDiscrete, CodecKind.MULTIDISCRETE),
    )
    for cls, kind in array_kinds:
        if isinstance(space, cls):
            return FieldCodec(kind=kind, path=path, role=role, dtype=space.dtype, shape=space.shape, reshape=True)
    if isinstance(space, gspaces.Discrete):
        start = int(space.start)
        return FieldCodec(kind=CodecKind.DISCRETE, path=path, role=role, dtype=space.dtype, low=start, high=start + int(space.n) - 1)
    if isinstance(space, JsonText):
        return FieldCodec(kind=CodecKind.JSON, path=path, role=role)
    if isinstance(space, gspaces.Text):
        return FieldCodec(kind=CodecKind.TEXT, path=path, role=role)
    if isinstance(space, gspaces.Sequence):
        items: Mapping[str, Any] | None = None
        if sub_schema is not None and root is not None:
            try:
                resolved, _, _ = _resolve(sub_schema, root, role, path, frozenset())
                items = resolved.get("items") if isinstance(resolved.get("items"), Mapping) else None
            except SpaceMappingError:
                items = None
        item = _explicit_codec(space.feature_space, f"{path}[]", role, items, root)
        if space.stack and not FIELD_KINDS[item.kind].stackable:
            raise _field_error(
                role, path, f"a stacked Sequence of {type(space.feature_space).__name__} is not supported (stack=True needs array items)"
            )
        return FieldCodec(kind=CodecKind.SEQUENCE, path=path, role=role, children=(("item", item),), stack=bool(space.stack))
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
        return FieldCodec(kind=CodecKind.DICT, path=path, role=role, children=tuple(kids))
    if isinstance(space, gspaces.Tuple):
        kids = [(str(i), _explicit_codec(sub, f"{path}.{i}" if path else str(i), role, None, None)) for i, sub in enumerate(space.spaces)]
        return FieldCodec(kind=CodecKind.TUPLE, path=path, role=role, children=tuple(kids))
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
        props, required, candidates, free = _schema_candidates(schema, role, truncated_key, exclude)
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


def _schema_candidates(
    schema: Mapping[str, Any], role: str, truncated_key: str | None, exclude: Collection[str]
) -> tuple[Mapping[str, Any], set[str], list[str], tuple[str, ...]]:
    """``(properties, required, candidates, free)`` of a model's schema, for :func:`space_codec`.

    ``candidates``: the fields a space that is not a ``Dict`` may stand for;
    ``free``: the observation fields of free-form content, which go to ``info``.
    """
    _, props, required = _top_properties(schema, role)
    free: tuple[str, ...] = ()
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
    return props, required, candidates, free
