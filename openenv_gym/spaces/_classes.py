"""The space classes Gymnasium lacks (any-Unicode text, JSON text, bounded and unsampleable spaces), and how Gymnasium flattens and batches them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces as gspaces
from gymnasium.spaces import Space
from gymnasium.spaces import utils as _space_utils
from gymnasium.vector.utils import batch_space as _batch_space

from ._base import TEXT_CHARSET, TEXT_SAMPLE_MAX_LENGTH, SpaceMappingError, _sendable_text


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
