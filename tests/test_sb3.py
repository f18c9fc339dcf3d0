"""SB3VecEnv: a pool as a Stable-Baselines3 VecEnv returns what SB3's DummyVecEnv returns."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

import openenv_gym  # noqa: E402
import tests.servers.gym_envs  # noqa: E402,F401  (registers the test envs locally)
from openenv_gym import OpenEnvVectorEnv  # noqa: E402
from openenv_gym.sb3 import SB3VecEnv, list_infos  # noqa: E402


def same(a: Any, b: Any, where: str) -> None:
    """Equal values; arrays equal in dtype and shape too; scalars of the same kind (np.int64 for int)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: {sorted(a)} != {sorted(b)}"
        for key in a:
            same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, np.ndarray) and a.dtype != object:
        assert isinstance(b, np.ndarray), f"{where}: {b!r} is not an array"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{where}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        assert a.tobytes() == b.tobytes(), f"{where}: {a} != {b}"
    elif a is None or b is None:
        assert a is None and b is None, f"{where}: {a!r} != {b!r}"
    else:
        assert np.asarray(a).dtype.kind == np.asarray(b).dtype.kind and a == b, f"{where}: {a!r} != {b!r}"


def step_both(remote: SB3VecEnv, local: DummyVecEnv, steps: int, seed: int) -> int:
    """Step both with the same random actions; every return and reset info must match. Returns episodes ended."""
    rng = np.random.default_rng(seed)
    ended = 0
    for t in range(steps):
        actions = rng.integers(0, 2, remote.num_envs)
        obs, rewards, dones, infos = remote.step(actions)
        local_obs, local_rewards, local_dones, local_infos = local.step(actions)
        same(obs, local_obs, f"step {t} obs")
        same(rewards, local_rewards, f"step {t} rewards")
        same(dones, local_dones, f"step {t} dones")
        assert len(infos) == len(local_infos) == remote.num_envs
        for i, (info, local_info) in enumerate(zip(infos, local_infos)):
            same(info, local_info, f"step {t} infos[{i}]")
        for i, (info, local_info) in enumerate(zip(remote.reset_infos, local.reset_infos)):
            same(info, local_info, f"step {t} reset_infos[{i}]")
        ended += int(dones.sum())
    return ended


def test_the_pool_returns_what_dummy_vec_env_returns(fast_info_cartpole_urls):
    """Observations, float32 rewards, dones, per-env infos with terminal_observation and
    TimeLimit.truncated, and reset infos: InfoCartPole puts counters, floats, bools and arrays there."""
    remote = SB3VecEnv(OpenEnvVectorEnv(fast_info_cartpole_urls, 4, autoreset_mode="SameStep"))
    local = DummyVecEnv([lambda: gym.make("InfoCartPole-v1") for _ in range(4)])
    try:
        assert remote.seed(7) == local.seed(7) == [7, 8, 9, 10]
        same(remote.reset(), local.reset(), "reset")
        for i in range(4):
            same(remote.reset_infos[i], local.reset_infos[i], f"reset_infos[{i}]")
        ended = step_both(remote, local, 300, seed=0)
        assert ended >= 20
    finally:
        remote.close()
        local.close()


def test_time_limits_are_told_apart_from_terminations(fast_cartpole_urls):
    """A time limit, client side, on the step where env 0 falls (terminated and truncated: not
    ``TimeLimit.truncated``) while env 1 balances (truncated only: ``TimeLimit.truncated``)."""
    probe = gym.make("CartPole-v1")
    probe.reset(seed=3)
    limit = 1
    while not probe.step(0)[2]:
        limit += 1
    openenv_gym.register_remote(f"openenv_sb3_test/CartPole-{limit}-v1", fast_cartpole_urls, max_episode_steps=limit)
    remote = SB3VecEnv(gym.make_vec(f"openenv_sb3_test/CartPole-{limit}-v1", num_envs=2, autoreset_mode="SameStep"))
    local = DummyVecEnv([lambda: gym.make("CartPole-v1", max_episode_steps=limit) for _ in range(2)])
    try:
        remote.seed(3)
        local.seed(3)
        same(remote.reset(), local.reset(), "reset")
        for t in range(limit):
            actions = np.array([0, t % 2])
            obs, _, dones, infos = remote.step(actions)
            local_obs, _, _, local_infos = local.step(actions)
            same(obs, local_obs, f"step {t} obs")
            for i in range(2):
                same(infos[i], local_infos[i], f"step {t} infos[{i}]")
        assert dones.all()
        assert [info["TimeLimit.truncated"] for info in infos] == [False, True]
    finally:
        remote.close()
        local.close()


def test_over_a_stock_openenv_server(stock_cartpole_url):
    remote = SB3VecEnv(OpenEnvVectorEnv(stock_cartpole_url, 3, autoreset_mode="SameStep", truncated_key="truncated"))
    local = DummyVecEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
    try:
        remote.seed(11)
        local.seed(11)
        same(remote.reset(), local.reset(), "reset")
        assert step_both(remote, local, 120, seed=1) >= 5
    finally:
        remote.close()
        local.close()


