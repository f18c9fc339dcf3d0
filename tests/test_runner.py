"""Where the server runs env calls: inline while they are cheap, in threads once they are slow."""

from __future__ import annotations

import asyncio
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from openenv_gym.server.hosting.runner import SMOOTHING, Runner

THRESHOLD = 0.005


@pytest.mark.unit
def test_a_lone_slow_call_does_not_move_calls_to_threads():
    runner = Runner("env", threshold=THRESHOLD)
    for _ in range(50):
        runner._observe(0.0001)
    runner._observe(THRESHOLD / SMOOTHING * 0.9)  # slow, but not slow enough on its own
    assert not runner.threaded
    for _ in range(50):
        runner._observe(0.0001)
    assert not runner.threaded


@pytest.mark.unit
def test_calls_that_keep_being_slow_move_to_threads_and_stay_there():
    runner = Runner("env", threshold=THRESHOLD)
    for _ in range(30):
        runner._observe(2 * THRESHOLD)
    assert runner.threaded
    runner._observe(0.0)
    assert runner.threaded


@pytest.mark.unit
def test_one_very_slow_call_moves_calls_to_threads_at_once():
    runner = Runner("env", threshold=THRESHOLD)
    runner._observe(THRESHOLD / SMOOTHING * 1.1)
    assert runner.threaded


@pytest.mark.unit
def test_inline_calls_stop_where_they_turn_slow_and_the_rest_run_in_threads():
    runner = Runner("env", threshold=0.001)

    def slow() -> str:
        time.sleep(0.02)  # the env's own work: a slow step
        return threading.current_thread().name

    calls = [(slow, ())] * 4
    done = runner.call_many_inline(calls)
    assert len(done) == 1 and runner.threaded  # the first call moved the runner; the rest were left
    fresh = Runner("env", threshold=0.001)
    names = asyncio.run(fresh.call_many(calls))
    fresh.shutdown()
    assert names[0] == threading.main_thread().name
    assert all(name.startswith("openenv-gym-env") for name in names[1:])


@pytest.mark.unit
def test_inline_mode_never_moves():
    runner = Runner("env", mode="inline", threshold=THRESHOLD)
    for _ in range(30):
        runner._observe(10.0)
    assert not runner.threaded
    assert runner.observe(10.0) is False


@pytest.mark.unit
def test_a_gymnasium_batch_stops_where_the_runner_says_so():
    from openenv_gym.server.hosting.gym_host import GymHostFactory

    factory = GymHostFactory("CartPole-v1")
    hosts = [factory.make() for _ in range(5)]
    seen = []

    def observe(elapsed: float) -> bool:
        seen.append(elapsed)
        return len(seen) == 3

    out = factory.run_batch([(h, "reset", (i, {})) for i, h in enumerate(hosts)], observe)
    assert len(seen) == 3 and all(e >= 0 for e in seen)
    assert out.fields["observation"].shape == (3, 4) and out.reward.shape == (3,)
    assert out.metadata is None  # CartPole's infos are empty: no column of empty dicts
    untouched = hosts[3].env  # never reset: stepping it is an error
    with pytest.raises(gym.error.ResetNeeded):
        untouched.step(0)
    for h in hosts:
        h.close()


@pytest.mark.unit
def test_call_many_inline_keeps_order_and_returns_exceptions():
    runner = Runner("env", mode="inline")

    def boom() -> None:
        raise ValueError("boom")

    results = runner.call_many_inline([(lambda: 1, ()), (boom, ()), (lambda x: x * 2, (21,))])
    assert results[0] == 1 and isinstance(results[1], ValueError) and results[2] == 42


@pytest.mark.unit
def test_call_each_answers_on_the_loop_as_each_call_ends():
    runner = Runner("env", mode="thread", threads=4)
    release = threading.Event()

    def slow() -> str:
        assert release.wait(10)
        return "slow"

    def fast() -> str:
        return threading.current_thread().name

    async def main() -> list:
        loop = asyncio.get_running_loop()
        got: list = []
        two, three = loop.create_future(), loop.create_future()

        def on_result(k: int, result: object) -> None:
            assert threading.current_thread() is threading.main_thread()  # on the loop's thread
            got.append((k, result))
            if len(got) == 2:
                two.set_result(None)
            if len(got) == 3:
                three.set_result(None)

        runner.call_each([(slow, ()), (fast, ()), (fast, ())], on_result, loop)
        await asyncio.wait_for(two, 10)
        assert sorted(k for k, _ in got) == [1, 2]  # the fast ones did not wait for the slow one
        release.set()
        await asyncio.wait_for(three, 10)
        return got

    try:
        got = asyncio.run(main())
    finally:
        runner.shutdown()
    results = dict(got)
    assert results[0] == "slow"
    assert all(name.startswith("openenv-gym-env") for name in (results[1], results[2]))


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["bogus"])
def test_unknown_modes_are_refused(mode):
    with pytest.raises(ValueError, match="execution mode"):
        Runner("env", mode=mode)  # type: ignore[arg-type]


