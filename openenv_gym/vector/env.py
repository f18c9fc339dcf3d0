"""``OpenEnvVectorEnv``: a Gymnasium ``VectorEnv`` over many remote sessions.

The async ``send``/``recv`` pair is the one code path (EnvPool's design);
``step`` is ``send`` of every env then ``recv`` of every env, and
``step_async``/``step_wait`` are Gymnasium's names for the same.

The network lives in :mod:`.core` and :mod:`.links`; this module only turns
per-env results into Gymnasium's batch, with the autoreset cases in the same
order as ``gymnasium.vector.SyncVectorEnv`` so the two can be read side by side.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import functools
import logging
import math
import ssl as ssl_module
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils.seeding import np_random
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from .._actions import coerce_action, refusal
from .._loop import LoopThread, Readers
from .._masks import any_true, count_true
from .._numbers import ARRAY_SPACES
from ..config import Limits, Timeouts
from ..errors import CapacityError, ConnectionLost, OpenEnvGymError, PoolUnavailable, ProtocolError, ServerError, SessionTimeout
from ..protocol.messages import check_reset_options
from ..registration import with_time_limit
from ..remote import Tool, fetch_health, fetch_schema, list_tools, resolve_spaces
from ..spaces import SpaceMappingError
from .core import Arrival, PoolCore, call_all, session_lost, take_columns
from .links import FastLink, Link, Results, connect_link
from .lockstep import step_every_env

__all__ = ["OpenEnvVectorEnv"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ActionsInFlight(gym.error.AlreadyPendingCallError, ValueError):
    """Actions sent for envs that still have one in flight: ``recv()`` (or ``step_wait()``) first.

    A :class:`gymnasium.error.AlreadyPendingCallError`, as ``AsyncVectorEnv``
    raises for a second ``step_async``, and a ``ValueError``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, "step")


@dataclasses.dataclass(slots=True)
class _CoreRequest:
    """A request handed to the core (``core.submit``), now or with the next wait; calling it submits it."""

    submit: Callable[..., None]
    kind: str  # "reset", "step" or "final_reset" (SAME_STEP)
    env_ids: np.ndarray
    arguments: dict[str, Any]  # submit's keyword arguments

    def __call__(self) -> None:
        self.submit(self.kind, self.env_ids, **self.arguments)


#: What may be called while an awaited ``arecv`` runs on the pool's worker: it lets go of the pool
#: while it waits for replies, so that code awaiting ``arecv`` in one task can ``send`` from another.
#: (An awaited reset or step does not: a send would mix with the envs it waits for.)
_WHILE_AWAITED = frozenset({"send", "step_async"})


def _one_caller(method: Callable[..., T]) -> Callable[..., T]:
    """Refuse a second thread while one is inside the pool (it is not thread-safe).

    The one exception: :data:`_WHILE_AWAITED` calls while an awaited ``arecv``
    runs. They wait for the moments in which it works on the pool's buffers,
    and it waits for them in turn.
    """
    name = method.__name__.lstrip("_")
    interleaves = name in _WHILE_AWAITED

    def refuse() -> RuntimeError:
        return RuntimeError(f"OpenEnvVectorEnv.{name}: the pool is in use by another thread (it is not thread-safe)")

    @functools.wraps(method)
    def guarded(self: "OpenEnvVectorEnv", *args: Any, **kwargs: Any) -> T:
        lock = self._in_use
        awaited = self._awaited
        on_worker = awaited is not None and threading.get_ident() == self._worker_ident
        beside = interleaves and awaited == "recv" and not on_worker  # (a send while an arecv waits)
        if not lock.acquire(blocking=False):
            if not (on_worker or beside) or not lock.acquire(timeout=self._wait_bound()):
                raise refuse()
        try:
            if self._awaited is not awaited:  # (an awaited call began as this thread came in: judge by it)
                awaited = self._awaited
                on_worker = awaited is not None and threading.get_ident() == self._worker_ident
                beside = interleaves and awaited == "recv" and not on_worker
            if awaited is not None and not (on_worker or beside):
                raise refuse()  # (an awaited arecv waits for replies, and lets go of the pool meanwhile)
            with self._io.holding_ctrl_c():  # (a Ctrl-C waits for a safe point: see _receive, _take_ready)
                return method(self, *args, **kwargs)
        finally:
            lock.release()

    return guarded


#: How many times, within one step, SAME_STEP's reset of an env is sent again after its server was lost
#: (once: a reset that kills every server it reaches should not reach many).
_RESET_TRIES = 1
#: How often the pool places its sessions at its start when servers refuse some (room taken by other clients meanwhile).
_PLACEMENT_TRIES = 3
#: What Gymnasium's info batching raises on infos it cannot batch (see ``OpenEnvVectorEnv._add_typed_info``).
_UNBATCHED = (OverflowError, ValueError, TypeError, AttributeError, KeyError, IndexError)


def _fits(vector_infos: Mapping[str, Any], env_info: Mapping[str, Any]) -> bool:
    """Whether every map in ``env_info`` meets a map (or nothing) in ``vector_infos``, and every other value a non-map."""
    for key, value in env_info.items():
        if key == "final_obs" or key not in vector_infos:
            continue
        batched = vector_infos[key]
        if isinstance(value, dict):
            if not isinstance(batched, dict) or not _fits(batched, value):
                return False
        elif isinstance(batched, dict):
            return False
    return True


def _info_row(batched: Mapping[str, Any], i: int) -> dict[str, Any] | None:
    """Env ``i``'s map out of a batched info map (its keys whose ``_key`` mask is set); ``None`` if it has none."""
    row: dict[str, Any] = {}
    for key, column in batched.items():
        if isinstance(key, str) and key.startswith("_") and key[1:] in batched:
            continue
        try:
            mask = batched.get(f"_{key}")
            if mask is None or not mask[i]:
                continue
            row[key] = _info_row(column, i) if isinstance(column, dict) else column[i]
        except _UNBATCHED:  # (a map that clashing keys left without arrays: what cannot be read is left out)
            continue
    return row or None


#: Rounds of a reset whose sessions broke with a ProtocolError (the server could not read it, say) before
#: ``reset`` raises that error, instead of opening new sessions for it again and again.
RESET_PROTOCOL_RETRIES = 3

#: OpenEnvEnv options a pool takes and ignores (a registered remote env may carry them into make_vec).
_SINGLE_ENV_ONLY = frozenset({"offer_msgpack", "render_mode", "disable_env_checker"})

#: A step() that took longer (seconds) is taken for one of slow envs: the next asks the servers
#: for replies in parts, as envs finish, so that one env past the step timeout costs only its own
#: episode. Faster steps keep the lockstep lane (one frame a server, none in parts), where a
#: timeout costs every env of the server's frame; the first step of a pool is one of those.
SLOW_STEP_SECONDS = 0.05


def _same_on_the_wire(codec: Any) -> bool:
    """Whether a field's wire values are its space's values (an enum sends ``enum[i]``, a bool field ``true``)."""
    return codec.kind in ("box", "discrete", "multibinary", "multidiscrete") and not codec.as_bool


def _batch_space(space: gym.Space, n: int) -> gym.Space:
    """``batch_space(space, n)``, with the open bounds of its integer ``Box`` es kept open.

    Gymnasium builds a batch ``Box`` from the bounds alone, and an open
    integer bound is stored as the dtype's extreme, which the batch takes for
    a bound: its ``sample()`` draws near -2**63, or fails ("high - low < 0")
    for a field that is only bounded below (an OpenEnv ``int = Field(ge=0)``).
    """
    batch = batch_space(space, n)
    _keep_open_bounds(space, batch, n)
    return batch


def _keep_open_bounds(space: gym.Space, batch: gym.Space, n: int) -> None:
    if isinstance(space, spaces.Box):
        if space.dtype.kind in "iu" and not (space.bounded_below.all() and space.bounded_above.all()):
            repeats = (n,) + (1,) * space.bounded_below.ndim
            batch.bounded_below = np.tile(space.bounded_below, repeats)  # type: ignore[attr-defined]
            batch.bounded_above = np.tile(space.bounded_above, repeats)  # type: ignore[attr-defined]
    elif isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _keep_open_bounds(sub, batch[key], n)  # type: ignore[index]
    elif isinstance(space, spaces.Tuple):
        for sub, sub_batch in zip(space.spaces, batch):  # type: ignore[call-overload]
            _keep_open_bounds(sub, sub_batch, n)


def _row_of(space: gym.Space, batch: Any, n: int) -> Any:
    """The ``n``-th value of a batch of ``space``: Dict and Tuple batches hold a batch per sub-space,
    array spaces an array, others (Text, Sequence, ...) a tuple of values."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _row_of(sub, batch[k], n) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_row_of(sub, b, n) for sub, b in zip(space.spaces, batch))
    if isinstance(batch, np.ndarray):
        # A Box's value is an array, even of shape () (batch[n] of a 1-D batch would be a numpy scalar).
        return (batch[n, ...] if isinstance(space, gym.spaces.Box) else batch[n]).copy()
    return batch[n]


def _array_leaves_only(space: gym.Space) -> bool:
    if isinstance(space, ARRAY_SPACES):
        return True
    if isinstance(space, spaces.Dict):
        return all(_array_leaves_only(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return all(_array_leaves_only(s) for s in space.spaces)
    return False


def _write_row(space: gym.Space, out: Any, index: int, value: Any) -> None:
    """Write one env's value into row ``index`` of a batch made by ``create_empty_array``."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _write_row(sub, out[key], index, value[key])
    elif isinstance(space, spaces.Tuple):
        for sub, part, item in zip(space.spaces, out, value):
            _write_row(sub, part, index, item)
    else:
        out[index] = value


