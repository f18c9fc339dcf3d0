"""Hostile input, property-based: both sides' decoders, then a live server.

Whatever a peer sends, a decoder either returns a well-formed message or
raises ``ProtocolError`` (``LimitExceeded`` for what is larger or deeper than
the configured :class:`Limits`); the server-side parsers raise
``FastRequestError`` / ``RequestError``. No other exception, no allocation
sized by what the peer declared, and every call is quick.

A live server answers every hostile frame with a stock error code (or closes
that one connection with a clear close code), while a canary session on
another connection keeps stepping, the server stays up, no session slot
leaks, and its memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import struct
import sys
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any, Iterator

import httpx
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from openenv_gym.config import Limits
from openenv_gym.errors import LimitExceeded, ProtocolError
from openenv_gym.launch import ServerProcess
from openenv_gym.protocol import multiplex as fastp
from openenv_gym.protocol.codec import WIRE_DTYPES, JsonCodec, MsgpackCodec, decode_ndarray
from openenv_gym.protocol.messages import (
    CAPACITY_REACHED,
    EXECUTION_ERROR,
    FACTORY_ERROR,
    INVALID_JSON,
    SESSION_ERROR,
    UNKNOWN_TYPE,
    VALIDATION_ERROR,
    ErrorReply,
    Request,
    RequestError,
    StateReply,
    StepReply,
    close_request,
    error_reply,
    observation_reply,
    parse_reply,
    parse_request,
    reset_request,
    state_reply,
    step_request,
)
from openenv_gym.server.wire.stock_loop import check_seed
from tests.servers.launch import free_port, rss_bytes

pytestmark = pytest.mark.chaos

STOCK_CODES = frozenset({INVALID_JSON, UNKNOWN_TYPE, VALIDATION_ERROR, EXECUTION_ERROR, CAPACITY_REACHED, FACTORY_ERROR, SESSION_ERROR})
MAX_ID = fastp.MAX_ID
U64 = 2**64 - 1
DEFAULT = Limits()
SMALL = Limits(max_frame_bytes=4096, max_array_bytes=256, max_depth=6, max_ndim=3)
LIMITS = st.sampled_from([DEFAULT, SMALL])
MAX_COUNT = 8

#: Pure decoder properties. No per-example deadline: a time limit fails on a loaded machine, not on slow
#: code (the work per example is bounded by the limits the tests assert, not by the clock).
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ====================================================================== strategies

WIRE_NP = [np.dtype(s) for s in WIRE_DTYPES]
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])

msgpack_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), U64),
    st.floats(),
    st.text(max_size=12),
    st.binary(max_size=12),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.integers(-(10**400), 10**400),
    st.floats(),
    st.text(max_size=12),
)


def wire_arrays(shape: Any = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)) -> st.SearchStrategy:
    """numpy arrays of every wire dtype, NaN and infinities included."""
    return hnp.arrays(st.sampled_from(WIRE_NP), shape)


def trees(leaves: st.SearchStrategy) -> st.SearchStrategy:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=10,
    )


msgpack_values = trees(msgpack_scalars | wire_arrays())
json_values = trees(json_scalars)
ids = st.one_of(st.integers(0, 16), st.integers(0, MAX_ID))
session_lists = st.lists(ids, max_size=4, unique=True)
error_entries = st.builds(
    lambda code, message: {"code": code, "message": message},
    st.sampled_from(sorted(STOCK_CODES)) | st.text(max_size=8),
    st.text(max_size=16),
)


def columns(n: int) -> st.SearchStrategy:
    """A column for ``n`` sessions: an array with a leading axis of ``n``, or a list of ``n``."""
    shaped = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3).map(lambda s: (n, *s))
    return hnp.arrays(st.sampled_from(WIRE_NP), shaped) | st.lists(msgpack_values, min_size=n, max_size=n)


def batches(n: int) -> st.SearchStrategy:
    return st.dictionaries(st.text(max_size=8), columns(n), max_size=3)


@st.composite
def fast_requests(draw: st.DrawFn) -> dict[str, Any]:
    """Valid fast-path client requests."""
    rid = draw(ids)
    kind = draw(st.sampled_from(["open", "reset", "step", "state", "close"]))
    if kind == "open":
        return fastp.open_request(rid, draw(st.integers(1, MAX_COUNT)))
    sessions = draw(session_lists)
    n = len(sessions)
    if kind == "reset":
        seeds = draw(st.none() | st.lists(st.none() | st.integers(0, U64), min_size=n, max_size=n))
        options = draw(st.none() | st.dictionaries(st.text(max_size=6), msgpack_values, max_size=3))
        return fastp.reset_batch_request(rid, sessions, seeds, options)
    if kind == "step":
        resets = draw(st.none() | hnp.arrays(np.bool_, (n,)))
        return fastp.step_batch_request(rid, sessions, draw(batches(n)), resets)
    if kind == "state":
        return fastp.state_batch_request(rid, sessions)
    return fastp.close_batch_request(rid, sessions)


@st.composite
def fast_replies(draw: st.DrawFn) -> dict[str, Any]:
    """Valid fast-path server replies; ``reward`` and ``done`` as arrays or as lists."""
    rid = draw(ids)
    kind = draw(st.sampled_from(["batch", "opened", "states", "closed", "error"]))
    if kind == "error":
        return fastp.fast_error_reply(draw(st.none() | ids), draw(st.sampled_from(sorted(STOCK_CODES))), draw(st.text(max_size=16)))
    sessions = draw(session_lists)
    n = len(sessions)
    if kind == "opened":
        return fastp.opened_reply(rid, sessions)
    if kind == "closed":
        return fastp.closed_reply(rid, sessions)
    if kind == "states":
        states = draw(st.lists(st.dictionaries(st.text(max_size=6), msgpack_values, max_size=3), min_size=n, max_size=n))
        return fastp.states_reply(rid, sessions, states)
    reward = draw(hnp.arrays(np.float64, (n,)))
    done = draw(hnp.arrays(np.bool_, (n,)))
    metadata = draw(st.none() | st.lists(st.dictionaries(st.text(max_size=6), msgpack_values, max_size=2), min_size=n, max_size=n))
    errors = draw(st.none() | st.lists(st.none() | error_entries, min_size=n, max_size=n))
    message = fastp.batch_reply(rid, sessions, draw(batches(n)), reward, done, metadata, errors)
    if draw(st.booleans()):  # the list forms a receiver must accept as well
        message["reward"] = [None if math.isnan(r) else r for r in reward.tolist()]
        message["done"] = done.tolist()
    return message


json_maps = st.dictionaries(st.text(max_size=6), json_values, max_size=3)

stock_requests = st.one_of(
    st.builds(
        lambda seed, kwargs: reset_request(seed, **kwargs),
        st.none() | st.integers(0, U64),
        st.dictionaries(st.text(max_size=6).filter(lambda k: k != "seed"), json_values, max_size=3),
    ),
    json_maps.map(step_request),
    st.just({"type": "state"}),
    st.just(close_request()),
)

stock_replies = st.one_of(
    st.builds(observation_reply, json_maps, st.none() | st.floats(allow_nan=False), st.booleans(), st.none() | json_maps),
    json_maps.map(state_reply),
    st.builds(error_reply, st.sampled_from(sorted(STOCK_CODES)) | st.text(max_size=8), st.text(max_size=16)),
)

FIELD_NAMES = [
    "type", "id", "count", "sessions", "seeds", "options", "actions", "resets",
    "observation", "reward", "done", "metadata", "errors", "states", "data", "code", "message", "seed",
]  # fmt: skip
KINDS = ["open", "reset", "step", "state", "close", "opened", "batch", "states", "closed", "error", "observation"]


def loose_messages(values: st.SearchStrategy) -> st.SearchStrategy:
    """Maps with the protocol's own field names (and often a known ``type``) holding anything."""
    return st.builds(
        lambda fields, kind: fields if kind is None else {**fields, "type": kind},
        st.dictionaries(st.sampled_from(FIELD_NAMES), values, max_size=6),
        st.none() | st.sampled_from(KINDS),
    )


