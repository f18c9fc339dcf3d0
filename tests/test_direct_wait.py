"""A step that waits by reading its sockets itself, not running the loop (``LoopThread.run_started`` with readers)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import openenv_gym
from openenv_gym import OpenEnvVectorEnv, _loop
from openenv_gym._loop import LoopThread
from openenv_gym._reads import READ_SIZE
from tests.servers.launch import started_fast_servers
from tests.vector_conformance import assert_same, step_side_by_side

TIMEOUT = 20.0


@pytest.fixture
def long_direct_waits(monkeypatch):
    """Every step may wait directly for its whole length (not only the first 20 ms, a moment after the loop ran)."""
    monkeypatch.setattr(_loop, "DIRECT_WINDOW", 60.0)
    monkeypatch.setattr(_loop, "DIRECT_WAIT", 60.0)


def test_steps_read_directly_return_what_syncvectorenv_returns(fast_cartpole_urls):
    with OpenEnvVectorEnv(fast_cartpole_urls, 8) as envs:
        sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 8)
        assert_same(envs.reset(seed=7), sync.reset(seed=7), "reset")
        assert all(link.connection.direct_reader() is not None for link in envs._core.links)
        assert all(link.connection._transport.max_size == READ_SIZE for link in envs._core.links)  # (64 KiB reads)
        before = envs._io.direct_waits
        assert step_side_by_side(envs, sync, 300, seed=0) > 0
        sync.close()
        # Most steps: the loop runs only when it has not for DIRECT_WINDOW, or has callbacks queued.
        assert envs._io.direct_waits - before > 150


def test_a_server_killed_during_a_direct_wait_costs_its_envs_a_truncation(long_direct_waits):
    slow = {"env": "tests.servers.gym_envs:Slow-v0", "env_kwargs": {"delay": 0.5}, "extra_args": ["--execution", "thread"]}
    with started_fast_servers(4, 4, **slow) as (_, servers):
        with OpenEnvVectorEnv([s.url for s in servers], 4, step_timeout=TIMEOUT) as envs:
            envs.reset(seed=0)
            envs.step(np.zeros(4, dtype=np.int64))  # (binds the lanes: their tasks run the next time the loop does)
            envs.step(np.zeros(4, dtype=np.int64))
            before = envs._io.direct_waits
            envs.step(np.zeros(4, dtype=np.int64))
            assert envs._io.direct_waits == before + 1
            victims = envs._core.home_of == 1
            assert victims.any() and not victims.all()
            threading.Timer(0.1, os.kill, (servers[1].proc.pid, signal.SIGKILL)).start()  # (its envs take 0.5 s)
            _, rewards, terminated, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
            assert infos["_openenv_error"].tolist() == victims.tolist()
            assert truncated[victims].all() and not terminated[victims].any() and (rewards[~victims] == 1.0).all()


def test_a_ctrl_c_during_a_direct_wait_interrupts_the_step_and_loses_nothing(long_direct_waits):
    extra = ["--execution", "thread"]
    with openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 1.0}, extra_args=extra) as urls:
        with OpenEnvVectorEnv(urls, 2, step_timeout=TIMEOUT) as envs:
            envs.reset(seed=0)
            before = envs._io.direct_waits
            with pytest.raises(KeyboardInterrupt):
                threading.Timer(0.2, signal.pthread_kill, (threading.get_ident(), signal.SIGINT)).start()
                envs.step(np.zeros(2, dtype=np.int64))  # (its envs take 1 s: the Ctrl-C comes first)
            assert envs._io.direct_waits == before  # (it did not finish directly: the loop took over)
            _, rewards, _, truncated, _ = envs.step_wait(timeout=TIMEOUT)  # the interrupted step's results
            assert rewards.tolist() == [1.0, 1.0] and not truncated.any()
            assert envs.step(np.zeros(2, dtype=np.int64))[1].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("server", ["ours", "stock"])
def test_a_single_envs_steps_read_their_replies_directly_and_match_a_local_episode(server, request):
    url = request.getfixturevalue("fast_cartpole_urls")[0] if server == "ours" else request.getfixturevalue("stock_cartpole_url")
    with openenv_gym.OpenEnvEnv(url) as env:
        local = gym.make("CartPole-v1")
        assert env.codec == ("msgpack" if server == "ours" else "json")
        for episode in range(3):
            obs, _ = env.reset(seed=episode)
            np.testing.assert_array_equal(obs, local.reset(seed=episode)[0])
            before, steps, done = env._io.direct_waits, 0, False
            while not done:
                action = steps % 2
                got, want = env.step(action), local.step(action)
                np.testing.assert_array_equal(got[0], want[0])
                assert got[1:4] == want[1:4]
                steps, done = steps + 1, got[2] or got[3]
            # Most steps: the loop runs only when it has not for DIRECT_WINDOW, or has callbacks queued
            # (a step that left one queued would keep the next off the direct wait: every other one).
            assert env._io.direct_waits - before >= 0.75 * steps, (env._io.direct_waits - before, steps)
        local.close()


@pytest.mark.parametrize("offer_msgpack", [True, False], ids=["fast", "json"])
def test_a_single_envs_resets_read_their_replies_directly_too(fast_cartpole_urls, long_direct_waits, offer_msgpack):
    with openenv_gym.OpenEnvEnv(fast_cartpole_urls[0], offer_msgpack=offer_msgpack) as env:
        local = gym.make("CartPole-v1")
        env.reset(seed=0)
        env.step(0)
        for seed in (5, 6):
            before = env._io.direct_waits
            obs, info = env.reset(seed=seed, options={})
            assert env._io.direct_waits == before + 1
            np.testing.assert_array_equal(obs, local.reset(seed=seed)[0])
        local.close()


@pytest.mark.parametrize("offer_msgpack", [True, False], ids=["fast", "json"])
def test_a_ctrl_c_during_a_single_envs_direct_wait_closes_its_session_and_reset_starts_anew(long_direct_waits, offer_msgpack):
    extra = ["--execution", "thread"]
    with openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 1.0}, extra_args=extra) as (url,):
        with openenv_gym.OpenEnvEnv(url, step_timeout=TIMEOUT, offer_msgpack=offer_msgpack) as env:
            assert env.codec == ("msgpack" if offer_msgpack else "json")
            env.reset(seed=0)
            with pytest.raises(KeyboardInterrupt):
                threading.Timer(0.2, signal.pthread_kill, (threading.get_ident(), signal.SIGINT)).start()
                env.step(0)  # (it takes 1 s: the Ctrl-C comes first)
            # The server may have stepped or not: the session is out of step, and says so.
            with pytest.raises(openenv_gym.ConnectionLost, match="reset"):
                env.step(0)
            env.reset(seed=1)  # a new session
            assert env.step(0)[1] == 1.0


@pytest.mark.parametrize("offer_msgpack", [True, False], ids=["fast", "json"])
def test_a_single_envs_steps_from_inside_a_running_event_loop_are_handed_to_the_io_thread(fast_cartpole_urls, offer_msgpack):
    # A notebook (or an async app) calling the sync env: its loop runs, so the step cannot drive ours.
    with openenv_gym.OpenEnvEnv(fast_cartpole_urls[0], offer_msgpack=offer_msgpack) as env:
        local = gym.make("CartPole-v1")
        np.testing.assert_array_equal(env.reset(seed=3)[0], local.reset(seed=3)[0])

        async def notebook_cell():
            return [env.step(i % 2) for i in range(5)]

        for got, want in zip(asyncio.run(notebook_cell()), [local.step(i % 2) for i in range(5)]):
            np.testing.assert_array_equal(got[0], want[0])
            assert got[1:4] == want[1:4]
        local.close()


class _Reader(asyncio.Protocol):
    """Ends the call's future with what it reads (up to a newline); ``fail``: raises instead."""

    def __init__(self) -> None:
        self.future: asyncio.Future | None = None
        self.fail = False
        self.read = b""

    def data_received(self, data: bytes) -> None:
        if self.fail:
            raise RuntimeError("a bug in data_received")
        self.read += data
        if self.read.endswith(b"\n") and not self.future.done():
            self.future.set_result(self.read)