def _take_rows(space: gym.Space, batch: Any, rows: np.ndarray) -> Any:
    """Rows ``rows`` of a batch (a copy)."""
    if isinstance(space, spaces.Dict):
        return {key: _take_rows(sub, batch[key], rows) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple) and isinstance(batch, tuple) and len(batch) == len(space.spaces):
        return tuple(_take_rows(sub, part, rows) for sub, part in zip(space.spaces, batch))
    if isinstance(batch, np.ndarray):
        return batch[rows]
    return tuple(batch[i] for i in rows.tolist())


def _copy_batch(batch: Any) -> Any:
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if isinstance(batch, dict):
        return {key: _copy_batch(value) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_copy_batch(value) for value in batch)
    return batch


def _take_results(results: Results, positions: np.ndarray) -> Results:
    """The entries at ``positions`` of every column of ``results`` (and the resets after those, renumbered)."""
    taken = Results(
        take_columns(results.observation, positions),
        results.reward[positions],
        results.done[positions],
        None if results.metadata is None else [results.metadata[p] for p in positions.tolist()],
        None,
    )
    if results.after_rows is not None and results.after is not None:
        renumber = np.full(len(results.done), -1, dtype=np.int64)
        renumber[positions] = np.arange(len(positions))
        rows = renumber[results.after_rows]
        kept = np.flatnonzero(rows >= 0)
        after = results.after
        taken.after_rows = rows[kept]
        taken.after = Results(
            take_columns(after.observation, kept),
            after.reward[kept],
            after.done[kept],
            None if after.metadata is None else [after.metadata[p] for p in kept.tolist()],
            None if after.errors is None else [after.errors[p] for p in kept.tolist()],
        )
    return taken


