"""The protocol layer with plain bytes: codecs, the ndarray extension, stock and fast messages."""

from __future__ import annotations

import json
import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from openenv_gym.config import Limits
from openenv_gym.errors import CapacityError, LimitExceeded, ProtocolError, ServerError
from openenv_gym.protocol import multiplex as fast
from openenv_gym.protocol.codec import (
    NDARRAY_EXT,
    JsonCodec,
    MsgpackCodec,
    check_depth,
    decode_ndarray,
    encode_ndarray,
)
from openenv_gym.protocol.messages import (
    ErrorReply,
    RequestError,
    StateReply,
    StepReply,
    close_request,
    error_reply,
    observation_reply,
    parse_reply,
    parse_request,
    reset_request,
    state_request,
    step_request,
)

pytestmark = pytest.mark.unit  # (the fast tier: no sockets, no server processes)

WIRE_DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


# ------------------------------------------------------------------ ndarray extension


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(dtype=st.sampled_from(WIRE_DTYPES), shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=6)))
def test_ndarray_round_trip_is_exact(array):
    codec = MsgpackCodec()
    out = codec.decode(codec.encode({"a": array}))["a"]
    assert out.dtype == array.dtype
    assert out.shape == array.shape
    assert out.tobytes() == array.tobytes()  # bitwise, NaNs included


def test_ndarray_decode_is_a_view_of_the_frame():
    array = np.arange(84 * 84 * 4, dtype=np.uint8).reshape(84, 84, 4)
    ext = encode_ndarray(array)
    out = decode_ndarray(ext.data, Limits())
    assert not out.flags.owndata  # np.frombuffer view, no copy
    assert not out.flags.writeable
    assert np.array_equal(out, array)


def test_ndarray_payload_is_aligned_raw_bytes():
    array = np.arange(6, dtype=np.float64).reshape(2, 3)
    data = encode_ndarray(array).data
    header = 1 + 3 + 1 + 8 * 2
    padded = header + (-header % 8)
    assert data[:4] == b"\x03<f8"
    assert data[padded:] == array.tobytes()
    assert len(data) == padded + array.nbytes


def test_big_endian_and_non_contiguous_arrays_are_sent_as_little_endian_c_order():
    array = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
    out = MsgpackCodec().decode(MsgpackCodec().encode(array))
    assert out.dtype == np.dtype("<i4")
    assert np.array_equal(out, array)


@pytest.mark.parametrize("dtype", [object, "U3", "complex64", [("a", "<i4")]])
def test_unsupported_dtypes_are_refused_when_encoding(dtype):
    with pytest.raises(TypeError):
        MsgpackCodec().encode(np.zeros(2, dtype=dtype))


def _ext(dtype: bytes, shape: tuple[int, ...], payload: bytes) -> bytes:
    head = bytes([len(dtype)]) + dtype + bytes([len(shape)]) + b"".join(struct.pack("<Q", d) for d in shape)
    head += bytes(-len(head) % 8)
    return msgpack.packb(msgpack.ExtType(NDARRAY_EXT, head + payload))


def test_huge_declared_shape_with_tiny_payload_is_refused_before_allocating():
    frame = _ext(b"<f8", (2**40, 2**20), b"\x00" * 8)
    with pytest.raises(LimitExceeded, match="limit"):
        MsgpackCodec().decode(frame)


def test_declared_shape_must_match_payload_bytes():
    with pytest.raises(ProtocolError, match="needs 24 bytes"):
        MsgpackCodec().decode(_ext(b"<f8", (3,), b"\x00" * 16))


@pytest.mark.parametrize("dtype", [b"|O8", b"<U4", b"<c8", b">f8", b"\xff\xfe", b""])
def test_dtypes_outside_the_wire_list_are_refused(dtype):
    with pytest.raises(ProtocolError):
        MsgpackCodec().decode(_ext(dtype, (1,), b"\x00" * 8))


def test_too_many_dimensions_are_refused():
    with pytest.raises(LimitExceeded):
        MsgpackCodec(Limits(max_ndim=3)).decode(_ext(b"|u1", (1, 1, 1, 1), b"\x00"))


