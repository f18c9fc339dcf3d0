"""The fork server the stock OpenEnv test servers come from: exits reported as Popen's, none left behind."""

from __future__ import annotations

import os
import signal
import tempfile
import time

import httpx

from tests.servers.launch import _ForkServer, free_port

TIMEOUT = 60.0


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no longer does)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _spawn(forks: _ForkServer, log: str):
    port = free_port()
    child = forks.spawn({"env": "cartpole", "port": port, "max_sessions": 1, "environ": {}, "log": log})
    deadline = time.monotonic() + TIMEOUT
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        while True:
            assert child.poll() is None, open(log).read()
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return child
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, open(log).read()
            time.sleep(0.05)


def test_forked_servers_serve_their_exit_is_reported_and_none_outlives_the_fork_server():
    forks = _ForkServer()
    fd, log = tempfile.mkstemp(prefix="openenv-forkserver-test-", suffix=".log")
    os.close(fd)
    try:
        killed, left = _spawn(forks, log), _spawn(forks, log)
        assert killed.pid != left.pid and killed.pid != forks.proc.pid
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=TIMEOUT) == -signal.SIGKILL
        assert killed.poll() == -signal.SIGKILL and left.poll() is None
        killed.kill()  # (reaped: no signal goes to a pid that may be another process's now)
        forks.close()  # as when the test run ends or dies: its stdin closes
        assert forks.proc.returncode == 0
        deadline = time.monotonic() + TIMEOUT
        while _alive(left.pid):
            assert time.monotonic() < deadline, f"server {left.pid} outlived the fork server"
            time.sleep(0.05)
    finally:
        forks.close()
        os.unlink(log)