# ---------------------------------------------------------------- frame damage


@st.composite
def damaged(draw: st.DrawFn, frame: bytes) -> bytes:
    """``frame`` truncated, with bytes flipped, inserted or dropped."""
    how = draw(st.sampled_from(["truncate", "flip", "insert", "drop"]))
    if how == "truncate" or not frame:
        return frame[: draw(st.integers(0, max(len(frame) - 1, 0)))]
    data = bytearray(frame)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif data:
            del data[at : at + draw(st.integers(1, 8))]
    return bytes(data)


def positions(obj: Any, path: tuple = ()) -> Iterator[tuple]:
    """Paths to every value inside ``obj`` (maps and lists; arrays are leaves)."""
    yield path
    if type(obj) is dict:
        for key, value in obj.items():
            yield from positions(value, (*path, key))
    elif type(obj) is list:
        for i, value in enumerate(obj):
            yield from positions(value, (*path, i))


def replaced(obj: Any, path: tuple, value: Any) -> Any:
    """A copy of ``obj`` with the value at ``path`` replaced."""
    if not path:
        return value
    copy = dict(obj) if type(obj) is dict else list(obj)
    copy[path[0]] = replaced(obj[path[0]], path[1:], value)
    return copy


def value_at(obj: Any, path: tuple) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def non_finite_like(old: Any, value: float) -> Any:
    """``value`` in the place of ``old``: an array of it where ``old`` is an array."""
    if isinstance(old, np.ndarray):
        return np.full(old.shape, value)
    return value


# ---------------------------------------------------------------- msgpack building blocks


def ext_bytes(code: int, data: bytes) -> bytes:
    """A msgpack ext object of any type code (``msgpack.ExtType`` refuses negative codes)."""
    n = len(data)
    if n in (1, 2, 4, 8, 16):
        head = bytes([{1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}[n]])
    elif n < 256:
        head = bytes([0xC7, n])
    else:
        head = b"\xc8" + struct.pack(">H", n)
    return head + struct.pack("b", code) + data


def ndarray_header(dtype: bytes, shape: list[int], *, dtype_len: int | None = None, ndim: int | None = None) -> bytes:
    head = bytes([len(dtype) if dtype_len is None else dtype_len]) + dtype
    head += bytes([len(shape) if ndim is None else ndim]) + b"".join(struct.pack("<Q", d) for d in shape)
    return head + bytes(-len(head) % 8)


HUGE_DIMS = st.sampled_from([0, 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, U64])


@st.composite
def ndarray_ext_data(draw: st.DrawFn) -> bytes:
    """ndarray ext payloads: huge declared shapes, tiny payloads, odd dtypes and ndims."""
    dtype = draw(
        st.sampled_from([s.encode() for s in WIRE_DTYPES])
        | st.sampled_from([b">f8", b"|O", b"<U4", b"|V8", b"<c16", b"<M8[s]", b"f8", b"<f", b""])
        | st.binary(max_size=10)
    )
    dims = draw(st.lists(st.integers(0, 16) | st.integers(0, U64) | HUGE_DIMS, max_size=8))
    dtype_len = draw(st.none() | st.integers(0, 255))
    ndim = draw(st.none() | st.integers(0, 255))
    payload = draw(st.binary(max_size=64) | st.integers(0, 64).map(bytes))
    data = ndarray_header(dtype, dims, dtype_len=dtype_len, ndim=ndim) + payload
    return data[: draw(st.none() | st.integers(0, len(data)))]


# ====================================================================== readers (the properties)


