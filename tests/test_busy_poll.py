"""Busy polling: a server loop that polls its sockets for a moment before it sleeps (``serve --busy-poll``)."""

from __future__ import annotations

import asyncio
import re
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from openenv_gym import OpenEnvVectorEnv
from openenv_gym.server.context import ServerConfig
from openenv_gym.server.net import busy_poll
from openenv_gym.server.net.busy_poll import MAX_WINDOW, BusyPollSelector, loop_factory
from tests.servers.launch import free_port, started_fast_servers
from tests.vector_conformance import run_side_by_side

WINDOW = 0.02


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


class Script:
    """Stands in for the selector's clock and ``sched_yield``: each call advances time by ``tick`` seconds, and runs what is due.

    ``on_yield[k]`` runs at the ``k``-th yield (from 1); ``on_clock[k]`` at the ``k``-th reading of the
    clock; ``at(when, action, nth)`` at the ``nth`` reading of a time >= ``when``.
    """

    def __init__(self, monkeypatch, tick: float = 1e-6) -> None:
        self.now, self.tick = 1000.0, tick
        self.clocks = self.yields = 0
        self.on_clock: dict[int, object] = {}
        self.on_yield: dict[int, object] = {}
        self.timed: list[list] = []  # [when, action, readings left]
        monkeypatch.setattr(busy_poll, "_clock", self.clock)
        monkeypatch.setattr(busy_poll, "_yield", self.yield_cpu)

    def clock(self) -> float:
        self.clocks += 1
        self.now += self.tick
        self._run(self.on_clock.pop(self.clocks, None))
        for entry in [t for t in self.timed if t[0] <= self.now]:
            entry[2] -= 1
            if entry[2] == 0:
                self.timed.remove(entry)
                self._run(entry[1])
        return self.now

    def at(self, when: float, action, nth: int = 1) -> None:
        self.timed.append([when, action, nth])

    def yield_cpu(self) -> None:
        self.yields += 1
        self._run(self.on_yield.pop(self.yields, None))

    @staticmethod
    def _run(action) -> None:
        if action is not None:
            action()


@pytest.mark.unit
def test_a_selector_polls_after_a_short_wait_and_finds_what_comes_meanwhile(pair, monkeypatch):
    a, b = pair
    script = Script(monkeypatch)
    with BusyPollSelector(WINDOW) as selector:
        selector.register(a, selectors.EVENT_READ)
        b.send(b"x")
        assert [key.fileobj for key, _ in selector.select(5)] == [a]  # (there at once: no wait at all)
        a.recv(16)
        script.on_yield[3] = lambda: b.send(b"y")  # (comes as it polls)
        assert [key.fileobj for key, _ in selector.select(5)] == [a]
        assert (selector.polled, selector.slept, script.yields) == (1, 0, 3)


@pytest.mark.unit
def test_a_selector_sleeps_after_polling_in_vain_and_then_polls_no_more(pair, monkeypatch):
    a, b = pair
    script = Script(monkeypatch, tick=10e-6)  # (each poll 10 us: another process never ran)
    with BusyPollSelector(WINDOW) as selector:
        selector.register(a, selectors.EVENT_READ)
        end = (script.now + script.tick) + WINDOW  # (the wait's first reading of the clock, plus the window: as the selector sums it)
        script.at(end, lambda: b.send(b"x"), nth=2)  # (the reading after the one that ends the polling: comes as it sleeps)
        assert len(selector.select(5)) == 1
        polls = script.yields
        assert polls >= WINDOW / 10e-6 * 0.9 and (selector.polled, selector.slept, selector.yielded) == (0, 1, 0)
        a.recv(16)
        script.on_clock[script.clocks + 1] = lambda: b.send(b"y")  # (as the next wait begins)
        assert len(selector.select(5)) == 1
        assert script.yields == polls and (selector.polled, selector.slept) == (0, 2)  # the last wait was long: no polling


@pytest.mark.unit
def test_a_selector_does_not_poll_after_a_wait_that_a_timer_ended(pair, monkeypatch):
    a, b = pair
    script = Script(monkeypatch)
    with BusyPollSelector(MAX_WINDOW) as selector:
        selector.register(a, selectors.EVENT_READ)
        script.on_yield[1] = lambda: b.send(b"x")
        assert len(selector.select(5)) == 1  # (polled: a short wait)
        a.recv(16)
        assert selector.select(0.001) == []  # (polls the 1 ms, then the timeout ends the wait)
        assert (selector.polled, selector.slept) == (1, 1)
        polls = script.yields
        script.on_clock[script.clocks + 1] = lambda: b.send(b"y")
        assert len(selector.select(5)) == 1
        assert script.yields == polls and (selector.polled, selector.slept) == (1, 2)  # slept at once: no polling after a timer


