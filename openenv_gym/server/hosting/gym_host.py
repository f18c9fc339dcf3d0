"""Hosting a Gymnasium environment.

On the wire (see ``docs/PROTOCOL.md``):

- action: one field, ``action`` (a value of the action space);
- observation: ``observation`` (the Gymnasium observation), ``truncated`` and
  ``terminated`` (both can be true); ``done = terminated or truncated``;
  ``reward`` is a float (``None`` after reset); ``metadata`` is Gymnasium's ``info``;
- reset: ``seed`` goes to ``env.reset(seed=...)``; ``episode_id`` names the
  episode in ``state``; every other key goes into ``options``;
- state: ``episode_id`` and ``step_count``.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from ..._masks import any_true
from ...protocol.codec import WIRE_DTYPES
from ...protocol.lane import Layout
from ...protocol.multiplex import MAX_EPISODE_ID, stack_column
from .hosts import BatchOutput, Host, HostFactory, LaneOutput, StepOutput
from .schema import ACTION_KEY, OBS_KEY, TERMINATED_KEY, TRUNCATED_KEY, gym_schema
from .values import ActionError, action_from_wire, plain_value, short_repr

__all__ = ["GymHost", "GymHostFactory"]

logger = logging.getLogger(__name__)

_ACTION_FIELDS = frozenset({ACTION_KEY, "metadata"})


class GymHost(Host):
    """One session: one Gymnasium env instance."""

    def __init__(self, env: gym.Env) -> None:
        self.env = env
        self.action_space = env.action_space
        self._episode_id: str | None = None  # drawn when first asked for
        self._started = False
        self.step_count = 0

    @property
    def episode_id(self) -> str | None:
        """The episode's id: the ``episode_id`` reset option, else a random UUID; ``None`` before any reset."""
        if self._episode_id is None and self._started:
            self._episode_id = str(uuid.uuid4())
        return self._episode_id

    def parse_action(self, fields: Mapping[str, Any]) -> Any:
        if ACTION_KEY not in fields:
            raise ActionError(f"the action needs the field {ACTION_KEY!r}")
        extra = set(fields) - _ACTION_FIELDS
        if extra:
            names = sorted(short_repr(name, 40) for name in extra)
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            raise ActionError(f"unexpected action fields {shown}; only {ACTION_KEY!r} is allowed")
        return action_from_wire(self.action_space, fields[ACTION_KEY], max_sequence_length=self.limits.max_sequence_length)

    def reset(self, seed: int | None, options: dict[str, Any]) -> StepOutput:
        observation, info = self.start(seed, options)
        return StepOutput({OBS_KEY: observation, TRUNCATED_KEY: False, TERMINATED_KEY: False}, None, False, dict(info))

    def start(self, seed: int | None, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """``env.reset``: the observation and info."""
        if "episode_id" in options:
            options = dict(options)
            episode_id = options.pop("episode_id")
            if episode_id is not None and not (type(episode_id) is str and len(episode_id) <= MAX_EPISODE_ID):
                raise ValueError(f"episode_id must be a string of at most {MAX_EPISODE_ID} characters")
        else:
            episode_id = None
        observation, info = self.env.reset(seed=seed, options=options or None)
        self._episode_id = str(episode_id) if episode_id is not None else None
        self._started = True
        self.step_count = 0
        return observation, info

    def step(self, action: Any) -> StepOutput:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.step_count += 1
        truncated, terminated = bool(truncated), bool(terminated)
        return StepOutput(
            {OBS_KEY: observation, TRUNCATED_KEY: truncated, TERMINATED_KEY: terminated},
            float(reward),
            terminated or truncated,
            dict(info),
        )

    def state(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step_count": self.step_count}

    def close(self) -> None:
        self.env.close()


class GymHostFactory(HostFactory):
    """Hosts a Gymnasium env: by id (``"CartPole-v1"``, ``"module:EnvId"``) or factory.

    Args:
        env: a registered env id, or a callable returning a new ``gymnasium.Env``.
        env_kwargs: keyword arguments for ``gymnasium.make`` (ids only).
        name: the name in ``/metadata`` and logs (default: the id, or the
            callable's ``__name__``).
        description: the description in ``/metadata``.
    """

    def __init__(
        self,
        env: str | Callable[[], gym.Env],
        env_kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        if isinstance(env, str):
            env_id, kwargs = env, dict(env_kwargs or {})
            self._make: Callable[[], gym.Env] = lambda: gym.make(env_id, **kwargs)
            self.name = name or env_id
        else:
            if env_kwargs:
                raise ValueError("env_kwargs only apply to env ids; bind them into the factory instead")
            self._make = env
            self.name = name or str(getattr(env, "__name__", "env"))
        self._description = description
        self._schema: dict[str, Any] | None = None
        self._metadata: dict[str, Any] | None = None
        self._action_space: gym.Space | None = None
        self._observation_space: gym.Space | None = None
        self._action_range = (0, 0)  # [low, high) of a Discrete action space

    def make(self) -> GymHost:
        return GymHost(self._new_env())

    def _new_env(self) -> gym.Env:
        env = self._make()
        if not isinstance(env, gym.Env):
            raise TypeError(f"{self.name} made a {type(env).__name__}, not a gymnasium.Env")
        return env

    def run_batch(self, calls: Sequence[tuple[Host, str, tuple[Any, ...]]], observe: Callable[[float], bool]) -> BatchOutput:
        """Resets and steps of many sessions, straight into columns (see :meth:`HostFactory.run_batch`)."""
        n = len(calls)
        clock = time.perf_counter
        observations: list[Any] = [None] * n
        rewards: list[Any] = [math.nan] * n
        done = [False] * n
        truncated = [False] * n
        terminated = [False] * n
        infos: list[Any] = [None] * n
        failures: dict[int, BaseException] = {}
        after: _Resets | None = None  # (step_then_reset calls that ended an episode: their resets, made on the first)
        for i, (host, kind, args) in enumerate(calls):
            start = clock()
            try:
                if kind == "reset":
                    observation, info = host.start(*args)  # type: ignore[attr-defined]
                else:  # "step", "step_then_reset"
                    observation, reward, term, trunc, info = host.env.step(args[0])  # type: ignore[attr-defined]
                    host.step_count += 1  # type: ignore[attr-defined]
                    rewards[i] = float(reward)
                    if trunc:
                        truncated[i] = done[i] = True
                    if term:
                        terminated[i] = done[i] = True
                    if done[i] and kind == "step_then_reset":
                        if after is None:
                            after = _Resets()
                        after.reset(i, host)
            except Exception as exc:
                failures[i] = exc
            else:
                observations[i] = observation
                infos[i] = info
            if observe(clock() - start) and i + 1 < n:  # slow calls: the rest go elsewhere
                n = i + 1
                del observations[n:], rewards[n:], done[n:], truncated[n:], terminated[n:], infos[n:]
                break
        out = _batch_output(observations, rewards, done, truncated, terminated, infos, failures)
        return out if after is None else after.attach(out)

    def run_lane(
        self,
        hosts: Sequence[Host],
        actions: Sequence[Any],
        restart: Sequence[bool] | None,
        observation: Layout,
        observe: Callable[[float], bool],
        *,
        autoreset: bool = False,
    ) -> LaneOutput | BatchOutput:
        """One raw step of a lane's sessions (see :meth:`HostFactory.run_lane`)."""
        n = len(hosts)
        clock = time.perf_counter
        dtype, shape = observation.dtype, observation.shape
        observations: list[Any] = [None] * n
        rewards: list[float] = [math.nan] * n
        done, truncated, terminated = bytearray(n), bytearray(n), bytearray(n)
        infos: dict[int, Any] = {}  # the ones that say something
        failures: dict[int, BaseException] = {}
        after = _Resets() if autoreset else None  # (the resets after episode ends)
        clean = True
        start = clock()
        for i, host in enumerate(hosts):
            try:
                if restart is not None and restart[i]:
                    obs, info = host.start(None, {})  # type: ignore[attr-defined]
                else:
                    obs, reward, term, trunc, info = host.env.step(actions[i])  # type: ignore[attr-defined]
                    host.step_count += 1  # type: ignore[attr-defined]
                    rewards[i] = float(reward)
                    if trunc:
                        truncated[i] = done[i] = 1
                    if term:
                        terminated[i] = done[i] = 1
                    if after is not None and done[i]:
                        after.reset(i, host)
                        if after.failures or after.infos[-1]:
                            clean = False
                        else:
                            reset = after.observations[-1]
                            if type(reset) is not np.ndarray or reset.dtype != dtype or reset.shape != shape:
                                clean = False
            except Exception as exc:
                failures[i] = exc
                clean = False
            else:
                observations[i] = obs
                if info:
                    infos[i] = info
                    clean = False
                elif type(obs) is not np.ndarray or obs.dtype != dtype or obs.shape != shape:
                    clean = False
            now = clock()
            if observe(now - start) and i + 1 < n:  # slow calls: the rest go elsewhere
                n, clean = i + 1, False
                break
            start = now
        if clean:
            return LaneOutput(rewards, done, truncated, terminated, observations, None if after is None else after.observations or None)
        done_flags, truncated_flags, terminated_flags = ([bool(b) for b in column[:n]] for column in (done, truncated, terminated))
        out = _batch_output(
            observations[:n], rewards[:n], done_flags, truncated_flags, terminated_flags, [infos.get(i, {}) for i in range(n)], failures
        )
        return out if after is None else after.attach(out)

    def parse_action_column(self, actions: Mapping[str, Any], n: int) -> list[Any] | None:
        """Read a whole column of ``Discrete`` actions at once.

        Returns one ``int`` (or :class:`ActionError`) per session, or ``None``
        when this fast path does not apply and actions are read one by one.
        """
        if self._action_space is None:
            self._probe()
        space = self._action_space
        column = actions.get(ACTION_KEY)
        if (
            type(space) is not gym.spaces.Discrete
            or len(actions) != 1
            or type(column) is not np.ndarray
            or column.dtype.kind not in "iu"
            or column.shape != (n,)
        ):
            return None
        low, high = self._action_range
        values = column.tolist()  # (min and max of a short list: cheaper in Python than numpy's reductions)
        if n == 0 or (min(values) >= low and max(values) < high):
            # numpy scalars of the space's dtype, as Gymnasium's own vector envs pass them
            # (cheaper for the env's own Discrete.contains than Python ints).
            return list(column if column.dtype == space.dtype else column.astype(space.dtype))
        return [v if low <= v < high else ActionError(f"action {v} is outside the action space {space}") for v in values]

    def lane_observation(self, action_field: str, action: Layout) -> tuple[str, Layout]:
        """The observation field and layout of a lane whose steps carry ``action_field`` values of layout ``action``.

        Raises:
            ValueError: this env cannot have such a lane (its observations have no
                fixed layout, or such actions are not of its action space).
        """
        if self._action_space is None:
            self._probe()
        space, observations = self._action_space, self._observation_space
        if action_field != ACTION_KEY:
            raise ValueError(f"the action field is {ACTION_KEY!r}, not {action_field!r}")
        if type(space) is gym.spaces.Discrete:
            if action.dtype.kind not in "iu" or action.shape != ():
                raise ValueError(f"actions of {space} are integers of shape (), not {action.dtype.str} {action.shape}")
        elif type(space) is gym.spaces.Box:
            if action.dtype != space.dtype or action.shape != space.shape:
                raise ValueError(f"actions of {space} are {space.dtype.str} {space.shape}, not {action.dtype.str} {action.shape}")
        else:
            raise ValueError(f"lanes carry Discrete and Box actions, not those of {space}")
        if type(observations) is not gym.spaces.Box or observations.dtype.str not in WIRE_DTYPES:
            raise ValueError(f"lanes carry Box observations, not those of {observations}")
        return OBS_KEY, Layout(observations.dtype, observations.shape)

    def _probe(self) -> None:
        env = self._new_env()
        try:
            spec = env.spec
            limit = getattr(spec, "max_episode_steps", None) if spec is not None else None
            self._schema = gym_schema(
                env.observation_space,
                env.action_space,
                title=_title(self.name),
                max_episode_steps=limit if isinstance(limit, int) and limit > 0 else None,
            )
            self._action_space = space = env.action_space
            self._observation_space = env.observation_space
            if type(space) is gym.spaces.Discrete:
                self._action_range = (int(space.start), int(space.start) + int(space.n))
            version = getattr(spec, "version", None) if spec is not None else None
            self._metadata = {
                "name": self.name,
                "description": self._description or f"Gymnasium environment {self.name}",
                "readme_content": None,
                "version": str(version) if version is not None else None,
                "author": None,
                "documentation_url": None,
            }
        finally:
            env.close()

    def schema(self) -> dict[str, Any]:
        if self._schema is None:
            self._probe()
        assert self._schema is not None
        return self._schema

    def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            self._probe()
        assert self._metadata is not None
        return self._metadata


class _Resets:
    """The resets that follow steps ending their episodes in a batch of calls (``step_then_reset``, autoreset lanes)."""

    __slots__ = ("rows", "observations", "infos", "failures")

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.observations: list[Any] = []
        self.infos: list[Any] = []
        self.failures: dict[int, BaseException] = {}

    def reset(self, i: int, host: Host) -> None:
        """Reset the host of call ``i`` (no seed, no options); a failure is that reset's, not its step's."""
        self.rows.append(i)
        try:
            observation, info = host.start(None, {})  # type: ignore[attr-defined]
        except Exception as exc:
            self.failures[len(self.observations)] = exc
            observation = info = None
        self.observations.append(observation)
        self.infos.append(info)

    def attach(self, out: BatchOutput) -> BatchOutput:
        """``out`` with these resets as its ``after``: of the calls it holds (a batch may stop early).

        (A call whose step failed after it, as an info no reply can hold, keeps
        its reset: the env was reset, and its client must not reset it again.)
        """
        n = len(out.reward)
        keep = [k for k, i in enumerate(self.rows) if i < n]
        if keep:
            k = len(keep)
            out.after_rows = [self.rows[j] for j in keep]
            failures = {new: self.failures[old] for new, old in enumerate(keep) if old in self.failures}
            out.after = _batch_output(
                [self.observations[j] for j in keep],
                [math.nan] * k,
                [False] * k,
                [False] * k,
                [False] * k,
                [self.infos[j] for j in keep],
                failures,
            )
        return out


def _batch_output(
    observations: list[Any],
    rewards: list[float],
    done: list[bool],
    truncated: list[bool],
    terminated: list[bool],
    infos: list[Any],
    failures: dict[int, BaseException],
) -> BatchOutput:
    """The columns of a batch of calls, from one entry per call (``None`` observation and info where a call failed)."""
    if failures:
        template = next((o for o in observations if o is not None), None)
        filler = np.zeros_like(template) if isinstance(template, (np.ndarray, np.generic)) else template
        observations = [filler if o is None else o for o in observations]
        for i in failures:
            rewards[i], done[i], truncated[i], terminated[i] = math.nan, False, False, False
    column = stack_column(observations)
    if not (type(column) is np.ndarray and column.dtype.str in WIRE_DTYPES):
        column = plain_value(observations, keep_arrays=True)
    metadata = None
    if any(infos):
        metadata = []
        for i, info in enumerate(infos):
            try:
                metadata.append(plain_value(info, keep_arrays=True, numpy_scalars=True) if info else {})
            except Exception as exc:  # (an info no reply can hold, nested past Python's recursion limit, say): this call failed
                metadata.append({})
                failures[i] = exc
                rewards[i], done[i], truncated[i], terminated[i] = math.nan, False, False, False
    reward = np.array(rewards, dtype=np.float64)
    flags = np.array([done, truncated, terminated], dtype=np.bool_)
    fields = {OBS_KEY: column, TRUNCATED_KEY: flags[1]}
    if any_true(flags[1] & flags[2]):  # (else done and truncated say it: the column is left out)
        fields[TERMINATED_KEY] = flags[2]
    return BatchOutput(fields, reward, flags[0], metadata, failures)


def _title(name: str) -> str:
    """A schema title from an env id: ``"ALE/Pong-v5"`` -> ``"ALEPongv5"``."""
    return "".join(ch for ch in name.rsplit(":", 1)[-1] if ch.isalnum()) or "Gym"
