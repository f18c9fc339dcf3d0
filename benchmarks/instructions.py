"""Instructions per step, counted: what each process of a lockstep step executes, free of the machine's noise.

Wall-clock and CPU times on a shared VM move by 30% from one hour to the
next; instruction counts do not. This counts the user-space instructions
(valgrind's cachegrind, ``I refs``) of, per step of CartPole-v1:

- **env**: 32 ``gym.make("CartPole-v1")`` envs stepped in a plain loop
  (numpy int64 actions, the next step resets an env that ended): the env
  work one server does per frame;
- **SyncVectorEnv**: gymnasium's, 64 envs, in-process;
- **pool client**: the process stepping ``OpenEnvVectorEnv`` over two local
  servers, 64 envs (32 each), lockstep ``step()``;
- **pool server**: one local server under the counter, 32 sessions stepped
  by a pool (a frame per step).

Each count is the difference of two runs (``--steps`` apart), so that
start-up work (imports, connecting, resets) cancels. Kernel work (system
calls, the network stack) is not counted: ``wire_floor.py`` reports CPU
time, which includes it.

The pool's critical path of a step is the client's count plus one server's
(the two servers run side by side): set against SyncVectorEnv's count, it
says how much of the gap in steps/s is work and how much is how fast each
process runs its instructions.

    python benchmarks/instructions.py [--steps 1000]

Needs ``valgrind`` on the PATH. Takes a few minutes (valgrind runs Python
about 50x slower).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time

import numpy as np

BASE_STEPS = 100  # the shorter run of each pair
STEP_TIMEOUT = 120.0  # seconds: a server under valgrind answers ~50x slower
_IREFS = re.compile(r"I\s+refs:\s+([\d,]+)")


_VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]


def _valgrind(*argv: str) -> list[str]:
    return [*_VALGRIND, sys.executable, *argv]


def _irefs(stderr: str) -> int:
    match = _IREFS.search(stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def _actions(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 2, n) for _ in range(100)]


def part_env(steps: int) -> None:
    """32 CartPoles in a plain loop, as one server steps its sessions."""
    import gymnasium as gym

    envs = [gym.make("CartPole-v1") for _ in range(32)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    actions = [list(a) for a in _actions(32)]
    ended = [False] * 32
    for t in range(steps):
        row = actions[t % 100]
        for i, env in enumerate(envs):
            if ended[i]:
                env.reset()
                ended[i] = False
                continue
            _, _, terminated, truncated, _ = env.step(row[i])
            ended[i] = terminated or truncated


def part_sync(steps: int) -> None:
    """gymnasium's SyncVectorEnv, 64 CartPoles."""
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 64)
    envs.reset(seed=0)
    actions = _actions(64)
    for t in range(steps):
        envs.step(actions[t % 100])
    envs.close()


def _step_pool(urls: list[str] | str, num_envs: int, steps: int) -> None:
    """Reset an ``OpenEnvVectorEnv`` of ``num_envs`` envs on ``urls`` and step it ``steps`` times."""
    from openenv_gym import OpenEnvVectorEnv

    envs = OpenEnvVectorEnv(urls, num_envs, step_timeout=STEP_TIMEOUT)
    envs.reset(seed=0)
    actions = _actions(num_envs)
    for t in range(steps):
        envs.step(actions[t % 100])
    envs.close()


def part_client(steps: int) -> None:
    """OpenEnvVectorEnv, 64 envs on two local servers (not counted: valgrind does not follow child processes).

    Under valgrind a step takes ~50x longer, which would end the client's
    direct waits (20 ms windows, ``openenv_gym._loop``) that a step at full
    speed takes: the windows are widened so that what is counted is the path
    a step takes natively.
    """
    from openenv_gym import _loop, launch_local

    _loop.DIRECT_WINDOW = _loop.DIRECT_WAIT = 60.0
    with launch_local("CartPole-v1", servers=2, max_sessions=64) as urls:
        _step_pool(urls, 64, steps)


def _count(part: str, steps: int) -> int:
    done = subprocess.run(_valgrind(__file__, "--part", part, "--steps", str(steps)), capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{part} failed:\n{done.stderr[-2000:]}")
    return _irefs(done.stderr)


def _count_server(steps: int) -> int:
    """One local server under valgrind, 32 sessions stepped ``steps`` times by a pool in this process."""
    import httpx

    from openenv_gym.launch import ServerProcess, _free_port, serve_command

    port = _free_port("127.0.0.1")
    # (--execution inline: under valgrind every env call looks slow, and "auto" would move them to threads)
    command = serve_command(
        "CartPole-v1", host="127.0.0.1", port=port, max_sessions=32, env_kwargs=None, extra_args=["--execution", "inline"]
    )
    server = ServerProcess([*_VALGRIND, *command], "127.0.0.1", port)
    try:
        with httpx.Client(timeout=5) as client:
            server.wait_healthy(client, time.monotonic() + 300)
        _step_pool(server.url, 32, steps)
        server.terminate()  # (a clean shutdown: valgrind writes its count as the process exits)
        server.proc.wait(300)
        return _irefs(server.log_tail())
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="the difference in steps between the two runs of each count")
    parser.add_argument("--part", choices=["env", "sync", "client"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part is not None:
        {"env": part_env, "sync": part_sync, "client": part_client}[args.part](args.steps)
        return
    if shutil.which("valgrind") is None:
        sys.exit("benchmarks/instructions.py needs valgrind on the PATH")
    from openenv_gym.bench.machine import describe_machine, machine_line

    counts: dict[str, float] = {}
    for name, part in (("env (32 CartPoles)", "env"), ("SyncVectorEnv (64)", "sync"), ("pool client (64)", "client")):
        counts[name] = (_count(part, BASE_STEPS + args.steps) - _count(part, BASE_STEPS)) / args.steps
        print(f"  {name}: {counts[name]:,.0f}", file=sys.stderr, flush=True)
    counts["pool server (32)"] = (_count_server(BASE_STEPS + args.steps) - _count_server(BASE_STEPS)) / args.steps
    env, sync, client, server = counts.values()
    print(f"CartPole-v1, instructions per step (valgrind I refs, user space), {args.steps} steps; {machine_line(describe_machine())}")
    print(f"{'process':<28} {'instructions/step':>18}")
    for name, count in counts.items():
        print(f"{name:<28} {count:>18,.0f}")
    print(f"{'server minus env':<28} {server - env:>18,.0f}")
    print(f"{'SyncVectorEnv minus 2 env':<28} {sync - 2 * env:>18,.0f}")
    critical = client + server
    print(f"pool critical path (client + one server): {critical:,.0f} = {critical / sync:.2f}x SyncVectorEnv's")


if __name__ == "__main__":
    main()
