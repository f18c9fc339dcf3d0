"""Autoreset, on plain arrival records: the pool's batch beside ``SyncVectorEnv``, with no server.

:class:`~openenv_gym.vector.batch.Batch` writes each arrival (one server's
answer to one request) into Gymnasium's batch by the autoreset policy. Here
the arrivals are made by stepping local scripted envs, exactly as a server
would answer the pool's requests, and every batch is compared with what
``SyncVectorEnv`` returns over the same envs, in all three modes.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from openenv_gym.errors import ConnectionLost
from openenv_gym.remote import resolve_spaces
from openenv_gym.vector.autoreset import Disabled, NextStep, SameStep, autoreset_policy
from openenv_gym.vector.batch import Batch
from openenv_gym.vector.core import Arrival
from openenv_gym.vector.links import Results

pytestmark = pytest.mark.unit

#: The /schema of the scripted env as a stock OpenEnv server would give it: a 2-vector and a truncated flag.
SCHEMA = {
    "action": {"type": "object", "properties": {"action": {"type": "integer", "minimum": 0, "maximum": 1}}, "required": ["action"]},
    "observation": {
        "type": "object",
        "properties": {
            "observation": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
            "truncated": {"type": "boolean"},
            "done": {"type": "boolean"},
            "reward": {"type": ["number", "null"]},
        },
    },
}


class Scripted(gym.Env):
    """Episodes of scripted lengths; an episode ends terminated or truncated by turns. Obs ``[episode, t]``."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.episode = -1
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {"episode": self.episode}

    def step(self, action):
        self.t += 1
        end = self.t >= self.lengths[self.episode % len(self.lengths)]
        terminated = end and self.episode % 2 == 0
        truncated = end and not terminated
        return self._obs(), float(self.t + action), terminated, truncated, {"t": self.t}

    def _obs(self) -> np.ndarray:
        return np.array([self.episode, self.t], dtype=np.float32)


class Outbox:
    """The pool's side of :class:`~openenv_gym.vector.batch.Requests`: resets asked for within a step."""

    def __init__(self) -> None:
        self.resets: list[int] = []

    def reset_later(self, env_ids: np.ndarray) -> None:
        self.resets.extend(env_ids.tolist())

    def withdraw_resets(self, env_ids: np.ndarray) -> None:
        self.resets = [i for i in self.resets if i not in set(env_ids.tolist())]


LENGTHS = [[2, 3], [1, 4, 2], [3], [5, 1]]


def _results(answers: list[tuple]) -> Results:
    """A server's answer to a request of ``len(answers)`` envs: each ``(obs, reward|None, terminated, truncated, info)``."""
    return Results(
        observation={
            "observation": np.stack([a[0] for a in answers]),
            "truncated": np.array([a[3] for a in answers], dtype=np.bool_),
        },
        reward=np.array([np.nan if a[1] is None else a[1] for a in answers], dtype=np.float64),
        done=np.array([a[2] or a[3] for a in answers], dtype=np.bool_),
        metadata=[a[4] for a in answers],
        errors=None,
    )


def _pool_step(batch: Batch, outbox: Outbox, envs: list[Scripted], actions: np.ndarray):
    """One ``step()`` of a pool, with ``envs`` answering its requests as servers would."""
    ids = np.arange(len(envs))
    resets = batch.autoreset.before_step(ids, batch.autoreset_envs[ids])
    answers = []
    for i, env in enumerate(envs):
        if resets is not None and resets[i]:
            obs, info = env.reset()
            answers.append((obs, None, False, False, info))
        else:
            answers.append(env.step(int(actions[i])))
    batch.pending[ids] = True
    batch.absorb(Arrival("step", ids, _results(answers), resets=resets, rows=slice(None)))
    while outbox.resets:  # SAME_STEP: the resets the batch asked for, answered within the step
        asked, outbox.resets = np.array(outbox.resets), []
        batch.absorb(_reset_arrival(envs, asked))
    returned = batch.take_ready(batch.ready_count)
    assert sorted(returned.tolist()) == ids.tolist()  # every env once
    infos = batch.infos.batch(returned)
    return batch.observations(), batch.rewards.copy(), batch.terminations.copy(), batch.truncations.copy(), infos


def _reset_arrival(envs: list[Scripted], ids: np.ndarray) -> Arrival:
    answers = []
    for i in ids.tolist():
        obs, info = envs[i].reset()
        answers.append((obs, None, False, False, info))
    return Arrival("final_reset", ids, _results(answers))


def _pool_reset(batch: Batch, envs: list[Scripted]):
    ids = np.arange(len(envs))
    answers = []
    for env in envs:
        obs, info = env.reset()
        answers.append((obs, None, False, False, info))
    batch.pending[ids] = True
    batch.absorb(Arrival("reset", ids, _results(answers), rows=slice(None)))
    returned = batch.take_ready(batch.ready_count)
    return batch.observations(), batch.infos.batch(returned)