@contextlib.contextmanager
def peak_allocation() -> Iterator[list[int]]:
    """Yields a list that holds, after the block, the peak of traced allocations in it (bytes)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    out: list[int] = []
    try:
        yield out
    finally:
        out.append(tracemalloc.get_traced_memory()[1] - base)
        if started:
            tracemalloc.stop()


def assert_arrays_within(message: Any, limits: Limits) -> None:
    """Every array in a decoded message has a wire dtype and fits ``limits``."""
    stack = [message]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            assert all(type(k) in (str, bytes) for k in item)
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
        elif isinstance(item, np.ndarray):
            assert item.dtype.str in WIRE_DTYPES
            assert item.ndim <= limits.max_ndim and item.nbytes <= limits.max_array_bytes
        else:
            assert item is None or type(item) in (bool, int, float, str, bytes), type(item)


REFUSED = object()


def decoded(codec: JsonCodec | MsgpackCodec, frame: str | bytes) -> Any:
    """The decoded frame, or ``REFUSED`` (``ProtocolError``); any other exception fails the test."""
    try:
        message = codec.decode(frame)
    except ProtocolError:
        return REFUSED
    assert_arrays_within(message, codec.limits)
    return message


def is_id(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_ID


def assert_fast_reply_well_formed(reply: fastp.FastReply) -> None:
    if isinstance(reply, fastp.FastErrorReply):
        assert reply.id is None or is_id(reply.id)
        assert type(reply.error.code) is str and type(reply.error.message) is str
        assert type(reply.error.data) is dict
        return
    assert is_id(reply.id)
    assert type(reply.sessions) is list and all(is_id(s) for s in reply.sessions)
    n = len(reply.sessions)
    if isinstance(reply, fastp.BatchReply):
        assert type(reply.observation) is dict
        for column in reply.observation.values():
            assert fastp.column_length(column) == n
        assert isinstance(reply.reward, np.ndarray) and reply.reward.dtype == np.float64 and reply.reward.shape == (n,)
        assert isinstance(reply.done, np.ndarray) and reply.done.dtype == np.bool_ and reply.done.shape == (n,)
        assert reply.metadata is None or (len(reply.metadata) == n and all(type(m) is dict for m in reply.metadata))
        if reply.errors is not None:
            assert len(reply.errors) == n
            assert all(e is None or (isinstance(e, ErrorReply) and type(e.code) is str) for e in reply.errors)
    elif isinstance(reply, fastp.StatesReply):
        assert len(reply.states) == n and all(type(s) is dict for s in reply.states)
    else:
        assert isinstance(reply, (fastp.OpenedReply, fastp.ClosedReply))


def assert_fast_request_well_formed(request: fastp.FastRequest, max_count: int) -> None:
    assert is_id(request.id)
    assert request.type in ("open", "reset", "step", "state", "close")
    if request.type == "open":
        assert request.sessions == [] and type(request.count) is int and 1 <= request.count <= max_count
        return
    assert all(is_id(s) for s in request.sessions) and len(set(request.sessions)) == len(request.sessions)
    n = len(request.sessions)
    if request.type == "reset":
        if request.seeds is not None:
            assert len(request.seeds) == n
            assert all(s is None or (type(s) is int and s >= 0) for s in request.seeds)
        assert request.options is None or type(request.options) is dict
    if request.type == "step":
        assert type(request.actions) is dict
        for column in request.actions.values():
            assert fastp.column_length(column) == n
        if request.resets is not None:
            assert request.resets.dtype == np.bool_ and request.resets.shape == (n,)


def assert_reply_well_formed(reply: Any) -> None:
    if isinstance(reply, StepReply):
        assert type(reply.observation) is dict and type(reply.metadata) is dict
        assert reply.reward is None or type(reply.reward) is float
        assert type(reply.done) is bool
    elif isinstance(reply, StateReply):
        assert type(reply.data) is dict
    else:
        assert isinstance(reply, ErrorReply)
        assert type(reply.code) is str and type(reply.message) is str and type(reply.data) is dict


def client_reads_fast(frame: bytes, limits: Limits = DEFAULT) -> Any:
    """What a client makes of a frame: a well-formed :data:`FastReply` or ``REFUSED``."""
    message = decoded(MsgpackCodec(limits), frame)
    return REFUSED if message is REFUSED else client_parses_fast(message)


def client_parses_fast(message: Any) -> Any:
    try:
        reply = fastp.parse_fast_reply(message)
    except ProtocolError:
        return REFUSED
    assert_fast_reply_well_formed(reply)
    return reply


def server_reads_fast(frame: bytes, limits: Limits = DEFAULT) -> Any:
    """What a server makes of a frame: a well-formed request, a ``FastRequestError``, or ``REFUSED``."""
    message = decoded(MsgpackCodec(limits), frame)
    return REFUSED if message is REFUSED else server_parses_fast(message)


def server_parses_fast(message: Any) -> Any:
    try:
        request = fastp.parse_fast_request(message, max_count=MAX_COUNT)
    except fastp.FastRequestError as exc:
        assert exc.code in (VALIDATION_ERROR, UNKNOWN_TYPE)
        assert exc.id is None or (is_id(exc.id) and exc.id == message.get("id"))
        assert type(exc.message) is str
        return exc
    assert_fast_request_well_formed(request, MAX_COUNT)
    return request


def client_reads_stock(frame: str | bytes, limits: Limits = DEFAULT) -> Any:
    message = decoded(JsonCodec(limits), frame)
    return REFUSED if message is REFUSED else client_parses_stock(message)


def client_parses_stock(message: Any) -> Any:
    try:
        reply = parse_reply(message)
    except ProtocolError:
        return REFUSED
    assert_reply_well_formed(reply)
    return reply


def server_reads_stock(frame: str | bytes, limits: Limits = DEFAULT) -> Any:
    message = decoded(JsonCodec(limits), frame)
    return REFUSED if message is REFUSED else server_parses_stock(message)


def server_parses_stock(message: Any) -> Any:
    """``parse_request``, then the seed check a stock server makes before ``reset``."""
    try:
        request = parse_request(message)
        assert isinstance(request, Request) and type(request.data) is dict
        assert request.type in ("reset", "step", "state", "close")
        if request.type in ("state", "close"):
            assert request.data == {}
        if request.type == "reset":
            seed = check_seed(request.data.get("seed"))
            assert seed is None or (type(seed) is int and seed >= 0)
    except RequestError as exc:
        assert exc.code in (VALIDATION_ERROR, UNKNOWN_TYPE) and type(exc.message) is str
        return exc
    return request


def every_reader(frame: bytes, limits: Limits) -> None:
    client_reads_fast(frame, limits)
    server_reads_fast(frame, limits)
    client_reads_stock(frame, limits)
    server_reads_stock(frame, limits)


def refused(outcome: Any) -> bool:
    return outcome is REFUSED or isinstance(outcome, (fastp.FastRequestError, RequestError))


# ====================================================================== pure decoders


@pytest.mark.unit
@FAST
@given(frame=st.binary(max_size=512), limits=LIMITS)
def test_random_bytes_are_refused_or_read_cleanly_by_every_decoder(frame, limits):
    every_reader(frame, limits)


@pytest.mark.unit
@FAST
@given(text=st.text(max_size=256), limits=LIMITS)
def test_random_text_is_refused_or_read_cleanly_by_the_json_side(text, limits):
    client_reads_stock(text, limits)
    server_reads_stock(text, limits)


@pytest.mark.unit
@FAST
@given(data=st.data(), request=fast_requests(), limits=LIMITS)
def test_damaged_fast_requests_are_refused_or_read_cleanly(data, request, limits):
    frame = data.draw(damaged(MsgpackCodec().encode(request)))
    server_reads_fast(frame, limits)
    client_reads_fast(frame, limits)


@pytest.mark.unit
@FAST
@given(data=st.data(), reply=fast_replies(), limits=LIMITS)
def test_damaged_fast_replies_are_refused_or_read_cleanly(data, reply, limits):
    frame = data.draw(damaged(MsgpackCodec().encode(reply)))
    client_reads_fast(frame, limits)
    server_reads_fast(frame, limits)


@pytest.mark.unit
@FAST
@given(data=st.data(), message=stock_requests | stock_replies, limits=LIMITS)
def test_damaged_stock_frames_are_refused_or_read_cleanly(data, message, limits):
    frame = data.draw(damaged(JsonCodec().encode(message).encode("utf-8")))
    for form in (frame, frame.decode("utf-8", errors="replace")):
        client_reads_stock(form, limits)
        server_reads_stock(form, limits)


@pytest.mark.unit
@FAST
@given(request=fast_requests(), reply=fast_replies())
def test_valid_fast_frames_are_read_on_their_side(request, reply):
    codec = MsgpackCodec()
    assert isinstance(server_reads_fast(codec.encode(request)), fastp.FastRequest)
    assert not refused(client_reads_fast(codec.encode(reply)))


@pytest.mark.unit
@FAST
@given(request=stock_requests, reply=stock_replies)
def test_valid_stock_frames_are_read_on_their_side(request, reply):
    codec = JsonCodec()
    assert isinstance(server_reads_stock(codec.encode(request)), Request)
    assert not refused(client_reads_stock(codec.encode(reply)))


# ---------------------------------------------------------------- nesting


def nested(levels: list[bool]) -> Any:
    """Lists (``True``) and maps (``False``), outermost first, around ``None``."""
    obj: Any = None
    for is_list in reversed(levels):
        obj = [obj] if is_list else {"k": obj}
    return obj


@pytest.mark.unit
@FAST
@given(max_depth=st.integers(1, 40), levels=st.lists(st.booleans(), min_size=1, max_size=100))
def test_nesting_beyond_the_configured_depth_is_refused(max_depth, levels):
    limits = Limits(max_depth=max_depth)
    message = nested(levels)
    for codec in (JsonCodec(limits), MsgpackCodec(limits)):
        frame = codec.encode(message)
        if len(levels) <= max_depth:
            assert codec.decode(frame) == message
        else:
            with pytest.raises(LimitExceeded):
                codec.decode(frame)


@pytest.mark.unit
@pytest.mark.parametrize(
    "codec, frame",
    [
        (JsonCodec, "[" * 200_000 + "]" * 200_000),
        (JsonCodec, '{"a":' * 100_000 + "1" + "}" * 100_000),
        (JsonCodec, "[" * 200_000),
        (MsgpackCodec, b"\x91" * 400_000 + b"\xc0"),
        (MsgpackCodec, b"\x81\xa1a" * 100_000 + b"\xc0"),
        (MsgpackCodec, b"\x91" * 400_000),
    ],
    ids=["json-lists", "json-maps", "json-unclosed", "msgpack-lists", "msgpack-maps", "msgpack-unclosed"],
)
def test_nesting_far_beyond_the_stack_is_refused_without_a_recursion_error(codec, frame):
    limits = Limits(max_frame_bytes=len(frame))
    outcome = decoded(codec(limits), frame)
    assert outcome is REFUSED
    with pytest.raises(ProtocolError):
        codec(limits).decode(frame)


# ---------------------------------------------------------------- ndarray bombs


@pytest.mark.unit
@settings(FAST, max_examples=300)
@given(data=ndarray_ext_data(), limits=LIMITS)
@example(data=ndarray_header(b"<f8", [0, U64]), limits=DEFAULT)
@example(data=ndarray_header(b"<f8", [U64, 0]), limits=DEFAULT)
@example(data=ndarray_header(b"|u1", [0, 2**62]), limits=DEFAULT)
@example(data=ndarray_header(b"|u1", [0] * 70), limits=Limits(max_ndim=100))  # more than numpy allows
@example(data=ndarray_header(b"<f8", [2**32, 2**32]) + bytes(16), limits=DEFAULT)
@example(data=ndarray_header(b"<f8", [U64] * 32) + bytes(8), limits=DEFAULT)
def test_ndarray_bombs_are_refused_before_anything_is_allocated(data, limits):
    with peak_allocation() as peak:
        try:
            array = decode_ndarray(data, limits)
        except ProtocolError:
            array = None
    assert peak[0] < 256 * 1024
    if array is not None:
        assert array.dtype.str in WIRE_DTYPES and array.ndim <= limits.max_ndim
        assert array.nbytes <= limits.max_array_bytes
        end = 2 + data[0] + 8 * array.ndim
        assert array.nbytes == len(data) - (end + -end % 8)  # exactly the payload, viewed in place
        assert not array.flags.writeable


@pytest.mark.unit
@settings(FAST, max_examples=200)
@given(data=ndarray_ext_data(), limits=LIMITS, where=st.sampled_from(["actions", "reward", "resets", "observation"]))
def test_ndarray_bombs_inside_messages_are_refused_by_both_sides(data, limits, where):
    ext = msgpack.ExtType(1, data)
    request = {"type": "step", "id": 1, "sessions": [0], "actions": {"action": ext}}
    reply = {"type": "batch", "id": 1, "sessions": [0], "observation": {"o": ext}, "reward": [1.0], "done": [False]}
    if where == "resets":
        request["resets"] = ext
    if where == "reward":
        reply["reward"] = ext
    with peak_allocation() as peak:
        server_reads_fast(msgpack.packb(request), limits)
        client_reads_fast(msgpack.packb(reply), limits)
    assert peak[0] < 1024 * 1024


@pytest.mark.unit
@FAST
@given(code=st.integers(-128, 127).filter(lambda c: c != 1), data=st.binary(max_size=20))
@example(code=-1, data=struct.pack(">I", 0))  # a msgpack timestamp
@example(code=-1, data=struct.pack(">Q", 1))
@example(code=-1, data=struct.pack(">IQ", 0, 1))
def test_ext_types_other_than_ndarray_are_refused(code, data):
    frame = b"\x82\xa4type\xa4step\xa6action" + ext_bytes(code, data)
    with pytest.raises(ProtocolError):
        MsgpackCodec().decode(frame)
    with pytest.raises(ProtocolError):
        MsgpackCodec().decode(ext_bytes(code, data))


MSGPACK_ATOMS = [b"\x80", b"\x90", b"\x91\x90", b"\x81\xa0\x80", b"\xc0", b"\x00", b"\xa0", b"\xc4\x00", b"\xcb" + bytes(8)]
JSON_ATOMS = ["{}", "[]", "[[]]", '{"":{}}', "null", "0", '""', "true", "1.5"]
#: Bytes of Python objects per byte of frame, at worst: ``{"": {}}`` is 3 bytes of msgpack and
#: 256 bytes of objects (a one-key dict, 184, an empty dict, 64, and its list slot, 8): 85x.
AMPLIFICATION = 96


@pytest.mark.unit
@settings(FAST, max_examples=60)
@given(atoms=st.lists(st.integers(0, len(JSON_ATOMS) - 1), min_size=1, max_size=3), size=st.integers(1, 16384))
@example(atoms=[3], size=12754)  # the worst atom, always tried
@example(atoms=[0], size=16384)
def test_decoded_messages_are_bounded_by_the_frame_size(atoms, size):
    """A frame of many tiny containers is the worst case: decoding costs a bounded multiple of its size."""
    body = b"".join(MSGPACK_ATOMS[i] for i in atoms)
    count = max(size // len(body), 1)
    frames = [
        (MsgpackCodec, b"\xdd" + struct.pack(">I", count * len(atoms)) + body * count),
        (JsonCodec, "[" + ",".join([",".join(JSON_ATOMS[i] for i in atoms)] * count) + "]"),
    ]
    for make, frame in frames:
        codec = make(Limits(max_frame_bytes=len(frame)))
        with peak_allocation() as peak:
            codec.decode(frame)
        assert peak[0] <= AMPLIFICATION * len(frame) + 64 * 1024, (make, peak[0] / len(frame))


# ---------------------------------------------------------------- configurable limits


@pytest.mark.unit
@FAST
@given(
    array=wire_arrays(hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=5)),
    max_array_bytes=st.integers(1, 512),
    max_ndim=st.integers(1, 6),
)
def test_array_limits_are_enforced_as_configured(array, max_array_bytes, max_ndim):
    frame = MsgpackCodec().encode({"a": array})
    codec = MsgpackCodec(Limits(max_array_bytes=max_array_bytes, max_ndim=max_ndim))
    if array.nbytes <= max_array_bytes and array.ndim <= max_ndim:
        out = codec.decode(frame)["a"]
        assert out.shape == array.shape and out.tobytes() == array.tobytes()
    else:
        with pytest.raises(LimitExceeded):
            codec.decode(frame)


@pytest.mark.unit
@FAST
@given(message=msgpack_values, json_message=json_values, max_frame_bytes=st.integers(1, 300))
def test_frame_limit_is_enforced_as_configured(message, json_message, max_frame_bytes):
    limits = Limits(max_frame_bytes=max_frame_bytes, max_depth=100)
    for codec, value in ((MsgpackCodec(limits), message), (JsonCodec(limits), json_message)):
        frame = codec.encode(value)
        for form in (frame, frame.encode("utf-8")) if isinstance(frame, str) else (frame,):
            if len(form) <= max_frame_bytes:
                codec.decode(form)
            else:
                with pytest.raises(LimitExceeded):
                    codec.decode(form)


@pytest.mark.unit
@pytest.mark.parametrize(
    "codec, frame",
    [(MsgpackCodec, lambda n: msgpack.packb(b"x" * (n - 3))), (JsonCodec, lambda n: '"' + "x" * (n - 2) + '"')],
)
def test_a_frame_one_byte_over_the_limit_is_refused(codec, frame):
    limits = Limits(max_frame_bytes=1000)
    assert len(frame(1000)) == 1000 and len(frame(1001)) == 1001
    codec(limits).decode(frame(1000))
    with pytest.raises(LimitExceeded, match="1001 bytes, limit is 1000"):
        codec(limits).decode(frame(1001))


# ---------------------------------------------------------------- NaN and infinity


def _pick_position(data: st.DataObject, message: dict) -> tuple:
    return data.draw(st.sampled_from([p for p in positions(message) if p]))


@pytest.mark.unit
@FAST
@given(data=st.data(), request=fast_requests(), value=NON_FINITE)
def test_non_finite_numbers_anywhere_in_a_fast_request(data, request, value):
    path = _pick_position(data, request)
    message = replaced(request, path, non_finite_like(value_at(request, path), value))
    outcome = server_reads_fast(MsgpackCodec().encode(message))
    if path[0] in ("type", "id", "count", "sessions", "seeds"):
        assert refused(outcome), (path, outcome)


@pytest.mark.unit
@FAST
@given(data=st.data(), reply=fast_replies(), value=NON_FINITE)
def test_non_finite_numbers_anywhere_in_a_fast_reply(data, reply, value):
    path = _pick_position(data, reply)
    message = replaced(reply, path, non_finite_like(value_at(reply, path), value))
    outcome = client_reads_fast(MsgpackCodec().encode(message))
    if path[0] in ("type", "id", "sessions", "done"):
        assert refused(outcome), (path, outcome)
    if path[0] == "reward" and len(path) == 2:
        assert isinstance(outcome, fastp.BatchReply)
        got = outcome.reward[path[1]]
        assert got == value or (math.isnan(got) and math.isnan(value))


@pytest.mark.unit
@FAST
@given(data=st.data(), request=stock_requests, value=NON_FINITE)
def test_non_finite_numbers_anywhere_in_a_stock_request(data, request, value):
    path = _pick_position(data, request)
    outcome = server_reads_stock(JsonCodec().encode(replaced(request, path, value)))
    if path[0] == "type" or path == ("data",) or (path == ("data", "seed") and request["type"] == "reset"):
        assert refused(outcome), (path, outcome)


@pytest.mark.unit
@FAST
@given(data=st.data(), reply=stock_replies, value=NON_FINITE)
def test_non_finite_numbers_anywhere_in_a_stock_reply(data, reply, value):
    path = _pick_position(data, reply)
    outcome = client_reads_stock(JsonCodec().encode(replaced(reply, path, value)))
    observation = reply["type"] == "observation"
    if path[0] == "type" or path == ("data",) or (path == ("data", "done") and observation):
        assert refused(outcome), (path, outcome)
    if path == ("data", "reward") and observation:
        assert isinstance(outcome, StepReply)
        assert outcome.reward == value or (math.isnan(outcome.reward) and math.isnan(value))


# ---------------------------------------------------------------- wrong field types


@pytest.mark.unit
@FAST
@given(data=st.data(), message=fast_requests() | fast_replies(), value=msgpack_values)
def test_fields_of_the_wrong_type_in_fast_messages(data, message, value):
    frame = MsgpackCodec().encode(replaced(message, _pick_position(data, message), value))
    server_reads_fast(frame)
    client_reads_fast(frame)


@pytest.mark.unit
@FAST
@given(data=st.data(), message=stock_requests | stock_replies, value=json_values)
def test_fields_of_the_wrong_type_in_stock_messages(data, message, value):
    frame = JsonCodec().encode(replaced(message, _pick_position(data, message), value))
    server_reads_stock(frame)
    client_reads_stock(frame)


@pytest.mark.unit
@FAST
@given(message=loose_messages(msgpack_values) | msgpack_values)
@example(message={"type": np.zeros(0), "id": 1, "sessions": []})
@example(message={"type": np.zeros(2), "id": 1, "sessions": []})
def test_fast_parsers_take_any_decoded_value(message):
    """Whatever msgpack can decode to (arrays included, even as ``type``), as Python objects."""
    server_parses_fast(message)
    client_parses_fast(message)


@pytest.mark.unit
@FAST
@given(message=loose_messages(json_values) | json_values)
def test_stock_parsers_take_any_decoded_value(message):
    server_parses_stock(message)
    client_parses_stock(message)


@pytest.mark.unit
@pytest.mark.parametrize(
    "field, value",
    [
        ("done", ["false"]),
        ("done", [math.nan]),
        ("done", [None]),
        ("done", [{}]),
        ("done", [0.5]),
        ("done", [2]),
        ("done", [2**64 - 1]),
        ("done", np.array([2], dtype=np.int64)),
        ("reward", [b"1"]),
        ("reward", ["1.5"]),
        ("reward", [1j]),
        ("reward", [2**1100]),
    ],
)
def test_flag_and_reward_lists_hold_only_their_own_types(field, value):
    reply = {"type": "batch", "id": 1, "sessions": [0], "observation": {}, "reward": [1.0], "done": [False]}
    reply[field] = value
    with pytest.raises(ProtocolError, match=field):
        fastp.parse_fast_reply(reply)


@pytest.mark.unit
def test_reward_of_a_huge_json_integer_is_refused():
    frame = '{"type":"observation","data":{"observation":{},"reward":' + "9" * 400 + ',"done":false}}'
    with pytest.raises(ProtocolError, match="reward"):
        parse_reply(JsonCodec().decode(frame))


# ====================================================================== live server

SERVER_FRAME = 65536
SERVER_ARRAY = 4096
SERVER_SESSIONS = 32
LIVE_TIMEOUT = 10.0
RSS_GROWTH = 50 * 1024 * 1024
CLEAR_CLOSE_CODES = {1009, 1002, 1007}

LIVE = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@dataclass(frozen=True)
class Frame:
    """One WebSocket message to send, and why the server may close the connection over it."""

    data: bytes | str
    text: bool = False
    closes: int | None = None  # the close code this frame may bring (1009, 1007, 1000)


def start_server() -> ServerProcess:
    """``openenv-gym serve CartPole-v1`` with small limits, as ``launch_local`` runs it (but we know its pid)."""
    for attempt in range(4):
        port = free_port()
        command = [
            sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1",
            "--host", "127.0.0.1", "--port", str(port), "--max-sessions", str(SERVER_SESSIONS),
            "--max-frame-bytes", str(SERVER_FRAME), "--max-array-bytes", str(SERVER_ARRAY),
            "--ping-interval", "0", "--log-level", "WARNING", "--parent-pid", str(os.getpid()),
        ]  # fmt: skip
        server = ServerProcess(command, "127.0.0.1", port)
        try:
            with httpx.Client(timeout=2.0, trust_env=False) as client:
                server.wait_healthy(client, time.monotonic() + 60)
            return server
        except Exception:
            tail = server.log_tail()
            server.stop()
            if attempt == 3 or "address already in use" not in tail.lower():
                raise
    raise AssertionError("unreachable")


class Live:
    """The server, its canaries, and the two hostile connections, on one event loop."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.ws_url = server.url.replace("http://", "ws://") + "/ws"
        self.loop = asyncio.new_event_loop()
        self.codec = MsgpackCodec()
        self.json = JsonCodec()
        self.rids = itertools.count(2**62)
        self.fast: ClientConnection | None = None
        self.stock: ClientConnection | None = None
        self.canary_fast: ClientConnection | None = None
        self.canary_stock: ClientConnection | None = None
        self.canary_sid = -1
        self.canary_expected: tuple[Any, Any] = (None, None)
        self.rss_start = 0
        # False while an example runs: a failed example leaves its hostile connection for a new one.
        self.fast_clean = self.stock_clean = True

    def run(self, coro: Any) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(LIVE_TIMEOUT):
                return await coro

        return self.loop.run_until_complete(bounded())

    def health(self) -> dict[str, Any]:
        response = httpx.get(self.server.url + "/health", timeout=5.0, trust_env=False)
        assert response.status_code == 200
        return response.json()

    async def released(self, most: int) -> None:
        """Wait until the server hosts at most ``most`` sessions.

        A connection's sessions are released by the server's handler after the
        close; ``/health`` is the only place to see it, so it is polled.
        """
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            while True:
                response = await client.get(self.server.url + "/health")
                assert response.status_code == 200
                if response.json()["active_sessions"] <= most:
                    return
                await asyncio.sleep(0.005)

    # ------------------------------------------------------------ connections

    async def connect_fast(self) -> ClientConnection:
        ws = await connect(self.ws_url, subprotocols=[fastp.SUBPROTOCOL], compression=None, max_size=None, ping_interval=None, proxy=None)
        assert ws.subprotocol == fastp.SUBPROTOCOL
        return ws

    async def connect_stock(self) -> ClientConnection:
        return await connect(self.ws_url, compression=None, max_size=None, ping_interval=None, proxy=None)

    async def ask_fast(self, ws: ClientConnection, message: dict[str, Any]) -> Any:
        await ws.send(self.codec.encode(message))
        return fastp.parse_fast_reply(self.codec.decode(await ws.recv()))

    async def ask_stock(self, ws: ClientConnection, message: dict[str, Any]) -> Any:
        await ws.send(self.json.encode(message))
        return parse_reply(self.json.decode(await ws.recv()))

    # ------------------------------------------------------------ canaries

    async def canary_round(self) -> tuple[Any, Any]:
        """Reset (seed 7) and step (action 1) both canaries; what they observed."""
        ws, sid = self.canary_fast, self.canary_sid
        await self.ask_fast(ws, fastp.reset_batch_request(next(self.rids), [sid], seeds=[7]))
        stepped = await self.ask_fast(ws, fastp.step_batch_request(next(self.rids), [sid], {"action": np.ones(1, np.int64)}))
        assert isinstance(stepped, fastp.BatchReply) and stepped.errors is None, stepped
        assert stepped.reward.tolist() == [1.0] and stepped.done.tolist() == [False]
        await self.ask_stock(self.canary_stock, reset_request(seed=7))
        reply = await self.ask_stock(self.canary_stock, step_request({"action": 1}))
        assert isinstance(reply, StepReply) and reply.reward == 1.0 and reply.done is False, reply
        return stepped.observation["observation"].tolist(), reply.observation["observation"]

    async def start(self) -> None:
        self.canary_fast = await self.connect_fast()
        opened = await self.ask_fast(self.canary_fast, fastp.open_request(next(self.rids), 1))
        self.canary_sid = opened.sessions[0]
        self.canary_stock = await self.connect_stock()
        self.canary_expected = await self.canary_round()
        fast_obs, stock_obs = self.canary_expected
        assert np.allclose(fast_obs[0], stock_obs, atol=1e-6)  # both paths, one env

    def check_canaries(self) -> None:
        assert self.run(self.canary_round()) == self.canary_expected, self.server.log_tail()

    # ------------------------------------------------------------ the hostile fast connection

    async def fast_prepare(self) -> list[int]:
        """Three fresh sessions on the hostile connection; the first two reset, the third not."""
        if self.fast is not None and not self.fast_clean:
            await self.fast.close()
            self.fast = None
        if self.fast is None:
            await self.released(3)  # the canaries and the hostile stock session: the last connection's are gone
            self.fast = await self.connect_fast()
        self.fast_clean = False
        opened = await self.ask_fast(self.fast, fastp.open_request(next(self.rids), 3))
        assert isinstance(opened, fastp.OpenedReply), opened
        reset = await self.ask_fast(self.fast, fastp.reset_batch_request(next(self.rids), opened.sessions[:2], seeds=[1, 2]))
        assert isinstance(reset, fastp.BatchReply) and reset.errors is None, reset
        return opened.sessions

    async def fast_exchange(self, frames: list[Frame]) -> tuple[list[Any], Any]:
        """Send every frame at once, then read one reply per frame (or the close)."""
        ws = self.fast
        replies: list[Any] = []
        try:
            for frame in frames:
                await ws.send(frame.data, text=frame.text)
            while len(replies) < len(frames):
                replies.append(await ws.recv())
        except ConnectionClosed as exc:
            self.fast = None
            return replies, exc.rcvd
        return replies, None

    async def fast_probe(self, alive: list[int], opened: list[int]) -> None:
        """The connection and its remaining sessions still work; then they are closed."""
        ws = self.fast
        if alive:
            reset = await self.ask_fast(ws, fastp.reset_batch_request(next(self.rids), alive, seeds=[3] * len(alive)))
            assert isinstance(reset, fastp.BatchReply) and reset.errors is None, reset
            assert reset.observation["observation"].shape == (len(alive), 4)
        else:
            states = await self.ask_fast(ws, fastp.state_batch_request(next(self.rids), []))
            assert isinstance(states, fastp.StatesReply) and states.states == []
        leftover = alive + opened
        if leftover:
            closed = await self.ask_fast(ws, fastp.close_batch_request(next(self.rids), leftover))
            assert isinstance(closed, fastp.ClosedReply) and closed.sessions == leftover, closed
        self.fast_clean = True

    # ------------------------------------------------------------ the hostile stock connection

    async def stock_fresh(self, reset: bool) -> None:
        if self.stock is not None:
            await self.stock.close()
        self.stock = await self.connect_stock()
        if reset:
            assert isinstance(await self.ask_stock(self.stock, reset_request(seed=0)), StepReply)

    async def stock_exchange(self, frames: list[Frame], fresh: bool) -> list[tuple[Frame, str, Any]]:
        """One frame at a time (the stock protocol has one request in flight): reply or close."""
        if fresh or self.stock is None or not self.stock_clean:
            await self.stock_fresh(reset=not fresh)
        self.stock_clean = False
        outcomes = []
        for frame in frames:
            if self.stock is None:
                await self.stock_fresh(reset=True)
            try:
                await self.stock.send(frame.data, text=frame.text)
                outcomes.append((frame, "reply", await self.stock.recv()))
            except ConnectionClosed as exc:
                outcomes.append((frame, "closed", exc.rcvd))
                self.stock = None
        return outcomes

    async def stock_probe(self) -> None:
        if self.stock is None:
            await self.stock_fresh(reset=False)
        assert isinstance(await self.ask_stock(self.stock, reset_request(seed=0)), StepReply)
        reply = await self.ask_stock(self.stock, step_request({"action": 0}))
        assert isinstance(reply, StepReply) and reply.reward == 1.0, reply
        self.stock_clean = True

    async def finish(self) -> None:
        for ws in (self.fast, self.stock, self.canary_fast, self.canary_stock):
            if ws is not None:
                await ws.close()
        self.fast = self.stock = self.canary_fast = self.canary_stock = None


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    server = start_server()
    live = Live(server)
    try:
        live.run(live.start())
        live.rss_start = rss_bytes(server.proc.pid)
        yield live
    finally:
        with contextlib.suppress(Exception):
            live.run(live.finish())
        live.loop.close()
        server.stop()