def _take_info(infos: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """Rows ``rows`` of a batched info dict (arrays and ``_key`` masks alike)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if isinstance(value, dict):
            out[key] = _take_info(value, rows)
        elif isinstance(value, np.ndarray):
            out[key] = value[rows]
        else:
            out[key] = value
    return out


class OpenEnvVectorEnv(VectorEnv):
    """A Gymnasium vector env whose sub-envs are sessions on remote OpenEnv servers.

    Args:
        base_url: one server URL or a list of them (all hosting the same env).
        num_envs: number of sessions.
        autoreset_mode: Gymnasium's ``AutoresetMode`` (or its string value).
        batch_size: envs returned by :meth:`recv` (default ``num_envs``).
        observation_space, action_space, obs_key, action_key, truncated_key, variable_fields, headers, connect_timeout, step_timeout, limits, ssl: as for
            :class:`~openenv_gym.OpenEnvEnv`.
        copy: return copies of the batch buffers (``True``, as ``SyncVectorEnv``)
            or the buffers themselves, overwritten by the next call.
        max_episode_steps: truncate episodes after this many steps, client side.
        request_size: at most this many envs per request in :meth:`send`
            (default: all of a server's envs in one request). With
            ``batch_size < num_envs``, envs arrive as they finish, as in
            EnvPool, whatever the request size: a fast-path server answers a
            request in parts, a stock server gets one request per env.
            :meth:`step` always sends one request per server.
        grace_period: seconds the pool tolerates having no server able to
            host its sessions before it raises :class:`~openenv_gym.PoolUnavailable`.

    Faults cost an episode, never the run: when an env's session is lost
    (server gone, connection dropped, no reply within ``step_timeout``), that
    env's step returns ``truncated=True``, its last observation, reward 0 and
    ``info["openenv_error"]`` (``type``, ``message``, ``server``); the pool
    opens it a new session (on the same server when it answers again, else on
    another with room) and its next step returns the new session's reset
    observation, as after any episode end. A step the server refused
    (``EXECUTION_ERROR``) is reported the same way and the env is reset next.

    Spaces: ``single_observation_space``/``single_action_space`` come from the
    schema; the batched ones from ``gymnasium.vector.utils.batch_space``.
    Rewards are float64 ``(n,)``, terminations and truncations bool ``(n,)``.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    _spec: EnvSpec | None = None

    def __init__(
        self,
        base_url: str | Sequence[str],
        num_envs: int,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        batch_size: int | None = None,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        obs_key: str | None = None,
        action_key: str | None = None,
        truncated_key: str | None = None,
        variable_fields: Sequence[str] = (),
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
        step_timeout: float = 60.0,
        limits: Limits | None = None,
        ssl: ssl_module.SSLContext | None = None,
        copy: bool = True,
        max_episode_steps: int | None = None,
        request_size: int | None = None,
        grace_period: float = 60.0,
        **unused: Any,
    ) -> None:
        unknown = sorted(set(unused) - _SINGLE_ENV_ONLY)
        if unknown:  # (a misspelt option must not pass silently)
            raise TypeError(f"OpenEnvVectorEnv got unexpected keyword arguments {unknown}")
        if unused.get("render_mode") is not None:  # (as OpenEnvEnv: a mode cannot be served)
            raise ValueError(
                f"remote envs do not render (the OpenEnv protocol has no frames to give); got render_mode={unused['render_mode']!r}"
            )
        if unused:
            # gymnasium.make_vec passes every registered kwarg, single-env ones included.
            logger.debug("OpenEnvVectorEnv ignores %s", sorted(unused))
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("base_url must name at least one server")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self.batch_size = num_envs if batch_size is None else int(batch_size)
        if not 1 <= self.batch_size <= num_envs:
            raise ValueError(f"batch_size must be in [1, num_envs={num_envs}], got {batch_size}")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        self.copy = copy
        if max_episode_steps is not None and not (isinstance(max_episode_steps, int) and max_episode_steps > 0):
            raise ValueError(f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}")  # (as TimeLimit)
        self.max_episode_steps = max_episode_steps
        if request_size is not None and request_size < 1:
            raise ValueError(f"request_size must be >= 1, got {request_size}")
        self.request_size = request_size
        self.urls = urls
        self._headers = dict(headers or {})
        self._timeouts = Timeouts(connect=connect_timeout, step=step_timeout)
        self._limits = limits or Limits()
        self._ssl = ssl
        self._io = LoopThread.shared()
        self._in_use = threading.Lock()  # held by the thread inside a public method
        self._worker: ThreadPoolExecutor | None = None  # runs the awaited calls, one at a time
        self._worker_ident: int | None = None  # its thread
        self._awaited: str | None = None  # the awaited call running on it: "recv", or "other"
        self._unclaimed: collections.deque[Future] = collections.deque()  # calls of cancelled arecvs, oldest first
        self._claims = threading.Lock()
        self._episodes = 0  # resets so far: a cancelled arecv's batch from before the last one is stale
        self._core: PoolCore | None = None
        self.grace_period = grace_period

        resolve = functools.partial(
            resolve_spaces,
            observation_space=observation_space,
            action_space=action_space,
            obs_key=obs_key,
            action_key=action_key,
            truncated_key=truncated_key,
            variable_fields=(variable_fields,) if isinstance(variable_fields, str) else tuple(variable_fields),
            limits=self._limits,
        )
        fetch = functools.partial(
            fetch_schema,
            headers=self._headers,
            timeout=connect_timeout,
            ssl=ssl,
            max_bytes=self._limits.max_frame_bytes,
            max_containers=self._limits.max_json_containers,
        )
        schema = fetch(urls[0])
        resolved = resolve(schema)
        self._spaces = resolved
        self._obs, self._act = resolved.observation, resolved.action
        self.truncated_key = resolved.truncated_key
        self._terminated_key = resolved.terminated_key
        self._server_time_limit = resolved.max_episode_steps
        for url in urls[1:]:
            other = resolve(fetch(url))
            if other.observation.space != self._obs.space or other.action.space != self._act.space:
                raise ValueError(
                    f"all servers must host the same env: {urls[0]} has spaces "
                    f"{self._obs.space} / {self._act.space}, {url} has {other.observation.space} / {other.action.space}"
                )
            if other.max_episode_steps is not None:  # (servers that differ in their time limits only: the smallest)
                known = self._server_time_limit
                self._server_time_limit = other.max_episode_steps if known is None else min(known, other.max_episode_steps)

        free, limit = self._free_capacity()
        self._core = self._io.run(self._open(free, limit), timeout=self._timeouts.connect * 2 + 30)
        if resolved.needs_first_observation:
            # The schema leaves some of it open (a list's length, a map's keys): the first env's reset says.
            first = self._first_observation()
            self._spaces = resolve(schema, first_observation=first, state=self._first_state() if resolved.needs_state else None)
            self._obs, self._act = self._spaces.observation, self._spaces.action

        self.single_observation_space = self._obs.space
        self.single_action_space = self._act.space
        self.observation_space = _batch_space(self.single_observation_space, num_envs)
        self.action_space = _batch_space(self.single_action_space, num_envs)

        # Batch buffers, written in place as results arrive (env order).
        self._observations: Any = create_empty_array(self.single_observation_space, num_envs, fn=np.zeros)
        self._array_obs = _array_leaves_only(self.single_observation_space)
        self._env_obs: list[Any] = [None] * num_envs  # per-env values, for non-array spaces only
        self._stand_in_value: Any = None  # the value of envs never reset in a non-array batch (see _stand_in)
        self._rewards = np.zeros(num_envs, dtype=np.float64)
        self._terminations = np.zeros(num_envs, dtype=np.bool_)
        self._truncations = np.zeros(num_envs, dtype=np.bool_)
        self._autoreset_envs = np.zeros(num_envs, dtype=np.bool_)
        self._elapsed = np.zeros(num_envs, dtype=np.int64)
        self._started = np.zeros(num_envs, dtype=np.bool_)  # reset at least once (as OrderEnforcing wants)
        self._all_started = False
        self._reset_tries = np.zeros(num_envs, dtype=np.int64)  # SAME_STEP resets tried again in this step
        self._all_ids = self._core.every

        # The fast case: the observation is one field whose column arrives as one
        # array of the buffer's dtype and shape, copied in with one assignment.
        # Only where the wire value is the space's value: not an enum (wire: enum[i]) or a bool field.
        self._direct_field = (
            self._obs.single_field
            if isinstance(self.single_observation_space, ARRAY_SPACES) and _same_on_the_wire(self._obs.codec)
            else None
        )
        self._direct_shape = self.single_observation_space.shape
        self._direct_dtype = getattr(self.single_observation_space, "dtype", None)
        self._direct_action = (
            self._act.single_field if isinstance(self.single_action_space, ARRAY_SPACES) and _same_on_the_wire(self._act.codec) else None
        )

        # send/recv bookkeeping
        self._pending = np.zeros(num_envs, dtype=np.bool_)  # sent, not yet returned by recv
        self._marks = np.zeros(num_envs, dtype=np.bool_)  # scratch, all False between calls
        self._batch_action_spaces: dict[int, gym.Space] = {num_envs: self.action_space}
        self._ready: list[np.ndarray] = []  # env ids arrived and not yet returned, in arrival order
        self._ready_count = 0
        self._env_infos: dict[int, list[dict[str, Any]]] = {}  # env -> infos to return, in order
        # For adapters that hand infos on per env (openenv_gym.sb3): when set, each call's per-env
        # infos, as the envs gave them, before batching types each key by its first env's value.
        self._keep_info_rows = False
        self._info_rows: dict[int, list[dict[str, Any]]] = {}
        self._deferred: list[_CoreRequest] = []  # core.submit calls to make with the next wait
        # The last step() took over SLOW_STEP_SECONDS: steps ask for replies in parts, so that an
        # env past the step timeout costs its own episode, not its server's others'.
        self._slow_steps = False
        self._failed_resets: dict[int, OpenEnvGymError] = {}  # envs whose explicit reset failed, and why
        self._unavailable: PoolUnavailable | None = None  # raised once the arrivals at hand are absorbed

    # ------------------------------------------------------------ setup

    async def _open(self, free: list[float], limit: list[int | None]) -> PoolCore:
        links: list[Link] = []
        try:
            for url in self.urls:
                links.append(await connect_link(url, headers=self._headers, timeouts=self._timeouts, limits=self._limits, ssl=self._ssl))
                if isinstance(links[-1], FastLink) and self.autoreset_mode == AutoresetMode.SAME_STEP:
                    links[-1].autoreset = True  # (its server resets ended envs within the step's request)
            free = list(free)
            opened: list[list[Any]] = [[] for _ in links]
            for _ in range(_PLACEMENT_TRIES):
                left = self.num_envs - sum(map(len, opened))
                if left == 0:
                    break
                counts = self._placement([f - len(o) for f, o in zip(free, opened)], left)
                for j, count in enumerate(counts):
                    if not count:
                        continue
                    try:
                        got = await links[j].open(int(count))
                    except CapacityError as exc:
                        # Another client took room since /health said it was free (two pools starting
                        # at once, say): learn what is left there, and place the rest again.
                        most, active = exc.max_sessions, exc.active_sessions
                        free[j] = len(opened[j]) + (max(most - active, 0) if most is not None and active is not None else 0)
                        continue
                    opened[j].extend(got)
                    if len(got) < count:  # (a stock server refuses sessions one by one: it is full now)
                        free[j] = len(opened[j])
            if sum(map(len, opened)) < self.num_envs:
                raise self._no_room(sum(map(len, opened)))
            link_of = np.repeat(np.arange(len(links)), [len(o) for o in opened])
            handles = [handle for o in opened for handle in o]
            capacity = [None if f == math.inf else int(f) for f in free]
            return PoolCore(
                links,
                link_of,
                handles,
                step_timeout=self._timeouts.step,
                grace=self.grace_period,
                capacity=capacity,
                limit=limit,
            )
        except BaseException:
            for link in links:
                await link.close()
            raise

    def _free_capacity(self) -> tuple[list[float], list[int | None]]:
        """Per server, the sessions it has room for (``inf`` when it does not say), and its limit (``None``: unknown)."""
        free: list[float] = []
        limit: list[int | None] = []
        for url in self.urls:
            try:
                health = fetch_health(
                    url,
                    headers=self._headers,
                    timeout=self._timeouts.connect,
                    ssl=self._ssl,
                    max_bytes=self._limits.max_frame_bytes,
                    max_containers=self._limits.max_json_containers,
                )
            except OpenEnvGymError:
                health = {}
            active, most = health.get("active_sessions"), health.get("max_sessions")
            if isinstance(active, int) and isinstance(most, int):
                free.append(max(most - active, 0))
                limit.append(most)
            else:
                free.append(math.inf)
                limit.append(None)
        return free, limit

    def _placement(self, free: list[float], n: int) -> list[int]:
        """How many of ``n`` sessions each server gets: by free capacity where a server tells it, else evenly."""
        k = len(self.urls)
        counts = [0] * k
        for _ in range(n):  # round-robin over servers with room, most free first
            j = min(range(k), key=lambda j: (-(free[j] - counts[j]), counts[j], j))
            if free[j] - counts[j] <= 0:
                raise self._no_room(self.num_envs - n + sum(max(min(f, n), 0) for f in free))
            counts[j] += 1
        return counts

    def _no_room(self, room: float) -> CapacityError:
        """The error of a pool whose servers have room for ``room`` of its ``num_envs`` sessions, naming both fixes."""
        return CapacityError(
            "CAPACITY_REACHED",
            f"{self.num_envs} sessions asked for, and the servers have room for {room:.0f}: start more servers "
            "(more URLs, or launch_local(..., servers=N)), or raise their session limit (openenv-gym serve "
            "--max-sessions; a stock OpenEnv app's max_concurrent_envs, which OpenEnv's apps leave at 1 unless "
            "they read MAX_CONCURRENT_ENVS)",
            url=", ".join(self.urls),
        )

    def _first_observation(self) -> dict[str, Any]:
        """The fields of the first env's reset observation (before the user's first reset)."""
        assert self._core is not None
        core = self._core

        async def probe() -> Any:
            core.submit("probe", np.array([0]))
            (arrival,) = await core.collect(1, self._timeouts.step + 1)
            return arrival.results

        results = self._io.run(probe(), timeout=self._wait_bound())
        if isinstance(results, OpenEnvGymError):
            raise results
        if results.errors is not None and results.errors[0] is not None:
            raise results.errors[0]
        return {name: column[0] for name, column in results.observation.items()}

    def _first_state(self) -> dict[str, Any] | None:
        """The first env's state (after :meth:`_first_observation`), or ``None`` where its server refuses it."""
        assert self._core is not None
        try:
            return self._io.run(self._core.state(0), timeout=self._wait_bound())
        except ServerError:
            return None

    def _wait_bound(self) -> float:
        return self._timeouts.step + self._timeouts.connect + 5

    # ------------------------------------------------------------ Gymnasium API

    @_one_caller
    def reset(
        self,
        *,
        seed: int | list[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every sub-env, or those in ``options["reset_mask"]``.

        Seeds follow ``SyncVectorEnv``: ``None``, an int ``s`` (``s, s+1, ...``)
        or a list of ``num_envs`` ints/``None``. Other options are passed to each
        server's reset. The caller's ``options`` dict is not modified.

        Envs still in flight (sent and not yet received) are waited for first
        and their results dropped, masked or not: ``recv`` every env you want
        the results of before a reset.
        """
        self._check_open()
        if isinstance(seed, int):
            super().reset(seed=seed)  # seeds this pool's own np_random
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"If seeds are passed as a list the length must match num_envs={self.num_envs} but got length={len(seeds)}.")
        for s in seeds:  # (checked here, as each env's reset would: nothing is reset if one is bad)
            if s is not None and not (isinstance(s, int) and s >= 0):
                np_random(s)  # raises Gymnasium's own error for it
        options = dict(options) if options is not None else None
        if options is not None and "reset_mask" in options:
            reset_mask = options.pop("reset_mask")
            if not isinstance(reset_mask, np.ndarray):
                raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(reset_mask)}")
            if reset_mask.shape != (self.num_envs,):
                raise ValueError(f"`options['reset_mask']` must have shape `({self.num_envs},)`, got {reset_mask.shape}")
            if reset_mask.dtype != np.bool_:
                raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {reset_mask.dtype}")
            if not np.any(reset_mask):
                raise ValueError(
                    f"`options['reset_mask']` must contain a boolean array with at least one True value, got reset_mask={reset_mask}"
                )
            env_ids = np.flatnonzero(reset_mask)
        else:
            env_ids = np.arange(self.num_envs)
        if options:
            core = self._core
            assert core is not None  # (checked open)
            check_reset_options(options, self._limits.max_depth, msgpack=any(link.codec == "msgpack" for link in core.links))
        self._episodes += 1  # (a cancelled arecv's results are of the episodes this reset ends)
        with self._claims:
            self._unclaimed.clear()
        self._drain()

        self._terminations[env_ids] = False
        self._truncations[env_ids] = False
        self._autoreset_envs[env_ids] = False
        self._elapsed[env_ids] = 0
        todo = env_ids
        garbled = 0  # rounds in which a server could not read a reset, or answered what the pool could not
        while True:
            # An env whose reset failed (its server went away) is reset again on a
            # new session; the pool raises PoolUnavailable after its grace period.
            self._failed_resets.clear()
            self._submit("reset", todo, seeds=[seeds[i] for i in todo.tolist()], options=options or None, partial=True, split=False)
            self._receive(len(todo))
            self._take_ready(len(todo))
            if not self._failed_resets:
                break
            refused = [e for e in self._failed_resets.values() if not session_lost(e)]
            if refused:  # the env itself failed to reset: as in SyncVectorEnv, that is the caller's error
                raise refused[0]
            broken = [e for e in self._failed_resets.values() if isinstance(e, ProtocolError)]
            if broken:
                # Not a server gone away: a server that answers, and cannot read this reset (its own
                # Limits, tighter than this pool's) or is answered in a way the pool cannot read.
                # Sent again it fails again, however long the grace period.
                garbled += 1
                if garbled >= RESET_PROTOCOL_RETRIES:
                    raise broken[0]
            todo = np.array(sorted(self._failed_resets), dtype=np.int64)
        if not self._all_started:
            self._started[env_ids] = True
            self._all_started = bool(self._started.all())
        infos = self._batch_infos(env_ids)
        return self._batch_observations(), infos

    @_one_caller
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env: ``send`` of all envs, then wait for all of them."""
        ids, columns, resets = self._step_request(actions, None)
        if self._deferred or self._unavailable is not None:  # (what waits to go out goes first, as in _receive)
            self._submit("step", ids, actions=columns, resets=resets, defer=True)  # sent with the wait
            return self._wait_all(None)
        began = time.perf_counter()
        if self._slow_steps:  # (slow envs: the general road, in parts; a fast server still answers in one frame)
            self._submit("step", ids, actions=columns, resets=resets, partial=True, split=False)
            result = self._wait_all(None)
            self._slow_steps = time.perf_counter() - began > SLOW_STEP_SECONDS
            return result
        # Sent and awaited in one hand-off to the I/O loop; by the lockstep lane when the servers allow.
        core = self._core
        assert core is not None  # (checked open)
        self._pending[ids] = True
        start = functools.partial(step_every_env, core, actions=columns, resets=resets, backstop=2 * self._timeouts.step + 1)
        try:
            arrivals = self._io.run_started(start, self._requeue, functools.partial(self._readers, core))
        except Exception:
            if self._core is None:
                raise gym.error.ClosedEnvironmentError("OpenEnvVectorEnv was closed while it waited for its envs") from None
            raise
        if self._core is None:
            raise gym.error.ClosedEnvironmentError("OpenEnvVectorEnv was closed while it waited for its envs")
        if arrivals is not None:
            if not self._absorb_every_env(arrivals, resets):
                for arrival in arrivals:
                    self._absorb(arrival)
            self._io.check_interrupt()  # (as in _receive: a Ctrl-C while absorbing is raised now, the arrivals in)
        result = self._wait_all(None)  # (collects what went the general road; else takes the arrivals written)
        self._slow_steps = time.perf_counter() - began > SLOW_STEP_SECONDS
        return result

    @staticmethod
    def _readers(core: PoolCore) -> Readers | None:
        """The sockets of a step's replies, when the step may read them itself (every server a fast-path one, no TLS)."""
        readers = []
        for link in core.links:
            if type(link) is not FastLink:
                return None
            reader = link.connection.direct_reader()
            if reader is None:
                return None
            readers.append(reader)
        return tuple(readers)

    @_one_caller
    def step_async(self, actions: Any) -> None:
        """Send ``actions`` for every env; collect the results with :meth:`step_wait`."""
        self._send(actions, None, defer=False)

    @_one_caller
    def step_wait(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait (at most ``timeout`` seconds; by default as long as the step timeout allows) for every env sent.

        Returns a batch of every env, so every env must be in flight, as
        :meth:`step_async` sends them: after a ``send`` of some envs, or a
        ``recv`` that took some, collect with :meth:`recv` instead (the batch
        would hold rows of envs not stepped, and give an episode's end twice).

        Raises:
            gymnasium.error.NoAsyncCallError: not every env is in flight.
        """
        self._check_open()
        if not self._pending.any():
            raise gym.error.NoAsyncCallError("Calling `step_wait` without any prior call to `step_async`.", "step")
        if not self._pending.all():
            idle = np.flatnonzero(~self._pending)
            raise gym.error.NoAsyncCallError(
                f"`step_wait` returns every env, but envs {idle[:16].tolist()} are not in flight (sent to some envs "
                "with `send`, or taken by `recv`): collect them with `recv()`",
                "step",
            )
        return self._wait_all(timeout)

    @_one_caller
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Send one action to each env in ``env_ids`` (default: all) and return at once.

        ``actions`` has one entry per env in ``env_ids`` (a batch of
        ``single_action_space``). Under ``NEXT_STEP`` an env whose episode ended
        is reset instead and its action ignored, as in ``SyncVectorEnv``.

        Raises:
            ValueError: an action outside the action space, an env already in
                flight, or (``DISABLED``) an env whose episode ended.
        """
        self._send(actions, env_ids, defer=False)

    def _send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None, *, defer: bool) -> None:
        ids, columns, resets = self._step_request(actions, env_ids)
        if ids.size == 0:
            return
        self._submit(
            "step",
            ids,
            actions=columns,
            resets=resets,
            defer=defer,
            request_size=None if defer else self.request_size,
            # (lockstep step_async too: a slow env's timeout is then its own; fast servers answer in one frame)
            partial=not defer,
            split=self.batch_size < self.num_envs,
        )

    def _step_request(
        self, actions: Any, env_ids: Sequence[int] | np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, Any], np.ndarray | None]:
        """Check a step of ``env_ids`` (default: all); the envs, their action columns and the resets among them (``NEXT_STEP``).

        Raises as :meth:`send` does.
        """
        self._check_open()
        ids: np.ndarray
        if env_ids is None:
            ids = self._all_ids
            if any_true(self._pending):
                raise ActionsInFlight(
                    f"envs {np.flatnonzero(self._pending).tolist()} already have an action in flight: take their results first "
                    "(recv(), or step_wait() after step_async())"
                )
        else:
            given = np.asarray(env_ids)
            if given.size and given.dtype.kind not in "iu":
                raise ValueError(f"env_ids must be distinct ints in [0, {self.num_envs}), got {given}")
            ids = given.astype(np.int64, copy=False).reshape(-1)
            if ids.size == 0:
                return ids, {}, None
            if ids.min() < 0 or ids.max() >= self.num_envs:
                raise ValueError(f"env_ids must be distinct ints in [0, {self.num_envs}), got {ids}")
            if self._pending[ids].any():
                raise ActionsInFlight(
                    f"envs {ids[self._pending[ids]].tolist()} already have an action in flight: take their results first "
                    "(recv(), or step_wait() after step_async())"
                )
            marks = self._marks  # distinct? (cheaper than np.unique: no sort)
            marks[ids] = True
            distinct = int(np.count_nonzero(marks)) == len(ids)
            marks[ids] = False
            if not distinct:
                raise ValueError(f"env_ids must be distinct ints in [0, {self.num_envs}), got {ids}")
        if not self._all_started and not self._started[ids].all():
            raise gym.error.ResetNeeded(f"envs {ids[~self._started[ids]].tolist()} were never reset: call reset() before stepping them")
        if not isinstance(actions, np.ndarray) or not self._actions_fit(actions, len(ids)):
            # (lists first: Gymnasium's contains casts them, so [1.7] would pass for an int Box and be sent as 1)
            actions = coerce_action(self._batch_action_space(len(ids)), actions)
            if not self._actions_fit(actions, len(ids)):
                space = self._batch_action_space(len(ids))
                raise ValueError(f"actions are not in the action space {space}: {refusal(space, actions, batched=True)}")
        restart = self._autoreset_envs[ids]
        any_restart = any_true(restart)
        if self.autoreset_mode == AutoresetMode.DISABLED and any_restart:
            raise ValueError(
                f"envs {ids[restart].tolist()} ended; with autoreset_mode=DISABLED, reset them with "
                "reset(options={'reset_mask': mask}) before stepping"
            )
        columns = self._action_columns(actions, len(ids))
        # NEXT_STEP: an env whose episode ended is reset instead (its action is
        # ignored), in the same request as the others' steps.
        # (Under SAME_STEP an env is flagged here only after a failed request.)
        resets = restart if self.autoreset_mode != AutoresetMode.DISABLED and any_restart else None
        return ids, columns, resets

    def recv(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Return the first ``batch_size`` envs whose results are ready.

        Returns ``(obs, rewards, terminations, truncations, infos)`` with a
        leading axis of ``batch_size``, in arrival order; ``infos["env_id"]``
        (int64) says which envs they are. Waits at most ``timeout`` seconds
        (by default as long as the step timeout allows).

        The results of an :meth:`arecv` whose await was cancelled come first.
        """
        while (job := self._claim()) is not None:
            try:
                job.result(timeout)
                error = None
            except Exception as exc:
                error = exc
            except BaseException:  # (KeyboardInterrupt) the call runs on: the next recv takes its envs
                self._unclaim(job, first=True)
                raise
            batch = self._handed_on(job, error, timeout)
            if batch is not None:
                return batch
        return self._recv(timeout)

    @_one_caller
    def _recv(self, timeout: float | None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._check_open()
        count = min(self.batch_size, int(self._pending.sum()))
        if count == 0:
            raise gym.error.NoAsyncCallError("Calling `recv` without any env in flight; call `send` first.", "recv")
        self._receive(count, timeout, keep_ready=True)
        returned = self._take_ready(count)
        infos = _take_info(self._batch_infos(returned), returned)  # rows in the order returned
        infos["env_id"] = returned
        obs = _take_rows(self.single_observation_space, self._current_observations(), returned)
        return (
            obs,
            self._rewards[returned],
            self._terminations[returned],
            self._truncations[returned],
            infos,
        )

    # ------------------------------------------------------------ from asyncio code

    async def areset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """:meth:`reset`, awaited: it runs on the pool's worker thread, so the caller's event loop goes on meanwhile.

        The awaited calls run one after another on that one thread, in the order
        they were made. Cancelling the await of a call that has started does not
        stop it: it runs to its end and its results are dropped (an
        :meth:`arecv`'s go to the next ``recv``).
        """
        return await asyncio.wrap_future(self._on_worker(functools.partial(self.reset, seed=seed, options=options)))

    async def astep(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """:meth:`step`, awaited (see :meth:`areset`)."""
        return await asyncio.wrap_future(self._on_worker(functools.partial(self.step, actions)))

    async def arecv(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """:meth:`recv`, awaited (see :meth:`areset`). :meth:`send` returns at once and needs no awaiting.

        If the await is cancelled (``asyncio.wait_for``, a task group) after
        the call started, the envs it receives are not lost: the next
        :meth:`arecv` or :meth:`recv` returns them (unless a reset came between).
        """
        while (job := self._claim()) is not None:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job)), timeout)
                error = None
            except asyncio.CancelledError:
                self._unclaim(job, first=True)
                raise
            except Exception as exc:
                error = exc
            batch = self._handed_on(job, error, timeout)
            if batch is not None:
                return batch
        job = self._on_worker(functools.partial(self._recv_counted, timeout), kind="recv")
        try:
            return (await asyncio.wrap_future(job))[1]
        except asyncio.CancelledError:
            if not job.cancelled():  # it had started: it runs on, and its envs go to the next recv
                self._unclaim(job)
            raise

    def _handed_on(self, job: Future, error: BaseException | None, timeout: float | None) -> Any:
        """The batch of a cancelled :meth:`arecv`'s call, once waited for (``error``: what the wait raised).

        ``None`` when it has none to give: it failed (its envs are still in
        flight, or the pool is closed), or it is from before a reset.

        Raises:
            SessionTimeout: the wait ran out before the call ended (it stays handed on).
        """
        if error is None:
            episodes, batch = job.result()
            return batch if episodes == self._episodes else None
        if isinstance(error, TimeoutError) and not (job.done() and job.exception() is error):
            self._unclaim(job, first=True)  # still running (or just done): the next recv takes it
            raise SessionTimeout(f"no env was ready within {timeout} s", timeout=timeout) from None
        return None

    def _recv_counted(self, timeout: float | None) -> tuple[int, tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]]:
        """:meth:`recv`'s batch, with the count of resets before it (a batch from before a reset is stale)."""
        episodes = self._episodes
        return episodes, self._recv(timeout)

    def _claim(self) -> "Future | None":
        """The oldest call of a cancelled :meth:`arecv`, if any (thread-safe)."""
        with self._claims:
            return self._unclaimed.popleft() if self._unclaimed else None

    def _unclaim(self, job: Future, *, first: bool = False) -> None:
        with self._claims:
            if first:
                self._unclaimed.appendleft(job)
            else:
                self._unclaimed.append(job)

    def _on_worker(self, call: Callable[[], T], kind: str = "other") -> "Future[T]":
        """Run ``call`` on the pool's worker thread (made on first use); ``kind``: ``"recv"`` for an ``arecv``."""
        self._check_open()
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openenv-gym-await")

        def awaited() -> T:
            self._worker_ident = threading.get_ident()
            self._awaited = kind
            try:
                return call()
            finally:
                self._awaited = None

        return self._worker.submit(awaited)

    def __del__(self) -> None:
        # Never closed: close the sessions in the background (their server slots are freed).
        try:
            core, io = self._core, self._io
            if core is not None and not io._closed and not io.loop.is_closed():
                self._core = None
                io.submit(core.close())
        except Exception:
            pass

    def close_extras(self, **kwargs: Any) -> None:
        """Close every session and connection (bounded by the close timeout)."""
        worker, self._worker = self._worker, None
        if worker is not None:  # (calls still queued on it run, and find the pool closed)
            worker.shutdown(wait=False)
        with self._claims:
            self._unclaimed.clear()
        core, self._core = self._core, None
        if core is not None:
            try:
                self._io.run(core.close(), timeout=self._timeouts.close * 2 + 5, finish=True)  # (a Ctrl-C waits for it)
            except Exception:  # pragma: no cover - closing is best effort
                logger.debug("closing the pool failed", exc_info=True)

    # ------------------------------------------------------------ the batch, in Gymnasium's terms

    def _wait_all(self, timeout: float | None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        count = count_true(self._pending)
        self._receive(count, timeout)
        returned = self._take_ready(count)
        infos = self._batch_infos(returned)
        return (
            self._batch_observations(),
            np.copy(self._rewards),
            np.copy(self._terminations),
            np.copy(self._truncations),
            infos,
        )

    def _absorb(self, arrival: Arrival) -> None:
        """Write one arrival into the batch buffers, following the autoreset mode."""
        results = arrival.results
        ids = arrival.env_ids
        rows = arrival.rows if arrival.rows is not None else ids  # a slice when contiguous
        restarted = arrival.resets
        if isinstance(results, OpenEnvGymError):  # the whole request failed
            self._fail(arrival.kind, ids, [results] * len(ids), arrival.server)
            return
        if results.errors is not None:  # some envs failed: set them apart
            failed = {j: e for j, e in enumerate(results.errors) if e is not None}
            if failed:
                rest = self._set_apart(arrival, ids, results, restarted, failed)
                if rest is None:
                    return
                results, ids, restarted = rest
                rows = ids
        unreadable = self._write_observations(rows, ids, results)
        if unreadable:  # (a list longer than the first observation's, say): those envs' transitions fail
            logger.warning("%d observation(s) do not fit the observation space: %s", len(unreadable), next(iter(unreadable.values())))
            rest = self._set_apart(arrival, ids, results, restarted, unreadable)
            if rest is None:
                return
            results, ids, restarted = rest
            rows = ids
        metadata = results.metadata
        if self._spaces.adds_info(results.observation):  # fields no space holds, and an action mask
            metadata = self._with_info_fields(results, metadata, len(ids))

        if arrival.kind != "step":  # "reset" (explicit) or "final_reset" (SAME_STEP)
            # SAME_STEP: the obs becomes the reset obs; reward and flags stay the step's.
            self._elapsed[rows] = 0
            self._collect_infos(ids, metadata)
            self._mark_ready(ids)
            return

        # A step (envs in `arrival.resets` were reset instead: NEXT_STEP; see _write_step).
        k = len(ids)
        also = None if self._terminated_key is None else self._flags(results, self._terminated_key, k, in_metadata=False)
        ended = self._write_step(rows, results.reward, results.done, self._flags(results, self.truncated_key, k), also, restarted)

        if self.autoreset_mode == AutoresetMode.SAME_STEP and ended.any():
            finished = ids[ended]
            self._reset_tries[finished] = 0
            obs_rows = _take_rows(self.single_observation_space, self._current_observations(), finished)
            for n, (j, i) in enumerate(zip(np.flatnonzero(ended).tolist(), finished.tolist())):
                final_info = metadata[j] if metadata is not None else {}
                self._env_infos.setdefault(i, []).append({"final_obs": self._row(obs_rows, n), "final_info": final_info})
            self._autoreset_envs[finished] = False
            keep = ~ended
            self._collect_infos(ids[keep], None if metadata is None else [m for m, k in zip(metadata, keep) if k])
            self._mark_ready(ids[keep])
            reset = self._absorb_after(ids, ended, results, arrival.server)  # the server's resets of the ended envs, if it made them
            if reset.size < finished.size:
                self._submit("final_reset", finished[~np.isin(finished, reset)], defer=True)
            return
        self._collect_infos(ids, metadata)
        self._mark_ready(ids)

    def _absorb_after(self, ids: np.ndarray, ended: np.ndarray, results: Results, server: str) -> np.ndarray:
        """Absorb the resets a server made right after steps that ended (``autoreset``); the envs it reset.

        ``ended``: bool, one per entry of ``ids``: the envs whose resets count
        (their episode ended for the pool, or their step failed). Each is
        absorbed as a ``final_reset`` arrival would be: the observation becomes
        the reset's, its info the env's, and the env is ready; a reset that
        failed, or whose observation does not fit, fails as such a reset
        fails. Envs without a reset here (a server that made none, a time
        limit of the pool's own) are not returned: they need a reset request.
        """
        after, positions = results.after, results.after_rows
        if after is None or positions is None or not positions.size:
            return ids[:0]
        wanted = ended[positions]
        if not wanted.all():
            kept = np.flatnonzero(wanted)
            after, positions = _take_results(after, kept), positions[kept]
        reset = ids[positions]
        if not reset.size:
            return reset
        failures: dict[int, OpenEnvGymError] = {}
        if after.errors is not None:
            failures = {j: e for j, e in enumerate(after.errors) if e is not None}
        readable = after
        if failures:
            ok = np.flatnonzero([e is None for e in after.errors])  # type: ignore[union-attr]
            readable = _take_results(after, ok)
        targets = reset if not failures else reset[ok]
        unreadable = self._write_observations(targets, targets, readable) if targets.size else {}
        if unreadable:
            fine = np.ones(targets.size, dtype=np.bool_)
            fine[list(unreadable)] = False
            bad = targets[~fine]
            self._fail("final_reset", bad, [unreadable[j] for j in sorted(unreadable)], server)
            readable, targets = _take_results(readable, np.flatnonzero(fine)), targets[fine]
        if failures:
            self._fail("final_reset", reset[sorted(failures)], [failures[j] for j in sorted(failures)], server)
        if targets.size:
            metadata = readable.metadata
            if self._spaces.adds_info(readable.observation):
                metadata = self._with_info_fields(readable, metadata, len(targets))
            self._elapsed[targets] = 0
            self._collect_infos(targets, metadata)
            self._mark_ready(targets)
        return reset

    def _withdraw_final_resets(self, ids: np.ndarray) -> None:
        """Take ``ids`` out of the ``final_reset`` requests waiting to go out (their server reset them already)."""
        kept = []
        for call in self._deferred:
            if call.kind == "final_reset":
                call.env_ids = call.env_ids[~np.isin(call.env_ids, ids)]
                if not call.env_ids.size:
                    continue
            kept.append(call)
        self._deferred = kept

    def _write_step(
        self,
        rows: slice | np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        flag: np.ndarray,
        also: np.ndarray | None,
        restarted: np.ndarray | None,
    ) -> np.ndarray:
        """Write the rewards and flags of a step of the envs at ``rows``; which of them ended (bool).

        ``reward`` float64, ``done``, ``flag`` (the truncated field) and
        ``also`` (the terminated field, if the server has one) bool, one entry
        per row; ``restarted``: the rows reset instead (``NEXT_STEP``), or
        ``None``. A reset has no reward (NaN -> 0) and is not done, so it gets
        reward 0 and no termination or truncation. The arguments may be views
        of the batch buffers they are written to.
        """
        cut = flag & done
        if also is None:
            terminated = done & ~cut
        else:  # (both: a time limit on the terminal step)
            terminated = done & (also | ~cut)
        truncated = cut
        self._rewards[rows] = np.where(np.isnan(reward), 0.0, reward)  # NaN: no reward (a reset, an OpenEnv None)
        if restarted is None:
            self._elapsed[rows] += 1
        else:
            self._elapsed[rows] = np.where(restarted, 0, self._elapsed[rows] + 1)
        if self.max_episode_steps is not None:  # as gymnasium's TimeLimit, client side
            truncated = truncated | (self._elapsed[rows] >= self.max_episode_steps)
        ended = terminated | truncated
        self._terminations[rows] = terminated
        self._truncations[rows] = truncated
        self._autoreset_envs[rows] = ended
        return ended

    def _absorb_every_env(self, arrivals: list[Arrival], resets: np.ndarray | None) -> bool:
        """:meth:`_absorb` for the clean answers of a lockstep step, which cover every env once: the flags worked out once for the batch.

        ``resets``: bool ``(num_envs,)``, the envs reset instead of stepped, or
        ``None``. Returns ``False``, having written nothing, where the general
        absorb is needed (an episode end under ``SAME_STEP``, observations not
        copied whole, one that does not fit).
        """
        field = self._direct_field
        if field is None:
            return False
        shape, dtype = self._direct_shape, self._direct_dtype
        for arrival in arrivals:
            columns = arrival.results.observation  # type: ignore[union-attr]
            column = columns.get(field)
            if not (type(column) is np.ndarray and column.shape[1:] == shape and column.dtype == dtype):
                return False
            if self._spaces.adds_info(columns):
                return False
        if self.autoreset_mode == AutoresetMode.SAME_STEP:  # (a step in which no episode ends is any step)
            if any(any_true(arrival.results.done) for arrival in arrivals):  # type: ignore[union-attr]
                return False
            limit = self.max_episode_steps
            if limit is not None and any_true(self._elapsed >= limit - 1):
                return False
        # Each answer's columns into the batch buffers (reward, done and the flag fields first), then the rest at once.
        reward, done, flag = self._rewards, self._terminations, self._truncations
        also = None if self._terminated_key is None else np.zeros(self.num_envs, dtype=np.bool_)
        for arrival in arrivals:
            results, rows, k = arrival.results, arrival.rows, len(arrival.env_ids)
            self._observations[rows] = results.observation[field]  # type: ignore[union-attr]
            reward[rows] = results.reward  # type: ignore[union-attr]
            done[rows] = results.done  # type: ignore[union-attr]
            flag[rows] = self._flags(results, self.truncated_key, k)  # type: ignore[arg-type]
            if also is not None:
                also[rows] = self._flags(results, self._terminated_key, k, in_metadata=False)  # type: ignore[arg-type]
            self._collect_infos(arrival.env_ids, results.metadata)  # type: ignore[union-attr]
        self._write_step(slice(None), reward, done, flag, also, resets)
        self._mark_ready(self._all_ids)
        return True

    def _set_apart(
        self,
        arrival: Arrival,
        ids: np.ndarray,
        results: Results,
        restarted: np.ndarray | None,
        failures: Mapping[int, OpenEnvGymError],
    ) -> tuple[Results, np.ndarray, np.ndarray | None] | None:
        """Fail the envs at positions ``failures`` (of ``ids``); the others' results, ids and resets, or ``None`` if none is left."""
        bad = np.zeros(len(ids), dtype=np.bool_)
        bad[list(failures)] = True
        self._fail(arrival.kind, ids[bad], [failures[j] for j in sorted(failures)], arrival.server)
        if results.after is not None and self.autoreset_mode == AutoresetMode.SAME_STEP:
            # A step that failed once its server had reset the env (its info could not be sent, say): that
            # reset is the env's reset within this step, not another one (_fail asked for it: withdrawn).
            reset = self._absorb_after(ids, bad, results, arrival.server)
            if reset.size:
                self._withdraw_final_resets(reset)
        ok = np.flatnonzero(~bad)
        if ok.size == 0:
            return None
        return _take_results(results, ok), ids[ok], None if restarted is None else restarted[ok]

    def _fail(self, kind: str, ids: np.ndarray, errors: Sequence[OpenEnvGymError], server: str) -> None:
        """Envs whose request failed: a truncated transition with their last observation.

        The env is reset (on a new session if its session is gone) as after
        any episode end: by its next step, or under ``SAME_STEP`` within this
        one, the last observation and the error going in ``final_obs`` and
        ``final_info``. An explicit reset that failed is retried by
        :meth:`reset`. A ``PoolUnavailable`` (no server is left) is raised
        once the arrivals at hand are absorbed, so that no env stays in flight.
        """
        unavailable = next((e for e in errors if isinstance(e, PoolUnavailable)), None)
        if unavailable is not None and self._unavailable is None:
            self._unavailable = unavailable
        if kind == "final_reset" and unavailable is None:
            # SAME_STEP's reset after an episode end lost its connection (a server died): reset again on
            # a new session, within this step. Other failures, or more of them, fall back to NEXT_STEP's
            # way: the env's next step resets it.
            lost = np.array([isinstance(e, ConnectionLost) for e in errors], dtype=np.bool_)
            lost &= self._reset_tries[ids] < _RESET_TRIES  # (a server that fails every reset is not tried forever)
            if lost.any():
                self._reset_tries[ids[lost]] += 1
                logger.info("%d env(s) reset again after a lost session: %s", int(lost.sum()), errors[int(np.argmax(lost))])
                self._submit("final_reset", ids[lost], defer=True)
                ids, errors = ids[~lost], [e for e, gone in zip(errors, lost) if not gone]
                if not ids.size:
                    return
        if kind == "reset":
            self._failed_resets.update(zip(ids.tolist(), errors))
            self._mark_ready(ids)
            return
        if kind != "final_reset":  # (a failed SAME_STEP reset keeps its step's reward and flags)
            self._rewards[ids] = 0.0
            self._terminations[ids] = False
            self._truncations[ids] = True
        self._elapsed[ids] = 0
        reports = [
            {"type": type(error).__name__, "message": str(error), "server": server or getattr(error, "url", None) or None}
            for error in errors
        ]
        logger.info("%d env(s) truncated after a failed %s: %s", len(ids), kind, errors[0])
        if kind == "step" and self.autoreset_mode == AutoresetMode.SAME_STEP and unavailable is None:
            # As after any episode end under SAME_STEP: the env is reset within this step (on a new
            # session if its own is gone); the last observation and the error go in final_obs/final_info.
            obs_rows = _take_rows(self.single_observation_space, self._current_observations(), ids)
            for n, (i, report) in enumerate(zip(ids.tolist(), reports)):
                self._env_infos.setdefault(i, []).append(
                    {"openenv_error": report, "final_obs": self._row(obs_rows, n), "final_info": {"openenv_error": report}}
                )
            self._reset_tries[ids] = 0
            self._submit("final_reset", ids, defer=True)
            return
        self._autoreset_envs[ids] = True
        for i, report in zip(ids.tolist(), reports):
            self._env_infos.setdefault(i, []).append({"openenv_error": report})
        self._mark_ready(ids)

    def _collect_infos(self, ids: np.ndarray, metadata: list[dict[str, Any]] | None) -> None:
        if metadata is not None:
            for i, info in zip(ids.tolist(), metadata):
                if info:
                    self._env_infos.setdefault(i, []).append(info)

    def _batch_infos(self, returned: np.ndarray) -> dict[str, Any]:
        infos: dict[str, Any] = {}
        if self._keep_info_rows:
            self._info_rows = {i: self._env_infos[i] for i in returned.tolist() if i in self._env_infos}
        if not self._env_infos:  # the common case: no env said anything
            return infos
        for i in np.sort(returned).tolist():  # in env order, as SyncVectorEnv: the first env types each key's array
            for info in self._env_infos.pop(i, ()):
                infos = self._add_info(infos, info, i)
        return infos

    def _batch_observations(self) -> Any:
        obs = self._current_observations()
        return _copy_batch(obs) if self.copy else obs

    def _current_observations(self) -> Any:
        if not self._array_obs:
            values = self._env_obs
            if any(v is None for v in values):  # (envs never reset, after a partial first reset: a stand-in, as arrays have zeros)
                values = [self._stand_in() if v is None else v for v in values]
            self._observations = concatenate(self.single_observation_space, values, self._observations)
        return self._observations

    def _stand_in(self) -> Any:
        """A fixed value of the observation space for an env that has none yet (never reset)."""
        if self._stand_in_value is None:
            space = copy.deepcopy(self.single_observation_space)  # (the user's space keeps its generator)
            space.seed(0)
            self._stand_in_value = space.sample()
        return self._stand_in_value

    def _row(self, batch_rows: Any, n: int) -> Any:
        """The ``n``-th env's observation in a batch of the observation space."""
        return _row_of(self.single_observation_space, batch_rows, n)

    # ------------------------------------------------------------ conversions

    def _batch_action_space(self, n: int) -> gym.Space:
        """The action space of a batch of ``n`` envs (made once per size)."""
        space = self._batch_action_spaces.get(n)
        if space is None:
            space = self._batch_action_spaces[n] = _batch_space(self.single_action_space, n)
        return space

    def _actions_fit(self, actions: Any, n: int) -> bool:
        """Whether ``actions`` is a batch of ``n`` actions of the action space."""
        single = self.single_action_space
        if type(single) is spaces.Discrete and type(actions) is np.ndarray:
            # As MultiDiscrete.contains, in three array operations.
            if actions.shape != (n,) or not np.can_cast(actions.dtype, single.dtype):
                return False
            low = int(single.start)
            values = actions.tolist()  # (min and max of a list: cheaper than numpy's reductions at these sizes)
            return n == 0 or (min(values) >= low and max(values) < low + int(single.n))
        return self._batch_action_space(n).contains(actions)

    def _action_columns(self, actions: Any, n: int) -> dict[str, Any]:
        if self._direct_action is not None:
            # No copy: the request is encoded before send()/step() return (and parked requests copy their rows).
            return {self._direct_action: np.asarray(actions, dtype=self.single_action_space.dtype)}
        single = self.single_action_space
        batch = self.action_space if n == self.num_envs else _batch_space(single, n)
        # Every env sends the same fields (a column each): an optional field is left out
        # only when it says nothing for every env (one env's null would not mean "unset").
        wire = [self._act.to_wire(a, omit=False) for a in iterate(batch, actions)]
        unsets = [self._act.unset_fields(w) for w in wire]
        unset = set.intersection(*unsets) if wire else set()
        names = {name for w in wire for name in w} - unset
        if any(len(names & w.keys()) != len(names) for w in wire):
            # (an action that is one of several models, as JSON text: a column cannot say "absent")
            raise ValueError(
                "the envs' actions name different fields; OpenEnvVectorEnv sends one column per field, "
                "so every env's action in a step must name the same ones"
            )
        columns = {name: [w[name] for w in wire] for name in names}
        if any(unsets):
            # An env whose optional field says nothing, where others' say something, sends the field's
            # default: what the server fills in when the field is left out, as a lone env leaves it out.
            defaults = {key: child.default for key, child in self._act.codec.children if child.has_default}
            for j, says_nothing in enumerate(unsets):
                for name in says_nothing & names:
                    if name in defaults:
                        columns[name][j] = defaults[name]
        return columns

    def _write_observations(self, rows: slice | np.ndarray, ids: np.ndarray, results: Results) -> dict[int, SpaceMappingError]:
        """Write the arrivals' observations; the positions (in ``ids``) of those that do not fit the space, and why."""
        columns = results.observation
        if self._direct_field is not None:
            column = columns.get(self._direct_field)
            if isinstance(column, np.ndarray) and column.shape[1:] == self._direct_shape and column.dtype == self._direct_dtype:
                self._observations[rows] = column
                return {}
            if type(column) is list and len(column) == len(ids):  # (JSON: a list per env; the other fields are not read)
                stacked = self._obs.codec.from_wire_rows(column)
                if stacked is not None:
                    self._observations[rows] = stacked
                    return {}
        unreadable: dict[int, SpaceMappingError] = {}
        for j, i in enumerate(ids.tolist()):
            try:
                value = self._obs.from_wire({name: column[j] for name, column in columns.items()})
            except SpaceMappingError as exc:
                unreadable[j] = exc
                continue
            if self._array_obs:
                _write_row(self.single_observation_space, self._observations, i, value)
            else:
                self._env_obs[i] = value
        return unreadable

    def _add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        """Gymnasium's batching of infos, but free-form observation fields go in object arrays as received.

        Gymnasium types an info key's array by the first env's value, which
        breaks when another env's value is of another type (an int, then a dict).
        """
        free = self._obs.info_fields
        if not free or not any(name in env_info for name in free):
            return self._add_typed_info(vector_infos, env_info, env_num)
        vector_infos = self._add_typed_info(vector_infos, {k: v for k, v in env_info.items() if k not in free}, env_num)
        for name in free:
            if name in env_info:
                self._add_object_info(vector_infos, name, env_info[name], env_num)
        return vector_infos

    def _add_typed_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        """Gymnasium's batching; a key it cannot batch goes in an object array instead of raising."""
        try:
            if not _fits(vector_infos, env_info):  # (Gymnasium would write a non-map into a map's dict)
                raise TypeError
            return super()._add_info(vector_infos, env_info, env_num)
        except _UNBATCHED:
            # A value the array typed by the first env cannot hold (a uint64 above int64, a float
            # after an int array of another shape), a map where another env sent a value (or the
            # other way round), a key that is another's mask ("_a" beside "a"): that key in an
            # object array, as received, so that a server's infos never fail a step.
            for key, value in env_info.items():
                try:
                    if not _fits(vector_infos, {key: value}):
                        raise TypeError
                    vector_infos = super()._add_info(vector_infos, {key: value}, env_num)
                except _UNBATCHED:
                    self._add_object_info(vector_infos, key, value, env_num)
            return vector_infos

    def _add_object_info(self, vector_infos: dict[str, Any], key: str, value: Any, env_num: int) -> None:
        """``value`` at ``env_num`` of ``vector_infos[key]``, an object array (converted if it was typed), with its ``_key`` mask."""
        column = vector_infos.get(key)
        if not (isinstance(column, np.ndarray) and column.dtype == object and column.shape == (self.num_envs,)):
            old = column
            column = vector_infos[key] = np.full(self.num_envs, None, dtype=object)
            if isinstance(old, np.ndarray) and old.shape[:1] == (self.num_envs,):
                for i in range(self.num_envs):
                    column[i] = old[i]
            elif isinstance(old, dict):  # (maps batched so far: each env's own map again)
                for i in range(self.num_envs):
                    column[i] = _info_row(old, i)
        mask = vector_infos.get(f"_{key}")
        if not (isinstance(mask, np.ndarray) and mask.shape == (self.num_envs,)):
            mask = vector_infos[f"_{key}"] = np.zeros(self.num_envs, dtype=np.bool_)
        column[env_num] = value
        mask[env_num] = True

    def _with_info_fields(self, results: Results, metadata: list[dict[str, Any]] | None, k: int) -> list[dict[str, Any]]:
        """Each env's info with what its observation adds (fields no space holds, an action mask: ``RemoteSpaces.info_of``)."""
        out = [{} for _ in range(k)] if metadata is None else [dict(m) for m in metadata]
        columns = results.observation
        for j in range(k):
            out[j].update(self._spaces.info_of({name: column[j] for name, column in columns.items()}))
        return out

    def _flags(self, results: Results, key: str | None, k: int, in_metadata: bool = True) -> np.ndarray:
        """The bool column of the flag field ``key`` (an observation field, or with ``in_metadata`` a metadata one), ``(k,)``.

        A column left out is all false (a server leaves out ``terminated`` when
        no session is both terminated and truncated).
        """
        if key is None:
            return np.zeros(k, dtype=np.bool_)
        column = results.observation.get(key)
        if isinstance(column, np.ndarray):
            return column.astype(np.bool_, copy=False).reshape(k)
        if column is not None:
            return np.array([bool(v) for v in column], dtype=np.bool_)
        if in_metadata and results.metadata is not None:
            return np.array([bool(m.get(key, False)) for m in results.metadata], dtype=np.bool_)
        return np.zeros(k, dtype=np.bool_)

    # ------------------------------------------------------------ plumbing

    def _check_open(self) -> None:
        if self.closed or self._core is None:
            raise gym.error.ClosedEnvironmentError("OpenEnvVectorEnv is closed")

    def _submit(
        self,
        kind: str,
        env_ids: np.ndarray,
        *,
        actions=None,
        resets=None,
        seeds=None,
        options=None,
        defer=False,
        request_size: int | None = None,
        partial: bool = False,
        split: bool = True,
    ) -> None:
        """Hand a request to the core: now, or (``defer``) with the next wait (``partial``, ``split``: see :meth:`PoolCore.submit`)."""
        core = self._core
        if core is None:  # (closed by another thread while a step was under way)
            raise gym.error.ClosedEnvironmentError("OpenEnvVectorEnv is closed")
        if kind in ("reset", "step"):
            self._pending[env_ids] = True
        call = _CoreRequest(
            core.submit,
            kind,
            env_ids,
            dict(
                actions=actions,
                resets=resets,
                seeds=seeds,
                options=options,
                request_size=request_size,
                partial=partial,
                split=split,
            ),
        )
        if defer:
            self._deferred.append(call)
        else:
            self._start_now([call])

    def _receive(self, count: int, timeout: float | None = None, *, keep_ready: bool = False) -> None:
        """Absorb arrivals until ``count`` envs are ready.

        ``timeout`` (seconds) bounds the wait. ``None`` is a backstop that no
        answer within the step timeout reaches: ``2 * step_timeout + 1``
        (a reset may wait ``step_timeout`` for a new session, then as long for
        its reply), counted anew whenever more requests go out while waiting
        (``SAME_STEP``'s resets after a step).

        Raises:
            PoolUnavailable: no server could host sessions for the grace
                period. The envs it cost are truncated; with ``keep_ready``
                (``recv``) they stay ready for the next ``recv``, with any
                others ready; else (a step or reset) the envs still in
                flight are waited for, and every ready env is dropped.
            SessionTimeout: fewer than ``count`` envs arrived within ``timeout``.
        """
        core = self._core
        assert core is not None
        backstop = timeout is None
        if timeout is None:
            timeout = 2 * self._timeouts.step + 1
        deadline = time.monotonic() + timeout
        while self._ready_count < count:
            deferred, self._deferred = self._deferred, []
            if deferred and backstop:
                deadline = time.monotonic() + timeout
            left = deadline - time.monotonic()
            try:
                arrivals = self._collect(core, count - self._ready_count, max(left, 0.0), deferred)
            except SessionTimeout:
                if self._unavailable is None:
                    raise
                break  # (the rest of a step after PoolUnavailable: that is raised below)
            if not arrivals:  # nothing was in flight for them (the collect saw it on the loop, after any queued sends)
                self._lose_track()
            for arrival in arrivals:
                self._absorb(arrival)
            self._io.check_interrupt()  # (a Ctrl-C while absorbing: raised now, the arrivals all in; the rest stay in flight)
            if self._unavailable is not None:
                # SAME_STEP resets not sent yet are not sent: those envs are ready, reset by their next step.
                for call in self._deferred:
                    if call.kind == "final_reset":
                        ids = call.env_ids
                        self._pending[ids] = True
                        self._autoreset_envs[ids] = True
                        self._mark_ready(ids)
                self._deferred = []
                if keep_ready:
                    # recv: every env sent is returned by a recv, those the exception cost as truncated
                    # transitions; the caller's next recv gets them (and any others that are ready).
                    error, self._unavailable = self._unavailable, None
                    raise error
                # step or reset: the envs still in flight come in first, so that none stays pending.
        if self._unavailable is not None:
            error, self._unavailable = self._unavailable, None
            # Their transitions go with the exception, so that the next step (or reset) can go on once
            # servers are back.
            for i in self._take_ready(self._ready_count).tolist():
                self._env_infos.pop(i, None)
            raise error
        if self._deferred:  # requests made while absorbing (SAME_STEP resets) go out now
            calls, self._deferred = self._deferred, []
            self._start_now(calls)

    def _requeue(self, arrivals: list[Arrival] | None) -> None:
        """Arrivals of a lockstep step whose caller was interrupted as they came: the core's again, for the next collect."""
        if arrivals and self._core is not None:
            self._core.requeue(arrivals)

    def _collect(self, core: PoolCore, min_envs: int, timeout: float, deferred: list[Any]) -> list[Arrival]:
        """``core.collect_into`` on the I/O loop: the arrivals once ``min_envs`` envs came in (or raises).

        An awaited ``arecv`` (on the worker thread) lets go of the pool while
        it waits, so that a :meth:`send` from the event loop's thread goes out
        meanwhile (see :data:`_WHILE_AWAITED`).

        Raises:
            gymnasium.error.ClosedEnvironmentError: the pool was closed meanwhile (its arrivals say
                "closed by the client", not what the envs did).
        """
        letting_go = self._awaited == "recv" and threading.get_ident() == self._worker_ident
        if letting_go:
            self._in_use.release()
        try:
            arrivals = self._io.run_started(
                functools.partial(core.collect_into, min_envs=min_envs, timeout=timeout, submit=deferred), core.requeue
            )
        except Exception:
            if self._core is None:
                raise gym.error.ClosedEnvironmentError("OpenEnvVectorEnv was closed while it waited for its envs") from None
            raise
        finally:
            if letting_go:
                self._in_use.acquire()
        if self._core is None:
            raise gym.error.ClosedEnvironmentError("OpenEnvVectorEnv was closed while it waited for its envs")
        return arrivals

    def _start_now(self, calls: list[Any]) -> None:
        """Make the core calls ``calls`` on the I/O loop now, from this thread (their frames go out before this returns)."""
        self._io.run_started(functools.partial(call_all, calls))

    def _lose_track(self) -> None:
        """Envs in flight that nothing in flight will answer: truncated transitions, with an ``openenv_error``.

        Only a ``KeyboardInterrupt`` raised inside the pool's bookkeeping (a
        second Ctrl-C; the first is held for a safe point) gets the pool here:
        it dropped an arrival, or a request before it was counted.
        """
        waiting = self._pending.copy()
        for ids in self._ready:
            waiting[ids] = False
        lost = np.flatnonzero(waiting)
        if not lost.size:  # pragma: no cover - ready_count < count means some env is pending and not ready
            raise RuntimeError("the pool awaits envs that are neither in flight nor pending (a bug in openenv_gym; please report it)")
        error = OpenEnvGymError("this env's request was lost to an interrupt (KeyboardInterrupt) inside the pool")
        self._fail("step", lost, [error] * len(lost), "")

    def _mark_ready(self, ids: np.ndarray) -> None:
        if ids.size:
            self._ready.append(ids)
            self._ready_count += len(ids)

    def _take_ready(self, count: int) -> np.ndarray:
        self._io.settle()  # (a Ctrl-C that came is raised now, before the envs are taken; later ones are not)
        if not self._ready:
            return np.zeros(0, dtype=np.int64)
        ready = np.concatenate(self._ready) if len(self._ready) > 1 else self._ready[0]
        returned, rest = ready[:count], ready[count:]
        self._ready = [rest] if rest.size else []
        self._ready_count = len(rest)
        self._pending[returned] = False
        return returned

    def _drain(self) -> None:
        """Wait for everything in flight and forget it (before a reset)."""
        if self._pending.any() or (self._core is not None and self._core.in_flight):
            self._receive(int(self._pending.sum()))
            self._take_ready(self._ready_count)
            self._env_infos.clear()

    def list_tools(self) -> list[Tool]:
        """The tools of the servers' MCP environment (the first server's; they host the same env).

        As :meth:`OpenEnvEnv.list_tools <openenv_gym.OpenEnvEnv.list_tools>`: MCP's
        ``tools/list``, outside any episode.
        """
        return list_tools(
            self.urls[0],
            headers=self._headers,
            timeout=self._timeouts.connect,
            ssl=self._ssl,
            max_bytes=self._limits.max_frame_bytes,
            max_containers=self._limits.max_json_containers,
        )

    def __enter__(self) -> "OpenEnvVectorEnv":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def spec(self) -> EnvSpec | None:
        """The pool's spec (set by ``gymnasium.make_vec``).

        Where the make call's spec has no ``max_episode_steps``, it is the
        time limit the pool keeps: its own ``max_episode_steps`` or, when the
        server's env has one (an openenv_gym server says so; Pendulum's 200
        steps; with several servers, the first to end episodes), whichever is smaller.
        """
        return self._spec

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        self._spec = with_time_limit(value, self.max_episode_steps, getattr(self, "_server_time_limit", None))

    def __repr__(self) -> str:
        return f"OpenEnvVectorEnv({self.urls}, num_envs={self.num_envs})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        # (copy.copy would share the live sessions between two pools; deepcopy failed on a generator)
        raise TypeError(
            f"an OpenEnvVectorEnv holds live sessions on {self.urls} and cannot be copied or pickled; "
            "make another with the same arguments (for other processes, pass a function that makes it)"
        )
