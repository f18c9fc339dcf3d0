"""The asyncio session client against real stock OpenEnv servers and misbehaving peers."""

from __future__ import annotations

import asyncio
import json
import time

import gymnasium as gym
import numpy as np
import pytest

from openenv_gym import (
    CapacityError,
    ConnectError,
    ConnectionLost,
    ProtocolError,
    ServerError,
    Session,
    SessionTimeout,
    Timeouts,
)
from tests.peers import rogue_ws_server, silent_tcp_server, stock_echo
from tests.servers.launch import free_port

GRACE = 1.0  # seconds a failure may take beyond its timeout


def run(coro, timeout: float = 60.0):
    async def bounded():
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def test_stock_server_negotiates_json_and_reproduces_local_cartpole(stock_cartpole_url):
    local = gym.make("CartPole-v1")
    expected, _ = local.reset(seed=7)

    async def main():
        async with await Session.connect(stock_cartpole_url) as session:
            assert session.codec == "json"
            reply = await session.reset(seed=7)
            assert np.array(reply.observation["state"], dtype=np.float32).tobytes() == expected.tobytes()
            for action in (0, 1, 1, 0):
                reply = await session.step({"action": action})
                obs, reward, terminated, truncated, _ = local.step(action)
                assert np.array(reply.observation["state"], dtype=np.float32).tobytes() == obs.tobytes()
                assert reply.reward == reward and reply.done == (terminated or truncated)
                assert reply.observation["truncated"] == truncated and reply.metadata == {}
            state = await session.state()
            assert state["step_count"] == 4

    run(main())


@pytest.mark.parametrize("form", ["{}", "{}/", "{ws}", "{ws}/ws"])
def test_base_url_may_be_http_or_ws_with_or_without_ws_path(stock_cartpole_url, form):
    url = form.format(stock_cartpole_url, ws=stock_cartpole_url.replace("http://", "ws://"))

    async def main():
        async with await Session.connect(url) as session:
            assert session.url.startswith("ws://") and session.url.endswith("/ws")
            assert (await session.reset(seed=1)).done is False

    run(main())


def test_validation_error_raises_server_error_and_session_stays_usable(stock_cartpole_url):
    async def main():
        async with await Session.connect(stock_cartpole_url) as session:
            await session.reset(seed=0)
            with pytest.raises(ServerError) as info:
                await session.step({"action": 7})
            assert info.value.code == "VALIDATION_ERROR"
            assert "action" in str(info.value)
            assert not session.closed
            with pytest.raises(TypeError, match="mapping of the action's fields"):
                await session.step(1)  # (was AttributeError: 'int' object has no attribute 'items')
            assert (await session.step({"action": 1})).reward == 1.0

    run(main())


def test_full_server_raises_capacity_error(stock_cartpole_single_url):
    async def main():
        async with await Session.connect(stock_cartpole_single_url) as first:
            await first.reset(seed=0)
            second = await Session.connect(stock_cartpole_single_url)
            with pytest.raises(CapacityError) as info:
                await second.reset(seed=0)
            assert info.value.code == "CAPACITY_REACHED"
            assert info.value.max_sessions == 1
            assert second.closed
            await second.close()
            assert (await first.step({"action": 0})).reward == 1.0  # the first session is untouched

    run(main())


def test_server_that_never_replies_times_out_within_the_timeout(stock_slow_url):
    async def main():
        session = await Session.connect(stock_slow_url, timeouts=Timeouts(step=0.5))
        await session.reset(seed=0)  # the slow env only sleeps in step
        started = time.monotonic()
        with pytest.raises(SessionTimeout) as info:
            await session.step({"action": 0})
        elapsed = time.monotonic() - started
        assert 0.5 <= elapsed < 0.5 + GRACE
        assert info.value.timeout == 0.5
        # The stream is out of step: the session is closed, never reused.
        assert session.closed
        with pytest.raises(SessionTimeout):
            await session.step({"action": 0})
        await session.close()

    run(main())


