"""A real network partition: a server in a network namespace of its own, its link cut mid-run and brought back (chaos tier).

A loopback fault proxy cannot show what a cut link does: no reset, no close,
the packets just go nowhere. Here the server runs in a namespace this test
makes (``ip netns``, a veth pair, addresses of 10.231.0.0/16), the pool in the
machine's own, beside a server on loopback. The link goes down mid-run: the
envs on the cut server are truncated within the step timeout and placed on
the other; the link comes back, the other server stops, and the envs go back
to the first. Skipped where network namespaces cannot be made (not root, no
``ip``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import ExitStack

import httpx
import numpy as np
import pytest

import openenv_gym
from openenv_gym.launch import ServerProcess, serve_command

STEP_TIMEOUT = 2.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _netns_works() -> bool:
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    name = f"ogprobe{os.getpid() % 100000}"
    try:
        _ip("netns", "add", name)
        _ip("netns", "del", name)
    except (subprocess.SubprocessError, OSError):
        return False
    return True


pytestmark = [pytest.mark.chaos, pytest.mark.skipif(not _netns_works(), reason="network namespaces need root and iproute2's ip")]


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _errors(infos: dict) -> int:
    return int(infos.get("_openenv_error", np.zeros(1, bool)).sum())


def test_a_link_cut_mid_run_costs_its_envs_one_truncated_step_within_the_step_timeout_and_the_server_is_used_again():
    tag = os.getpid() % 250
    ns, host_end, ns_end = f"og{os.getpid()}", f"ogh{os.getpid() % 100000}", f"ogn{os.getpid() % 100000}"
    here, there = f"10.231.{tag}.1", f"10.231.{tag}.2"
    with ExitStack() as stack:
        _ip("netns", "add", ns)
        stack.callback(subprocess.run, ["ip", "netns", "del", ns], capture_output=True, timeout=10)  # (its veth goes with it)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        _ip("link", "set", ns_end, "netns", ns)
        _ip("addr", "add", f"{here}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{there}/30", "dev", ns_end)
        _ip("netns", "exec", ns, "ip", "link", "set", ns_end, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")

        port = _free_port()
        command = [
            "ip",
            "netns",
            "exec",
            ns,
            *serve_command("CartPole-v1", host=there, port=port, max_sessions=16, env_kwargs=None, extra_args=()),
        ]
        far = ServerProcess(command, there, port)
        stack.callback(far.stop)
        near_port = _free_port()
        near = ServerProcess(
            serve_command("CartPole-v1", host="127.0.0.1", port=near_port, max_sessions=16, env_kwargs=None, extra_args=()),
            "127.0.0.1",
            near_port,
        )
        stack.callback(near.stop)
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            far.wait_healthy(client, time.monotonic() + 60)
            near.wait_healthy(client, time.monotonic() + 60)

        envs = stack.enter_context(
            openenv_gym.OpenEnvVectorEnv([far.url, near.url], 8, step_timeout=STEP_TIMEOUT, connect_timeout=2.0, grace_period=60)
        )
        envs.reset(seed=0)
        actions = np.zeros(8, dtype=np.int64)
        for _ in range(20):
            *_, infos = envs.step(actions)
            assert _errors(infos) == 0

        _ip("link", "set", host_end, "down")  # the cut: no reset, no close; packets go nowhere
        started = time.monotonic()
        *_, truncated, infos = envs.step(actions)
        took = time.monotonic() - started
        assert took < STEP_TIMEOUT + 3, f"the step took {took:.1f} s"
        assert truncated.sum() == 4 and _errors(infos) == 4  # the far server's envs, once each
        for _ in range(20):  # (placed on the near server: every step is whole again)
            *_, infos = envs.step(actions)
            assert _errors(infos) == 0

        _ip("link", "set", host_end, "up")  # the link comes back
        near.stop()  # and the near server goes: its envs move back to the far one
        lost = 0
        for _ in range(40):
            *_, infos = envs.step(actions)
            lost += _errors(infos)
        # Each env at most once, when the near server went (one whose next step was its reset loses nothing); none after.
        assert 0 < lost <= 8
        *_, infos = envs.step(actions)
        assert _errors(infos) == 0
        health = httpx.get(f"{far.url}/health", timeout=5, trust_env=False).json()
        assert health["active_sessions"] == 8
