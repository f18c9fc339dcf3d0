"""OpenEnvVectorEnv against real stock OpenEnv servers: Gymnasium conformance and the async API."""

from __future__ import annotations

import asyncio
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import NormalizeObservation, RecordEpisodeStatistics

import openenv_gym
from openenv_gym import OpenEnvVectorEnv
from openenv_gym.vector.core import PoolCore
from tests.servers.launch import forked_launch
from tests.vector_conformance import assert_same, reset_alike, run_side_by_side, step_alike


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_pool_over_stock_server_equals_sync_vector_env(stock_cartpole_url, mode):
    ended = run_side_by_side(
        lambda m: OpenEnvVectorEnv(stock_cartpole_url, 4, autoreset_mode=m, truncated_key="truncated"),
        lambda: gym.make("CartPole-v1"),
        mode,
        num_envs=4,
        steps=250,
        exact_spaces=False,
    )
    assert ended >= 20


def test_make_vec_returns_the_pool(stock_cartpole_url):
    envs = gym.make_vec(openenv_gym.REMOTE_ID, num_envs=3, base_url=stock_cartpole_url, truncated_key="truncated")
    try:
        assert isinstance(envs, OpenEnvVectorEnv)
        assert envs.num_envs == 3
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (3, 4) and obs.dtype == np.float32
        assert envs.observation_space.shape == (3, 4)
    finally:
        envs.close()


def test_registered_remote_env_makes_a_pool_with_its_kwargs(stock_cartpole_url):
    openenv_gym.register_remote("openenv_vec_test/CartPole-v1", stock_cartpole_url, truncated_key="truncated", max_episode_steps=5)
    envs = gym.make_vec("openenv_vec_test/CartPole-v1", num_envs=2)
    try:
        envs.reset(seed=1)
        for _ in range(4):
            _, _, _, truncated, _ = envs.step(np.array([0, 1]))
            assert not truncated.any()
        _, _, terminated, truncated, _ = envs.step(np.array([1, 0]))
        assert truncated.all() and not terminated.any()  # the registered time limit, client side
    finally:
        envs.close()


def test_gymnasium_vector_wrappers_work(stock_cartpole_url):
    envs = RecordEpisodeStatistics(NormalizeObservation(OpenEnvVectorEnv(stock_cartpole_url, 4, truncated_key="truncated")))
    try:
        envs.reset(seed=0)
        episodes = 0
        for _ in range(60):
            obs, _, _, _, infos = envs.step(np.ones(4, dtype=np.int64))  # always right: short episodes
            assert np.isfinite(obs).all()
            if "episode" in infos:
                episodes += int(infos["_episode"].sum())
        assert episodes >= 4
        assert len(envs.return_queue) == episodes
    finally:
        envs.close()


def test_reset_mask_resets_only_masked_envs_and_leaves_options_alone(stock_cartpole_url):
    with OpenEnvVectorEnv(stock_cartpole_url, 3, truncated_key="truncated") as envs:
        first, _ = envs.reset(seed=10)
        moved, *_ = envs.step(np.array([1, 1, 1]))
        options = {"reset_mask": np.array([True, False, False])}
        obs, _ = envs.reset(seed=[10, None, None], options=options)
        assert "reset_mask" in options
        assert_same(obs[0], first[0])  # reseeded with the same seed
        assert_same(obs[1:], moved[1:])  # untouched
        with pytest.raises(ValueError, match="at least one True"):
            envs.reset(options={"reset_mask": np.zeros(3, dtype=bool)})
        with pytest.raises(TypeError):
            envs.reset(options={"reset_mask": [True, False, True]})


def test_a_seed_gymnasium_refuses_is_refused_before_any_env_is_reset(stock_cartpole_url):
    with OpenEnvVectorEnv(stock_cartpole_url, 3, truncated_key="truncated") as envs:
        envs.reset(seed=0)
        moved, *_ = envs.step(np.array([1, 1, 1]))
        for seed, message in (
            ([5, None, -1], "greater or equal to zero"),
            ([np.int64(1), 2, 3], "python integer"),
            (-1, "greater or equal to zero"),
        ):
            with pytest.raises(gym.error.Error, match=message):
                envs.reset(seed=seed)
        # Nothing was reset: the next step goes on from where the envs were, as a pool of local envs would.
        again, *_ = envs.step(np.array([1, 1, 1]))
        local = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
        local.reset(seed=0)
        local.step(np.array([1, 1, 1]))
        expected, *_ = local.step(np.array([1, 1, 1]))
        assert_same(again, expected)
        assert not np.array_equal(again, moved)
        # A bool is a seed to Gymnasium (True seeds as 1), and so it is here.
        obs, _ = envs.reset(seed=[True, 5, False])
        expected, _ = local.reset(seed=[True, 5, False])
        local.close()
        assert_same(obs, expected)


def test_disabled_mode_refuses_to_step_an_ended_env(stock_cartpole_url):
    with OpenEnvVectorEnv(stock_cartpole_url, 2, autoreset_mode="Disabled", truncated_key="truncated") as envs:
        envs.reset(seed=0)
        for _ in range(100):
            _, _, terminated, truncated, _ = envs.step(np.array([1, 1]))
            if (terminated | truncated).any():
                break
        with pytest.raises(ValueError, match="reset_mask"):
            envs.step(np.array([1, 1]))


def test_send_recv_returns_batches_with_env_ids(stock_cartpole_url):
    with OpenEnvVectorEnv(stock_cartpole_url, 6, batch_size=3, truncated_key="truncated") as envs:
        envs.reset(seed=0)
        envs.send(np.zeros(6, dtype=np.int64))
        seen = []
        for _ in range(2):
            obs, rewards, terminated, truncated, infos = envs.recv()
            assert obs.shape == (3, 4) and rewards.shape == (3,)
            assert infos["env_id"].dtype == np.int64
            seen.extend(infos["env_id"].tolist())
            assert (rewards == 1.0).all()
        assert sorted(seen) == list(range(6))  # every env exactly once
        with pytest.raises(gym.error.NoAsyncCallError):
            envs.recv()
        # Send to a subset, as an EnvPool loop does with info["env_id"].
        envs.send(np.array([1, 0]), env_ids=[4, 2])
        with pytest.raises(ValueError, match="in flight"):
            envs.send(np.array([1]), env_ids=[2])
        with pytest.raises(gym.error.AlreadyPendingCallError, match="in flight"):  # as AsyncVectorEnv's
            envs.send(np.array([1]), env_ids=[4])
        obs, rewards, *_, infos = envs.recv()
        assert sorted(infos["env_id"].tolist()) == [2, 4]


def test_step_async_and_step_wait(stock_cartpole_url):
    with OpenEnvVectorEnv(stock_cartpole_url, 2, truncated_key="truncated") as envs:
        envs.reset(seed=5)
        envs.step_async(np.array([0, 1]))
        with pytest.raises(gym.error.AlreadyPendingCallError) as second:
            envs.step_async(np.array([0, 1]))
        assert second.value.name == "step" and isinstance(second.value, ValueError)
        obs, rewards, *_ = envs.step_wait(timeout=10)
        assert obs.shape == (2, 4) and (rewards == 1.0).all()
        with pytest.raises(gym.error.NoAsyncCallError):
            envs.step_wait()


def test_step_wait_refuses_when_not_every_env_is_in_flight(fast_cartpole_urls):
    """step_wait returns every env: after a send to some, or a recv that took some, it would repeat old rows."""
    with OpenEnvVectorEnv(fast_cartpole_urls, 2, batch_size=1) as envs:
        envs.reset(seed=0)
        envs.send(np.array([0]), env_ids=[0])
        with pytest.raises(gym.error.NoAsyncCallError, match=r"envs \[1\] are not in flight"):
            envs.step_wait()
        _, _, _, _, infos = envs.recv()  # nothing was lost by the refusal
        assert infos["env_id"].tolist() == [0]
        envs.step_async(np.array([0, 1]))
        _, _, _, _, infos = envs.recv()
        taken = int(infos["env_id"][0])
        with pytest.raises(gym.error.NoAsyncCallError, match=rf"envs \[{taken}\] are not in flight"):
            envs.step_wait()
        _, _, _, _, infos = envs.recv()
        assert infos["env_id"].tolist() == [1 - taken]
        envs.step_async(np.array([1, 1]))
        obs, rewards, *_ = envs.step_wait(timeout=10)  # every env in flight: the whole batch
        assert obs.shape == (2, 4) and rewards.tolist() == [1.0, 1.0]


def test_action_outside_the_space_is_refused(stock_cartpole_url):
    with OpenEnvVectorEnv(stock_cartpole_url, 2, truncated_key="truncated") as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="not in the action space"):
            envs.step(np.array([0, 2]))
        envs.step(np.array([0, 1]))  # still usable
        with pytest.raises(ValueError, match="not in the action space"):
            envs.step(np.array([0.0, 1.7]))  # never made 1
        with pytest.raises(ValueError, match="env_ids must be distinct ints"):
            envs.send(np.array([0]), env_ids=[1.7])  # never made env 1
        envs.step([0, 1])  # a list is a batch too


