"""Nothing grows with time or with use: a pool that steps on, and pools made and closed by the hundred (chaos tier, bounded).

The soak steps 64 envs on 2 servers for a few seconds and compares the
memory and open files of the client and the servers at its start and end;
the churn makes and closes 200 pools and compares files and threads before
and after. Both are bounded in time, as every test here is.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from contextlib import ExitStack

import numpy as np
import pytest

import openenv_gym
from openenv_gym.launch import ServerProcess, serve_command

pytestmark = pytest.mark.chaos

SOAK_SECONDS = 6.0


def _fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss(pid: int | str = "self") -> int:
    """Resident memory, in bytes."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _servers(stack: ExitStack, count: int) -> list[ServerProcess]:
    import socket

    servers = []
    for _ in range(count):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = serve_command("CartPole-v1", host="127.0.0.1", port=port, max_sessions=64, env_kwargs=None, extra_args=())
        server = ServerProcess(command, "127.0.0.1", port)
        stack.callback(server.stop)
        servers.append(server)
    import httpx

    with httpx.Client(timeout=2.0, trust_env=False) as client:
        for server in servers:
            server.wait_healthy(client, time.monotonic() + 60)
    return servers


def _step_for(envs: openenv_gym.OpenEnvVectorEnv, seconds: float) -> int:
    actions = np.zeros(envs.num_envs, dtype=np.int64)
    steps = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(100):
            actions[:] = steps % 2
            envs.step(actions)
            steps += 1
    return steps


def test_a_pool_stepping_on_keeps_memory_and_files_flat_on_both_ends():
    with ExitStack() as stack:
        servers = _servers(stack, 2)
        with openenv_gym.OpenEnvVectorEnv([s.url for s in servers], 64) as envs:
            envs.reset(seed=0)
            _step_for(envs, 1.0)  # (warm: caches, lanes bound, buffers grown)
            gc.collect()
            before = [(_rss(), _fds())] + [(_rss(s.proc.pid), _fds(s.proc.pid)) for s in servers]
            steps = _step_for(envs, SOAK_SECONDS)
            gc.collect()
            after = [(_rss(), _fds())] + [(_rss(s.proc.pid), _fds(s.proc.pid)) for s in servers]
        assert steps > 1000
        for (rss0, fds0), (rss1, fds1) in zip(before, after):
            assert fds1 == fds0
            assert rss1 - rss0 < 16 << 20, f"grew {(rss1 - rss0) >> 20} MiB in {steps} steps"


def test_two_hundred_pools_made_and_closed_leave_no_file_or_thread_behind():
    with ExitStack() as stack:
        (server,) = _servers(stack, 1)
        with openenv_gym.OpenEnvVectorEnv(server.url, 2) as envs:  # (the loop thread and its like, started once)
            envs.reset(seed=0)
        gc.collect()
        fds, threads, server_fds = _fds(), threading.active_count(), _fds(server.proc.pid)
        for i in range(200):
            with openenv_gym.OpenEnvVectorEnv(server.url, 4) as envs:
                if i % 20 == 0:
                    envs.reset(seed=i)
                    envs.step(np.zeros(4, dtype=np.int64))
        gc.collect()
        assert _fds() == fds and threading.active_count() == threads
        deadline = time.monotonic() + 10
        while _fds(server.proc.pid) != server_fds and time.monotonic() < deadline:  # (the server closes them as it learns)
            time.sleep(0.05)
        assert _fds(server.proc.pid) == server_fds
