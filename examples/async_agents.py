"""Async ``send``/``recv`` over a slow, variable-latency env: the shape an LLM-agent trainer needs.

Each step of ``openenv_gym/Sleep-v0`` takes a random 5..100 ms (a tool call,
a simulator, a judge model); the "policy" takes a few milliseconds per batch
(a forward pass). Stepping 32 envs in lockstep waits, every step, for the
slowest of them. With ``batch_size=8``, ``recv()`` returns as soon as any 8
envs are ready, the policy acts on those 8 while the other 24 keep stepping,
and ``send(actions, env_ids)`` hands the actions back to exactly those envs.

The example runs both for a few seconds against the same two local servers
and prints env steps per second.

    python examples/async_agents.py [--num-envs 32] [--batch-size 8] [--duration 3] [--policy-ms 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import openenv_gym

ENV_KWARGS = {"min_ms": 5, "max_ms": 100, "episode_length": 20}


def policy(obs: np.ndarray, policy_ms: float) -> np.ndarray:
    """A stand-in for a model: ``(B, 4)`` float32 observations -> ``(B,)`` int64 actions, in ``policy_ms`` ms."""
    time.sleep(policy_ms / 1000.0)
    return (obs[:, 0] > 0).astype(np.int64)


def lockstep(urls: list[str], num_envs: int, duration: float, policy_ms: float, seed: int) -> float:
    """``step()`` all envs together for ``duration`` seconds; returns env steps per second."""
    with openenv_gym.OpenEnvVectorEnv(urls, num_envs=num_envs) as envs:
        obs, _ = envs.reset(seed=seed)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < duration:
            obs, _, _, _, _ = envs.step(policy(obs, policy_ms))
            steps += num_envs
        return steps / (time.perf_counter() - start)


def asynchronous(urls: list[str], num_envs: int, batch_size: int, duration: float, policy_ms: float, seed: int) -> tuple[float, str]:
    """``send``/``recv`` in batches of ``batch_size`` for ``duration`` seconds; env steps per second, and a line on the envs' pace."""
    with openenv_gym.OpenEnvVectorEnv(urls, num_envs=num_envs, batch_size=batch_size) as envs:
        obs, _ = envs.reset(seed=seed)
        envs.send(policy(obs, policy_ms))  # every env gets a first action
        in_flight = num_envs  # and keeps one in flight: what recv() returns, send() gives back
        episode_return = np.zeros(num_envs)  # per env, indexed by env id
        steps_done = np.zeros(num_envs, dtype=np.int64)
        finished: list[float] = []
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < duration:
            obs, rewards, terminations, truncations, infos = envs.recv()  # the first batch_size ready envs
            env_ids = infos["env_id"]  # (batch_size,) int64: which envs these rows are
            episode_return[env_ids] += rewards
            steps_done[env_ids] += 1
            for env_id in env_ids[terminations | truncations]:
                finished.append(float(episode_return[env_id]))
                episode_return[env_id] = 0.0
            # Under NEXT_STEP autoreset, an env whose episode just ended is reset
            # by this send (its action is ignored) and returns its first observation.
            envs.send(policy(obs, policy_ms), env_ids)
            steps += len(env_ids)
        elapsed = time.perf_counter() - start
        while in_flight:  # collect what is still in flight before closing
            in_flight -= len(envs.recv()[4]["env_id"])
    pace = (
        f"  steps per env: min {steps_done.min()}, max {steps_done.max()} "
        f"(envs advance at their own pace); {len(finished)} episodes finished"
    )
    return steps / elapsed, pace


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run both modes; returns ``{"lockstep_steps_per_s", "async_steps_per_s", "speedup"}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per mode")
    parser.add_argument("--policy-ms", type=float, default=5.0, help="milliseconds per policy call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    with openenv_gym.launch_local("openenv_gym/Sleep-v0", servers=args.servers, env_kwargs=ENV_KWARGS) as urls:
        print(
            f"{args.num_envs} envs on {len(urls)} servers; each step sleeps "
            f"{ENV_KWARGS['min_ms']}..{ENV_KWARGS['max_ms']} ms, the policy {args.policy_ms} ms per call"
        )
        sync_rate = lockstep(urls, args.num_envs, args.duration, args.policy_ms, args.seed)
        print(f"lockstep step():              {sync_rate:7.0f} env steps/s")
        async_rate, pace = asynchronous(urls, args.num_envs, args.batch_size, args.duration, args.policy_ms, args.seed)
        print(f"send/recv, batch_size={args.batch_size:<3d}:    {async_rate:7.0f} env steps/s")
        print(pace)
    speedup = async_rate / sync_rate
    print(f"speedup {speedup:.2f}x")
    return {"lockstep_steps_per_s": sync_rate, "async_steps_per_s": async_rate, "speedup": speedup}


if __name__ == "__main__":
    main()
