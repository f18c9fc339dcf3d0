"""The fast-path server's reading of the byte stream: frames split anywhere, fragments, control frames.

A raw TCP client (handshake and frames written by hand) talks to a real
server process, so that the tests choose exactly which bytes arrive when.
The frame splitter itself is checked against random chunkings.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import apply_mask

from openenv_gym import launch_local
from openenv_gym.protocol import multiplex as fastp
from openenv_gym.protocol.codec import MsgpackCodec
from openenv_gym.server.wire.framing import FrameSplitter, Message, Raw

TIMEOUT = 20.0
codec = MsgpackCodec()


def frame(payload: bytes, opcode: int = 0x2, fin: bool = True, masked: bool = True) -> bytes:
    """One client frame (masked, as RFC 6455 wants from clients)."""
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head = bytes((first, mask_bit | n))
    elif n < 0x10000:
        head = struct.pack("!BBH", first, mask_bit | 126, n)
    else:
        head = struct.pack("!BBQ", first, mask_bit | 127, n)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + apply_mask(payload, key)


# ---------------------------------------------------------------- the splitter, without I/O


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 125, 126, 127, 300, 65535, 65536, 70000]), min_size=1, max_size=8),
    cuts=st.lists(st.integers(1, 5000), min_size=1, max_size=50),
)
def test_splitter_reads_every_message_whatever_the_chunks(sizes, cuts):
    messages = [os.urandom(n) for n in sizes]
    stream = b"".join(frame(m) for m in messages)
    splitter = FrameSplitter(1 << 20)
    pieces: list = []
    at, i = 0, 0
    while at < len(stream):
        step = cuts[i % len(cuts)]
        pieces += splitter.feed(stream[at : at + step], True)
        at, i = at + step, i + 1
    assert [p.payload for p in pieces] == messages
    assert all(type(p) is Message for p in pieces)
    assert splitter.buffered == 0


def test_splitter_hands_control_frames_fragments_and_text_to_the_protocol_whole():
    ping = frame(b"p", opcode=0x9)
    first = frame(b"ab", opcode=0x2, fin=False)
    last = frame(b"cd", opcode=0x0)
    text = frame(b"hi", opcode=0x1)
    splitter = FrameSplitter(1 << 20)
    # A whole binary frame, a ping on its own (it may go ahead of held requests), then the
    # rest raw in one piece (it may start a fragmented message); a ping inside that run stays in it.
    out = splitter.feed(frame(b"m") + ping + first + ping + last + text, True)
    assert [type(p) for p in out] == [Message, Raw, Raw]
    assert out[0].payload == b"m"
    assert out[1] == Raw(ping, control=True)
    assert out[2] == Raw(first + ping + last + text)
    # Not on the fast path (a fragmented message in progress): binary frames go raw too.
    binary = frame(b"x")
    assert splitter.feed(binary, False) == [Raw(binary)]


def test_splitter_does_not_buffer_an_oversized_or_unmasked_frame():
    splitter = FrameSplitter(10)
    big = frame(b"x" * 11)
    out = splitter.feed(big[:6], True)
    assert out == [Raw(big[:6])]  # the header says too big: no buffering, the protocol fails it
    assert splitter.feed(big[6:], True) == [Raw(big[6:])]
    assert splitter.buffered == 0
    unmasked = frame(b"x", masked=False)
    assert FrameSplitter(10).feed(unmasked, True) == [Raw(unmasked)]


# ---------------------------------------------------------------- a live server


@pytest.fixture(scope="module")
def url():
    with launch_local("CartPole-v1", servers=1, max_sessions=16) as urls:
        yield urls[0]


class RawClient:
    """A WebSocket client written by hand over a TCP stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.rid = 0

    @classmethod
    async def connect(cls, url: str) -> "RawClient":
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {fastp.SUBPROTOCOL}\r\n\r\n"
            ).encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        assert fastp.SUBPROTOCOL.encode() in head
        return cls(reader, writer)

    def request(self, build) -> bytes:
        self.rid += 1
        return codec.encode(build(self.rid))

    async def write(self, data: bytes, chunk: int | None = None) -> None:
        if chunk is None:
            self.writer.write(data)
            await self.writer.drain()
            return
        for at in range(0, len(data), chunk):
            self.writer.write(data[at : at + chunk])
            await self.writer.drain()

    async def read_frame(self) -> tuple[int, bytes]:
        first, second = await self.reader.readexactly(2)
        n = second & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
        assert not second & 0x80, "server frames are not masked"
        return first & 0x0F, await self.reader.readexactly(n)

    async def reply(self) -> fastp.FastReply:
        opcode, payload = await self.read_frame()
        assert opcode == 0x2, (opcode, payload)
        return fastp.parse_fast_reply(codec.decode(payload))

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def live(coro_fn):
    """Run ``coro_fn(client)`` against a fresh raw connection, bounded by TIMEOUT."""

    def run(url: str):
        async def main():
            async with asyncio.timeout(TIMEOUT):
                client = await RawClient.connect(url)
                try:
                    return await coro_fn(client)
                finally:
                    await client.close()

        return asyncio.run(main())

    return run


