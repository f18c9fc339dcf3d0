"""The setups under test, each behind one interface: ``runner(k)`` does one call.

A runner owns what it steps (a vector env, a set of stock clients) and
releases it in :meth:`close`. ``env_steps_per_call`` says how many env-steps
one call performs. Actions are drawn once, up front, from a seeded RNG, so
that drawing them is not part of what is timed.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

__all__ = [
    "ACTION_ROWS",
    "Runner",
    "SendRecvRunner",
    "StockClientRunner",
    "VectorRunner",
    "stock_available",
]

#: Rows of pre-drawn actions a runner cycles through.
ACTION_ROWS = 64


class Runner(Protocol):
    env_steps_per_call: int

    def __call__(self, k: int) -> None: ...

    def close(self) -> None: ...


def stock_available() -> bool:
    """Whether the stock OpenEnv package (and uvicorn, for its server) can be imported."""
    return all(importlib.util.find_spec(name) is not None for name in ("openenv", "uvicorn"))


def include_stock_setups(asked: bool | None, notes: list[str]) -> bool:
    """Whether a study runs its stock setups: as ``asked``, else when openenv is installed (if not, said in ``notes``)."""
    if asked is not None:
        return asked
    if stock_available():
        return True
    notes.append("the stock OpenEnv setups were left out: they need openenv (`pip install -e '.[openenv]'` in a checkout)")
    return False


def _draw(space: gym.Space, rows: int, seed: int) -> list[Any]:
    space.seed(seed)
    return [space.sample() for _ in range(rows)]


class VectorRunner:
    """Steps a Gymnasium vector env (``step()``, lockstep) with random actions.

    Args:
        envs: the vector env; it is reset here (seed 0) and closed by :meth:`close`.
    """

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.envs = envs
        self.env_steps_per_call = envs.num_envs
        self.actions = _draw(envs.action_space, ACTION_ROWS, 0)
        envs.reset(seed=0)

    def __call__(self, k: int) -> None:
        self.envs.step(self.actions[k % ACTION_ROWS])

    def close(self) -> None:
        self.envs.close()


class SendRecvRunner:
    """Drives an ``OpenEnvVectorEnv`` with ``send``/``recv``: one call is one ``recv`` of ``batch_size`` envs.

    Every env is kept in flight: the first call sends all of them, and each
    call sends new actions to the envs it received.
    """

    def __init__(self, envs: Any) -> None:
        if envs.batch_size >= envs.num_envs:
            raise ValueError("send/recv needs batch_size < num_envs")
        self.envs = envs
        self.env_steps_per_call = envs.batch_size
        self.actions = _draw(batch_space(envs.single_action_space, envs.batch_size), ACTION_ROWS, 0)
        self.in_flight = 0
        envs.reset(seed=0)
        envs.send(_draw(envs.action_space, 1, 1)[0])
        self.in_flight = envs.num_envs

    def __call__(self, k: int) -> None:
        *_, infos = self.envs.recv()
        env_ids = infos["env_id"]
        actions = self.actions[k % ACTION_ROWS]
        self.envs.send(actions[: len(env_ids)], env_ids)

    def close(self) -> None:
        try:
            for _ in range(self.envs.num_envs):  # drain, bounded: each recv returns >= 1 env
                if self.in_flight <= 0:
                    break
                *_, infos = self.envs.recv()
                self.in_flight -= len(infos["env_id"])
        finally:
            self.envs.close()


class StockClientRunner:
    """``num_envs`` stock ``openenv.core.GenericEnvClient`` sessions, stepped with ``asyncio.gather``.

    One call steps every session once (a session whose episode ended is reset
    instead). Actions are sent as ``{action_key: value}``.

    Args:
        url: the server's base URL, or a list of them (sessions go round robin).
        num_envs: sessions.
        actions: ``(rows, num_envs)`` plain actions (ints, lists) cycled through.
        timeout: the clients' connect and message timeouts, in seconds.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        num_envs: int,
        actions: Sequence[Sequence[Any]],
        *,
        action_key: str = "action",
        timeout: float = 60.0,
    ) -> None:
        from openenv.core.generic_client import GenericEnvClient

        self.env_steps_per_call = num_envs
        self.action_key = action_key
        self.actions = [list(row) for row in actions]
        self.loop = asyncio.new_event_loop()
        urls = [url] if isinstance(url, str) else list(url)
        self.clients = [
            GenericEnvClient(base_url=urls[i % len(urls)], connect_timeout_s=timeout, message_timeout_s=timeout) for i in range(num_envs)
        ]
        self.done = [False] * num_envs
        try:
            self._run(lambda: asyncio.gather(*(c.connect() for c in self.clients)))
            self._run(lambda: asyncio.gather(*(c.reset(seed=i) for i, c in enumerate(self.clients))))
        except BaseException:
            self.close()
            raise

    def _run(self, make: Callable[[], Any]) -> Any:
        # The stock client's methods return awaitables only when called inside a running loop.
        async def inside() -> Any:
            return await make()

        return self.loop.run_until_complete(inside())

    async def _one(self, i: int, action: Any) -> None:
        client = self.clients[i]
        result = await (client.reset() if self.done[i] else client.step({self.action_key: action}))
        self.done[i] = bool(result.done)

    def __call__(self, k: int) -> None:
        row = self.actions[k % len(self.actions)]
        self._run(lambda: asyncio.gather(*(self._one(i, a) for i, a in enumerate(row))))

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self._run(lambda: asyncio.gather(*(c.close() for c in self.clients), return_exceptions=True))
        finally:
            self.loop.close()


def env_actions(env_id: str, num_envs: int) -> list[list[Any]]:
    """:func:`plain_actions` of ``env_id``'s action space (the env is made here and closed), for the stock client."""
    probe = gym.make(env_id)
    try:
        return plain_actions(probe.action_space, num_envs)
    finally:
        probe.close()


def plain_actions(space: gym.Space, num_envs: int, rows: int = ACTION_ROWS, seed: int = 0) -> list[list[Any]]:
    """``rows`` rows of ``num_envs`` random actions of ``space``, as JSON-able values."""
    space.seed(seed)
    out = []
    for _ in range(rows):
        row = []
        for _ in range(num_envs):
            value = space.sample()
            row.append(value.tolist() if isinstance(value, np.ndarray) else (int(value) if isinstance(value, np.integer) else value))
        out.append(row)
    return out
