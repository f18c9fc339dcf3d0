"""Lanes: lockstep steps as raw frames of fixed layout, on the fast path (docs/PROTOCOL.md, 5.5)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openenv_gym import OpenEnvVectorEnv, launch_local
from openenv_gym.client import FastConnection
from openenv_gym.errors import ProtocolError
from openenv_gym.protocol import lane as lanes
from openenv_gym.protocol import multiplex as fastp
from openenv_gym.vector.links import BIND_TRIES
from tests.clients import fast_connection, run

TIMEOUT = 20.0
INT_ACTION = lanes.Layout(np.dtype("<i8"), ())


#: Env calls stay inline whatever the VM does (a stall of 50 ms in one CartPole step would move a server's
#: calls to threads, answered by ordinary batch replies, for the next 1,024 calls), so raw frames can be counted.
INLINE = ["--execution", "inline"]


@pytest.fixture(scope="module")
def cartpole_url():
    with launch_local("CartPole-v1", max_sessions=32, extra_args=INLINE) as urls:
        yield urls[0]


async def _bind(fc: FastConnection, sids: list[int], layout: lanes.Layout = INT_ACTION) -> Any:
    reply = await fc.request(lambda rid: lanes.bind_request(rid, sids, "action", layout))
    if isinstance(reply, fastp.BoundReply):
        return lanes.parse_bound(reply.message, sids, "action", layout, lanes.MAX_LANE_BYTES)
    return reply


async def _raw(fc: FastConnection, frame: Any) -> Any:
    """Send ``frame(rid)`` (bytes) as it is; the reply."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    fc.send_request(frame, lambda reply: future.done() or future.set_result(reply), raw=True)
    return await future


# ---------------------------------------------------------------- the frames, no I/O


def test_raw_frames_carry_steps_and_batches_exactly():
    lane = lanes.Lane(7, (3, 5, 9), "action", lanes.Layout(np.dtype("<f4"), (2,)), "observation", lanes.Layout(np.dtype("|u1"), (2, 3)))
    actions = np.arange(6, dtype=np.float32).reshape(3, 2)
    resets = np.array([False, True, False])
    frame = lanes.pack_step(lane, 2**40 + 1, actions, resets)
    assert len(frame) == lane.step_size and frame[0] == lanes.RAW_MARK
    assert lanes.raw_header(frame) == (lanes.STEP, 7, 2**40 + 1)
    got, got_resets = lanes.unpack_step(lane, frame)
    assert got.dtype == np.float32 and got.tolist() == actions.tolist() and got_resets.tolist() == resets.tolist()
    assert lanes.unpack_step(lane, lanes.pack_step(lane, 1, actions, None))[1] is None

    observation = np.arange(18, dtype=np.uint8).reshape(3, 2, 3)
    reward = np.array([1.0, np.nan, -2.5])
    done, truncated, terminated = np.array([True, False, True]), np.array([True, False, True]), np.array([False, False, True])
    frame = lanes.pack_batch(lane, 5, reward, done, truncated, terminated, observation)
    assert len(frame) == lane.batch_size
    fields, got_reward, got_done = lanes.RawBatch(5, 7, frame).columns(lane)
    assert fields["observation"].tolist() == observation.tolist() and fields["observation"].dtype == np.uint8
    assert np.array_equal(got_reward, reward, equal_nan=True) and got_done.tolist() == done.tolist()
    assert fields["truncated"].tolist() == truncated.tolist() and fields["terminated"].tolist() == terminated.tolist()


def test_a_raw_batch_with_resets_carries_the_ended_sessions_reset_observations():
    obs = lanes.Layout(np.dtype("<f4"), (2,))
    lane = lanes.Lane(4, (1, 2, 3), "action", INT_ACTION, "observation", obs, autoreset=True)
    rows = [np.full(2, i, np.float32) for i in range(3)]
    done = bytearray([1, 0, 1])
    frame = lanes.pack_batch_rows(
        lane, 9, [1.0, 1.0, 1.0], done, bytes(3), done, rows, [np.full(2, 7, np.float32), np.full(2, 8, np.float32)]
    )
    assert lanes.raw_header(frame) == (lanes.BATCH_AFTER, 4, 9) and len(frame) == lane.batch_size + 2 * obs.nbytes
    raw = lanes.RawBatch(9, 4, frame, lanes.BATCH_AFTER)
    fields, _, got_done = raw.columns(lane)
    assert fields["observation"].tolist() == [[0, 0], [1, 1], [2, 2]] and got_done.tolist() == [True, False, True]
    assert raw.after(lane, got_done).tolist() == [[7, 7], [8, 8]]
    with pytest.raises(ProtocolError, match="has 96 bytes, got 88"):  # one reset observation short
        lanes.RawBatch(9, 4, frame[:-8], lanes.BATCH_AFTER).columns(lane)
    with pytest.raises(ProtocolError, match="does not reset"):
        lanes.RawBatch(9, 4, frame, lanes.BATCH_AFTER).columns(dataclasses.replace(lane, autoreset=False))
    plain = lanes.pack_batch_rows(lane, 9, [1.0] * 3, bytes(3), bytes(3), bytes(3), rows)
    assert lanes.raw_header(plain)[0] == lanes.BATCH and lanes.RawBatch(9, 4, plain).after(lane, np.zeros(3, bool)) is None


