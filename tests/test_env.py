"""OpenEnvEnv against real stock OpenEnv servers: Gymnasium semantics, spaces, registration."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import openenv_gym
from openenv_gym import ConnectError, ConnectionLost, OpenEnvEnv, OpenEnvVectorEnv, ServerError, SessionTimeout
from openenv_gym.spaces import SpaceMappingError, UnicodeText
from tests.servers.launch import forked_launch, free_port


def actions_for(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 2, size=n).tolist()


@pytest.fixture
def cartpole(stock_cartpole_url):
    env = OpenEnvEnv(stock_cartpole_url, truncated_key="truncated")
    yield env
    env.close()


def test_spaces_come_from_the_stock_schema(cartpole):
    assert cartpole.codec == "json"
    assert cartpole.action_space == spaces.Discrete(2)
    space = cartpole.observation_space
    assert isinstance(space, spaces.Box)
    assert space.shape == (4,) and space.dtype == np.float32


@pytest.mark.parametrize("seed", [0, 42])
def test_remote_cartpole_episode_equals_local_cartpole(cartpole, seed):
    local = gym.make("CartPole-v1")
    obs, info = cartpole.reset(seed=seed)
    expected, _ = local.reset(seed=seed)
    assert obs.dtype == expected.dtype and obs.tobytes() == expected.tobytes()
    steps = 0
    for action in actions_for(seed, 600):
        got = cartpole.step(action)
        want = local.step(action)
        steps += 1
        assert got[0].tobytes() == want[0].tobytes()
        assert got[1:4] == want[1:4]
        assert isinstance(got[1], float) and type(got[2]) is bool and type(got[3]) is bool
        if want[2] or want[3]:
            break
    assert steps > 5  # an episode actually ended


def test_truncation_is_reported_through_truncated_key(cartpole):
    # A simple balancing policy keeps the pole up until the 500-step time limit.
    local = gym.make("CartPole-v1")
    cartpole.reset(seed=1)
    obs, _ = local.reset(seed=1)
    for _ in range(500):
        action = int(obs[2] + obs[3] > 0)
        obs, r, term, trunc, _ = local.step(action)
        got = cartpole.step(action)
        assert got[2:4] == (term, trunc)
        if term or trunc:
            break
    assert trunc and not term


def test_without_truncated_key_done_means_terminated(stock_cartpole_url):
    with OpenEnvEnv(stock_cartpole_url) as env:
        env.reset(seed=0)
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(1)
            done = terminated or truncated
        assert terminated and not truncated
        assert info == {}  # CartPole's info, carried as the server's metadata


def test_observations_are_new_arrays_each_call(cartpole):
    first, _ = cartpole.reset(seed=0)
    second = cartpole.step(0)[0]
    assert not np.shares_memory(first, second)
    first[:] = 99  # writable, and the env does not care
    assert cartpole.step(0)[0][0] != 99


def test_check_env_passes(stock_cartpole_url):
    env = gym.make("openenv_gym/Remote-v0", base_url=stock_cartpole_url, truncated_key="truncated")
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_action_outside_the_space_is_refused_before_sending(cartpole):
    cartpole.reset(seed=0)
    with pytest.raises(ValueError, match="not in the action space"):
        cartpole.step(2)
    assert cartpole.state()["step_count"] == 0  # nothing reached the server


def test_close_is_idempotent(stock_cartpole_url):
    env = OpenEnvEnv(stock_cartpole_url)
    env.reset()
    env.close()
    env.close()
    assert env.codec is None
    with pytest.raises(gym.error.ClosedEnvironmentError):
        env.reset()


# ------------------------------------------------------------------ mixed types


def test_mixed_schema_maps_to_exact_spaces(stock_mixed_url):
    with OpenEnvEnv(stock_mixed_url) as env:
        assert env.action_space == spaces.Discrete(3)
        space = env.observation_space
        assert isinstance(space, spaces.Dict)
        assert list(space.keys()) == ["energy", "label", "position", "velocity"]
        assert space["position"] == spaces.Discrete(11, start=0)
        assert space["energy"] == spaces.Box(0.0, 1.0, (), np.float32)
        assert isinstance(space["label"], spaces.Text)
        assert space["velocity"].shape == (2,) and space["velocity"].dtype == np.float32


def test_mixed_actions_sampled_from_the_space_are_accepted(stock_mixed_url):
    with OpenEnvEnv(stock_mixed_url) as env:
        env.action_space.seed(5)
        obs, _ = env.reset(seed=5)
        assert obs in env.observation_space
        for _ in range(25):
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            assert obs in env.observation_space
            assert info["step"] >= 1
            if terminated:
                break
        assert terminated and info["step"] == 20


def test_enum_actions_are_sent_as_their_values(stock_mixed_url):
    with OpenEnvEnv(stock_mixed_url) as env:
        obs, _ = env.reset(seed=0)
        start = int(obs["position"])
        # enum ["left", "right", "stay"]: index 1 is "right"
        obs, *_ = env.step(1)
        assert obs["label"].startswith("right")
        assert int(obs["position"]) == min(start + 1, 10)


def test_obs_key_selects_one_field(stock_mixed_url):
    with OpenEnvEnv(stock_mixed_url, obs_key="velocity") as env:
        assert env.observation_space.shape == (2,)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2,)


def test_explicit_spaces_win(stock_mixed_url):
    box = spaces.Box(-10, 10, (2,), np.float64)
    with OpenEnvEnv(stock_mixed_url, observation_space=box, obs_key="velocity") as env:
        assert env.observation_space is box
        obs, _ = env.reset(seed=0)
        assert obs.dtype == np.float64 and obs in box


def test_unmappable_field_names_the_field_and_the_fix(stock_mixed_url):
    with pytest.raises(SpaceMappingError) as info:
        OpenEnvEnv(stock_mixed_url, observation_space=spaces.Box(0, 1, (2,)))
    assert "obs_key=" in str(info.value)


# ------------------------------------------------------------------ failures surface as types


def test_unreachable_server_fails_at_construction():
    started = time.monotonic()
    with pytest.raises(ConnectError):
        OpenEnvEnv(f"http://127.0.0.1:{free_port()}", connect_timeout=2.0)
    assert time.monotonic() - started < 2.0 + 1.0


def test_step_timeout_then_reset_opens_a_new_session(stock_slow_url):
    with OpenEnvEnv(stock_slow_url, step_timeout=0.5) as env:
        env.reset(seed=0)
        with pytest.raises(SessionTimeout):
            env.step(0)
        with pytest.raises(ConnectionLost, match="call reset"):
            env.step(0)
        # state() neither: a new session's state is not this episode's, and a step after it
        # would play an env that was never reset.
        with pytest.raises(ConnectionLost, match="call reset"):
            env.state()
        with pytest.raises(ConnectionLost, match="call reset"):
            env.step(0)
        obs, _ = env.reset(seed=0)  # a fresh session
        assert env.state()["step_count"] == 0
        assert obs in env.observation_space


def test_server_refusal_is_a_server_error(stock_cartpole_url):
    with OpenEnvEnv(stock_cartpole_url) as env:
        with pytest.raises(ServerError, match="EXECUTION_ERROR"):
            env.step(0)  # gymnasium's CartPole refuses a step before reset
        obs, _ = env.reset(seed=0)
        assert env.step(0)[1] == 1.0


# ------------------------------------------------------------------ registration


def test_remote_id_is_registered_on_import():
    assert openenv_gym.REMOTE_ID in gym.registry


def test_register_remote_makes_a_named_env(stock_cartpole_url):
    openenv_gym.register_remote("openenv_test/CartPole-v1", stock_cartpole_url, max_episode_steps=10, truncated_key="truncated")
    env = gym.make("openenv_test/CartPole-v1")
    try:
        assert isinstance(env.unwrapped, OpenEnvEnv)
        assert env.spec.max_episode_steps == 10
        env.reset(seed=0)
        for step in range(10):
            _, _, terminated, truncated, _ = env.step(step % 2)
        assert truncated and not terminated  # TimeLimit cut it
    finally:
        env.close()


def test_a_list_of_servers_is_for_make_vec_and_make_says_it_needs_one(fast_cartpole_urls):
    with pytest.raises(TypeError, match="one server's base URL, a str; got list .*OpenEnvVectorEnv"):
        OpenEnvEnv(fast_cartpole_urls)  # (before: AttributeError: 'list' object has no attribute 'strip')
    openenv_gym.register_remote("openenv_test/Fleet-v1", fast_cartpole_urls)
    with pytest.raises(TypeError, match="one server's base URL"):
        gym.make("openenv_test/Fleet-v1")
    with gym.make("openenv_test/Fleet-v1", base_url=fast_cartpole_urls[1]) as env:
        assert env.reset(seed=0)[0] in env.observation_space
    with gym.make_vec("openenv_test/Fleet-v1", num_envs=4) as envs:
        envs.reset(seed=0)
        assert envs.unwrapped._core.sessions_per_link() == [2, 2]


def test_a_reset_observation_model_of_its_own_reads_the_missing_fields_as_null(stock_guess_url):
    # OpenEnv's reset_observation_cls: /schema publishes it; a reset lacks the step model's fields.
    # The fields only the reset model has (a task's rules) are in the reset's info, as received.
    with OpenEnvEnv(stock_guess_url) as env:
        obs, info = env.reset(seed=3)
        assert obs["feedback"] == "" and obs["tries"] == 0 and obs["prompt"] == "guess a digit"
        assert env.observation_space.contains(obs) and "rules" not in obs
        assert info["rules"] == "one digit, 0 to 9"
        obs, reward, terminated, _, info = env.step(0)  # the one action field: Discrete(10)
        assert obs["tries"] == 1 and obs["feedback"] in ("right", "higher")
        assert env.observation_space.contains(obs) and "rules" not in info
    with OpenEnvVectorEnv(stock_guess_url, 2) as envs:
        obs, infos = envs.reset(seed=[3, 4])
        assert infos["rules"].tolist() == ["one digit, 0 to 9"] * 2 and infos["_rules"].all()
        obs, _, _, _, infos = envs.step(np.array([0, 0]))
        assert (obs["tries"] == 1).all() and not infos.get("_rules", np.zeros(2, bool)).any()


def test_a_float_action_reaches_the_env_as_given_and_its_bounds_are_in_the_space(stock_dial_url):
    # Action numbers are float64 Boxes: as float32, le=0.3 was 0.29999998 (an action of 0.3 refused
    # before sending, though the server takes it) and 0.2 reached the env as 0.20000000298.
    with OpenEnvEnv(stock_dial_url) as env:
        assert env.action_space == gym.spaces.Box(0.1, 0.3, (), np.float64)
        env.reset(seed=0)
        obs, reward, *_ = env.step(np.float64(0.3))
        assert reward == 1.0 and float(obs) == np.float32(0.3)
        assert float(env.step(np.array(0.2))[0]) == np.float32(0.2)
        assert env.step(np.float32(0.25))[1] == 0.0  # float32 actions are taken too (widened exactly)
    with OpenEnvVectorEnv(stock_dial_url, 2) as envs:
        envs.reset(seed=0)
        _, rewards, *_ = envs.step(np.array([0.3, 0.1]))
        assert rewards.tolist() == [1.0, 0.0]


def test_a_seed_in_reset_options_is_refused_clearly(stock_cartpole_url):
    with OpenEnvEnv(stock_cartpole_url) as env:
        with pytest.raises(ValueError, match="reset\\(seed="):
            env.reset(options={"seed": 3})


def test_reset_after_the_stock_server_restarted_opens_a_fresh_session_at_once():
    from tests.servers.launch import ServerProcess, free_port

    port = free_port()
    server = ServerProcess("cartpole", max_sessions=2, port=port).start_healthy(timeout=60)
    try:
        env = OpenEnvEnv(server.url)
        env.reset(seed=0)
        env.step(0)
        server.stop()  # the server closes our connection
        env._io.run(env._session._stock.wait_closed(), timeout=10)
        server = ServerProcess("cartpole", max_sessions=2, port=port).start_healthy(timeout=60)
        obs, _ = env.reset(seed=1)  # not a ConnectionLost from the dead socket first
        assert obs in env.observation_space
        env.close()
    finally:
        server.stop()


def test_register_remote_refuses_an_ssl_context_it_could_not_copy():
    import ssl

    with pytest.raises(ValueError, match="gymnasium.make"):
        openenv_gym.register_remote("test/NoSSL-v0", "https://127.0.0.1:1", ssl=ssl.create_default_context())
    assert "test/NoSSL-v0" not in gym.registry


UNICODE_MESSAGES = ["café", "“quoted” — and a dash", "naïve 🙂 ✓", "日本語", ""]


def _echo_each(env, messages):
    for message in messages:
        assert env.action_space.contains(message)
        obs, reward, _, _, _ = env.step(message)
        assert obs["echoed"] == message and obs["length"] == len(message) and reward == len(message)
        assert env.observation_space.contains(obs)
        env.reset()


def test_text_actions_and_observations_hold_any_unicode_on_a_stock_server(stock_echo_url):
    # A pydantic `str` maps to UnicodeText: an LLM's text (accents, curly quotes, emoji) is an action.
    with OpenEnvEnv(stock_echo_url) as env:
        assert isinstance(env.action_space, UnicodeText)
        env.reset()
        _echo_each(env, UNICODE_MESSAGES)
        assert not env.action_space.contains("\ud800")  # a lone surrogate cannot be sent
        with pytest.raises(ValueError, match="action space") as refused:
            env.step("\ud800" * 5000)
        assert len(str(refused.value)) < 300  # the action is shown shortened
        # No maxLength in the schema: no limit (a program, a page), yet samples stay short.
        _echo_each(env, ["x" * 100_000])
        assert all(len(env.action_space.sample()) <= 4096 for _ in range(20))


def test_text_actions_hold_any_unicode_on_the_fast_path():
    with forked_launch("tests.servers.stock_envs:EchoEnvironment", max_sessions=2) as (url,):
        with OpenEnvEnv(url) as env:
            assert env.codec == "msgpack"
            env.reset()
            _echo_each(env, UNICODE_MESSAGES)


def test_a_chat_style_env_maps_lists_to_sequences_and_free_form_fields_to_info(stock_arena_url):
    # OpenEnv's TextArena models: messages: List[Message], legal_players: List[int], info: Dict[str, Any].
    with OpenEnvEnv(stock_arena_url) as env:
        space = env.observation_space
        assert isinstance(space["messages"], spaces.Sequence) and isinstance(space["messages"].feature_space, spaces.Dict)
        assert "info" not in space.spaces  # free-form: no space holds it
        obs, info = env.reset()
        assert obs["messages"] == () and obs["prompt"] == "say hello" and info["info"] == {"turn": 0}
        assert space.contains(obs)
        obs, reward, terminated, _, info = env.step("hello")
        assert reward == 1.0 and not terminated
        assert [m["content"] for m in obs["messages"]] == ["hello", "you said hello"]
        assert info["info"] == {"turn": 1, "detail": {"said": ["hello"]}}
        obs, _, _, _, info = env.step("¡hola! 🙂")
        assert len(obs["messages"]) == 4 and obs["messages"][3]["content"] == "you said ¡hola! 🙂"
        assert space.contains(obs) and info["info"]["turn"] == 2


def test_a_tool_call_sends_its_free_form_arguments(stock_tools_url):
    # Shaped as OpenEnv's MCP CallToolAction: type (a tag with a default), tool_name, arguments: Dict[str, Any].
    with forked_launch("tests.servers.stock_envs:ToolEnvironment", max_sessions=2) as (fast_url,):
        for url in (stock_tools_url, fast_url):
            with OpenEnvEnv(url) as env:
                assert set(env.action_space.spaces) == {"tool_name", "arguments"}  # the tag is left to the server
                assert isinstance(env.action_space["arguments"], openenv_gym.JsonText)
                env.reset()
                obs, reward, _, _, info = env.step({"tool_name": "add", "arguments": '{"a": 2, "b": 3}'})
                assert reward == 1.0 and info["result"] == 5 and obs["error"] == ""
                assert type(info["result"]) is int  # plain JSON values on both paths (not a numpy scalar)
                _, _, _, _, info = env.step({"tool_name": "upper", "arguments": '{"text": "ça va"}'})
                assert info["result"] == {"text": "ÇA VA"}
                obs, reward, _, _, _ = env.step(env.action_space.sample())  # a random tool name, arguments "{}"
                assert reward == 0.0 and obs["error"].startswith("no tool")
                with pytest.raises(ValueError, match="not JSON text"):
                    env.step({"tool_name": "add", "arguments": "{a: 2"})


def test_a_list_that_outgrows_the_first_observation_names_the_fix(stock_moves_url):
    with OpenEnvEnv(stock_moves_url) as env:
        env.reset(seed=0)
        with pytest.raises(SpaceMappingError, match="Sequence"):
            env.step(0)
    varying = spaces.Sequence(spaces.Box(0, 3, (), np.int64), stack=False)
    with OpenEnvEnv(stock_moves_url, observation_space=varying) as env:
        obs, _ = env.reset(seed=0)
        assert len(obs) == 4
        obs, reward, _, _, _ = env.step(2)
        assert [int(m) for m in obs] == [0, 1, 3] and reward == 1.0 and env.observation_space.contains(obs)


def test_variable_fields_make_a_varying_list_a_sequence(stock_moves_url):
    with OpenEnvEnv(stock_moves_url, variable_fields=("legal",)) as env:
        assert isinstance(env.observation_space, spaces.Sequence)
        obs, _ = env.reset(seed=0)
        obs, reward, _, _, _ = env.step(1)
        assert [int(m) for m in obs] == [0, 2, 3] and reward == 1.0 and env.observation_space.contains(obs)
    with pytest.raises(SpaceMappingError, match="variable_fields"):
        OpenEnvEnv(stock_moves_url, variable_fields=("nope",))


def test_variable_fields_need_a_space_built_from_the_schema(stock_moves_url):
    with pytest.raises(ValueError, match="variable_fields"):
        OpenEnvEnv(stock_moves_url, variable_fields=("legal",), observation_space=spaces.Sequence(spaces.Discrete(4)))


def test_list_bounds_unions_aliases_and_an_optional_truncated_flag(stock_form_url):
    # FormAction: words: List[str] (1 to 2 items), value: Union[int, str]; FormObservation: board_size
    # (alias boardSize, sent as board_size), truncated: Optional[bool] (true when the 3rd step cuts the episode).
    with forked_launch("tests.servers.stock_envs:FormEnvironment", max_sessions=4) as ours:
        for url in (stock_form_url, ours[0]):
            with openenv_gym.OpenEnvEnv(url) as env:
                words = env.action_space["words"]
                assert isinstance(words, openenv_gym.BoundedSequence) and (words.min_length, words.max_length) == (1, 2)
                assert not env.action_space.contains({"words": ("a", "b", "c"), "value": "0"})
                assert env.action_space["value"].sample() == "0"  # a value the union takes (null is not one)
                assert set(env.observation_space.spaces) == {"boardSize", "last_value"}  # truncated: the flag
                env.action_space.seed(0)
                env.reset(seed=0)
                for step in range(1, 3 * 4 + 1):  # four episodes of sampled actions, every one accepted
                    action = env.action_space.sample()
                    obs, _, terminated, truncated, _ = env.step(action)
                    assert obs["boardSize"] == len(action["words"]) and obs["last_value"] == "0"
                    assert (terminated, truncated) == (False, step % 3 == 0)
                    if truncated:
                        env.reset()
            with openenv_gym.OpenEnvVectorEnv(url, 2) as envs:  # the same in the pool
                envs.action_space.seed(1)
                envs.reset(seed=0)
                for step in range(1, 4):
                    actions = envs.action_space.sample()
                    obs, _, terminated, truncated, _ = envs.step(actions)
                    assert obs["boardSize"].tolist() == [len(w) for w in actions["words"]]
                    assert not terminated.any() and truncated.tolist() == [step == 3] * 2


def test_make_passes_render_mode_none_and_tls_needs_an_https_url(stock_cartpole_url):
    import ssl

    env = gym.make("openenv_gym/Remote-v0", base_url=stock_cartpole_url, render_mode=None)
    assert env.render_mode is None
    env.reset(seed=0)
    with pytest.warns(UserWarning, match="remote envs do not render"):
        assert env.render() is None  # (as a local env made with render_mode=None; was a bare NotImplementedError)
    env.close()
    with pytest.raises(ValueError, match="do not render"):
        OpenEnvEnv(stock_cartpole_url, render_mode="rgb_array")
    with pytest.raises(ConnectError, match="https://"):  # (was an empty error from a TLS hello to a plain server)
        OpenEnvEnv(stock_cartpole_url, ssl=ssl.create_default_context())
    envs = gym.make_vec(
        "openenv_gym/Remote-v0", num_envs=2, vectorization_mode="vector_entry_point", base_url=stock_cartpole_url, disable_env_checker=True
    )
    envs.close()
