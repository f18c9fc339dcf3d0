"""Quickstart: gymnasium.make on a remote environment, one episode.

Starts a local openenv_gym server hosting CartPole-v1 (no Docker, no network),
plays one episode through `gymnasium.make`, and prints what happened.

    python examples/quickstart.py [--env CartPole-v1] [--seed 0]
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import openenv_gym


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium env id to serve")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    with openenv_gym.launch_local(args.env) as (url,):
        env = gym.make("openenv_gym/Remote-v0", base_url=url)
        print(f"server {url}, codec {env.unwrapped.codec}")
        print(f"observation space {env.observation_space}")
        print(f"action space {env.action_space}")
        env.action_space.seed(args.seed)
        obs, info = env.reset(seed=args.seed)
        episode_return, steps, done = 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            episode_return += float(reward)
            steps += 1
            done = terminated or truncated
        env.close()
    print(f"episode: {steps} steps, return {episode_return:.1f}, {'truncated' if truncated else 'terminated'}")
    return episode_return


if __name__ == "__main__":
    main()
