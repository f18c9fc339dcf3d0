"""FastConnection on websockets' Sans-I/O protocol: real servers and sockets on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from typing import Any, AsyncIterator

import httpx
import numpy as np
import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.server import ServerProtocol

from openenv_gym import launch_local
from openenv_gym.client import Session
from openenv_gym.client.fast_connection import FastConnection, SubprotocolNotSelected
from openenv_gym.config import Limits, Timeouts
from openenv_gym.errors import ConnectError, ConnectionLost, OpenEnvGymError, SessionTimeout
from openenv_gym.launch import ServerProcess
from openenv_gym.protocol import multiplex as fastp
from openenv_gym.protocol.codec import MsgpackCodec
from tests.peers import rogue_ws_server, silent_tcp_server
from tests.servers.launch import free_port

TIMEOUT = 30.0
TIMEOUTS = Timeouts(connect=10.0, step=10.0)


def run(coro: Any) -> Any:
    async def bounded():
        async with asyncio.timeout(TIMEOUT):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture(scope="module")
def cartpole_url():
    with launch_local("CartPole-v1", max_sessions=16) as urls:
        yield urls[0]


@pytest.fixture(scope="module")
def slow_url():
    """Slow-v0: every step sleeps 0.5 s."""
    with launch_local("tests.servers.gym_envs:Slow-v0", max_sessions=8, env_kwargs={"delay": 0.5}) as urls:
        yield urls[0]


@pytest.fixture(scope="module")
def pinging_url():
    """A server that pings every 0.2 s and gives up after 0.2 s without a pong."""
    with launch_local("CartPole-v1", max_sessions=4, extra_args=["--ping-interval", "0.2", "--ping-timeout", "0.2"]) as urls:
        yield urls[0]


class Replies:
    """A ReplyCallback that records every call and wakes a waiter on each."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self._event = asyncio.Event()

    def __call__(self, result: Any) -> None:
        self.calls.append(result)
        self._event.set()

    async def wait(self, count: int = 1) -> list[Any]:
        while len(self.calls) < count:
            self._event.clear()
            await self._event.wait()
        return self.calls


@contextlib.asynccontextmanager
async def fast_peer(on_message) -> AsyncIterator[str]:
    """A WebSocket peer that selects the fast subprotocol and calls ``await on_message(frame, conn)``."""

    async def handler(conn: ServerConnection) -> None:
        async for frame in conn:
            if await on_message(frame, conn) == "STOP":
                return

    async with serve(handler, "127.0.0.1", 0, subprotocols=[fastp.SUBPROTOCOL], compression=None) as server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@contextlib.asynccontextmanager
async def deaf_fast_peer() -> AsyncIterator[str]:
    """Completes the fast-path handshake, then never reads or answers again (no pongs)."""
    held: list[asyncio.StreamWriter] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        protocol = ServerProtocol(subprotocols=[fastp.SUBPROTOCOL])
        while data := await reader.read(4096):
            protocol.receive_data(data)
            events = protocol.events_received()
            if events:  # the handshake request: accept it, then go deaf
                protocol.send_response(protocol.accept(events[0]))
                writer.write(b"".join(protocol.data_to_send()))
                return

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def _step(sessions: list[int], actions: list[int]):
    return lambda rid: fastp.step_batch_request(rid, sessions, {"action": np.asarray(actions, dtype=np.int64)})


def _reset(sessions: list[int], seeds: list[int | None]):
    return lambda rid: fastp.reset_batch_request(rid, sessions, seeds)


# ------------------------------------------------------------ round trips


def test_connect_open_reset_and_step_with_request(cartpole_url):
    async def talk():
        conn = await FastConnection.connect(cartpole_url, timeouts=TIMEOUTS)
        try:
            sessions = await conn.open_sessions(2)
            reset = await conn.request(_reset(sessions, [1, 2]))
            step = await conn.request(_step(sessions, [0, 1]))
            return conn.url, conn.closed, sessions, reset, step
        finally:
            await conn.close()

    url, closed, sessions, reset, step = run(talk())
    assert url.endswith("/ws") and not closed and len(set(sessions)) == 2
    for reply in (reset, step):
        assert isinstance(reply, fastp.BatchReply) and reply.sessions == sessions
        assert reply.observation["observation"].shape == (2, 4)
    assert np.all(np.isnan(reset.reward)) and np.all(step.reward == 1.0)