def test_array_byte_limit_is_configurable():
    frame = MsgpackCodec().encode(np.zeros(1000, dtype=np.uint8))
    MsgpackCodec(Limits(max_array_bytes=1000)).decode(frame)
    with pytest.raises(LimitExceeded):
        MsgpackCodec(Limits(max_array_bytes=999)).decode(frame)


def test_unknown_ext_type_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="ext type 7"):
        MsgpackCodec().decode(msgpack.packb(msgpack.ExtType(7, b"x")))


# ------------------------------------------------------------------ codecs


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_random_bytes_never_escape_as_anything_but_protocol_errors(data):
    try:
        MsgpackCodec().decode(data)
    except ProtocolError:
        pass
    try:
        JsonCodec().decode(data)
    except ProtocolError:
        pass


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
        max_leaves=20,
    )
)
def test_plain_values_round_trip_through_both_codecs(value):
    for codec in (JsonCodec(), MsgpackCodec()):
        assert codec.decode(codec.encode(value)) == value


def test_truncated_msgpack_frame_is_a_protocol_error():
    frame = MsgpackCodec().encode({"obs": np.zeros((8, 8), dtype=np.float32), "k": "v"})
    for cut in (1, len(frame) // 2, len(frame) - 1):
        with pytest.raises(ProtocolError):
            MsgpackCodec().decode(frame[:cut])


@pytest.mark.parametrize("codec", [JsonCodec(Limits(max_depth=8)), MsgpackCodec(Limits(max_depth=8))])
def test_nesting_depth_is_limited(codec):
    ok = codec.encode([[[[[[[[1]]]]]]]])
    codec.decode(ok)
    with pytest.raises(LimitExceeded, match="deeper than 8"):
        codec.decode(codec.encode([[[[[[[[[1]]]]]]]]]))


def test_json_depth_is_judged_by_the_tree_when_brackets_outnumber_the_limit():
    codec = JsonCodec(Limits(max_depth=3))
    # Nine brackets, all in a string: more than the limit, so the tree is walked, and it is shallow.
    assert codec.decode('{"a": "[[[[{{{{"}') == {"a": "[[[[{{{{"}
    assert codec.decode(b'[[["x"]]]') == [[["x"]]]  # (bytes too: exactly the limit)
    with pytest.raises(LimitExceeded, match="deeper than 3"):
        codec.decode(b'[[[["x"]]]]')
    with pytest.raises(LimitExceeded, match="deeper than 3"):
        codec.decode('{"a": [{"b": [1]}], "c": "]]]]"}')


@pytest.mark.parametrize("frame", [b"\x91" * 5000 + b"\xc0", "[" * 100_000 + "]" * 100_000])
def test_very_deep_frames_do_not_blow_the_stack(frame):
    codec = MsgpackCodec() if isinstance(frame, bytes) else JsonCodec()
    with pytest.raises(LimitExceeded):
        codec.decode(frame)


def test_check_depth_counts_dicts_and_lists():
    check_depth({"a": [{"b": 1}]}, 3)
    with pytest.raises(LimitExceeded):
        check_depth({"a": [{"b": [1]}]}, 3)


@pytest.mark.parametrize("codec", [JsonCodec(Limits(max_frame_bytes=100)), MsgpackCodec(Limits(max_frame_bytes=100))])
def test_frame_size_is_limited(codec):
    with pytest.raises(LimitExceeded, match="limit is 100"):
        codec.decode(codec.encode("x" * 200))


def test_msgpack_codec_refuses_text_frames():
    with pytest.raises(ProtocolError, match="binary"):
        MsgpackCodec().decode("{}")


def test_json_codec_writes_numpy_as_lists():
    text = JsonCodec().encode({"a": np.array([[1, 2]], dtype=np.int8), "b": np.float32(0.5)})
    assert json.loads(text) == {"a": [[1, 2]], "b": 0.5}


@pytest.mark.parametrize("finite", [False, True])
def test_json_text_goes_as_utf_8_and_lone_surrogates_as_escapes(finite):
    codec = JsonCodec(finite=finite)
    text = codec.encode({"guess": "café ☕" * 100})
    assert len(text.encode("utf-8")) == len('{"guess":""}') + 100 * len("café ☕".encode("utf-8"))  # (was \u00e9, \u2615)
    assert codec.decode(text) == {"guess": "café ☕" * 100}
    name = "caf\udce9"  # (os.fsdecode of b"caf\xe9": no UTF-8 can carry it)
    text = codec.encode({"file": name, "text": "é"})
    assert text.isascii() and codec.decode(text) == {"file": name, "text": "é"}


def test_msgpack_is_smaller_than_json_for_frames():
    frame = np.random.default_rng(0).integers(0, 255, (210, 160, 3), dtype=np.uint8)
    assert len(MsgpackCodec().encode(frame)) <= frame.nbytes + 64
    assert len(JsonCodec().encode(frame)) > 3 * frame.nbytes


# ------------------------------------------------------------------ stock messages


def test_request_builders_match_the_stock_shapes():
    assert reset_request(seed=3, episode_id="e") == {"type": "reset", "data": {"episode_id": "e", "seed": 3}}
    assert reset_request() == {"type": "reset", "data": {}}
    assert step_request({"action": 1}) == {"type": "step", "data": {"action": 1}}
    assert state_request() == {"type": "state"}
    assert close_request() == {"type": "close"}


def test_observation_reply_parses_with_metadata_from_either_place():
    reply = parse_reply({"type": "observation", "data": {"observation": {"x": 1, "metadata": {"m": 2}}, "reward": 1, "done": False}})
    assert reply == StepReply({"x": 1, "metadata": {"m": 2}}, 1.0, False, {"m": 2})
    reply = parse_reply({"type": "observation", "data": {"observation": {}, "reward": None, "done": True, "metadata": {"t": True}}})
    assert reply.reward is None and reply.done and reply.metadata == {"t": True}


def test_server_reply_builders_parse_back():
    reply = parse_reply(observation_reply({"x": [1.0]}, 0.5, True, {"k": 1}))
    assert reply == StepReply({"x": [1.0], "metadata": {"k": 1}}, 0.5, True, {"k": 1})
    assert parse_reply({"type": "state", "data": {"step_count": 3}}) == StateReply({"step_count": 3})
    err = parse_reply(error_reply("CAPACITY_REACHED", "full", active_sessions=2, max_sessions=2))
    assert isinstance(err, ErrorReply) and err.closes_connection
    exc = err.exception("ws://h/ws")
    assert isinstance(exc, CapacityError) and exc.max_sessions == 2 and exc.url == "ws://h/ws"
    exc = parse_reply(error_reply("EXECUTION_ERROR", "boom")).exception()
    assert type(exc) is ServerError and exc.code == "EXECUTION_ERROR" and exc.message == "boom"


@pytest.mark.parametrize(
    "message",
    [
        None,
        [],
        {"type": "observation"},
        {"type": "observation", "data": {"observation": [], "done": False}},
        {"type": "observation", "data": {"observation": {}, "done": "no"}},
        {"type": "observation", "data": {"observation": {}, "done": False, "reward": "1"}},
        {"type": "observation", "data": {"observation": {}, "done": False, "metadata": []}},
        {"type": "state", "data": 3},
        {"type": "error", "data": {"message": "no code"}},
        {"type": "surprise", "data": {}},
    ],
)
def test_malformed_replies_are_protocol_errors(message):
    with pytest.raises(ProtocolError):
        parse_reply(message)


def test_parse_request_follows_the_stock_server():
    assert parse_request({"type": "reset"}).data == {}
    assert parse_request({"type": "step", "data": {"action": 1}}).data == {"action": 1}
    with pytest.raises(RequestError) as info:
        parse_request({"type": "dance"})
    assert info.value.code == "UNKNOWN_TYPE"
    for bad in ({"type": "step", "data": []}, {"type": "step", "data": {}, "extra": 1}, ["step"]):
        with pytest.raises(RequestError) as info:
            parse_request(bad)
        assert info.value.code == "VALIDATION_ERROR"


# ------------------------------------------------------------------ fast protocol


def test_stack_column_stacks_what_agrees_and_lists_the_rest():
    a = fast.stack_column([np.zeros(3, np.float32), np.ones(3, np.float32)])
    assert isinstance(a, np.ndarray) and a.shape == (2, 3) and a.dtype == np.float32
    assert fast.stack_column([1, 2]).dtype == np.int64
    assert fast.stack_column([True, False]).dtype == np.bool_
    assert fast.stack_column([1.0, 2.5]).dtype == np.float64
    assert fast.stack_column([1, 2.5]) == [1, 2.5]
    assert isinstance(fast.stack_column([np.zeros(2), np.zeros(3)]), list)
    assert fast.stack_column(["a", "b"]) == ["a", "b"]


def test_batch_reply_round_trips_through_msgpack():
    codec = MsgpackCodec()
    obs = np.arange(8, dtype=np.float32).reshape(2, 4)
    message = fast.batch_reply(
        7,
        [3, 4],
        {"observation": obs, "truncated": np.array([False, True])},
        np.array([1.0, np.nan]),
        np.array([False, True]),
        metadata=[{}, {"k": 1}],
        errors=[None, {"code": "EXECUTION_ERROR", "message": "x"}],
    )
    reply = fast.parse_fast_reply(codec.decode(codec.encode(message)))
    assert isinstance(reply, fast.BatchReply)
    assert reply.id == 7 and reply.sessions == [3, 4]
    assert np.array_equal(reply.observation["observation"], obs)
    assert np.isnan(reply.reward[1]) and reply.done.tolist() == [False, True]
    assert reply.metadata == [{}, {"k": 1}]
    assert reply.errors[0] is None and reply.errors[1].code == "EXECUTION_ERROR"


def test_batch_reply_drops_empty_metadata_and_errors():
    message = fast.batch_reply(1, [0], {}, np.zeros(1), np.zeros(1, bool), metadata=[{}], errors=[None])
    assert "metadata" not in message and "errors" not in message


@pytest.mark.parametrize(
    "message",
    [
        {"type": "batch", "id": 1, "sessions": [0, 1], "observation": {"o": [1]}, "reward": [0, 0], "done": [0, 0]},
        {"type": "batch", "id": 1, "sessions": [0], "observation": {}, "reward": [0, 0], "done": [0]},
        {"type": "batch", "id": -1, "sessions": [0], "observation": {}, "reward": [0], "done": [0]},
        {"type": "batch", "id": 1, "sessions": ["a"], "observation": {}, "reward": [0], "done": [0]},
        {"type": "batch", "id": 1, "sessions": [0], "observation": {}, "reward": ["x"], "done": [0]},
        {"type": "opened", "id": 1},
        {"type": "states", "id": 1, "sessions": [0], "states": [1]},
        {"type": "error", "id": 1, "data": {}},
        {"type": "nope", "id": 1, "sessions": []},
    ],
)
def test_malformed_fast_replies_are_protocol_errors(message):
    with pytest.raises(ProtocolError):
        fast.parse_fast_reply(message)


def test_fast_requests_are_checked():
    request = fast.parse_fast_request(fast.step_batch_request(5, [1, 2], {"action": np.array([0, 1])}), max_count=8)
    assert request.type == "step" and request.id == 5 and request.sessions == [1, 2]
    request = fast.parse_fast_request(fast.reset_batch_request(6, [1], [None], {"level": 2}), max_count=8)
    assert request.seeds == [None] and request.options == {"level": 2}
    # Seeds past msgpack's ints (a SeedSequence's 128-bit entropy) travel as decimal text.
    big = [2**64, 2**128 + 7, 2**64 - 1]
    wire = MsgpackCodec().encode(fast.reset_batch_request(7, [1, 2, 3], big))
    assert fast.parse_fast_request(MsgpackCodec().decode(wire), max_count=8).seeds == big
    assert fast.parse_fast_request(fast.open_request(1, 8), max_count=8).count == 8
    cases = [
        ({"type": "open", "id": 1, "count": 9}, "VALIDATION_ERROR", 1),
        ({"type": "open", "count": 1}, "VALIDATION_ERROR", None),
        ({"type": "fly", "id": 2, "sessions": []}, "UNKNOWN_TYPE", 2),
        ({"type": "step", "id": 3, "sessions": [1, 1], "actions": {}}, "VALIDATION_ERROR", 3),
        ({"type": "step", "id": 4, "sessions": [1], "actions": {"a": [1, 2]}}, "VALIDATION_ERROR", 4),
        ({"type": "reset", "id": 5, "sessions": [1], "seeds": [-1]}, "VALIDATION_ERROR", 5),
        ({"type": "reset", "id": 5, "sessions": [1], "seeds": ["-1"]}, "VALIDATION_ERROR", 5),
        ({"type": "reset", "id": 5, "sessions": [1], "seeds": ["1e9"]}, "VALIDATION_ERROR", 5),
        ({"type": "reset", "id": 5, "sessions": [1], "seeds": ["\u0661"]}, "VALIDATION_ERROR", 5),  # a non-ASCII digit
        ({"type": "reset", "id": 5, "sessions": [1], "seeds": ["9" * 1001]}, "VALIDATION_ERROR", 5),
        ({"type": "reset", "id": 6, "sessions": [1], "partial": 1}, "VALIDATION_ERROR", 6),
    ]
    for message, code, rid in cases:
        with pytest.raises(fast.FastRequestError) as info:
            fast.parse_fast_request(message, max_count=8)
        assert info.value.code == code and info.value.id == rid


def test_partial_requests_and_reply_parts_round_trip():
    codec = MsgpackCodec()
    request = fast.parse_fast_request(
        codec.decode(codec.encode(fast.step_batch_request(5, [1, 2, 3], {"action": np.array([0, 1, 0])}, partial=True))),
        max_count=8,
    )
    assert request.partial
    assert not fast.parse_fast_request(fast.reset_batch_request(6, [1]), max_count=8).partial
    assert fast.parse_fast_request(fast.reset_batch_request(6, [1], partial=True), max_count=8).partial
    obs = np.zeros((2, 4), dtype=np.float32)
    part = fast.part_reply(fast.batch_reply(5, [1, 3], {"o": obs}, np.zeros(2), np.zeros(2, bool)), [0, 2], False)
    reply = fast.parse_fast_reply(codec.decode(codec.encode(part)))
    assert reply.part.tolist() == [0, 2] and reply.part.dtype == np.int64 and reply.last is False
    whole = fast.parse_fast_reply(codec.decode(codec.encode(fast.batch_reply(5, [1], {}, np.zeros(1), np.zeros(1, bool)))))
    assert whole.part is None and whole.last is True


@pytest.mark.parametrize(
    "extra",
    [
        {"part": [0], "last": True},  # a list, not an array
        {"part": np.array([0, 1]), "last": True},  # one entry per session
        {"part": np.array([0.0]), "last": True},  # ints
        {"part": np.array([0])},  # last missing
        {"part": np.array([0]), "last": 1},
    ],
)
def test_malformed_reply_parts_are_protocol_errors(extra):
    message = {"type": "batch", "id": 1, "sessions": [0], "observation": {}, "reward": np.zeros(1), "done": np.zeros(1, bool)}
    with pytest.raises(ProtocolError):
        fast.parse_fast_reply({**message, **extra})


def test_a_servers_json_writes_non_finite_floats_as_null_as_the_stock_server_does():
    import numpy as np

    from openenv_gym.protocol.codec import JsonCodec

    message = {"a": [1.5, float("nan")], "b": np.array([np.inf, 2.0]), "c": np.float32("-inf"), "d": "x"}
    assert JsonCodec(finite=True).encode(message) == '{"a":[1.5,null],"b":[null,2.0],"c":null,"d":"x"}'
    assert JsonCodec().encode({"a": float("nan")}) == '{"a":NaN}'  # a client's own JSON, read by Python servers


def test_big_frames_are_decoded_with_the_garbage_collector_paused_and_it_runs_again_after():
    # A frame of millions of tiny containers: the collector, running as they are made, walked them
    # all again and again (7.5 s for 16 MiB of empty lists, 0.8 s with it paused).
    import gc

    from openenv_gym.protocol.codec import GC_PAUSE_BYTES, MsgpackCodec

    seen: list[bool] = []
    codec = MsgpackCodec()
    hook = codec._ext_hook

    def watching(code, data):  # runs inside msgpack's decode
        seen.append(gc.isenabled())
        return hook(code, data)

    codec._ext_hook = watching
    small = codec.encode({"a": np.zeros(4, np.float32)})
    big = codec.encode({"a": np.zeros(GC_PAUSE_BYTES, np.uint8), "b": [[]] * 1000})
    assert len(small) < GC_PAUSE_BYTES <= len(big)
    assert gc.isenabled()
    codec.decode(small)
    codec.decode(big)
    assert seen == [True, False] and gc.isenabled()
    with pytest.raises(ProtocolError):  # a failed decode lets it run again too
        codec.decode(big[:-1])
    assert gc.isenabled()


_trees = st.recursive(
    st.none() | st.integers(-3, 3) | st.sampled_from([msgpack.Timestamp(1)]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=2), children, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(tree=_trees, max_depth=st.integers(1, 8), refuse=st.booleans())
def test_the_wide_walk_for_big_frames_judges_every_message_as_the_depth_first_walk_does(tree, max_depth, refuse):
    from openenv_gym.errors import LimitExceeded
    from openenv_gym.protocol.codec import _check_tree, _check_wide_tree

    refused = msgpack.Timestamp if refuse else None
    outcomes = []
    for check in (_check_tree, _check_wide_tree):
        try:
            check(tree, max_depth, refused)
            outcomes.append(None)
        except (LimitExceeded, ProtocolError) as exc:
            outcomes.append(type(exc))
    # (both report a problem where there is one; which one first may differ when a message has both)
    assert (outcomes[0] is None) == (outcomes[1] is None), outcomes


@pytest.mark.parametrize(
    "kind, shown",
    [("jump", "jump"), (5, "5"), (None, "None"), ("x" * 10_000, "x" * 97 + "..."), (["a"] * 1000, "list")],
)
def test_an_unknown_message_type_is_named_in_the_error_but_never_echoed_whole(kind, shown):
    # Echoed whole, a 16 MiB type made a 16 MiB error reply (and a client that reads no replies
    # made the server hold them).
    with pytest.raises(RequestError) as caught:
        parse_request({"type": kind, "data": {}})
    assert caught.value.code == "UNKNOWN_TYPE"
    assert caught.value.message == f"Unknown message type: {shown}"


def test_an_autoreset_step_and_the_resets_after_it_round_trip():
    from openenv_gym.protocol import multiplex as fastp
    from openenv_gym.protocol.codec import MsgpackCodec

    codec = MsgpackCodec()
    request = fastp.parse_fast_request(
        codec.decode(codec.encode(fastp.step_batch_request(7, [1, 2], {"a": np.array([0, 1])}, autoreset=True))), max_count=8
    )
    assert request.autoreset is True
    plain = fastp.parse_fast_request(codec.decode(codec.encode(fastp.step_batch_request(8, [1], {"a": np.array([0])}))), max_count=8)
    assert plain.autoreset is False
    with pytest.raises(fastp.FastRequestError, match="'autoreset' must be a bool"):
        fastp.parse_fast_request({"type": "step", "id": 9, "sessions": [1], "actions": {}, "autoreset": 1}, max_count=8)

    reply = fastp.batch_reply(7, [1, 2, 3], {"o": np.zeros((3, 2))}, np.ones(3), np.array([True, False, True]))
    reply["after"] = fastp.after_reset([0, 2], {"o": np.ones((2, 2))}, [{"k": 1}, {}], [None, {"code": "E", "message": "no"}])
    parsed = fastp.parse_fast_reply(codec.decode(codec.encode(reply)))
    assert parsed.after.rows.tolist() == [0, 2] and parsed.after.observation["o"].shape == (2, 2)
    assert parsed.after.metadata == [{"k": 1}, {}] and parsed.after.errors[0] is None and parsed.after.errors[1].code == "E"
    for rows, match in (
        ([1], "whose step is done"),
        ([0, 0], "each once"),
        ([3], "sessions of the reply"),
        ([-1], "sessions of the reply"),
    ):
        bad = dict(reply, after=fastp.after_reset(rows, {"o": np.ones((len(rows), 2))}))
        with pytest.raises(ProtocolError, match=match):
            fastp.parse_fast_reply(bad)
    # A step that failed after its session was reset (its results could not be sent) keeps the reset.
    failed = fastp.batch_reply(
        7,
        [1, 2],
        {"o": np.zeros((2, 2))},
        np.ones(2),
        np.array([False, True]),
        None,
        [{"code": "EXECUTION_ERROR", "message": "cannot send its info"}, None],
    )
    failed["after"] = fastp.after_reset([0, 1], {"o": np.ones((2, 2))})
    assert fastp.parse_fast_reply(failed).after.rows.tolist() == [0, 1]
    with pytest.raises(ProtocolError, match="after observation"):
        fastp.parse_fast_reply(dict(reply, after=fastp.after_reset([0], {"o": np.ones((2, 2))})))
