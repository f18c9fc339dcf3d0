"""The fast path: msgpack frames, raw arrays, many sessions per frame, requests in flight."""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from openenv_gym import launch_local
from openenv_gym.client import FastConnection, Session
from openenv_gym.config import Timeouts
from openenv_gym.protocol import multiplex as fastp
from openenv_gym.protocol.codec import MsgpackCodec
from openenv_gym.spaces import space_from_description
from tests.clients import fast_connection, run
from tests.servers import gym_envs

TIMEOUT = 20.0
EPISODE_STEPS = 30  # CartPole's TimeLimit, so that episodes end by truncation


@pytest.fixture(scope="module")
def cartpole_url():
    with launch_local("CartPole-v1", max_sessions=32, env_kwargs={"max_episode_steps": EPISODE_STEPS}) as urls:
        yield urls[0]


@pytest.fixture(scope="module")
def frames_url():
    with launch_local("tests.servers.gym_envs:Frames-v0", max_sessions=8) as urls:
        yield urls[0]


@pytest.fixture(scope="module")
def nested_url():
    with launch_local("tests.servers.gym_envs:Nested-v0", max_sessions=8) as urls:
        yield urls[0]


def _schema(url: str) -> dict:
    with httpx.Client(timeout=TIMEOUT, trust_env=False) as client:
        return client.get(url + "/schema").json()


def _policy(observation: np.ndarray) -> int:
    return int(observation[2] + 0.5 * observation[3] > 0)


def test_session_negotiates_msgpack_and_reproduces_a_local_episode_bit_for_bit(cartpole_url):
    async def episode():
        replies = []
        async with await Session.connect(cartpole_url) as session:
            codec = session.codec
            reply = await session.reset(seed=42)
            replies.append(reply)
            while not reply.done:
                reply = await session.step({"action": _policy(reply.observation["observation"])})
                replies.append(reply)
        return codec, replies

    codec, replies = run(episode())
    assert codec == "msgpack"

    local = gym.make("CartPole-v1", max_episode_steps=EPISODE_STEPS)
    obs, _ = local.reset(seed=42)
    first = replies[0].observation["observation"]
    assert first.dtype == np.float32 and first.tobytes() == obs.tobytes()
    assert replies[0].reward is None and not replies[0].done
    for reply in replies[1:]:
        obs, reward, terminated, truncated, _ = local.step(_policy(obs))
        remote = reply.observation["observation"]
        assert remote.dtype == obs.dtype and remote.tobytes() == obs.tobytes()
        assert reply.reward == reward
        assert bool(reply.observation["truncated"]) is truncated
        assert reply.done is (terminated or truncated)
    assert terminated or truncated


@pytest.mark.parametrize("env_id", ["CartPole-v1", "tests.servers.gym_envs:Nested-v0"])
def test_schema_extension_gives_exactly_the_env_spaces(env_id, cartpole_url, nested_url):
    url = cartpole_url if env_id == "CartPole-v1" else nested_url
    extension = _schema(url)["x-openenv-gym"]
    local = gym.make(env_id)
    assert space_from_description(extension["observation_space"]) == local.observation_space
    assert space_from_description(extension["action_space"]) == local.action_space


def test_one_frame_resets_and_steps_many_sessions_with_stacked_arrays(cartpole_url):
    async def talk():
        fc = await fast_connection(cartpole_url)
        try:
            sids = await fc.open_sessions(6)
            reset = await fc.request(lambda rid: fastp.reset_batch_request(rid, sids, seeds=list(range(6))))
            subset = sids[1::2]
            step = await fc.request(lambda rid: fastp.step_batch_request(rid, subset, {"action": np.array([0, 1, 1], np.int64)}))
            states = await fc.request(lambda rid: fastp.state_batch_request(rid, sids))
            closed = await fc.request(lambda rid: fastp.close_batch_request(rid, sids))
        finally:
            await fc.close()
        return sids, reset, step, states, closed

    sids, reset, step, states, closed = run(talk())
    assert len(set(sids)) == 6
    assert isinstance(reset, fastp.BatchReply) and reset.sessions == sids
    observations = reset.observation["observation"]
    assert isinstance(observations, np.ndarray) and observations.shape == (6, 4) and observations.dtype == np.float32
    locals_ = [gym.make("CartPole-v1") for _ in range(6)]
    for i, env in enumerate(locals_):
        obs, _ = env.reset(seed=i)
        np.testing.assert_array_equal(observations[i], obs)
    assert np.isnan(reset.reward).all() and not reset.done.any()
    assert reset.errors is None

    assert isinstance(step, fastp.BatchReply) and step.sessions == sids[1::2]
    assert step.observation["observation"].shape == (3, 4)
    assert step.observation["truncated"].dtype == np.bool_
    for row, (i, action) in enumerate(zip((1, 3, 5), (0, 1, 1))):
        obs, reward, *_ = locals_[i].step(action)
        np.testing.assert_array_equal(step.observation["observation"][row], obs)
        assert step.reward[row] == reward
    assert [s["step_count"] for s in states.states] == [0, 1, 0, 1, 0, 1]
    assert isinstance(closed, fastp.ClosedReply) and closed.sessions == sids


