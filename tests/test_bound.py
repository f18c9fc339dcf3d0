"""The zero-overhead bound that ``send``/``recv`` is measured against (``openenv_gym.bench.bound``)."""

from __future__ import annotations

import pytest

from openenv_gym.bench.bound import lockstep_steps_per_s, zero_overhead_steps_per_s

pytestmark = pytest.mark.unit


def test_a_batch_of_every_env_is_lockstep_and_smaller_batches_gain_what_the_model_says():
    # recv of all 64 waits for the slowest: the lockstep bound (64 / E[max of 64 U(1, 20)] per ms).
    assert zero_overhead_steps_per_s(64, 64, steps=100_000) == pytest.approx(lockstep_steps_per_s(64), rel=0.02)
    assert lockstep_steps_per_s(64) == pytest.approx(64 / (20 - 19 / 65) * 1000)
    # Half the envs per recv: 1.42x lockstep on U(1, 20) ms steps, a quarter 1.66x (the figures the targets are set by).
    assert zero_overhead_steps_per_s(64, 32) / lockstep_steps_per_s(64) == pytest.approx(1.42, abs=0.01)
    assert zero_overhead_steps_per_s(64, 16) / lockstep_steps_per_s(64) == pytest.approx(1.66, abs=0.01)