async def _open_and_reset(client: RawClient, n: int = 2) -> list[int]:
    await client.write(frame(client.request(lambda rid: fastp.open_request(rid, n))))
    opened = await client.reply()
    assert isinstance(opened, fastp.OpenedReply)
    await client.write(frame(client.request(lambda rid: fastp.reset_batch_request(rid, opened.sessions, [1] * n))))
    reset = await client.reply()
    assert isinstance(reset, fastp.BatchReply) and reset.errors is None
    return opened.sessions


def test_a_request_written_one_byte_at_a_time_is_answered(url):
    async def scenario(client: RawClient):
        sids = await _open_and_reset(client)
        step = client.request(lambda rid: fastp.step_batch_request(rid, sids, {"action": np.array([0, 1])}, None))
        await client.write(frame(step), chunk=1)
        reply = await client.reply()
        assert isinstance(reply, fastp.BatchReply) and reply.id == client.rid
        assert reply.observation["observation"].shape == (2, 4)

    live(scenario)(url)


def test_requests_in_one_write_are_answered_in_order(url):
    async def scenario(client: RawClient):
        sids = await _open_and_reset(client)
        data = b""
        ids = []
        for k in range(5):
            data += frame(client.request(lambda rid: fastp.step_batch_request(rid, sids, {"action": np.array([k % 2, 1])}, None)))
            ids.append(client.rid)
        await client.write(data)
        replies = [await client.reply() for _ in ids]
        assert [r.id for r in replies] == ids
        assert all(isinstance(r, fastp.BatchReply) and r.errors is None for r in replies)

    live(scenario)(url)


def test_a_fragmented_request_with_a_ping_inside_is_answered_and_the_ping_ponged(url):
    async def scenario(client: RawClient):
        sids = await _open_and_reset(client)
        payload = client.request(lambda rid: fastp.step_batch_request(rid, sids, {"action": np.array([1, 0])}, None))
        half = len(payload) // 2
        data = frame(payload[:half], opcode=0x2, fin=False) + frame(b"are you there", opcode=0x9)
        await client.write(data)
        opcode, pong = await client.read_frame()
        assert (opcode, pong) == (0xA, b"are you there")
        await client.write(frame(payload[half:], opcode=0x0))
        reply = await client.reply()
        assert isinstance(reply, fastp.BatchReply) and reply.id == client.rid and reply.errors is None
        # and the fast path goes on after it
        await client.write(frame(client.request(lambda rid: fastp.state_batch_request(rid, sids))))
        states = await client.reply()
        assert isinstance(states, fastp.StatesReply) and [s["step_count"] for s in states.states] == [1, 1]

    live(scenario)(url)


def test_a_text_frame_gets_an_error_reply_and_invalid_utf8_closes_with_1007(url):
    async def scenario(client: RawClient):
        await client.write(frame(b'{"type": "reset"}', opcode=0x1))
        reply = await client.reply()
        assert isinstance(reply, fastp.FastErrorReply) and reply.error.code == "INVALID_JSON"
        await client.write(frame(b"\x80", opcode=0x1))
        opcode, payload = await client.read_frame()
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1007

    live(scenario)(url)


def test_replies_not_read_for_a_while_all_arrive_in_order(url):
    async def scenario(client: RawClient):
        sids = await _open_and_reset(client, 4)
        ids = []
        for k in range(300):
            await client.write(
                frame(client.request(lambda rid: fastp.step_batch_request(rid, sids, {"action": np.array([k % 2] * 4)}, None)))
            )
            ids.append(client.rid)
        replies = [await client.reply() for _ in ids]
        assert [r.id for r in replies] == ids
        assert all(isinstance(r, fastp.BatchReply) for r in replies)

    live(scenario)(url)


def test_a_client_that_does_not_read_stops_the_server_reading_and_loses_nothing():
    # Each request carries 200 kB (a reset option the env ignores) and gets a
    # 403 kB reply (4 frames of 210x160x3). A client that never reads must see
    # its writes block after a bounded number of requests (the server stops
    # reading once its replies back up), not the server buffering them all.
    cap, pad = 200, b"x" * 200_000
    with launch_local("openenv_gym/Frames-v0", servers=1, max_sessions=4) as urls:

        async def scenario(client: RawClient):
            sids = await _open_and_reset(client, 4)
            ids: list[int] = []
            blocked = False
            while len(ids) < cap and not blocked:
                client.writer.write(frame(client.request(lambda rid: fastp.reset_batch_request(rid, sids, None, {"pad": pad}))))
                ids.append(client.rid)
                try:
                    await asyncio.wait_for(client.writer.drain(), 2.0)
                except TimeoutError:
                    blocked = True  # nobody reads on the other side: backpressure reached us
            assert blocked, f"the server read all {cap} requests without its replies being read"
            replies = [await client.reply() for _ in ids]
            assert [r.id for r in replies] == ids
            assert all(r.observation["observation"].shape == (4, 210, 160, 3) for r in replies)
            # and the connection goes on
            await _write_many(client, sids, ids, 1)
            assert (await client.reply()).id == ids[-1]

        live(scenario)(urls[0])