@pytest.mark.parametrize(
    "answer, match",
    [
        ("this is not json", "invalid JSON"),
        (json.dumps({"type": "observation"}), "data"),
        (json.dumps({"type": "observation", "data": {"observation": {}, "done": "maybe"}}), "done"),
        (json.dumps({"type": "state", "data": {}}), "expected an observation"),
        (json.dumps([1, 2, 3]), "object"),
    ],
)
def test_malformed_reply_raises_protocol_error_and_closes_the_session(answer, match):
    async def main():
        async with rogue_ws_server(lambda frame, conn: answer) as (url, _):
            session = await Session.connect(url)
            with pytest.raises(ProtocolError, match=match):
                await session.reset()
            assert session.closed
            await session.close()

    run(main())


def test_refused_connection_fails_fast():
    url = f"http://127.0.0.1:{free_port()}"

    async def main():
        started = time.monotonic()
        with pytest.raises(ConnectError) as info:
            await Session.connect(url, timeouts=Timeouts(connect=2.0))
        assert time.monotonic() - started < 2.0
        assert info.value.url.endswith("/ws")

    run(main())


def test_peer_that_never_answers_the_handshake_fails_within_the_connect_timeout():
    async def main():
        async with silent_tcp_server() as url:
            started = time.monotonic()
            with pytest.raises(ConnectError, match="timed out"):
                await Session.connect(url, timeouts=Timeouts(connect=0.5))
            assert 0.5 <= time.monotonic() - started < 0.5 + GRACE

    run(main())


def test_peer_that_hangs_up_raises_connection_lost():
    async def main():
        async with rogue_ws_server(lambda frame, conn: "CLOSE") as (url, _):
            session = await Session.connect(url)
            with pytest.raises(ConnectionLost) as info:
                await session.reset()
            assert info.value.code == 1011 and "hangs up" in info.value.reason
            assert session.closed

    run(main())


def test_headers_are_sent_in_the_handshake_and_msgpack_is_offered():
    async def main():
        async with rogue_ws_server(stock_echo) as (url, headers):
            async with await Session.connect(url, headers={"Authorization": "Bearer s3cret"}) as session:
                assert session.codec == "json"  # this peer selects no subprotocol
                await session.reset()
            assert headers[0]["Authorization"] == "Bearer s3cret"
            assert "openenv.msgpack.v1" in headers[0]["Sec-WebSocket-Protocol"]

    run(main())


def test_close_is_idempotent_and_later_requests_raise(stock_cartpole_url):
    async def main():
        session = await Session.connect(stock_cartpole_url)
        await session.reset()
        await session.close()
        await session.close()
        assert session.closed
        with pytest.raises(ConnectionLost):
            await session.step({"action": 0})

    run(main())


@pytest.mark.parametrize("offer_msgpack", [True, False])
def test_a_cancelled_step_closes_the_session_on_both_paths(offer_msgpack):
    # The server may still run a cancelled request: the session is out of step, on either path.
    from openenv_gym import launch_local

    slow = ["--execution", "thread"]
    with launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 1.0}, extra_args=slow) as (url,):

        async def scenario() -> None:
            session = await Session.connect(url, offer_msgpack=offer_msgpack)
            try:
                await session.reset(seed=0)
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(session.step({"action": 0}), 0.2)
                assert session.closed
                with pytest.raises(ConnectionLost, match="cancelled"):
                    await session.step({"action": 0})
            finally:
                await session.close()

        run(scenario())


def test_stock_requests_carry_text_as_utf_8_and_lone_surrogates_escaped(stock_echo_url):
    async def main():
        async with await Session.connect(stock_echo_url) as session:
            assert session.codec == "json"
            await session.reset()
            reply = await session.step({"message": "café ☕"})
            assert reply.observation["echoed"] == "café ☕" and reply.reward == 6.0
            # (UTF-8 cannot carry a lone surrogate: it goes as \udce9, which the stock server reads;
            # its own reply then fails to serialize it, an error of that step alone)
            with pytest.raises(ServerError, match="surrogates not allowed"):
                await session.step({"message": "caf\udce9"})
            reply = await session.step({"message": "é"})
            assert reply.observation["echoed"] == "é"

    run(main())
