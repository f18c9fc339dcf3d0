"""Smoke tests of the stock-server test infrastructure itself."""

from __future__ import annotations

import asyncio

import httpx
import pytest

TIMEOUT = 20.0


def _get(url: str, path: str):
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        r = client.get(url + path)
    r.raise_for_status()
    return r.json()


@pytest.mark.parametrize(
    "fixture_name",
    ["stock_cartpole_url", "stock_mixed_url", "stock_cartpole_single_url", "stock_slow_url"],
)
def test_health(request, fixture_name):
    url = request.getfixturevalue(fixture_name)
    assert url.startswith("http://127.0.0.1:")
    assert _get(url, "/health") == {"status": "healthy"}


def test_cartpole_schema(stock_cartpole_url):
    schema = _get(stock_cartpole_url, "/schema")
    obs_props = schema["observation"]["properties"]
    assert obs_props["state"]["type"] == "array"
    assert obs_props["state"]["minItems"] == 4
    assert obs_props["state"]["maxItems"] == 4
    act_props = schema["action"]["properties"]
    assert act_props["action"]["minimum"] == 0
    assert act_props["action"]["maximum"] == 1
    assert "action" in schema["action"]["required"]


def test_mixed_schema(stock_mixed_url):
    schema = _get(stock_mixed_url, "/schema")
    assert schema["action"]["properties"]["command"]["enum"] == ["left", "right", "stay"]
    props = schema["observation"]["properties"]
    assert props["position"]["type"] == "integer"
    assert props["energy"]["type"] == "number"
    assert props["label"]["type"] == "string"
    assert props["velocity"]["minItems"] == 2


def _cartpole_episode(url: str):
    from openenv.core.generic_client import GenericEnvClient

    async def run():
        client = GenericEnvClient(base_url=url, connect_timeout_s=10.0, message_timeout_s=TIMEOUT)
        async with client as c:
            r0 = await asyncio.wait_for(c.reset(seed=3), TIMEOUT)
            r1 = await asyncio.wait_for(c.step({"action": 1}), TIMEOUT)
            st = await asyncio.wait_for(c.state(), TIMEOUT)
        return r0, r1, st

    return asyncio.run(asyncio.wait_for(run(), 3 * TIMEOUT))


def test_cartpole_reset_matches_local_gymnasium(stock_cartpole_url):
    import gymnasium as gym

    r0, r1, st = _cartpole_episode(stock_cartpole_url)

    local = gym.make("CartPole-v1")
    obs0, _ = local.reset(seed=3)
    obs1, reward, terminated, truncated, _ = local.step(1)
    local.close()

    assert r0.observation["state"] == [float(x) for x in obs0]
    assert r0.done is False
    assert r1.observation["state"] == [float(x) for x in obs1]
    assert r1.reward == float(reward) == 1.0
    assert r1.done is bool(terminated or truncated) is False
    assert r1.observation["truncated"] is False
    assert not r1.metadata  # CartPole's info is empty; stock servers then omit metadata
    assert st["step_count"] == 1
    assert isinstance(st["episode_id"], str)


def test_mixed_deterministic_and_validation(stock_mixed_url):
    from openenv.core.generic_client import GenericEnvClient

    async def run():
        out = []
        for _ in range(2):
            async with GenericEnvClient(base_url=stock_mixed_url, message_timeout_s=TIMEOUT) as c:
                traj = [await asyncio.wait_for(c.reset(seed=7), TIMEOUT)]
                for cmd in ["left", "right", "stay"] * 7:  # 21 steps
                    traj.append(await asyncio.wait_for(c.step({"command": cmd}), TIMEOUT))
                with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                    await asyncio.wait_for(c.step({"command": "jump"}), TIMEOUT)
                out.append(traj)
        return out

    a, b = asyncio.run(asyncio.wait_for(run(), 6 * TIMEOUT))
    assert [(r.observation, r.reward, r.done) for r in a] == [(r.observation, r.reward, r.done) for r in b]
    assert [r.done for r in a[:20]] == [False] * 20
    assert a[20].done and a[21].done
    obs = a[5].observation
    assert isinstance(obs["position"], int) and 0 <= obs["position"] <= 10
    assert isinstance(obs["energy"], float) and isinstance(obs["label"], str)
    assert len(obs["velocity"]) == 2


def test_single_server_capacity(stock_cartpole_single_url):
    from openenv.core.generic_client import GenericEnvClient

    async def run():
        async with GenericEnvClient(base_url=stock_cartpole_single_url, message_timeout_s=TIMEOUT) as a:
            await asyncio.wait_for(a.reset(seed=0), TIMEOUT)
            b = GenericEnvClient(base_url=stock_cartpole_single_url, message_timeout_s=TIMEOUT)
            try:
                with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                    await asyncio.wait_for(b.reset(seed=0), TIMEOUT)
            finally:
                await asyncio.wait_for(b.close(), TIMEOUT)

    asyncio.run(asyncio.wait_for(run(), 3 * TIMEOUT))


def test_slow_server_does_not_reply_in_time(stock_slow_url):
    from openenv.core.generic_client import GenericEnvClient

    async def run():
        async with GenericEnvClient(base_url=stock_slow_url, message_timeout_s=TIMEOUT) as c:
            await asyncio.wait_for(c.reset(seed=0), TIMEOUT)  # reset is not slowed
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.step({"action": 0}), 1.0)

    asyncio.run(asyncio.wait_for(run(), 3 * TIMEOUT))


def test_a_stalled_server_is_asked_whether_it_answers_again_by_a_probe_of_either_kind(stock_cartpole_url, fast_cartpole_urls):
    # The pool puts a stalled server aside until a probe gets an answer: a stock server is asked
    # with a new connection (closed again), an openenv_gym server with an empty state request.
    from openenv_gym.config import Limits, Timeouts
    from openenv_gym.vector.links import FastLink, StockLink, connect_link
    from tests.peers import silent_tcp_server

    options = dict(headers=None, timeouts=Timeouts(connect=2.0, step=2.0), limits=Limits())

    async def probes():
        stock = await connect_link(stock_cartpole_url, **options)
        fast = await connect_link(fast_cartpole_urls[0], **options)
        try:
            assert isinstance(stock, StockLink) and isinstance(fast, FastLink)
            answers = [await stock.probe(2.0), await fast.probe(2.0)]
            async with silent_tcp_server() as silent:
                quiet = StockLink(silent, **options)
                answers.append(await quiet.probe(0.3))
            return answers
        finally:
            await stock.close()
            await fast.close()

    assert asyncio.run(asyncio.wait_for(probes(), 30)) == [True, True, False]
    assert _get(stock_cartpole_url, "/health") == {"status": "healthy"}
