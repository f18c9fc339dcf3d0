"""Bad input gets the stock error code and a message; everything else keeps working."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import socket
import struct
import time
from pathlib import Path

import httpx
import msgpack
import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from openenv_gym import launch_local
from openenv_gym.protocol import multiplex as fastp
from openenv_gym.protocol.codec import MsgpackCodec
from tests.clients import run

TIMEOUT = 20.0
MAX_FRAME = 64 * 1024
codec = MsgpackCodec()


@pytest.fixture(scope="module")
def url():
    extra = ["--max-frame-bytes", str(MAX_FRAME)]
    with launch_local("CartPole-v1", max_sessions=32, extra_args=extra) as urls:
        yield urls[0]


# ------------------------------------------------------------------ helpers


async def stock_ws(url: str):
    return await connect(url.replace("http://", "ws://") + "/ws", proxy=None, compression=None, max_size=None)


async def fast_ws(url: str):
    ws = await connect(
        url.replace("http://", "ws://") + "/ws",
        subprotocols=[fastp.SUBPROTOCOL],
        proxy=None,
        compression=None,
        max_size=None,
    )
    assert ws.subprotocol == fastp.SUBPROTOCOL
    return ws


async def ask_json(ws, frame: str | dict) -> dict:
    await ws.send(frame if isinstance(frame, str) else json.dumps(frame))
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def ask_fast(ws, frame: bytes | str | dict) -> dict:
    await ws.send(codec.encode(frame) if isinstance(frame, dict) else frame)
    return codec.decode(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def stock_session(url: str):
    ws = await stock_ws(url)
    reply = await ask_json(ws, {"type": "reset", "data": {"seed": 0}})
    assert reply["type"] == "observation"
    return ws


async def stock_steps(ws) -> None:
    reply = await ask_json(ws, {"type": "step", "data": {"action": 0}})
    assert reply["type"] == "observation", reply


async def fast_sessions(url: str, count: int = 2):
    ws = await fast_ws(url)
    opened = await ask_fast(ws, fastp.open_request(1, count))
    sids = opened["sessions"]
    reset = await ask_fast(ws, fastp.reset_batch_request(2, sids, seeds=list(range(count))))
    assert reset["type"] == "batch"
    return ws, sids


async def fast_steps(ws, sids: list[int], rid: int = 99) -> None:
    reply = await ask_fast(ws, fastp.step_batch_request(rid, sids, {"action": np.zeros(len(sids), np.int64)}))
    assert reply["type"] == "batch" and reply["id"] == rid and "errors" not in reply, reply


# ------------------------------------------------------------------ stock path


@pytest.mark.parametrize(
    "frame, code, text",
    [
        ("{not json", "INVALID_JSON", "Invalid JSON: Expecting property name"),  # (once, not twice)
        ({"type": "step"}, "VALIDATION_ERROR", "'step' needs 'data'"),
        ({"type": "jump"}, "UNKNOWN_TYPE", "Unknown message type: jump"),
        ({"type": "step", "data": {"action": 5}}, "VALIDATION_ERROR", "outside the action space"),
        ({"type": "step", "data": {"action": "left"}}, "VALIDATION_ERROR", "must be an integer"),
        ({"type": "step", "data": {"action": 1, "force": 3}}, "VALIDATION_ERROR", "unexpected action fields"),
        ({"type": "step", "data": {}}, "VALIDATION_ERROR", "needs the field 'action'"),
        ({"type": "reset", "data": {"seed": -1}}, "VALIDATION_ERROR", "seed"),
        ({"type": "reset", "data": {"episode_id": "x" * 10_000}}, "VALIDATION_ERROR", "episode_id"),  # as on the fast path
        ({"type": "step", "data": [1]}, "VALIDATION_ERROR", "data"),
    ],
)
def test_stock_bad_request_gets_an_error_and_the_session_goes_on(url, frame, code, text):
    async def talk():
        ws = await stock_session(url)
        reply = await ask_json(ws, frame)
        await stock_steps(ws)
        await ws.close()
        return reply

    reply = run(talk())
    assert reply["type"] == "error"
    assert reply["data"]["code"] == code
    assert text in reply["data"]["message"]


def test_stock_oversized_frame_closes_only_that_connection_with_1009(url):
    async def talk():
        other = await stock_session(url)
        fast, sids = await fast_sessions(url)
        ws = await stock_session(url)
        await ws.send(json.dumps({"type": "step", "data": {"action": 0, "pad": "x" * MAX_FRAME}}))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), TIMEOUT)
        await stock_steps(other)
        await fast_steps(fast, sids)
        await other.close()
        await fast.close()
        return closed.value.rcvd

    close_frame = run(talk())
    assert close_frame is not None and close_frame.code == 1009
    assert "exceeds limit" in close_frame.reason


# ------------------------------------------------------------------ fast path


def _bad_shape_array_frame() -> bytes:
    # An ndarray ext declaring shape (100,) of <f8 (800 bytes) but carrying 16.
    head = bytes([3]) + b"<f8" + bytes([1]) + struct.pack("<Q", 100)
    head += bytes(-len(head) % 8)
    ext = msgpack.ExtType(1, head + np.zeros(2).tobytes())
    message = {"type": "step", "id": 7, "sessions": [0], "actions": {"action": ext}}
    return msgpack.packb(message, use_bin_type=True)


@pytest.mark.parametrize(
    "frame, reply_id, code, text",
    [
        (b"\x92\x01", None, "INVALID_JSON", "invalid msgpack"),  # (an array of 2 with 1 item: cut short)
        (b"\xc1\xc1 not msgpack", None, "INVALID_JSON", "invalid raw frame"),  # (0xC1 marks a lane's raw frame)
        (_bad_shape_array_frame(), None, "INVALID_JSON", "needs 800 bytes"),
        (msgpack.packb([1, 2, 3]), None, "VALIDATION_ERROR", "must be a map"),
        ({"type": "jump", "id": 5}, 5, "UNKNOWN_TYPE", "Unknown message type: jump"),
        ({"type": "step", "id": 6, "sessions": [0]}, 6, "VALIDATION_ERROR", "actions"),
        ({"type": "state", "id": 8, "sessions": [12345]}, 8, "VALIDATION_ERROR", "unknown session"),
        ({"type": "open", "id": 9, "count": 0}, 9, "VALIDATION_ERROR", "count"),
        ("a text frame", None, "INVALID_JSON", "text frame"),
    ],
)
def test_fast_bad_frame_gets_an_error_and_the_connection_goes_on(url, frame, reply_id, code, text):
    async def talk():
        ws, sids = await fast_sessions(url)
        reply = await ask_fast(ws, frame)
        await fast_steps(ws, sids)
        await ws.close()
        return reply

    reply = run(talk())
    assert reply["type"] == "error"
    assert reply["id"] == reply_id
    assert reply["data"]["code"] == code
    assert text in reply["data"]["message"]


def test_fast_action_outside_the_space_fails_only_its_session(url):
    async def talk():
        ws, sids = await fast_sessions(url, 3)
        reply = await ask_fast(ws, fastp.step_batch_request(10, sids, {"action": [0, 7, 1]}))
        await fast_steps(ws, sids)
        await ws.close()
        return reply

    reply = fastp.parse_fast_reply(run(talk()))
    assert isinstance(reply, fastp.BatchReply) and reply.id == 10
    assert reply.errors[0] is None and reply.errors[2] is None
    assert reply.errors[1].code == "VALIDATION_ERROR"
    assert "outside the action space" in reply.errors[1].message
    assert reply.observation["observation"].shape == (3, 4)
    assert reply.reward[0] == reply.reward[2] == 1.0 and np.isnan(reply.reward[1])


def test_fast_oversized_frame_closes_only_that_connection_with_1009(url):
    async def talk():
        other, other_sids = await fast_sessions(url)
        stock = await stock_session(url)
        ws, sids = await fast_sessions(url)
        big = np.zeros(MAX_FRAME, np.uint8)
        await ws.send(codec.encode(fastp.step_batch_request(11, sids, {"action": [big, big]})))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), TIMEOUT)
        await fast_steps(other, other_sids)
        await stock_steps(stock)
        await other.close()
        await stock.close()
        return closed.value.rcvd

    close_frame = run(talk())
    assert close_frame is not None and close_frame.code == 1009
    assert "exceeds limit" in close_frame.reason


class _Trap:
    """Unpickling this would create a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_pickles_on_the_wire_are_never_unpickled(url, tmp_path):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Trap(str(marker)))

    async def talk():
        ws, sids = await fast_sessions(url)
        binary = await ask_fast(ws, payload)
        inner = await ask_fast(ws, codec.encode({"type": "step", "id": 12, "sessions": sids, "actions": {"action": [payload, payload]}}))
        stock = await stock_session(url)
        text = await ask_json(stock, payload.decode("latin-1"))
        await fast_steps(ws, sids)
        await ws.close()
        await stock.close()
        return binary, inner, text

    binary, inner, text = run(talk())
    assert binary["data"]["code"] == "INVALID_JSON"
    assert [e["code"] for e in inner["errors"]] == ["VALIDATION_ERROR", "VALIDATION_ERROR"]
    assert text["data"]["code"] == "INVALID_JSON"
    assert not os.path.exists(marker)


