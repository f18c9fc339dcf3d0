"""The shared I/O loop: the caller drives it, the daemon keeps it alive between calls."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from openenv_gym import OpenEnvEnv, OpenEnvVectorEnv, launch_local
from openenv_gym._loop import LoopThread


@pytest.mark.unit
def test_run_returns_results_and_raises_errors():
    io = LoopThread()
    try:

        async def double(x):
            await asyncio.sleep(0)
            return 2 * x

        async def fail():
            raise KeyError("boom")

        assert io.run(double(21)) == 42
        with pytest.raises(KeyError):
            io.run(fail())
        with pytest.raises(TimeoutError):
            io.run(asyncio.sleep(10), timeout=0.05)
    finally:
        io.stop()


@pytest.mark.unit
def test_calls_from_inside_a_running_event_loop_are_handed_to_the_daemon():
    io = LoopThread()
    try:

        async def where():
            return threading.current_thread().name

        async def app():  # a notebook or an async app calling sync code
            return io.run(where(), timeout=5)

        assert asyncio.run(app()) == "openenv-gym-io"
    finally:
        io.stop()


@pytest.mark.unit
def test_calls_handed_to_the_daemon_do_not_lock_out_a_plain_thread():
    io = LoopThread()
    try:
        done = threading.Event()

        def plain():  # a thread making ordinary sync calls
            for _ in range(300):
                io.run(asyncio.sleep(0), timeout=5)
            done.set()

        async def app():  # meanwhile, sync calls from inside a running loop (they hop)
            thread = threading.Thread(target=plain, daemon=True)
            thread.start()
            for _ in range(300):
                io.run(asyncio.sleep(0), timeout=5)

        asyncio.run(app())
        assert done.wait(20), "the plain thread never got the loop"
    finally:
        io.stop()


@pytest.mark.unit
def test_a_call_takes_the_loop_back_from_the_daemon_at_once():
    # After a pause the daemon drives the loop; the next call asks it to let go at once
    # (it once waited for its own 50 ms retry first: a stall on every step after a pause).
    import statistics

    io = LoopThread(idle_after=0.01)
    try:
        waits = []
        for _ in range(5):
            deadline = time.monotonic() + 10
            while io._handoff is None:  # the daemon has taken the loop
                assert time.monotonic() < deadline
                time.sleep(0.005)
            started = time.monotonic()
            io.run(asyncio.sleep(0), timeout=5)
            waits.append(time.monotonic() - started)
        assert statistics.median(waits) < 0.03, waits
    finally:
        io.stop()


@pytest.mark.unit
def test_a_call_made_while_the_daemon_drives_the_loop_drives_it_itself_and_does_not_hop():
    # Only a call that another *caller* drives the loop for is handed over (a hop); the daemon lets
    # go instead. Hopping to the daemon would run every call after a pause on the daemon's thread.
    io = LoopThread(idle_after=0.01)
    try:

        async def where():
            return threading.current_thread().name

        for _ in range(5):
            deadline = time.monotonic() + 10
            while not io._daemon_holds:  # the daemon has taken the loop
                assert time.monotonic() < deadline
                time.sleep(0.005)
            assert io.run(where(), timeout=5) == threading.current_thread().name
            assert io._hops == 0
    finally:
        io.stop()


@pytest.mark.unit
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # (the fork is the point: Python 3.12+ warns)
def test_a_loop_used_after_fork_refuses_clearly():
    import os

    io = LoopThread()
    try:
        assert io.run(asyncio.sleep(0, result=1), timeout=5) == 1
        pid = os.fork()
        if pid == 0:  # the child: the parent's loop (and its daemon thread) is not ours
            try:
                io.run(asyncio.sleep(0), timeout=1)
            except RuntimeError as exc:
                os._exit(0 if "before a fork" in str(exc) else 2)
            os._exit(1)
        deadline = time.monotonic() + 20
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "the child hung"
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
        assert io.run(asyncio.sleep(0, result=2), timeout=5) == 2  # the parent goes on
    finally:
        io.stop()


@pytest.mark.unit
def test_calls_from_several_threads_take_turns():
    io = LoopThread()
    try:

        async def work(i):
            await asyncio.sleep(0.001)
            return i

        results: list[int] = []

        def caller(k):
            for i in range(50):
                results.append(io.run(work(k * 100 + i), timeout=5))

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(results) == sorted(k * 100 + i for k in range(4) for i in range(50))
    finally:
        io.stop()


@pytest.mark.unit
def test_background_work_progresses_between_calls():
    io = LoopThread(idle_after=0.05)
    try:
        done = threading.Event()

        async def later():
            await asyncio.sleep(0.1)
            done.set()

        io.submit(later())
        assert done.wait(timeout=5)  # nobody called run(): the daemon drove the loop
    finally:
        io.stop()


@pytest.fixture(scope="module")
def pinging_url():
    """CartPole, pings every 0.3 s with a 1 s deadline: an idle client must still answer (one that did not is closed by 1.3 s)."""
    extra = ["--ping-interval", "0.3", "--ping-timeout", "1.0", "--close-timeout", "0.3"]
    with launch_local("CartPole-v1", max_sessions=8, extra_args=extra) as urls:
        yield urls[0]


def test_idle_env_keeps_answering_pings(pinging_url):
    with OpenEnvEnv(pinging_url) as env:
        env.reset(seed=0)
        time.sleep(1.5)  # the trainer thinks; the behaviour under test is the passage of time
        _, reward, *_ = env.step(0)
        assert reward == 1.0


def test_idle_pool_keeps_answering_pings(pinging_url):
    with OpenEnvVectorEnv(pinging_url, 4) as envs:
        envs.reset(seed=0)
        time.sleep(1.5)
        _, rewards, *_ = envs.step(np.zeros(4, dtype=np.int64))
        assert (rewards == 1.0).all()


@pytest.mark.parametrize("make", ["env", "vector"])
def test_a_ctrl_c_while_sessions_open_leaves_none_open_on_the_server(tmp_path, make):
    # Cut short by a Ctrl-C, the call that opens the sessions is cancelled and closes them; it used
    # to run on under the daemon, and keep its sessions open with nobody to close them.
    import signal

    import httpx

    marker = tmp_path / "slow"
    kwargs = {"marker": str(marker), "make_delay": 1.5}
    with launch_local("tests.servers.gym_envs:SlowMake-v0", env_kwargs=kwargs, max_sessions=8) as (url,):
        marker.touch()  # (the server made its probe env already: from now on a session takes 1.5 s)

        def active() -> int:
            return httpx.get(url + "/health", trust_env=False, timeout=10).json()["active_sessions"]

        with pytest.raises(KeyboardInterrupt):
            threading.Timer(0.5, signal.pthread_kill, (threading.get_ident(), signal.SIGINT)).start()
            if make == "env":
                OpenEnvEnv(url)
            else:
                OpenEnvVectorEnv(url, 2)
        deadline = time.monotonic() + 15
        while active() and time.monotonic() < deadline:  # (the server ends them as their envs are made)
            time.sleep(0.05)
        assert active() == 0


@pytest.mark.unit
def test_an_interrupt_as_a_started_call_ends_hands_its_result_on_and_its_stale_stop_is_run_past():
    # A Ctrl-C that lands as the call's future is done: the result goes to `abandon` (a pool puts its
    # arrivals back), and asyncio's stop callback, left queued, must not stop the next run at once
    # ("Event loop stopped before Future completed"), nor kill the daemon thread.
    io = LoopThread(idle_after=0.01)
    try:

        def interrupt() -> None:
            raise KeyboardInterrupt

        def start(future: asyncio.Future) -> None:
            future.set_result(42)
            io.loop.call_soon(interrupt)  # (after the future's own callbacks)

        kept: list[int] = []
        with pytest.raises(KeyboardInterrupt):
            io.run_started(start, kept.append)
        assert kept == [42]
        io.loop.call_soon_threadsafe(io.loop.stop)  # a stale stop, as an interrupt leaves one
        assert io.run(asyncio.sleep(0, result=7), timeout=5) == 7
        io.loop.call_soon_threadsafe(io.loop.stop)
        deadline = time.monotonic() + 10
        while io._handoff is None:  # the daemon drives the loop (and meets the stale stop)
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert io._thread.is_alive()
        assert io.run(asyncio.sleep(0, result=8), timeout=5) == 8
    finally:
        io.stop()


@pytest.mark.unit
def test_a_ctrl_c_inside_the_loops_callbacks_is_held_until_the_call_lets_go():
    # Python raises KeyboardInterrupt between any two bytecodes; inside the loop's callbacks it cuts
    # work in half. While a call (run) drives the loop on the main thread, the first Ctrl-C cancels
    # the call between callbacks instead, as asyncio.Runner does.
    import signal

    io = LoopThread()
    try:
        done: list[str] = []

        async def call() -> None:
            signal.raise_signal(signal.SIGINT)  # (Python runs the handler at once, in this frame)
            done.append("after the signal")
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                done.append("cleaned up")
                raise

        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            io.run(call(), timeout=60)
        assert done == ["after the signal", "cleaned up"] and time.monotonic() - start < 10
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

        def start_call(future: asyncio.Future) -> None:
            signal.raise_signal(signal.SIGINT)
            done.append("started")  # (never finishes the future: the Ctrl-C lets go of it)

        with pytest.raises(KeyboardInterrupt):
            io.run_started(start_call)
        assert done[-1] == "started"

        kept: list[int] = []

        def finish_call(future: asyncio.Future) -> None:
            signal.raise_signal(signal.SIGINT)
            future.set_result(5)

        with pytest.raises(KeyboardInterrupt):  # done anyway: its result goes to `abandon`, the Ctrl-C is raised
            io.run_started(finish_call, kept.append)
        assert kept == [5]

        async def twice() -> None:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # a second Ctrl-C is raised at once
            done.append("not reached")

        with pytest.raises(KeyboardInterrupt):
            io.run(twice(), timeout=60)
        assert "not reached" not in done

        assert io.run(asyncio.sleep(0, result=3), timeout=5) == 3
    finally:
        io.stop()


@pytest.mark.unit
def test_a_program_that_handles_ctrl_c_itself_keeps_its_handler():
    import signal

    io = LoopThread()
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:

        async def call() -> int:
            signal.raise_signal(signal.SIGINT)
            return 1

        assert io.run(call(), timeout=10) == 1
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
        io.stop()


@pytest.mark.unit
def test_a_ctrl_c_held_over_a_whole_call_is_raised_at_its_safe_points_or_as_it_ends():
    import signal

    io = LoopThread()
    try:
        with pytest.raises(KeyboardInterrupt):  # in the call's own work, with no safe point: as it ends
            with io.holding_ctrl_c():
                signal.raise_signal(signal.SIGINT)
                ended = True  # (the call goes on to its end)
        assert ended

        started: list[int] = []
        with pytest.raises(KeyboardInterrupt):  # before a run: the run starts (its requests go out), then raises
            with io.holding_ctrl_c():
                signal.raise_signal(signal.SIGINT)
                io.run_started(lambda future: started.append(1))  # (never done: let go of)
        assert started == [1]

        with pytest.raises(KeyboardInterrupt):  # at a safe point: raised there
            with io.holding_ctrl_c():
                signal.raise_signal(signal.SIGINT)
                io.check_interrupt()
                raise AssertionError("not reached")

        with io.holding_ctrl_c():  # after the results are handed over: the call returns them
            io.settle()
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        began: list[int] = []
        with pytest.raises(KeyboardInterrupt):  # ... and the next call raises it as it begins
            with io.holding_ctrl_c():
                began.append(1)
        assert began == []
        with io.holding_ctrl_c():  # owed once only
            began.append(2)
        assert began == [2]
        with pytest.raises(KeyboardInterrupt):  # before: settle raises it, so nothing is taken
            with io.holding_ctrl_c():
                signal.raise_signal(signal.SIGINT)
                io.settle()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        io.stop()


UNCLOSED = """
import sys
import gymnasium as gym
import openenv_gym