def test_send_request_calls_back_once_with_the_reply(cartpole_url):
    async def talk():
        conn = await FastConnection.connect(cartpole_url, timeouts=TIMEOUTS)
        try:
            sessions = await conn.open_sessions(1)
            replies = Replies()
            rid = conn.send_request(_reset(sessions, [7]), replies, 5.0)
            await replies.wait(1)
            # Another round trip on the connection: the first callback is not called again.
            await conn.request(_step(sessions, [1]))
            return rid, replies.calls
        finally:
            await conn.close()

    rid, calls = run(talk())
    assert len(calls) == 1
    assert isinstance(calls[0], fastp.BatchReply) and calls[0].id == rid


def test_requests_in_flight_are_answered_by_id(cartpole_url):
    async def talk():
        conn = await FastConnection.connect(cartpole_url, timeouts=TIMEOUTS)
        try:
            sessions = await conn.open_sessions(4)
            await conn.request(_reset(sessions, [0, 1, 2, 3]))
            replies = Replies()
            sent = {conn.send_request(_step([s], [i % 2]), replies, 5.0): s for i, s in enumerate(sessions)}
            awaited = await asyncio.gather(*(conn.request(_step([s], [1])) for s in sessions))
            await replies.wait(len(sessions))
            return sessions, sent, replies.calls, awaited
        finally:
            await conn.close()

    sessions, sent, calls, awaited = run(talk())
    assert len(calls) == len(sessions) and len(set(sent)) == len(sessions)
    for reply in calls:
        assert reply.sessions == [sent[reply.id]]
    assert [reply.sessions for reply in awaited] == [[s] for s in sessions]


# ------------------------------------------------------------ timeouts


def test_a_timed_out_request_drops_the_late_reply_and_the_connection_goes_on(slow_url, caplog):
    caplog.set_level(logging.DEBUG, logger="openenv_gym.client.fast_connection")

    async def talk():
        conn = await FastConnection.connect(slow_url, timeouts=TIMEOUTS)
        try:
            (sid,) = await conn.open_sessions(1)
            await conn.request(_reset([sid], [None]))
            with pytest.raises(SessionTimeout) as timed_out:
                await conn.request(_step([sid], [0]), timeout=0.1)
            replies = Replies()
            rid = conn.send_request(_step([sid], [1]), replies, 0.1)
            await replies.wait(1)
            # The session's next request is answered after both late replies.
            state = await conn.request(lambda r: fastp.state_batch_request(r, [sid]))
            await asyncio.sleep(0)
            return timed_out.value, rid, replies.calls, state, conn.closed
        finally:
            await conn.close()

    error, rid, calls, state, closed = run(talk())
    assert error.timeout == 0.1 and "no reply" in str(error)
    assert len(calls) == 1 and isinstance(calls[0], SessionTimeout)
    assert isinstance(state, fastp.StatesReply) and not closed
    dropped = [r.getMessage() for r in caplog.records if "dropping reply" in r.getMessage()]
    assert len(dropped) == 2 and any(f"request {rid} " in m for m in dropped)


def test_a_short_deadline_after_a_long_one_expires_first(slow_url):
    # One timer serves all of a connection's requests: it must be re-armed for an earlier deadline.
    async def talk():
        conn = await FastConnection.connect(slow_url, timeouts=TIMEOUTS)
        try:
            sids = await conn.open_sessions(2)
            await conn.request(_reset(sids, [None, None]))
            long, short = Replies(), Replies()
            conn.send_request(_step([sids[0]], [0]), long, 30.0)
            started = asyncio.get_running_loop().time()
            conn.send_request(_step([sids[1]], [0]), short, 0.2)
            await short.wait(1)
            waited = asyncio.get_running_loop().time() - started
            return waited, short.calls, long.calls
        finally:
            await conn.close()

    waited, short_calls, long_calls = run(talk())
    assert isinstance(short_calls[0], SessionTimeout) and short_calls[0].timeout == 0.2
    assert waited < 5.0  # not held until the first request's deadline (30 s)
    assert len(long_calls) == 1 and isinstance(long_calls[0], ConnectionLost)  # failed by the close, not timed out


