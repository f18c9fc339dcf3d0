"""The pool's batch: per-env buffers in Gymnasium's terms, and the arrivals of requests written into them.

:class:`Batch` takes each :class:`~openenv_gym.vector.core.Arrival` (one
link's answer to one request) and writes its observations, rewards and flags
into the rows of its envs, following the autoreset policy
(:mod:`.autoreset`): an episode that ends, or a request that fails, is
reset by the env's next step or within this one. It does no I/O: requests it
needs (a reset within the step) go to :class:`Requests`, which the pool
sends with its next wait. Envs become *ready* as their arrivals are written,
and are taken in arrival order by ``recv`` or all at once by ``step``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array

from .._masks import any_true
from .._numbers import ARRAY_SPACES
from ..errors import ConnectionLost, OpenEnvGymError, PoolUnavailable
from ..remote import RemoteSpaces
from ..spaces import SpaceMappingError
from .autoreset import Autoreset
from .core import Arrival
from .infos import Infos
from .links import Results
from .rows import array_leaves_only, copy_batch, row_of, same_on_the_wire, take_results, take_rows, write_row

__all__ = ["Batch", "Requests"]

logger = logging.getLogger(__name__)

#: How many times, within one step, SAME_STEP's reset of an env is sent again after its server was lost
#: (once: a reset that kills every server it reaches should not reach many).
_RESET_TRIES = 1


class Requests(Protocol):
    """Where a :class:`Batch` puts the resets it needs (the pool sends them with its next wait)."""

    def reset_later(self, env_ids: np.ndarray) -> None:
        """Reset envs ``env_ids`` within the step under way (SAME_STEP's reset after an episode end)."""

    def withdraw_resets(self, env_ids: np.ndarray) -> None:
        """Take ``env_ids`` out of the resets not sent yet (their server reset them already)."""


class Batch:
    """Batch buffers of ``num_envs`` envs, written as arrivals come in.

    Args:
        spaces: the env's spaces and codecs (observations are read with ``spaces.observation``).
        num_envs: the batch's length.
        autoreset: the policy for envs whose episode ended.
        requests: where resets within a step go.
        max_episode_steps: truncate episodes after this many steps, client side.
        copy: ``observations()`` returns a copy (else the buffer, overwritten by the next call).

    Attributes:
        rewards: float64 ``(num_envs,)``; terminations, truncations: bool ``(num_envs,)``.
        autoreset_envs: bool ``(num_envs,)``, envs whose episode ended (or whose step failed) and
            that no reset has started again: the autoreset policy's ``ended``.
        elapsed: int64 ``(num_envs,)``, steps in the current episode.
        pending: bool ``(num_envs,)``, envs sent and not yet taken.
        ready_count: envs written and not yet taken.
        infos: the envs' infos until they are taken.
        failed_resets: envs whose explicit reset failed, and why (the pool resets them again).
        unavailable: a :class:`~openenv_gym.PoolUnavailable` that an arrival carried: raised by the
            pool once the arrivals at hand are written.
    """

    def __init__(
        self,
        spaces: RemoteSpaces,
        num_envs: int,
        *,
        autoreset: Autoreset,
        requests: Requests,
        max_episode_steps: int | None = None,
        copy: bool = True,
    ) -> None:
        self._spaces = spaces
        self._obs = spaces.observation
        self.single_observation_space = spaces.observation.space
        self.truncated_key = spaces.truncated_key
        self._terminated_key = spaces.terminated_key
        self.num_envs = num_envs
        self.autoreset = autoreset
        self._requests = requests
        self.max_episode_steps = max_episode_steps
        self.copy = copy
        self._all_ids = np.arange(num_envs)

        self._observations: Any = create_empty_array(self.single_observation_space, num_envs, fn=np.zeros)
        self._array_obs = array_leaves_only(self.single_observation_space)
        self._env_obs: list[Any] = [None] * num_envs  # per-env values, for non-array spaces only
        self._stand_in_value: Any = None  # the value of envs never reset in a non-array batch (see _stand_in)
        self.rewards = np.zeros(num_envs, dtype=np.float64)
        self.terminations = np.zeros(num_envs, dtype=np.bool_)
        self.truncations = np.zeros(num_envs, dtype=np.bool_)
        self.autoreset_envs = np.zeros(num_envs, dtype=np.bool_)
        self.elapsed = np.zeros(num_envs, dtype=np.int64)
        self._reset_tries = np.zeros(num_envs, dtype=np.int64)  # SAME_STEP resets tried again in this step
        self.pending = np.zeros(num_envs, dtype=np.bool_)
        self._ready: list[np.ndarray] = []  # env ids arrived and not yet taken, in arrival order
        self.ready_count = 0
        self.infos = Infos(num_envs, self._obs.info_fields)
        self.failed_resets: dict[int, OpenEnvGymError] = {}
        self.unavailable: PoolUnavailable | None = None

        # The fast case: the observation is one field whose column arrives as one
        # array of the buffer's dtype and shape, copied in with one assignment.
        # Only where the wire value is the space's value: not an enum (wire: enum[i]) or a bool field.
        self._direct_field = (
            self._obs.single_field
            if isinstance(self.single_observation_space, ARRAY_SPACES) and same_on_the_wire(self._obs.codec)
            else None
        )
        self._direct_shape = self.single_observation_space.shape
        self._direct_dtype = getattr(self.single_observation_space, "dtype", None)

    def absorb(self, arrival: Arrival) -> None:
        """Write one arrival into the batch buffers, following the autoreset mode."""
        results = arrival.results
        ids = arrival.env_ids
        rows = arrival.rows if arrival.rows is not None else ids  # a slice when contiguous
        restarted = arrival.resets
        if isinstance(results, OpenEnvGymError):  # the whole request failed
            self.fail(arrival.kind, ids, [results] * len(ids), arrival.server)
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
            self.elapsed[rows] = 0
            self.infos.collect(ids, metadata)
            self.mark_ready(ids)
            return

        # A step (envs in `arrival.resets` were reset instead: NEXT_STEP; see _write_step).
        k = len(ids)
        also = None if self._terminated_key is None else self._flags(results, self._terminated_key, k, in_metadata=False)
        ended = self._write_step(rows, results.reward, results.done, self._flags(results, self.truncated_key, k), also, restarted)

        if self.autoreset.within_step and ended.any():
            finished = ids[ended]
            self._reset_tries[finished] = 0
            obs_rows = take_rows(self.single_observation_space, self.current_observations(), finished)
            for n, (j, i) in enumerate(zip(np.flatnonzero(ended).tolist(), finished.tolist())):
                final_info = metadata[j] if metadata is not None else {}
                self.infos.add(i, {"final_obs": self._row(obs_rows, n), "final_info": final_info})
            self.autoreset_envs[finished] = False
            keep = ~ended
            self.infos.collect(ids[keep], None if metadata is None else [m for m, k in zip(metadata, keep) if k])
            self.mark_ready(ids[keep])
            reset = self._absorb_after(ids, ended, results, arrival.server)  # the server's resets of the ended envs, if it made them
            if reset.size < finished.size:
                self._requests.reset_later(finished[~np.isin(finished, reset)])
            return
        self.infos.collect(ids, metadata)
        self.mark_ready(ids)

    def absorb_every_env(self, arrivals: list[Arrival], resets: np.ndarray | None) -> bool:
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
        if self.autoreset.within_step:  # (a step in which no episode ends is any step)
            if any(any_true(arrival.results.done) for arrival in arrivals):  # type: ignore[union-attr]
                return False
            limit = self.max_episode_steps
            if limit is not None and any_true(self.elapsed >= limit - 1):
                return False
        # Each answer's columns into the batch buffers (reward, done and the flag fields first), then the rest at once.
        reward, done, flag = self.rewards, self.terminations, self.truncations
        also = None if self._terminated_key is None else np.zeros(self.num_envs, dtype=np.bool_)
        for arrival in arrivals:
            results, rows, k = arrival.results, arrival.rows, len(arrival.env_ids)
            self._observations[rows] = results.observation[field]  # type: ignore[union-attr]
            reward[rows] = results.reward  # type: ignore[union-attr]
            done[rows] = results.done  # type: ignore[union-attr]
            flag[rows] = self._flags(results, self.truncated_key, k)  # type: ignore[arg-type]
            if also is not None:
                also[rows] = self._flags(results, self._terminated_key, k, in_metadata=False)  # type: ignore[arg-type]
            self.infos.collect(arrival.env_ids, results.metadata)  # type: ignore[union-attr]
        self._write_step(slice(None), reward, done, flag, also, resets)
        self.mark_ready(self._all_ids)
        return True

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
            after, positions = take_results(after, kept), positions[kept]
        reset = ids[positions]
        if not reset.size:
            return reset
        failures: dict[int, OpenEnvGymError] = {}
        if after.errors is not None:
            failures = {j: e for j, e in enumerate(after.errors) if e is not None}
        readable = after
        if failures:
            ok = np.flatnonzero([e is None for e in after.errors])  # type: ignore[union-attr]
            readable = take_results(after, ok)
        targets = reset if not failures else reset[ok]
        unreadable = self._write_observations(targets, targets, readable) if targets.size else {}
        if unreadable:
            fine = np.ones(targets.size, dtype=np.bool_)
            fine[list(unreadable)] = False
            bad = targets[~fine]
            self.fail("final_reset", bad, [unreadable[j] for j in sorted(unreadable)], server)
            readable, targets = take_results(readable, np.flatnonzero(fine)), targets[fine]
        if failures:
            self.fail("final_reset", reset[sorted(failures)], [failures[j] for j in sorted(failures)], server)
        if targets.size:
            metadata = readable.metadata
            if self._spaces.adds_info(readable.observation):
                metadata = self._with_info_fields(readable, metadata, len(targets))
            self.elapsed[targets] = 0
            self.infos.collect(targets, metadata)
            self.mark_ready(targets)
        return reset

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
        self.fail(arrival.kind, ids[bad], [failures[j] for j in sorted(failures)], arrival.server)
        if results.after is not None and self.autoreset.within_step:
            # A step that failed once its server had reset the env (its info could not be sent, say): that
            # reset is the env's reset within this step, not another one (_fail asked for it: withdrawn).
            reset = self._absorb_after(ids, bad, results, arrival.server)
            if reset.size:
                self._requests.withdraw_resets(reset)
        ok = np.flatnonzero(~bad)
        if ok.size == 0:
            return None
        return take_results(results, ok), ids[ok], None if restarted is None else restarted[ok]

    def fail(self, kind: str, ids: np.ndarray, errors: Sequence[OpenEnvGymError], server: str) -> None:
        """Envs whose request failed: a truncated transition with their last observation.

        The env is reset (on a new session if its session is gone) as after
        any episode end: by its next step, or under ``SAME_STEP`` within this
        one, the last observation and the error going in ``final_obs`` and
        ``final_info``. An explicit reset that failed is retried by
        :meth:`reset`. A ``PoolUnavailable`` (no server is left) is raised
        once the arrivals at hand are absorbed, so that no env stays in flight.
        """
        unavailable = next((e for e in errors if isinstance(e, PoolUnavailable)), None)
        if unavailable is not None and self.unavailable is None:
            self.unavailable = unavailable
        if kind == "final_reset" and unavailable is None:
            # SAME_STEP's reset after an episode end lost its connection (a server died): reset again on
            # a new session, within this step. Other failures, or more of them, fall back to NEXT_STEP's
            # way: the env's next step resets it.
            lost = np.array([isinstance(e, ConnectionLost) for e in errors], dtype=np.bool_)
            lost &= self._reset_tries[ids] < _RESET_TRIES  # (a server that fails every reset is not tried forever)
            if lost.any():
                self._reset_tries[ids[lost]] += 1
                logger.info("%d env(s) reset again after a lost session: %s", int(lost.sum()), errors[int(np.argmax(lost))])
                self._requests.reset_later(ids[lost])
                ids, errors = ids[~lost], [e for e, gone in zip(errors, lost) if not gone]
                if not ids.size:
                    return
        if kind == "reset":
            self.failed_resets.update(zip(ids.tolist(), errors))
            self.mark_ready(ids)
            return
        if kind != "final_reset":  # (a failed SAME_STEP reset keeps its step's reward and flags)
            self.rewards[ids] = 0.0
            self.terminations[ids] = False
            self.truncations[ids] = True
        self.elapsed[ids] = 0
        reports = [
            {"type": type(error).__name__, "message": str(error), "server": server or getattr(error, "url", None) or None}
            for error in errors
        ]
        logger.info("%d env(s) truncated after a failed %s: %s", len(ids), kind, errors[0])
        if kind == "step" and self.autoreset.within_step and unavailable is None:
            # As after any episode end under SAME_STEP: the env is reset within this step (on a new
            # session if its own is gone); the last observation and the error go in final_obs/final_info.
            obs_rows = take_rows(self.single_observation_space, self.current_observations(), ids)
            for n, (i, report) in enumerate(zip(ids.tolist(), reports)):
                self.infos.add(i, {"openenv_error": report, "final_obs": self._row(obs_rows, n), "final_info": {"openenv_error": report}})
            self._reset_tries[ids] = 0
            self._requests.reset_later(ids)
            return
        self.autoreset_envs[ids] = True
        for i, report in zip(ids.tolist(), reports):
            self.infos.add(i, {"openenv_error": report})
        self.mark_ready(ids)

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
        self.rewards[rows] = np.where(np.isnan(reward), 0.0, reward)  # NaN: no reward (a reset, an OpenEnv None)
        if restarted is None:
            self.elapsed[rows] += 1
        else:
            self.elapsed[rows] = np.where(restarted, 0, self.elapsed[rows] + 1)
        if self.max_episode_steps is not None:  # as gymnasium's TimeLimit, client side
            truncated = truncated | (self.elapsed[rows] >= self.max_episode_steps)
        ended = terminated | truncated
        self.terminations[rows] = terminated
        self.truncations[rows] = truncated
        self.autoreset_envs[rows] = ended
        return ended

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
                write_row(self.single_observation_space, self._observations, i, value)
            else:
                self._env_obs[i] = value
        return unreadable

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

    def mark_ready(self, ids: np.ndarray) -> None:
        if ids.size:
            self._ready.append(ids)
            self.ready_count += len(ids)

    def take_ready(self, count: int) -> np.ndarray:
        if not self._ready:
            return np.zeros(0, dtype=np.int64)
        ready = np.concatenate(self._ready) if len(self._ready) > 1 else self._ready[0]
        returned, rest = ready[:count], ready[count:]
        self._ready = [rest] if rest.size else []
        self.ready_count = len(rest)
        self.pending[returned] = False
        return returned

    def lose_track(self) -> None:
        """Envs in flight that nothing in flight will answer: truncated transitions, with an ``openenv_error``.

        Only a ``KeyboardInterrupt`` raised inside the pool's bookkeeping (a
        second Ctrl-C; the first is held for a safe point) gets the pool here:
        it dropped an arrival, or a request before it was counted.
        """
        waiting = self.pending.copy()
        for ids in self._ready:
            waiting[ids] = False
        lost = np.flatnonzero(waiting)
        if not lost.size:  # pragma: no cover - ready_count < count means some env is pending and not ready
            raise RuntimeError("the pool awaits envs that are neither in flight nor pending (a bug in openenv_gym; please report it)")
        error = OpenEnvGymError("this env's request was lost to an interrupt (KeyboardInterrupt) inside the pool")
        self.fail("step", lost, [error] * len(lost), "")

    def observations(self) -> Any:
        obs = self.current_observations()
        return copy_batch(obs) if self.copy else obs

    def current_observations(self) -> Any:
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
        return row_of(self.single_observation_space, batch_rows, n)
