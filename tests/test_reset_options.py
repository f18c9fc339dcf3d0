"""Reset options a server could not read are refused before anything is sent; a reset no server reads ends."""

from __future__ import annotations

import numpy as np
import pytest

from openenv_gym import Limits, OpenEnvEnv, OpenEnvVectorEnv, ProtocolError, launch_local
from openenv_gym.protocol.messages import check_reset_options


def _nested(levels: int) -> dict:
    """``levels`` maps, each in the one before."""
    value: dict = {}
    for _ in range(levels - 1):
        value = {"x": value}
    return value


UNREADABLE = [
    ({"table": {1: "a"}}, "string keys"),  # msgpack peers refuse int keys; JSON would make them "1"
    ({"rows": [{"ok": 1}, {(1, 2): 0}]}, "string keys"),
    ({"deep": _nested(31)}, "nests deeper"),  # the options map is level 2 of the request: 33 > 32
]


def test_the_options_rules_count_the_request_around_them(fast_cartpole_urls):
    check_reset_options({"deep": _nested(30)}, 32, msgpack=True)  # its deepest map: level 32
    with pytest.raises(ValueError, match="nests deeper than the 32 levels"):
        check_reset_options({"deep": _nested(31)}, 32, msgpack=True)
    check_reset_options({"big": [2**64 - 1, -(2**63)]}, 32, msgpack=True)
    with pytest.raises(ValueError, match=r"options\['big'\]\[0\] is an integer beyond 64 bits"):
        check_reset_options({"big": (2**64,)}, 32, msgpack=True)
    check_reset_options({"big": 2**70}, 32, msgpack=False)  # JSON carries it
    check_reset_options({"a": np.zeros((2, 2)), "s": {1, 2}, "t": (True, None)}, 32, msgpack=True)
    # The server counts as the check does: options at the limit are read.
    with OpenEnvVectorEnv(fast_cartpole_urls[0], 2) as envs:
        assert envs.reset(seed=0, options={"deep": _nested(30)})[0].shape == (2, 4)


@pytest.mark.parametrize("options, problem", UNREADABLE, ids=["int-key", "tuple-key-in-list", "too-deep"])
def test_unreadable_options_are_a_value_error_and_the_envs_go_on(fast_cartpole_urls, stock_cartpole_url, options, problem):
    # Before, the pool's reset sent them, the server refused the frame, the pool took that for lost
    # sessions and sent the reset again on new ones: forever, as the server kept answering.
    for url in (fast_cartpole_urls[0], stock_cartpole_url):
        with OpenEnvEnv(url) as env:
            env.reset(seed=0)
            with pytest.raises(ValueError, match=problem):
                env.reset(seed=1, options=options)
            assert env.step(0)[0].shape == (4,)  # the same session: nothing was sent
        with OpenEnvVectorEnv(url, 2) as envs:
            envs.reset(seed=0)
            with pytest.raises(ValueError, match=problem):
                envs.reset(seed=1, options=dict(options, reset_mask=np.array([True, False])))
            first, _ = envs.reset(seed=0)
            with OpenEnvVectorEnv(url, 2) as again:
                assert np.array_equal(again.reset(seed=0)[0], first)


def test_a_reset_a_server_cannot_read_raises_after_a_few_rounds():
    # A server with tighter limits than the pool's: the pool's own check lets the options through,
    # the server refuses every frame that holds them. The reset ends with the server's reason.
    with launch_local("CartPole-v1", max_sessions=16, extra_args=["--max-depth", "4"]) as (url,):
        with OpenEnvVectorEnv(url, 2) as envs:
            envs.reset(seed=0)
            with pytest.raises(ProtocolError, match="could not read a request"):
                envs.reset(seed=1, options={"deep": _nested(4)})
            assert envs.reset(seed=0)[0].shape == (2, 4)  # new sessions, and the pool goes on
        with OpenEnvEnv(url, limits=Limits(max_depth=32)) as env:
            env.reset(seed=0)
            with pytest.raises(ProtocolError, match="could not read a request"):
                env.reset(seed=1, options={"deep": _nested(4)})
            assert env.reset(seed=0)[0].shape == (4,)
