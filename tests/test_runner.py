"""Where the server runs env calls: inline while they are cheap, in threads once they are slow."""

from __future__ import annotations

import asyncio
import threading

import pytest

from openenv_gym.server.runner import SMOOTHING, Runner

THRESHOLD = 0.005


def test_a_lone_slow_call_does_not_move_calls_to_threads():
    runner = Runner("env", threshold=THRESHOLD)
    for _ in range(50):
        runner._observe(0.0001)
    runner._observe(THRESHOLD / SMOOTHING * 0.9)  # slow, but not slow enough on its own
    assert not runner.threaded
    for _ in range(50):
        runner._observe(0.0001)
    assert not runner.threaded


def test_calls_that_keep_being_slow_move_to_threads_and_stay_there():
    runner = Runner("env", threshold=THRESHOLD)
    for _ in range(30):
        runner._observe(2 * THRESHOLD)
    assert runner.threaded
    runner._observe(0.0)
    assert runner.threaded


def test_one_very_slow_call_moves_calls_to_threads_at_once():
    runner = Runner("env", threshold=THRESHOLD)
    runner._observe(THRESHOLD / SMOOTHING * 1.1)
    assert runner.threaded


def test_a_batch_counts_as_that_many_calls_of_its_mean():
    cheap = Runner("env", threshold=THRESHOLD)
    cheap.observe_many(32 * 0.0003, 32)  # 32 CartPole steps in one frame
    assert not cheap.threaded
    slow = Runner("env", threshold=THRESHOLD)
    slow.observe_many(32 * 0.010, 32)  # 32 sessions of a 10 ms env in one frame
    assert slow.threaded
    # One slow call hidden in a batch of fast ones is averaged out, as it would be call by call.
    mixed = Runner("env", threshold=THRESHOLD)
    mixed.observe_many(31 * 0.0003 + 0.030, 32)
    assert not mixed.threaded


def test_inline_mode_never_moves():
    runner = Runner("env", mode="inline", threshold=THRESHOLD)
    runner.observe_many(32 * 1.0, 32)
    runner._observe(10.0)
    assert not runner.threaded


def test_call_many_inline_keeps_order_and_returns_exceptions():
    runner = Runner("env", mode="inline")

    def boom() -> None:
        raise ValueError("boom")

    results = runner.call_many_inline([(lambda: 1, ()), (boom, ()), (lambda x: x * 2, (21,))])
    assert results[0] == 1 and isinstance(results[1], ValueError) and results[2] == 42


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


@pytest.mark.parametrize("mode", ["bogus"])
def test_unknown_modes_are_refused(mode):
    with pytest.raises(ValueError, match="execution mode"):
        Runner("env", mode=mode)  # type: ignore[arg-type]