# ---------------------------------------------------------------- hostile fast frames


def packed(message: Any) -> bytes:
    return MsgpackCodec().encode(message)


def fast_hostile(sids: list[int]) -> st.SearchStrategy:
    """Lists of hostile frames for a fast connection whose sessions are ``sids`` (the last not reset)."""
    sid = st.sampled_from(sids) | ids
    rid = ids
    any_value = msgpack_values | NON_FINITE
    one = lambda s: s.map(lambda f: [f])  # noqa: E731
    bin_frame = lambda s: one(s.map(Frame))  # noqa: E731
    return st.one_of(
        # random bytes, text frames, invalid UTF-8 text frames
        bin_frame(st.binary(max_size=256)),
        one(st.text(max_size=64).map(lambda t: Frame(t, text=True))),
        one(st.binary(min_size=1, max_size=16).map(lambda b: Frame(b, text=True, closes=_utf8_close(b)))),
        # valid frames, damaged
        fast_requests().flatmap(lambda r: bin_frame(damaged(packed(r)))),
        # nesting bombs, and frames of nothing but tiny containers
        bin_frame(st.integers(33, 30_000).map(lambda d: b"\x91" * d + b"\xc0")),
        bin_frame(st.integers(1, SERVER_FRAME - 5).map(lambda k: b"\xdd" + struct.pack(">I", k) + b"\x80" * k)),
        bin_frame(st.integers(33, 8_000).map(lambda d: b"\x81\xa1a" * d + b"\xc0")),
        # array bombs: huge shapes, tiny payloads, odd dtypes; and arrays over the array limit
        bin_frame(
            st.builds(
                lambda r, s, d: packed({"type": "step", "id": r, "sessions": [s], "actions": {"action": msgpack.ExtType(1, d)}}),
                rid,
                sid,
                ndarray_ext_data(),
            )
        ),
        bin_frame(
            st.builds(
                lambda r, s, n: packed({"type": "step", "id": r, "sessions": [s], "actions": {"action": np.zeros(n, np.uint8)}}),
                rid,
                sid,
                st.integers(SERVER_ARRAY + 1, SERVER_FRAME - 100),
            )
        ),
        # wrong dtypes, NaN and infinite actions, actions of any type
        bin_frame(
            st.builds(
                lambda r, a: packed(fastp.step_batch_request(r, sids[:2], {"action": a})),
                rid,
                wire_arrays(st.sampled_from([(2,), (2, 1), (1,), (), (2, 3)])) | st.lists(any_value, min_size=2, max_size=2) | any_value,
            )
        ),
        # out of order: step before reset, step or reset right after close, unknown sessions
        one(st.builds(lambda r: Frame(packed(fastp.step_batch_request(r, [sids[2]], {"action": [0]}))), rid)),
        st.builds(
            lambda r, s, kind: [
                Frame(packed(fastp.close_batch_request(r, [s]))),
                Frame(packed({"type": kind, "id": r + 1 if r < MAX_ID else 0, "sessions": [s], "actions": {"action": [1]}})),
            ],
            rid,
            st.sampled_from(sids),
            st.sampled_from(["step", "reset", "state", "close"]),
        ),
        bin_frame(st.builds(lambda r, s: packed(fastp.state_batch_request(r, [s])), rid, ids)),
        # reset with seeds of the wrong type, duplicated sessions
        bin_frame(
            st.builds(
                lambda r, seeds: packed({"type": "reset", "id": r, "sessions": sids[:2], "seeds": seeds}),
                rid,
                st.lists(any_value, min_size=2, max_size=2) | any_value,
            )
        ),
        bin_frame(
            st.builds(
                lambda r, s, kind: packed({"type": kind, "id": r, "sessions": [s, s], "actions": {"action": [0, 0]}}),
                rid,
                st.sampled_from(sids),
                st.sampled_from(["step", "reset", "state", "close"]),
            )
        ),
        # a request type of any type (an array does not even compare with ==)
        bin_frame(st.builds(lambda r, t: packed({"type": t, "id": r, "sessions": []}), rid, wire_arrays() | any_value)),
        # open with a huge (or otherwise wrong) count
        bin_frame(
            st.builds(
                lambda r, c: packed({"type": "open", "id": r, "count": c}),
                rid,
                st.integers(SERVER_SESSIONS - 4, U64) | st.integers(-(2**63), 0) | any_value,
            )
        ),
        # a valid request with one field of the wrong type
        st.tuples(fast_requests(), any_value).flatmap(
            lambda rv: st.sampled_from([p for p in positions(rv[0]) if p]).map(lambda p: [Frame(packed(replaced(rv[0], p, rv[1])))])
        ),
        # oversized frames
        one(st.integers(SERVER_FRAME + 1, 2 * SERVER_FRAME).map(lambda n: Frame(bytes(n), closes=1009))),
    )