class _ScriptedClock:
    """The runner's clock, moved by the calls themselves: a call "takes" what it adds, whatever the machine does."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def take(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.unit
def test_calls_in_threads_that_are_fast_again_return_inline_and_one_slow_call_among_them_stays(monkeypatch):
    from openenv_gym.server.hosting import runner as runner_module
    from openenv_gym.server.hosting.runner import RETURN_AFTER

    clock = _ScriptedClock()  # (real durations of near-empty calls in threads jump past 5 ms on a loaded VM)
    monkeypatch.setattr(runner_module, "time", clock)
    runner = Runner("env", threshold=THRESHOLD)
    runner._observe(THRESHOLD / SMOOTHING * 2)  # one very slow call (a hostile reset, say): to threads
    assert runner.threaded

    async def calls(durations: list[float]) -> None:
        for d in durations:
            await runner.call(clock.take, d)

    asyncio.run(calls([0.0] * (RETURN_AFTER - 10) + [THRESHOLD * 2] + [0.0] * (RETURN_AFTER - 10)))
    assert runner.threaded  # a slow call in the run: the count starts again
    names = []

    async def where() -> None:
        for _ in range(20):
            names.append(await runner.call(lambda: threading.current_thread().name))

    asyncio.run(where())
    assert not runner.threaded  # RETURN_AFTER fast calls in a row: inline again
    assert names[-1] == threading.main_thread().name and names[0].startswith("openenv-gym-env")
    runner.shutdown()


@pytest.mark.unit
def test_calls_that_stay_slow_in_threads_stay_there():
    runner = Runner("env", threshold=0.001)
    runner._observe(1.0)
    assert runner.threaded

    async def calls() -> None:
        await asyncio.gather(*(runner.call(time.sleep, 0.002) for _ in range(64)))

    asyncio.run(calls())
    assert runner.threaded
    runner.shutdown()


@pytest.mark.unit
def test_a_lane_step_gives_clean_rows_or_the_batch_output_a_batch_would():
    from openenv_gym.protocol.lane import Layout
    from openenv_gym.server.hosting.gym_host import GymHostFactory
    from openenv_gym.server.hosting.hosts import BatchOutput, LaneOutput

    factory = GymHostFactory("CartPole-v1")
    layout = Layout(np.dtype(np.float32), (4,))
    ours, theirs = [factory.make() for _ in range(4)], [factory.make() for _ in range(4)]
    for i, (a, b) in enumerate(zip(ours, theirs)):
        a.start(i, {})
        b.start(i, {})
    actions = factory.parse_action_column({"action": np.array([0, 1, 1, 0])}, 4)
    restart = [False, True, False, False]
    out = factory.run_lane(ours, actions, restart, layout, lambda elapsed: False)
    calls = [(h, "reset", (None, {})) if r else (h, "step", (a,)) for h, a, r in zip(theirs, actions, restart)]
    batch = factory.run_batch(calls, lambda elapsed: False)
    assert type(out) is LaneOutput
    assert np.array_equal(np.array(out.observations), batch.fields["observation"])
    assert np.array_equal(np.array(out.reward), batch.reward, equal_nan=True) and np.isnan(out.reward[1])
    assert list(out.done) == batch.done.tolist() and list(out.truncated) == batch.fields["truncated"].tolist()
    assert [h.step_count for h in ours] == [1, 0, 1, 1]

    # Stopped where the runner says so: the output of the calls made, as run_batch's.
    seen = []
    out = factory.run_lane(ours, actions, None, layout, lambda elapsed: seen.append(elapsed) or len(seen) == 2)
    assert type(out) is BatchOutput and len(out.reward) == 2 and len(seen) == 2
    assert out.fields["observation"].shape == (2, 4) and [h.step_count for h in ours] == [2, 1, 1, 1]

    # Off the layout: the same calls, as a batch output.
    out = factory.run_lane(ours, actions, None, Layout(np.dtype(np.float64), (4,)), lambda elapsed: False)
    assert type(out) is BatchOutput and out.fields["observation"].dtype == np.float32 and len(out.reward) == 4

    # A call that fails is a failure of its row only.
    out = factory.run_lane(ours, [actions[0], "left", actions[2], actions[3]], None, layout, lambda elapsed: False)
    assert type(out) is BatchOutput and list(out.failures) == [1] and np.isnan(out.reward[1]) and not out.done[1]
    for h in ours + theirs:
        h.close()


def test_raw_steps_whose_calls_turn_slow_finish_in_threads_with_every_row():

    from openenv_gym import launch_local
    from openenv_gym.protocol import lane as lanes
    from openenv_gym.protocol import multiplex as fastp
    from tests.clients import fast_connection, run

    layout = lanes.Layout(np.dtype("<i8"), ())
    # (a 300 ms call moves calls to threads at a 10 ms threshold; a stall of the VM during the fast calls would need 100 ms)
    extra = ["--thread-threshold-ms", "10", "--env-kwargs", '{"delay": 0.3}']
    with launch_local("tests.servers.gym_envs:ActionSleep-v0", max_sessions=4, extra_args=extra) as urls:

        async def talk() -> list:
            fc = await fast_connection(urls[0])
            try:
                sids = await fc.open_sessions(4)
                await fc.request(lambda rid: fastp.reset_batch_request(rid, sids, seeds=[0, 1, 2, 3]))
                bound = await fc.request(lambda rid: lanes.bind_request(rid, sids, "action", layout))
                lane = lanes.parse_bound(bound.message, sids, "action", layout, lanes.MAX_LANE_BYTES)
                replies = []
                for actions in ([0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]):  # fast; slow from the first call on; in threads
                    future = asyncio.get_running_loop().create_future()
                    frame = lambda rid, a=np.array(actions): lanes.pack_step(lane, rid, a, None)  # noqa: E731
                    fc.send_request(frame, lambda reply, f=future: f.done() or f.set_result(reply), raw=True)
                    replies.append(await asyncio.wait_for(future, 20))
                return replies
            finally:
                await fc.close()

        inline, turned, threaded = run(talk())
    assert isinstance(inline, lanes.RawBatch)
    for reply in (turned, threaded):  # (answered from threads: the ordinary batch reply)
        assert isinstance(reply, fastp.BatchReply) and reply.errors is None
        assert reply.reward.tolist() == [1.0] * 4 and reply.observation["observation"].shape == (4, 2)