def test_float64_box_actions_are_taken_as_gymnasium_envs_take_them():
    # numpy's default float64 for a float32 Box: SyncVectorEnv passes it on; so do we.
    with openenv_gym.launch_local("Pendulum-v1") as urls:
        local = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")
        with OpenEnvVectorEnv(urls, 2) as envs:
            actions = np.array([[0.5], [-1.25]], dtype=np.float64)
            assert_same(envs.reset(seed=3), local.reset(seed=3), "reset")
            remote_step, local_step = envs.step(actions), local.step(actions)
            # The action travels as the space's float32: float32 arithmetic in the env.
            for got, want in zip(remote_step[:4], local_step[:4]):
                np.testing.assert_allclose(got, want, rtol=1e-6)
            with pytest.raises(ValueError, match="not in the action space"):
                envs.step(np.array([[0.5], [2.5]]))  # out of bounds stays refused
        local.close()
        with openenv_gym.OpenEnvEnv(urls[0]) as env:
            env.reset(seed=0)
            env.step(np.array([0.25]))  # float64, in bounds


def test_close_is_idempotent_and_closed_pool_refuses_work(stock_cartpole_url):
    envs = OpenEnvVectorEnv(stock_cartpole_url, 2, truncated_key="truncated")
    envs.reset(seed=0)
    envs.step_async(np.array([0, 1]))
    envs.close()
    envs.close()
    for call in (envs.reset, envs.step_wait, envs.recv):
        with pytest.raises(gym.error.ClosedEnvironmentError):
            call()


def test_servers_must_host_the_same_env(stock_cartpole_url, stock_mixed_url):
    with pytest.raises(ValueError, match="same env"):
        OpenEnvVectorEnv([stock_cartpole_url, stock_mixed_url], 2, truncated_key="truncated")


# ------------------------------------------------------------------ the fast path


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_pool_on_the_fast_path_equals_sync_vector_env(fast_cartpole_urls, mode):
    ended = run_side_by_side(
        lambda m: OpenEnvVectorEnv(fast_cartpole_urls, 8, autoreset_mode=m),
        lambda: gym.make("CartPole-v1"),
        mode,
        num_envs=8,
        steps=300,
    )
    assert ended >= 40


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_infos_batch_exactly_as_in_sync_vector_env(fast_info_cartpole_urls, mode):
    from tests.servers.gym_envs import InfoCartPole

    ended = run_side_by_side(
        lambda m: OpenEnvVectorEnv(fast_info_cartpole_urls, 4, autoreset_mode=m),
        InfoCartPole,
        mode,
        num_envs=4,
        steps=120,
    )
    assert ended >= 10


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_numpy_scalar_infos_keep_their_dtypes_on_the_fast_path(mode):
    # SyncVectorEnv types an info key's array by the first value's type: float32 for np.float32,
    # an object array for np.bool_. The fast path carries numpy scalars with their dtypes.
    from tests.servers.gym_envs import NumpyInfoCartPole

    with openenv_gym.launch_local("tests.servers.gym_envs:NumpyInfoCartPole-v1", max_sessions=4) as urls:
        ended = run_side_by_side(lambda m: OpenEnvVectorEnv(urls, 3, autoreset_mode=m), NumpyInfoCartPole, mode, num_envs=3, steps=60)
        assert ended >= 3
        with openenv_gym.OpenEnvEnv(urls[0]) as env:
            local = NumpyInfoCartPole()
            assert_same(env.reset(seed=1), local.reset(seed=1), "reset")
            got, want = env.step(0)[4], local.step(0)[4]
            assert type(got["angle"]) is np.float32 and type(got["inner"]["half"]) is np.float16
            assert_same(got, want, "step info")
            got["pair"] += 1  # an info's array is writeable, as the env's own (not a view of the frame)
            got["pairs"][0] += 1
            got["pairs"][1]["deep"][0] += 1


def test_same_step_resets_go_with_the_step_one_request_per_server(fast_cartpole_urls):
    """Fast-path servers reset the envs a step ends within that step's request: no second round trip."""
    local = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4, autoreset_mode=AutoresetMode.SAME_STEP)
    with OpenEnvVectorEnv(fast_cartpole_urls, 4, autoreset_mode=AutoresetMode.SAME_STEP) as envs:
        requests = []  # each request's type ("raw": a raw step on a lane)
        for link in envs._core.links:
            conn = link.connection
            send = conn.send_request

            def counted(build, *args, _send=send, **kwargs):
                def built(rid):
                    message = build(rid)
                    requests.append("raw" if isinstance(message, bytes) else message["type"])
                    return message

                return _send(built, *args, **kwargs)

            conn.send_request = counted
        reset_alike(envs, local, np.ones(4, dtype=np.bool_), "reset", seeds=[0, 1, 2, 3])
        rng = np.random.default_rng(0)
        ended = raw = 0
        for t in range(150):
            requests.clear()
            _, _, terminated, truncated, _ = step_alike(envs, local, rng.integers(0, 2, 4), f"step {t}")
            steps = [r for r in requests if r != "bind"]  # (a lane is bound on the side, once)
            assert len(steps) == 2 and set(steps) <= {"step", "raw"}, f"step {t}: {requests}"  # one per server
            ended += int((terminated | truncated).sum())
            raw += steps.count("raw")
        assert ended >= 10
        assert raw >= 250  # on lanes that reset too, once bound


def test_pool_spreads_sessions_over_servers_by_capacity(fast_cartpole_urls):
    from openenv_gym.remote import fetch_health

    before = [fetch_health(u)["active_sessions"] for u in fast_cartpole_urls]
    with OpenEnvVectorEnv(fast_cartpole_urls, 6) as envs:
        during = [fetch_health(u)["active_sessions"] for u in fast_cartpole_urls]
        assert [d - b for d, b in zip(during, before)] == [3, 3]
        assert {link.codec for link in envs._core.links} == {"msgpack"}


def test_pool_on_the_fast_path_observations_land_in_one_batch_array(fast_cartpole_urls):
    with OpenEnvVectorEnv(fast_cartpole_urls, 4, copy=False) as envs:
        obs, _ = envs.reset(seed=0)
        again, *_ = envs.step(np.zeros(4, dtype=np.int64))
        assert again is obs  # copy=False: the preallocated buffer itself
        assert obs.dtype == np.float32 and obs.flags.c_contiguous


# ------------------------------------------------------------------ async independence and stock servers


@pytest.fixture(scope="module")
def action_sleep_url():
    from openenv_gym import launch_local

    # Force threads so that a slow step of one session never holds up another.
    with launch_local("tests.servers.gym_envs:ActionSleep-v0", max_sessions=8, extra_args=["--execution", "thread"]) as urls:
        yield urls[0]


def test_recv_returns_envs_that_finish_first(action_sleep_url):
    # Env 0 steps slowly (action 1: 0.5 s), envs 1-3 at once; all on one server.
    with OpenEnvVectorEnv(action_sleep_url, 4, batch_size=2) as envs:
        envs.reset(seed=0)
        envs.send(np.array([1, 0, 0, 0]))
        *_, infos = envs.recv(timeout=10)
        assert 0 not in infos["env_id"].tolist()  # the server answers in parts: the fast ones are not held back
        *_, infos = envs.recv(timeout=10)
        assert 0 in infos["env_id"].tolist()


def test_a_finished_env_steps_again_while_a_slow_one_of_its_request_still_runs(action_sleep_url):
    # One request (one frame) for all four envs; env 0 sleeps 0.5 s per step.
    with OpenEnvVectorEnv(action_sleep_url, 4, batch_size=3) as envs:
        envs.reset(seed=0)
        envs.send(np.array([1, 0, 0, 0]))
        first = envs.recv(timeout=10)[-1]["env_id"].tolist()
        assert sorted(first) == [1, 2, 3]
        # Their next steps run at once on the server: they do not wait for env 0's step to end.
        envs.send(np.zeros(3, dtype=np.int64), first)
        again = envs.recv(timeout=10)[-1]["env_id"].tolist()
        assert sorted(again) == [1, 2, 3]
        *_, infos = envs.recv(timeout=10)
        assert infos["env_id"].tolist() == [0]


def test_request_size_splits_requests_and_envs_still_arrive_as_they_finish(action_sleep_url):
    with OpenEnvVectorEnv(action_sleep_url, 4, batch_size=2, request_size=2) as envs:
        envs.reset(seed=0)
        envs.send(np.array([1, 0, 0, 0]))
        first = envs.recv(timeout=10)[-1]["env_id"].tolist()
        second = envs.recv(timeout=10)[-1]["env_id"].tolist()
        assert 0 not in first and sorted(first + second) == [0, 1, 2, 3]


def test_pool_over_the_stock_openenv_server_launched_locally():
    from openenv_gym import launch_local

    with launch_local("CartPole-v1", stock=True, max_sessions=8) as (url,):
        ended = run_side_by_side(
            lambda m: OpenEnvVectorEnv(url, 3, autoreset_mode=m),  # truncated_key found by name
            lambda: gym.make("CartPole-v1"),
            AutoresetMode.SAME_STEP,
            num_envs=3,
            steps=80,
            exact_spaces=False,
        )
    assert ended >= 5


def test_a_pool_never_closed_frees_its_sessions_when_collected():
    import gc
    import time

    import httpx

    with openenv_gym.launch_local("CartPole-v1", max_sessions=4) as (url,):
        envs = OpenEnvVectorEnv(url, 4)
        envs.reset(seed=0)
        assert httpx.get(f"{url}/health", timeout=5).json()["active_sessions"] == 4
        del envs
        gc.collect()
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/health", timeout=5).json()["active_sessions"]:
            assert time.monotonic() < deadline, "the sessions of a collected pool were never closed"
            time.sleep(0.05)
        with OpenEnvVectorEnv(url, 4) as again:  # the server has room for a new pool
            again.reset(seed=0)