def test_several_requests_in_flight_keep_each_sessions_order(cartpole_url):
    async def talk():
        fc = await fast_connection(cartpole_url)
        try:
            a, b = await fc.open_sessions(2)
            await fc.request(lambda rid: fastp.reset_batch_request(rid, [a, b], seeds=[1, 2]))
            actions = [1, 0, 1, 1, 0]
            # All sent before any reply is read: five steps of `a`, interleaved with steps of `b`.
            replies = await asyncio.gather(
                *(fc.request(lambda rid, x=x, s=s: fastp.step_batch_request(rid, [s], {"action": [x]})) for x in actions for s in (a, b))
            )
            states = await fc.request(lambda rid: fastp.state_batch_request(rid, [a, b]))
        finally:
            await fc.close()
        return actions, replies, states

    actions, replies, states = run(talk())
    local_a, local_b = gym.make("CartPole-v1"), gym.make("CartPole-v1")
    local_a.reset(seed=1)
    local_b.reset(seed=2)
    for k, action in enumerate(actions):
        obs_a, *_ = local_a.step(action)
        obs_b, *_ = local_b.step(action)
        np.testing.assert_array_equal(replies[2 * k].observation["observation"][0], obs_a)
        np.testing.assert_array_equal(replies[2 * k + 1].observation["observation"][0], obs_b)
    assert [s["step_count"] for s in states.states] == [5, 5]


def test_a_step_reply_of_an_84x84x4_frame_costs_at_most_200_bytes_more_than_the_frame(frames_url):
    codec = MsgpackCodec()

    async def talk():
        url = frames_url.replace("http://", "ws://") + "/ws"
        async with connect(url, subprotocols=[fastp.SUBPROTOCOL], proxy=None, compression=None) as ws:
            assert ws.subprotocol == fastp.SUBPROTOCOL

            async def ask(message: dict) -> bytes:
                await ws.send(codec.encode(message))
                return await asyncio.wait_for(ws.recv(), TIMEOUT)

            opened = codec.decode(await ask(fastp.open_request(1, 1)))
            sid = opened["sessions"][0]
            await ask(fastp.reset_batch_request(2, [sid], seeds=[0]))
            return await ask(fastp.step_batch_request(3, [sid], {"action": np.array([2])}))

    frame = run(talk())
    raw = int(np.prod(gym_envs.FRAME_SHAPE))
    assert len(frame) <= raw + 200, len(frame) - raw
    reply = fastp.parse_fast_reply(codec.decode(frame))
    assert reply.observation["observation"].shape == (1, *gym_envs.FRAME_SHAPE)
    assert reply.observation["observation"].dtype == np.uint8
    local = gym.make("tests.servers.gym_envs:Frames-v0")
    local.reset(seed=0)
    obs, reward, *_ = local.step(2)
    np.testing.assert_array_equal(reply.observation["observation"][0], obs)
    assert reply.reward[0] == reward == 2.0


def test_nested_observations_and_dict_actions_travel_exactly(nested_url):
    async def talk():
        async with await Session.connect(nested_url) as session:
            reset = await session.reset(seed=3, scale=2)
            step = await session.step({"action": {"move": np.array([0.5, -0.25], np.float32), "fire": 1}})
        return reset, step

    reset, step = run(talk())
    local = gym.make("tests.servers.gym_envs:Nested-v0")
    obs, info = local.reset(seed=3, options={"scale": 2})
    remote = reset.observation["observation"]
    np.testing.assert_array_equal(remote["pos"], obs["pos"])
    assert remote["pos"].dtype == np.float64
    assert reset.metadata["options"] == {"scale": 2}
    np.testing.assert_array_equal(reset.metadata["origin"], info["origin"])
    obs, reward, *_ = local.step({"move": np.array([0.5, -0.25], np.float32), "fire": 1})
    np.testing.assert_array_equal(step.observation["observation"]["pos"], obs["pos"])
    assert step.observation["observation"]["mode"] == obs["mode"]
    assert step.reward == reward == 1.0
    np.testing.assert_array_equal(step.metadata["moved"], [0.5, -0.25])