def play():  # an env and a pool, never closed: collected as this returns
    env = gym.make("openenv_gym/Remote-v0", base_url=sys.argv[1])
    env.reset(seed=0)
    envs = gym.make_vec("openenv_gym/Remote-v0", num_envs=2, base_url=sys.argv[1])
    envs.reset(seed=0)

play()
print("played")
"""


SERVER_GONE = """
import sys
import numpy as np
import openenv_gym

with openenv_gym.launch_local("CartPole-v1") as urls:
    envs = openenv_gym.OpenEnvVectorEnv(urls, 2)
    envs.reset(seed=0)
_, _, _, truncated, _ = envs.step(np.zeros(2, dtype=np.int64))  # (its server is gone: a repair starts)
print("truncated" if truncated.all() else "stepped")
"""


def test_a_pool_alive_at_exit_whose_server_is_gone_exits_quietly(tmp_path):
    # The pool's repair of the dead server is still waiting at exit; before, asyncio printed
    # "Task was destroyed but it is pending!" for it. Stopping the loop thread now cancels it.
    import subprocess
    import sys

    script = tmp_path / "server_gone.py"
    script.write_text(SERVER_GONE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "truncated", done.stderr
    assert "destroyed" not in done.stderr and "never awaited" not in done.stderr, done.stderr


def test_envs_collected_unclosed_just_before_exit_close_their_sessions_quietly(tmp_path):
    # Their finalizers hand the closes to the loop thread; the interpreter exits at once. Before, the
    # closes were dropped half-done ("Task was destroyed but it is pending!", "coroutine
    # 'PoolCore.close' was never awaited") and the server only saw the connections drop.
    import subprocess
    import sys

    import httpx

    script = tmp_path / "unclosed.py"
    script.write_text(UNCLOSED)
    with launch_local("CartPole-v1", max_sessions=4) as (url,):
        for _ in range(2):  # (the race it guards against went our way about one run in nine)
            done = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0 and done.stdout.strip() == "played", done.stderr
            assert "destroyed" not in done.stderr and "never awaited" not in done.stderr, done.stderr
            assert httpx.get(f"{url}/health", trust_env=False, timeout=10).json()["active_sessions"] == 0