def test_fast_requests_cannot_make_replies_much_larger_than_themselves(url):
    # One reset's options go to every session, and every state echoes the episode_id: bounded.
    async def talk():
        ws, sids = await fast_sessions(url, 8)
        long_id = await ask_fast(ws, fastp.reset_batch_request(10, sids, options={"episode_id": "x" * 10_000}))
        ok_id = await ask_fast(ws, fastp.reset_batch_request(11, sids, options={"episode_id": "run-7"}))
        states = await ask_fast(ws, fastp.state_batch_request(12, sids))
        # Extra action columns are named in each session's error: only the first few, shortened.
        extra = {f"{k:04d}" + "k" * 500: np.zeros(8, np.int64) for k in range(40)}
        extra["action"] = np.zeros(8, np.int64)
        request = codec.encode(fastp.step_batch_request(13, sids, extra))
        await ws.send(request)
        fields = await asyncio.wait_for(ws.recv(), TIMEOUT)
        await fast_steps(ws, sids)
        await ws.close()
        return long_id, ok_id, states, len(request), fields

    long_id, ok_id, states, request_bytes, fields = run(talk())
    assert long_id["type"] == "error" and long_id["data"]["code"] == "VALIDATION_ERROR"
    assert "episode_id" in long_id["data"]["message"]
    assert ok_id["type"] == "batch" and "errors" not in ok_id
    assert [s["episode_id"] for s in states["states"]] == ["run-7"] * 8
    reply = codec.decode(fields)
    assert [e["code"] for e in reply["errors"]] == ["VALIDATION_ERROR"] * 8
    assert "and 32 more" in reply["errors"][0]["message"]
    assert len(fields) < request_bytes / 4


