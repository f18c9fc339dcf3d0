"""Gymnasium envs with ``Sequence`` spaces served by ``openenv-gym serve`` and driven by both envs."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs

from openenv_gym import OpenEnvEnv, OpenEnvVectorEnv, ServerError, Session, launch_local
from openenv_gym.server.hosting.values import ActionError, action_from_wire
from openenv_gym.spaces import SpaceMappingError, describe_space, space_from_description

HAND = "tests.servers.gym_envs:Hand-v0"
TIMEOUT = 20.0
# Discards, as positions in the hand; () draws a card.
ACTIONS = [(), (0,), (), (1, 2), (), (), (0, 5), (), (3,), ()]


@pytest.fixture(scope="module")
def hand_url():
    with launch_local(HAND, max_sessions=16) as (url,):
        yield url


def assert_same_obs(got: dict, want: dict) -> None:
    assert tuple(int(c) for c in got["hand"]) == tuple(want["hand"])
    assert isinstance(got["trail"], np.ndarray) and got["trail"].dtype == np.float32  # stacked, as Gymnasium stacks it
    assert got["trail"].shape == want["trail"].shape
    np.testing.assert_array_equal(got["trail"], want["trail"])
    assert float(got["score"]) == float(want["score"])


@pytest.mark.parametrize("offer_msgpack, codec", [(True, "msgpack"), (False, "json")])
def test_sequence_spaces_travel_exactly_and_steps_match_the_local_env(hand_url, offer_msgpack, codec):
    local = gym.make(HAND)
    env = OpenEnvEnv(hand_url, offer_msgpack=offer_msgpack, connect_timeout=TIMEOUT)
    try:
        assert env.codec == codec
        assert env.observation_space == local.observation_space
        assert env.action_space == local.action_space
        obs, _ = env.reset(seed=5)
        assert_same_obs(obs, local.reset(seed=5)[0])
        for action in ACTIONS:
            got, want = env.step(action), local.step(action)
            assert got[0] in env.observation_space
            assert_same_obs(got[0], want[0])
            assert got[1:4] == want[1:4]
            if want[2]:
                break
    finally:
        env.close()
        local.close()


def test_vector_env_with_sequence_spaces_matches_sync_vector_env(hand_url):
    envs = OpenEnvVectorEnv(hand_url, 3, step_timeout=TIMEOUT)
    local = gym.vector.SyncVectorEnv([lambda: gym.make(HAND)] * 3)
    try:
        got, want = envs.reset(seed=1)[0], local.reset(seed=1)[0]
        for step in range(12):
            for i in range(3):
                assert_same_obs({k: v[i] for k, v in got.items()}, {k: v[i] for k, v in want.items()})
            actions = tuple(ACTIONS[(step + i) % len(ACTIONS)] for i in range(3))
            got_step, want_step = envs.step(actions), local.step(actions)
            got, want = got_step[0], want_step[0]
            for g, w in zip(got_step[1:4], want_step[1:4]):
                np.testing.assert_array_equal(g, w)
    finally:
        envs.close()
        local.close()


def test_the_server_refuses_a_sequence_action_that_is_not_a_list(hand_url):
    async def main():
        async with await Session.connect(hand_url) as session:
            await session.reset(seed=0)
            with pytest.raises(ServerError, match="must be a list"):
                await session.step({"action": 3})
            with pytest.raises(ServerError, match="outside the action space"):
                await session.step({"action": [9]})
            reply = await session.step({"action": []})  # the session goes on
            assert len(reply.observation["observation"]["hand"]) == 4

    asyncio.run(asyncio.wait_for(main(), 60.0))


@pytest.mark.unit
@pytest.mark.parametrize(
    "space",
    [
        gs.Sequence(gs.Discrete(3)),
        gs.Sequence(gs.Box(-1.0, 1.0, (2,), np.float32), stack=True),
        gs.Dict({"moves": gs.Sequence(gs.Tuple([gs.Discrete(2), gs.Text(5)]))}),
    ],
)
def test_sequence_descriptions_round_trip(space):
    assert space_from_description(describe_space(space)) == space


@pytest.mark.unit
def test_a_sequence_description_is_checked():
    with pytest.raises(SpaceMappingError, match="stack"):
        space_from_description({"type": "Sequence", "feature_space": describe_space(gs.Discrete(2)), "stack": 1})
    with pytest.raises(SpaceMappingError):
        space_from_description({"type": "Sequence", "feature_space": {"type": "Nope"}, "stack": False})


def test_the_stock_openenv_client_steps_an_env_with_sequence_spaces(hand_url):
    from openenv.core.generic_client import GenericEnvClient

    local = gym.make(HAND)

    async def episode():
        async with GenericEnvClient(base_url=hand_url, connect_timeout_s=10.0, message_timeout_s=TIMEOUT) as client:
            result = await client.reset(seed=2)
            assert result.observation["observation"]["hand"] == list(local.reset(seed=2)[0]["hand"])
            for action in ACTIONS[:4]:
                result = await client.step({"action": list(action)})
                obs, reward, *_ = local.step(action)
                assert result.observation["observation"]["hand"] == list(obs["hand"])
                assert result.observation["observation"]["trail"] == obs["trail"].tolist()
                assert result.reward == reward

    asyncio.run(asyncio.wait_for(episode(), 60.0))
    local.close()


@pytest.mark.unit
@pytest.mark.parametrize(
    "space, value",
    [
        (gs.Sequence(gs.Discrete(3), stack=True), []),
        (gs.Sequence(gs.Box(-1.0, 1.0, (2, 3), np.float32), stack=True), []),
        (gs.Sequence(gs.Discrete(3), stack=True), np.array([0, 2], np.int8)),
        (gs.Sequence(gs.MultiDiscrete([2, 3], start=[-1, 0]), stack=True), [[0, 2], [-1, 0]]),
        (gs.Sequence(gs.MultiBinary(3), stack=True), [[0, 1, 1]]),
        (gs.Sequence(gs.Dict({"card": gs.Discrete(52)})), []),
        (gs.Sequence(gs.Text(4)), ["ab", "cd"]),
        (gs.Sequence(gs.Discrete(100, start=28, dtype=np.int8), stack=True), [28, 127]),  # start + n overflows int8
        (gs.Sequence(gs.MultiDiscrete([101], start=[27], dtype=np.int8), stack=True), [[27], [127]]),
        (gs.Sequence(gs.Sequence(gs.Discrete(2))), [[0] * 3] * 4),  # 4 + 12 items: within 16
    ],
)
def test_the_server_reads_sequence_actions_as_gymnasium_holds_them(space, value):
    action = action_from_wire(space, value, max_sequence_length=16)
    assert space.contains(action)
    assert len(action) == len(value)
    if space.stack:
        assert isinstance(action, np.ndarray) and action.dtype == space.feature_space.dtype


@pytest.mark.unit
@pytest.mark.parametrize(
    "space, value, message",
    [
        (gs.Sequence(gs.Discrete(3), stack=True), [3], "outside the (action|item) space"),
        (gs.Sequence(gs.Box(-1.0, 1.0, (2,), np.float32), stack=True), [[0.0, 2.0]], "outside the (action|item) space"),
        (gs.Sequence(gs.MultiDiscrete([2, 3], start=[-1, 0]), stack=True), [[1, 2]], "outside the (action|item) space"),
        (gs.Sequence(gs.Discrete(3), stack=True), [[1]], "shape"),
        (gs.Sequence(gs.Discrete(3)), "abc", "must be a list"),
        (gs.Sequence(gs.Discrete(3)), list(range(3)) * 10, "more than 16 sequence items"),
        (gs.Sequence(gs.Discrete(3), stack=True), np.zeros(17, np.int64), "more than 16 sequence items"),
        (gs.Sequence(gs.Sequence(gs.Discrete(2))), [[0] * 4] * 4, "more than 16 sequence items"),  # 4 + 16, all levels
        (gs.Sequence(gs.Discrete(3), stack=True), [True, False], "must hold integers"),
        (gs.Sequence(gs.Discrete(3), stack=True), [1.0], "must hold integers"),
        (gs.Sequence(gs.Box(0, 255, (), np.uint8), stack=True), [300], "integers that uint8 holds"),
    ],
)
def test_the_server_refuses_bad_sequence_actions_with_a_reason(space, value, message):
    with pytest.raises(ActionError, match=message):
        action_from_wire(space, value, max_sequence_length=16)


def test_the_server_reads_at_most_max_sequence_length_items_and_goes_on():
    async def main(url: str):
        async with await Session.connect(url) as session:
            await session.reset(seed=0)
            with pytest.raises(ServerError, match="more than 4 sequence items"):
                await session.step({"action": [0, 1, 2, 3, 4]})
            reply = await session.step({"action": [0, 1]})
            assert reply.reward == 2.0

    with launch_local(HAND, extra_args=["--max-sequence-length", "4"]) as (url,):
        asyncio.run(asyncio.wait_for(main(url), 60.0))
    with launch_local(HAND, extra_args=["--max-sequence-length", "4", "--workers", "2"]) as (url,):  # workers too
        asyncio.run(asyncio.wait_for(main(url), 60.0))


@pytest.mark.unit
def test_stacked_sequences_need_array_items():
    stacked_dict = gs.Sequence(gs.Dict({"a": gs.Discrete(2)}), stack=True)
    with pytest.raises(SpaceMappingError, match="stacked Sequence of Dict"):
        describe_space(stacked_dict)  # so a server refuses to host it, at start
    described = {"type": "Sequence", "feature_space": describe_space(gs.Dict({"a": gs.Discrete(2)})), "stack": True}
    with pytest.raises(SpaceMappingError, match="array items"):
        space_from_description(described)
    deep: dict = describe_space(gs.Discrete(2))
    for _ in range(30):  # each stacked level would copy the ones inside: refused at the second level
        deep = {"type": "Sequence", "feature_space": deep, "stack": True}
    with pytest.raises(SpaceMappingError, match="array items"):
        space_from_description(deep)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_a_stacked_sequence_observation_batches_as_sync_vector_env(mode):
    """Each env's observation is an array of its own length: the pool's batch is SyncVectorEnv's, step by step."""
    import gymnasium as gym

    import tests.servers.gym_envs  # noqa: F401
    from openenv_gym import launch_local
    from tests.vector_conformance import assert_same

    local = gym.vector.SyncVectorEnv([lambda: gym.make("Trail-v0")] * 2, autoreset_mode=mode)
    with launch_local("tests.servers.gym_envs:Trail-v0") as urls:
        with OpenEnvVectorEnv(urls, 2, autoreset_mode=mode) as envs:
            assert_same(envs.reset(seed=0), local.reset(seed=0), "reset")
            for t in range(8):
                actions = np.array([t % 2, 1])
                got, want = envs.step(actions), local.step(actions)
                for name, x, y in zip(("obs", "rewards", "terminated", "truncated"), got, want):
                    assert_same(x, y, f"step {t} {name}")