def test_malformed_raw_frames_and_layouts_are_refused():
    lane = lanes.Lane(1, (0, 1), "action", INT_ACTION, "observation", lanes.Layout(np.dtype("<f4"), (4,)))
    frame = lanes.pack_step(lane, 3, np.zeros(2, np.int64), None)
    with pytest.raises(ProtocolError):
        lanes.unpack_step(lane, frame[:-1])
    with pytest.raises(ProtocolError):
        lanes.unpack_step(lane, frame + b"\0")
    bad = bytearray(frame)
    bad[16] = 2  # a reset byte neither 0 nor 1
    with pytest.raises(ProtocolError):
        lanes.unpack_step(lane, bytes(bad))
    with pytest.raises(ProtocolError):
        lanes.raw_header(frame[:15])
    assert lanes.raw_header(frame) == (lanes.STEP, 1, 3)
    for at, byte in ((2, 1), (3, 0x80), (15, 0x80)):  # the two zero bytes; a request id beyond 2**63 - 1
        bad = bytearray(frame)
        bad[at] = byte
        with pytest.raises(ProtocolError, match=r"zero|2\*\*63"):
            lanes.raw_header(bytes(bad))
    bad = bytearray(frame)
    bad[18] = 1  # padding after the two reset bytes (16 + 2 .. 24)
    with pytest.raises(ProtocolError, match="padding"):
        lanes.unpack_step(lane, bytes(bad))
    with pytest.raises(ProtocolError):
        lanes.RawBatch(3, 1, b"\xc1" + bytes(20)).columns(lane)
    batch = lanes.pack_batch(lane, 3, np.zeros(2), *[np.zeros(2, bool)] * 3, np.zeros((2, 4), np.float32))
    with pytest.raises(ProtocolError):  # a flag byte neither 1 nor 0
        lanes.RawBatch(3, 1, batch[:32] + b"\x02" + batch[33:]).columns(lane)
    with pytest.raises(ProtocolError):  # another lane's batch
        lanes.RawBatch(3, 2, lanes.pack_batch(lane, 3, np.zeros(2), *[np.zeros(2, bool)] * 3, np.zeros((2, 4), np.float32))).columns(lane)
    for value in (
        {"dtype": "<f4"},
        {"dtype": "O", "shape": []},
        {"dtype": ">f4", "shape": [2]},
        {"dtype": "<f4", "shape": [-1]},
        {"dtype": "<f4", "shape": [1] * 9},
        {"dtype": "<f8", "shape": [2**30, 2]},
        [],
        {"dtype": "<f4", "shape": [True]},
    ):
        with pytest.raises(ProtocolError):
            lanes.Layout.read(value, "observation", lanes.MAX_LANE_BYTES)


# ---------------------------------------------------------------- a server's lanes


