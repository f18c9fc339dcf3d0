"""Tool calls as Gymnasium actions: an LLM-style environment driven through openenv_gym.

``examples/tool_env.py`` is an OpenEnv environment whose action is a tool
call, shaped as OpenEnv's MCP ``CallToolAction`` (``tool_name`` and free-form
``arguments``), and whose observation holds a chat history and a free-form
``result``. From its ``/schema``, openenv_gym builds:

- the action space ``Dict(arguments=JsonText, tool_name=UnicodeText)``: the
  ``type`` tag is left to the server, and ``arguments`` is JSON text that is
  parsed before it is sent;
- the observation space ``Dict(error=UnicodeText, history=Sequence(Dict(...)),
  task=UnicodeText)``; the free-form ``result`` travels in ``info["result"]``.

A scripted agent (read, add, answer) plays a few episodes with ``OpenEnvEnv``
and then with ``OpenEnvVectorEnv`` over 4 sessions, on a local server.
Needs the ``openenv`` package (``pip install "openenv-gym[openenv]"``).

    python examples/tool_calls.py [--episodes 3] [--num-envs 4]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

import openenv_gym

ENV = "examples.tool_env:ToolEnvironment"


def agent(step: int, info: dict[str, Any]) -> dict[str, str]:
    """The next tool call: read the numbers, add them, answer the sum."""
    if step == 0:
        return {"tool_name": "read", "arguments": "{}"}
    if step == 1:
        return {"tool_name": "add", "arguments": json.dumps({"numbers": info["result"]})}
    return {"tool_name": "answer", "arguments": json.dumps({"value": info["result"]})}


def play(env: openenv_gym.OpenEnvEnv, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` scripted episodes."""
    total = 0.0
    for episode in range(episodes):
        _, info = env.reset(seed=seed + episode)
        for step in range(3):
            _, reward, terminated, truncated, info = env.step(agent(step, info))
            total += reward
            if terminated or truncated:
                break
    return total / episodes


def play_vector(envs: openenv_gym.OpenEnvVectorEnv, seed: int) -> list[float]:
    """One scripted episode in every env at once (a batch of Dict actions is a dict of batches)."""
    _, infos = envs.reset(seed=seed)
    returns = np.zeros(envs.num_envs)
    results: list[Any] = [None] * envs.num_envs
    for step in range(3):
        calls = [agent(step, {"result": r}) for r in results]
        batch = {key: tuple(call[key] for call in calls) for key in ("tool_name", "arguments")}
        _, rewards, _, _, infos = envs.step(batch)
        returns += rewards
        results = list(infos["result"])
    return returns.tolist()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with openenv_gym.launch_local(ENV, max_sessions=args.num_envs + 1) as (url,):
        with openenv_gym.OpenEnvEnv(url) as env:
            print("action space:", env.action_space)
            print("observation space:", env.observation_space)
            mean_return = play(env, args.episodes, args.seed)
        print(f"OpenEnvEnv: mean return {mean_return:.2f} over {args.episodes} episodes")
        with openenv_gym.OpenEnvVectorEnv(url, args.num_envs) as envs:
            vector_returns = play_vector(envs, args.seed)
        print(f"OpenEnvVectorEnv: returns {vector_returns}")
    return {"mean_return": mean_return, "vector_returns": vector_returns}


if __name__ == "__main__":
    main()
