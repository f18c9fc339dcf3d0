"""A model's whole JSON Schema to the :class:`SchemaSpace` of its observations or actions, and open shapes fixed from a first observation."""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from gymnasium import spaces as gspaces
from gymnasium.spaces import Space

from ._base import (
    _MAX_ARRAY_BYTES,
    _MAX_DEPTH,
    _MAX_ELEMENTS,
    ACTION_BASE_FIELDS,
    OBSERVATION_BASE_FIELDS,
    SpaceMappingError,
    _field_error,
    _too_big,
)
from ._classes import JsonText, _sampleable
from ._field_codec import FieldCodec, SchemaSpace
from ._kinds import CodecKind
from ._schema_fields import _array_space, field_space
from ._schema_nodes import _ANY, _is_free, _required, _resolve

_logger = logging.getLogger(__name__)


def _top_properties(schema: Any, role: str) -> tuple[dict[str, Any], Mapping[str, Any], set[str]]:
    if not isinstance(schema, Mapping):
        raise _field_error(role, "", f"expected a JSON schema object, got {type(schema).__name__}")
    s, _, _ = _resolve(schema, schema, role, "", frozenset())
    props = s.get("properties")
    if not isinstance(props, Mapping):
        raise _field_error(role, "", "schema has no 'properties'")
    return dict(s), props, _required(s)


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
        wrong = [v for v in variable if not (v in paths and paths[v].kind == CodecKind.SEQUENCE)]
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
        if codec.kind in (CodecKind.BOX, CodecKind.MULTIBINARY) and codec.shape and codec.shape[0] is None:
            if isinstance(value, (list, tuple)) and not value:
                out.append(codec.path)
        elif codec.kind == CodecKind.DICT and isinstance(value, Mapping):
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
            return SchemaSpace(JsonText(example="{}"), (), None, FieldCodec(kind=CodecKind.JSON, path="", role=role), role)
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
    if codec.kind in (CodecKind.BOX, CodecKind.MULTIBINARY):
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
        etype = "boolean" if codec.kind == CodecKind.MULTIBINARY else ("integer" if codec.dtype == np.dtype(np.int64) else "number")
        new_space = _array_space((etype, codec.low, codec.high), shape, codec.role, codec.path)
        return new_space, replace(codec, shape=shape, shaped_by_first=True)
    if codec.kind == CodecKind.DICT:
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
    if sspace.single_field is None and sspace.codec.kind == CodecKind.DICT:
        # An open array that is null in the first observation (a screenshot not taken yet) has no
        # shape to take: it travels in info, as received, rather than failing the whole env.
        unshaped = tuple(
            key
            for key, child in sspace.codec.children
            if child.kind in (CodecKind.BOX, CodecKind.MULTIBINARY) and any(d is None for d in child.shape) and payload.get(key) is None
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
