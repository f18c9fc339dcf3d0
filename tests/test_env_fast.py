"""OpenEnvEnv against openenv_gym servers: the msgpack fast path and exact spaces."""

from __future__ import annotations

import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from openenv_gym import OpenEnvEnv, OpenEnvVectorEnv, SessionTimeout, launch_local


def test_env_negotiates_msgpack_and_builds_exact_spaces(fast_cartpole_urls):
    local = gym.make("CartPole-v1")
    with OpenEnvEnv(fast_cartpole_urls[0]) as env:
        assert env.codec == "msgpack"
        assert env.observation_space == local.observation_space
        assert env.action_space == local.action_space


def test_remote_episode_equals_local_episode_bit_for_bit(fast_cartpole_urls):
    local = gym.make("CartPole-v1")
    with OpenEnvEnv(fast_cartpole_urls[0]) as env:
        obs, info = env.reset(seed=11)
        want, _ = local.reset(seed=11)
        assert obs.tobytes() == want.tobytes() and info == {}
        rng = np.random.default_rng(11)
        for _ in range(500):
            action = int(rng.integers(0, 2))
            got, expected = env.step(action), local.step(action)
            assert got[0].dtype == expected[0].dtype and got[0].tobytes() == expected[0].tobytes()
            assert got[1:] == expected[1:]
            if expected[2] or expected[3]:
                break
        assert expected[2] or expected[3]


@pytest.mark.parametrize("offer_msgpack", [True, False])
def test_a_bool_seed_seeds_as_gymnasium_seeds_it(fast_cartpole_urls, offer_msgpack):
    with OpenEnvEnv(fast_cartpole_urls[0], offer_msgpack=offer_msgpack) as env:
        obs, _ = env.reset(seed=True)
    want, _ = gym.make("CartPole-v1").reset(seed=True)  # (as seed=1)
    assert obs.tobytes() == want.tobytes()


def test_time_limit_truncation_arrives_as_truncated(fast_cartpole_urls):
    with OpenEnvEnv(fast_cartpole_urls[0]) as env:
        obs, _ = env.reset(seed=1)
        for _ in range(500):
            obs, _, terminated, truncated, _ = env.step(int(obs[2] + obs[3] > 0))
            if terminated or truncated:
                break
        assert truncated and not terminated


def test_observations_are_fresh_writable_arrays(fast_cartpole_urls):
    with OpenEnvEnv(fast_cartpole_urls[0]) as env:
        first, _ = env.reset(seed=0)
        second = env.step(0)[0]
        assert first.flags.writeable and not np.shares_memory(first, second)


def test_check_env_passes_on_the_fast_path(fast_cartpole_urls):
    env = gym.make("openenv_gym/Remote-v0", base_url=fast_cartpole_urls[0])
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_json_fallback_is_forced_with_offer_msgpack_false(fast_cartpole_urls):
    with OpenEnvEnv(fast_cartpole_urls[0], offer_msgpack=False) as env:
        assert env.codec == "json"
        obs, _ = env.reset(seed=2)
        assert obs.dtype == np.float32 and obs.shape == (4,)


def test_a_stalled_step_raises_within_the_step_timeout():
    # The session is dropped at once, without waiting for a closing handshake from the stalled
    # server (inline: its event loop is stuck in the env's step, 3 s).
    extra = ["--execution", "inline"]
    with launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 3.0}, extra_args=extra) as (url,):
        with OpenEnvEnv(url, step_timeout=0.5) as env:
            assert env.codec == "msgpack"
            env.reset(seed=0)
            started = time.monotonic()
            with pytest.raises(SessionTimeout):
                env.step(0)
            assert time.monotonic() - started < 0.5 + 1.0


def test_a_dict_action_with_float64_leaves_is_taken():
    with launch_local("tests.servers.gym_envs:Nested-v0") as (url,):
        with OpenEnvEnv(url) as env:
            env.reset(seed=0)
            obs, reward, *_ = env.step({"move": np.array([0.5, -0.25]), "fire": 1})  # move: float64
            assert reward == 1.0 and obs in env.observation_space
            with pytest.raises(ValueError, match="not in the action space"):
                env.step({"move": np.array([0.5, -1.25]), "fire": 1})


@pytest.mark.parametrize("make", ["env", "vector"])
def test_a_live_env_cannot_be_copied_or_pickled_and_says_so(fast_cartpole_urls, make):
    import copy
    import pickle

    if make == "env":
        env = OpenEnvEnv(fast_cartpole_urls[0])
    else:
        env = OpenEnvVectorEnv(fast_cartpole_urls[0], 2)
    try:
        env.reset(seed=0)
        for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be copied or pickled"):
                attempt(env)
        assert env.reset(seed=0)[0] is not None  # the env goes on
    finally:
        env.close()