# ------------------------------------------------------------ the peer goes away


def test_a_peer_that_closes_fails_every_pending_request_with_its_code_and_reason():
    async def hang_up(frame: bytes, conn: ServerConnection) -> str:
        await conn.close(1011, "rogue peer hangs up")
        return "STOP"

    async def talk():
        async with fast_peer(hang_up) as url:
            conn = await FastConnection.connect(url, timeouts=TIMEOUTS)
            replies = Replies()
            conn.send_request(_step([1], [0]), replies, 5.0)
            with pytest.raises(ConnectionLost) as awaited:
                await conn.request(_step([2], [0]))
            await replies.wait(1)
            with pytest.raises(ConnectionLost) as later:
                conn.send_request(_step([1], [0]), replies, 5.0)
            await conn.close()
            return awaited.value, replies.calls, later.value, conn.closed

    awaited, calls, later, closed = run(talk())
    for error in (awaited, calls[0], later):
        assert isinstance(error, ConnectionLost)
        assert (error.code, error.reason) == (1011, "rogue peer hangs up")
    assert len(calls) == 1 and closed


def test_a_server_shutting_down_fails_the_pending_request_with_going_away():
    port = free_port()
    command = [
        sys.executable, "-m", "openenv_gym.server", "serve", "tests.servers.gym_envs:Slow-v0",
        "--port", str(port), "--env-kwargs", '{"delay": 1.0}', "--thread-threshold-ms", "0",
    ]  # fmt: skip
    server = ServerProcess(command, "127.0.0.1", port)
    try:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            server.wait_healthy(client, time.monotonic() + 60)

        async def talk():
            conn = await FastConnection.connect(server.url, timeouts=TIMEOUTS)
            (sid,) = await conn.open_sessions(1)
            await conn.request(_reset([sid], [None]))
            replies = Replies()
            conn.send_request(_step([sid], [0]), replies, 10.0)
            server.proc.send_signal(signal.SIGTERM)
            await replies.wait(1)
            await conn.close()
            return replies.calls

        calls = run(talk())
    finally:
        server.stop()
    assert len(calls) == 1 and isinstance(calls[0], ConnectionLost), calls
    assert (calls[0].code, calls[0].reason) == (1001, "server shutting down")


# ------------------------------------------------------------ keepalive


def test_pings_from_the_server_are_answered(pinging_url):
    async def talk():
        conn = await FastConnection.connect(pinging_url, timeouts=TIMEOUTS)
        try:
            sessions = await conn.open_sessions(1)
            # The behaviour under test is the passage of time: ~5 server pings, each
            # with a 0.2 s pong deadline, while we stay idle.
            await asyncio.sleep(1.0)
            reply = await conn.request(_reset(sessions, [3]))
            return reply, conn.closed
        finally:
            await conn.close()

    reply, closed = run(talk())
    assert isinstance(reply, fastp.BatchReply) and not closed


def test_our_pings_keep_a_live_connection(cartpole_url):
    async def talk():
        conn = await FastConnection.connect(cartpole_url, timeouts=TIMEOUTS, ping_interval=0.1, ping_timeout=0.5)
        try:
            sessions = await conn.open_sessions(1)
            await asyncio.sleep(0.6)  # several of our pings and the server's pongs
            return await conn.request(_reset(sessions, [3])), conn.closed
        finally:
            await conn.close()

    reply, closed = run(talk())
    assert isinstance(reply, fastp.BatchReply) and not closed