def test_an_env_error_that_cannot_be_printed_still_gets_its_reply():
    extra = ["--execution", "thread"]
    with launch_local("tests.servers.gym_envs:UnprintableError-v0", max_sessions=2, extra_args=extra) as (url,):

        async def talk():
            ws, sids = await fast_sessions(url, 2)
            request = fastp.step_batch_request(10, sids, {"action": [0, 1]})
            request["partial"] = True
            await ws.send(codec.encode(request))
            parts = [codec.decode(await asyncio.wait_for(ws.recv(), TIMEOUT))]
            while not parts[-1].get("last", True):
                parts.append(codec.decode(await asyncio.wait_for(ws.recv(), TIMEOUT)))
            await fast_steps(ws, sids[:1])  # the sessions go on
            await ws.close()
            return parts

        parts = run(talk())
        errors = [e for part in parts for e in part.get("errors", []) if e is not None]
        assert [e["code"] for e in errors] == ["EXECUTION_ERROR"]
        assert errors[0]["message"] == "Unprintable"


@pytest.mark.parametrize("target", ["//[x/health", "http://[::1/health", "/%ff%fe"])
def test_a_malformed_request_target_is_a_404_not_a_500(url, target):
    async def ask() -> bytes:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        status = await asyncio.wait_for(reader.readline(), TIMEOUT)
        writer.close()
        return status

    assert run(ask()).startswith(b"HTTP/1.1 404")


