"""The server speaks the stock OpenEnv protocol: GenericEnvClient, plain JSON, HTTP endpoints."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from openenv_gym import Session, launch_local
from tests.clients import run

TIMEOUT = 20.0


@pytest.fixture(scope="module")
def cartpole_url():
    with launch_local("CartPole-v1", max_sessions=8) as urls:
        yield urls[0]


async def _json_ws(url: str):
    return await connect(url.replace("http://", "ws://") + "/ws", proxy=None, compression=None)


async def _ask(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


def _policy(observation: list[float]) -> int:
    return 1 if observation[2] + 0.5 * observation[3] > 0 else 0


def test_generic_env_client_runs_a_full_episode_like_local_gymnasium(cartpole_url):
    from openenv.core.generic_client import GenericEnvClient

    async def episode():
        steps = []
        client = GenericEnvClient(base_url=cartpole_url, connect_timeout_s=10.0, message_timeout_s=TIMEOUT)
        async with client as c:
            result = await c.reset(seed=11)
            steps.append(result)
            while not result.done:
                result = await c.step({"action": _policy(result.observation["observation"])})
                steps.append(result)
            state = await c.state()
        return steps, state

    steps, state = run(episode())

    local = gym.make("CartPole-v1")
    obs, _ = local.reset(seed=11)
    assert steps[0].observation["observation"] == obs.tolist()
    assert steps[0].reward is None and steps[0].done is False
    for result in steps[1:]:
        obs, reward, terminated, truncated, _ = local.step(_policy(obs.tolist()))
        assert result.observation["observation"] == obs.tolist()
        assert result.observation["truncated"] is truncated
        assert result.reward == reward
        assert result.done is (terminated or truncated)
    assert terminated or truncated
    assert state["step_count"] == len(steps) - 1
    assert isinstance(state["episode_id"], str)


def test_plain_json_messages_have_the_stock_shapes(cartpole_url):
    async def talk():
        ws = await _json_ws(cartpole_url)
        assert ws.subprotocol is None
        reset = await _ask(ws, {"type": "reset", "data": {"seed": 5, "episode_id": "ep-1"}})
        step = await _ask(ws, {"type": "step", "data": {"action": 1}})
        state = await _ask(ws, {"type": "state"})
        await ws.send(json.dumps({"type": "close"}))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), TIMEOUT)
        return reset, step, state, closed.value.rcvd

    reset, step, state, close_frame = run(talk())
    local = gym.make("CartPole-v1")
    obs0, _ = local.reset(seed=5)
    obs1, *_ = local.step(1)
    assert reset == {
        "type": "observation",
        "data": {
            "observation": {"observation": obs0.tolist(), "truncated": False, "terminated": False, "metadata": {}},
            "reward": None,
            "done": False,
        },
    }
    assert step["data"]["observation"]["observation"] == obs1.tolist()
    assert step["data"]["reward"] == 1.0 and step["data"]["done"] is False
    assert state == {"type": "state", "data": {"episode_id": "ep-1", "step_count": 1}}
    assert close_frame is not None and close_frame.code == 1000


def test_http_endpoints_answer_like_a_stock_server(cartpole_url):
    with httpx.Client(timeout=TIMEOUT, trust_env=False) as client:
        health = client.get(cartpole_url + "/health")
        schema = client.get(cartpole_url + "/schema")
        metadata = client.get(cartpole_url + "/metadata")
        missing = client.get(cartpole_url + "/reset")
    assert health.status_code == 200 and health.json()["status"] == "healthy"
    assert isinstance(health.json()["active_sessions"], int) and health.json()["max_sessions"] >= 1
    assert health.headers["content-type"] == "application/json"
    body = schema.json()
    assert {"action", "observation", "reset_observation", "state"} <= set(body)
    assert body["action"]["required"] == ["action"]
    assert body["action"]["properties"]["action"] == {"type": "integer", "minimum": 0, "maximum": 1, "title": "Action"}
    field = body["observation"]["properties"]["observation"]
    assert field["type"] == "array" and field["minItems"] == field["maxItems"] == 4
    assert field["items"] == {"type": "number"}  # bounds differ per element: none given
    assert body["observation"]["properties"]["truncated"]["type"] == "boolean"
    assert {"done", "reward", "metadata"} <= set(body["observation"]["properties"])
    assert set(body["state"]["properties"]) == {"episode_id", "step_count"}
    extension = body["x-openenv-gym"]
    assert extension["version"] == 1
    assert (extension["obs_key"], extension["action_key"], extension["truncated_key"]) == (
        "observation",
        "action",
        "truncated",
    )
    assert metadata.json()["name"] == "CartPole-v1"
    assert {"name", "description", "version"} <= set(metadata.json())
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"


def test_full_house_gets_the_stock_capacity_error_and_close_1000():
    from openenv.core.generic_client import GenericEnvClient

    async def talk(url: str):
        first = await _json_ws(url)
        await _ask(first, {"type": "reset", "data": {}})
        second = await _json_ws(url)
        error = json.loads(await asyncio.wait_for(second.recv(), TIMEOUT))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(second.recv(), TIMEOUT)
        client = GenericEnvClient(base_url=url, connect_timeout_s=10.0, message_timeout_s=TIMEOUT)
        with pytest.raises(Exception, match="CAPACITY_REACHED"):
            async with client as c:
                await c.reset()
        await first.close()
        return error, closed.value.rcvd

    with launch_local("CartPole-v1", max_sessions=1) as urls:
        error, close_frame = run(talk(urls[0]))
    assert error == {
        "type": "error",
        "data": {
            "message": "Server at capacity: 1/1 sessions active. Cannot accept new connections.",
            "code": "CAPACITY_REACHED",
            "active_sessions": 1,
            "max_sessions": 1,
        },
    }
    assert close_frame is not None and close_frame.code == 1000


def test_health_reports_free_capacity(cartpole_url):
    """Pools place sessions by the capacity /health reports."""
    from openenv_gym.remote import fetch_health

    async def main():
        before = fetch_health(cartpole_url)["active_sessions"]
        async with await Session.connect(cartpole_url) as session:
            await session.reset(seed=0)
            during = fetch_health(cartpole_url)["active_sessions"]
        return before, during

    before, during = asyncio.run(asyncio.wait_for(main(), TIMEOUT))
    assert during == before + 1