def test_a_peer_that_stops_answering_pings_is_declared_lost():
    async def talk():
        async with deaf_fast_peer() as url:
            conn = await FastConnection.connect(url, timeouts=TIMEOUTS, ping_interval=0.1, ping_timeout=0.2)
            replies = Replies()
            conn.send_request(_step([1], [0]), replies, 10.0)
            await replies.wait(1)
            await conn.close()
            return replies.calls

    (error,) = run(talk())
    assert isinstance(error, ConnectionLost) and "no pong" in str(error)


# ------------------------------------------------------------ connecting


def test_a_stock_server_is_reported_as_not_selecting_the_subprotocol(stock_cartpole_url):
    async def talk():
        with pytest.raises(SubprotocolNotSelected) as info:
            await FastConnection.connect(stock_cartpole_url, timeouts=TIMEOUTS)
        transport = info.value.transport
        # The probe connection is handed over, usable as a stock JSON session.
        async with Session(transport, timeouts=TIMEOUTS, limits=Limits()) as session:
            reply = await session.reset(seed=5)
        return info.value, transport.codec, reply

    error, codec, reply = run(talk())
    assert isinstance(error, ConnectError) and fastp.SUBPROTOCOL in str(error)
    assert codec == "json" and reply.observation and not reply.done


def test_handshake_sends_extra_headers_and_our_user_agent():
    async def talk():
        async with rogue_ws_server(lambda frame, conn: None) as (url, seen):
            with pytest.raises(SubprotocolNotSelected) as info:
                await FastConnection.connect(url, headers={"Authorization": "Bearer t0k"}, timeouts=TIMEOUTS)
            await info.value.transport.ws.close()
            return seen[0]

    headers = run(talk())
    assert headers["Authorization"] == "Bearer t0k" and headers["User-Agent"] == "openenv-gym"
    assert headers["Sec-WebSocket-Protocol"] == fastp.SUBPROTOCOL
    assert "Sec-WebSocket-Extensions" not in headers


def test_connect_failures_are_connect_errors(cartpole_url):
    async def talk():
        errors = []
        with pytest.raises(ConnectError) as refused:
            await FastConnection.connect(f"http://127.0.0.1:{free_port()}", timeouts=TIMEOUTS)
        errors.append(refused.value)
        with pytest.raises(ConnectError) as status:
            await FastConnection.connect(cartpole_url + "/nowhere", timeouts=TIMEOUTS)
        errors.append(status.value)
        async with silent_tcp_server() as url:
            with pytest.raises(ConnectError) as timed_out:
                await FastConnection.connect(url, timeouts=Timeouts(connect=0.3))
        errors.append(timed_out.value)
        return errors

    refused, status, timed_out = run(talk())
    assert "cannot connect" in str(refused)
    assert "HTTP 404" in str(status)
    assert "timed out after 0.3 s" in str(timed_out)
    assert not any(isinstance(e, SubprotocolNotSelected) for e in (refused, status, timed_out))


def test_close_is_idempotent_and_later_requests_fail(cartpole_url):
    async def talk():
        conn = await FastConnection.connect(cartpole_url, timeouts=TIMEOUTS)
        await conn.open_sessions(1)
        await conn.close()
        await conn.close()
        with pytest.raises(ConnectionLost, match="closed by the client"):
            await conn.request(_reset([1], [None]))
        return conn.closed

    assert run(talk())