def test_a_second_thread_inside_the_pool_is_refused_clearly():
    import threading
    import time

    extra = ["--execution", "thread"]
    with openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 1.0}, extra_args=extra) as urls:
        with OpenEnvVectorEnv(urls, 2) as envs:
            envs.reset(seed=0)
            stepped = threading.Thread(target=envs.step, args=(np.zeros(2, dtype=np.int64),))
            stepped.start()
            deadline = time.monotonic() + 10
            while not envs._awaited_calls.in_use.locked():  # the other thread is inside step()
                assert time.monotonic() < deadline
                time.sleep(0.005)
            with pytest.raises(RuntimeError, match="in use by another thread"):
                envs.step(np.zeros(2, dtype=np.int64))
            stepped.join(timeout=20)
            assert not stepped.is_alive()
            *_, infos = envs.step(np.zeros(2, dtype=np.int64))  # one thread again: fine
            assert "openenv_error" not in infos


def test_an_interrupt_before_the_requests_went_out_leaves_the_pool_usable(fast_cartpole_urls):
    # A Ctrl-C as step() hands its requests to the loop: they go out with the next call.
    def interrupt() -> None:
        raise KeyboardInterrupt

    with OpenEnvVectorEnv(fast_cartpole_urls, 4, step_timeout=5) as envs:
        envs.reset(seed=0)
        envs._io.loop.call_soon_threadsafe(interrupt)  # runs just before step's own callback
        with pytest.raises(KeyboardInterrupt):
            envs.step(np.zeros(4, dtype=np.int64))
        _, rewards, _, _, infos = envs.step_wait(timeout=10)  # the interrupted step's results
        assert rewards.tolist() == [1.0] * 4 and "openenv_error" not in infos
        envs._io.loop.call_soon_threadsafe(interrupt)
        with pytest.raises(KeyboardInterrupt):
            envs.step(np.zeros(4, dtype=np.int64))
        obs, _ = envs.reset(seed=1)  # at once: the interrupted step is waited for and dropped
        assert obs.shape == (4, 4)
        _, rewards, *_ = envs.step(np.zeros(4, dtype=np.int64))
        assert rewards.tolist() == [1.0] * 4


def test_text_actions_hold_any_unicode(stock_echo_url):
    messages = ("café", "“quoted” — 🙂")
    with OpenEnvVectorEnv(stock_echo_url, 2) as envs:
        envs.reset(seed=0)
        assert envs.action_space.contains(messages)
        obs, rewards, _, _, _ = envs.step(messages)
        assert tuple(obs["echoed"]) == messages and rewards.tolist() == [float(len(m)) for m in messages]
        with pytest.raises(ValueError, match="action space"):
            envs.step(("ok", "\ud800"))


def test_a_chat_style_env_batches_sequences_and_returns_free_form_fields_in_infos(stock_arena_url):

    with forked_launch("tests.servers.stock_envs:ArenaEnvironment", max_sessions=2) as fast_urls:
        for urls in ([stock_arena_url], fast_urls):
            with OpenEnvVectorEnv(urls, 2) as envs:
                obs, infos = envs.reset(seed=0)
                assert obs["messages"] == ((), ()) and [i["turn"] for i in infos["info"]] == [0, 0]
                obs, rewards, _, _, infos = envs.step(("hello", "héllo"))
                assert rewards.tolist() == [1.0, 0.0]
                assert [m["content"] for m in obs["messages"][1]] == ["héllo", "you said héllo"]
                # (free-form fields: an object array of the values as received, whatever their types)
                assert [i["turn"] for i in infos["info"]] == [1, 1] and infos["_info"].all()
                assert [i["detail"]["said"] for i in infos["info"]] == [["hello"], ["héllo"]]
                assert envs.observation_space.contains(obs)


def test_tool_calls_with_and_without_arguments_in_one_batch(stock_tools_url):

    with forked_launch("tests.servers.stock_envs:ToolEnvironment", max_sessions=2) as fast_urls:
        for urls in ([stock_tools_url], fast_urls):
            with OpenEnvVectorEnv(urls, 2) as envs:
                envs.reset(seed=0)
                # (a batch of Dict actions is a dict of batches, as Gymnasium batches Dict spaces)
                calls = {"tool_name": ("add", "nope"), "arguments": ('{"a": 1, "b": 2}', "{}")}
                obs, rewards, _, _, infos = envs.step(calls)  # the second call's arguments are its default: not sent
                assert rewards.tolist() == [1.0, 0.0] and obs["error"][1] == "no tool 'nope'"
                assert infos["result"][0] == 3 and infos["_result"].tolist() == [True, False]  # null: absent
                assert type(infos["result"][0]) is int  # plain JSON values on both paths


def test_an_optional_field_that_says_nothing_reaches_the_env_as_one_env_sends_it_whatever_its_batch_mates_send():
    # NoteAction.note: Optional[str] = None. A lone env leaves "" out, so the env gets None; in a pool step
    # where another env sends a note, the column must hold every env's: "" went as "" there, now as None.
    from openenv_gym import OpenEnvEnv

    with forked_launch("tests.servers.stock_envs:NoteEnvironment", max_sessions=4) as (url,):
        with OpenEnvEnv(url) as env:
            env.reset()
            assert env.step({"guess": "a", "note": ""})[0] == "('a', None)"  # (one field: the observation is it)
        with OpenEnvVectorEnv(url, 3) as envs:
            envs.reset(seed=0)
            obs, *_ = envs.step({"guess": ("a", "b", "c"), "note": ("", "hi", "")})
            assert list(obs) == ["('a', None)", "('b', 'hi')", "('c', None)"]
            obs, *_ = envs.step({"guess": ("a", "b", "c"), "note": ("", "", "")})  # (left out for all)
            assert list(obs) == ["('a', None)", "('b', None)", "('c', None)"]


def test_free_form_info_values_of_different_types_batch_as_objects(stock_tools_url):
    # Gymnasium types an info key's array by the first env's value: an int then a dict would break it.
    with OpenEnvVectorEnv(stock_tools_url, 2) as envs:
        envs.reset(seed=0)
        calls = {"tool_name": ("add", "upper"), "arguments": ('{"a": 1, "b": 2}', '{"text": "x"}')}
        _, rewards, _, _, infos = envs.step(calls)
        assert rewards.tolist() == [1.0, 1.0] and infos["result"].tolist() == [3, {"text": "X"}]


def test_a_list_that_outgrows_the_first_observation_truncates_those_envs_and_the_pool_goes_on(stock_moves_url):
    import gymnasium as gym

    with OpenEnvVectorEnv(stock_moves_url, 2) as envs:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 4)  # the first observation's 4 legal moves fixed the shape
        for step in range(4):  # a truncated step, then NEXT_STEP's reset, and again: never raised, never stuck
            _, _, terminated, truncated, infos = envs.step(np.array([0, 1]))
            assert truncated.all() == (step % 2 == 0) and not terminated.any()
            if step % 2 == 0:
                assert set(infos["openenv_error"]["type"]) == {"SpaceMappingError"}
                assert "Sequence" in infos["openenv_error"]["message"][0]
    # The fix the error names: a Sequence for the field.
    varying = gym.spaces.Sequence(gym.spaces.Box(0, 3, (), np.int64), stack=False)
    with OpenEnvVectorEnv(stock_moves_url, 2, observation_space=varying) as envs:
        envs.reset(seed=0)
        obs, rewards, _, truncated, _ = envs.step(np.array([0, 1]))
        assert [len(o) for o in obs] == [3, 3] and rewards.tolist() == [1.0, 1.0] and not truncated.any()


def test_variable_fields_in_the_pool(stock_moves_url):
    with OpenEnvVectorEnv(stock_moves_url, 2, variable_fields="legal") as envs:
        envs.reset(seed=0)
        obs, rewards, _, truncated, _ = envs.step(np.array([3, 0]))
        assert [[int(m) for m in o] for o in obs] == [[0, 1, 2], [1, 2, 3]] and not truncated.any()


def test_json_text_no_wire_format_carries_is_refused_before_anything_is_sent():

    with forked_launch("tests.servers.stock_envs:ToolEnvironment", max_sessions=2) as urls:
        with OpenEnvVectorEnv(urls, 2) as envs:
            envs.reset(seed=0)
            bad = {"tool_name": ("upper", "add"), "arguments": ('{"text": "\\ud800"}', '{"a": 1, "b": 2}')}
            with pytest.raises(ValueError, match="surrogate"):
                envs.step(bad)
            good = {"tool_name": ("upper", "add"), "arguments": ('{"text": "ok"}', '{"a": 1, "b": 2}')}
            _, rewards, _, truncated, _ = envs.step(good)  # nothing was left in flight
            assert rewards.tolist() == [1.0, 1.0] and not truncated.any()


def test_an_image_null_in_the_first_observation_travels_in_info(stock_page_url):
    with openenv_gym.OpenEnvEnv(stock_page_url) as env:
        assert set(env.observation_space.spaces) == {"text"}
        _, info = env.reset()
        assert "screenshot" not in info  # null: left out
        obs, _, _, _, info = env.step("a.html")
        assert obs == {"text": "a.html"} and info["screenshot"] == [[1, 1], [1, 1]]
    with OpenEnvVectorEnv(stock_page_url, 2) as envs:
        envs.reset(seed=0)
        obs, _, _, _, infos = envs.step(("a", "b"))
        assert obs["text"] == ("a", "b") and infos["screenshot"][1] == [[1, 1], [1, 1]] and infos["_screenshot"].all()


