"""An environment written for ``openenv``, served by OpenEnv's own server and by ``openenv-gym serve``.

``examples/guess_number_env.py`` is a plain OpenEnv ``Environment`` (guess a
secret number from higher/lower hints). This example serves it twice:

(a) with OpenEnv's stock server, ``create_fastapi_app`` under uvicorn, in a
    subprocess: JSON over ``/ws``, as every OpenEnv environment is served;
(b) with ``openenv-gym serve examples.guess_number_env:GuessNumberEnvironment
    --action-class ... --observation-class ...``: the same protocol, plus the
    binary fast path (msgpack) for clients that offer it.

and drives both with ``openenv_gym.OpenEnvEnv``: the Gymnasium spaces are
built from the server's ``/schema`` (the ``hint`` enum becomes a
``Discrete``, the bounded ``guess`` integer a ``Discrete`` with ``start``),
and a binary-search agent plays the same seeded episodes on each, over JSON
and over msgpack. Needs the ``openenv`` package (``pip install "openenv-gym[openenv]"``).

    python examples/openenv_environment.py [--episodes 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

import openenv_gym

ROOT = Path(__file__).resolve().parents[1]  # the repository root, from which `examples` imports
MODULE = "examples.guess_number_env"


@contextlib.contextmanager
def stock_openenv_server(startup_timeout: float = 60.0) -> Iterator[str]:
    """Run ``uvicorn --factory examples.guess_number_env:create_app`` on a free loopback port; yield its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "--factory", f"{MODULE}:create_app",
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
               "--timeout-graceful-shutdown", "2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + startup_timeout
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"the stock OpenEnv server exited with code {server.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{url}/health").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the stock OpenEnv server on port {port} did not start in {startup_timeout} s")
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def play(env: openenv_gym.OpenEnvEnv, seed: int) -> tuple[float, list[int]]:
    """One episode of binary search; returns ``(episode return, the guesses made)``."""
    # The action space is Discrete(HIGH - LOW + 1, start=LOW), from the `guess`
    # field's minimum and maximum; the observation's `hint` is an index into
    # the schema's enum (["start", "higher", "lower", "correct"]).
    low = int(env.action_space.start)
    high = low + int(env.action_space.n) - 1
    hints = env.schema["observation"]["properties"]["hint"]["enum"]
    obs, _ = env.reset(seed=seed)
    episode_return, guesses, done = 0.0, [], False
    while not done:
        guess = (low + high) // 2
        obs, reward, terminated, truncated, _ = env.step(guess)
        guesses.append(guess)
        episode_return += reward
        done = terminated or truncated
        if hints[obs["hint"]] == "higher":
            low = guess + 1
        elif hints[obs["hint"]] == "lower":
            high = guess - 1
    return episode_return, guesses


def drive(label: str, url: str, episodes: int, seed: int, offer_msgpack: bool = True) -> dict[str, object]:
    """Play ``episodes`` seeded episodes on ``url``; print and return what happened."""
    env = openenv_gym.OpenEnvEnv(url, offer_msgpack=offer_msgpack)
    print(f"{label}: {url}, codec {env.codec}")
    print(f"  observation space {env.observation_space}")
    print(f"  action space {env.action_space}")
    start = time.perf_counter()
    played = [play(env, seed + i) for i in range(episodes)]
    elapsed = time.perf_counter() - start
    codec = env.codec
    env.close()
    steps = sum(len(guesses) for _, guesses in played)
    mean_return = sum(r for r, _ in played) / episodes
    print(f"  {episodes} episodes, mean return {mean_return:.2f}, {steps / episodes:.1f} guesses per episode, "
          f"{steps / elapsed:,.0f} steps/s; guesses of the longest: {max((g for _, g in played), key=len)}")  # fmt: skip
    return {"codec": codec, "mean_return": mean_return, "trajectories": [g for _, g in played]}


def main(argv: list[str] | None = None) -> dict[str, dict[str, object]]:
    """Serve the env both ways and drive it; returns, per server and codec, ``{"codec", "mean_return", "trajectories"}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    results = {}
    with stock_openenv_server() as url:
        results["stock"] = drive("(a) stock OpenEnv server", url, args.episodes, args.seed)

    with openenv_gym.launch_local(
        f"{MODULE}:GuessNumberEnvironment",
        max_sessions=16,
        extra_args=["--action-class", f"{MODULE}:GuessAction", "--observation-class", f"{MODULE}:GuessObservation"],
    ) as (url,):
        results["openenv_gym"] = drive("(b) openenv-gym serve", url, args.episodes, args.seed)
        results["openenv_gym_json"] = drive(
            "(b) openenv-gym serve, msgpack not offered", url, args.episodes, args.seed, offer_msgpack=False
        )

    same = all(r["trajectories"] == results["stock"]["trajectories"] for r in results.values())
    print(f"same episodes on every server and codec: {same}")
    return results


if __name__ == "__main__":
    main()
