"""The pool survives crashed, stalled and lying servers without losing or inventing a transition.

A loopback fault proxy (tests/faultproxy.py) sits between the pool and one of
two real servers; the pool steps through each fault and must keep stepping.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import threading
import time
from urllib.parse import urlsplit

import gymnasium as gym
import numpy as np
import pytest

from openenv_gym import CapacityError, OpenEnvVectorEnv, PoolUnavailable, launch_local
from openenv_gym.launch import ServerProcess
from tests.faultproxy import ThreadedFaultProxy, inject
from tests.servers.launch import free_port, start_fast_server, started_fast_servers

pytestmark = pytest.mark.chaos

STEP_TIMEOUT = 1.0
MARGIN = 1.5  # seconds a step may take beyond its timeout (scheduling on a loaded 2-core machine)
NUM_ENVS = 8


@pytest.fixture(scope="module")
def servers():
    with launch_local("CartPole-v1", servers=2, max_sessions=2 * NUM_ENVS) as urls:
        yield urls


@pytest.fixture
def proxied(servers):
    """A fault proxy in front of the first server; yields (proxy, [proxy url, second server url])."""
    port = urlsplit(servers[0]).port
    proxy = ThreadedFaultProxy("127.0.0.1", port)
    proxy.start()
    try:
        yield proxy, [proxy.url, servers[1]]
    finally:
        proxy.stop()


def _pool(urls, **kwargs) -> OpenEnvVectorEnv:
    return OpenEnvVectorEnv(urls, NUM_ENVS, step_timeout=STEP_TIMEOUT, connect_timeout=STEP_TIMEOUT, grace_period=30.0, **kwargs)


class Ledger:
    """Steps a pool and keeps the books: actions sent, transitions back, errors seen, slowest step."""

    def __init__(self, envs: OpenEnvVectorEnv) -> None:
        self.envs = envs
        self.rng = np.random.default_rng(0)
        self.sent = self.received = 0
        self.errors: list[tuple[int, dict]] = []  # (env, report)
        self.slowest = 0.0

    def step(self, count: int) -> None:
        for _ in range(count):
            actions = self.rng.integers(0, 2, size=self.envs.num_envs)
            start = time.monotonic()
            obs, rewards, terminated, truncated, infos = self.envs.step(actions)
            self.slowest = max(self.slowest, time.monotonic() - start)
            self.sent += self.envs.num_envs
            self.received += len(rewards)
            assert obs.shape == (self.envs.num_envs, 4) and np.isfinite(obs).all()
            if "openenv_error" in infos:
                mask = infos["_openenv_error"]
                for i in np.flatnonzero(mask).tolist():
                    report = {k: v[i] for k, v in infos["openenv_error"].items() if not k.startswith("_")}
                    self.errors.append((i, report))
                    # A failed step is a truncation with no reward, never a termination.
                    assert truncated[i] and not terminated[i] and rewards[i] == 0.0

    def check(self) -> None:
        assert self.sent == self.received  # one transition per action, none lost or invented
        assert self.slowest < STEP_TIMEOUT + MARGIN


def _on_proxy(envs: OpenEnvVectorEnv) -> set[int]:
    """Envs whose session goes through the proxy (the first link)."""
    return set(np.flatnonzero(envs._core.home_of == 0).tolist())


@pytest.mark.parametrize("fault", ["drop", "delay", "blackhole", "cut"])
def test_pool_keeps_stepping_through_a_fault(proxied, fault):
    proxy, urls = proxied
    with _pool(urls) as envs:
        envs.reset(seed=0)
        ledger = Ledger(envs)
        ledger.step(5)
        assert not ledger.errors
        inject(proxy, fault, delay=STEP_TIMEOUT * 2)
        ledger.step(15)
        proxy.heal()
        ledger.step(10)
        ledger.check()
        hit = {i for i, _ in ledger.errors}
        assert hit and hit <= _on_proxy(envs)  # only envs behind the fault paid for it
        kinds = {report["type"] for _, report in ledger.errors}
        expected = {
            "drop": {"ConnectionLost"},
            "delay": {"SessionTimeout"},
            "blackhole": {"SessionTimeout"},
            "cut": {"ConnectionLost", "ProtocolError"},
        }[fault]
        assert kinds & expected, kinds
        assert {report["server"] for _, report in ledger.errors} <= set(envs.urls)  # the base URL given, whatever the fault
        # Afterwards every env steps again without errors.
        before = len(ledger.errors)
        ledger.step(5)
        assert len(ledger.errors) == before


def test_envs_moved_off_a_stalled_server_go_home_only_once_it_answers_again(proxied):
    # They went home as soon as its avoid window (5 s) ran out, stalled or not: each one cost a
    # blocked step (the open timed out), another truncation, and sessions the server opened late.
    proxy, urls = proxied
    with _pool(urls) as envs:
        core = envs._core
        envs.reset(seed=0)
        ledger = Ledger(envs)
        proxy.blackhole()  # A stalls: connected, silent
        ledger.step(3)
        first = len(ledger.errors)
        assert first and {r["type"] for _, r in ledger.errors} == {"SessionTimeout"}
        deadline = time.monotonic() + 30
        while (core.link_of == 0).any():  # its envs move to B (each at its reset, as episodes end)
            assert time.monotonic() < deadline
            ledger.step(10)
        moved_at = time.monotonic()
        while time.monotonic() < moved_at + 7:  # past A's avoid window: still stalled, so they stay
            ledger.step(10)
        assert len(ledger.errors) == first and not (core.link_of == 0).any()
        proxy.heal()
        while not (core.link_of == core.home_of).all():  # A answers: they go home
            assert time.monotonic() < deadline + 30
            ledger.step(10)
        ledger.check()


def test_one_stall_seen_by_several_requests_puts_its_server_aside_once(proxied):
    # With request_size=1 each of A's envs is its own request: four timeouts of one stall counted
    # as four stalls, and A was kept aside for 40 s instead of 5 (found by review).
    proxy, urls = proxied
    with _pool(urls, request_size=1) as envs:
        core = envs._core
        envs.reset(seed=0)
        on_a = int((core.link_of == 0).sum())
        proxy.blackhole()
        envs.step_async(np.zeros(NUM_ENVS, dtype=np.int64))  # (request_size applies to step_async, not to step)
        *_, truncated, infos = envs.step_wait()
        assert int(infos["_openenv_error"].sum()) == on_a > 1 and truncated[infos["_openenv_error"]].all()
        assert core._stalls[0] == 1 and core._avoid_until[0] - time.monotonic() <= 5.0


def test_send_recv_returns_each_sent_env_exactly_once_through_a_drop(proxied):
    proxy, urls = proxied
    with _pool(urls, batch_size=NUM_ENVS // 2) as envs:
        envs.reset(seed=0)
        sent = received = 0
        envs.send(np.zeros(NUM_ENVS, dtype=np.int64))
        sent += NUM_ENVS
        for cycle in range(30):
            if cycle == 10:
                proxy.drop_all()
            start = time.monotonic()
            *_, infos = envs.recv()
            assert time.monotonic() - start < STEP_TIMEOUT + MARGIN
            ids = infos["env_id"]
            received += len(ids)
            envs.send(np.zeros(len(ids), dtype=np.int64), ids)
            sent += len(ids)
        while received < sent:
            received += len(envs.recv()[-1]["env_id"])
        assert received == sent


def test_kill_9_of_one_server_and_its_return():
    with started_fast_servers(64, 64, 64, 64) as (ports, servers):
        urls = [s.url for s in servers]
        with OpenEnvVectorEnv(urls, 32, step_timeout=STEP_TIMEOUT, connect_timeout=STEP_TIMEOUT) as envs:
            envs.reset(seed=0)
            core = envs._core
            assert core.sessions_per_link() == [8, 8, 8, 8]
            ledger = Ledger(envs)
            ledger.step(5)
            os.kill(servers[1].proc.pid, signal.SIGKILL)
            servers[1].proc.wait(timeout=10)
            killed_at = time.monotonic()
            ledger.step(20)
            recovery = None
            hit = {i for i, _ in ledger.errors}
            assert hit and hit <= set(range(8, 16))  # only the killed server's envs
            # Every env stepped on a survivor since: the killed server hosts nothing.
            assert core.sessions_per_link()[1] == 0 and sum(core.sessions_per_link()) == 32
            # Back on its port: it gets sessions again as envs reset.
            servers[1] = start_fast_server(ports[1])
            # The pool knocks on it with backoff (at most 5 s, jittered): step until it is back, bounded.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                ledger.step(1)
                if core.sessions_per_link()[1] > 0:
                    recovery = time.monotonic() - killed_at
                    break
            assert recovery is not None, core.sessions_per_link()
            ledger.check()


def test_pool_raises_only_after_the_grace_period_with_no_server():
    port = free_port()
    server = start_fast_server(port)
    try:
        with OpenEnvVectorEnv(server.url, 4, step_timeout=STEP_TIMEOUT, connect_timeout=0.5, grace_period=2.0) as envs:
            envs.reset(seed=0)
            envs.step(np.zeros(4, dtype=np.int64))
            os.kill(server.proc.pid, signal.SIGKILL)
            server.proc.wait(timeout=10)
            start = time.monotonic()
            with pytest.raises(PoolUnavailable) as failure:
                for _ in range(100):
                    envs.step(np.zeros(4, dtype=np.int64))  # truncations first, no exception
            waited = time.monotonic() - start
            assert 2.0 <= waited < 2.0 + 4 * (STEP_TIMEOUT + MARGIN)
            assert server.url in str(failure.value)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def flaky_url():
    with launch_local("tests.servers.gym_envs:Flaky-v0", max_sessions=8) as urls:
        yield urls[0]


def test_a_step_the_env_refused_is_a_truncation_and_the_env_resets_next(flaky_url):
    from openenv_gym import ServerError

    with OpenEnvVectorEnv(flaky_url, 3) as envs:
        envs.reset(seed=0)
        obs, rewards, terminated, truncated, infos = envs.step(np.array([1, 0, 0]))  # env 0's step raises
        assert truncated.tolist() == [True, False, False] and not terminated.any()
        assert infos["_openenv_error"].tolist() == [True, False, False]
        assert infos["openenv_error"]["type"][0] == ServerError.__name__
        assert "flaky step" in infos["openenv_error"]["message"][0]
        obs, rewards, terminated, truncated, infos = envs.step(np.array([0, 0, 0]))
        assert rewards[0] == 0.0 and not truncated.any()  # env 0 was reset (NEXT_STEP), not stepped
        assert "openenv_error" not in infos


def test_an_env_that_cannot_reset_raises_instead_of_retrying_forever(flaky_url):
    from openenv_gym import ServerError

    with OpenEnvVectorEnv(flaky_url, 2) as envs:
        with pytest.raises(ServerError, match="flaky reset"):
            envs.reset(options={"fail": True})


def test_full_servers_make_the_pool_wait_with_backoff_not_fail():
    with launch_local("CartPole-v1", max_sessions=4) as (a,), launch_local("CartPole-v1", max_sessions=4) as (b,):
        proxy = ThreadedFaultProxy("127.0.0.1", urlsplit(a).port)
        proxy.start()
        try:
            with OpenEnvVectorEnv([proxy.url, b], 4, step_timeout=STEP_TIMEOUT, connect_timeout=STEP_TIMEOUT, grace_period=30.0) as envs:
                envs.reset(seed=0)
                assert envs._core.sessions_per_link() == [2, 2]
                blocker = OpenEnvVectorEnv(b, 2)  # the second server is now full: 4 of 4
                try:
                    ledger = Ledger(envs)
                    proxy.refuse()
                    proxy.drop_all()  # the first server is gone for the pool
                    ledger.step(4)
                    stuck = {i for i, _ in ledger.errors}
                    assert stuck == {0, 1}  # only the first server's envs, and no exception
                    assert "CAPACITY_REACHED" in " ".join(envs._core.last_error.values())
                finally:
                    blocker.close()  # room again on the second server
                for _ in range(20):
                    before = len(ledger.errors)
                    ledger.step(1)
                    if len(ledger.errors) == before and envs._core.sessions_per_link()[1] == 4:
                        break
                assert envs._core.sessions_per_link() == [0, 4]
                ledger.check()
        finally:
            proxy.stop()


def _bad_parts(kind: str):
    """Step replies of a server that gets partial replies wrong, in way ``kind``."""
    from openenv_gym.protocol import multiplex as fastp
    from tests.peers import zero_batch

    def step(request: dict) -> list[dict]:
        rid, sessions = request["id"], request["sessions"]
        if not request.get("partial") or len(sessions) < 2:
            return [zero_batch(rid, sessions)]
        first, rest = sessions[:1], sessions[1:]
        if kind == "twice":  # the first session answered in both parts
            return [
                fastp.part_reply(zero_batch(rid, first), [0], False),
                fastp.part_reply(zero_batch(rid, sessions), list(range(len(sessions))), True),
            ]
        if kind == "twice_in_one":  # the first session twice in one part (the part as long as the rest)
            dup = [sessions[0]] * 2
            return [
                fastp.part_reply(zero_batch(rid, dup), [0, 0], False),
                fastp.part_reply(zero_batch(rid, rest), list(range(1, len(sessions))), True),
            ]
        if kind == "outside":  # a position beyond the request
            return [fastp.part_reply(zero_batch(rid, first), [len(sessions)], False)]
        # "short": the last part leaves a session unanswered
        return [fastp.part_reply(zero_batch(rid, rest), list(range(1, len(sessions))), True)]

    return step


@contextlib.contextmanager
def _rogue_fast_server_in_a_thread(step, raw_step=None, grant_partial=True):
    """``tests.peers.rogue_fast_server(step, raw_step, grant_partial)`` on its own event loop thread; yields its URL."""
    from tests.peers import rogue_fast_server

    loop = asyncio.new_event_loop()
    ready: concurrent.futures.Future[str] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def main() -> None:
        async with rogue_fast_server(step, raw_step, grant_partial) as url:
            ready.set_result(url)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        yield ready.result(timeout=20)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)


@pytest.mark.parametrize("kind", ["twice", "twice_in_one", "outside", "short"])
def test_reply_parts_that_break_the_protocol_cost_truncations_not_the_run(kind):
    with _rogue_fast_server_in_a_thread(_bad_parts(kind)) as url:
        with OpenEnvVectorEnv(url, 4, batch_size=2, step_timeout=STEP_TIMEOUT) as envs:
            envs.reset(seed=0)
            envs.send(np.zeros(4, dtype=np.int64))
            errors, seen = [], []
            while len(seen) < 4:
                _, _, _, truncated, infos = envs.recv(timeout=20)
                seen += infos["env_id"].tolist()
                if "openenv_error" in infos:
                    errors += infos["openenv_error"]["type"][infos["_openenv_error"]].tolist()
            assert sorted(seen) == [0, 1, 2, 3]  # each env exactly once
            assert errors and set(errors) == {"ProtocolError"}


def test_a_lane_bound_without_partial_is_not_stepped_raw_so_a_timeout_stays_per_env():
    # A server that binds lanes but knows no `partial` (it says nothing of it in `bound`) would answer a
    # raw step whole, so that one env past the timeout cost its frame-mates: the pool steps by msgpack
    # `partial` requests instead, and never sends it a raw frame.
    from tests.peers import zero_batch

    raw_frames = []
    steps = []

    def step(request):
        steps.append(request.get("partial"))
        return [zero_batch(request["id"], request["sessions"])]

    def raw_step(frame: bytes) -> bytes:
        raw_frames.append(frame)
        raise AssertionError("a raw frame on a lane bound without partial")

    with _rogue_fast_server_in_a_thread(step, raw_step, grant_partial=False) as url:
        with OpenEnvVectorEnv(url, 4, step_timeout=STEP_TIMEOUT) as envs:
            envs.reset(seed=0)
            for _ in range(6):  # (a lane is asked for, and bound, after the first steps)
                _, _, _, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
                assert not truncated.any()
            assert envs._core.links[0]._lane is not None and not envs._core.links[0]._lane.partial
    assert raw_frames == [] and len(steps) == 6 and all(steps)


@pytest.mark.parametrize("fault", ["flag byte", "short", "other lane", "kind"])
def test_a_malformed_raw_batch_costs_that_servers_envs_a_truncation_and_new_sessions_not_the_run(fault):
    # A lane's raw answers that break the protocol: the stream is out of step, as after any malformed
    # frame. The connection is dropped, its envs come back truncated (ProtocolError), get new sessions,
    # and the pool steps on.
    from openenv_gym.protocol import lane as lanes
    from tests.peers import zero_batch

    answered = []

    def raw_step(frame: bytes) -> bytes:
        _, lane_id, rid = lanes.raw_header(frame)
        n = (len(frame) - 16) // 9  # (n reset bytes, padding, n int64 actions: exact for n = 8)
        lane = lanes.Lane(
            lane_id, tuple(range(n)), "action", lanes.Layout(np.dtype("<i8"), ()), "observation", lanes.Layout(np.dtype("<f4"), (4,))
        )
        zeros = np.zeros(n, np.bool_)
        good = lanes.pack_batch(lane, rid, np.ones(n), zeros, zeros, zeros, np.zeros((n, 4), np.float32))
        answered.append(rid)
        if len(answered) % 3:  # (every third answer is bad: some steps go well)
            return good
        if fault == "flag byte":
            return good[: 16 + 8 * n] + b"\x02" + good[16 + 8 * n + 1 :]
        if fault == "short":
            return good[:-1]
        if fault == "other lane":
            return good[:4] + (7).to_bytes(4, "little") + good[8:]
        return good[:1] + b"\x01" + good[2:]  # (a raw step, from a server)

    with _rogue_fast_server_in_a_thread(lambda request: [zero_batch(request["id"], request["sessions"])], raw_step) as url:
        with OpenEnvVectorEnv(url, 8, step_timeout=STEP_TIMEOUT) as envs:
            envs.reset(seed=0)
            errors = []
            for _ in range(12):
                _, _, _, truncated, infos = envs.step(np.zeros(8, dtype=np.int64))
                if truncated.any():
                    assert truncated.all()  # (the one server's envs)
                    errors += infos["openenv_error"]["type"].tolist()
            assert errors and set(errors) == {"ProtocolError"}
            assert len(answered) >= 3  # (it went raw, again after new sessions)


def test_reply_parts_ended_by_an_empty_last_part_settle_the_request():
    # Allowed by the protocol: every session in its own part, then an empty part with last=true.
    from openenv_gym.protocol import multiplex as fastp
    from tests.peers import zero_batch

    def step(request: dict) -> list[dict]:
        rid, sessions = request["id"], request["sessions"]
        if not request.get("partial"):
            return [zero_batch(rid, sessions)]
        parts = [fastp.part_reply(zero_batch(rid, [sid]), [i], False) for i, sid in enumerate(sessions)]
        return parts + [fastp.part_reply(zero_batch(rid, []), [], True)]

    with _rogue_fast_server_in_a_thread(step) as url:
        with OpenEnvVectorEnv(url, 4, batch_size=2, step_timeout=STEP_TIMEOUT) as envs:
            envs.reset(seed=0)
            for _ in range(3):
                envs.send(np.zeros(4, dtype=np.int64))
                seen = []
                while len(seen) < 4:
                    *_, infos = envs.recv(timeout=20)
                    assert "openenv_error" not in infos
                    seen += infos["env_id"].tolist()
                assert sorted(seen) == [0, 1, 2, 3]
                deadline = time.monotonic() + 10
                while envs._core.in_flight:  # the empty last part arrives after the envs: let the loop take it
                    assert time.monotonic() < deadline, "the request never settled"
                    envs._io.run(asyncio.sleep(0.01))


def test_a_connection_dropped_mid_way_through_a_partial_reply_fails_only_the_envs_not_yet_answered():
    # Threads, so that the server answers in parts; env 0 sleeps 0.5 s, the others not.
    extra = ["--execution", "thread"]
    with launch_local("tests.servers.gym_envs:ActionSleep-v0", max_sessions=8, extra_args=extra) as (url,):
        proxy = ThreadedFaultProxy("127.0.0.1", urlsplit(url).port)
        proxy.start()
        try:
            with OpenEnvVectorEnv(proxy.url, 4, batch_size=3, step_timeout=STEP_TIMEOUT) as envs:
                envs.reset(seed=0)
                envs.send(np.array([1, 0, 0, 0]))
                *_, infos = envs.recv(timeout=10)
                assert sorted(infos["env_id"].tolist()) == [1, 2, 3] and "openenv_error" not in infos
                proxy.drop_all()  # env 0's part is still to come
                _, rewards, _, truncated, infos = envs.recv(timeout=10)
                assert infos["env_id"].tolist() == [0]
                assert truncated.tolist() == [True] and rewards.tolist() == [0.0]
                assert infos["openenv_error"]["type"].tolist() == ["ConnectionLost"]
                with pytest.raises(gym.error.NoAsyncCallError):
                    envs.recv(timeout=1)  # nothing else in flight: every env came back exactly once
        finally:
            proxy.stop()


@pytest.mark.parametrize("road", ["step", "step_async", "astep"])
def test_a_step_past_the_timeout_costs_only_the_slow_env_s_episode_once_steps_are_slow(road):
    # ActionSleep-v0 in threads, action a sleeping 0.25 * a s. A first step of 0.25 s (under the 1 s
    # timeout); then env 1 sleeps 3 s, past the timeout, while its three frame-mates answer at once.
    # Before, all four came back truncated: the server's one request was answered in one reply, and
    # its timeout lost every session in it.
    extra = ["--execution", "thread"]
    env_kwargs = {"delay": 0.25, "actions": 13}
    with launch_local("tests.servers.gym_envs:ActionSleep-v0", max_sessions=8, env_kwargs=env_kwargs, extra_args=extra) as (url,):
        with OpenEnvVectorEnv(url, 4, step_timeout=1.0, grace_period=30.0) as envs:
            envs.reset(seed=0)
            assert not envs.step(np.array([1, 1, 0, 0]))[3].any()
            actions = np.array([0, 12, 0, 0])
            if road == "step":
                _, rewards, _, truncated, infos = envs.step(actions)
            elif road == "step_async":
                envs.step_async(actions)
                _, rewards, _, truncated, infos = envs.step_wait(timeout=20)
            else:
                _, rewards, _, truncated, infos = asyncio.run(envs.astep(actions))
            assert truncated.tolist() == [False, True, False, False]
            assert rewards.tolist() == [1.0, 0.0, 1.0, 1.0]
            assert infos["_openenv_error"].tolist() == [False, True, False, False]
            assert infos["openenv_error"]["type"][1] == "SessionTimeout"
            _, rewards, _, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))  # (env 1: its new session's reset)
            assert not truncated.any() and rewards.tolist() == [1.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("steps_before", [0, 6])
def test_a_step_past_the_timeout_costs_only_the_slow_env_on_the_first_step_as_on_later_ones(steps_before):
    # No step so far took long: the first step (msgpack), or one after a few fast steps (raw, on the
    # lane they bound). Before, such a step went out whole, one reply per server, and one env past
    # the timeout lost every env of its server's frame; a pool asked for parts only once a step had
    # taken over 50 ms. Now every request asks for parts: env 1 alone is truncated.
    extra = ["--execution", "thread"]
    env_kwargs = {"delay": 0.25, "actions": 13}
    with launch_local("tests.servers.gym_envs:ActionSleep-v0", max_sessions=8, env_kwargs=env_kwargs, extra_args=extra) as (url,):
        with OpenEnvVectorEnv(url, 4, step_timeout=1.0, grace_period=30.0) as envs:
            envs.reset(seed=0)
            for _ in range(steps_before):  # (action 0: no sleep)
                assert not envs.step(np.zeros(4, dtype=np.int64))[3].any()
            if steps_before:
                assert envs._core.links[0]._lane is not None  # (the steps went raw, on a lane)
            _, rewards, _, truncated, infos = envs.step(np.array([0, 12, 0, 0]))
            assert truncated.tolist() == [False, True, False, False]
            assert rewards.tolist() == [1.0, 0.0, 1.0, 1.0]
            assert infos["openenv_error"]["type"][1] == "SessionTimeout"
            _, rewards, _, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))  # (env 1: its new session's reset)
            assert not truncated.any() and rewards.tolist() == [1.0, 0.0, 1.0, 1.0]


def test_after_pool_unavailable_the_pool_works_again_once_a_server_answers():
    with launch_local("CartPole-v1") as (url,):
        proxy = ThreadedFaultProxy("127.0.0.1", urlsplit(url).port)
        proxy.start()
        try:
            with OpenEnvVectorEnv(proxy.url, 4, step_timeout=STEP_TIMEOUT, connect_timeout=0.5, grace_period=1.0) as envs:
                envs.reset(seed=0)
                proxy.refuse(True)
                proxy.drop_all()
                with pytest.raises(PoolUnavailable):
                    for _ in range(100):
                        envs.step(np.zeros(4, dtype=np.int64))
                assert envs._core.in_flight == 0 and not envs._batch.pending.any()  # nothing left half-counted
                proxy.heal()
                # Stepping on goes on (not "already in flight"): each env's next step resets it.
                _, rewards, _, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
                assert rewards.tolist() == [0.0] * 4
                obs, _ = envs.reset(seed=1)  # waits for the server (no hang, no stale failure)
                assert obs.shape == (4, 4)
                _, _, _, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
                assert "openenv_error" not in infos and not truncated.any()
        finally:
            proxy.stop()


def test_same_step_reset_after_a_step_gets_its_own_timeout():
    # Step and reset each take 2.2 s, within the 3 s step timeout: together more than 3 s + 1 s.
    kwargs = {"delay": 2.2, "length": 1}
    extra = ["--execution", "thread"]
    with launch_local("tests.servers.gym_envs:SlowEpisode-v0", env_kwargs=kwargs, extra_args=extra) as (url,):
        with OpenEnvVectorEnv(url, 2, step_timeout=3.0, autoreset_mode="SameStep") as envs:
            envs.reset(seed=0)
            _, _, terminated, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
            assert terminated.all() and not truncated.any() and "openenv_error" not in infos
            assert infos["_final_obs"].all()


def test_an_empty_last_part_that_leaves_envs_unanswered_counts_the_request_once():
    from openenv_gym.protocol import multiplex as fastp
    from tests.peers import zero_batch

    asked = []

    def step(request: dict) -> list[dict]:
        rid, sessions = request["id"], request["sessions"]
        asked.append(request)
        if len(asked) > 1:
            return []  # silent after the first step
        if not request.get("partial") or len(sessions) < 2:
            return [zero_batch(rid, sessions)]
        # The first env in a part, then an empty last part: the others are never answered.
        return [fastp.part_reply(zero_batch(rid, sessions[:1]), [0], False), fastp.part_reply(zero_batch(rid, []), [], True)]

    with _rogue_fast_server_in_a_thread(step) as url:
        with OpenEnvVectorEnv(url, 4, batch_size=2, step_timeout=3.0) as envs:
            envs.reset(seed=0)
            envs.send(np.zeros(4, dtype=np.int64))
            seen = []
            while len(seen) < 4:
                *_, infos = envs.recv(timeout=20)
                seen += infos["env_id"].tolist()
            assert sorted(seen) == [0, 1, 2, 3]
            assert envs._core.in_flight == 0
            # The bookkeeping holds: a request that is never answered makes recv wait its timeout.
            envs.send(np.zeros(1, dtype=np.int64), env_ids=[0])
            started = time.monotonic()
            with pytest.raises(TimeoutError) as timed_out:
                envs.recv(timeout=0.3)
            assert time.monotonic() - started < 0.3 + MARGIN
            # What AsyncVectorEnv.step_wait(timeout=) raises, for code written for it.
            import multiprocessing

            assert isinstance(timed_out.value, multiprocessing.TimeoutError)


def test_an_idle_env_whose_connection_dropped_is_reset_before_it_is_stepped():
    # ActionSleep-v0: action 1 answers after 0.5 s (the connection drops meanwhile), action 0 at once.
    with launch_local("tests.servers.gym_envs:ActionSleep-v0", env_kwargs={"delay": 0.5}) as (url,):
        proxy = ThreadedFaultProxy("127.0.0.1", urlsplit(url).port)
        proxy.start()
        try:
            with OpenEnvVectorEnv(proxy.url, 2, batch_size=1, step_timeout=STEP_TIMEOUT) as envs:
                envs.reset(seed=0)
                envs.send(np.array([1]), env_ids=[0])  # env 1 stays idle
                proxy.drop_all()
                _, _, _, truncated, infos = envs.recv(timeout=10)
                assert infos["env_id"].tolist() == [0] and truncated.tolist() == [True]
                deadline = time.monotonic() + 10
                while envs._core.broken.any():  # the repairer gives both envs new sessions
                    assert time.monotonic() < deadline, "no new sessions"
                    envs._io.run(asyncio.sleep(0.01))
                # Env 1's new session never saw a reset: its step is refused on our side, as a
                # truncation, and it is reset next (never stepped on a session with no episode).
                envs.send(np.array([0]), env_ids=[1])
                _, _, _, truncated, infos = envs.recv(timeout=10)
                assert infos["env_id"].tolist() == [1] and truncated.tolist() == [True]
                assert infos["openenv_error"]["type"].tolist() == ["ConnectionLost"]
                for env in (0, 1):  # both reset on their new sessions, then step normally
                    envs.send(np.array([0]), env_ids=[env])
                    *_, infos = envs.recv(timeout=10)
                    assert "openenv_error" not in infos
                    envs.send(np.array([0]), env_ids=[env])
                    _, rewards, _, truncated, infos = envs.recv(timeout=10)
                    assert "openenv_error" not in infos and rewards.tolist() == [1.0]
        finally:
            proxy.stop()


def test_an_interrupt_inside_the_frame_parser_costs_a_truncation_not_the_connection_for_good():
    # A KeyboardInterrupt that lands inside websockets' parser kills it; the pool must see the
    # connection as lost (and repair it), not keep a live-looking link on a dead stream.
    with launch_local("CartPole-v1") as (url,):
        with OpenEnvVectorEnv(url, 2, step_timeout=STEP_TIMEOUT) as envs:
            envs.reset(seed=0)
            conn = envs._core.links[0]._conn
            protocol = conn._protocol
            receive_data = protocol.receive_data

            def interrupted(data: bytes) -> None:
                protocol.receive_data = receive_data
                protocol.parser.throw(KeyboardInterrupt())  # as a signal arriving mid-parse

            protocol.receive_data = interrupted

            def ping_arrives(future) -> None:  # a loop callback, as the transport's own reads are
                conn.data_received(b"\x89\x00")  # an unmasked empty ping: goes through the parser
                future.set_result(None)

            with pytest.raises(KeyboardInterrupt):
                envs._io.run_started(ping_arrives)
            assert conn.closed and not envs._core.links[0].alive
            _, _, _, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
            assert truncated.all() and set(infos["openenv_error"]["type"]) == {"ConnectionLost"}
            envs.step(np.zeros(2, dtype=np.int64))  # the reset, on new sessions
            _, rewards, _, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
            assert "openenv_error" not in infos and rewards.tolist() == [1.0, 1.0]


def test_under_same_step_a_failed_step_is_reset_within_the_step(flaky_url):
    from gymnasium.vector import AutoresetMode

    with OpenEnvVectorEnv(flaky_url, 3, autoreset_mode=AutoresetMode.SAME_STEP) as envs:
        first, _ = envs.reset(seed=0)
        obs, rewards, terminated, truncated, infos = envs.step(np.array([1, 0, 0]))  # env 0's step raises
        assert truncated.tolist() == [True, False, False] and rewards[0] == 0.0
        assert infos["_final_obs"].tolist() == [True, False, False]
        np.testing.assert_array_equal(infos["final_obs"][0], first[0])  # the last observation before the failure
        assert "flaky step" in infos["final_info"]["openenv_error"]["message"][0]
        assert infos["_openenv_error"].tolist() == [True, False, False]
        obs, rewards, terminated, truncated, infos = envs.step(np.array([0, 0, 0]))
        assert rewards.tolist() == [1.0, 1.0, 1.0] and not truncated.any()  # env 0 steps: it was reset already
        assert "openenv_error" not in infos and "final_obs" not in infos


@contextlib.contextmanager
def _reset_crash_pool(tmp_path, extra_args: tuple[str, ...] = (), num_envs: int = 4):
    """A SAME_STEP pool of ``num_envs`` envs, reset, on 2 ResetCrash-v0 servers (one-step episodes; a second reset kills one server)."""
    from gymnasium.vector import AutoresetMode

    kwargs = {"marker": str(tmp_path / "crashed")}
    with launch_local("tests.servers.gym_envs:ResetCrash-v0", servers=2, max_sessions=8, env_kwargs=kwargs, extra_args=extra_args) as urls:
        with OpenEnvVectorEnv(
            urls, num_envs, autoreset_mode=AutoresetMode.SAME_STEP, step_timeout=STEP_TIMEOUT, connect_timeout=STEP_TIMEOUT
        ) as envs:
            envs.reset(seed=0)
            assert envs._core.sessions_per_link() == [num_envs // 2] * 2
            yield envs


def test_under_same_step_a_reset_whose_server_dies_is_retried_within_the_step(tmp_path):
    # Env calls in threads: each step is answered before its env is reset, by a request of its own.
    # One env per server: a step's answer comes in parts as envs finish, so with two envs on the
    # server the reset of the first could kill it while the second's step is still in flight
    # (which then costs that step, as a server's death does).
    with _reset_crash_pool(tmp_path, ("--execution", "thread"), num_envs=2) as envs:
        # Every episode ends; the reset within the step kills one server, whose env is reset on the other.
        _, rewards, terminated, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert terminated.all() and not truncated.any() and infos["_final_obs"].all()
        assert "openenv_error" not in infos and rewards.tolist() == [1.0] * 2
        assert (tmp_path / "crashed").exists() and envs._core.sessions_per_link() in ([0, 2], [2, 0])
        # No env is left to be reset by its next step (its action would be dropped): every env steps.
        _, rewards, terminated, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert rewards.tolist() == [1.0] * 2 and terminated.all() and "openenv_error" not in infos


def test_under_same_step_a_server_that_dies_in_its_reset_within_the_step_costs_that_step(tmp_path):
    # Instant env calls, answered inline: the server resets each ended env within the step's own request.
    with _reset_crash_pool(tmp_path) as envs:
        # Every episode ends; one server dies in the reset, and its reply (the steps too) with it.
        _, rewards, terminated, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
        lost = np.flatnonzero(truncated)
        assert len(lost) == 2 and not terminated[lost].any() and rewards[lost].tolist() == [0.0, 0.0]
        assert set(infos["openenv_error"]["type"][lost]) == {"ConnectionLost"}
        assert terminated[~truncated].all() and infos["_final_obs"].all()
        assert (tmp_path / "crashed").exists() and envs._core.sessions_per_link() in ([0, 4], [4, 0])
        # Every env was reset within that step (the lost ones on the survivor): every env steps.
        _, rewards, terminated, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert rewards.tolist() == [1.0] * 4 and terminated.all() and "openenv_error" not in infos


def test_under_same_step_envs_of_a_killed_server_are_reset_within_the_step_on_a_survivor():
    from gymnasium.vector import AutoresetMode

    with started_fast_servers(64, 64) as (ports, servers):
        urls = [s.url for s in servers]
        with OpenEnvVectorEnv(
            urls, 4, autoreset_mode=AutoresetMode.SAME_STEP, step_timeout=STEP_TIMEOUT, connect_timeout=STEP_TIMEOUT
        ) as envs:
            envs.reset(seed=0)
            assert envs._core.sessions_per_link() == [2, 2]
            os.kill(servers[0].proc.pid, signal.SIGKILL)
            servers[0].proc.wait(timeout=10)
            obs, rewards, terminated, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
            failed = np.flatnonzero(truncated)
            assert len(failed) == 2 and infos["_final_obs"][failed].all()
            assert envs._core.sessions_per_link() == [0, 4]  # re-placed within the step
            obs, rewards, terminated, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
            assert not truncated.any() and "openenv_error" not in infos


def test_idle_sessions_of_a_restarted_server_are_never_used_on_its_new_connection():
    # Sessions are numbered per connection: after the pool reconnects to a restarted server, the ids
    # its idle envs still held may name other envs' new sessions there. They must not be used.
    with started_fast_servers(64, 64) as (ports, servers):
        urls = [s.url for s in servers]
        with OpenEnvVectorEnv(urls, 4, batch_size=2, step_timeout=STEP_TIMEOUT, connect_timeout=STEP_TIMEOUT) as envs:
            obs, _ = envs.reset(seed=0)
            assert envs._core.sessions_per_link() == [2, 2]  # envs 0 and 1 on A, 2 and 3 on B
            for i in (0, 1):  # A restarts (envs 0 and 1, idle, are not told); then B dies
                os.kill(servers[i].proc.pid, signal.SIGKILL)
                servers[i].proc.wait(timeout=10)
                if i == 0:
                    servers[0] = start_fast_server(ports[0])
            envs.send(np.zeros(2, dtype=np.int64), env_ids=[2, 3])
            _, _, _, truncated, infos = envs.recv(timeout=30)
            assert truncated.all() and sorted(infos["env_id"].tolist()) == [2, 3]
            envs.send(np.zeros(2, dtype=np.int64), env_ids=[2, 3])  # reset on new sessions, on A
            _, _, _, truncated, infos = envs.recv(timeout=30)
            assert not truncated.any() and envs._core.sessions_per_link()[0] >= 2
            before = obs[0].copy()
            envs.send(np.ones(1, dtype=np.int64), env_ids=[0])
            got, _, _, truncated, infos = envs.recv(timeout=30)
            # Not a step of env 2's or 3's session: env 0's own was lost with A's first connection.
            assert truncated.tolist() == [True] and infos["openenv_error"]["type"][0] == "ConnectionLost"
            np.testing.assert_array_equal(got[0], before)


def test_an_env_that_found_room_steps_while_the_others_of_its_reset_still_wait():
    # A dies; B has room for one of A's three envs. That one steps on; the other two are truncated.
    with started_fast_servers(3, 4) as (ports, servers):
        urls = [s.url for s in servers]
        with OpenEnvVectorEnv(urls, 6, step_timeout=STEP_TIMEOUT, connect_timeout=0.5, grace_period=60.0) as envs:
            envs.reset(seed=0)
            assert envs._core.sessions_per_link() == [3, 3]
            os.kill(servers[0].proc.pid, signal.SIGKILL)
            servers[0].proc.wait(timeout=10)
            stepped = set()
            for _ in range(4):  # the loss, the reset of the one with room, then its steps
                _, rewards, _, truncated, _ = envs.step(np.zeros(6, dtype=np.int64))
                stepped |= {i for i in range(3) if rewards[i] == 1.0 and not truncated[i]}
                assert not truncated[3:].any()
            # Before, the three were one parked reset, sent only once all had sessions: none ever stepped,
            # and the one session opened on B was dropped again at each deadline.
            assert len(stepped) == 1


def test_under_same_step_pool_unavailable_leaves_no_env_pending():
    # Env 1's episode ends (its reset within the step is queued) in the same wait in which env 0,
    # whose server died and which no other server has room for, makes the pool unavailable.
    from gymnasium.vector import AutoresetMode

    with started_fast_servers(1, 1) as (ports, servers):
        urls = [s.url for s in servers]
        with OpenEnvVectorEnv(
            urls, 2, step_timeout=2.0, connect_timeout=0.5, grace_period=0.5, autoreset_mode=AutoresetMode.SAME_STEP, max_episode_steps=1
        ) as envs:
            envs.reset(seed=0)
            os.kill(servers[0].proc.pid, signal.SIGKILL)
            servers[0].proc.wait(timeout=10)
            for _ in range(3):  # not "already in flight" after the first
                with pytest.raises(PoolUnavailable):
                    envs.step(np.zeros(2, dtype=np.int64))
                assert not envs._batch.pending.any() and envs._core.in_flight == 0


def test_envs_moved_off_a_dead_stock_server_step_on_where_they_went():
    # A stock link counts as alive with its server gone (its sessions are connections of their own):
    # the envs that found room elsewhere must not go home, be parked and move again for ever.
    from tests.servers.launch import ServerProcess

    a, b = ServerProcess("cartpole", max_sessions=3), ServerProcess("cartpole", max_sessions=4)
    a.start_healthy()
    b.start_healthy()
    try:
        with OpenEnvVectorEnv([a.url, b.url], 6, step_timeout=STEP_TIMEOUT, connect_timeout=0.5, grace_period=60.0) as envs:
            envs.reset(seed=0)
            os.kill(a.proc.pid, signal.SIGKILL)
            a.proc.wait(timeout=10)
            stepped = set()
            for _ in range(4):  # before: SessionTimeout ("fewer than 6 envs answered"), then a pool stuck in flight
                _, rewards, _, truncated, _ = envs.step(np.zeros(6, dtype=np.int64))
                stepped |= {i for i in range(3) if rewards[i] == 1.0 and not truncated[i]}
                assert not truncated[3:].any() and envs._core.in_flight == 0
            assert stepped  # some of A's envs found room on B and step there
    finally:
        a.stop()
        b.stop()


def test_room_freed_by_another_client_after_the_pool_started_is_used():
    # The pool learns each server's free room once, at its start. A server that had little room
    # then (another client held sessions) and has more now must still be asked when envs need a home.
    with started_fast_servers(4, 4) as (ports, servers):
        a, b = (s.url for s in servers)
        blocker = OpenEnvVectorEnv(a, 2)  # A: 2 of 4 taken by someone else
        with OpenEnvVectorEnv([a, b], 4, step_timeout=STEP_TIMEOUT, connect_timeout=0.5, grace_period=60.0) as envs:
            envs.reset(seed=0)
            on_a, on_b = envs._core.sessions_per_link()
            assert on_a <= 2 and on_b >= 2 and on_a + on_b == 4
            blocker.close()  # A has room for all 4 now
            os.kill(servers[1].proc.pid, signal.SIGKILL)
            servers[1].proc.wait(timeout=10)
            for _ in range(40):  # backoff rounds are at most 5 s apart; each step waits at most its timeout
                _, _, _, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
                if envs._core.sessions_per_link()[0] == 4 and not truncated.any():
                    break
            # Before: the pool counted A's room as 2 - on_a for good, and B's envs beyond it never stepped again.
            assert envs._core.sessions_per_link() == [4, 0]
            stepped = np.zeros(4, dtype=np.bool_)
            for _ in range(3):  # (a moved env's first step there is its reset: reward 0)
                _, rewards, _, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
                assert not truncated.any()
                stepped |= rewards == 1.0
            assert stepped.all()


def test_recv_after_pool_unavailable_still_returns_every_env_sent_exactly_once():
    # A restarts and other clients take all its room: its envs have nowhere to go, and recv raises
    # PoolUnavailable. Envs stepping on B, and the ones it cost, must still come back by later recvs.
    from openenv_gym import OpenEnvEnv

    ports = [free_port() for _ in range(2)]
    servers = [start_fast_server(ports[0], max_sessions=2), start_fast_server(ports[1], max_sessions=2)]
    others = []
    try:
        urls = [s.url for s in servers]
        with OpenEnvVectorEnv(urls, 4, batch_size=1, step_timeout=STEP_TIMEOUT, connect_timeout=0.5, grace_period=1.0) as envs:
            envs.reset(seed=0)
            assert envs._core.sessions_per_link() == [2, 2]
            os.kill(servers[0].proc.pid, signal.SIGKILL)
            servers[0].proc.wait(timeout=10)
            servers[0] = start_fast_server(ports[0], max_sessions=2)
            others = [OpenEnvEnv(urls[0]) for _ in range(2)]
            for other in others:
                other.reset(seed=0)
            in_flight = set(range(4))
            envs.send(np.zeros(4, dtype=np.int64))
            errors: list[str] = []
            deadline = time.monotonic() + 30
            raised = False
            while in_flight and time.monotonic() < deadline:
                try:
                    _, _, _, _, infos = envs.recv(timeout=10)
                except PoolUnavailable:
                    raised = True
                    continue
                (i,) = infos["env_id"].tolist()
                assert i in in_flight, f"env {i} returned but not in flight"
                in_flight.discard(i)
                if "openenv_error" in infos:
                    errors.append(infos["openenv_error"]["type"][0])
                if not raised:  # keep B's envs stepping until the pool gives up on A's
                    envs.send(np.zeros(1, dtype=np.int64), env_ids=[i])
                    in_flight.add(i)
            assert raised
            assert not in_flight and not envs._batch.pending.any()  # before: B's ready envs vanished with the exception
            assert "PoolUnavailable" in errors
    finally:
        for other in others:
            other.close()
        for server in servers:
            server.stop()


def test_a_server_asked_for_room_blindly_is_never_asked_for_more_sessions_than_its_limit():
    # A and B die; C, full when the pool started (another client), has room for 2 of their 4 envs now.
    # Asked blindly for all 4 at once, it refused the request itself (more than its limit): none moved.
    with started_fast_servers(2, 2, 2) as (ports, servers):
        a, b, c = (s.url for s in servers)
        other = OpenEnvVectorEnv(c, 2)
        with OpenEnvVectorEnv([a, b, c], 4, step_timeout=STEP_TIMEOUT, connect_timeout=0.5, grace_period=60.0) as envs:
            envs.reset(seed=0)
            assert envs._core.sessions_per_link() == [2, 2, 0]
            other.close()
            for server in servers[:2]:
                os.kill(server.proc.pid, signal.SIGKILL)
                server.proc.wait(timeout=10)
            for _ in range(20):
                envs.step(np.zeros(4, dtype=np.int64))
                if envs._core._hosted(2) == 2:
                    break
            assert envs._core._hosted(2) == 2
            on_c = np.flatnonzero((envs._core.link_of == 2) & ~envs._core.broken)
            for _ in range(2):  # their reset there, then a step
                _, _, _, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
                assert not truncated[on_c].any()


def test_a_pool_whose_room_was_taken_while_it_started_places_its_envs_elsewhere(monkeypatch):
    # Another client takes room on A between the pool's reading of /health and its opening of
    # sessions (two pools starting at once do this). Before, the pool's constructor raised
    # CapacityError though B had room; now it learns A's room from the refusal and places again.
    ports = [free_port() for _ in range(2)]
    servers = [start_fast_server(ports[0], max_sessions=8), start_fast_server(ports[1], max_sessions=4)]
    others: list[OpenEnvVectorEnv] = []
    try:
        a, b = (s.url for s in servers)

        import openenv_gym.vector.env as pool_module

        real = pool_module.free_capacity

        def racing(urls, **kwargs):
            seen = real(urls, **kwargs)
            if len(urls) == 2:  # (the racing pool's, not the other client's)
                others.append(OpenEnvVectorEnv(a, 4))  # the other client, just after /health answered
            return seen

        monkeypatch.setattr(pool_module, "free_capacity", racing)
        Racing = OpenEnvVectorEnv

        with Racing([a, b], 6, step_timeout=STEP_TIMEOUT, connect_timeout=STEP_TIMEOUT) as envs:
            per_link = envs._core.sessions_per_link()
            assert sum(per_link) == 6 and per_link[0] <= 4 and per_link[1] <= 4
            envs.reset(seed=0)
            _, rewards, _, truncated, _ = envs.step(np.zeros(6, dtype=np.int64))
            assert (rewards == 1.0).all() and not truncated.any()
        with pytest.raises(CapacityError):  # others hold all of A now: B alone cannot host 6
            with Racing([a, b], 6, step_timeout=STEP_TIMEOUT, connect_timeout=STEP_TIMEOUT) as envs:
                pass
    finally:
        for other in others:
            other.close()
        for server in servers:
            server.stop()


def test_a_pool_waiting_on_a_dead_server_does_not_hold_up_a_pool_in_another_thread():
    # Pools of one process share one I/O loop, driven by whichever thread waits. Before, the thread of a
    # pool whose server had died held the loop for its whole step timeout, and the other pool's steps
    # (on a healthy server) waited for it: seconds per step instead of milliseconds.
    import threading

    with started_fast_servers(2, 2) as (ports, servers):
        slow = OpenEnvVectorEnv(servers[0].url, 2, step_timeout=2.0, connect_timeout=0.5, grace_period=60.0)
        fast = OpenEnvVectorEnv(servers[1].url, 2, step_timeout=2.0)
        slow.reset(seed=0)
        fast.reset(seed=0)
        os.kill(servers[0].proc.pid, signal.SIGKILL)
        servers[0].proc.wait(timeout=10)
        slow_steps: list[float] = []

        def step_slow() -> None:
            for _ in range(3):  # the loss, then resets that find no server: about step_timeout each
                start = time.monotonic()
                slow.step(np.zeros(2, dtype=np.int64))
                slow_steps.append(time.monotonic() - start)

        thread = threading.Thread(target=step_slow)
        thread.start()
        fast_steps: list[float] = []
        deadline = time.monotonic() + 30
        while thread.is_alive() and time.monotonic() < deadline:
            start = time.monotonic()
            fast.step(np.zeros(2, dtype=np.int64))
            fast_steps.append(time.monotonic() - start)
        thread.join(timeout=30)
        assert not thread.is_alive() and max(slow_steps) > 1.0  # the slow pool did wait
        assert len(fast_steps) >= 20 and max(fast_steps) < 1.0, f"{len(fast_steps)} steps, slowest {max(fast_steps):.2f} s"
        slow.close()
        fast.close()


def test_a_parked_reset_that_expires_does_not_blame_the_server_that_gave_one_of_its_envs_a_session(tmp_path):
    # Both servers restart; new sessions now take 0.3 s to make on A and 3 s on B. The pool's reset of
    # envs 0 (home A) and 1 (home B) waits for new sessions: env 0 gets one on A, then the repairer waits
    # on B past the reset's deadline. That costs env 1 a try; before, it was also counted as a lost
    # session of A, which dropped env 0's new session and kept new sessions off A for 5 s.
    marker = tmp_path / "slow"
    ports = [free_port() for _ in range(2)]

    def start(port: int, make_delay: float) -> ServerProcess:
        kwargs = {"marker": str(marker), "make_delay": make_delay}
        return start_fast_server(port, max_sessions=4, env="tests.servers.gym_envs:SlowMake-v0", env_kwargs=kwargs)

    servers = [start(ports[0], 0.3), start(ports[1], 3.0)]
    try:
        with OpenEnvVectorEnv([s.url for s in servers], 2, step_timeout=1.0, connect_timeout=1.0, grace_period=60.0) as envs:
            core = envs._core
            envs.reset(seed=0)
            assert core.sessions_per_link() == [1, 1]
            marker.touch()
            for i in range(2):
                os.kill(servers[i].proc.pid, signal.SIGKILL)
                servers[i].proc.wait(timeout=10)
                servers[i] = start(ports[i], (0.3, 3.0)[i])
            envs.reset(seed=1)  # env 1 ends up on A (B is too slow), after a failed try
            assert time.monotonic() >= core._avoid_until[0] and not core._suspect[0], "A was put aside as if it had stalled"
            assert "no server could host" not in core.last_error.get(0, "")
            _, rewards, _, truncated, _ = envs.step(np.zeros(2, dtype=np.int64))
            assert rewards.tolist() == [1.0, 1.0] and not truncated.any()
    finally:
        for server in servers:
            server.stop()


@pytest.mark.parametrize("execution", ["inline", "thread"])
def test_under_same_step_a_step_that_fails_after_its_server_reset_the_env_is_not_reset_again(execution):
    """DeepEnd-v0's last step gives an info no reply can hold: that step fails (truncated, openenv_error), and the
    reset its server made within the step (inline calls) is the env's one reset, as a separate reset is in threads."""
    from gymnasium.vector import AutoresetMode

    with launch_local("tests.servers.gym_envs:DeepEnd-v0", extra_args=["--execution", execution]) as urls:
        with OpenEnvVectorEnv(urls, 2, autoreset_mode=AutoresetMode.SAME_STEP, step_timeout=STEP_TIMEOUT) as envs:
            _, infos = envs.reset(seed=0)
            assert infos["resets"].tolist() == [1, 1]
            for episode in (2, 3, 4):
                obs, rewards, terminated, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
                assert not truncated.any() and rewards.tolist() == [1.0, 1.0]
                obs, rewards, terminated, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
                assert truncated.all() and infos["_final_obs"].all() and "openenv_error" in infos["final_info"]
                assert infos["resets"].tolist() == [episode, episode]  # one reset per episode, never two
                assert obs.tolist() == [[0.0, 0.0], [0.0, 0.0]]
