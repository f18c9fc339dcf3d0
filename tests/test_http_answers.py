"""What a client reads over HTTP (``/schema``, ``/health``) is bounded like what it reads over the WebSocket.

The peers here are the faults themselves (``tests.peers.rogue_http_server``):
an answer far over the configured size, sent whole or in chunks, and one
nested deeper than JSON can be read. Each is a ``ConnectError`` that says
why, after reading no more than the limit and a chunk.
"""

from __future__ import annotations

import json

import pytest

from openenv_gym import ConnectError, Limits, OpenEnvEnv, OpenEnvVectorEnv
from openenv_gym.remote import fetch_health, fetch_schema
from tests.peers import rogue_http_server

MiB = 1024 * 1024
SCHEMA = {"observation": {"properties": {"x": {"type": "number"}}}, "action": {"properties": {"a": {"type": "integer"}}}}


def padded(target_bytes: int) -> bytes:
    """A valid OpenEnv schema (with a long title) of about ``target_bytes`` bytes."""
    return json.dumps({**SCHEMA, "title": "x" * target_bytes}).encode()


def in_pieces(data: bytes, size: int = 64 * 1024):
    return (data[i : i + size] for i in range(0, len(data), size))


def test_a_schema_within_the_limit_is_read() -> None:
    with rogue_http_server(lambda path: [padded(100_000)]) as (url, _):
        assert fetch_schema(url, max_bytes=MiB, timeout=10)["observation"] == SCHEMA["observation"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_schema_over_the_limit_is_refused_having_read_little_of_it(chunked: bool) -> None:
    body = padded(32 * MiB)  # (more than the loopback socket buffers hold)
    with rogue_http_server(lambda path: in_pieces(body), chunked=chunked) as (url, sent):
        with pytest.raises(ConnectError, match=f"over {MiB} bytes"):
            fetch_schema(url, max_bytes=MiB, timeout=10)
        # The client hung up: the server could not write the whole answer
        # (what it wrote is at most the limit plus what the socket buffers held).
        assert sent.get(timeout=10) < len(body)


def test_a_health_answer_over_the_limit_is_refused() -> None:
    with rogue_http_server(lambda path: [json.dumps({"status": "healthy", "pad": "x" * (2 * MiB)}).encode()]) as (url, _):
        with pytest.raises(ConnectError, match=f"over {MiB} bytes"):
            fetch_health(url, max_bytes=MiB, timeout=10)
        assert fetch_health(url, timeout=10)["status"] == "healthy"  # (the default limit is 64 MiB)


def test_a_schema_nested_beyond_what_json_reads_is_a_connect_error_not_a_recursion_error() -> None:
    depth = 200_000
    with rogue_http_server(lambda path: [b"[" * depth + b"]" * depth]) as (url, _):
        with pytest.raises(ConnectError, match="nests too deep"):
            fetch_schema(url, timeout=10)


def test_envs_read_the_schema_within_their_limits() -> None:
    body = padded(3 * MiB)
    with rogue_http_server(lambda path: [body]) as (url, _):
        small = Limits(max_frame_bytes=MiB)
        with pytest.raises(ConnectError, match="Limits.max_frame_bytes"):
            OpenEnvEnv(url, limits=small)
        with pytest.raises(ConnectError, match="Limits.max_frame_bytes"):
            OpenEnvVectorEnv(url, 2, limits=small)
