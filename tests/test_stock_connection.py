"""StockConnection: one stock OpenEnv session on websockets' Sans-I/O protocol, real servers and sockets."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from openenv_gym.client.fast_connection import FastConnection, SubprotocolNotSelected
from openenv_gym.client.stock_connection import StockConnection
from openenv_gym.config import Limits, Timeouts
from openenv_gym.errors import CapacityError, ConnectionLost, OpenEnvGymError, ProtocolError, SessionTimeout
from openenv_gym.protocol.messages import ErrorReply, StateReply, StepReply, reset_request, state_request, step_request
from tests.peers import OBSERVATION, rogue_ws_server

GRACE = 1.0  # seconds a failure may take beyond its timeout
TIMEOUTS = Timeouts(connect=10.0, step=10.0)


def run(coro: Any, timeout: float = 60.0) -> Any:
    async def bounded():
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


class Replies:
    """A reply callback that records every call and lets a test await them."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self._event = asyncio.Event()

    def __call__(self, result: Any) -> None:
        self.calls.append(result)
        self._event.set()

    async def wait(self, count: int) -> list[Any]:
        while len(self.calls) < count:
            self._event.clear()
            await self._event.wait()
        return self.calls


def test_each_request_gets_exactly_one_callback_with_its_reply(stock_cartpole_url):
    async def talk():
        conn = await StockConnection.connect(stock_cartpole_url, timeouts=TIMEOUTS)
        replies = Replies()
        conn.send_request(reset_request(seed=3), replies)
        await replies.wait(1)
        for n in range(2, 7):
            conn.send_request(step_request({"action": n % 2}), replies)
            await replies.wait(n)
        conn.send_request(state_request(), replies)
        await replies.wait(7)
        await conn.close()
        await asyncio.sleep(0)  # any stray second call would have run by now
        return replies.calls, conn.closed

    calls, closed = run(talk())
    assert len(calls) == 7
    assert all(isinstance(c, StepReply) for c in calls[:6])
    assert calls[1].reward == 1.0
    assert isinstance(calls[6], StateReply) and calls[6].data["step_count"] == 5
    assert closed


def test_only_one_request_may_be_in_flight(stock_cartpole_url):
    async def talk():
        async with asyncio.timeout(30):
            conn = await StockConnection.connect(stock_cartpole_url, timeouts=TIMEOUTS)
            replies = Replies()
            conn.send_request(reset_request(), replies)
            with pytest.raises(RuntimeError, match="in flight"):
                conn.send_request(step_request({"action": 0}), replies)
            await replies.wait(1)
            await conn.close()
            return replies.calls

    (reply,) = run(talk())
    assert isinstance(reply, StepReply)


def test_a_request_without_reply_times_out_within_the_bound_and_aborts(stock_slow_url):
    async def talk():
        conn = await StockConnection.connect(stock_slow_url, timeouts=TIMEOUTS)
        await conn.request(reset_request(seed=0))  # the slow env only sleeps in step
        replies = Replies()
        started = time.monotonic()
        conn.send_request(step_request({"action": 0}), replies, timeout=0.5)
        await replies.wait(1)
        elapsed = time.monotonic() - started
        await conn.wait_closed()  # aborted: the socket is dropped, no closing handshake
        with pytest.raises(SessionTimeout) as later:
            conn.send_request(step_request({"action": 0}), replies)
        return replies.calls, elapsed, conn.closed, later.value

    (error,), elapsed, closed, later = run(talk())
    assert isinstance(error, SessionTimeout) and error.timeout == 0.5
    assert 0.5 <= elapsed < 0.5 + GRACE
    assert closed and later is error


def test_a_silent_peer_times_out_within_the_bound():
    async def talk():
        async with rogue_ws_server(lambda frame, conn: None) as (url, _):
            conn = await StockConnection.connect(url, timeouts=Timeouts(step=0.3))
            started = time.monotonic()
            with pytest.raises(SessionTimeout):
                await conn.request(reset_request())
            return time.monotonic() - started, conn.closed

    elapsed, closed = run(talk())
    assert 0.3 <= elapsed < 0.3 + GRACE and closed


