"""The hot path's byte-level tests of bool and int arrays agree with numpy's reductions."""

from __future__ import annotations

import numpy as np
import pytest

from openenv_gym._masks import any_true, count_true, same

pytestmark = pytest.mark.unit  # (the fast tier: no sockets, no server processes)


@pytest.mark.parametrize("size", [0, 1, 7, 64, 1000])
def test_any_and_count_agree_with_numpy(size: int) -> None:
    rng = np.random.default_rng(size)
    for p in (0.0, 0.01, 0.5, 1.0):
        mask = rng.random(size) < p
        assert any_true(mask) == bool(mask.any())
        assert count_true(mask) == int(mask.sum())
        strided = mask[::3]  # (not contiguous)
        assert any_true(strided) == bool(strided.any())
        assert count_true(strided) == int(strided.sum())
        square = np.resize(mask, (size // 2, 2))
        assert count_true(square) == int(square.sum())


def test_same_agrees_with_numpy() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, 64)
    b = a.copy()
    assert same(a, b)
    for i in (0, 31, 63):
        b[i] += 1
        assert not same(a, b)
        b[i] -= 1
    assert same(a[::2], b[::2])
    assert same(np.zeros(0, np.int64), np.zeros(0, np.int64))