def test_enum_actions_and_observations_travel_as_their_values(stock_gear_url):
    # Literal[2, 1, 0]: index 0 is the value 2. The pool's one-field fast paths must map them.
    with forked_launch("tests.servers.stock_envs:GearEnvironment", max_sessions=4) as fast_urls:
        for urls in ([stock_gear_url], fast_urls):
            with OpenEnvVectorEnv(urls, 3) as envs:
                assert envs.single_action_space == gym.spaces.Discrete(3)
                obs, _ = envs.reset(seed=0)
                assert obs.tolist() == [0, 0, 0]  # gear 2
                obs, rewards, *_ = envs.step(np.array([0, 1, 2]))
                assert obs.tolist() == [0, 1, 2]
                assert rewards.tolist() == [2.0, 1.0, 0.0]  # the server got gears 2, 1, 0


def test_infos_that_no_batch_or_codec_takes_as_they_are_cost_nothing():
    with openenv_gym.launch_local("tests.servers.gym_envs:OddInfo-v0", max_sessions=4) as urls:
        with OpenEnvVectorEnv(urls, 2) as envs:  # msgpack
            for _ in range(2):  # the reset, then a step
                _, infos = envs.reset(seed=0) if _ == 0 else envs.step(np.zeros(2, dtype=np.int64))[::4]
                # int 5, then uint64 2**64 - 1: Gymnasium's int array cannot hold the second
                assert infos["big"].tolist() == [5, 2**64 - 1] and infos["_big"].all()
                assert infos["huge"].tolist() == [2.0**70] * 2  # msgpack has no such int: a float
                assert infos["ld"].tolist() == [1.5, 1.5]
                assert [list(v) for v in infos["lda"]] == [[1.5, 2.5], [1.5, 2.5]]
                assert "openenv_error" not in infos
        with openenv_gym.OpenEnvEnv(urls[0], offer_msgpack=False) as env:  # the stock JSON path
            for _ in range(2):
                _, info = env.reset(seed=1) if _ == 0 else env.step(0)[::4]
                assert info == {"big": 2**64 - 1, "huge": 2**70, "ld": 1.5, "lda": [1.5, 2.5]}


def test_awaited_calls_leave_the_callers_event_loop_running():
    # An asyncio trainer (an LLM client, say) awaits the pool; its own tasks go on while envs step.
    import asyncio

    with openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", max_sessions=4, env_kwargs={"delay": 0.2}) as urls:
        with OpenEnvVectorEnv(urls, 2, batch_size=1) as envs:

            async def main() -> tuple:
                ticks = 0
                stop = asyncio.Event()

                async def ticker() -> None:
                    nonlocal ticks
                    while not stop.is_set():
                        ticks += 1
                        await asyncio.sleep(0.01)

                task = asyncio.create_task(ticker())
                await envs.areset(seed=0)  # 0.2 s on the servers
                result = await envs.astep(np.zeros(2, dtype=np.int64))  # 0.2 s more
                envs.send(np.zeros(2, dtype=np.int64))
                first = await envs.arecv()
                second = await envs.arecv()
                stop.set()
                await task
                return ticks, (result, first, second)

            ticks, (result, first, second) = asyncio.run(asyncio.wait_for(main(), 60.0))
            assert ticks >= 20  # ~0.6 s of awaited env time: the loop ticked all along
            assert result[1].tolist() == [1.0, 1.0]
            assert sorted(first[4]["env_id"].tolist() + second[4]["env_id"].tolist()) == [0, 1]


def test_a_cancelled_arecv_hands_its_envs_to_the_next_recv():
    # A trainer bounds its await with asyncio.wait_for: the envs that call was receiving are not lost.
    import asyncio

    with openenv_gym.launch_local("tests.servers.gym_envs:ActionSleep-v0", max_sessions=4, env_kwargs={"delay": 0.4}) as urls:
        with OpenEnvVectorEnv(urls, 2) as envs:

            async def main() -> tuple:
                await envs.areset(seed=0)
                envs.send(np.ones(2, dtype=np.int64))  # each step sleeps 0.4 s
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(envs.arecv(), 0.05)
                first = await envs.arecv()  # not "in use by another thread": the cancelled call's envs
                envs.send(np.ones(2, dtype=np.int64))
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(envs.arecv(), 0.05)
                return first

            first = asyncio.run(asyncio.wait_for(main(), 60.0))
            assert sorted(first[4]["env_id"].tolist()) == [0, 1] and first[1].tolist() == [1.0, 1.0]
            second = envs.recv(timeout=30.0)  # the sync face takes them too
            assert sorted(second[4]["env_id"].tolist()) == [0, 1] and second[1].tolist() == [1.0, 1.0]
            with pytest.raises(gym.error.NoAsyncCallError):  # nothing is left over
                envs.recv(timeout=1.0)


def test_cancelled_arecvs_hand_their_envs_on_in_order_and_never_across_a_reset():
    import asyncio

    env = "tests.servers.gym_envs:ActionSleep-v0"
    with (
        openenv_gym.launch_local(env, max_sessions=4, env_kwargs={"delay": 0.4}) as fast,
        openenv_gym.launch_local(env, max_sessions=4, env_kwargs={"delay": 2.4}) as slow,
    ):
        with OpenEnvVectorEnv(fast + slow, 2, batch_size=1, step_timeout=10.0) as envs:

            async def two_cancelled() -> None:
                await envs.areset(seed=0)
                envs.send(np.ones(2, dtype=np.int64))  # env 0 is ready at 0.4 s, env 1 at 2.4 s
                first = asyncio.create_task(envs.arecv())
                second = asyncio.create_task(envs.arecv())  # queued behind the first
                await asyncio.sleep(0.1)
                first.cancel()
                await asyncio.gather(first, return_exceptions=True)
                await asyncio.sleep(1.2)  # the first call is done (at 0.4 s), the second running (until 2.4 s)
                second.cancel()
                await asyncio.gather(second, return_exceptions=True)

            asyncio.run(asyncio.wait_for(two_cancelled(), 60.0))
            assert [envs.recv(timeout=10.0)[4]["env_id"].tolist() for _ in range(2)] == [[0], [1]]

            async def cancelled_then_reset() -> None:
                envs.send(np.ones(2, dtype=np.int64))
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(envs.arecv(), 0.05)
                started = time.monotonic()
                with pytest.raises(TimeoutError):  # the handed-on call is still running: arecv keeps to its timeout
                    await envs.arecv(timeout=0.05)
                assert time.monotonic() - started < 1.0  # (not the handed-on call's 2.4 s)
                await envs.areset(seed=1)  # runs after that call: its envs are of the episodes the reset ended

            asyncio.run(asyncio.wait_for(cancelled_then_reset(), 60.0))
            envs.send(np.zeros(2, dtype=np.int64))  # instant steps
            got = [envs.recv(timeout=10.0)[4]["env_id"].tolist() for _ in range(2)]
            assert sorted(got) == [[0], [1]] and not envs._batch.pending.any()


def test_closing_the_pool_under_awaited_calls_fails_them_as_closed():
    import asyncio

    with openenv_gym.launch_local("tests.servers.gym_envs:ActionSleep-v0", max_sessions=4, env_kwargs={"delay": 1.0}) as urls:
        envs = OpenEnvVectorEnv(urls, 2, step_timeout=10.0, autoreset_mode=AutoresetMode.SAME_STEP)

        async def main() -> list:
            await envs.areset(seed=0)
            stepping = asyncio.create_task(envs.astep(np.ones(2, dtype=np.int64)))  # 1 s on the worker thread
            queued = asyncio.create_task(envs.areset(seed=1))  # behind it
            await asyncio.sleep(0.3)
            envs.close()
            return await asyncio.gather(stepping, queued, return_exceptions=True)

        outcomes = asyncio.run(asyncio.wait_for(main(), 60.0))
        # Not an AssertionError (SAME_STEP's resets of the failed steps), not a CancelledError nobody asked for.
        assert [type(o) for o in outcomes] == [gym.error.ClosedEnvironmentError] * 2


def test_infos_are_batched_in_env_order_whatever_order_the_servers_answer_in():
    env = "tests.servers.gym_envs:TypedInfo-v0"
    with openenv_gym.launch_local(env, servers=2, max_sessions=4) as urls:
        with OpenEnvVectorEnv(urls, 4) as envs:
            local = gym.vector.SyncVectorEnv([lambda: gym.make(env)] * 4)
            envs.reset(seed=0), local.reset(seed=0)  # envs 0 and 1 (one server) are slow and say 1; 2 and 3 say 2.5
            actions = np.zeros(4, dtype=np.int64)
            got, want = envs.step(actions)[4], local.step(actions)[4]
            assert want["v"].dtype == np.int64  # typed by env 0, as SyncVectorEnv does (not float64, by env 2)
            assert got["v"].dtype == want["v"].dtype and got["v"].tolist() == want["v"].tolist() == [1, 1, 2, 2]