def _answer_of(url: str, request: bytes | list[bytes]) -> tuple[bytes, bytes | None]:
    """The status code and ``Allow`` header the server at ``url`` answers ``request`` with on a new connection.

    ``request`` in parts is sent in as many writes, 50 ms apart (b"" and ``None`` if no answer).
    """
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        for n, part in enumerate([request] if isinstance(request, bytes) else request):
            if n:
                time.sleep(0.05)  # (so that the server reads the parts apart; nothing to wait for)
            sock.sendall(part)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    if not answer.startswith(b"HTTP/1."):
        return b"", None
    fields = answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    allow = next((f.split(b":", 1)[1].strip() for f in fields[1:] if f.lower().startswith(b"allow:")), None)
    return answer.split(b" ", 2)[1], allow


def _status_of(url: str, request: bytes | list[bytes]) -> bytes:
    return _answer_of(url, request)[0]


PLAIN_REQUESTS = [
    b"GET\r\n\r\n",  # no target, no version
    b"GARBAGE\r\n\r\n",
    b"GET /health HTTP/1.0\r\n\r\n",
    b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"OPTIONS /schema HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PUT /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    b"GET /mcp HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",  # a GET with a body
    b"GET /health HTTP/1.1\r\nHost: x\r\ncontent-length: 0\r\n\r\n",
    b"GET /health HTTP/1.1\nHost: x\n\n",  # bare LF line ends (RFC 9112 lets a server take them)
]


def test_every_plain_http_request_gets_the_stock_servers_status_and_costs_nothing_else(url):
    with launch_local("CartPole-v1", stock=True) as (stock_url,):
        stock = [_answer_of(stock_url, request) for request in PLAIN_REQUESTS]
    ours = [_answer_of(url, request) for request in PLAIN_REQUESTS]
    assert [status for status, _ in stock] == [
        b"400",
        b"400",
        b"200",
        b"405",
        b"405",
        b"405",
        b"404",
        b"405",
        b"405",
        b"200",
        b"200",
        b"200",
    ]
    assert ours == stock  # the Allow headers too
    # Where the stock server reads on (HTTP/2.0 as 1.1, a target that is not ASCII), ours says why it does not.
    assert _status_of(url, b"GET /health HTTP/2.0\r\n\r\n") == b"505"
    assert _status_of(url, "GET /h\u00e9 HTTP/1.1\r\n\r\n".encode()) == b"400"
    # The routes take no body: one is refused before it is read whole (its bearer token is checked after).
    assert _status_of(url, b"GET /health HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (1 << 20)) == b"413"
    assert httpx.get(url + "/health", timeout=TIMEOUT).json()["status"] == "healthy"
    assert run(_open_and_step_once(url))  # the WebSocket handshake is unchanged


@pytest.mark.parametrize("token", [None, "t" * 32])
def test_a_head_answer_has_no_body_and_the_connection_goes_on(token):
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    with launch_local("CartPole-v1", token=token) as (url,), httpx.Client(timeout=TIMEOUT) as client:
        for path in ("/health", "/schema", "/mcp", "/nowhere"):
            for auth in ({}, headers):
                head = client.head(url + path, headers=auth)  # kept alive: the next request reads after it
                get = client.get(url + "/health")
                assert head.content == b"" and get.json()["status"] == "healthy", (path, auth)
                assert head.status_code in (401, 404, 405)
        assert client.head(url + "/schema", headers=headers).headers["allow"] == "GET"


def test_a_handshake_goes_to_websockets_however_it_is_cut_and_whatever_its_headers_say():
    handshake = (
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"X-Note: content-length: 5\r\nX-Original-Content-Length: 7\r\n"  # (no body for all that)
    )
    big = handshake + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 4000) for i in range(5)) + b"\r\n"  # a 20 KB head
    with launch_local("CartPole-v1") as (url,):
        assert _status_of(url, handshake + b"\r\n") == b"101"
        assert _status_of(url, big) == b"101"
        assert _status_of(url, [big[:17000], big[17000:]]) == b"101"  # past 16 KiB before its end: the same
        assert _status_of(url, [handshake[:20], handshake[20:60], handshake[60:] + b"\r\n"]) == b"101"
        # Two Content-Lengths, one of them not 0: a body websockets would close on without a word.
        assert _status_of(url, b"GET /health HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 2\r\n\r\n{}") == b"400"


