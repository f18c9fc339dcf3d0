"""``OpenEnvVectorEnv``: a Gymnasium ``VectorEnv`` over many remote sessions.

The Gymnasium face of the pool: ``reset``, ``step``, ``send``/``recv``
(EnvPool's pair), ``step_async``/``step_wait`` and their awaited forms. Each
checks its arguments, hands requests to the pool's core (:mod:`.core`, on the
I/O loop) and waits for their arrivals, which :class:`~.batch.Batch` writes
into Gymnasium's batch by the autoreset policy (:mod:`.autoreset`). Where
sessions go is :mod:`.placement`; infos are batched in :mod:`.infos`; the
thread rules of the awaited calls are :mod:`.awaited`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl as ssl_module
import time
from concurrent.futures import Future
from typing import Any, Callable, Mapping, Sequence, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode, VectorEnv

from .._loop import LoopThread, Readers
from .._masks import any_true, count_true
from ..config import Limits, Timeouts
from ..errors import ProtocolError, SessionTimeout
from ..protocol.messages import check_reset_options
from ..registration import with_time_limit
from ..remote import RemoteSpaces, Tool, fetch_schema, list_tools, resolve_spaces
from .actions import ActionColumns
from .arguments import check_sizes, refuse_unused, reset_ids, reset_seeds
from .autoreset import autoreset_policy
from .awaited import AwaitedCalls, one_caller
from .batch import Batch
from .core import Arrival, PoolCore, call_all, session_lost
from .links import FastLink
from .lockstep import step_every_env
from .outbox import Outbox
from .placement import first_observation, first_state, free_capacity, open_core
from .rows import batched_space, take_info, take_rows

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


#: Rounds of a reset whose sessions broke with a ProtocolError (the server could not read it, say) before
#: ``reset`` raises that error, instead of opening new sessions for it again and again.
RESET_PROTOCOL_RETRIES = 3


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
        refuse_unused(unused)
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        check_sizes(urls, num_envs, batch_size, max_episode_steps, request_size)
        self.num_envs = num_envs
        self.batch_size = num_envs if batch_size is None else int(batch_size)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        self.copy = copy
        self.max_episode_steps = max_episode_steps
        self.request_size = request_size
        self.urls = urls
        self._headers = dict(headers or {})
        self._timeouts = Timeouts(connect=connect_timeout, step=step_timeout)
        self._limits = limits or Limits()
        self._ssl = ssl
        self._io = LoopThread.shared()
        self._awaited_calls = AwaitedCalls()
        self._core: PoolCore | None = None
        self.grace_period = grace_period
        self._autoreset = autoreset_policy(self.autoreset_mode)

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
        schema, resolved = self._same_env_everywhere(resolve)
        self._core = self._open(urls, num_envs, grace_period)
        self._outbox = Outbox(self._core.submit)  # core requests to make with the next wait
        if resolved.needs_first_observation:  # (the schema leaves some of it open: a list's length, a map's keys)
            resolved = self._probe(resolved, resolve, schema)
        self._spaces = resolved
        self._obs, self._act = resolved.observation, resolved.action
        self.single_observation_space = self._obs.space
        self.single_action_space = self._act.space
        self.observation_space = batched_space(self.single_observation_space, num_envs)
        self.action_space = batched_space(self.single_action_space, num_envs)
        # The batch buffers, written in place as results arrive (env order).
        self._batch = Batch(
            resolved, num_envs, autoreset=self._autoreset, requests=self._outbox, max_episode_steps=max_episode_steps, copy=copy
        )
        self._started = np.zeros(num_envs, dtype=np.bool_)  # reset at least once (as OrderEnforcing wants)
        self._all_started = False
        self._all_ids = self._core.every
        self._actions = ActionColumns(self._act, num_envs, self.action_space)
        self._marks = np.zeros(num_envs, dtype=np.bool_)  # scratch, all False between calls

    def _open(self, urls: list[str], num_envs: int, grace: float) -> PoolCore:
        """The pool's core: ``num_envs`` sessions placed on the servers by their free room (:mod:`.placement`)."""
        headers, timeouts, limits, ssl_context = self._headers, self._timeouts, self._limits, self._ssl
        free, limit = free_capacity(urls, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl_context)
        opening = open_core(
            urls,
            num_envs,
            free,
            limit,
            headers=headers,
            timeouts=timeouts,
            limits=limits,
            ssl=ssl_context,
            grace=grace,
            server_autoreset=self._autoreset.within_step,
        )
        return self._io.run(opening, timeout=timeouts.connect * 2 + 30)

    def _same_env_everywhere(self, resolve: Callable[..., RemoteSpaces]) -> tuple[dict[str, Any], RemoteSpaces]:
        """The first server's schema and spaces, once every server's say the same env (the smallest time limit kept).

        Raises:
            ValueError: servers host envs of different spaces.
        """
        fetch = functools.partial(
            fetch_schema,
            headers=self._headers,
            timeout=self._timeouts.connect,
            ssl=self._ssl,
            max_bytes=self._limits.max_frame_bytes,
            max_containers=self._limits.max_json_containers,
        )
        urls = self.urls
        schema = fetch(urls[0])
        resolved = resolve(schema)
        self.truncated_key = resolved.truncated_key
        self._server_time_limit = resolved.max_episode_steps
        obs, act = resolved.observation, resolved.action
        for url in urls[1:]:
            other = resolve(fetch(url))
            if other.observation.space != obs.space or other.action.space != act.space:
                raise ValueError(
                    f"all servers must host the same env: {urls[0]} has spaces "
                    f"{obs.space} / {act.space}, {url} has {other.observation.space} / {other.action.space}"
                )
            if other.max_episode_steps is not None:  # (servers that differ in their time limits only: the smallest)
                known = self._server_time_limit
                self._server_time_limit = other.max_episode_steps if known is None else min(known, other.max_episode_steps)
        return schema, resolved

    # ------------------------------------------------------------ setup

    def _probe(self, resolved: RemoteSpaces, resolve: Callable[..., RemoteSpaces], schema: dict[str, Any]) -> RemoteSpaces:
        """The spaces again, with the first env's reset observation (and state) where the schema leaves them open."""
        assert self._core is not None
        first = self._io.run(first_observation(self._core, self._timeouts.step + 1), timeout=self._wait_bound())
        state = self._io.run(first_state(self._core), timeout=self._wait_bound()) if resolved.needs_state else None
        return resolve(schema, first_observation=first, state=state)

    def _wait_bound(self) -> float:
        return self._timeouts.step + self._timeouts.connect + 5

    # ------------------------------------------------------------ Gymnasium API

    @one_caller
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
        seeds = reset_seeds(seed, self.num_envs)
        options = dict(options) if options is not None else None
        env_ids = reset_ids(options, self.num_envs)
        if options:
            core = self._core
            assert core is not None  # (checked open)
            check_reset_options(options, self._limits.max_depth, msgpack=any(link.codec == "msgpack" for link in core.links))
        self._awaited_calls.episodes += 1  # (a cancelled arecv's results are of the episodes this reset ends)
        self._awaited_calls.forget()
        self._drain()

        batch = self._batch
        batch.terminations[env_ids] = False
        batch.truncations[env_ids] = False
        batch.autoreset_envs[env_ids] = False
        batch.elapsed[env_ids] = 0
        todo = env_ids
        garbled = 0  # rounds in which a server could not read a reset, or answered what the pool could not
        while True:
            # An env whose reset failed (its server went away) is reset again on a
            # new session; the pool raises PoolUnavailable after its grace period.
            batch.failed_resets.clear()
            self._submit("reset", todo, seeds=[seeds[i] for i in todo.tolist()], options=options or None)
            self._receive(len(todo))
            self._take_ready(len(todo))
            if not batch.failed_resets:
                break
            refused = [e for e in batch.failed_resets.values() if not session_lost(e)]
            if refused:  # the env itself failed to reset: as in SyncVectorEnv, that is the caller's error
                raise refused[0]
            broken = [e for e in batch.failed_resets.values() if isinstance(e, ProtocolError)]
            if broken:
                # Not a server gone away: a server that answers, and cannot read this reset (its own
                # Limits, tighter than this pool's) or is answered in a way the pool cannot read.
                # Sent again it fails again, however long the grace period.
                garbled += 1
                if garbled >= RESET_PROTOCOL_RETRIES:
                    raise broken[0]
            todo = np.array(sorted(batch.failed_resets), dtype=np.int64)
        if not self._all_started:
            self._started[env_ids] = True
            self._all_started = bool(self._started.all())
        infos = batch.infos.batch(env_ids)
        return batch.observations(), infos

    @one_caller
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env: ``send`` of all envs, then wait for all of them."""
        ids, columns, resets = self._step_request(actions, None)
        if self._outbox or self._batch.unavailable is not None:  # (what waits to go out goes first, as in _receive)
            self._submit("step", ids, actions=columns, resets=resets, defer=True)  # sent with the wait
            return self._wait_all(None)
        # Sent and awaited in one hand-off to the I/O loop; by the lockstep path when the servers allow. Every
        # request asks for its answer in parts, so that an env past the step timeout costs only its own episode
        # (a server whose env calls are fast answers in one frame all the same).
        core = self._core
        assert core is not None  # (checked open)
        self._batch.pending[ids] = True
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
            if not self._batch.absorb_every_env(arrivals, resets):
                for arrival in arrivals:
                    self._batch.absorb(arrival)
            self._io.check_interrupt()  # (as in _receive: a Ctrl-C while absorbing is raised now, the arrivals in)
        return self._wait_all(None)  # (collects what went the general road; else takes the arrivals written)

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

    @one_caller
    def step_async(self, actions: Any) -> None:
        """Send ``actions`` for every env; collect the results with :meth:`step_wait`."""
        self._send(actions, None)

    @one_caller
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
        if not self._batch.pending.any():
            raise gym.error.NoAsyncCallError("Calling `step_wait` without any prior call to `step_async`.", "step")
        if not self._batch.pending.all():
            idle = np.flatnonzero(~self._batch.pending)
            raise gym.error.NoAsyncCallError(
                f"`step_wait` returns every env, but envs {idle[:16].tolist()} are not in flight (sent to some envs "
                "with `send`, or taken by `recv`): collect them with `recv()`",
                "step",
            )
        return self._wait_all(timeout)

    @one_caller
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Send one action to each env in ``env_ids`` (default: all) and return at once.

        ``actions`` has one entry per env in ``env_ids`` (a batch of
        ``single_action_space``). Under ``NEXT_STEP`` an env whose episode ended
        is reset instead and its action ignored, as in ``SyncVectorEnv``.

        Raises:
            ValueError: an action outside the action space, an env already in
                flight, or (``DISABLED``) an env whose episode ended.
        """
        self._send(actions, env_ids)

    def _send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None) -> None:
        ids, columns, resets = self._step_request(actions, env_ids)
        if ids.size == 0:
            return
        self._submit("step", ids, actions=columns, resets=resets, request_size=self.request_size, split=self.batch_size < self.num_envs)

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
            if any_true(self._batch.pending):
                raise ActionsInFlight(
                    f"envs {np.flatnonzero(self._batch.pending).tolist()} already have an action in flight: take their results first "
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
            if self._batch.pending[ids].any():
                raise ActionsInFlight(
                    f"envs {ids[self._batch.pending[ids]].tolist()} already have an action in flight: take their results first "
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
        actions = self._actions.checked(actions, len(ids))
        # The envs reset instead of stepped: NEXT_STEP's after an episode end, in the same request as the
        # others' steps (their actions ignored); under SAME_STEP only after a failed request. DISABLED refuses.
        resets = self._autoreset.before_step(ids, self._batch.autoreset_envs[ids])
        columns = self._actions.columns(actions, len(ids))
        return ids, columns, resets

    def recv(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Return the first ``batch_size`` envs whose results are ready.

        Returns ``(obs, rewards, terminations, truncations, infos)`` with a
        leading axis of ``batch_size``, in arrival order; ``infos["env_id"]``
        (int64) says which envs they are. Waits at most ``timeout`` seconds
        (by default as long as the step timeout allows).

        The results of an :meth:`arecv` whose await was cancelled come first.
        """
        while (job := self._awaited_calls.claim()) is not None:
            try:
                job.result(timeout)
                error = None
            except Exception as exc:
                error = exc
            except BaseException:  # (KeyboardInterrupt) the call runs on: the next recv takes its envs
                self._awaited_calls.unclaim(job, first=True)
                raise
            batch = self._awaited_calls.handed_on(job, error, timeout)
            if batch is not None:
                return batch
        return self._recv(timeout)

    @one_caller
    def _recv(self, timeout: float | None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._check_open()
        count = min(self.batch_size, int(self._batch.pending.sum()))
        if count == 0:
            raise gym.error.NoAsyncCallError("Calling `recv` without any env in flight; call `send` first.", "recv")
        self._receive(count, timeout, keep_ready=True)
        returned = self._take_ready(count)
        infos = take_info(self._batch.infos.batch(returned), returned)  # rows in the order returned
        infos["env_id"] = returned
        obs = take_rows(self.single_observation_space, self._batch.current_observations(), returned)
        return (
            obs,
            self._batch.rewards[returned],
            self._batch.terminations[returned],
            self._batch.truncations[returned],
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
        while (job := self._awaited_calls.claim()) is not None:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job)), timeout)
                error = None
            except asyncio.CancelledError:
                self._awaited_calls.unclaim(job, first=True)
                raise
            except Exception as exc:
                error = exc
            batch = self._awaited_calls.handed_on(job, error, timeout)
            if batch is not None:
                return batch
        job = self._on_worker(functools.partial(self._recv_counted, timeout), kind="recv")
        try:
            return (await asyncio.wrap_future(job))[1]
        except asyncio.CancelledError:
            if not job.cancelled():  # it had started: it runs on, and its envs go to the next recv
                self._awaited_calls.unclaim(job)
            raise

    def _on_worker(self, call: Callable[[], T], kind: str = "other") -> "Future[T]":
        """Run ``call`` on the pool's worker thread; ``kind``: ``"recv"`` for an ``arecv``."""
        self._check_open()
        return self._awaited_calls.run(call, kind)

    def _recv_counted(self, timeout: float | None) -> tuple[int, tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]]:
        """:meth:`recv`'s batch, with the count of resets before it (a batch from before a reset is stale)."""
        episodes = self._awaited_calls.episodes
        return episodes, self._recv(timeout)

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
        self._awaited_calls.shutdown()  # (calls still queued on its worker run, and find the pool closed)
        core, self._core = self._core, None
        if core is not None:
            try:
                self._io.run(core.close(), timeout=self._timeouts.close * 2 + 5, finish=True)  # (a Ctrl-C waits for it)
            except Exception:  # pragma: no cover - closing is best effort
                logger.debug("closing the pool failed", exc_info=True)

    # ------------------------------------------------------------ the batch, in Gymnasium's terms

    def _wait_all(self, timeout: float | None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        count = count_true(self._batch.pending)
        self._receive(count, timeout)
        returned = self._take_ready(count)
        infos = self._batch.infos.batch(returned)
        return (
            self._batch.observations(),
            np.copy(self._batch.rewards),
            np.copy(self._batch.terminations),
            np.copy(self._batch.truncations),
            infos,
        )

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
        split: bool = False,
    ) -> None:
        """Hand a request to the core: now, or (``defer``) with the next wait.

        Every request asks for its answer in parts (``partial``), so that an env
        past the step timeout costs only itself; ``split``: a stock server gets
        one request per env (see :meth:`PoolCore.submit`).
        """
        core = self._core
        if core is None:  # (closed by another thread while a step was under way)
            raise gym.error.ClosedEnvironmentError("OpenEnvVectorEnv is closed")
        if kind in ("reset", "step"):
            self._batch.pending[env_ids] = True
        call = self._outbox.request(
            kind, env_ids, actions=actions, resets=resets, seeds=seeds, options=options, request_size=request_size, split=split
        )
        if defer:
            self._outbox.add(call)
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
        while self._batch.ready_count < count:
            deferred = self._outbox.take()
            if deferred and backstop:
                deadline = time.monotonic() + timeout
            left = deadline - time.monotonic()
            try:
                arrivals = self._collect(core, count - self._batch.ready_count, max(left, 0.0), deferred)
            except SessionTimeout:
                if self._batch.unavailable is None:
                    raise
                break  # (the rest of a step after PoolUnavailable: that is raised below)
            if not arrivals:  # nothing was in flight for them (the collect saw it on the loop, after any queued sends)
                self._batch.lose_track()
            for arrival in arrivals:
                self._batch.absorb(arrival)
            self._io.check_interrupt()  # (a Ctrl-C while absorbing: raised now, the arrivals all in; the rest stay in flight)
            if self._batch.unavailable is not None:
                # SAME_STEP resets not sent yet are not sent: those envs are ready, reset by their next step.
                for ids in self._outbox.drop_resets():
                    self._batch.pending[ids] = True
                    self._batch.autoreset_envs[ids] = True
                    self._batch.mark_ready(ids)
                if keep_ready:
                    # recv: every env sent is returned by a recv, those the exception cost as truncated
                    # transitions; the caller's next recv gets them (and any others that are ready).
                    error, self._batch.unavailable = self._batch.unavailable, None
                    raise error
                # step or reset: the envs still in flight come in first, so that none stays pending.
        if self._batch.unavailable is not None:
            error, self._batch.unavailable = self._batch.unavailable, None
            # Their transitions go with the exception, so that the next step (or reset) can go on once
            # servers are back.
            for i in self._take_ready(self._batch.ready_count).tolist():
                self._batch.infos.drop(i)
            raise error
        if self._outbox:  # requests made while absorbing (SAME_STEP resets) go out now
            self._start_now(self._outbox.take())

    def _requeue(self, arrivals: list[Arrival] | None) -> None:
        """Arrivals of a lockstep step whose caller was interrupted as they came: the core's again, for the next collect."""
        if arrivals and self._core is not None:
            self._core.requeue(arrivals)

    def _collect(self, core: PoolCore, min_envs: int, timeout: float, deferred: list[Any]) -> list[Arrival]:
        """``core.collect_into`` on the I/O loop: the arrivals once ``min_envs`` envs came in (or raises).

        An awaited ``arecv`` (on the worker thread) lets go of the pool while
        it waits, so that a :meth:`send` from the event loop's thread goes out
        meanwhile (see :mod:`.awaited`).

        Raises:
            gymnasium.error.ClosedEnvironmentError: the pool was closed meanwhile (its arrivals say
                "closed by the client", not what the envs did).
        """
        try:
            with self._awaited_calls.letting_go():
                arrivals = self._io.run_started(
                    functools.partial(core.collect_into, min_envs=min_envs, timeout=timeout, submit=deferred), core.requeue
                )
        except Exception:
            if self._core is None:
                raise gym.error.ClosedEnvironmentError("OpenEnvVectorEnv was closed while it waited for its envs") from None
            raise
        if self._core is None:
            raise gym.error.ClosedEnvironmentError("OpenEnvVectorEnv was closed while it waited for its envs")
        return arrivals

    def _start_now(self, calls: list[Any]) -> None:
        """Make the core calls ``calls`` on the I/O loop now, from this thread (their frames go out before this returns)."""
        self._io.run_started(functools.partial(call_all, calls))

    def _take_ready(self, count: int) -> np.ndarray:
        """The first ``count`` ready envs (int64), no longer pending."""
        self._io.settle()  # (a Ctrl-C that came is raised now, before the envs are taken; later ones are not)
        return self._batch.take_ready(count)

    def _drain(self) -> None:
        """Wait for everything in flight and forget it (before a reset)."""
        if self._batch.pending.any() or (self._core is not None and self._core.in_flight):
            self._receive(int(self._batch.pending.sum()))
            self._take_ready(self._batch.ready_count)
            self._batch.infos.clear()

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
