"""The fork server the stock OpenEnv test servers come from: exits reported as Popen's, none left behind."""

from __future__ import annotations

import os
import signal
import time

from tests.servers.launch import ServerProcess, _ForkServer, running

TIMEOUT = 60.0


def test_forked_servers_serve_their_exit_is_reported_and_none_outlives_the_fork_server():
    forks = _ForkServer()  # (its own: closing the run's one would stop the other tests' servers)
    killed = ServerProcess("cartpole", max_sessions=1, forks=forks)
    left = ServerProcess("cartpole", max_sessions=1, forks=forks)
    try:
        killed.start_healthy(TIMEOUT)
        left.start_healthy(TIMEOUT)
        assert killed.proc.pid != left.proc.pid and killed.proc.pid != forks.proc.pid
        os.kill(killed.proc.pid, signal.SIGKILL)
        assert killed.proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
        assert killed.proc.poll() == -signal.SIGKILL and left.proc.poll() is None
        killed.proc.kill()  # (reaped: no signal goes to a pid that may be another process's now)
        forks.close()  # as when the test run ends or dies: its stdin closes
        assert forks.proc.returncode == 0
        deadline = time.monotonic() + TIMEOUT
        while running(left.proc.pid):
            assert time.monotonic() < deadline, f"server {left.proc.pid} outlived the fork server"
            time.sleep(0.05)
    finally:
        forks.close()
        killed.stop()
        left.stop()
