"""Reading one node of a JSON Schema: ``$ref``, ``allOf`` and union wrappers, numeric and length bounds, choice patterns."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._base import _MAX_DEPTH, _field_error, _number

_INT64 = np.iinfo(np.int64)


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


def _is_free(s: Mapping[str, Any]) -> bool:
    """Whether a resolved schema is free-form content: an object without ``properties``, no type, or a union."""
    if s.get(_ANY):
        return True
    if any(key in s for key in ("enum", "const", "properties", "items", "prefixItems")):
        return False
    return s.get("type") in ("object", None)


def _required(s: Mapping[str, Any]) -> set[str]:
    """The names an object schema lists as required (what is not a name in it is ignored)."""
    required = s.get("required")
    return {name for name in required if isinstance(name, str)} if isinstance(required, list) else set()