def test_seeds_and_options_per_env_are_used_once():
    """LevelCartPole tells its reset option in its reset info; envs with other options reset apart."""
    with openenv_gym.launch_local("tests.servers.gym_envs:LevelCartPole-v1") as urls:
        remote = SB3VecEnv(OpenEnvVectorEnv(urls, 3, autoreset_mode="SameStep"))
        local = DummyVecEnv([lambda: gym.make("LevelCartPole-v1") for _ in range(3)])
        try:
            for envs in (remote, local):
                envs.seed(5)
                envs.set_options([{"level": 1}, {}, {"level": 2}])
            first = remote.reset()
            same(first, local.reset(), "reset with options")
            assert [info["level"] for info in remote.reset_infos] == [1, -1, 2]
            for i in range(3):
                same(remote.reset_infos[i], local.reset_infos[i], f"reset_infos[{i}]")
            # Seeds and options were for that reset only.
            second = remote.reset()
            assert [info["level"] for info in remote.reset_infos] == [-1, -1, -1]
            same(second, local.reset(), "second reset")  # both envs' generators go on
            assert not np.array_equal(second, first)  # and were not seeded again
        finally:
            remote.close()
            local.close()


def test_a_pool_that_does_not_reset_in_the_same_step_is_refused(fast_cartpole_urls):
    pool = OpenEnvVectorEnv(fast_cartpole_urls, 2)  # NEXT_STEP, Gymnasium's default
    try:
        with pytest.raises(ValueError, match="SAME_STEP"):
            SB3VecEnv(pool)
    finally:
        pool.close()
    with pytest.raises(TypeError, match="VectorEnv"):
        SB3VecEnv(gym.make("CartPole-v1"))  # type: ignore[arg-type]


def test_attributes_are_those_a_remote_pool_has(fast_cartpole_urls):
    envs = SB3VecEnv(OpenEnvVectorEnv(fast_cartpole_urls, 2, autoreset_mode="SameStep"))
    try:
        assert envs.render_mode is None and envs.get_attr("render_mode", indices=1) == [None]
        assert envs.env_is_wrapped(gym.Wrapper) == [False, False]
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        assert not envs.has_attr("gravity")  # sub-envs live on the servers
        with pytest.raises(AttributeError):
            envs.env_method("close")
    finally:
        envs.close()


def test_list_infos_follows_the_masks():
    info = {
        "a": np.array([1, 0, 3]),
        "_a": np.array([True, False, True]),
        "inner": {"b": np.array([0.5, 0.0, 0.0]), "_b": np.array([True, False, False])},
        "_inner": np.array([True, False, False]),
        "_own": np.array(["x", "y", "z"], dtype=object),
    }
    assert list_infos(info, 3) == [
        {"a": 1, "inner": {"b": 0.5}, "_own": "x"},
        {"_own": "y"},
        {"a": 3, "_own": "z"},
    ]
    assert list_infos(info, 3, [2, 0]) == [{"a": 3, "_own": "z"}, {"a": 1, "inner": {"b": 0.5}, "_own": "x"}]


def test_the_benchmark_steps_every_setup(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("sb3_vec_envs", Path(__file__).parent.parent / "benchmarks" / "sb3_vec_envs.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    medians = bench.main(["--num-envs", "2", "--seconds", "0.2", "--trials", "1", "--json", str(tmp_path / "out.json")])
    assert set(medians) == {"SB3VecEnv(OpenEnvVectorEnv)", "DummyVecEnv of OpenEnvEnvs", "DummyVecEnv, local CartPole"}
    assert all(value > 0 for value in medians.values())
    assert (tmp_path / "out.json").read_text().startswith("{")


def test_infos_are_the_envs_own_not_typed_by_another_envs_value():
    """FrozenLake's info: ``prob`` 1 (an int) at reset, 0.333 (a float) on a slippery step. A batched info
    types the key by its first env's value (0.333 read as 0): the pool hands the envs' own dicts on."""
    with openenv_gym.launch_local("FrozenLake-v1") as urls:
        remote = SB3VecEnv(OpenEnvVectorEnv(urls, 2, autoreset_mode="SameStep"))
        local = DummyVecEnv([lambda: gym.make("FrozenLake-v1") for _ in range(2)])
        try:
            remote.seed(0)
            local.seed(0)
            same(remote.reset(), local.reset(), "reset")
            assert remote.reset_infos == local.reset_infos and type(remote.reset_infos[0]["prob"]) is int
            rng = np.random.default_rng(0)
            ended = 0
            for t in range(300):
                actions = rng.integers(0, 4, 2)
                obs, rewards, dones, infos = remote.step(actions)
                local_obs, local_rewards, local_dones, local_infos = local.step(actions)
                same(obs, local_obs, f"step {t} obs")
                for info, local_info in zip(infos, local_infos):
                    terminal = info.pop("terminal_observation", None)
                    assert terminal == local_info.pop("terminal_observation", None), t
                    assert info == local_info and [type(v) for v in info.values()] == [type(v) for v in local_info.values()], t
                assert remote.reset_infos == local.reset_infos, t
                ended += int(dones.sum())
            assert ended >= 10
        finally:
            remote.close()
            local.close()


def test_set_attr_gives_every_env_the_value_as_sb3_does():
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    envs = SB3VecEnv(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=AutoresetMode.SAME_STEP))
    try:
        envs.set_attr("tags", [7, 8])  # one list for every env, not one item each
        assert envs.get_attr("tags") == [[7, 8], [7, 8]]
        envs.set_attr("tags", "x", indices=[1])
        assert envs.get_attr("tags") == [[7, 8], "x"]
    finally:
        envs.close()
