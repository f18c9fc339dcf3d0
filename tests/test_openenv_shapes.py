"""OpenEnv's own envs, as they are shaped, work with the URL alone (or with the one override ``check`` finds).

Each stand-in (``tests/servers/shaped_envs.py``) has the shape of one of the
envs in huggingface/OpenEnv's ``envs/`` folder where the library once
stopped short; each is driven here with defaults, through ``OpenEnvEnv``,
``check_env`` and ``OpenEnvVectorEnv``, on a stock OpenEnv server.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import openenv_gym
from openenv_gym import CapacityError, OpenEnvEnv, OpenEnvVectorEnv, SpaceMappingError
from openenv_gym.check import check

STANDALONE = Path(__file__).parent / "servers" / "standalone"


def _play(env: gym.Env, steps: int, seed: int = 0) -> int:
    """``steps`` random steps (masked where the env lists its legal actions); the episodes ended."""
    env.action_space.seed(seed)
    obs, info = env.reset(seed=seed)
    ended = 0
    for _ in range(steps):
        assert env.observation_space.contains(obs)
        mask = info.get("action_mask")
        obs, _, terminated, truncated, info = env.step(
            env.action_space.sample(mask=mask) if mask is not None else env.action_space.sample()
        )
        if terminated or truncated:
            ended += 1
            obs, info = env.reset()
    return ended


def _pool_errors(envs: OpenEnvVectorEnv, steps: int, seed: int = 0) -> int:
    """Env-steps of ``steps`` random pool steps truncated with ``info["openenv_error"]``."""
    envs.action_space.seed(seed)
    _, infos = envs.reset(seed=seed)
    errors = 0
    for _ in range(steps):
        mask = infos.get("action_mask")
        actions = envs.action_space.sample(mask=tuple(mask)) if mask is not None else envs.action_space.sample()
        _, _, _, _, infos = envs.step(actions)
        errors += int(infos.get("_openenv_error", np.zeros(1, bool)).sum())
    return errors


def test_legal_actions_bound_an_integer_with_no_range_and_are_an_action_mask(stock_grid_url):
    # maze's shape: `move: int` (no ge/le), `legal_actions: List[int]` of 1 to 4 moves, [] at the end.
    with OpenEnvEnv(stock_grid_url) as env:
        assert env.action_space == spaces.Discrete(4)  # 1 + the largest legal action at reset ([1, 3])
        assert env.observation_space == spaces.Box(-np.inf, np.inf, (2,), np.int64)  # legal_actions: in info
        obs, info = env.reset(seed=0)
        assert obs.tolist() == [0, 0] and info["legal_actions"] == [1, 3]
        assert info["action_mask"].dtype == np.int8 and info["action_mask"].tolist() == [0, 1, 0, 1]
        obs, reward, _, _, info = env.step(3)  # right
        assert obs.tolist() == [1, 0] and reward == pytest.approx(-0.1) and info["action_mask"].tolist() == [0, 1, 1, 1]
        assert _play(env, 50) >= 1
        check_env(env.unwrapped, skip_render_check=True)


def test_a_pool_of_the_legal_actions_env_steps_with_its_batched_action_masks(stock_grid_url):
    with OpenEnvVectorEnv(stock_grid_url, 8) as envs:
        assert envs.single_action_space == spaces.Discrete(4)
        _, infos = envs.reset(seed=0)
        assert infos["action_mask"].shape == (8, 4) and infos["action_mask"].dtype == np.int8
        assert infos["action_mask"].tolist() == [[0, 1, 0, 1]] * 8
        assert _pool_errors(envs, 30) == 0


def test_a_list_empty_at_reset_is_a_sequence_and_an_integer_with_no_range_is_never_sampled(stock_tokens_url):
    # chat's shape: `tokens: list[int]` in (no range), `tokens: list[int]` out, [] at reset.
    with OpenEnvEnv(stock_tokens_url) as env:
        assert isinstance(env.observation_space, spaces.Sequence)
        assert isinstance(env.action_space, openenv_gym.UnsizedSequence)
        with pytest.raises(SpaceMappingError, match="action_space=.*openenv-gym check"):
            env.action_space.sample()  # (never a random token id the env refuses)
        obs, _ = env.reset(seed=0)
        assert obs == ()
        obs, reward, _, _, _ = env.step((104, 105))  # the user's own action is sent
        assert [int(t) for t in obs] == [104, 105] and reward == 2.0
        obs, *_ = env.step((33,))
        assert [int(t) for t in obs] == [104, 105, 33] and env.observation_space.contains(obs)
    given = openenv_gym.BoundedSequence(spaces.Box(32, 126, (), np.int64), min_length=1, max_length=4)
    with OpenEnvEnv(stock_tokens_url, action_space=given) as env:
        assert _play(env, 50) >= 10
        check_env(env.unwrapped, skip_render_check=True)
    with OpenEnvVectorEnv(stock_tokens_url, 8, action_space=given) as envs:
        assert _pool_errors(envs, 30) == 0
    with OpenEnvVectorEnv(stock_tokens_url, 2) as envs:
        with pytest.raises(SpaceMappingError):
            envs.action_space.sample()  # (a batch refuses too)


def test_a_map_of_number_lists_is_a_dict_of_boxes_and_an_action_spec_in_the_state_sizes_the_action(stock_control_url):
    # dm_control's shape: `observations: Dict[str, List[float]]`, `pixels: Optional[str]` (null), `values: List[float]`,
    # and its state's action_spec (a dm_env BoundedArray: shape [1], minimum [-1], maximum [1]).
    force = spaces.Box(-1.0, 1.0, (1,), np.float64)
    with OpenEnvEnv(stock_control_url) as env:
        observations = spaces.Dict(
            position=spaces.Box(-np.inf, np.inf, (3,), np.float32), velocity=spaces.Box(-np.inf, np.inf, (2,), np.float32)
        )
        assert env.observation_space == spaces.Dict(observations=observations, pixels=openenv_gym.UnicodeText(2**31 - 1))
        assert env.action_space == force
        obs, _ = env.reset(seed=5)
        assert obs["observations"]["position"].tolist() == pytest.approx([0.5, np.cos(0.125), np.sin(0.125)])
        assert _play(env, 50) == 5
        check_env(env.unwrapped, skip_render_check=True)
    with OpenEnvVectorEnv(stock_control_url, 8) as envs:
        assert envs.single_action_space == force
        assert _pool_errors(envs, 30) == 0


def test_an_action_list_nothing_sizes_is_never_sampled_and_check_finds_its_length():
    with openenv_gym.launch_local("server.app:blind_control_app", app_dir=STANDALONE, environ={"MAX_CONCURRENT_ENVS": "4"}) as (url,):
        with OpenEnvEnv(url) as env:
            assert isinstance(env.action_space, openenv_gym.UnsizedSequence)
            with pytest.raises(SpaceMappingError, match="list of numbers whose schema gives no length"):
                env.action_space.sample()
        report = check(url, steps=20, num_envs=2, pool_steps=5)
        assert report.ok and report.overrides == {"action_space": "gymnasium.spaces.Box(-1, 1, (1,), numpy.float64)"}


def test_a_required_field_missing_at_reset_reads_as_null_and_a_null_enum_is_not_its_first_value(stock_mcp_url):
    # echo's shape: CallToolObservation (tool_name required, result: Any, error: Optional[ToolError]); reset: a bare Observation.
    with OpenEnvEnv(stock_mcp_url) as env:
        error_types = env.observation_space["error"]["error_type"]
        assert error_types == spaces.Discrete(6)  # MCP's five error types, and null
        obs, info = env.reset(seed=0)
        assert obs["tool_name"] == "" and obs["error"]["error_type"] == 5 and info == {}
        obs, _, _, _, info = env.step({"tool_name": "add", "arguments": json.dumps({"a": 2, "b": 3})})
        assert obs["tool_name"] == "add" and obs["error"]["error_type"] == 5  # success: no error
        assert info["result"]["structured_content"] == {"result": 5}  # the tool's result, in info
        obs, _, _, _, info = env.step({"tool_name": "nope", "arguments": "{}"})
        assert obs["error"]["error_type"] == 3 and "nope" in obs["error"]["message"]  # tool_not_found
        assert sorted(t.name for t in env.list_tools()) == ["add", "opened"]
        assert env.list_tools()[0].input_schema["type"] == "object"
        assert _play(env, 50) == 0
        check_env(env.unwrapped, skip_render_check=True)
    with OpenEnvVectorEnv(stock_mcp_url, 8) as envs:
        assert _pool_errors(envs, 30) == 0
        assert sorted(t.name for t in envs.list_tools()) == ["add", "opened"]


def test_obs_key_keeps_the_other_fields_in_info(stock_mcp_url):
    with OpenEnvEnv(stock_mcp_url, obs_key="tool_name") as env:
        assert env.observation_space == openenv_gym.UnicodeText(2**31 - 1)
        env.reset()
        obs, _, _, _, info = env.step({"tool_name": "nope", "arguments": "{}"})
        assert obs == "nope" and info["error"]["error_type"] == "tool_not_found"  # (as received)


def test_an_integer_with_no_range_and_nothing_to_bound_it_is_found_by_check(stock_turn_url):
    # snake's shape: `action: int`, no legal actions.
    with OpenEnvEnv(stock_turn_url) as env:
        assert isinstance(env.action_space, openenv_gym.UnboundedInteger)
        with pytest.raises(SpaceMappingError, match="action field 'action'"):
            env.action_space.sample()
    report = check(stock_turn_url, steps=20, num_envs=4, pool_steps=10)
    assert report.ok and report.overrides == {"action_space": "gymnasium.spaces.Discrete(3)"}
    assert [f.name for f in report.findings if not f.ok] == []
    with OpenEnvEnv(stock_turn_url, action_space=spaces.Discrete(3)) as env:
        check_env(env.unwrapped, skip_render_check=True)


def test_check_reports_where_each_field_went_and_passes_a_good_env_with_no_override(stock_grid_url):
    report = check(stock_grid_url, steps=20, num_envs=4, pool_steps=10)
    assert report.ok and report.overrides == {} and report.protocol == "stock"
    goes = {(f["role"], f["field"]): f["goes"] for f in report.fields}
    assert goes[("observation", "legal_actions")] == "info" and goes[("observation", "position")] == "observation"
    assert goes[("observation", "reward")] == "reward" and goes[("action", "move")] == "action"
    assert json.loads(json.dumps(report.to_json()))["ok"] is True
    assert "OK" in report.text().splitlines()[-1]


def test_check_finds_the_range_of_a_list_of_token_ids_and_the_hole_in_it(stock_tokens_url):
    # Code points: 0 to 0x10FFFF, but a surrogate (0xD800-0xDFFF) is refused; a random one, once sampled, ends the range below.
    report = check(stock_tokens_url, steps=50, num_envs=8, pool_steps=30)
    assert report.ok, report.text()
    assert report.overrides == {
        "action_space": "openenv_gym.BoundedSequence(gymnasium.spaces.Box(0, 55295, (), numpy.int64), min_length=1, max_length=16)"
    }


def test_the_check_command_exits_non_zero_when_a_check_fails(stock_turn_url, capsys):
    from openenv_gym.cli import main

    assert main(["check", stock_turn_url, "--no-probe", "--json", "--steps", "5", "--envs", "0"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and any("no range" in f["detail"] for f in report["findings"])


def test_a_stock_app_as_shipped_is_served_from_its_folder_and_its_one_session_limit_is_named():
    # OpenEnv's apps allow one session a server (create_app's default): the pool says so before it steps.
    with openenv_gym.launch_local("server.app:app", app_dir=STANDALONE, servers=2) as urls:
        with OpenEnvEnv(urls[0]) as env:
            assert env.action_space == spaces.Discrete(4)
        with pytest.raises(CapacityError, match="room for 2.*start more servers.*raise their session limit") as caught:
            OpenEnvVectorEnv(urls, 3)
        assert "MAX_CONCURRENT_ENVS" in str(caught.value)
        with OpenEnvVectorEnv(urls, 2) as envs:  # (a server per env)
            assert _pool_errors(envs, 10) == 0


def test_a_stock_app_that_reads_its_session_limit_from_the_environment_takes_a_pool():
    with openenv_gym.launch_local("server.app:turn_app", app_dir=STANDALONE, environ={"MAX_CONCURRENT_ENVS": "4"}) as (url,):
        with OpenEnvVectorEnv(url, 4, action_space=spaces.Discrete(3)) as envs:
            assert _pool_errors(envs, 10) == 0


def test_serve_starts_copies_of_a_stock_app_from_its_folder_and_stops_them_on_sigterm():
    import signal
    import subprocess
    import sys

    import httpx

    serve = subprocess.Popen(
        [sys.executable, "-m", "openenv_gym.cli", "serve", "server.app:app", "--app-dir", str(STANDALONE), "--port", "0", "--copies", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        urls = [serve.stdout.readline().strip() for _ in range(2)]  # (printed once every copy answers /health)
        assert all(url.startswith("http://127.0.0.1:") for url in urls) and len(set(urls)) == 2, (
            serve.stderr.read() if serve.poll() else urls
        )
        for url in urls:
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        with OpenEnvVectorEnv(urls, 2) as envs:  # (one session a copy, as shipped)
            assert envs.single_action_space == spaces.Discrete(4)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
        for url in urls:
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"{url}/health", timeout=2)
    finally:
        serve.kill()
        serve.wait(timeout=30)


def test_serve_refuses_options_a_stock_app_cannot_take():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "openenv_gym.cli", "serve", "server.app:app", "--app-dir", str(STANDALONE), "--token", "x" * 32],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "served as it is" in done.stderr and "module:EnvironmentClass" in done.stderr
