"""A client that pipelines HTTP requests on one connection and reads no answer cannot make the server buffer without bound.

After a first ``POST /mcp`` a connection is plain HTTP/1.1 with keep-alive. The
server reads at most a few requests ahead of the one it answers, and writes no
answer while the peer reads none. So a client that only sends soon finds the
server no longer reading: its sends block, and what it sent waits in the
kernel's socket buffers, not in the server's memory. Once the client reads,
every request is answered, in order.
"""

from __future__ import annotations

import math
import re
import selectors
import socket
import sys
import time

import httpx
import pytest

from openenv_gym.launch import ServerProcess, serve_command
from tests.servers.launch import free_port, rss_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for memory and TCP buffer sizes")

MIB = 1024 * 1024
REQUEST_BYTES = 2048  # each pipelined request, padded: the server's count of requests, not their size, is bounded
STALL = 1.0  # seconds the client's sends stay blocked: the server has stopped reading
RSS_GROWTH = 32 * MIB  # the server's memory may grow this much while the client pushes
SEND_TIMEOUT = 10.0
DRAIN_TIMEOUT = 10.0


def kernel_max(name: str) -> int:
    """The largest buffer the kernel's autotuning gives a TCP socket (``tcp_rmem`` / ``tcp_wmem``, third value)."""
    with open(f"/proc/sys/net/ipv4/{name}") as f:
        return int(f.read().split()[2])


def read_answer(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytes]:
    """One whole HTTP answer from a blocking socket: (status code, body)."""
    while True:
        parsed = parse_answer(buffer)
        if parsed is not None:
            return parsed
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        buffer += chunk


def parse_answer(buffer: bytearray) -> tuple[bytes, bytes] | None:
    """Take one whole HTTP answer off the front of ``buffer``, if it holds one."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end])
    length = int(re.search(rb"\r\nContent-Length: (\d+)", head).group(1))
    if len(buffer) < end + 4 + length:
        return None
    body = bytes(buffer[end + 4 : end + 4 + length])
    del buffer[: end + 4 + length]
    return head.split(b" ", 2)[1], body


def test_a_client_that_pipelines_requests_and_reads_nothing_cannot_make_the_server_buffer_without_bound():
    port = free_port()
    command = serve_command(
        "CartPole-v1", host="127.0.0.1", port=port, max_sessions=2, env_kwargs=None, extra_args=["--log-level", "WARNING"]
    )
    server = ServerProcess(command, "127.0.0.1", port)
    sock = None
    try:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            server.wait_healthy(client, time.monotonic() + 60)
        pid = server.proc.pid

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Small client-side buffers, so that little of either direction hides in this end's kernel buffers.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.settimeout(5.0)
        sock.connect(("127.0.0.1", port))

        # A POST makes the connection plain HTTP; then a GET /schema on it, to learn the answer the GETs will get.
        rpc = b'{"jsonrpc": "2.0", "method": "no/such", "id": 1}'
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(rpc), rpc))
        sock.sendall(b"GET /schema HTTP/1.1\r\nHost: x\r\n\r\n")
        received = bytearray()
        assert read_answer(sock, received)[0] == b"200"
        status, schema = read_answer(sock, received)
        assert status == b"200" and schema.startswith(b"{") and not received

        head = b"GET /schema HTTP/1.1\r\nHost: x\r\nX-Pad: "
        request = head + b"p" * (REQUEST_BYTES - len(head) - 4) + b"\r\n\r\n"
        assert len(request) == REQUEST_BYTES
        stream = memoryview(request * (2 + 65536 // REQUEST_BYTES))  # the requests, back to back, from any offset

        # What the kernel alone may hold of what the client sends: the server's receive buffer (requests not
        # read yet), plus the requests whose answers fill the server's send buffer, plus 16 MiB for the
        # server's own read-ahead (a few requests, one read of the socket) and this end's small buffers.
        # A client that gets more through has found a server that buffers it in its own memory.
        per_answer = max(1, math.ceil(REQUEST_BYTES / len(schema)))  # request bytes behind one answer's bytes
        budget = kernel_max("tcp_rmem") + kernel_max("tcp_wmem") * per_answer + 16 * MIB

        # Push requests, reading nothing, until the sends stay blocked for STALL seconds, or the client has
        # sent more than the kernel can hold (the server kept reading), or the server's memory grew too much.
        rss_start = rss_bytes(pid)
        rss_peak = rss_start
        sock.setblocking(False)
        selector = selectors.DefaultSelector()
        selector.register(sock, selectors.EVENT_WRITE)
        sent = 0
        started = time.monotonic()
        while True:
            rss_peak = max(rss_peak, rss_bytes(pid))
            assert rss_peak - rss_start <= RSS_GROWTH, (
                f"the server's memory grew by {(rss_peak - rss_start) / MIB:.0f} MiB while the client sent "
                f"{sent / MIB:.0f} MiB of requests and read no answer"
            )
            assert sent <= budget, (
                f"the server kept reading: the client sent {sent / MIB:.0f} MiB of requests, reading no answer, "
                f"more than the kernel's buffers hold ({budget / MIB:.0f} MiB)"
            )
            assert time.monotonic() - started < SEND_TIMEOUT, f"the client's sends neither stalled nor ran over in {SEND_TIMEOUT} s"
            try:
                offset = sent % REQUEST_BYTES
                sent += sock.send(stream[offset : offset + 65536])
            except BlockingIOError:
                if not selector.select(timeout=STALL):
                    break  # blocked for STALL seconds: the server has stopped reading
        rss_peak = max(rss_peak, rss_bytes(pid))
        assert rss_peak - rss_start <= RSS_GROWTH
        assert server.proc.poll() is None

        # Now read: the server goes on, and answers every request, in order, with the whole schema.
        requests = -(-sent // REQUEST_BYTES)  # (the last one may be partly sent: send the rest)
        rest = requests * REQUEST_BYTES - sent
        selector.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if rest else 0))
        answered = 0
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while answered < requests:
            timeout = deadline - time.monotonic()
            assert timeout > 0, f"only {answered} of {requests} requests answered in {DRAIN_TIMEOUT} s"
            for _, events in selector.select(timeout=timeout):
                if events & selectors.EVENT_WRITE:
                    offset = sent % REQUEST_BYTES
                    try:
                        n = sock.send(stream[offset : offset + rest])
                    except BlockingIOError:
                        n = 0
                    sent += n
                    rest -= n
                    if not rest:
                        selector.modify(sock, selectors.EVENT_READ)
                if events & selectors.EVENT_READ:
                    try:
                        chunk = sock.recv(1 << 20)
                    except BlockingIOError:
                        continue
                    assert chunk, f"the server closed the connection after {answered} of {requests} answers"
                    received += chunk
                    while (parsed := parse_answer(received)) is not None:
                        assert parsed == (b"200", schema)
                        answered += 1
        assert answered == requests and not received
        selector.close()
    finally:
        if sock is not None:
            sock.close()
        server.stop()
