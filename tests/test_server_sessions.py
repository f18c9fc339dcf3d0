"""Sessions: capacity over both paths, no idle reaping on live connections, dead peers, SIGTERM, blocking envs."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import sys
import time

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from openenv_gym import launch_local
from openenv_gym.client import FastConnection, Session, open_socket
from openenv_gym.config import Limits, Timeouts
from openenv_gym.launch import ServerProcess
from openenv_gym.protocol import multiplex as fastp
from openenv_gym.protocol.codec import MsgpackCodec
from tests.clients import run
from tests.servers.launch import free_port

TIMEOUT = 20.0
codec = MsgpackCodec()


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


async def stock_ws(url: str):
    return await connect(ws_url(url), proxy=None, compression=None)


async def fast_ws(url: str):
    ws = await connect(ws_url(url), subprotocols=[fastp.SUBPROTOCOL], proxy=None, compression=None)
    assert ws.subprotocol == fastp.SUBPROTOCOL
    return ws


async def ask_json(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def ask_fast(ws, message: dict) -> dict:
    await ws.send(codec.encode(message))
    return codec.decode(await asyncio.wait_for(ws.recv(), TIMEOUT))


@pytest.fixture(scope="module")
def small_url():
    """CartPole, 3 sessions per process, pings every 0.5 s with a 0.5 s deadline."""
    extra = ["--ping-interval", "0.5", "--ping-timeout", "0.5", "--close-timeout", "0.5"]
    with launch_local("CartPole-v1", max_sessions=3, extra_args=extra) as urls:
        yield urls[0]


def test_capacity_counts_sessions_of_both_paths(small_url):
    async def talk():
        fast = await fast_ws(small_url)
        opened = await ask_fast(fast, fastp.open_request(1, 2))
        stock = await stock_ws(small_url)
        assert (await ask_json(stock, {"type": "reset", "data": {}}))["type"] == "observation"

        refused_open = await ask_fast(fast, fastp.open_request(2, 1))
        late = await stock_ws(small_url)
        refused_stock = json.loads(await asyncio.wait_for(late.recv(), TIMEOUT))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(late.recv(), TIMEOUT)
        # The refused open left the connection and its sessions working.
        stepped = await ask_fast(fast, fastp.reset_batch_request(3, opened["sessions"]))

        await ask_fast(fast, fastp.close_batch_request(4, opened["sessions"][:1]))
        reopened = await ask_fast(fast, fastp.open_request(5, 1))
        await stock.close()
        await fast.close()
        # Closing connections released everything: the whole house opens at once.
        again = await fast_ws(small_url)
        full = await ask_fast(again, fastp.open_request(6, 3))
        await again.close()
        return opened, refused_open, refused_stock, stepped, reopened, full

    opened, refused_open, refused_stock, stepped, reopened, full = run(talk())
    assert opened["type"] == "opened" and len(opened["sessions"]) == 2
    assert refused_open["type"] == "error" and refused_open["id"] == 2
    assert refused_open["data"]["code"] == "CAPACITY_REACHED"
    assert refused_open["data"]["active_sessions"] == 3 and refused_open["data"]["max_sessions"] == 3
    assert refused_stock["data"]["code"] == "CAPACITY_REACHED"
    assert stepped["type"] == "batch"
    assert reopened["type"] == "opened"
    assert full["type"] == "opened" and len(full["sessions"]) == 3


def test_an_idle_session_on_a_live_connection_is_never_reaped(small_url):
    async def talk():
        async with await Session.connect(small_url) as fast, await Session.connect(small_url, offer_msgpack=False) as stock:
            await fast.reset(seed=1)
            await stock.reset(seed=1)
            await asyncio.sleep(3.0)  # the behaviour under test: six ping periods of silence
            fast_step = await fast.step({"action": 0})
            stock_step = await stock.step({"action": 0})
        return fast.codec, stock.codec, fast_step, stock_step

    fast_codec, stock_codec, fast_step, stock_step = run(talk())
    assert (fast_codec, stock_codec) == ("msgpack", "json")
    assert fast_step.reward == stock_step.reward == 1.0
    np.testing.assert_array_equal(fast_step.observation["observation"], stock_step.observation["observation"])


def _handshake_and_go_silent(url: str) -> socket.socket:
    """A client that completes the handshake, then never reads or answers again (a dead peer)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


