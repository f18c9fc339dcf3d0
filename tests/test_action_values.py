"""How servers read actions: ``action_from_wire`` (Gymnasium hosts), OpenEnv hosts, and per-host limits."""

from __future__ import annotations

import asyncio
from typing import List

import numpy as np
import pytest
from gymnasium import spaces as gs
from openenv.core.env_server.types import Action

from openenv_gym.config import Limits
from openenv_gym.server.context import ServerConfig, ServerContext
from openenv_gym.server.hosting.gym_host import GymHostFactory
from openenv_gym.server.hosting.openenv_host import OpenEnvHost
from openenv_gym.server.hosting.values import ActionError, action_from_wire
from tests.servers.stock_envs import EchoEnvironment


@pytest.mark.unit
@pytest.mark.parametrize(
    "space, value",
    [
        (gs.Box(0, 255, (2,), np.uint8), [300, 0]),  # would wrap to 44
        (gs.Box(-5, 5, (1,), np.int8), [-129]),
        (gs.Box(0, 1, (2,), np.bool_), [2, 0]),  # would become True
        (gs.MultiBinary(2), [2, 0]),
        (gs.Box(0, 10, (1,), np.int64), [1.5]),
    ],
)
def test_numbers_a_dtype_cannot_hold_are_refused_not_wrapped(space, value):
    with pytest.raises(ActionError):
        action_from_wire(space, value)


@pytest.mark.unit
@pytest.mark.parametrize(
    "space, value",
    [
        (gs.Box(0, 255, (2,), np.uint8), [255, 0]),
        (gs.Box(0, 1, (2,), np.bool_), [True, 0]),
        (gs.Box(0, 10, (1,), np.int64), [3.0]),  # an integral float, as JSON may carry it
        (gs.MultiDiscrete([3, 3], dtype=np.int8), np.array([2, 0], np.int64)),
        (gs.Dict({"a": gs.Discrete(2), "b": gs.Tuple([gs.Text(3), gs.Box(-1, 1, (2,), np.float32)])}), {"a": 1, "b": ["xy", [0.5, -0.5]]}),
    ],
)
def test_values_in_the_space_are_read(space, value):
    assert space.contains(action_from_wire(space, value))


class TaggedAction(Action):
    """An action with its own field named ``type`` (not MCP's tag)."""

    type: List[str]


@pytest.mark.unit
def test_an_action_field_named_type_is_read_by_the_model():
    host = OpenEnvHost(EchoEnvironment(), TaggedAction)
    assert host.parse_action({"type": ["a", "b"]}).type == ["a", "b"]


@pytest.mark.unit
def test_each_server_gives_its_hosts_its_own_limits():
    factory = GymHostFactory("CartPole-v1")
    tight = ServerContext(factory, ServerConfig(limits=Limits(max_sequence_length=4)))
    loose = ServerContext(factory, ServerConfig())

    async def make_two():
        return await tight.make_host(), await loose.make_host()

    try:
        first, second = asyncio.run(asyncio.wait_for(make_two(), 60.0))
        assert (first.limits.max_sequence_length, second.limits.max_sequence_length) == (4, 16 * 1024)
    finally:
        tight.shutdown()
        loose.shutdown()


@pytest.mark.unit
@pytest.mark.parametrize(
    "space, value",
    [
        (gs.Box(-(2**63), 2**63 - 1, (2,), np.int64), [-1, 2**63]),  # numpy reads the list as floats
        (gs.Box(-(2**63), 2**63 - 1, (2,), np.int64), [9.223372036854776e18, 1]),  # 2.0**63
        (gs.Box(0, 2**64 - 1, (1,), np.uint64), [1.8446744073709552e19]),  # 2.0**64
        (gs.Box(-(2**63), 2**63 - 1, (2,), np.int64), [1.0, 9007199254740993]),  # not exact as a float
        (gs.Box(-np.inf, np.inf, (1,), np.float32), [1e39]),  # would become inf
    ],
)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # (refused without numpy's overflow warning on the way)
def test_numbers_at_the_64_bit_and_float32_limits_are_refused_not_changed(space, value):
    with pytest.raises(ActionError):
        action_from_wire(space, value)


@pytest.mark.unit
@pytest.mark.parametrize(
    "space, action",
    [
        (gs.Box(-10, 10, (1,), np.int64), [1.7]),  # Gymnasium's contains casts the list: it would pass, as 1
        (gs.Box(0, 1, (1,), np.bool_), [2]),
        (gs.Box(0, 255, (1,), np.uint8), [255.9]),
        (gs.Box(-np.inf, np.inf, (1,), np.float32), np.array([1e39])),  # would become inf
    ],
)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # (refused without numpy's overflow warning on the way)
def test_client_refuses_list_actions_it_would_have_to_change(space, action):
    from openenv_gym._actions import coerce_action

    assert not space.contains(coerce_action(space, action))