async def _write_many(client: RawClient, sids: list[int], ids: list[int], count: int) -> None:
    for k in range(count):
        actions = {"action": np.array([k % 2] * len(sids))}
        await client.write(frame(client.request(lambda rid: fastp.step_batch_request(rid, sids, actions, None))))
        ids.append(client.rid)


def test_the_takeover_knows_when_websockets_parser_stands_between_frames():
    # The server takes the socket over from websockets right after the handshake; bytes of a
    # frame websockets has begun to read must stay its own. This check (on websockets' Sans-I/O
    # protocol, fed by hand) is what decides, so a websockets release that changes its parser
    # shows up here, not as a silently slower server.
    from websockets.server import ServerProtocol

    from openenv_gym._internals import parser_between_frames as between_frames

    protocol = ServerProtocol()
    key = base64.b64encode(os.urandom(16)).decode()
    protocol.receive_data(
        f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    (request,) = protocol.events_received()
    protocol.send_response(protocol.accept(request))
    protocol.data_to_send()
    assert between_frames(protocol)
    whole = frame(b"hello")
    protocol.receive_data(whole[:2])  # the parser takes the 2-byte header and waits for the rest
    assert not between_frames(protocol)
    protocol.receive_data(whole[2:])
    assert [f.data for f in protocol.events_received()] == [b"hello"]
    assert between_frames(protocol)
    protocol.receive_data(whole[:1])  # one byte, not yet taken by the parser
    assert not between_frames(protocol)


def test_a_peer_that_keeps_a_failed_connection_open_loses_it_after_the_close_timeout():
    # Pings off: only the close timeout can end it. The session held by the connection is freed then.
    extra = ["--ping-interval", "0", "--close-timeout", "0.5"]
    with launch_local("CartPole-v1", servers=1, max_sessions=4, extra_args=extra) as urls:

        async def scenario(client: RawClient):
            await _open_and_reset(client, 1)
            await client.write(frame(b"\x80", opcode=0x1))  # invalid UTF-8: the server fails the connection
            opcode, payload = await client.read_frame()
            assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1007
            # We never close our side. The server must let go of the connection (and its session) by itself.
            async with httpx.AsyncClient(trust_env=False, timeout=5.0) as http:
                deadline = asyncio.get_running_loop().time() + 10.0
                while (await http.get(urls[0] + "/health")).json()["active_sessions"] != 0:
                    assert asyncio.get_running_loop().time() < deadline, "the session is still held"
                    await asyncio.sleep(0.05)  # (no event to await from outside the server)

        live(scenario)(urls[0])


def test_a_message_in_more_fragments_than_the_limit_closes_with_1009_and_costs_nothing_else():
    async def scenario(client: RawClient):
        sids = await _open_and_reset(client)
        payload = client.request(lambda rid: fastp.step_batch_request(rid, sids, {"action": np.array([1, 0])}, None))
        # Within the limit (8 fragments): answered.
        pieces = [payload[:1]] + [payload[i : i + 1] for i in range(1, 7)] + [payload[7:]]
        data = b"".join(frame(p, opcode=0x2 if i == 0 else 0x0, fin=i == len(pieces) - 1) for i, p in enumerate(pieces))
        await client.write(data)
        reply = await client.reply()
        assert isinstance(reply, fastp.BatchReply) and reply.errors is None
        # One more fragment than the limit: the server closes with 1009, as websockets does for its own connections.
        payload = client.request(lambda rid: fastp.state_batch_request(rid, sids))
        await client.write(b"".join(frame(payload[i : i + 1], opcode=0x2 if i == 0 else 0x0, fin=False) for i in range(9)))
        opcode, closing = await client.read_frame()
        assert opcode == 0x8 and struct.unpack("!H", closing[:2])[0] == 1009 and b"too many fragments" in closing

    async def bystander(client: RawClient):
        sids = await _open_and_reset(client)
        await client.write(frame(client.request(lambda rid: fastp.state_batch_request(rid, sids))))
        assert isinstance(await client.reply(), fastp.StatesReply)

    with launch_local("CartPole-v1", servers=1, max_sessions=8, extra_args=["--max-fragments", "8"]) as (url,):
        live(scenario)(url)
        live(bystander)(url)  # the server goes on