@pytest.fixture(scope="module")
def action_sleep_url():
    # Threads, so that sessions of one request finish independently; action 1 sleeps 0.5 s.
    with launch_local("tests.servers.gym_envs:ActionSleep-v0", max_sessions=8, extra_args=["--execution", "thread"]) as urls:
        yield urls[0]


async def _parts(conn: FastConnection, build) -> list[fastp.FastReply]:
    """Send one request; every reply to it, until the last."""
    loop = asyncio.get_running_loop()
    replies: list[Any] = []
    finished = loop.create_future()

    def on_reply(reply):
        replies.append(reply)
        if not (isinstance(reply, fastp.BatchReply) and not reply.last) and not finished.done():
            finished.set_result(None)

    conn.send_request(build, on_reply)
    await finished
    return replies


def test_a_partial_step_is_answered_in_parts_as_sessions_finish(action_sleep_url):
    async def main():
        conn = await fast_connection(action_sleep_url)
        try:
            sids = await conn.open_sessions(4)
            await conn.request(lambda rid: fastp.reset_batch_request(rid, sids, [0, 1, 2, 3]))
            # Session 0 sleeps, 1 and 2 do not, 3 has an action outside the space.
            actions = {"action": np.array([1, 0, 0, 7])}
            parts = await _parts(conn, lambda rid: fastp.step_batch_request(rid, sids, actions, partial=True))
        finally:
            await conn.close()
        assert all(isinstance(p, fastp.BatchReply) and p.part is not None for p in parts)
        assert [p.last for p in parts] == [False] * (len(parts) - 1) + [True]
        positions = [i for p in parts for i in p.part.tolist()]
        assert sorted(positions) == [0, 1, 2, 3]  # each session exactly once
        assert 0 not in parts[0].part.tolist() and parts[-1].part.tolist() == [0]  # the slow one comes last
        for p in parts:
            assert p.sessions == [sids[i] for i in p.part.tolist()]
            assert p.observation["observation"].shape[0] == len(p.sessions)  # (a filler row for the invalid one)
            for i, error in zip(p.part.tolist(), p.errors or [None] * len(p.sessions)):
                assert (error is not None and error.code == "VALIDATION_ERROR") == (i == 3)

    run(main())


def test_a_partial_step_of_inline_sessions_is_answered_whole(cartpole_url):
    async def main():
        conn = await fast_connection(cartpole_url)
        try:
            sids = await conn.open_sessions(3)
            await conn.request(lambda rid: fastp.reset_batch_request(rid, sids, [0, 1, 2]))
            actions = {"action": np.array([0, 1, 0])}
            return await _parts(conn, lambda rid: fastp.step_batch_request(rid, sids, actions, partial=True))
        finally:
            await conn.close()

    (reply,) = run(main())
    assert isinstance(reply, fastp.BatchReply) and reply.part is None and reply.last
    assert reply.observation["observation"].shape == (3, 4)


def test_a_frame_of_slow_calls_moves_to_threads_part_way_instead_of_holding_the_loop():
    # Auto execution starts inline; 8 steps of 0.5 s in one frame would hold the
    # event loop 4 s. The first slow call moves the runner to threads and the
    # other 7 run there at once: about 1 s in all.
    with launch_local("tests.servers.gym_envs:ActionSleep-v0", max_sessions=8) as urls:

        async def main():
            conn = await fast_connection(urls[0])
            try:
                sids = await conn.open_sessions(8)
                await conn.request(lambda rid: fastp.reset_batch_request(rid, sids, list(range(8))))
                loop = asyncio.get_running_loop()
                start = loop.time()
                reply = await conn.request(lambda rid: fastp.step_batch_request(rid, sids, {"action": np.ones(8, np.int64)}))
                took = loop.time() - start
                # the sessions keep their order: the next request waits for the threads
                state = await conn.request(lambda rid: fastp.state_batch_request(rid, sids))
                return reply, took, state
            finally:
                await conn.close()

        reply, took, state = run(main())
    assert isinstance(reply, fastp.BatchReply) and reply.errors is None and reply.reward.tolist() == [1.0] * 8
    assert took < 2.5, took  # not 8 x 0.5 s one after the other
    assert [s["step_count"] for s in state.states] == [1] * 8