def test_seeds_past_64_bits_and_the_final_obs_of_a_0d_box_are_as_in_sync_vector_env():
    env = "tests.servers.gym_envs:Hand-v0"
    with openenv_gym.launch_local(env, max_sessions=4) as urls:
        seeds = [2**64, 2**128 + 1]  # (a SeedSequence's entropy is 128 bits; msgpack's ints end at 2**64 - 1)
        kwargs = dict(autoreset_mode=AutoresetMode.SAME_STEP)
        with OpenEnvVectorEnv(urls, 2, max_episode_steps=1, **kwargs) as envs:
            local = gym.vector.SyncVectorEnv([lambda: gym.make(env, max_episode_steps=1)] * 2, **kwargs)
            got_obs, want_obs = envs.reset(seed=seeds)[0], local.reset(seed=seeds)[0]
            assert [list(map(int, h)) for h in got_obs["hand"]] == [list(h) for h in want_obs["hand"]]
            assert_same(got_obs["score"], want_obs["score"])
            actions = ((), ())
            got, want = envs.step(actions)[4], local.step(actions)[4]
            score = got["final_obs"][0]["score"]
            assert isinstance(score, np.ndarray) and score.shape == () and score == want["final_obs"][0]["score"]
        with pytest.raises(ValueError, match="max_episode_steps"):  # as gymnasium's TimeLimit
            OpenEnvVectorEnv(urls, 2, max_episode_steps=0)


def test_a_tuple_observation_with_text_matches_sync_vector_env():
    with openenv_gym.launch_local("tests.servers.gym_envs:Pair-v0", max_sessions=8) as urls:
        ended = run_side_by_side(
            lambda m: OpenEnvVectorEnv(urls, 3, autoreset_mode=m),
            lambda: gym.make("tests.servers.gym_envs:Pair-v0"),
            AutoresetMode.NEXT_STEP,
            num_envs=3,
            steps=12,
        )
        assert ended >= 6
        # SAME_STEP: final_obs of a Tuple batch is each env's tuple (it was the batch's n-th sub-space).
        # (Its Discrete leaf is the batch's numpy int, where the local env returned a Python int.)
        local = gym.vector.SyncVectorEnv([lambda: gym.make("tests.servers.gym_envs:Pair-v0")] * 3, autoreset_mode=AutoresetMode.SAME_STEP)
        with OpenEnvVectorEnv(urls, 3, autoreset_mode=AutoresetMode.SAME_STEP) as envs:
            envs.reset(seed=0), local.reset(seed=0)
            for step in range(6):
                actions = np.array([step % 2, 1, 0])
                ours, theirs = envs.step(actions), local.step(actions)
                assert_same(ours[0], theirs[0], f"step {step} obs")
                assert ours[2].tolist() == theirs[2].tolist()
                if "final_obs" in theirs[4]:
                    assert ours[4]["_final_obs"].tolist() == theirs[4]["_final_obs"].tolist()
                    for i in np.flatnonzero(theirs[4]["_final_obs"]):
                        got = ours[4]["final_obs"][i]
                        assert isinstance(got, tuple) and (int(got[0]), got[1]) == theirs[4]["final_obs"][i]
        local.close()
        # A partial first reset of a non-array batch: the envs never reset get a stand-in, as arrays get zeros.
        with OpenEnvVectorEnv(urls, 4, batch_size=1) as envs:
            obs, _ = envs.reset(seed=0, options={"reset_mask": np.array([True, True, False, False])})
            assert obs[1][:2] == ("s0", "s0") and len(obs[1]) == 4
            envs.send(np.array([0]), [0])
            _, rewards, _, _, infos = envs.recv()  # (it raised, and the transition was lost)
            assert infos["env_id"].tolist() == [0] and not envs._batch.pending.any()
            with pytest.raises(gym.error.ResetNeeded):
                envs.send(np.array([0]), [2])


def test_an_interrupt_while_another_thread_drives_the_loop_leaves_the_pool_usable():
    # The pool's step is handed to the loop another thread drives (a slow single env's step there).
    # A Ctrl-C in the waiting thread must let go of the step without taking the pool down with it.
    import signal
    import threading

    slow = ["--execution", "thread"]
    with (
        openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 1.0}, extra_args=slow) as a,
        openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 3.0}, extra_args=slow) as b,
    ):
        with OpenEnvVectorEnv(a, 2, step_timeout=10) as envs, openenv_gym.OpenEnvEnv(b[0], step_timeout=10) as single:
            envs.reset(seed=0)
            single.reset(seed=0)
            io = envs._io
            other = threading.Thread(target=single.step, args=(0,))
            other.start()
            deadline = time.monotonic() + 10
            while not (io._drive.locked() and not io._daemon_holds) and time.monotonic() < deadline:
                time.sleep(0.001)  # (until the other thread drives the loop: no event to wait on)
            assert io._drive.locked() and not io._daemon_holds
            main = threading.get_ident()
            with pytest.raises(KeyboardInterrupt):
                threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT)).start()
                envs.step(np.zeros(2, dtype=np.int64))  # (its envs take 1 s: the Ctrl-C comes first)
            _, rewards, _, truncated, _ = envs.step_wait(timeout=10)  # the interrupted step's results
            assert rewards.tolist() == [1.0, 1.0] and not truncated.any()
            envs.reset(seed=1)
            assert envs.step(np.zeros(2, dtype=np.int64))[1].tolist() == [1.0, 1.0]
            other.join(timeout=10)


def _steps_to_fall() -> int:
    """CartPole-v1 from seed 0, always pushing right: the step on which the pole falls."""
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    for n in range(1, 500):
        if env.step(1)[2]:
            return n
    raise AssertionError("the pole never fell")


def test_a_step_both_terminated_and_truncated_is_both_as_in_gymnasium():
    # A time limit that falls on the terminal step: Gymnasium's TimeLimit keeps terminated=True and
    # sets truncated=True too. Before, every remote path said terminated=False (done alone cannot say
    # both), and a learner would bootstrap from a terminal state.
    n = _steps_to_fall()
    kwargs = {"max_episode_steps": n}
    with (
        openenv_gym.launch_local("CartPole-v1", env_kwargs=kwargs) as urls,
        openenv_gym.launch_local("CartPole-v1", env_kwargs=kwargs, stock=True) as stock_urls,
    ):
        for url, msgpack in ((urls[0], True), (urls[0], False), (stock_urls[0], False)):
            with openenv_gym.OpenEnvEnv(url, offer_msgpack=msgpack) as env:
                env.reset(seed=0)
                flags = [env.step(1)[2:4] for _ in range(n)]
            assert flags == [(False, False)] * (n - 1) + [(True, True)], (url, msgpack)
        local = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", **kwargs)] * 2)
        with OpenEnvVectorEnv(urls, 2) as envs:
            assert_same(envs.reset(seed=[0, 0]), local.reset(seed=[0, 0]), "reset")
            both = 0
            for t in range(n + 1):
                actions = np.ones(2, dtype=np.int64)
                got, want = envs.step(actions), local.step(actions)
                for name, x, y in zip(("obs", "rewards", "terminations", "truncations", "infos"), got, want):
                    assert_same(x, y, f"step {t} {name}")
                both += int((want[2] & want[3]).sum())
            assert both == 2  # (the both-true step was among them)


def test_an_info_key_called_terminated_is_not_the_termination_flag():
    # The server leaves the terminated column out when no env is both terminated and truncated;
    # the pool then read Gymnasium's info["terminated"] as the flag, and ended episodes that went on.
    env = "tests.servers.gym_envs:InfoTerminated-v0"
    with openenv_gym.launch_local(env, max_sessions=2) as urls, OpenEnvVectorEnv(urls, 2) as envs:
        local = gym.vector.SyncVectorEnv([lambda: gym.make(env)] * 2)
        assert_same(envs.reset(seed=0), local.reset(seed=0), "reset")
        for t in range(4):  # the time limit cuts the episodes at the third step
            actions = np.zeros(2, dtype=np.int64)
            got, want = envs.step(actions), local.step(actions)
            for name, x, y in zip(("obs", "rewards", "terminations", "truncations", "infos"), got, want):
                assert_same(x, y, f"step {t} {name}")
        assert not want[2].any()


def test_stepping_an_env_never_reset_raises_reset_needed_as_sync_vector_env_does(fast_cartpole_urls):
    local = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(gym.error.ResetNeeded):
        local.step(np.array([0, 1]))
    with OpenEnvVectorEnv(fast_cartpole_urls, 2) as envs:
        with pytest.raises(gym.error.ResetNeeded, match=r"envs \[0, 1\] were never reset"):
            envs.step(np.array([0, 1]))
        envs.reset(seed=0, options={"reset_mask": np.array([True, False])})
        with pytest.raises(gym.error.ResetNeeded, match=r"envs \[1\] were never reset"):
            envs.send(np.array([0, 1]))
        envs.send(np.array([1]), env_ids=[0])  # env 0 was reset: it steps
        _, rewards, *_ = envs.recv()
        assert rewards.tolist() == [1.0]
        envs.reset(seed=0)
        assert envs.step(np.array([0, 1]))[1].tolist() == [1.0, 1.0]


def test_a_render_mode_is_refused_as_by_openenv_env(fast_cartpole_urls):
    with pytest.raises(ValueError, match="remote envs do not render"):
        gym.make_vec(openenv_gym.REMOTE_ID, num_envs=2, base_url=fast_cartpole_urls[0], render_mode="rgb_array")
    with gym.make_vec(openenv_gym.REMOTE_ID, num_envs=2, base_url=fast_cartpole_urls[0], render_mode=None) as envs:
        assert envs.render_mode is None


