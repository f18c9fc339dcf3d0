"""Recovery after a server is killed: what the trainer sees and how long it takes.

Four local servers host CartPole-v1; a pool of 32 envs steps with random
actions; one server gets SIGKILL mid-run and is restarted on its port later.
Counted: actions sent and rows returned (equal by construction: a lockstep
step returns one row per env, truncations included; what it shows is that no
step raised or hung), truncations reported with ``openenv_error``, the time from the
kill until every env steps without error again, and the time from the restart
until the server hosts sessions again.

    python benchmarks/fault_recovery.py [--envs 32] [--servers 4] [--step-timeout 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time

import httpx
import numpy as np

from openenv_gym import OpenEnvVectorEnv
from openenv_gym.launch import ServerProcess, serve_command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int, max_sessions: int) -> ServerProcess:
    command = serve_command("CartPole-v1", host="127.0.0.1", port=port, max_sessions=max_sessions, env_kwargs=None, extra_args=())
    server = ServerProcess(command, "127.0.0.1", port)
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        server.wait_healthy(client, time.monotonic() + 60)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--step-timeout", type=float, default=2.0)
    args = parser.parse_args()

    ports = [_free_port() for _ in range(args.servers)]
    servers = [_start(p, args.envs) for p in ports]
    victim = 1
    try:
        rng = np.random.default_rng(0)
        sent = received = truncations = 0
        with OpenEnvVectorEnv([s.url for s in servers], args.envs, step_timeout=args.step_timeout) as envs:
            envs.reset(seed=0)
            core = envs._core

            def step() -> dict:
                nonlocal sent, received, truncations
                _, rewards, _, _, infos = envs.step(rng.integers(0, 2, size=args.envs))
                sent += args.envs
                received += len(rewards)
                if "openenv_error" in infos:
                    truncations += int(infos["_openenv_error"].sum())
                return infos

            for _ in range(50):
                step()
            os.kill(servers[victim].proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            # Recovered: the first of 20 steps in a row in which no env reported an error.
            streak, clean_from = 0, None
            for _ in range(1000):
                infos = step()
                if "openenv_error" in infos:
                    streak, clean_from = 0, None
                    continue
                if streak == 0:
                    clean_from = time.monotonic()
                streak += 1
                if streak == 20:
                    break
            recovered = (clean_from or time.monotonic()) - killed
            placement_after_kill = core.sessions_per_link()
            servers[victim].stop()
            servers[victim] = _start(ports[victim], args.envs)
            restarted = time.monotonic()
            back = None
            for _ in range(2000):
                step()
                if core.sessions_per_link()[victim] > 0:
                    back = time.monotonic() - restarted
                    break
            for _ in range(50):
                step()
            placement_end = core.sessions_per_link()
        print(f"{args.envs} envs on {args.servers} servers, SIGKILL of one server mid-run, restart on its port:")
        print(f"- actions sent {sent}, rows returned {received} (truncations included; no step raised or hung)")
        print(f"- truncations with openenv_error: {truncations}")
        print(f"- every env stepping without error again {recovered:.2f} s after the kill; placement {placement_after_kill}")
        print(
            f"- restarted server hosts sessions again {back:.2f} s after its restart; placement {placement_end}"
            if back is not None
            else "- restarted server got no sessions within the run"
        )
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