def test_a_backlog_beyond_max_inflight_keeps_answering_pings_and_loses_no_request():
    # 600 steps of one slow session (> max_inflight = 256) written at once: the server works
    # through them for a few seconds while its keepalive (0.5 s / 0.5 s) must see our pongs.
    extra = ["--execution", "thread", "--ping-interval", "0.5", "--ping-timeout", "0.5"]
    kwargs = {"delay": 0.01}
    with launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs=kwargs, extra_args=extra) as (url,):

        async def talk() -> list[fastp.FastReply]:
            fc = await FastConnection.connect(url, timeouts=Timeouts(step=60.0), ping_interval=None)
            try:
                (sid,) = await fc.open_sessions(1)
                await fc.request(lambda rid: fastp.reset_batch_request(rid, [sid]))
                step = lambda rid: fastp.step_batch_request(rid, [sid], {"action": [0]})  # noqa: E731
                return await asyncio.gather(*(fc.request(step) for _ in range(600)))
            finally:
                await fc.close()

        replies = run(talk())
        assert len(replies) == 600 and all(isinstance(r, fastp.BatchReply) and r.errors is None for r in replies)


@pytest.mark.parametrize("max_held", [None, 200_000])
def test_once_the_fast_path_holds_reading_a_write_pause_and_resume_does_not_start_it_again(max_held):
    # The fast path pauses reading past 1 MiB (ServerConfig.max_held_bytes) of requests held behind
    # a busy session. The write pauses it passes on to websockets' connection resumed reading there,
    # and the held requests then grew without bound (found by review). A server in this process, to
    # reach its connection. (200,000: the limit is the one configured; 6 frames would not reach 1 MiB.)
    import gc
    import socket
    import threading

    from openenv_gym.server.app import serve
    from openenv_gym.server.context import ServerConfig
    from openenv_gym.server.hosting.resolve import resolve_factory
    from openenv_gym.server.wire.fast_loop import _FastConnection

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    factory = resolve_factory("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 5.0}, max_sessions=2)
    limit, frames = (1 << 20, 24) if max_held is None else (max_held, 6)
    config = ServerConfig(
        port=port,
        max_sessions=2,
        execution="thread",
        max_inflight=1,
        ping_interval=None,
        shutdown_timeout=1.0,
        **({} if max_held is None else {"max_held_bytes": max_held}),
    )
    thread = threading.Thread(
        target=loop.run_until_complete, args=(serve(factory, config, sock=listener, stop=stop, handle_signals=False),)
    )
    thread.start()

    def on_server(fn):
        async def call():
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result(10)

    codec = MsgpackCodec()

    async def client():
        async with connect(f"ws://127.0.0.1:{port}/ws", subprotocols=[fastp.SUBPROTOCOL], compression=None, open_timeout=10) as ws:
            await ws.send(codec.encode(fastp.open_request(1, 1)))
            sid = codec.decode(await ws.recv())["sessions"][0]
            (conn,) = on_server(lambda: [o for o in gc.get_objects() if type(o) is _FastConnection])
            await ws.send(codec.encode(fastp.reset_batch_request(2, [sid], [0])))
            await ws.recv()
            await ws.send(codec.encode(fastp.step_batch_request(3, [sid], {"action": np.zeros(1, np.int64)})))  # 5 s
            junk = codec.encode(fastp.reset_batch_request(4, [sid], [0], {"pad": "x" * 60_000}))
            for _ in range(frames):  # ~1.4 MiB (or 0.36 MiB) behind the busy session: past what it holds
                await ws.send(junk)
            for _ in range(500):  # until the server has read them and paused
                if not on_server(conn.transport.is_reading):
                    break
                await asyncio.sleep(0.01)
            before = on_server(lambda: (conn.transport.is_reading(), conn._held_bytes))
            on_server(lambda: (conn.pause_writing(), conn.resume_writing()))  # (as a filling, draining write buffer makes)
            return before, on_server(conn.transport.is_reading)

    try:
        (reading_before, held), reading_after = asyncio.run(asyncio.wait_for(client(), 30))
        assert not reading_before and held > limit  # the fast path held reading
        assert not reading_after  # ... and still does
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
        loop.close()


def test_a_pools_lockstep_steps_take_the_servers_lane_path_and_its_reads_are_64_kib(monkeypatch):
    # A server in this process, to see inside it: its raw lane steps go by the factory's run_lane
    # (not the general road), and its transport reads 64 KiB at a time.
    import gc
    import socket
    import threading

    from openenv_gym import OpenEnvVectorEnv
    from openenv_gym._reads import READ_SIZE
    from openenv_gym.server.app import serve
    from openenv_gym.server.context import ServerConfig
    from openenv_gym.server.hosting.gym_host import GymHostFactory
    from openenv_gym.server.hosting.resolve import resolve_factory
    from openenv_gym.server.wire.fast_loop import _FastConnection
    from tests.vector_conformance import assert_same, step_side_by_side

    lane_steps: list[int] = []
    real_run_lane = GymHostFactory.run_lane

    def run_lane(self, hosts, *args, **kwargs):
        lane_steps.append(len(hosts))
        return real_run_lane(self, hosts, *args, **kwargs)

    monkeypatch.setattr(GymHostFactory, "run_lane", run_lane)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    factory = resolve_factory("CartPole-v1", max_sessions=4)
    config = ServerConfig(port=port, max_sessions=4, execution="inline", ping_interval=None, shutdown_timeout=1.0)
    thread = threading.Thread(
        target=loop.run_until_complete, args=(serve(factory, config, sock=listener, stop=stop, handle_signals=False),)
    )
    thread.start()
    try:
        with OpenEnvVectorEnv(f"http://127.0.0.1:{port}", 4) as envs:
            sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
            assert_same(envs.reset(seed=5), sync.reset(seed=5), "reset")
            assert step_side_by_side(envs, sync, 100, seed=5) > 0
            sync.close()

            async def read_sizes():  # (of this server's open connections: earlier tests' may linger, closed)
                gc.collect()
                return [
                    conn.transport.max_size
                    for conn in gc.get_objects()
                    if type(conn) is _FastConnection and not conn.transport.is_closing()
                ]

            sizes = asyncio.run_coroutine_threadsafe(read_sizes(), loop).result(10)
        # (the first steps go as msgpack while the lane is bound; then every step is one raw frame)
        assert len(lane_steps) >= 90 and set(lane_steps) == {4}
        assert sizes == [READ_SIZE]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
        loop.close()


def test_an_autoreset_step_resets_the_sessions_it_ends_in_the_same_reply(cartpole_url):
    """Same-step autoreset in one round trip: the reply's ``after`` holds the resets of the ended sessions."""
    n = 4
    locals_ = [gym.make("CartPole-v1", max_episode_steps=EPISODE_STEPS) for _ in range(n)]

    async def talk():
        fc = await fast_connection(cartpole_url)
        try:
            sids = await fc.open_sessions(n)
            await fc.request(lambda rid: fastp.reset_batch_request(rid, sids, seeds=list(range(n))))
            for env, seed in zip(locals_, range(n)):
                env.reset(seed=seed)
            replies = []
            for t in range(40):  # env 0 pushes one way and falls first; the others last until the time limit
                actions = np.array([0] + [t % 2] * (n - 1), np.int64)
                replies.append(await fc.request(lambda rid: fastp.step_batch_request(rid, sids, {"action": actions}, autoreset=True)))
                expected = [env.step(int(a)) for env, a in zip(locals_, actions)]
                reply = replies[-1]
                for i, (obs, _reward, terminated, truncated, _) in enumerate(expected):
                    np.testing.assert_array_equal(reply.observation["observation"][i], obs)  # the final observation
                    assert reply.done[i] == (terminated or truncated)
                after = reply.after
                if not reply.done.any():
                    assert after is None  # (no session ended: nothing after)
                    continue
                assert after is not None and after.rows.tolist() == np.flatnonzero(reply.done).tolist()
                for row, i in enumerate(after.rows.tolist()):
                    obs, _ = locals_[i].reset()  # no seed, no options: each env's generator goes on
                    np.testing.assert_array_equal(after.observation["observation"][row], obs)
                assert after.errors is None
            plain = await fc.request(lambda rid: fastp.step_batch_request(rid, sids, {"action": np.zeros(n, np.int64)}))
        finally:
            await fc.close()
        return replies, plain

    replies, plain = run(talk())
    ended = sum(int(r.done.sum()) for r in replies)
    assert ended >= n + 1  # env 0 more than once, and every env at the time limit
    assert plain.after is None  # without the flag, nothing is reset