def _batch(mode: AutoresetMode, n: int) -> tuple[Batch, Outbox]:
    outbox = Outbox()
    return Batch(resolve_spaces(SCHEMA), n, autoreset=autoreset_policy(mode), requests=outbox), outbox


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) and a.dtype == object:
        return isinstance(b, np.ndarray) and b.dtype == object and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return type(a) is type(b) and a == b if not isinstance(a, float) else a == b


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_the_batch_returns_what_sync_vector_env_returns_step_for_step(mode):
    n = len(LENGTHS)
    sync = SyncVectorEnv([lambda lengths=lengths: Scripted(lengths) for lengths in LENGTHS], autoreset_mode=mode)
    batch, outbox = _batch(mode, n)
    ours = [Scripted(lengths) for lengths in LENGTHS]
    expected_obs, expected_infos = sync.reset(seed=0)
    obs, infos = _pool_reset(batch, ours)
    assert _same(obs, expected_obs) and _same(infos, expected_infos)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(12):
        actions = rng.integers(0, 2, n)
        expected = sync.step(actions)
        got = _pool_step(batch, outbox, ours, actions)
        for name, e, g in zip(("obs", "rewards", "terminations", "truncations", "infos"), expected, got):
            assert _same(g, e), f"{name}: pool {g!r}, SyncVectorEnv {e!r}"
        ended += int(expected[2].sum() + expected[3].sum())
    assert ended >= 8  # (the script ends episodes of every env, both ways)


def test_disabled_returns_what_sync_vector_env_returns_and_refuses_to_step_an_ended_env():
    n = len(LENGTHS)
    sync = SyncVectorEnv([lambda lengths=lengths: Scripted(lengths) for lengths in LENGTHS], autoreset_mode=AutoresetMode.DISABLED)
    batch, outbox = _batch(AutoresetMode.DISABLED, n)
    ours = [Scripted(lengths) for lengths in LENGTHS]
    sync.reset(seed=0)
    _pool_reset(batch, ours)
    actions = np.zeros(n, dtype=np.int64)
    expected = sync.step(actions)  # env 1's episode (length 1) ends here
    got = _pool_step(batch, outbox, ours, actions)
    assert all(_same(g, e) for g, e in zip(got, expected)) and expected[2][1]
    assert not outbox.resets  # (nothing reset by the pool)
    with pytest.raises(ValueError, match=r"envs \[1\] ended; with autoreset_mode=DISABLED"):
        batch.autoreset.before_step(np.arange(n), batch.autoreset_envs)


def test_a_failed_step_is_a_truncation_reset_by_the_next_step_or_within_this_one():
    # A server gone away: its env's step comes back truncated with reward 0 and the error in info,
    # its last observation kept; NEXT_STEP resets it by its next step, SAME_STEP within this one.
    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
        batch, outbox = _batch(mode, 2)
        envs = [Scripted([5]), Scripted([5])]
        _pool_reset(batch, envs)
        ids = np.arange(2)
        answers = [envs[0].step(0), envs[1].step(0)]
        results = _results(answers)
        results.errors = [None, ConnectionLost("the server went away")]
        batch.pending[ids] = True
        batch.absorb(Arrival("step", ids, results, rows=slice(None), server="ws://a"))
        assert batch.rewards.tolist() == [1.0, 0.0] and batch.truncations.tolist() == [False, True]
        assert not batch.terminations.any()
        if mode is AutoresetMode.NEXT_STEP:
            assert outbox.resets == [] and batch.autoreset_envs.tolist() == [False, True]
            infos = batch.infos.batch(batch.take_ready(2))
            assert infos["openenv_error"]["type"][1] == "ConnectionLost" and infos["openenv_error"]["server"][1] == "ws://a"
            assert batch.observations()[1].tolist() == [0.0, 0.0]  # (its last observation: the reset's)
        else:
            assert outbox.resets == [1] and batch.ready_count == 1  # (env 1 waits for its reset within the step)
            batch.absorb(_reset_arrival(envs, np.array([1])))
            infos = batch.infos.batch(batch.take_ready(2))
            assert infos["final_obs"][1].tolist() == [0.0, 0.0] and infos["final_info"]["openenv_error"]["type"][1] == "ConnectionLost"
            assert batch.observations()[1].tolist() == [1.0, 0.0]  # (the new episode's first observation)
            assert batch.rewards.tolist() == [1.0, 0.0] and batch.truncations.tolist() == [False, True]


def test_each_mode_has_its_policy():
    assert [type(autoreset_policy(m)) for m in AutoresetMode] == [NextStep, SameStep, Disabled]
    assert autoreset_policy("SameStep").within_step and not autoreset_policy("NextStep").within_step
    ended = np.array([False, True, False])
    ids = np.array([4, 5, 6])
    assert NextStep().before_step(ids, ended).tolist() == [False, True, False]
    assert SameStep().before_step(ids, ended).tolist() == [False, True, False]  # (a reset within the step that failed)
    assert NextStep().before_step(ids, np.zeros(3, dtype=np.bool_)) is None
    with pytest.raises(ValueError, match=r"envs \[5\] ended"):
        Disabled().before_step(ids, ended)