@pytest.mark.unit
def test_a_selector_stops_polling_when_another_process_wants_the_cpu(pair, monkeypatch):
    a, b = pair
    script = Script(monkeypatch)
    with BusyPollSelector(MAX_WINDOW) as selector:
        selector.register(a, selectors.EVENT_READ)

        def another_process_runs() -> None:
            script.now += 10 * busy_poll.YIELDED

        script.on_yield[2] = another_process_runs
        script.on_clock[4] = lambda: b.send(b"x")  # (the reading after the cut-short poll: comes as it sleeps)
        assert len(selector.select(5)) == 1
        assert script.yields == 2 and (selector.polled, selector.slept, selector.yielded) == (0, 1, 1)


@pytest.mark.unit
def test_a_selector_keeps_to_the_timeout_it_is_given(pair):
    a, _ = pair
    with BusyPollSelector(WINDOW) as selector:
        selector.register(a, selectors.EVENT_READ)
        started = time.monotonic()
        assert selector.select(WINDOW / 5) == []  # (shorter than the window: polls that long, then a wait of nothing left)
        assert time.monotonic() - started >= WINDOW / 5 * 0.9
        assert selector.select(0) == []
        assert selector.select(-1) == []


@pytest.mark.unit
@pytest.mark.parametrize("window", [0.0, -0.001, MAX_WINDOW * 2])
def test_a_window_out_of_range_is_refused(window):
    with pytest.raises(ValueError, match="busy-poll window"):
        BusyPollSelector(window)
    with pytest.raises(ValueError, match="busy_poll"):
        ServerConfig(busy_poll=window if window else -1.0)


@pytest.mark.unit
def test_a_loop_factory_busy_polls_only_with_a_window():
    assert loop_factory(0.0) is None  # (asyncio.Runner then makes the loop asyncio.run makes)
    loops = loop_factory(WINDOW)
    with asyncio.Runner(loop_factory=loops) as runner:
        assert runner.run(asyncio.sleep(0.01, "slept")) == "slept"
    (selector,) = loops.selectors
    assert selector.slept >= 1  # (the sleep's wait went through it)


def test_busy_polling_servers_step_as_syncvectorenv_does():
    with started_fast_servers(4, 4, extra_args=["--busy-poll", "500"]) as (ports, _):
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        ended = run_side_by_side(
            lambda mode: OpenEnvVectorEnv(urls, 8, autoreset_mode=mode),
            lambda: gym.make("CartPole-v1"),
            AutoresetMode.NEXT_STEP,
            num_envs=8,
            steps=200,
        )
        assert ended > 0


def test_serve_busy_polls_between_a_pools_steps():
    # `serve --busy-poll` reaches the server's loop, whose selector then polls between lockstep steps:
    # the counts it logs as it stops say so.
    with started_fast_servers(4, extra_args=["--busy-poll", "100000"]) as (ports, (server,)):
        with OpenEnvVectorEnv(f"http://127.0.0.1:{ports[0]}", 4) as envs:
            envs.reset(seed=0)
            for _ in range(200):
                envs.step(np.ones(4, dtype=np.int64))
        server.terminate()
        assert server.proc.wait(30) == 0, server.log_tail()
        counts = re.findall(r"busy polling \(100000 us\): (\d+) waits found a request by polling", server.log_tail())
    assert len(counts) == 1  # (one loop, one selector)
    assert int(counts[0]) >= 20, counts  # (unloaded, ~200 of the 200 steps' requests come while it polls)


@pytest.mark.unit
def test_serve_with_workers_passes_busy_poll_on_to_them():
    from openenv_gym.cli import _worker_command, build_parser

    args = build_parser().parse_args(["serve", "CartPole-v1", "--workers", "2", "--busy-poll", "750"])
    command = _worker_command(args)
    assert command[command.index("--busy-poll") + 1] == "750"


@pytest.mark.parametrize("value", ["-1", str(int(MAX_WINDOW * 1e6) + 1), "lots"])
def test_serve_refuses_a_busy_poll_out_of_range(value):
    command = [sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1", "--port", str(free_port())]
    done = subprocess.run([*command, "--busy-poll", value], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--busy-poll" in done.stderr


def test_the_busy_poll_benchmark_measures_both_fleets_in_turn():
    top = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, str(top / "benchmarks" / "busy_poll.py"), "--blocks", "4", "--block", "20", "--work-us", "100"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=top,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "busy-polling 500 us" in done.stdout and "ratio" in done.stdout, done.stdout
    rates = [float(x.replace(",", "")) for x in re.findall(r"servers ([\d,]+), busy-polling 500 us ([\d,]+)", done.stdout)[0]]
    assert all(rate > 0 for rate in rates)