def test_raw_steps_of_a_lane_reproduce_local_episodes_and_resets_bit_for_bit(cartpole_url):
    n, steps = 4, 60

    async def talk() -> tuple[list[Any], lanes.Lane, list[Any]]:
        fc = await fast_connection(cartpole_url)
        try:
            sids = await fc.open_sessions(n)
            await fc.request(lambda rid: fastp.reset_batch_request(rid, sids, seeds=list(range(n))))
            lane = await _bind(fc, sids)
            rng = np.random.default_rng(0)
            replies, plan = [], []
            ended = np.zeros(n, dtype=np.bool_)
            for _ in range(steps):
                actions = rng.integers(0, 2, n)
                plan.append((actions, ended.copy()))
                reply = await _raw(fc, lambda rid: lanes.pack_step(lane, rid, actions, ended if ended.any() else None))
                replies.append(reply)
                _, _, done = reply.columns(lane)
                ended = done.copy()
        finally:
            await fc.close()
        return replies, lane, plan

    replies, lane, plan = run(talk())
    assert lane.observation == lanes.Layout(np.dtype("<f4"), (4,)) and lane.observation_field == "observation"
    assert all(isinstance(r, lanes.RawBatch) for r in replies)
    local = [gym.make("CartPole-v1") for _ in range(n)]
    for i, env in enumerate(local):
        env.reset(seed=i)
    resets_seen = 0
    for reply, (actions, resets) in zip(replies, plan):
        fields, reward, done = reply.columns(lane)
        for i, env in enumerate(local):
            if resets[i]:
                obs, _ = env.reset()
                resets_seen += 1
                assert np.isnan(reward[i]) and not done[i]
            else:
                obs, r, term, trunc, _ = env.step(int(actions[i]))
                assert reward[i] == r and done[i] == (term or trunc) and fields["terminated"][i] == term
            assert np.array_equal(fields["observation"][i], obs)
    assert resets_seen > 0


def test_what_a_raw_batch_cannot_say_comes_as_the_ordinary_batch_reply():
    # Errors, infos and observations off the lane's layout: the whole answer in msgpack, same request id.
    cases = [
        ("tests.servers.gym_envs:Flaky-v0", [0, 1], "errors"),
        ("tests.servers.gym_envs:InfoCartPole-v1", [0, 1], "metadata"),
        ("tests.servers.gym_envs:OutOfRange-v0", [0, 0], "observation"),
    ]
    for env_id, actions, what in cases:
        with launch_local(env_id, max_sessions=4) as urls:

            async def talk() -> Any:
                fc = await fast_connection(urls[0])
                try:
                    sids = await fc.open_sessions(2)
                    await fc.request(lambda rid: fastp.reset_batch_request(rid, sids, seeds=[0, 1]))
                    lane = await _bind(fc, sids)
                    return await _raw(fc, lambda rid: lanes.pack_step(lane, rid, np.array(actions), None))
                finally:
                    await fc.close()

            reply = run(talk())
            assert isinstance(reply, fastp.BatchReply), env_id
            if what == "errors":
                assert reply.errors[0] is None and "flaky step" in reply.errors[1].message
            elif what == "metadata":
                assert reply.metadata is not None and reply.errors is None
            else:
                assert reply.observation["observation"].dtype == np.int64


def test_a_server_refuses_lanes_it_cannot_serve_and_bad_raw_frames_and_goes_on(cartpole_url):
    async def talk() -> list[Any]:
        fc = await fast_connection(cartpole_url)
        out: list[Any] = []
        try:
            sids = await fc.open_sessions(2)
            await fc.request(lambda rid: fastp.reset_batch_request(rid, sids, seeds=[0, 1]))
            out.append(await _bind(fc, [sids[0], 10**6]))  # a session it does not have
            out.append(await _bind(fc, sids, lanes.Layout(np.dtype("<f4"), ())))  # float actions for a Discrete space
            out.append(await _bind(fc, sids, lanes.Layout(np.dtype("<i8"), (2,))))
            lane = await _bind(fc, sids)
            ghost = lanes.Lane(lane.id + 1, lane.sessions, lane.action_field, lane.action, lane.observation_field, lane.observation)
            out.append(await _raw(fc, lambda rid: lanes.pack_step(ghost, rid, np.zeros(2, np.int64), None)))  # no such lane
            out.append(await _raw(fc, lambda rid: lanes.pack_step(lane, rid, np.zeros(2, np.int64), None)[:-1]))  # short
            out.append(await _raw(fc, lambda rid: lanes.pack_step(lane, rid, np.array([0, 7]), None)))  # an action out of range
            out.append(await _raw(fc, lambda rid: lanes.pack_step(lane, rid, np.array([0, 1]), None)))  # still good
            await fc.request(lambda rid: fastp.close_batch_request(rid, [sids[0]]))
            out.append(await _raw(fc, lambda rid: lanes.pack_step(lane, rid, np.zeros(2, np.int64), None)))  # its lane is gone
        finally:
            await fc.close()
        return out

    unknown, float_actions, shaped, ghost, short, out_of_range, good, closed = run(talk())
    for reply in (unknown, float_actions, shaped, ghost, short, closed):
        assert isinstance(reply, fastp.FastErrorReply) and reply.error.code == "VALIDATION_ERROR", reply
    assert "unknown session" in unknown.error.message and "integers" in float_actions.error.message
    assert isinstance(out_of_range, fastp.BatchReply) and out_of_range.errors[0] is None and "outside" in out_of_range.errors[1].message
    assert isinstance(good, lanes.RawBatch)