def test_the_batch_spaces_keep_open_integer_bounds_open_so_random_actions_are_sane():
    # gymnasium's batch_space turns an open integer bound into the dtype's extreme, taken for a real
    # bound: sample() then draws near -2**63, or raises for a space bounded below only.
    from gymnasium.vector.utils import batch_space

    with openenv_gym.launch_local("tests.servers.gym_envs:OpenInt-v0", max_sessions=4) as urls:
        with OpenEnvVectorEnv(urls, 3) as envs:
            single = envs.single_action_space
            assert not single.bounded_above.any() and single.bounded_below.all()
            assert envs.action_space == batch_space(single, 3)  # the same space, only sampled right
            envs.action_space.seed(0)
            envs.reset(seed=0)
            for _ in range(5):
                actions = envs.action_space.sample()
                assert actions.shape == (3, 2) and actions.min() >= 0 and actions.max() < 2**40
                obs, *_ = envs.step(actions)
                assert np.array_equal(obs, actions)
            sampled = envs.observation_space.sample()
            assert sampled.shape == (3, 2) and np.abs(sampled).max() < 2**40


def test_send_from_one_task_while_another_awaits_arecv():
    # The asyncio pattern for slow envs: one task awaits batches while others send the actions of
    # batches they got (when their LLM answers). The awaited call lets go of the pool while it waits.
    import asyncio

    slow = ["--execution", "thread"]
    with openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 1.0}, extra_args=slow) as urls:
        with OpenEnvVectorEnv(urls, 4, batch_size=2, step_timeout=10) as envs:

            async def main() -> list[list[int]]:
                await envs.areset(seed=0)
                envs.send(np.zeros(2, dtype=np.int64), [0, 1])
                first = asyncio.ensure_future(envs.arecv())
                await asyncio.sleep(0.2)  # (the arecv waits on the worker: envs 0 and 1 take 1 s)
                assert not first.done()
                envs.send(np.zeros(2, dtype=np.int64), [2, 3])  # meanwhile, from this task
                batches = [await asyncio.wait_for(first, 20), await asyncio.wait_for(envs.arecv(), 20)]
                assert all(b[1].tolist() == [1.0, 1.0] for b in batches)
                return [sorted(b[4]["env_id"].tolist()) for b in batches]

            assert asyncio.run(asyncio.wait_for(main(), 60)) == [[0, 1], [2, 3]]
            with pytest.raises(RuntimeError, match="in use by another thread"):  # (only sends interleave)

                async def step_while_awaited() -> None:
                    envs.send(np.zeros(2, dtype=np.int64), [0, 1])
                    receiving = asyncio.ensure_future(envs.arecv())
                    await asyncio.sleep(0.2)
                    try:
                        envs.step(np.zeros(4, dtype=np.int64))
                    finally:
                        await asyncio.wait_for(receiving, 20)

                asyncio.run(asyncio.wait_for(step_while_awaited(), 60))


def test_closing_the_pool_while_an_astep_waits_raises_closed_not_invented_truncations():
    import asyncio

    slow = ["--execution", "thread"]
    with openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 1.0}, extra_args=slow) as urls:
        envs = OpenEnvVectorEnv(urls, 2, step_timeout=10)
        envs.reset(seed=0)

        async def main() -> None:
            stepping = asyncio.ensure_future(envs.astep(np.zeros(2, dtype=np.int64)))
            await asyncio.sleep(0.3)  # (the step is under way on the worker: its envs take 1 s)
            envs.close()
            await asyncio.wait_for(stepping, 20)

        with pytest.raises(gym.error.ClosedEnvironmentError, match="closed while it waited"):
            asyncio.run(main())


def test_an_interrupted_recv_of_a_cancelled_arecvs_call_hands_its_envs_on():
    import asyncio
    import signal
    import threading

    slow = ["--execution", "thread"]
    with openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 1.0}, extra_args=slow) as urls:
        with OpenEnvVectorEnv(urls, 4, step_timeout=10) as envs:
            envs.reset(seed=0)
            envs.send(np.zeros(4, dtype=np.int64))

            async def give_up() -> None:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(envs.arecv(), 0.05)  # its call runs on, its envs handed on

            asyncio.run(give_up())
            with pytest.raises(KeyboardInterrupt):
                threading.Timer(0.2, signal.pthread_kill, (threading.get_ident(), signal.SIGINT)).start()
                envs.recv()  # (waits for the handed-on call: its envs take 1 s, the Ctrl-C comes first)
            *_, infos = envs.recv(timeout=10)
            assert sorted(infos["env_id"].tolist()) == [0, 1, 2, 3]


