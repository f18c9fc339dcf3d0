"""An OpenEnv Environment subclass, hosted by openenv_gym.server, on both paths."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from openenv_gym import launch_local
from openenv_gym.client import Session
from openenv_gym.errors import ServerError
from tests.clients import run
from tests.servers.launch import forked_launch

TIMEOUT = 20.0
MIXED = "tests.servers.stock_envs:MixedEnvironment"


@pytest.fixture(scope="module")
def mixed_url():
    with launch_local(MIXED, max_sessions=4) as urls:
        yield urls[0]


def _local_episode(seed: int, commands: list[str]):
    from tests.servers.stock_envs import MixedAction, MixedEnvironment

    env = MixedEnvironment()
    out = [env.reset(seed=seed)]
    out += [env.step(MixedAction(command=c)) for c in commands]
    return [o.model_dump(exclude={"reward", "done", "metadata"}) for o in out], out


COMMANDS = ["left", "right", "right", "stay"]


def test_generic_env_client_drives_an_openenv_environment(mixed_url):
    from openenv.core.generic_client import GenericEnvClient

    async def episode():
        client = GenericEnvClient(base_url=mixed_url, connect_timeout_s=10.0, message_timeout_s=TIMEOUT)
        async with client as c:
            results = [await c.reset(seed=4)]
            results += [await c.step({"command": cmd}) for cmd in COMMANDS]
            state = await c.state()
        return results, state

    results, state = run(episode())
    fields, local = _local_episode(4, COMMANDS)
    for result, expected, obs in zip(results, fields, local):
        assert {k: v for k, v in result.observation.items() if k != "metadata"} == expected
        assert result.reward == obs.reward and result.done == obs.done
    assert results[-1].metadata == {"step": len(COMMANDS)}
    assert state["step_count"] == len(COMMANDS)


def test_the_fast_path_serves_an_openenv_environment(mixed_url):
    async def episode():
        async with await Session.connect(mixed_url) as session:
            results = [await session.reset(seed=4)]
            results += [await session.step({"command": cmd}) for cmd in COMMANDS]
            with pytest.raises(ServerError) as invalid:
                await session.step({"command": "jump"})
            after = await session.step({"command": "stay"})
        return session.codec, results, invalid.value, after

    codec, results, invalid, after = run(episode())
    assert codec == "msgpack"
    fields, local = _local_episode(4, COMMANDS)
    for result, expected, obs in zip(results, fields, local):
        assert result.observation == expected
        assert result.reward == obs.reward and result.done == obs.done
    assert invalid.code == "VALIDATION_ERROR"
    assert invalid.data["errors"][0]["loc"] == ["command"]
    assert after.observation["label"] == f"stay-{len(COMMANDS) + 1}"


def test_schema_and_metadata_are_the_openenv_models(mixed_url):
    with httpx.Client(timeout=TIMEOUT, trust_env=False) as client:
        schema = client.get(mixed_url + "/schema").json()
        metadata = client.get(mixed_url + "/metadata").json()
    assert schema["action"]["properties"]["command"]["enum"] == ["left", "right", "stay"]
    assert {"position", "energy", "label", "velocity"} <= set(schema["observation"]["properties"])
    assert "x-openenv-gym" not in schema
    assert metadata["name"] == "MixedEnvironment"


def test_the_pool_reports_a_step_without_reward_as_zero_not_nan():
    import numpy as np

    from openenv_gym import OpenEnvVectorEnv

    with forked_launch("tests.servers.stock_envs:SilentMixedEnvironment", max_sessions=4) as urls:
        with OpenEnvVectorEnv(urls, 2) as envs:
            envs.reset(seed=0)
            for _ in range(3):
                _, rewards, *_ = envs.step(envs.action_space.sample())
                assert rewards.tolist() == [0.0, 0.0]
                assert rewards.dtype == np.float64


def test_an_action_of_bytes_that_are_not_utf8_fails_only_its_session(mixed_url):
    from websockets.asyncio.client import connect

    from openenv_gym.protocol import multiplex as fastp
    from openenv_gym.protocol.codec import MsgpackCodec

    codec = MsgpackCodec()

    async def talk() -> list[dict]:
        ws_url = mixed_url.replace("http://", "ws://") + "/ws"
        async with connect(ws_url, subprotocols=[fastp.SUBPROTOCOL], proxy=None, compression=None) as ws:
            replies = []
            for request in (
                fastp.open_request(1, 3),
                fastp.reset_batch_request(2, [0, 1, 2]),
                fastp.step_batch_request(3, [0, 1, 2], {"command": ["left", b"\xff\xfe", "stay"]}),
            ):
                await ws.send(codec.encode(request))
                replies.append(codec.decode(await asyncio.wait_for(ws.recv(), TIMEOUT)))
            return replies

    *_, step = run(talk())
    assert step["type"] == "batch", step
    errors = step["errors"]
    assert errors[0] is None and errors[2] is None
    assert errors[1]["code"] == "VALIDATION_ERROR" and errors[1]["errors"][0]["loc"] == ["command"]


def test_a_model_the_env_builds_from_our_input_that_refuses_it_is_a_validation_error(mixed_url):
    # As the stock server: reset(episode_id=5) makes the env build State(episode_id=5), which pydantic refuses.
    import json

    from websockets.asyncio.client import connect

    async def talk() -> tuple[dict, dict]:
        ws_url = mixed_url.replace("http://", "ws://") + "/ws"
        async with connect(ws_url, proxy=None, compression=None) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {"episode_id": 5}}))
            refused = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
            await ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
            return refused, json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))

    refused, after = run(talk())
    assert refused["type"] == "error" and refused["data"]["code"] == "VALIDATION_ERROR"
    assert refused["data"]["errors"][0]["loc"] == ["episode_id"]
    assert after["type"] == "observation"  # the session goes on


def test_observations_and_state_are_json_values_as_the_stock_server_sends_them():
    import datetime
    import enum

    from openenv.core.env_server.types import Observation

    from openenv_gym.server.hosting.openenv_host import _json_fields

    class Color(str, enum.Enum):
        RED = "red"

    class Shown(Observation):
        color: Color
        when: datetime.datetime

    fields = _json_fields(Shown(color=Color.RED, when=datetime.datetime(2024, 1, 2, 3, 4, 5)), exclude={"reward", "done"})
    assert fields["color"] == "red" and fields["when"] == "2024-01-02T03:04:05"


MCP_CLASSES = [
    "--action-class",
    "openenv.core.env_server.mcp_types:CallToolAction",
    "--observation-class",
    "openenv.core.env_server.mcp_types:CallToolObservation",
]


async def _mcp_steps(url: str) -> list[Any]:
    from openenv.core.generic_client import GenericEnvClient

    steps = []
    async with GenericEnvClient(base_url=url, connect_timeout_s=10.0, message_timeout_s=TIMEOUT) as client:
        await client.reset(seed=0)
        for action in (
            {"type": "list_tools"},  # MCP's ListToolsAction: not the env's action class, routed as stock does
            {"type": "call_tool", "tool_name": "add", "arguments": {"a": 2, "b": 3}},
            {"tool_name": "add", "arguments": {"a": 40, "b": 2}},
            {"type": "call_tool", "tool_name": "opened", "arguments": {}},
        ):
            result = await client.step(action)
            steps.append((result.observation, result.reward, result.done))
    return steps


def test_an_mcp_environment_takes_mcp_actions_as_on_the_stock_server(stock_mcp_url):
    with forked_launch("tests.servers.stock_envs:CalcEnvironment", max_sessions=2, extra_args=MCP_CLASSES) as (url,):
        ours = run(_mcp_steps(url))
    stock = run(_mcp_steps(stock_mcp_url))
    assert sorted(tool["name"] for tool in ours[0][0]["tools"]) == ["add", "opened"]
    assert ours[1][0]["result"]["structured_content"] == {"result": 5}
    assert ours[2][0]["result"]["structured_content"] == {"result": 42}
    # The env's MCP session is held open for the whole session, as the stock server holds it:
    # its tool calls do not open one each.
    assert ours[3][0]["result"]["structured_content"] == {"result": 1}
    assert ours == stock


def test_an_action_whose_reading_fails_otherwise_costs_only_its_own_step():
    import numpy as np

    from openenv_gym import OpenEnvEnv, OpenEnvVectorEnv, ServerError

    trap = ["--action-class", "tests.servers.stock_envs:TrapAction"]
    with forked_launch("tests.servers.stock_envs:TrapEnvironment", max_sessions=4, extra_args=trap) as urls:
        with OpenEnvVectorEnv(urls, 2) as envs:  # the fast path: one request for both sessions
            envs.reset(seed=0)
            actions = {"command": np.array([1, 1]), "note": ("boom", "fine")}
            _, rewards, _, truncations, infos = envs.step(actions)
            assert truncations.tolist() == [True, False]
            assert "validator failed" in infos["openenv_error"]["message"][0]
            assert infos["_openenv_error"].tolist() == [True, False]
            _, _, _, truncations, infos = envs.step({"command": np.array([1, 1]), "note": ("fine", "fine")})
            assert "openenv_error" not in infos  # both go on
        with OpenEnvEnv(urls[0], offer_msgpack=False) as env:  # the stock JSON path
            env.reset(seed=0)
            with pytest.raises(ServerError, match="validator failed"):
                env.step({"command": 1, "note": "boom"})
            assert env.step({"command": 1, "note": "fine"})[0] is not None  # the session goes on


def test_an_int_beyond_int64_costs_only_its_own_env_on_the_fast_path():
    # Before, the server stacked the sessions' ints into one int64 column: 2**63 raised there, and
    # the whole frame was an EXECUTION_ERROR (every env of the server truncated). 2**70, beyond
    # msgpack, would have failed the reply's encoding the same way.
    import numpy as np

    from openenv_gym import OpenEnvEnv, OpenEnvVectorEnv
    from openenv_gym.spaces import SpaceMappingError

    with forked_launch("tests.servers.stock_envs:BigIntEnvironment", max_sessions=8) as (url,):
        with OpenEnvVectorEnv(url, 3) as envs:
            envs.reset(seed=0)
            obs, rewards, _, truncations, infos = envs.step(np.array([0, 1, 2]))
            assert truncations.tolist() == [False, True, True], infos
            assert obs[0] == 5 and rewards[0] == 1.0
            assert infos["_openenv_error"].tolist() == [False, True, True]
            assert all("count" in m for m in infos["openenv_error"]["message"][1:])
        for offer_msgpack in (True, False):  # the same answer on both codecs
            with OpenEnvEnv(url, offer_msgpack=offer_msgpack) as env:
                env.reset(seed=0)
                for which in (1, 2):
                    with pytest.raises(SpaceMappingError, match="count"):
                        env.step(which)
                    env.reset(seed=0)
                assert env.step(0)[0] == 5


@pytest.mark.parametrize("execution", [None, "thread"], ids=["default", "explicit-thread"])
def test_an_openenv_environment_runs_each_session_on_a_thread_of_its_own(execution):
    # As OpenEnv's own server does. Before, calls ran inline on the event loop (asyncio.run in a
    # step failed there) and then, once slow, in a shared pool (the sqlite3 connection made with the
    # env refused other threads). An explicit --execution still wins.
    import numpy as np

    from openenv_gym import OpenEnvEnv, OpenEnvVectorEnv
    from openenv_gym.errors import ServerError

    extra = [] if execution is None else ["--execution", execution]
    with forked_launch("tests.servers.stock_envs:ThreadBoundEnvironment", max_sessions=8, extra_args=extra) as (url,):
        if execution == "thread":
            with OpenEnvEnv(url) as env:  # the pool's threads: not the one that made the env
                with pytest.raises(ServerError, match="same thread"):
                    env.reset(seed=0)
            return
        for offer_msgpack in (True, False):
            with OpenEnvEnv(url, offer_msgpack=offer_msgpack) as env:
                obs, _ = env.reset(seed=0)
                assert obs["same_thread"] and obs["steps"] == 0
                for n in range(1, 4):  # a slow step (60 ms) among fast ones
                    obs = env.step(60 if n == 2 else 0)[0]  # (the action space: Discrete(101), pause_ms)
                    assert obs["same_thread"] and obs["steps"] == n
        with OpenEnvVectorEnv(url, 4) as envs:
            obs, _ = envs.reset(seed=0)
            for n in range(1, 4):
                obs, _, _, truncations, infos = envs.step(np.array([0, 20, 0, 60]))
                assert not truncations.any(), infos
                assert obs["same_thread"].all() and (obs["steps"] == n).all()


def test_a_refused_action_is_answered_as_the_stock_server_answers_it(mixed_url, stock_mixed_url):
    # The same raw messages to OpenEnv's own server and to ours: the same VALIDATION_ERROR, its
    # pydantic `errors` entries included (each with its documentation "url", as stock sends them).
    import json

    import websockets.sync.client as ws_client

    def replies(url: str) -> list[dict]:
        out = []
        with ws_client.connect(url.replace("http", "ws", 1) + "/ws", open_timeout=TIMEOUT) as ws:
            for message in (
                {"type": "reset", "data": {"seed": 1}},
                {"type": "step", "data": {"command": "jump"}},
                {"type": "step", "data": {}},
            ):
                ws.send(json.dumps(message))
                out.append(json.loads(ws.recv(timeout=TIMEOUT)))
        return out[1:]

    ours, theirs = replies(mixed_url), replies(stock_mixed_url)
    assert [r["data"]["code"] for r in theirs] == ["VALIDATION_ERROR"] * 2
    assert all("url" in e for r in theirs for e in r["data"]["errors"])
    assert [r["data"]["errors"] for r in ours] == [r["data"]["errors"] for r in theirs]


def test_an_awaited_env_s_sessions_come_back_as_they_finish_under_send_recv():
    """``step_async`` envs get partial replies too: two envs awaiting 2 s do not hold back the two that do not.

    Before, a partial request of awaited calls was answered in one reply, when the last call ended: the
    first ``recv`` of 2 envs waited 2 s for the slow ones (here: ``SessionTimeout`` after 1.5 s).
    """
    import numpy as np

    from openenv_gym import OpenEnvVectorEnv
    from tests.servers.stock_envs import AWAITED_PAUSE_SECONDS

    with forked_launch("tests.servers.stock_envs:AwaitedCartPoleEnvironment", max_sessions=4) as (url,):
        with OpenEnvVectorEnv(url, 4, batch_size=2) as envs:
            envs.reset(seed=0)
            envs.send(np.array([1, 0, 1, 0]))  # (one frame: envs 0 and 2 await, 1 and 3 do not)
            _, rewards, _, truncated, infos = envs.recv(timeout=AWAITED_PAUSE_SECONDS * 0.75)
            assert sorted(infos["env_id"].tolist()) == [1, 3]
            assert rewards.tolist() == [1.0, 1.0] and not truncated.any()
            _, rewards, _, truncated, infos = envs.recv(timeout=30)
            assert sorted(infos["env_id"].tolist()) == [0, 2]
            assert rewards.tolist() == [1.0, 1.0] and not truncated.any()