def test_a_server_whose_observations_have_no_fixed_layout_binds_no_lane_and_a_pool_steps_on_in_msgpack():
    with launch_local("tests.servers.gym_envs:Pair-v0", max_sessions=4) as urls:

        async def talk() -> Any:
            fc = await fast_connection(urls[0])
            try:
                return await _bind(fc, await fc.open_sessions(1))
            finally:
                await fc.close()

        refused = run(talk())
        assert isinstance(refused, fastp.FastErrorReply) and "cannot bind a lane" in refused.error.message
        with OpenEnvVectorEnv(urls, 2) as envs:
            envs.reset(seed=0)
            link = envs._core.links[0]
            binds = 0
            real = link._bind

            def counted(*args):
                nonlocal binds
                binds += 1
                return real(*args)

            link._bind = counted
            for _ in range(500):  # (a bind's answer comes in the background, a few steps later)
                envs.step(np.zeros(2, dtype=np.int64))
                if link.lanes_refused:
                    break
            for _ in range(5):
                envs.step(np.zeros(2, dtype=np.int64))
            assert link._lane is None and link.lanes_refused and binds == BIND_TRIES


def test_a_pool_binds_a_lane_per_server_and_steps_by_raw_frames(cartpole_url):
    with launch_local("CartPole-v1", servers=2, extra_args=INLINE) as urls, OpenEnvVectorEnv(urls, 6) as envs:
        sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 6)
        assert np.array_equal(envs.reset(seed=3)[0], sync.reset(seed=3)[0])
        rng = np.random.default_rng(1)
        raw = 0
        real = lanes.RawBatch.columns

        def counted(self, lane):
            nonlocal raw
            raw += 1
            return real(self, lane)

        lanes.RawBatch.columns = counted
        try:
            for _ in range(300):
                actions = rng.integers(0, 2, 6)
                got, want = envs.step(actions), sync.step(actions)
                for a, b in zip(got[:4], want[:4]):
                    assert np.array_equal(a, b)
                assert got[4].keys() == want[4].keys()
        finally:
            lanes.RawBatch.columns = real
        assert all(link._lane is not None for link in envs._core.links)
        assert raw >= 2 * 298  # (the first step binds, in msgpack; then every step of both servers goes raw)


# ---------------------------------------------------------------- hostile bytes

_LANE = lanes.Lane(3, (0, 1, 2), "action", INT_ACTION, "observation", lanes.Layout(np.dtype("<f4"), (4,)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 199), st.booleans())
def test_any_bytes_read_as_a_raw_frame_give_a_protocol_error_or_values_of_the_layout(data, cut, as_step):
    # Whatever a peer sends: either a ProtocolError, or exactly the lane's shapes and dtypes (no other exception).
    good = (
        lanes.pack_step(_LANE, 9, np.array([1, 0, 1]), None)
        if as_step
        else lanes.pack_batch(_LANE, 9, np.zeros(3), *[np.zeros(3, bool)] * 3, np.zeros((3, 4), np.float32))
    )
    for frame in (data, b"\xc1" + data, good[:cut] + data[: len(good) - cut]):
        try:
            lanes.raw_header(frame)
            if as_step:
                actions, resets = lanes.unpack_step(_LANE, frame)
                assert actions.shape == (3,) and actions.dtype == np.int64
                assert resets is None or (resets.dtype == np.bool_ and resets.shape == (3,))
            else:
                fields, reward, done = lanes.RawBatch(9, 3, frame).columns(_LANE)
                assert fields["observation"].shape == (3, 4) and reward.shape == done.shape == (3,)
                assert set(np.frombuffer(frame, np.uint8, 9, 40).tolist()) <= {0, 1}
        except ProtocolError:
            pass