def test_a_reply_callback_that_raises_does_not_break_the_connection(cartpole_url, caplog):
    def broken(result: Any) -> None:
        raise RuntimeError("callback bug")

    async def talk():
        conn = await FastConnection.connect(cartpole_url, timeouts=TIMEOUTS)
        try:
            sessions = await conn.open_sessions(1)
            conn.send_request(_reset(sessions, [0]), broken, 5.0)
            return await conn.request(_step(sessions, [0])), conn.closed
        finally:
            await conn.close()

    reply, closed = run(talk())
    assert isinstance(reply, fastp.BatchReply) and not closed
    assert any("callback" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


def test_a_text_frame_is_a_protocol_error():
    async def answer_text(frame: bytes, conn: ServerConnection) -> None:
        await conn.send("not msgpack")

    async def talk():
        async with fast_peer(answer_text) as url:
            conn = await FastConnection.connect(url, timeouts=TIMEOUTS)
            with pytest.raises(OpenEnvGymError) as info:
                await conn.request(_step([1], [0]))
            await conn.close()
            return info.value

    error = run(talk())
    assert type(error).__name__ == "ProtocolError" and "text" in str(error)


def test_fragmented_replies_are_reassembled():
    codec = MsgpackCodec()

    async def answer_in_pieces(frame: bytes, conn: ServerConnection) -> None:
        rid = codec.decode(frame)["id"]
        data = codec.encode(fastp.closed_reply(rid, [1, 2]))
        await conn.send([data[:3], data[3:7], data[7:]])

    async def talk():
        async with fast_peer(answer_in_pieces) as url:
            conn = await FastConnection.connect(url, timeouts=TIMEOUTS)
            try:
                return await conn.request(lambda rid: fastp.close_batch_request(rid, [1, 2]))
            finally:
                await conn.close()

    reply = run(talk())
    assert isinstance(reply, fastp.ClosedReply) and reply.sessions == [1, 2]


def test_a_reply_in_more_fragments_than_the_limit_fails_the_connection_with_limit_exceeded():
    codec = MsgpackCodec()

    async def answer_in_pieces(frame: bytes, conn: ServerConnection) -> None:
        rid = codec.decode(frame)["id"]
        data = codec.encode(fastp.closed_reply(rid, [1, 2]))
        await conn.send([data[i : i + 1] for i in range(len(data))])  # one byte a fragment

    async def talk(max_fragments: int):
        async with fast_peer(answer_in_pieces) as url:
            conn = await FastConnection.connect(url, timeouts=TIMEOUTS, limits=Limits(max_fragments=max_fragments))
            try:
                return await conn.request(lambda rid: fastp.close_batch_request(rid, [1, 2]))
            except OpenEnvGymError as exc:
                return exc, conn.closed
            finally:
                await conn.close()

    assert len(codec.encode(fastp.closed_reply(1, [1, 2]))) > 8
    assert isinstance(run(talk(Limits().max_fragments)), fastp.ClosedReply)  # within the default limit: read
    error, closed = run(talk(8))
    assert type(error).__name__ == "LimitExceeded" and "fragments" in str(error) and closed


def test_sessions_opened_after_their_request_timed_out_are_closed_when_the_late_reply_comes(cartpole_url):
    # A stalled server answers an open after the client gave up: nobody holds those sessions, and
    # they held the server's room until the connection closed (a pool's repairs piled them up).
    from urllib.parse import urlsplit

    from tests.faultproxy import FaultProxy

    async def active() -> int:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            return (await client.get(cartpole_url + "/health")).json()["active_sessions"]

    async def talk():
        before = await active()
        async with FaultProxy("127.0.0.1", urlsplit(cartpole_url).port) as proxy:
            conn = await FastConnection.connect(proxy.url, timeouts=TIMEOUTS)
            try:
                kept = await conn.open_sessions(1)
                await conn.request(_reset(kept, [1]))
                proxy.set_delay(0.5)  # (the open goes up, and its reply down, 0.5 s late: after its 0.2 s timeout)
                with pytest.raises(SessionTimeout):
                    await conn.request(lambda rid: fastp.open_request(rid, 3), timeout=0.2)
                while (opened := await active()) < before + 4:  # the server opens them
                    await asyncio.sleep(0.02)
                proxy.set_delay(0)
                while (now := await active()) > before + 1:  # the late reply came, and they are closed
                    await asyncio.sleep(0.02)
                reply = await conn.request(_step(kept, [0]))  # the connection and its own session are fine
                return before, opened, now, reply
            finally:
                await conn.close()

    before, opened, now, reply = run(talk())
    assert opened == before + 4 and now == before + 1
    assert isinstance(reply, fastp.BatchReply) and reply.reward.tolist() == [1.0]