def test_an_observation_value_the_dtype_cannot_hold_is_an_error_not_a_wrapped_number():
    from openenv_gym.spaces import SpaceMappingError

    with launch_local("tests.servers.gym_envs:OutOfRange-v0", max_sessions=4) as (url,):
        for offer_msgpack in (True, False):
            with OpenEnvEnv(url, offer_msgpack=offer_msgpack) as env:
                assert env.reset(seed=0)[0].tolist() == [1, 2]
                with pytest.raises(SpaceMappingError, match="uint8"):
                    env.step(0)  # 300 is no uint8 (numpy would make it 44)
        with OpenEnvVectorEnv(url, 2) as envs:
            envs.reset(seed=0)
            obs, _, _, truncations, infos = envs.step(np.zeros(2, dtype=np.int64))
            assert truncations.all() and "uint8" in infos["openenv_error"]["message"][0]
            assert obs.tolist() == [[1, 2], [1, 2]]  # the last observation that fit


@pytest.mark.parametrize("stock", [False, True], ids=["project-server", "stock-server"])
def test_a_float_beyond_float32_is_read_as_infinity_without_a_warning(stock):
    # float64 1e300 in a float32 Box: inf, the space's own choice of dtype. numpy warns "overflow
    # encountered in cast" there; where warnings are errors, that warning failed the step.
    with launch_local("tests.servers.gym_envs:HugeFloat-v0", stock=stock, max_sessions=4) as (url,):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for offer_msgpack in (True, False):
                with OpenEnvEnv(url, offer_msgpack=offer_msgpack) as env:
                    env.reset(seed=0)
                    obs = env.step(0)[0]
                    assert obs.dtype == np.float32 and obs.tolist() == [np.inf, -np.inf]
                    assert env.observation_space.contains(obs)
            with OpenEnvVectorEnv(url, 2) as envs:
                envs.reset(seed=0)
                obs, _, _, truncations, infos = envs.step(np.zeros(2, dtype=np.int64))
                assert obs.tolist() == [[np.inf, -np.inf]] * 2 and not truncations.any(), infos


def test_the_spec_says_the_time_limit_of_the_servers_env():
    # A local Pendulum's spec says 200 steps, and tools read it (TimeAwareObservation refuses an env
    # whose spec has none). The server truncates at 200: the remote env's spec says so too.
    with launch_local("Pendulum-v1") as (url,):
        local = gym.make("Pendulum-v1")
        with gym.make("openenv_gym/Remote-v0", base_url=url) as env:
            assert env.spec.max_episode_steps == local.spec.max_episode_steps == 200
            timed = gym.wrappers.TimeAwareObservation(env)
            obs, _ = timed.reset(seed=0)
            assert obs.shape == (4,) and obs[-1] == 0
            for step in range(1, 201):
                obs, _, terminated, truncated, _ = timed.step(np.zeros(1, dtype=np.float32))
                assert truncated == (step == 200) and not terminated and obs[-1] == step
        with gym.make("openenv_gym/Remote-v0", base_url=url, max_episode_steps=50) as env:
            assert env.spec.max_episode_steps == 50  # the make call's own limit wins
        with OpenEnvEnv(url) as env:
            assert env.spec is None  # (not made by gymnasium.make: no spec, as for any env made directly)
        # The pool's spec, as make_vec's SyncVectorEnv's: the limit it keeps (its own, if smaller).
        local_vec = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")
        with gym.make_vec("openenv_gym/Remote-v0", num_envs=2, base_url=url) as envs:
            assert envs.spec.max_episode_steps == local_vec.spec.max_episode_steps == 200
        with gym.make_vec("openenv_gym/Remote-v0", num_envs=2, base_url=url, max_episode_steps=50) as envs:
            assert envs.spec.max_episode_steps == 50
        with OpenEnvVectorEnv(url, 2) as envs:
            assert envs.spec is None
        with launch_local("Pendulum-v1", env_kwargs={"max_episode_steps": 50}) as (short,):
            with gym.make_vec("openenv_gym/Remote-v0", num_envs=2, base_url=[url, short]) as envs:
                assert envs.spec.max_episode_steps == 50  # (servers whose limits differ: the first to end episodes)


def test_a_nan_reward_reads_as_no_reward_and_infinities_pass_on_the_fast_path():
    # On the wire NaN is OpenEnv's "no reward" (as after a reset); JSON has no infinities at all.
    with launch_local("tests.servers.gym_envs:NonFiniteReward-v0", max_sessions=8) as (url,):
        with OpenEnvVectorEnv(url, 3) as envs:
            envs.reset(seed=0)
            _, rewards, *_ = envs.step(np.array([0, 1, 2]))
            assert rewards.tolist() == [0.0, np.inf, -np.inf]
        for offer_msgpack, expected in ((True, [0.0, np.inf, -np.inf]), (False, [0.0, 0.0, 0.0])):
            with OpenEnvEnv(url, offer_msgpack=offer_msgpack) as env:
                env.reset(seed=0)
                assert [env.step(a)[1] for a in (0, 1, 2)] == expected