def test_a_lane_that_resets_answers_raw_with_the_resets_of_the_sessions_it_ends():
    """``bind`` with ``autoreset``: raw steps reset the sessions they end, and the reply carries their observations."""
    n = 3
    locals_ = [gym.make("CartPole-v1") for _ in range(n)]

    async def talk(url):
        fc = await fast_connection(url)
        try:
            sids = await fc.open_sessions(n)
            await fc.request(lambda rid: fastp.reset_batch_request(rid, sids, seeds=list(range(n))))
            reply = await fc.request(lambda rid: lanes.bind_request(rid, sids, "action", INT_ACTION, autoreset=True))
            lane = lanes.parse_bound(reply.message, sids, "action", INT_ACTION, lanes.MAX_LANE_BYTES)
            replies = []
            for t in range(30):  # env 0 pushes one way and falls; the others balance
                actions = np.array([0] + [t % 2] * (n - 1), np.int64)
                replies.append((actions, await _raw(fc, lambda rid: lanes.pack_step(lane, rid, actions, None))))
        finally:
            await fc.close()
        return lane, replies

    with launch_local("CartPole-v1", max_sessions=8, extra_args=INLINE) as (url,):
        lane, replies = run(talk(url))
    assert lane.autoreset is True
    for env, seed in zip(locals_, range(n)):
        env.reset(seed=seed)
    kinds = set()
    for actions, reply in replies:
        expected = [env.step(int(a)) for env, a in zip(locals_, actions)]
        ended = [terminated or truncated for _, _, terminated, truncated, _ in expected]
        if not any(ended):
            assert type(reply) is lanes.RawBatch  # nothing ended: raw, as on any lane
            kinds.add("raw")
            continue
        # Raw too, of kind BATCH_AFTER: the reset observations of the ended sessions follow the batch.
        assert type(reply) is lanes.RawBatch and reply.kind == lanes.BATCH_AFTER
        kinds.add("after")
        fields, _, done = reply.columns(lane)
        assert done.tolist() == ended
        after = reply.after(lane, done)
        assert after.shape == (sum(ended), 4) and after.dtype == np.float32
        for row, i in enumerate(np.flatnonzero(done).tolist()):
            np.testing.assert_array_equal(fields["observation"][i], expected[i][0])  # the last observation
            np.testing.assert_array_equal(after[row], locals_[i].reset()[0])
    assert kinds == {"raw", "after"}


def test_a_bound_reply_says_whether_its_lane_resets():
    observation = {"field": "observation", "dtype": "<f4", "shape": [4]}
    plain = {"type": "bound", "id": 1, "sessions": [4, 5], "lane": 2, "observation": observation}
    assert lanes.parse_bound(plain, [4, 5], "action", INT_ACTION, lanes.MAX_LANE_BYTES).autoreset is False  # (an older server)
    assert lanes.parse_bound({**plain, "autoreset": True}, [4, 5], "action", INT_ACTION, lanes.MAX_LANE_BYTES).autoreset is True
    with pytest.raises(ProtocolError, match="'autoreset' must be a bool"):
        lanes.parse_bound({**plain, "autoreset": 1}, [4, 5], "action", INT_ACTION, lanes.MAX_LANE_BYTES)
    bind = fastp.parse_fast_request(lanes.bind_request(3, [4, 5], "action", INT_ACTION, autoreset=True), max_count=8)
    assert bind.autoreset is True and bind.bind == ("action", INT_ACTION)


@pytest.mark.unit
def test_a_bind_asks_for_raw_steps_in_parts_and_the_bound_reply_says_whether_they_are():
    # A lane's raw steps are partial requests where the server grants it, so that a session past the
    # client's timeout costs only itself; an older server says nothing, and its lane is not used.
    observation = {"field": "observation", "dtype": "<f4", "shape": [4]}
    plain = {"type": "bound", "id": 1, "sessions": [4, 5], "lane": 2, "observation": observation}
    assert lanes.parse_bound(plain, [4, 5], "action", INT_ACTION, lanes.MAX_LANE_BYTES).partial is False
    assert lanes.parse_bound({**plain, "partial": True}, [4, 5], "action", INT_ACTION, lanes.MAX_LANE_BYTES).partial is True
    with pytest.raises(ProtocolError, match="'partial' must be a bool"):
        lanes.parse_bound({**plain, "partial": "yes"}, [4, 5], "action", INT_ACTION, lanes.MAX_LANE_BYTES)
    bind = fastp.parse_fast_request(lanes.bind_request(3, [4, 5], "action", INT_ACTION, partial=True), max_count=8)
    assert bind.partial is True and bind.autoreset is False
    assert fastp.parse_fast_request(lanes.bind_request(3, [4, 5], "action", INT_ACTION), max_count=8).partial is False
    layout = lanes.Layout(np.dtype("<f4"), (4,))
    reply = lanes.bound_reply(1, [4, 5], 2, "observation", layout, partial=True)
    assert lanes.parse_bound(reply, [4, 5], "action", INT_ACTION, lanes.MAX_LANE_BYTES).partial is True