async def _open_and_step_once(url: str) -> bool:
    ws = await stock_ws(url)
    await ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
    reset = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
    await ws.close()
    return reset["type"] == "observation"


def test_a_stock_client_that_floods_pings_and_reads_nothing_is_stopped_by_its_own_buffers():
    # Each ping makes a pong; a peer that reads none of them grew the server's memory one to one
    # with what it sent (1.5 GiB for 1.5 GiB of pings). Now the server stops reading from it.
    import socket

    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    from openenv_gym import launch_local

    with launch_local("CartPole-v1", max_sessions=2) as urls:
        port = int(urls[0].rsplit(":", 1)[1])
        client = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/ws"))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            client.send_request(client.connect())
            sock.sendall(b"".join(client.data_to_send()))
            while client.handshake_exc is None and client.state.name == "CONNECTING":
                client.receive_data(sock.recv(65536))
            assert client.state.name == "OPEN", client.handshake_exc
            client.send_ping(b"p" * 125)
            ping = b"".join(client.data_to_send())
            burst = ping * 8192  # ~1 MiB of pings (and we read none of the pongs)
            sock.settimeout(3)
            sent = 0
            with pytest.raises(TimeoutError):  # the server stops reading: our sends block
                while sent < 64 * 2**20:
                    sock.sendall(burst)
                    sent += len(burst)
        assert httpx.get(urls[0] + "/health", trust_env=False, timeout=10).status_code == 200


def test_requests_waiting_for_their_session_hold_a_bounded_number_of_bytes():
    # A request that waits (its session is busy) keeps its frame. A client pipelining big ones
    # behind a slow step made the server hold all of them: up to 256 x 16 MiB per connection.
    # Past 8 MiB of waiting requests, the server holds the rest unread, and then stops reading.
    import socket

    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    from openenv_gym import launch_local
    from openenv_gym.protocol import multiplex as fastp
    from openenv_gym.protocol.codec import MsgpackCodec

    codec = MsgpackCodec()
    slow = ["--execution", "thread", "--max-frame-bytes", str(4 << 20)]
    with launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 5.0}, extra_args=slow, max_sessions=2) as urls:
        port = int(urls[0].rsplit(":", 1)[1])
        client = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/ws"), subprotocols=[fastp.SUBPROTOCOL])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:

            def send(message) -> None:
                client.send_binary(codec.encode(message))
                sock.sendall(b"".join(client.data_to_send()))

            def receive():
                while True:
                    for event in client.events_received():
                        if hasattr(event, "data"):
                            return codec.decode(event.data) if event.opcode.name == "BINARY" else event
                    client.receive_data(sock.recv(65536))

            client.send_request(client.connect())
            sock.sendall(b"".join(client.data_to_send()))
            while client.state.name == "CONNECTING":
                client.receive_data(sock.recv(65536))
            assert client.state.name == "OPEN" and client.subprotocol == fastp.SUBPROTOCOL
            send(fastp.open_request(1, 1))
            sid = receive()["sessions"][0]
            send(fastp.reset_batch_request(2, [sid], [0]))
            receive()
            send(fastp.step_batch_request(3, [sid], {"action": np.zeros(1, np.int64)}))  # busy for 5 s
            big = "x" * (3 << 20)
            sock.settimeout(1)
            sent = 0
            with pytest.raises(TimeoutError):  # the server stops reading: our sends block
                for rid in range(4, 44):  # 40 resets of 3 MiB each, all waiting for the step
                    send(fastp.reset_batch_request(rid, [sid], [0], {"episode": big}))
                    sent += len(big)
            # (8 MiB running, 1 MiB and a frame held, and the kernel's buffers: up to 36 MiB here)
            assert sent < 80 << 20, f"the server read {sent >> 20} MiB of waiting requests"
        assert httpx.get(urls[0] + "/health", trust_env=False, timeout=10).status_code == 200


