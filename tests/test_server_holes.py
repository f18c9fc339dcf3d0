"""What a hostile or unlucky peer could once do to a server, and now cannot (chaos tier).

An unfinished fragmented message held memory for as long as its sender
answered pings; ``--unix PATH`` followed a link planted at ``PATH.lock``;
silent unauthenticated connections filled ``--max-connections``; pipelined
GETs on a fresh connection got nothing; an error reply echoed a megabyte.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import httpx
import pytest
from websockets.asyncio.client import connect

import openenv_gym
from openenv_gym import launch_local
from openenv_gym.protocol import multiplex as fastp
from openenv_gym.protocol.codec import MsgpackCodec
from openenv_gym.server.net.unix import UnixListener
from tests.clients import run

pytestmark = pytest.mark.chaos

TIMEOUT = 20.0
TOKEN = "t" * 32
codec = MsgpackCodec()


async def _ws(url: str, fast: bool, **kwargs):
    subprotocols = [fastp.SUBPROTOCOL] if fast else None
    return await connect(
        url.replace("http://", "ws://") + "/ws", subprotocols=subprotocols, proxy=None, compression=None, max_size=None, **kwargs
    )


@pytest.mark.parametrize("fast", [False, True], ids=["stock", "fast"])
def test_an_unfinished_fragmented_message_closes_its_connection_after_the_fragment_timeout(fast):
    # Fifteen fragments of 64 KiB, then nothing more of that message; the client answers the server's pings.
    async def scenario(url: str) -> tuple[int | None, float]:
        ws = await _ws(url, fast, ping_interval=None)
        never = asyncio.Event()

        async def fragments():
            for _ in range(15):
                yield b"\0" * 65536 if fast else "x" * 65536
            await never.wait()  # (the rest of the message never comes)

        started = time.monotonic()
        sending = asyncio.ensure_future(ws.send(fragments()))
        try:
            await asyncio.wait_for(ws.wait_closed(), TIMEOUT)
        finally:
            sending.cancel()
        return ws.close_code, time.monotonic() - started

    extra = ["--fragment-timeout", "1", "--ping-interval", "0.2", "--close-timeout", "1"]
    with launch_local("CartPole-v1", max_sessions=4, extra_args=extra) as (url,):
        code, took = run(scenario(url), timeout=TIMEOUT + 5)
        assert code == 1008 and took < 5  # (policy violation, about the fragment timeout)
        with openenv_gym.OpenEnvEnv(url) as env:  # the server serves on
            env.reset(seed=0)


def test_a_link_planted_at_the_lock_file_is_never_followed(tmp_path):
    target = tmp_path / "victim"
    path = tmp_path / "s.sock"
    os.symlink(target, str(path) + ".lock")
    with pytest.raises(OSError, match="symbolic link"):
        UnixListener(str(path))
    assert not target.exists() and not path.exists()  # (the link's target was not made)
    os.unlink(str(path) + ".lock")
    fifo = str(path) + ".lock"
    os.mkfifo(fifo)  # (where a plain open would block)
    with pytest.raises(OSError, match="not a regular file"):
        UnixListener(str(path))
    os.unlink(fifo)
    listener = UnixListener(str(path))  # a lock file of its own: fine
    listener.release()


def test_silent_unauthenticated_connections_cannot_keep_a_client_with_the_token_out():
    extra = ["--max-connections", "8", "--max-pending-connections", "4"]
    with launch_local("CartPole-v1", max_sessions=4, extra_args=extra, token=TOKEN) as (url,):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        silent = [socket.create_connection((host, int(port)), timeout=TIMEOUT) for _ in range(50)]
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with openenv_gym.OpenEnvVectorEnv(url, 2, headers=headers, connect_timeout=TIMEOUT) as envs:
                envs.reset(seed=0)
                more = [socket.create_connection((host, int(port)), timeout=TIMEOUT) for _ in range(50)]  # (while it steps)
                silent += more
                for _ in range(5):
                    envs.step(envs.action_space.sample())
            closed = 0
            for conn in silent:  # the server dropped the oldest silent ones to let the client in
                conn.settimeout(0.5)
                try:
                    closed += conn.recv(1) == b""
                except (ConnectionResetError, TimeoutError, socket.timeout):
                    closed += 0
            assert closed >= 90
        finally:
            for conn in silent:
                conn.close()


def test_pipelined_gets_on_a_fresh_connection_are_answered_in_order():
    with launch_local("CartPole-v1", max_sessions=4, extra_args=["--workers", "2"]) as (url,):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        request = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\nGET /schema HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        for _ in range(6):  # (both workers, likely)
            with socket.create_connection((host, int(port)), timeout=TIMEOUT) as conn:
                conn.sendall(request.encode())
                answer = b""
                while chunk := conn.recv(65536):
                    answer += chunk
            assert answer.count(b"HTTP/1.1 200 OK") == 2 and b'"status"' in answer and b'"observation"' in answer
        assert httpx.get(url + "/ws", timeout=TIMEOUT).status_code == 426  # (a plain GET of the WebSocket path)


def test_pipelined_gets_log_no_error(caplog):
    import subprocess
    import sys

    port_socket = socket.socket()
    port_socket.bind(("127.0.0.1", 0))
    port = port_socket.getsockname()[1]
    port_socket.close()
    server = subprocess.Popen(
        [sys.executable, "-m", "openenv_gym.cli", "serve", "CartPole-v1", "--port", str(port), "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + TIMEOUT
        while True:  # (until it answers: bounded)
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as conn:
                conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                conn.recv(65536)
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    assert "ERROR" not in out and "Traceback" not in out, out[-3000:]


@pytest.mark.parametrize("fast", [False, True], ids=["stock", "fast"])
def test_an_error_reply_never_echoes_a_megabyte(fast):
    async def scenario(url: str) -> int:
        ws = await _ws(url, fast)
        kind = "x" * 1_000_000
        if fast:
            await ws.send(codec.encode({"type": kind, "id": 1}))
        else:
            await ws.send('{"type": "' + kind + '"}')
        answer = await asyncio.wait_for(ws.recv(), TIMEOUT)
        await ws.close()
        return len(answer)

    with launch_local("CartPole-v1", max_sessions=4) as (url,):
        assert run(scenario(url), timeout=TIMEOUT + 5) < 400