def test_a_full_server_refuses_the_first_request_with_capacity_error(stock_cartpole_single_url):
    async def talk():
        first = await StockConnection.connect(stock_cartpole_single_url, timeouts=TIMEOUTS)
        await first.request(reset_request(seed=0))
        second = await StockConnection.connect(stock_cartpole_single_url, timeouts=TIMEOUTS)
        await second.wait_closed()  # the refusal came unasked, then the server closed
        reply = await second.request(reset_request(seed=0))
        with pytest.raises(ConnectionLost) as after:
            await second.request(reset_request(seed=0))
        still = await first.request(step_request({"action": 0}))
        await first.close()
        return reply, after.value, still

    reply, after, still = run(talk())
    assert isinstance(reply, ErrorReply) and reply.code == "CAPACITY_REACHED"
    error = reply.exception()
    assert isinstance(error, CapacityError) and error.max_sessions == 1
    assert after.code == 1000
    assert isinstance(still, StepReply) and still.reward == 1.0  # the first session is untouched


def test_the_refusal_survives_the_handover_from_a_fast_connection_attempt(stock_cartpole_single_url):
    async def talk():
        first = await StockConnection.connect(stock_cartpole_single_url, timeouts=TIMEOUTS)
        await first.request(reset_request(seed=0))
        with pytest.raises(SubprotocolNotSelected) as info:
            await FastConnection.connect(stock_cartpole_single_url, timeouts=TIMEOUTS)
        second = StockConnection(info.value.transport, timeouts=TIMEOUTS, limits=Limits())
        reply = await second.request(reset_request(seed=0))
        await second.close()
        await first.close()
        return reply

    reply = run(talk())
    assert isinstance(reply, ErrorReply) and reply.code == "CAPACITY_REACHED"


@pytest.mark.parametrize(
    "answer, match",
    [
        ("this is not json", "invalid JSON"),
        (json.dumps({"type": "observation"}), "data"),
        (json.dumps([1, 2, 3]), "object"),
    ],
)
def test_a_malformed_reply_is_a_protocol_error_and_aborts(answer, match):
    async def talk():
        async with rogue_ws_server(lambda frame, conn: answer) as (url, _):
            conn = await StockConnection.connect(url, timeouts=TIMEOUTS)
            replies = Replies()
            conn.send_request(reset_request(), replies)
            (error,) = await replies.wait(1)
            await conn.wait_closed()
            return error, conn.closed

    error, closed = run(talk())
    assert isinstance(error, ProtocolError) and match in str(error) and closed


def test_a_reply_with_nothing_in_flight_is_a_protocol_error():
    async def twice(conn: ServerConnection) -> None:
        async for _ in conn:
            await conn.send(json.dumps(OBSERVATION))
            await conn.send(json.dumps(OBSERVATION))

    async def talk():
        async with serve(twice, "127.0.0.1", 0, compression=None) as server:
            port = server.sockets[0].getsockname()[1]
            conn = await StockConnection.connect(f"http://127.0.0.1:{port}", timeouts=TIMEOUTS)
            reply = await conn.request(reset_request())
            await conn.wait_closed()
            with pytest.raises(ProtocolError, match="no request in flight") as later:
                await conn.request(reset_request())
            return reply, later.value

    reply, _ = run(talk())
    assert isinstance(reply, StepReply)


def test_a_peer_that_closes_fails_the_request_with_its_close_code():
    async def talk():
        async with rogue_ws_server(lambda frame, conn: "CLOSE") as (url, _):
            conn = await StockConnection.connect(url, timeouts=TIMEOUTS)
            replies = Replies()
            conn.send_request(reset_request(), replies)
            (error,) = await replies.wait(1)
            with pytest.raises(ConnectionLost):
                conn.send_request(reset_request(), replies)
            await conn.close()
            return error, len(replies.calls)

    error, calls = run(talk())
    assert isinstance(error, ConnectionLost) and error.code == 1011 and "hangs up" in error.reason
    assert calls == 1


def test_a_cancelled_request_aborts_the_connection(stock_slow_url):
    async def talk():
        conn = await StockConnection.connect(stock_slow_url, timeouts=TIMEOUTS)
        await conn.request(reset_request(seed=0))
        waiter = asyncio.ensure_future(conn.request(step_request({"action": 0})))
        await asyncio.sleep(0)  # let the request go out
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await conn.wait_closed()
        with pytest.raises(ConnectionLost, match="cancelled"):
            await conn.request(reset_request())

    run(talk())


def test_close_ends_the_session_and_is_idempotent(stock_cartpole_url):
    async def talk():
        conn = await StockConnection.connect(stock_cartpole_url, timeouts=TIMEOUTS)
        await conn.request(reset_request())
        started = time.monotonic()
        await conn.close()
        await conn.close()
        with pytest.raises(OpenEnvGymError):
            conn.send_request(reset_request(), lambda _: None)
        return time.monotonic() - started

    assert run(talk()) < TIMEOUTS.close  # the server closed at once, no timeout waited out
