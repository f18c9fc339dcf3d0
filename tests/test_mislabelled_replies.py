"""A fast-path reply is put on the envs of its own request only: one that names other sessions fails its envs (chaos tier).

A relay between the pool and a real server rewrites the server's replies as a
buggy or hostile middle could: sessions and columns reversed together, session
ids the connection never opened, the ids of two replies in flight swapped. The
counts stay right in each, which is all the pool once checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import openenv_gym
from openenv_gym import OpenEnvVectorEnv
from tests.relay import Relay

pytestmark = pytest.mark.chaos


@pytest.fixture(scope="module")
def cartpole_url():
    with openenv_gym.launch_local("CartPole-v1", max_sessions=16) as (url,):
        yield url


def _reversed(message: dict[str, Any]) -> dict[str, Any]:
    """A batch reply with its sessions and every column in reverse order (each env's row on another's session)."""
    out = dict(message)
    out["sessions"] = list(reversed(message["sessions"]))
    out["observation"] = {name: column[::-1] for name, column in message["observation"].items()}
    for key in ("reward", "done"):
        out[key] = message[key][::-1]
    if message.get("metadata") is not None:
        out["metadata"] = list(reversed(message["metadata"]))
    return out


def _errors(infos: dict[str, Any]) -> list[str]:
    mask = infos.get("_openenv_error", np.zeros(0, bool))
    return [str(infos["openenv_error"]["type"][i]) for i in np.flatnonzero(mask)]


def test_a_step_reply_with_sessions_and_columns_reversed_truncates_its_envs_and_gives_none_another_s_data(cartpole_url):
    def rewrite(message: dict[str, Any], kind: str | None) -> list[dict[str, Any]]:
        return [_reversed(message) if kind == "step" and message.get("type") == "batch" else message]

    with Relay(cartpole_url, rewrite) as relay, OpenEnvVectorEnv(relay.url, 4) as envs:
        first, _ = envs.reset(seed=[0, 1, 2, 3])  # (resets pass as they are)
        assert len({tuple(row) for row in first.tolist()}) == 4
        envs.send(np.array([0, 1, 0, 1]))  # (send/recv: msgpack batches, never a raw lane)
        obs, reward, terminated, truncated, infos = envs.recv()
        assert truncated.all() and not terminated.any() and (reward == 0).all()
        assert _errors(infos) == ["ProtocolError"] * 4
        assert np.array_equal(obs, first)  # each env's own last observation, not another's


def test_a_reply_naming_sessions_the_connection_never_opened_fails_its_envs(cartpole_url):
    def rewrite(message: dict[str, Any], kind: str | None) -> list[dict[str, Any]]:
        if kind == "step" and message.get("type") == "batch":
            message = {**message, "sessions": [s + 1000 for s in message["sessions"]]}
        return [message]

    with Relay(cartpole_url, rewrite) as relay, OpenEnvVectorEnv(relay.url, 4) as envs:
        envs.reset(seed=0)
        envs.send(np.zeros(4, dtype=np.int64))
        *_, truncated, infos = envs.recv()
        assert truncated.all() and _errors(infos) == ["ProtocolError"] * 4


def test_two_replies_in_flight_with_their_ids_swapped_put_no_result_on_the_wrong_envs(cartpole_url):
    # send/recv in two requests of 2 envs: the relay holds the first step reply and sends both with their ids swapped.
    held: list[dict[str, Any]] = []

    def rewrite(message: dict[str, Any], kind: str | None) -> list[dict[str, Any]]:
        if kind != "step" or message.get("type") != "batch":
            return [message]
        held.append(message)
        if len(held) < 2:
            return []
        a, b = held
        held.clear()
        return [{**a, "id": b["id"]}, {**b, "id": a["id"]}]

    with Relay(cartpole_url, rewrite) as relay, OpenEnvVectorEnv(relay.url, 4, batch_size=2) as envs:
        envs.reset(seed=[0, 1, 2, 3])
        for _ in range(5):
            envs.send(np.zeros(2, dtype=np.int64), [0, 1])
            envs.send(np.ones(2, dtype=np.int64), [2, 3])
            for _ in range(2):
                obs, reward, terminated, truncated, infos = envs.recv()
                assert truncated.all() and (reward == 0).all() and _errors(infos) == ["ProtocolError"] * 2
        assert len(held) == 0