def test_a_direct_wait_reads_its_socket_itself_and_hands_what_it_cannot_finish_to_the_loop():
    io = LoopThread()
    ours, theirs = socket.socketpair()
    errors: list[dict] = []
    io.loop.set_exception_handler(lambda loop, context: errors.append(context))
    reader = _Reader()
    try:
        transport, _ = io.run(io.loop.connect_accepted_socket(lambda: reader, sock=ours))  # (a real transport, reading)

        def call(send: bytes | None, *, queued: bool = False) -> Any:
            def start(future: asyncio.Future) -> None:
                reader.future, reader.read = future, b""
                asyncio.get_running_loop().call_later(0.5, lambda: future.done() or future.set_result("by the loop"))
                if queued:
                    asyncio.get_running_loop().call_soon(lambda: None)  # (the loop has work: it runs, not a direct wait)
                if send is None:
                    theirs.shutdown(socket.SHUT_WR)  # (the end of the stream: left for the loop)
                else:
                    theirs.send(send)

            io.run(asyncio.sleep(0))  # (the loop ran a moment ago)
            return io.run_started(start, readers=lambda: ((ours.fileno(), reader, transport),))

        waits = io.direct_waits
        assert call(b"one frame\n") == b"one frame\n" and io.direct_waits == waits + 1
        assert call(b"two\n", queued=True) == b"two\n" and io.direct_waits == waits + 1  # (by the loop, as fast)
        reader.fail = True
        assert call(b"more\n") == "by the loop" and io.direct_waits == waits + 1
        assert transport.is_closing() and "a bug in data_received" in str(errors[-1]["exception"])  # (as asyncio does)
    finally:
        ours.close()
        theirs.close()
        io.stop()


def test_a_direct_wait_leaves_the_end_of_a_stream_to_the_loop():
    io = LoopThread()
    ours, theirs = socket.socketpair()
    reader = _Reader()
    lost = []
    reader.connection_lost = lost.append  # type: ignore[method-assign]
    try:
        transport, _ = io.run(io.loop.connect_accepted_socket(lambda: reader, sock=ours))

        def start(future: asyncio.Future) -> None:
            reader.future = future
            asyncio.get_running_loop().call_later(0.5, lambda: future.done() or future.set_result("by the loop"))
            theirs.shutdown(socket.SHUT_WR)

        io.run(asyncio.sleep(0))
        waits = io.direct_waits
        assert io.run_started(start, readers=lambda: ((ours.fileno(), reader, transport),)) == "by the loop"
        assert io.direct_waits == waits and lost == [None]  # (the transport found the end itself)
    finally:
        ours.close()
        theirs.close()
        io.stop()
