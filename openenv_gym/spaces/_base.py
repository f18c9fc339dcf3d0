"""What every part of the spaces package shares: the error it raises, its limits and checks of JSON values."""

from __future__ import annotations

import math
import string
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np

from openenv_gym.config import Limits
from openenv_gym.errors import OpenEnvGymError


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


def _hint(role: str) -> str:
    if role == "action":
        return "pass action_space= (to OpenEnvEnv or OpenEnvVectorEnv), or action_key= to use a single field"
    return "pass observation_space= (to OpenEnvEnv or OpenEnvVectorEnv), or obs_key= to use a single field"


def _field_error(role: str, path: str, problem: str) -> SpaceMappingError:
    where = f"{role} field '{path}'" if path else f"{role} schema"
    return SpaceMappingError(f"{where}: {problem}; {_hint(role)}")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not (isinstance(x, float) and math.isnan(x))


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)