@pytest.mark.parametrize("read_ahead", [None, 16])
def test_a_stock_connection_reads_only_a_few_frames_ahead_of_the_one_it_answers(read_ahead):
    # websockets reads 16 messages ahead by default: 16 x --max-frame-bytes held per connection
    # while its handler is busy. The server reads 2 ahead (found by review), or --stock-read-ahead.
    import socket
    import time

    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    from openenv_gym.launch import ServerProcess, serve_command
    from tests.servers.launch import free_port, rss_bytes

    port = free_port()
    command = serve_command(
        "tests.servers.gym_envs:Slow-v0",
        host="127.0.0.1",
        port=port,
        max_sessions=2,
        env_kwargs={"delay": 30.0},
        extra_args=("--execution", "thread", "--max-frame-bytes", str(4 << 20))
        + (() if read_ahead is None else ("--stock-read-ahead", str(read_ahead))),
    )
    server = ServerProcess(command, "127.0.0.1", port)
    try:
        with httpx.Client(timeout=2.0, trust_env=False) as http:
            server.wait_healthy(http, time.monotonic() + 60)
        client = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/ws"))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            client.send_request(client.connect())
            sock.sendall(b"".join(client.data_to_send()))
            while client.state.name == "CONNECTING":
                client.receive_data(sock.recv(65536))
            assert client.state.name == "OPEN"
            client.send_text(json.dumps({"type": "reset", "data": {}}).encode())
            sock.sendall(b"".join(client.data_to_send()))
            while not any(hasattr(event, "data") for event in client.events_received()):  # the reset's reply
                client.receive_data(sock.recv(65536))
            # (busy for 30 s: however slowly this VM takes the 72 MiB below, the handler reads none of it meanwhile)
            client.send_text(json.dumps({"type": "step", "data": {"action": 0}}).encode())
            sock.sendall(b"".join(client.data_to_send()))
            before = rss_bytes(server.proc.pid)
            client.send_text(json.dumps({"type": "state", "data": {"pad": "x" * (3 << 20)}}).encode())
            frame = b"".join(client.data_to_send())
            sock.settimeout(1)
            with pytest.raises(TimeoutError):  # the server stops reading: our sends block
                for _ in range(24):  # 72 MiB
                    sock.sendall(frame)
            grown = rss_bytes(server.proc.pid) - before
        if read_ahead is None:
            assert grown < 24 << 20, f"the server holds {grown >> 20} MiB of unread requests"
        else:  # (16 frames of 3 MiB read ahead: the flag is the one that holds)
            assert grown > 36 << 20, f"the server holds only {grown >> 20} MiB of unread requests"
    finally:
        server.stop()


def test_connections_beyond_the_limit_get_503_and_the_server_serves_on_once_one_closes():
    from websockets.exceptions import InvalidStatus

    async def scenario(url: str) -> int:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        held = [await stock_ws(url) for _ in range(3)]  # sessions whose handshake passed: never dropped for a newcomer
        reader, writer = await asyncio.open_connection(host, int(port))
        answer = await reader.read()  # the server answers, then closes
        assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in answer
        writer.close()
        with pytest.raises(InvalidStatus) as refused:  # a WebSocket client is told the same
            await stock_ws(url)
        assert refused.value.response.status_code == 503
        for ws in held:
            await ws.close()
        async with httpx.AsyncClient(trust_env=False, timeout=TIMEOUT) as client:
            while True:  # (until the server has seen the three go: bounded by the caller's timeout)
                status = (await client.get(url + "/health")).status_code
                if status != 503:
                    return status
                await asyncio.sleep(0.01)

    with launch_local("CartPole-v1", max_sessions=4, extra_args=["--max-connections", "3"]) as (url,):
        assert run(asyncio.wait_for(scenario(url), TIMEOUT)) == 200