@pytest.mark.unit
@pytest.mark.parametrize(
    "space, action",
    [
        (gs.Box(0, 255, (2,), np.uint8), [1, 255]),  # ints into an unsigned dtype
        (gs.Box(0, 1, (2,), np.bool_), [1, 0]),
        (gs.Box(-5, 5, (2,), np.int64), [1.0, 2.0]),  # whole floats, as Gymnasium takes them
        (gs.Discrete(5), np.uint64(3)),
        (gs.Tuple([gs.Discrete(3), gs.Box(-5, 5, (2,), np.int64)]), [1, [1, 2]]),  # a list for a Tuple
        (gs.Box(-1, 1, (2,), np.float32), [0.5, -0.5]),
    ],
)
def test_client_takes_list_actions_it_can_read_exactly(space, action):
    from openenv_gym._actions import coerce_action

    assert space.contains(coerce_action(space, action))


@pytest.mark.unit
def test_client_refuses_a_lossy_leaf_of_a_tuple_given_as_a_list():
    from openenv_gym._actions import coerce_action

    space = gs.Tuple([gs.Discrete(3), gs.Box(-5, 5, (2,), np.int64)])
    assert not space.contains(coerce_action(space, [1, [1.7, 2]]))


@pytest.mark.unit
def test_uint64_values_past_int64_are_read_exactly_from_json_lists():
    # numpy reads [2**63, 0] as float64 (losing the low bits); JSON carries a uint64 array so.
    from openenv_gym._actions import coerce_action
    from openenv_gym._numbers import numbers_of
    from openenv_gym.server.hosting.values import _array

    u64 = np.dtype(np.uint64)
    assert numbers_of([2**63 + 5, 0], u64).tolist() == [2**63 + 5, 0]
    assert numbers_of([2**63, -1], u64).dtype.kind == "f"  # (then refused: no uint64 holds -1)
    assert _array([2**64 - 1, 0], u64, (2,), "action").tolist() == [2**64 - 1, 0]
    space = gs.Box(0, 2**64 - 1, (2,), np.uint64)
    assert coerce_action(space, [2**63 + 5, 0]).tolist() == [2**63 + 5, 0]


@pytest.mark.unit
def test_an_error_shows_a_peers_value_by_its_first_items_only():
    from openenv_gym.server.hosting.values import short_repr

    shown = []

    class Item:
        def __repr__(self) -> str:
            shown.append(self)
            return "item"

    text = short_repr([Item() for _ in range(100_000)])
    assert len(text) <= 120 and text.startswith("[item, item") and "..." in text
    assert len(shown) <= 8  # not a repr of all 100,000 (a peer's millions took seconds)


def test_action_leaves_reach_the_env_as_gymnasiums_vector_envs_hand_them():
    """numpy scalars of the space's dtype for Discrete values and shape-() arrays, on both wire paths."""
    import gymnasium as gym

    import openenv_gym
    import tests.servers.gym_envs  # noqa: F401  (registers ActionTypes-v0 here too)

    local = gym.vector.SyncVectorEnv([lambda: gym.make("ActionTypes-v0")] * 2)
    local.reset(seed=0)
    local.action_space.seed(0)
    actions = local.action_space.sample()
    expected = local.step(actions)[4]
    assert expected["pick"][0] == "int64 int64 True" and expected["knob"][0] == "float32 float32 True"
    with openenv_gym.launch_local("tests.servers.gym_envs:ActionTypes-v0") as (url,):
        with openenv_gym.OpenEnvVectorEnv(url, 2) as envs:
            envs.reset(seed=0)
            got = envs.step(actions)[4]
        for key in ("pick", "small", "knob", "pair0", "pair1"):
            assert got[key].tolist() == expected[key].tolist(), key
        single = {
            "pick": actions["pick"][0],
            "small": actions["small"][0],
            "knob": actions["knob"][0],
            "pair": (actions["pair"][0][0], actions["pair"][1][0]),
        }
        for offer_msgpack in (True, False):
            env = openenv_gym.OpenEnvEnv(url, offer_msgpack=offer_msgpack)
            try:
                env.reset(seed=0)
                info = env.step(single)[4]
            finally:
                env.close()
            assert {key: info[key] for key in ("pick", "small", "knob", "pair0", "pair1")} == {
                key: expected[key][0] for key in ("pick", "small", "knob", "pair0", "pair1")
            }, offer_msgpack
