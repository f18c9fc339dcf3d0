"""What a server answers is held to the client's limits: its time, the arrays its schema asks for, its JSON (chaos tier).

A peer that drips ``/schema`` a byte at a time, a 300-byte schema that asks
for an array of 2**31 numbers, an answer of millions of empty lists: each is
refused with a clear error, fast, before anything big is made.
"""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from openenv_gym import ConnectError, LimitExceeded, Limits, OpenEnvEnv, OpenEnvVectorEnv, SpaceMappingError
from openenv_gym.protocol.codec import JsonCodec, check_json_containers
from openenv_gym.remote import fetch_schema, resolve_spaces
from tests.peers import dripping_http_server, rogue_http_server

pytestmark = pytest.mark.chaos

SCHEMA = {
    "observation": {"properties": {"x": {"type": "number"}}, "type": "object"},
    "action": {"properties": {"a": {"type": "integer", "minimum": 0, "maximum": 1}}, "required": ["a"], "type": "object"},
}


def _http_answer(path: str) -> bytes:
    body = json.dumps(SCHEMA if path == "/schema" else {"status": "healthy"}).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.mark.parametrize("make", [OpenEnvEnv, lambda url, **kw: OpenEnvVectorEnv(url, 2, **kw)], ids=["env", "pool"])
def test_connect_timeout_bounds_a_schema_dripped_a_byte_at_a_time(make):
    # Each read gets a byte within the per-read timeout: only a deadline for the whole answer ends the wait.
    with dripping_http_server(_http_answer, interval=0.05) as url:  # (the answer would take ~12 s)
        started = time.monotonic()
        with pytest.raises(ConnectError, match="no whole answer within 1 s"):
            make(url, connect_timeout=1.0)
        assert time.monotonic() - started < 3


def test_a_schema_of_an_array_too_big_for_the_limits_is_refused_before_it_is_made():
    huge = {"type": "array", "items": {"type": "number"}, "minItems": 2**31, "maxItems": 2**31}
    schema = {**SCHEMA, "observation": {"properties": {"x": huge, "y": {"type": "number"}}, "type": "object"}}
    assert len(json.dumps(schema)) < 400
    tracemalloc.start()
    try:
        assert resolve_spaces(schema).observation.info_fields == ("x",)  # (beside another field: in info, with a warning)
        with pytest.raises(SpaceMappingError, match="observation field 'x'.*over 67108864 bytes.*max_array_bytes"):
            resolve_spaces({**SCHEMA, "observation": {"properties": {"x": huge}, "type": "object"}})
        with pytest.raises(SpaceMappingError, match="over 1000 bytes"):
            resolve_spaces(
                {**SCHEMA, "observation": {"properties": {"x": {**huge, "minItems": 300, "maxItems": 300}}}},
                limits=Limits(max_array_bytes=1000),
            )
        action = {"properties": {"a": {**huge, "items": {"type": "integer"}}}, "required": ["a"]}
        with pytest.raises(SpaceMappingError, match="action field 'a'.*max_array_bytes"):
            resolve_spaces({**SCHEMA, "action": action})
        described = {"type": "Box", "dtype": "float64", "shape": [2**31], "low": "-inf", "high": "inf"}
        with pytest.raises(SpaceMappingError, match="Box.shape.*max_array_bytes"):
            resolve_spaces({**SCHEMA, "x-openenv-gym": {"observation_space": described}})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # (nothing near the 16 GiB the first schema asked for)


def test_an_answer_of_millions_of_empty_lists_is_refused_before_it_is_parsed():
    lists = 2_000_000
    junk = b'{"observation": {"properties": {}}, "junk": [' + b"[]," * (lists - 1) + b"[]]}"
    with rogue_http_server(lambda path: [junk]) as (url, _):
        started = time.monotonic()
        with pytest.raises(ConnectError, match="2000004 lists and objects, limit is 1000000"):
            fetch_schema(url, max_containers=1_000_000)
        assert time.monotonic() - started < 5
        assert fetch_schema(url)["junk"][0] == []  # (under the default limit, 4,194,304, it is read)


def test_a_stock_reply_of_too_many_containers_is_a_limit_and_brackets_in_text_do_not_count():
    codec = JsonCodec(Limits(max_json_containers=10))
    with pytest.raises(LimitExceeded, match="Limits.max_json_containers"):
        codec.decode("[" + "[]," * 20 + "[]]")
    text = json.dumps({"type": "observation", "data": {"observation": {"code": "[[[[{{{{" * 50}, "reward": 1.0, "done": False}})
    assert codec.decode(text)["data"]["observation"]["code"].startswith("[[[[")
    check_json_containers(b'["\\"[[[[", {"a": []}]', 3)  # (an escaped quote does not end the string)
    with pytest.raises(LimitExceeded):
        check_json_containers(b'["\\"[[[[", {"a": [[]]}]', 3)