# ---------------------------------------------------------------- env values a reply cannot hold


@pytest.mark.parametrize("execution", ["auto", "thread"])
def test_an_info_no_reply_can_hold_costs_only_its_own_env(execution):
    """DeepInfo-v0's step(1) info nests 2,000 maps deep: that env's step fails, the others' go on."""
    import openenv_gym
    import tests.servers.gym_envs  # noqa: F401

    extra = ["--execution", execution]
    with launch_local("tests.servers.gym_envs:DeepInfo-v0", extra_args=extra) as (url,):
        with openenv_gym.OpenEnvVectorEnv(url, 3, batch_size=3 if execution == "auto" else 1) as envs:
            envs.reset(seed=0)
            if execution == "auto":  # lockstep, answered inline
                _, rewards, _, truncated, infos = envs.step(np.array([1, 0, 0]))
                assert truncated.tolist() == [True, False, False] and rewards.tolist() == [0.0, 1.0, 1.0]
                assert infos["_openenv_error"].tolist() == [True, False, False]
                assert infos["_plain"].tolist() == [False, True, True]
            else:  # send/recv, calls in threads, answered in parts
                envs.send(np.array([1, 0, 0]))
                seen = {}
                for _ in range(3):
                    _, rewards, _, truncated, infos = envs.recv(timeout=TIMEOUT)
                    seen[int(infos["env_id"][0])] = (bool(truncated[0]), "openenv_error" in infos)
                assert seen == {0: (True, True), 1: (False, False), 2: (False, False)}
            _, rewards, _, truncated, infos = envs.step(np.array([0, 0, 0]))  # env 0 is reset (NEXT_STEP)
            assert rewards.tolist() == [0.0, 1.0, 1.0] and not truncated.any() and "openenv_error" not in infos
            _, rewards, _, truncated, infos = envs.step(np.array([0, 0, 0]))  # and all step again
            assert rewards.tolist() == [1.0, 1.0, 1.0] and not truncated.any()


def test_strings_with_lone_surrogates_travel_as_on_json():
    """os.fsdecode of a non-UTF-8 file name holds lone surrogates: msgpack carries them (surrogatepass)."""
    import gymnasium as gym

    import openenv_gym
    import tests.servers.gym_envs  # noqa: F401

    local = gym.vector.SyncVectorEnv([lambda: gym.make("FileName-v0")] * 2)
    with launch_local("tests.servers.gym_envs:FileName-v0") as (url,):
        with openenv_gym.OpenEnvVectorEnv(url, 2) as envs:
            obs, info = envs.reset(seed=0)
            want_obs, want_info = local.reset(seed=0)
            assert obs == want_obs and info["file"].tolist() == want_info["file"].tolist() == ["log-\udcff.txt"] * 2
            _, _, _, truncated, info = envs.step(np.array([0, 1]))
            assert not truncated.any() and info["file"].tolist() == local.step(np.array([0, 1]))[4]["file"].tolist()
        for offer_msgpack in (True, False):
            env = openenv_gym.OpenEnvEnv(url, offer_msgpack=offer_msgpack)
            try:
                assert env.reset(seed=0)[1]["file"] == "log-\udcff.txt"
            finally:
                env.close()


def test_a_batch_reply_msgpack_refuses_fails_only_the_sessions_it_cannot_carry():
    from openenv_gym.server.wire.jobs import encodable_batch as _encodable_batch

    reply = fastp.batch_reply(
        3,
        [7, 8, 9],
        {"o": [1, 2**70, 3], "a": np.zeros((3, 2))},
        np.ones(3),
        np.zeros(3, dtype=bool),
        [{}, {}, {"big": 2**65}],
    )
    with pytest.raises((OverflowError, TypeError)):
        codec.encode(reply)
    parsed = fastp.parse_fast_reply(codec.decode(codec.encode(_encodable_batch(reply, codec.encode))))
    assert [e is None for e in parsed.errors] == [True, False, False]
    assert "cannot encode" in parsed.errors[1].message and parsed.observation["o"][0] == 1
