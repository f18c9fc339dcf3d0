"""PPO in PyTorch (CPU) on remote CartPole-v1, trained through the session pool.

Two local openenv_gym servers host CartPole-v1; one ``OpenEnvVectorEnv`` of
``--num-envs`` sessions spreads over both. The agent is a small actor-critic
MLP trained with PPO: rollouts of ``--rollout-steps`` vector steps, GAE,
the clipped surrogate objective, a few epochs of minibatches. Training stops
when the mean return of the last 20 finished episodes reaches ``--target``
(or after ``--total-steps`` env steps); then 20 greedy episodes, one per env
of a fresh 20-env pool, give the final score.

The pool autoresets as Gymnasium does by default (``NEXT_STEP``): the step
after an episode ends is a reset step, whose action is ignored, whose reward
is 0 and whose observation is the next episode's first. Such transitions are
not transitions of the MDP; they are kept out of GAE and of the loss. The
observation *before* a reset step is the ended episode's final observation,
so a truncated episode is bootstrapped from its real final state.

Needs PyTorch (``pip install "openenv-gym[torch]"``).

    python examples/ppo_cartpole.py [--num-envs 16] [--total-steps 300000] [--seed 1] [--target 475]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from torch import nn

import openenv_gym


@dataclass
class Result:
    """What a run did: env steps taken, seconds of wall time, returns."""

    env_steps: int
    wall_time: float
    train_mean_return: float  # mean of the last 20 finished training episodes (nan if none)
    eval_mean_return: float  # mean of the greedy evaluation episodes
    updates: int


def layer(n_in: int, n_out: int, gain: float = np.sqrt(2)) -> nn.Linear:
    """A linear layer with orthogonal weights and zero bias (the usual PPO init)."""
    linear = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


class ActorCritic(nn.Module):
    """Separate policy and value MLPs (64-64, tanh) over a flat observation."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.actor = nn.Sequential(layer(obs_dim, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(), layer(hidden, n_actions, gain=0.01))
        self.critic = nn.Sequential(layer(obs_dim, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(), layer(hidden, 1, gain=1.0))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``(B, obs_dim)`` float32 -> ``(B,)`` state values."""
        return self.critic(obs).squeeze(-1)

    def policy(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        """``(B, obs_dim)`` float32 -> a categorical distribution over actions, batch ``(B,)``."""
        return torch.distributions.Categorical(logits=self.actor(obs))


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_value: np.ndarray,
    terminated: np.ndarray,
    ended: np.ndarray,
    gamma: float,
    lam: float,
) -> np.ndarray:
    """Generalized advantage estimates, ``(T, N)`` float32, for a NEXT_STEP rollout.

    Arrays are ``(T, N)``: row ``t`` is vector step ``t``, taken from the
    observation whose value is ``values[t]``. ``next_value`` ``(N,)`` is the
    value of the observation after the last step. ``terminated[t]`` and
    ``ended[t]`` (terminated or truncated) are step ``t``'s flags.

    The value of the state after step ``t`` is ``values[t + 1]``: under
    NEXT_STEP that is the ended episode's final observation when step ``t``
    ended it, so truncated episodes bootstrap correctly and terminated ones do
    not bootstrap at all. Advantages do not flow back across an episode end.
    Rows of reset steps come out meaningless and must be masked by the caller.
    """
    steps = rewards.shape[0]
    advantages = np.zeros_like(rewards, dtype=np.float32)
    running = np.zeros(rewards.shape[1], dtype=np.float32)
    for t in reversed(range(steps)):
        following = next_value if t == steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * following * (1.0 - terminated[t]) - values[t]
        running = delta + gamma * lam * (1.0 - ended[t]) * running
        advantages[t] = running
    return advantages


def train(args: argparse.Namespace, urls: list[str]) -> tuple[ActorCritic, int, float, int]:
    """Train until the target or the step budget; returns ``(agent, env_steps, train_mean_return, updates)``."""
    envs = openenv_gym.OpenEnvVectorEnv(urls, num_envs=args.num_envs)
    envs = RecordEpisodeStatistics(envs, buffer_length=20)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = ActorCritic(obs_dim, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)

    n, T = args.num_envs, args.rollout_steps
    obs_buf = np.zeros((T, n, obs_dim), dtype=np.float32)
    actions_buf = np.zeros((T, n), dtype=np.int64)
    logp_buf = np.zeros((T, n), dtype=np.float32)
    values_buf = np.zeros((T, n), dtype=np.float32)
    rewards_buf = np.zeros((T, n), dtype=np.float32)
    terminated_buf = np.zeros((T, n), dtype=np.float32)
    ended_buf = np.zeros((T, n), dtype=np.float32)
    valid_buf = np.zeros((T, n), dtype=bool)  # False: a reset step (NEXT_STEP), not a transition

    obs, _ = envs.reset(seed=args.seed)
    resetting = np.zeros(n, dtype=bool)  # this env's next step is a reset step
    num_updates = max(1, args.total_steps // (n * T))
    env_steps, update = 0, 0
    train_mean = float("nan")

    for update in range(1, num_updates + 1):
        for group in optimizer.param_groups:  # linear learning-rate annealing over the budget
            group["lr"] = args.lr * (1.0 - (update - 1) / num_updates)

        # ---- rollout
        for t in range(T):
            obs_buf[t] = obs
            valid_buf[t] = ~resetting
            with torch.no_grad():
                obs_t = torch.from_numpy(obs)
                dist = agent.policy(obs_t)
                action = dist.sample()
                values_buf[t] = agent.value(obs_t).numpy()
                logp_buf[t] = dist.log_prob(action).numpy()
            actions_buf[t] = action.numpy()
            obs, reward, terminated, truncated, _ = envs.step(actions_buf[t])
            rewards_buf[t] = reward
            terminated_buf[t] = terminated
            ended_buf[t] = terminated | truncated
            resetting = terminated | truncated
        env_steps += n * T
        if len(envs.return_queue) > 0:
            train_mean = float(np.mean(envs.return_queue))

        # ---- advantages and returns
        with torch.no_grad():
            next_value = agent.value(torch.from_numpy(obs)).numpy()
        advantages = gae(rewards_buf, values_buf, next_value, terminated_buf, ended_buf, args.gamma, args.gae_lambda)
        returns = advantages + values_buf

        # ---- PPO update over the valid transitions only
        keep = valid_buf.reshape(-1)
        b_obs = torch.from_numpy(obs_buf.reshape(-1, obs_dim)[keep])
        b_actions = torch.from_numpy(actions_buf.reshape(-1)[keep])
        b_logp = torch.from_numpy(logp_buf.reshape(-1)[keep])
        b_adv = torch.from_numpy(advantages.reshape(-1)[keep])
        b_returns = torch.from_numpy(returns.reshape(-1)[keep])
        size = b_obs.shape[0]
        minibatch = max(2, size // args.minibatches)
        for _epoch in range(args.epochs):
            order = torch.randperm(size)
            for start in range(0, size - minibatch + 1, minibatch):
                idx = order[start : start + minibatch]
                dist = agent.policy(b_obs[idx])
                ratio = torch.exp(dist.log_prob(b_actions[idx]) - b_logp[idx])
                adv = b_adv[idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - args.clip, 1 + args.clip) * adv).mean()
                value_loss = 0.5 * (agent.value(b_obs[idx]) - b_returns[idx]).pow(2).mean()
                entropy = dist.entropy().mean()
                loss = policy_loss + args.vf_coef * value_loss - args.ent_coef * entropy
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        if update % args.log_every == 0 or update == num_updates:
            print(f"update {update:4d}  env steps {env_steps:7d}  mean return (last 20 episodes) {train_mean:6.1f}")
        if len(envs.return_queue) == envs.return_queue.maxlen and train_mean >= args.target:
            print(f"target {args.target} reached after {env_steps} env steps")
            break

    envs.close()
    return agent, env_steps, train_mean, update


def evaluate(agent: ActorCritic, urls: list[str], episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes, one per env of a fresh pool, ``(episodes,)`` float64."""
    envs = openenv_gym.OpenEnvVectorEnv(urls, num_envs=episodes)
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    while running.any():
        with torch.no_grad():
            action = agent.actor(torch.from_numpy(obs)).argmax(-1).numpy()
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns += np.where(running, reward, 0.0)
        running &= ~(terminated | truncated)
    envs.close()
    return returns


def main(argv: list[str] | None = None) -> Result:
    """Train, evaluate, print and return a :class:`Result`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--total-steps", type=int, default=300_000, help="env step budget")
    parser.add_argument("--target", type=float, default=475.0, help="stop at this mean return of the last 20 episodes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-episodes", type=int, default=20)
    parser.add_argument("--rollout-steps", type=int, default=64, help="vector steps per update")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--ent-coef", type=float, default=0.0)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--max-grad-norm", type=float, default=0.5)
    parser.add_argument("--log-every", type=int, default=10, help="updates between progress lines")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # the servers need the other cores
    start = time.perf_counter()
    with openenv_gym.launch_local("CartPole-v1", servers=args.servers) as urls:
        agent, env_steps, train_mean, updates = train(args, urls)
        train_time = time.perf_counter() - start
        eval_returns = evaluate(agent, urls, args.eval_episodes, seed=args.seed + 10_000)
        eval_time = time.perf_counter() - start - train_time
    result = Result(env_steps, train_time, train_mean, float(eval_returns.mean()), updates)
    print(
        f"trained with {args.num_envs} envs on {args.servers} servers: {env_steps} env steps, "
        f"{updates} updates, {train_time:.1f} s wall time (incl. server start)"
    )
    print(f"greedy evaluation: mean return {result.eval_mean_return:.1f} over {args.eval_episodes} episodes ({eval_time:.1f} s)")
    return result


if __name__ == "__main__":
    main()