def _utf8_close(data: bytes) -> int | None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return 1007
    return None


def _reply_codes(reply: fastp.FastReply) -> list[str]:
    if isinstance(reply, fastp.FastErrorReply):
        return [reply.error.code]
    if isinstance(reply, fastp.BatchReply) and reply.errors is not None:
        return [e.code for e in reply.errors if e is not None]
    return []


@LIVE
@given(data=st.data())
def test_fast_connection_answers_hostile_frames_with_stock_errors_and_goes_on(live, data):
    sids = live.run(live.fast_prepare())
    frames = [f for group in data.draw(st.lists(fast_hostile(sids), min_size=1, max_size=4)) for f in group]
    replies, close = live.run(live.fast_exchange(frames))

    alive, opened = set(sids), []
    for frame in replies:
        assert isinstance(frame, bytes), frame
        reply = fastp.parse_fast_reply(MsgpackCodec().decode(frame))
        assert set(_reply_codes(reply)) <= STOCK_CODES, reply
        event(f"fast reply: {type(reply).__name__} {' '.join(sorted(set(_reply_codes(reply))))}")
        if isinstance(reply, fastp.OpenedReply):
            opened += reply.sessions
        if isinstance(reply, fastp.ClosedReply):
            alive -= set(reply.sessions)
            opened = [s for s in opened if s not in reply.sessions]
    if close is None:
        assert len(replies) == len(frames)
        assert not any(f.closes for f in frames), frames
        live.run(live.fast_probe(sorted(alive), opened))
    else:
        assert close.code in CLEAR_CLOSE_CODES, (close, live.server.log_tail())
        assert close.code in {f.closes for f in frames}, (close, frames)
        event(f"fast close: {close.code}")
    live.check_canaries()


