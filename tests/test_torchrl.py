"""TorchRL's GymWrapper over the pool and over OpenEnvEnv returns what it returns over local envs.

TorchRL (0.14) takes a Gymnasium vector env as one batched env. It accepts the
``SameStep`` and ``Disabled`` autoreset modes and refuses ``NextStep``, the
pool's default; in ``Disabled`` it resets ended envs itself with a
``reset_mask``. Each rollout below is compared, key by key, with the same
rollout of ``SyncVectorEnv`` (or ``gymnasium.make``) for the same seed and
actions.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
from torchrl.envs import GymWrapper  # noqa: E402
from torchrl.envs.utils import check_env_specs  # noqa: E402

import tests.servers.gym_envs  # noqa: E402,F401  (registers the test envs locally)
from openenv_gym import OpenEnvEnv, OpenEnvVectorEnv  # noqa: E402

logging.getLogger("torchrl").setLevel(logging.WARNING)

STEPS = 200


def playing(actions: Any) -> Callable[[Any], Any]:
    """A TorchRL policy that plays ``actions`` (one one-hot row per step), whatever it observes."""
    rows = iter(actions)

    def policy(td: Any) -> Any:
        td.set("action", next(rows).clone())
        return td

    return policy


def one_hot_actions(num_envs: int | None, seed: int = 1) -> Any:
    """``STEPS`` CartPole actions, one-hot, shape ``(STEPS, num_envs, 2)`` (``(STEPS, 2)`` for one env)."""
    shape = (STEPS,) if num_envs is None else (STEPS, num_envs)
    return torch.nn.functional.one_hot(torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(seed)), 2)


def rollout(env: Any, actions: Any, seed: int = 3) -> Any:
    env.set_seed(seed)
    return env.rollout(STEPS, playing(actions), break_when_any_done=False)


def assert_same_rollout(remote: Any, local: Any) -> None:
    assert remote.batch_size == local.batch_size
    keys = set(remote.keys(True, True))
    assert keys == set(local.keys(True, True))
    for key in keys:
        a, b = remote.get(key), local.get(key)
        assert a.dtype == b.dtype and torch.equal(a, b), f"{key} differs"


def rolls_out_alike(remote: Any, local: Any, actions: Any, *, infos: bool = False, check_specs: bool = False) -> Any:
    """The remote env's rollout, once it equals the local env's (and TorchRL's spec check passed); both envs are closed."""
    try:
        if infos:
            for env in (remote, local):
                env.auto_register_info_dict()
        out = rollout(remote, actions)
        assert_same_rollout(out, rollout(local, actions))
        if check_specs:  # (after: in SameStep, a reset after its random steps can be stale, a TorchRL bug; see the README)
            check_env_specs(remote, seed=0)
        return out
    finally:
        remote.close()
        local.close()


def sync(env_id: str, num_envs: int, mode: str) -> Any:
    return GymWrapper(gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs, autoreset_mode=mode))


@pytest.mark.parametrize("mode", ["SameStep", "Disabled"])
def test_a_pool_rollout_equals_sync_vector_env_s(fast_cartpole_urls, mode):
    remote = GymWrapper(OpenEnvVectorEnv(fast_cartpole_urls, 4, autoreset_mode=mode))
    out = rolls_out_alike(remote, sync("CartPole-v1", 4, mode), one_hot_actions(4), check_specs=True)
    assert out.batch_size == (4, STEPS)
    assert int(out["next", "done"].sum()) >= 10  # episodes ended, and the envs went on


def test_a_pool_on_a_stock_server_resets_by_mask_as_sync_vector_env_does(stock_cartpole_url):
    """``Disabled``: TorchRL resets ended envs with ``options={"reset_mask": ...}``, one reset request per env here."""
    remote = GymWrapper(OpenEnvVectorEnv(stock_cartpole_url, 3, autoreset_mode="Disabled"))
    out = rolls_out_alike(remote, sync("CartPole-v1", 3, "Disabled"), one_hot_actions(3, seed=2))
    assert int(out["next", "done"].sum()) >= 5


def test_infos_reach_the_tensordict_as_they_do_from_local_envs(fast_info_cartpole_urls):
    """InfoCartPole's step infos (int, float, bool, an array, a key on odd steps only) under ``Disabled``."""
    remote = GymWrapper(OpenEnvVectorEnv(fast_info_cartpole_urls, 4, autoreset_mode="Disabled"))
    out = rolls_out_alike(remote, sync("InfoCartPole-v1", 4, "Disabled"), one_hot_actions(4, seed=4), infos=True)
    assert {"steps", "speed", "left", "obs", "odd"} <= set(out["next"].keys())


def test_one_remote_env_rolls_out_as_the_local_env(fast_cartpole_urls):
    remote = GymWrapper(OpenEnvEnv(fast_cartpole_urls[0]))
    out = rolls_out_alike(remote, GymWrapper(gym.make("CartPole-v1")), one_hot_actions(None, seed=5), check_specs=True)
    assert int(out["next", "done"].sum()) >= 2


def test_torchrl_refuses_the_pool_s_default_mode_as_it_refuses_sync_vector_env_s(fast_cartpole_urls):
    """A TorchRL rule, documented in the README: the pool must be made in ``SameStep`` or ``Disabled``."""
    with OpenEnvVectorEnv(fast_cartpole_urls, 2) as envs:
        with pytest.raises(RuntimeError, match="SAME_STEP or DISABLED"):
            GymWrapper(envs)