def test_a_dead_peer_is_detected_by_ping_and_its_session_released(small_url):
    async def talk():
        holder = await fast_ws(small_url)
        assert (await ask_fast(holder, fastp.open_request(1, 2)))["type"] == "opened"
        dead = _handshake_and_go_silent(small_url)  # takes the third and last slot
        try:
            refused = await ask_fast(holder, fastp.open_request(2, 1))
            start = time.monotonic()
            rid = 3
            while True:  # the slot comes back after about ping_interval + ping_timeout + close_timeout
                reply = await ask_fast(holder, fastp.open_request(rid, 1))
                if reply["type"] == "opened":
                    break
                assert time.monotonic() - start < 10.0, "the dead peer's session was never released"
                rid += 1
                await asyncio.sleep(0.1)
            waited = time.monotonic() - start
        finally:
            dead.close()
            await holder.close()
        return refused, waited

    refused, waited = run(talk())
    assert refused["data"]["code"] == "CAPACITY_REACHED"
    assert waited < 4.0


def test_sigterm_closes_connections_with_1001_and_exits_0():
    port = free_port()
    command = [sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1", "--port", str(port)]
    server = ServerProcess(command, "127.0.0.1", port)
    try:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            server.wait_healthy(client, time.monotonic() + 60)

        async def talk():
            fast = await fast_ws(server.url)
            stock = await stock_ws(server.url)
            sids = (await ask_fast(fast, fastp.open_request(1, 2)))["sessions"]
            await ask_fast(fast, fastp.reset_batch_request(2, sids))
            await ask_json(stock, {"type": "reset", "data": {}})
            server.proc.send_signal(signal.SIGTERM)
            frames = []
            for ws in (stock, fast):
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), TIMEOUT)
                frames.append(closed.value.rcvd)
            return frames

        frames = run(talk())
        code = server.proc.wait(TIMEOUT)
        log = server.log_tail()
    finally:
        server.stop()
    for frame in frames:
        assert frame is not None and (frame.code, frame.reason) == (1001, "server shutting down")
    assert code == 0, log
    assert "server stopped" in log


@pytest.fixture(scope="module")
def slow_url():
    """Slow-v0: every step sleeps 0.4 s."""
    with launch_local("tests.servers.gym_envs:Slow-v0", max_sessions=8, env_kwargs={"delay": 1.0}) as urls:
        yield urls[0]


def test_a_blocking_step_does_not_stall_other_sessions(slow_url):
    async def talk():
        async with await Session.connect(slow_url) as slow, await Session.connect(slow_url) as other:
            await slow.reset()
            await other.reset()
            await slow.step({"action": 0})  # the first slow call moves env calls to threads
            step = asyncio.ensure_future(slow.step({"action": 1}))
            start = time.monotonic()
            for _ in range(5):
                await other.reset()
                await other.state()
            other_time = time.monotonic() - start
            await step
        # Four blocking steps in one frame run side by side, not one after the other.
        transport = await open_socket(slow_url, timeouts=Timeouts(), limits=Limits())
        fc = FastConnection(transport, timeouts=Timeouts(step=TIMEOUT), limits=Limits())
        try:
            sids = await fc.open_sessions(4)
            await fc.request(lambda rid: fastp.reset_batch_request(rid, sids))
            start = time.monotonic()
            reply = await fc.request(lambda rid: fastp.step_batch_request(rid, sids, {"action": [0, 1, 0, 1]}))
            batch_time = time.monotonic() - start
        finally:
            await fc.close()
        return other_time, batch_time, reply

    other_time, batch_time, reply = run(talk())
    assert other_time < 0.7, other_time  # (stalled behind the slow step: about 1 s)
    assert batch_time < 3.0, batch_time  # sequential would be 4 s
    assert reply.errors is None and list(reply.reward) == [1.0] * 4
