"""A server's infos never fail a pool's step, whatever Gymnasium's batching of infos makes of them.

Gymnasium batches each key of the envs' infos into an array typed by the
first env's value, with a ``_key`` mask beside it, and raises on what that
cannot hold: a key beside its own mask's name (``"a"`` and ``"_a"``), a map
where another env sent a number, a number its array's type cannot hold.
Local envs raising so is the trainer's bug to fix; a remote server's infos
are a peer's input, so the pool puts such a key in an object array instead.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import openenv_gym
from openenv_gym import OpenEnvVectorEnv
from openenv_gym.vector.infos import Infos


def test_infos_that_gymnasium_cannot_batch_cost_a_step_nothing():
    with openenv_gym.launch_local("tests.servers.gym_envs:ClashingInfo-v0", max_sessions=2) as urls:
        for offer_msgpack in (True, False):
            with OpenEnvVectorEnv(urls, 2, offer_msgpack=offer_msgpack) as envs:
                _, infos = envs.reset(seed=0)  # env 0: {"a": 1.0, "_a": {"b": 2}}; env 1: {"a": {"x": 1}}
                for _ in range(2):
                    assert infos["a"][0] == 1.0 and infos["a"][1] == {"x": 1}
                    _, rewards, _, _, infos = envs.step(np.zeros(2, dtype=np.int64))
                    assert rewards.tolist() == [1.0, 1.0]


_KEYS = st.sampled_from(["a", "_a", "b", "final_obs", "final_info", "episode", "_episode", 3])
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.integers(2**63, 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.sampled_from([np.zeros(2, np.float32), np.zeros((4, 2)), np.uint64(2**64 - 1), np.float32(1.5)]),
)


def _extend(children):
    return st.one_of(st.lists(children, max_size=3), st.dictionaries(_KEYS, children, max_size=3))


_INFOS = st.dictionaries(_KEYS, st.recursive(_LEAVES, _extend, max_leaves=10), max_size=4)


@settings(max_examples=500, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 3), _INFOS), min_size=1, max_size=6))
def test_any_infos_batch_without_raising(steps):
    # The pool's batching alone (no server needed to feed it values): what four envs said, in env order.
    pool = Infos(4)
    infos: dict = {}
    for env_num, info in sorted(steps, key=lambda step: step[0]):
        infos = pool._add_info(infos, info, env_num)
    said = {key for _, info in steps for key in info}
    assert said <= set(infos)


def _batch(*infos: dict) -> dict:
    """What the pool's batching makes of four envs' infos, given in env order."""
    pool = Infos(4)
    batched: dict = {}
    for env_num, info in enumerate(infos):
        batched = pool._add_info(batched, info, env_num)
    return batched


def test_a_map_then_a_number_or_none_for_one_key_go_in_an_object_array_either_way():
    # Before, a map first made Gymnasium write env 1's number into the map's dict as key 1
    # ({"k": ..., "_k": ..., 1: 5}); only the number-first order gave an object array.
    for later in (5, None, "text"):
        batched = _batch({"tool": {"error": 1, "detail": {"code": 7}}}, {"tool": later}, {}, {"tool": {"error": 2}})
        column = batched["tool"]
        assert isinstance(column, np.ndarray) and column.dtype == object
        assert column[0] == {"error": 1, "detail": {"code": 7}} and column[1] == later
        assert column[2] is None and column[3] == {"error": 2}
        assert batched["_tool"].tolist() == [True, True, False, True]
    batched = _batch({"tool": 5}, {"tool": {"error": 1}})  # (the other order, as before)
    assert batched["tool"].tolist()[:2] == [5, {"error": 1}] and batched["_tool"].tolist() == [True, True, False, False]
    batched = _batch({"tool": {"a": {"b": 1}}}, {"tool": {"a": 2}})  # (deeper down: the top-level key)
    assert batched["tool"].tolist() == [{"a": {"b": 1}}, {"a": 2}, None, None]


def test_big_endian_arrays_in_an_info_stay_arrays_on_the_fast_path():
    """An env's ``>f8`` info array goes as the same values in the wire's byte order (it became a list)."""
    from openenv_gym.protocol import multiplex as fastp
    from openenv_gym.protocol.codec import MsgpackCodec
    from openenv_gym.server.hosting.values import plain_value

    info = {"be": np.array([1.5, -2.0], ">f8"), "ints": np.array([[1, 2]], ">i4"), "mixed": [np.array([3], ">u2")]}
    plain = plain_value(info, keep_arrays=True, numpy_scalars=True)
    codec = MsgpackCodec()
    reply = fastp.batch_reply(1, [5], {}, np.zeros(1), np.zeros(1, dtype=bool), [plain])
    got = fastp.parse_fast_reply(codec.decode(codec.encode(reply))).metadata[0]
    assert got["be"].dtype == np.float64 and got["be"].tolist() == [1.5, -2.0]
    assert got["ints"].dtype == np.int32 and got["ints"].shape == (1, 2)
    assert type(got["mixed"][0]) is np.ndarray and got["mixed"][0].dtype == np.uint16  # in lists too