# ---------------------------------------------------------------- hostile stock frames


def stock_frame(text: str) -> Frame:
    closes = 1009 if len(text.encode("utf-8", errors="surrogatepass")) > SERVER_FRAME else None
    if closes is None:
        with contextlib.suppress(ProtocolError, RequestError):
            if parse_request(JsonCodec().decode(text)).type == "close":
                closes = 1000
    return Frame(text, text=True, closes=closes)


stock_hostile = st.one_of(
    st.text(max_size=128).map(stock_frame),
    st.binary(max_size=128).map(Frame),
    st.binary(min_size=1, max_size=16).map(lambda b: Frame(b, text=True, closes=_utf8_close(b))),
    (stock_requests | stock_replies)
    .flatmap(lambda m: damaged(JsonCodec().encode(m).encode()))
    .map(lambda b: Frame(b) if _utf8_close(b) else stock_frame(b.decode())),
    st.integers(33, 30_000).map(lambda d: stock_frame("[" * d + "]" * d)),
    st.integers(1, SERVER_FRAME // 3 - 1).map(lambda k: stock_frame("[" + "{}," * k + "{}]")),
    st.integers(33, 10_000).map(lambda d: stock_frame('{"type":' * d + "1" + "}" * d)),
    st.builds(lambda v: stock_frame(JsonCodec().encode(step_request({"action": v}))), json_values | NON_FINITE),
    st.builds(
        lambda v: stock_frame(JsonCodec().encode({"type": "reset", "data": {"seed": v}})),
        json_values | NON_FINITE | st.integers(-(10**4000), 10**4000),
    ),
    st.builds(lambda t, d: stock_frame(JsonCodec().encode({"type": t, "data": d})), json_values, json_values),
    st.tuples(stock_requests, json_values).flatmap(
        lambda rv: st.sampled_from([p for p in positions(rv[0]) if p]).map(
            lambda p: stock_frame(JsonCodec().encode(replaced(rv[0], p, rv[1])))
        )
    ),
    st.just(stock_frame(JsonCodec().encode(step_request({"action": 0})))),
    st.just(stock_frame('{"type":"close"}')),
    st.integers(SERVER_FRAME + 1, 2 * SERVER_FRAME).map(lambda n: stock_frame('"' + "x" * n + '"')),
)


@LIVE
@given(frames=st.lists(stock_hostile, min_size=1, max_size=4), fresh=st.booleans())
def test_stock_connection_answers_hostile_frames_with_stock_errors_and_goes_on(live, frames, fresh):
    for frame, what, payload in live.run(live.stock_exchange(frames, fresh)):
        if what == "reply":
            assert isinstance(payload, str), payload
            reply = parse_reply(JsonCodec().decode(payload))
            if isinstance(reply, ErrorReply):
                assert reply.code in STOCK_CODES and not reply.closes_connection, reply
            event(f"stock reply: {type(reply).__name__} {getattr(reply, 'code', '')}")
        else:
            assert payload is not None and payload.code == frame.closes, (payload, frame, live.server.log_tail())
            event(f"stock close: {payload.code}")
    live.run(live.stock_probe())
    live.check_canaries()


# ---------------------------------------------------------------- and afterwards


def test_server_is_alive_leaks_no_session_and_its_memory_stayed_bounded(live):
    log = live.server.output()
    assert "connection handler failed" not in log, log[-4000:]
    live.check_canaries()
    live.run(live.finish())
    live.run(live.released(0))
    assert live.health()["active_sessions"] == 0
    assert live.server.proc.poll() is None
    grown = rss_bytes(live.server.proc.pid) - live.rss_start
    assert grown < RSS_GROWTH, f"server RSS grew by {grown / 2**20:.1f} MiB"


@pytest.mark.unit
def test_serve_configures_every_limit():
    from openenv_gym.cli import build_parser

    args, rest = build_parser().parse_known_args(
        [
            "serve",
            "CartPole-v1",
            "--max-frame-bytes",
            "1000",
            "--max-array-bytes",
            "100",
            "--max-depth",
            "8",
            "--max-ndim",
            "4",
            "--max-waiting-bytes",
            "5000",
            "--max-held-bytes",
            "6000",
            "--stock-read-ahead",
            "3",
            "--max-containers",
            "77",
            "--max-fragments",
            "9",
            "--max-sequence-length",
            "5",
            "--max-connections",
            "11",
        ]
    )
    assert rest == []
    assert args.max_connections == 11
    assert (args.max_frame_bytes, args.max_array_bytes, args.max_depth, args.max_ndim) == (1000, 100, 8, 4)
    assert (args.max_containers, args.max_fragments, args.max_sequence_length) == (77, 9, 5)
    assert (args.max_waiting_bytes, args.max_held_bytes, args.stock_read_ahead) == (5000, 6000, 3)


@pytest.mark.unit
@pytest.mark.parametrize("container", ["list", "map"])
def test_msgpack_messages_of_more_lists_and_maps_than_the_limit_are_refused_before_they_grow(container):
    limit = 1000
    empty = {"list": b"\x90", "map": b"\x80"}[container]

    def frame_of(n: int) -> bytes:  # an array of n empty containers: n + 1 in all
        return b"\xdd" + struct.pack(">I", n) + empty * n

    limits = Limits(max_containers=limit)
    assert len(MsgpackCodec(limits).decode(frame_of(limit - 1))) == limit - 1  # at the limit: read
    with pytest.raises(LimitExceeded, match="lists and maps"):
        MsgpackCodec(limits).decode(frame_of(limit))
    # A frame of a million one-byte containers is refused having built at most ~the limit of them.
    big, reader = frame_of(1_000_000), MsgpackCodec(limits)
    with peak_allocation() as peak:
        with pytest.raises(LimitExceeded):
            reader.decode(big)
    assert peak[0] < 1024 * 1024, peak[0]


@pytest.mark.unit
def test_json_arrays_as_nested_lists_are_not_counted_against_the_container_limit():
    image = np.zeros((64, 64, 3), np.uint8).tolist()  # 4,161 lists, as a stock peer sends an image
    assert JsonCodec(Limits(max_containers=1000)).decode(JsonCodec().encode({"observation": image}))["observation"] == image


def test_a_served_container_limit_is_enforced_live_and_the_connection_goes_on():
    import asyncio as _asyncio

    from websockets.asyncio.client import connect as _connect

    from openenv_gym import launch_local as _launch

    async def probe(url: str) -> tuple[Any, Any]:
        ws_url = url.replace("http://", "ws://") + "/ws"
        async with _connect(ws_url, subprotocols=[fastp.SUBPROTOCOL], compression=None, max_size=None) as ws:
            await ws.send(packed({"type": "open", "id": 1, "count": 1}))
            sessions = msgpack.unpackb(await _asyncio.wait_for(ws.recv(), 10))["sessions"]
            await ws.send(packed({"type": "reset", "id": 2, "sessions": sessions, "options": {"a": [[]] * 300}}))
            refused = fastp.parse_fast_reply(MsgpackCodec().decode(await _asyncio.wait_for(ws.recv(), 10)))
            await ws.send(packed({"type": "reset", "id": 3, "sessions": sessions}))
            return refused, fastp.parse_fast_reply(MsgpackCodec().decode(await _asyncio.wait_for(ws.recv(), 10)))

    with _launch("CartPole-v1", max_sessions=2, extra_args=["--max-containers", "100"]) as (url,):
        refused, reset = _asyncio.run(probe(url))
    assert isinstance(refused, fastp.FastErrorReply) and "lists and maps" in refused.error.message
    assert isinstance(reset, fastp.BatchReply) and reset.errors is None


def test_a_served_depth_limit_is_enforced_live():
    import asyncio as _asyncio
    import json as _json

    from websockets.asyncio.client import connect as _connect

    from openenv_gym import launch_local as _launch

    async def probe(url: str) -> dict:
        async with _connect(url.replace("http://", "ws://") + "/ws", compression=None) as ws:
            await ws.send(_json.dumps({"type": "reset", "data": {"a": [[[[[1]]]]]}}))
            return _json.loads(await _asyncio.wait_for(ws.recv(), 10))

    with _launch("CartPole-v1", max_sessions=2, extra_args=["--max-depth", "4"]) as (url,):
        reply = _asyncio.run(probe(url))
    assert reply["type"] == "error" and "deeper than 4" in reply["data"]["message"]