def test_an_arecv_starting_while_a_send_runs_waits_for_it_and_a_send_during_areset_is_refused(fast_cartpole_urls):
    import asyncio

    with OpenEnvVectorEnv(fast_cartpole_urls, 4, batch_size=2, step_timeout=10) as envs:

        async def ping_pong() -> int:
            await envs.areset(seed=0)
            envs.send(np.zeros(2, dtype=np.int64), [0, 1])
            idle, received = [2, 3], 0
            for _ in range(100):
                receiving = asyncio.ensure_future(envs.arecv())
                await asyncio.sleep(0)  # (its call starts on the worker, as this task sends)
                envs.send(np.zeros(2, dtype=np.int64), idle)
                *_, infos = await asyncio.wait_for(receiving, 20)
                idle = infos["env_id"].tolist()
                received += len(idle)
            return received + len((await asyncio.wait_for(envs.arecv(), 20))[4]["env_id"])

        assert asyncio.run(asyncio.wait_for(ping_pong(), 120)) == 202  # every env sent, once

    slow = ["--execution", "thread"]
    with openenv_gym.launch_local("tests.servers.gym_envs:ActionSleep-v0", env_kwargs={"delay": 0.5}, extra_args=slow) as urls:
        with OpenEnvVectorEnv(urls, 4, batch_size=1, step_timeout=10) as envs:

            async def send_during_areset() -> None:
                await envs.areset(seed=0)
                envs.send(np.array([1]), [0])  # env 0: a 0.5 s step, which the next reset waits for
                resetting = asyncio.ensure_future(envs.areset(seed=1))
                await asyncio.sleep(0.1)
                with pytest.raises(RuntimeError, match="in use by another thread"):
                    envs.send(np.array([0]), [1])  # (it would mix with the envs the reset waits for)
                await asyncio.wait_for(resetting, 20)

            asyncio.run(asyncio.wait_for(send_during_areset(), 60))
            assert not envs._batch.pending.any() and envs._batch.ready_count == 0
            envs.send(np.zeros(4, dtype=np.int64))
            assert sorted(int(envs.recv(timeout=10)[4]["env_id"][0]) for _ in range(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("road", ["lockstep", "general"])
def test_a_ctrl_c_while_a_step_goes_out_is_held_until_its_frames_are_sent(fast_cartpole_urls, road):
    # A Ctrl-C that lands as the pool hands a step to a server, after counting the request and
    # before writing it: the request used to stay counted, never sent, and the next wait timed out.
    # Now the interrupt waits for the step's frames to go out; the step's envs come back whole.
    # (step() goes out by the lockstep path, step_async() by the general road.)
    import signal

    with OpenEnvVectorEnv(fast_cartpole_urls, 4, step_timeout=5) as envs:
        envs.reset(seed=0)
        link = envs._core.links[0]
        real = link.step

        def interrupted(*args, **kwargs):
            link.step = real  # (once)
            signal.raise_signal(signal.SIGINT)
            return real(*args, **kwargs)

        link.step = interrupted
        with pytest.raises(KeyboardInterrupt):
            (envs.step if road == "lockstep" else envs.step_async)(np.zeros(4, dtype=np.int64))
        assert link.step is real  # (it was called)
        _, rewards, terminated, truncated, infos = envs.step_wait(timeout=20)
        assert rewards.tolist() == [1.0] * 4 and not truncated.any() and "openenv_error" not in infos
        assert envs.step(np.zeros(4, dtype=np.int64))[1].tolist() == [1.0] * 4
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("absorber", ["absorb_every_env", "absorb"])
def test_a_ctrl_c_while_arrivals_are_absorbed_waits_for_them_and_one_raised_there_costs_a_truncation(
    fast_cartpole_urls, absorber, monkeypatch
):
    # The pool's own bookkeeping, after the loop let go: a Ctrl-C while it writes a server's answer
    # into the batch used to drop that answer, and every later call failed ("awaited with nothing
    # in flight"). It is held until the answers at hand are in. A KeyboardInterrupt raised there
    # anyway (a second Ctrl-C) costs those envs a truncated transition, not the pool.
    import signal

    # (absorb_every_env: a lockstep step's answers, all clean; absorb: one answer, as the general road has them)
    if absorber == "absorb":
        monkeypatch.setattr(PoolCore, "settled", lambda core: False)
    with OpenEnvVectorEnv(fast_cartpole_urls, 4, step_timeout=5) as envs:
        envs.reset(seed=0)
        real = getattr(envs._batch, absorber)

        def signalled(*args):
            setattr(envs._batch, absorber, real)  # (once)
            signal.raise_signal(signal.SIGINT)
            return real(*args)

        setattr(envs._batch, absorber, signalled)
        with pytest.raises(KeyboardInterrupt):
            envs.step(np.zeros(4, dtype=np.int64))
        assert getattr(envs._batch, absorber) is real  # (it was called)
        _, rewards, _, truncated, infos = envs.step_wait(timeout=20)
        assert rewards.tolist() == [1.0] * 4 and not truncated.any() and "openenv_error" not in infos

        def raised(*args):
            setattr(envs._batch, absorber, real)
            raise KeyboardInterrupt

        setattr(envs._batch, absorber, raised)
        with pytest.raises(KeyboardInterrupt):
            envs.step(np.zeros(4, dtype=np.int64))
        start = time.monotonic()
        _, _, _, truncated, infos = envs.step_wait(timeout=20)
        assert time.monotonic() - start < 5
        lost = np.flatnonzero(truncated)
        assert lost.size and all("lost to an interrupt" in infos["openenv_error"]["message"][i] for i in lost)
        for _ in range(2):
            _, _, _, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert not truncated.any() and "openenv_error" not in infos
        envs.reset(seed=1)


def test_a_ctrl_c_after_a_step_handed_its_envs_over_lets_it_return_them_and_the_next_call_raises_it(fast_cartpole_urls):
    # Raised there, it would lose the step's results: the pool counts them handed back already.
    # Dropped, it would make the user press again: the next call raises it before it does anything.
    import signal

    with OpenEnvVectorEnv(fast_cartpole_urls, 4, step_timeout=5) as envs:
        envs.reset(seed=0)
        real = envs._batch.observations

        def signalled():
            envs._batch.observations = real  # (once)
            signal.raise_signal(signal.SIGINT)
            return real()

        envs._batch.observations = signalled
        obs, rewards, *_ = envs.step(np.zeros(4, dtype=np.int64))
        assert obs.shape == (4, 4) and rewards.tolist() == [1.0] * 4
        assert not envs._batch.pending.any()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

        with pytest.raises(KeyboardInterrupt):
            envs.step(np.zeros(4, dtype=np.int64))
        assert not envs._batch.pending.any() and envs._core.in_flight == 0  # nothing was sent
        after, rewards, *_ = envs.step(np.zeros(4, dtype=np.int64))  # owed once only; the pool goes on
        assert rewards.tolist() == [1.0] * 4
        assert not np.array_equal(after, obs)  # (a step from where the first one left the envs)


@pytest.mark.parametrize("road", ["lockstep", "general"])
def test_a_ctrl_c_as_a_handed_over_call_completes_keeps_its_answers(fast_cartpole_urls, road, monkeypatch):
    # The main thread's step is handed to the loop another thread drives; a real Ctrl-C lands as
    # the step's answers are taken. They used to be thrown away with the wait, and the step's envs
    # came back truncated ("lost to an interrupt"); they come back whole.
    import signal

    from openenv_gym.vector import lockstep

    if road == "general":
        monkeypatch.setattr(PoolCore, "settled", lambda core: False)

    slow = ["--execution", "thread"]
    main = threading.get_ident()
    with openenv_gym.launch_local("tests.servers.gym_envs:Slow-v0", env_kwargs={"delay": 3.0}, extra_args=slow) as b:
        with OpenEnvVectorEnv(fast_cartpole_urls, 2, step_timeout=10) as envs, openenv_gym.OpenEnvEnv(b[0], step_timeout=10) as single:
            envs.reset(seed=0)
            single.reset(seed=0)
            io, core = envs._io, envs._core
            # Where the answers are taken: the lane's step finishing, or the core's collect.
            owner, name = (lockstep._Step, "_finish") if road == "lockstep" else (core, "_take_arrivals")
            take = getattr(owner, name)
            landed: list[bool] = []

            def taken(*args):
                held = io._held  # (the main thread's step holds Ctrl-C)
                if threading.get_ident() != main and held is not None and not landed:
                    signal.pthread_kill(main, signal.SIGINT)  # (as the answers are taken, on the other thread)
                    deadline = time.monotonic() + 5
                    while not held.interrupts and time.monotonic() < deadline:  # (the main thread's handler runs)
                        time.sleep(0.001)
                    landed.append(held.interrupts > 0)
                return take(*args)

            other = threading.Thread(target=single.step, args=(0,))
            other.start()
            deadline = time.monotonic() + 10
            while not (io._drive.locked() and not io._daemon_holds):  # (the other thread drives the loop)
                assert time.monotonic() < deadline
                time.sleep(0.001)
            monkeypatch.setattr(owner, name, taken)
            with pytest.raises(KeyboardInterrupt):
                envs.step(np.zeros(2, dtype=np.int64))
            monkeypatch.setattr(owner, name, take)
            assert landed == [True]
            _, rewards, _, truncated, infos = envs.step_wait(timeout=10)
            assert rewards.tolist() == [1.0, 1.0] and not truncated.any() and "openenv_error" not in infos
            other.join(timeout=10)


def test_a_ctrl_c_while_the_pool_closes_waits_for_every_connection_to_close(fast_cartpole_urls):
    # It used to cancel the close half-way: connections left open (their sessions taking the
    # servers' room), and a second close() did nothing.
    import signal

    envs = OpenEnvVectorEnv(fast_cartpole_urls, 4, step_timeout=5)
    envs.reset(seed=0)
    links = list(envs._core.links)
    assert len(links) == 2
    real = links[0].close

    async def interrupted_close() -> None:
        signal.raise_signal(signal.SIGINT)
        await asyncio.sleep(0.05)  # (the close goes on meanwhile: nothing cancels it)
        await real()

    links[0].close = interrupted_close
    with pytest.raises(KeyboardInterrupt):
        envs.close()
    assert all(link._conn.closed for link in links)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _InterruptOnce:
    """A codec whose ``method`` raises KeyboardInterrupt once (as a Ctrl-C landing there), else the real one's."""

    def __init__(self, codec, method: str) -> None:
        self._codec, self._method, self.armed = codec, method, True

    def __getattr__(self, name):
        real = getattr(self._codec, name)
        if name != self._method or not self.armed:
            return real

        def interrupted(*args, **kwargs):
            self.armed = False
            real(*args, **kwargs)
            raise KeyboardInterrupt

        return interrupted


@pytest.mark.parametrize(("where", "cost"), [("encode", "interrupted before it was sent"), ("decode", "ConnectionLost")])
def test_a_keyboard_interrupt_raised_in_the_codec_costs_those_envs_a_truncation_not_a_stall(fast_cartpole_urls, where, cost):
    # Raised inside the codec (a second Ctrl-C is raised where it lands). As a request is encoded:
    # nothing was sent; the request used to stay counted in flight, and the next wait stalled for
    # its timeout (30 s here). Now those envs' step fails, and the connection is kept. As a reply
    # is decoded: the reply is gone, and its request waited out its timeout. Now the connection
    # fails at once, and its envs get new sessions.
    with OpenEnvVectorEnv(fast_cartpole_urls, 4, step_timeout=30) as envs:
        envs.reset(seed=0)
        conn = envs._core.links[0]._conn
        conn._codec = _InterruptOnce(conn._codec, where)
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            envs.step(np.zeros(4, dtype=np.int64))
        _, _, _, truncated, infos = envs.step_wait(timeout=20)
        assert time.monotonic() - start < 10
        cut = np.flatnonzero(truncated)
        errors = infos["openenv_error"]
        assert cut.size and all(cost in f"{errors['type'][i]}: {errors['message'][i]}" for i in cut)
        if where == "encode":
            assert envs._core.links[0]._conn is conn and not conn.closed
        for _ in range(3):  # (the truncated envs are reset by their next step; new sessions after a lost connection)
            *_, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert "openenv_error" not in infos


def test_ctrl_cs_at_random_moments_of_stepping_cost_no_env_and_no_session(fast_cartpole_urls):
    # 120 real SIGINTs, each at a random moment (0-3 ms) into a run of lockstep steps: each one ends
    # the run. The interrupted step's envs all come back whole, at once, and the pool goes on. (A
    # Ctrl-C used to land inside the loop's callbacks: cut frames, lost replies, requests counted
    # and never sent, and then steps that waited out their timeout.)
    import random
    import signal

    main = threading.get_ident()
    rng = random.Random(0)
    kick, fired, stop = threading.Event(), threading.Event(), threading.Event()

    def kicker() -> None:
        while not stop.is_set():
            if kick.wait(0.1):
                kick.clear()
                time.sleep(rng.uniform(0, 0.003))
                signal.pthread_kill(main, signal.SIGINT)
                fired.set()

    thread = threading.Thread(target=kicker, daemon=True)
    thread.start()
    actions = np.zeros(4, dtype=np.int64)
    in_step = 0
    try:
        with OpenEnvVectorEnv(fast_cartpole_urls, 4, step_timeout=30) as envs:
            envs.reset(seed=0)
            for _ in range(120):
                fired.clear()
                kick.set()
                try:
                    for _ in range(10_000):
                        envs.step(actions)
                except KeyboardInterrupt:
                    pass
                assert fired.wait(10)  # (its one signal is in: nothing more arrives this round)
                if envs._batch.pending.any():  # the Ctrl-C came inside a step
                    in_step += 1
                    start = time.monotonic()
                    _, _, _, truncated, infos = envs.step_wait(timeout=20)
                    assert time.monotonic() - start < 10  # (a lost request would wait out its 30 s)
                    assert not truncated.any() and "openenv_error" not in infos
            _, _, _, truncated, infos = envs.step(actions)
            assert not truncated.any() and "openenv_error" not in infos
    finally:
        stop.set()
        thread.join(5)
    assert in_step > 0


def test_a_ctrl_c_in_the_write_of_a_step_neither_hangs_nor_breaks_the_pool(fast_cartpole_urls):
    # A Ctrl-C lands in sock.send as a step's frame goes out (injected there: a real one lands
    # anywhere). The step used to wait forever, or the pool to count that request as in flight for good.
    with OpenEnvVectorEnv(fast_cartpole_urls, 4, step_timeout=5) as envs:
        envs.reset(seed=0)
        link = envs._core.links[0]
        conn = link._conn
        real = conn._send_message

        def interrupted(payload: bytes, text: bool) -> bool:
            conn._send_message = real  # (once)
            real(payload, text)
            raise KeyboardInterrupt

        conn._send_message = interrupted
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            envs.step(np.zeros(4, dtype=np.int64))
        assert time.monotonic() - start < 5
        _, _, _, truncated, infos = envs.step_wait(timeout=20)  # the interrupted step's envs
        cut = np.flatnonzero(truncated)
        assert cut.size and all(infos["openenv_error"]["type"][i] == "ConnectionLost" for i in cut)
        for _ in range(3):  # the envs whose connection was cut get new sessions; all step again
            *_, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert "openenv_error" not in infos
        envs.reset(seed=1)
        assert envs.step(np.zeros(4, dtype=np.int64))[1].tolist() == [1.0] * 4


class _EncodeFailsOnce:
    """A codec whose ``encode`` raises ``TypeError`` once (a value msgpack cannot carry), else the real one's."""

    def __init__(self, codec) -> None:
        self._codec, self.armed = codec, True

    def __getattr__(self, name):
        return getattr(self._codec, name)

    def encode(self, message):
        if self.armed:
            self.armed = False
            raise TypeError("cannot encode this")
        return self._codec.encode(message)


@pytest.mark.parametrize("road", ["lockstep", "general"])
def test_a_step_that_cannot_be_encoded_truncates_that_servers_envs_and_keeps_the_connection(fast_cartpole_urls, road):
    # Nothing was sent: the sessions are fine. The other server's envs step as usual.
    with OpenEnvVectorEnv(fast_cartpole_urls, 4, step_timeout=30) as envs:
        envs.reset(seed=0)
        conn = envs._core.links[0].connection
        conn._codec = _EncodeFailsOnce(conn._codec)
        actions = np.zeros(4, dtype=np.int64)
        if road == "lockstep":
            _, rewards, _, truncated, infos = envs.step(actions)
        else:
            envs.step_async(actions)
            _, rewards, _, truncated, infos = envs.step_wait(timeout=20)
        cut = np.flatnonzero(truncated)
        assert cut.tolist() == envs._core._all[0].tolist()
        assert all("could not be encoded" in infos["openenv_error"]["message"][i] for i in cut)
        assert rewards[~truncated].tolist() == [1.0] * int((~truncated).sum())
        assert envs._core.links[0].connection is conn and not conn.closed
        _, rewards, _, truncated, infos = envs.step(actions)  # (the truncated envs are reset by this step)
        _, rewards, _, truncated, infos = envs.step(actions)
        assert rewards.tolist() == [1.0] * 4 and not truncated.any() and "openenv_error" not in infos


def _partial_resets_side_by_side(remote: OpenEnvVectorEnv, make_local, mode: AutoresetMode, steps: int, seed: int) -> tuple[int, int]:
    """Steps with resets of random envs (random seeds) in between, side by side with SyncVectorEnv; (episodes ended, partial resets)."""
    from gymnasium.vector import SyncVectorEnv

    n = remote.num_envs
    local = SyncVectorEnv([make_local] * n, autoreset_mode=mode)
    rng = np.random.default_rng(seed)
    ended = resets = 0
    try:
        assert_same(remote.reset(seed=seed), local.reset(seed=seed), "reset")
        for t in range(steps):
            if rng.random() < 0.15:  # some envs reset mid-episode (or just after they ended), each with its own seed
                mask = rng.random(n) < 0.4
                mask[rng.integers(n)] = True
                reset_alike(remote, local, mask, f"reset before {t}", [int(s) for s in rng.integers(0, 2**31, n)])
                resets += 1
            want = step_alike(remote, local, rng.integers(0, 2, size=n), f"step {t}")
            done = want[2] | want[3]
            ended += int(done.sum())
            if mode == AutoresetMode.DISABLED and done.any():
                reset_alike(remote, local, done, f"reset at {t}", [int(s) for s in rng.integers(0, 2**31, n)])
    finally:
        remote.close()
        local.close()
    return ended, resets


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("path", ["fast", "stock"])
def test_resets_of_some_envs_between_steps_equal_sync_vector_env(fast_cartpole_urls, stock_cartpole_url, mode, path):
    if path == "fast":
        remote = OpenEnvVectorEnv(fast_cartpole_urls, 6, autoreset_mode=mode)
    else:
        remote = OpenEnvVectorEnv(stock_cartpole_url, 6, autoreset_mode=mode, truncated_key="truncated")
    ended, resets = _partial_resets_side_by_side(remote, lambda: gym.make("CartPole-v1"), mode, steps=200, seed=11)
    assert ended >= 10 and resets >= 15


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_resets_of_some_envs_batch_their_infos_as_sync_vector_env(fast_info_cartpole_urls, mode):
    from tests.servers.gym_envs import InfoCartPole

    remote = OpenEnvVectorEnv(fast_info_cartpole_urls, 4, autoreset_mode=mode)
    ended, resets = _partial_resets_side_by_side(remote, InfoCartPole, mode, steps=120, seed=5)
    assert ended >= 5 and resets >= 8


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("path", ["fast", "stock"])
def test_send_recv_in_random_subsets_steps_each_env_as_its_own_sync_vector_env(fast_cartpole_urls, stock_cartpole_url, mode, path):
    # Whatever order envs come back in and however actions are sent (some envs held back a while),
    # each env's transitions are exactly those of a one-env SyncVectorEnv given its actions.
    from gymnasium.vector import SyncVectorEnv

    n, seed = 7, 21
    rng = np.random.default_rng(seed)
    if path == "fast":
        remote = OpenEnvVectorEnv(fast_cartpole_urls, n, batch_size=3, autoreset_mode=mode)
    else:
        remote = OpenEnvVectorEnv(stock_cartpole_url, n, batch_size=3, autoreset_mode=mode, truncated_key="truncated")
    refs = [SyncVectorEnv([lambda: gym.make("CartPole-v1")], autoreset_mode=mode) for _ in range(n)]
    try:
        obs, _ = remote.reset(seed=seed)
        for i, ref in enumerate(refs):
            assert_same(obs[i], ref.reset(seed=seed + i)[0][0], f"reset of env {i}")
        sent: dict[int, int] = {}  # env -> the action in flight
        held: list[int] = []  # envs whose next action is not sent yet
        ended = returned = 0

        def send(ids: list[int]) -> None:
            actions = rng.integers(0, 2, size=len(ids))
            remote.send(actions, env_ids=ids)
            sent.update(zip(ids, actions.tolist()))

        send(list(range(n)))
        # 400 transitions, and more (up to 2,000) until 10 episodes ended: which envs come back, and so
        # which get the random actions, depends on timing (one CI run saw 9 episode ends in 400).
        while returned < 400 or (ended < 10 and returned < 2000):
            obs, rewards, terminations, truncations, infos = remote.recv(timeout=30)
            for j, i in enumerate(infos["env_id"].tolist()):
                want = refs[i].step(np.array([sent.pop(i)]))
                where = f"env {i}, transition {returned}"
                assert_same(obs[j], want[0][0], where)
                assert (rewards[j], terminations[j], truncations[j]) == (want[1][0], want[2][0], want[3][0]), where
                if mode == AutoresetMode.SAME_STEP and (want[2][0] or want[3][0]):
                    assert infos["_final_obs"][j] and want[4]["_final_obs"][0]
                    assert_same(infos["final_obs"][j], want[4]["final_obs"][0], f"{where} final_obs")
                ended += int(want[2][0] or want[3][0])
                returned += 1
            back = infos["env_id"].tolist()
            keep = [i for i in back if rng.random() < 0.3]  # held back until a later recv
            go = [i for i in back if i not in keep] + held
            held = keep
            if len(sent) + len(go) < remote.batch_size:  # (recv needs batch_size envs in flight)
                go += held
                held = []
            send(go)
        while sent:  # what is still in flight
            for i in remote.recv(timeout=30)[4]["env_id"].tolist():
                del sent[i]
    finally:
        remote.close()
        for ref in refs:
            ref.close()
    assert ended >= 10


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_dict_observations_actions_and_array_infos_match_sync_vector_env(mode):
    # Nested-v0: a Dict observation (Box, Discrete with a start, a Tuple), a Dict action (Box and
    # Discrete), numpy arrays and None in its infos; no episode ends.
    from gymnasium.vector import SyncVectorEnv

    env_id = "tests.servers.gym_envs:Nested-v0"
    with openenv_gym.launch_local(env_id, max_sessions=8) as urls:
        local = SyncVectorEnv([lambda: gym.make(env_id)] * 3, autoreset_mode=mode)
        with OpenEnvVectorEnv(urls, 3, autoreset_mode=mode) as remote:
            assert remote.single_observation_space == local.single_observation_space
            assert remote.single_action_space == local.single_action_space
            assert_same(remote.reset(seed=4), local.reset(seed=4), "reset")
            local.action_space.seed(4)
            for t in range(30):
                step_alike(remote, local, local.action_space.sample(), f"step {t}")
        local.close()
