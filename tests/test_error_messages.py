"""Errors that teach: each names what it got and the fix."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import openenv_gym
from openenv_gym import OpenEnvEnv, OpenEnvVectorEnv


@pytest.fixture(scope="module")
def pendulum_url():
    with openenv_gym.launch_local("Pendulum-v1", max_sessions=8) as (url,):
        yield url


def test_an_action_outside_a_box_names_clip_action_and_a_wrong_shape_names_both_shapes(pendulum_url):
    with OpenEnvEnv(pendulum_url) as env:
        env.reset(seed=0)
        with pytest.raises(ValueError, match=r"outside the space's bounds \(such as 3\.0\).*gymnasium\.wrappers\.ClipAction"):
            env.step(np.array([3.0]))
        with pytest.raises(ValueError, match=r"expected an array of shape \(1,\), got shape \(2,\)"):
            env.step(np.array([0.5, 0.5]))
    with OpenEnvVectorEnv(pendulum_url, 2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"gymnasium\.wrappers\.vector\.ClipAction"):
            envs.step(np.array([[0.0], [9.0]]))
        with pytest.raises(ValueError, match=r"expected an array of shape \(2, 1\), got shape \(3, 1\)"):
            envs.step(np.zeros((3, 1)))


def test_actions_in_flight_name_recv_and_step_wait(pendulum_url):
    with OpenEnvVectorEnv(pendulum_url, 2) as envs:
        envs.reset(seed=0)
        envs.step_async(np.zeros((2, 1), np.float32))
        with pytest.raises(ValueError, match=r"recv\(\), or step_wait\(\) after step_async\(\)"):
            envs.step_async(np.zeros((2, 1), np.float32))
        envs.step_wait()


def test_python_m_openenv_gym_is_the_command():
    done = subprocess.run([sys.executable, "-m", "openenv_gym", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"openenv-gym {openenv_gym.__version__}"
