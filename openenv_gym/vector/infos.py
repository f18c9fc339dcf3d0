"""Per-env infos, held until their envs are returned, then batched as Gymnasium batches them.

Gymnasium's batching (``VectorEnv._add_info``) types each key's array by the
first env's value; a server's infos are free-form, so a key it cannot batch
goes in an object array instead of failing the step.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import numpy as np
from gymnasium.vector import VectorEnv

#: What Gymnasium's info batching raises on infos it cannot batch (see :meth:`Infos.add_typed`).
_UNBATCHED = (OverflowError, ValueError, TypeError, AttributeError, KeyError, IndexError)


def _fits(vector_infos: Mapping[str, Any], env_info: Mapping[str, Any]) -> bool:
    """Whether every map in ``env_info`` meets a map (or nothing) in ``vector_infos``, and every other value a non-map."""
    for key, value in env_info.items():
        if key == "final_obs" or key not in vector_infos:
            continue
        batched = vector_infos[key]
        if isinstance(value, dict):
            if not isinstance(batched, dict) or not _fits(batched, value):
                return False
        elif isinstance(batched, dict):
            return False
    return True


def _info_row(batched: Mapping[str, Any], i: int) -> dict[str, Any] | None:
    """Env ``i``'s map out of a batched info map (its keys whose ``_key`` mask is set); ``None`` if it has none."""
    row: dict[str, Any] = {}
    for key, column in batched.items():
        if isinstance(key, str) and key.startswith("_") and key[1:] in batched:
            continue
        try:
            mask = batched.get(f"_{key}")
            if mask is None or not mask[i]:
                continue
            row[key] = _info_row(column, i) if isinstance(column, dict) else column[i]
        except _UNBATCHED:  # (a map that clashing keys left without arrays: what cannot be read is left out)
            continue
    return row or None


class Infos:
    """The infos of ``num_envs`` envs: each env's, in order, until the env is returned; then one batched dict.

    Args:
        num_envs: the batch's length.
        free_fields: observation fields that go in infos as received (free-form JSON):
            batched in object arrays, whatever their first env's type.
    """

    def __init__(self, num_envs: int, free_fields: Collection[str] = ()) -> None:
        self.num_envs = num_envs
        self.free_fields = tuple(free_fields)
        self.pending: dict[int, list[dict[str, Any]]] = {}  # env -> infos to return, in order
        # For adapters that hand infos on per env (openenv_gym.sb3): when set, each call's per-env
        # infos, as the envs gave them, before batching types each key by its first env's value.
        self.keep_rows = False
        self.rows: dict[int, list[dict[str, Any]]] = {}

    def add(self, env: int, info: dict[str, Any]) -> None:
        """One more info of env ``env``."""
        self.pending.setdefault(env, []).append(info)

    def collect(self, ids: np.ndarray, metadata: list[dict[str, Any]] | None) -> None:
        """The non-empty infos of envs ``ids`` (``metadata``: one per env, or ``None``: none said anything)."""
        if metadata is not None:
            for i, info in zip(ids.tolist(), metadata):
                if info:
                    self.pending.setdefault(i, []).append(info)

    def drop(self, env: int) -> None:
        self.pending.pop(env, None)

    def clear(self) -> None:
        self.pending.clear()

    def batch(self, returned: np.ndarray) -> dict[str, Any]:
        """The infos of envs ``returned``, batched in env order (as ``SyncVectorEnv``: the first env types each key's array)."""
        infos: dict[str, Any] = {}
        if self.keep_rows:
            self.rows = {i: self.pending[i] for i in returned.tolist() if i in self.pending}
        if not self.pending:  # the common case: no env said anything
            return infos
        for i in np.sort(returned).tolist():
            for info in self.pending.pop(i, ()):
                infos = self._add_info(infos, info, i)
        return infos

    def _add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        """Gymnasium's batching of infos, but free-form observation fields go in object arrays as received.

        Gymnasium types an info key's array by the first env's value, which
        breaks when another env's value is of another type (an int, then a dict).
        """
        free = self.free_fields
        if not free or not any(name in env_info for name in free):
            return self.add_typed(vector_infos, env_info, env_num)
        vector_infos = self.add_typed(vector_infos, {k: v for k, v in env_info.items() if k not in free}, env_num)
        for name in free:
            if name in env_info:
                self._add_object(vector_infos, name, env_info[name], env_num)
        return vector_infos

    def add_typed(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        """Gymnasium's batching of ``env_info`` at ``env_num``; a key it cannot batch goes in an object array instead of raising."""
        try:
            if not _fits(vector_infos, env_info):  # (Gymnasium would write a non-map into a map's dict)
                raise TypeError
            return self._gymnasium_add_info(vector_infos, env_info, env_num)
        except _UNBATCHED:
            # A value the array typed by the first env cannot hold (a uint64 above int64, a float
            # after an int array of another shape), a map where another env sent a value (or the
            # other way round), a key that is another's mask ("_a" beside "a"): that key in an
            # object array, as received, so that a server's infos never fail a step.
            for key, value in env_info.items():
                try:
                    if not _fits(vector_infos, {key: value}):
                        raise TypeError
                    vector_infos = self._gymnasium_add_info(vector_infos, {key: value}, env_num)
                except _UNBATCHED:
                    self._add_object(vector_infos, key, value, env_num)
            return vector_infos

    def _gymnasium_add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        # Gymnasium's own method reads ``num_envs`` and, for nested maps, calls ``_add_info`` again:
        # on this object both are ours, so a nested map is batched by the same rules.
        return VectorEnv._add_info(self, vector_infos, env_info, env_num)  # type: ignore[arg-type]

    def _add_object(self, vector_infos: dict[str, Any], key: str, value: Any, env_num: int) -> None:
        """``value`` at ``env_num`` of ``vector_infos[key]``, an object array (converted if it was typed), with its ``_key`` mask."""
        column = vector_infos.get(key)
        if not (isinstance(column, np.ndarray) and column.dtype == object and column.shape == (self.num_envs,)):
            old = column
            column = vector_infos[key] = np.full(self.num_envs, None, dtype=object)
            if isinstance(old, np.ndarray) and old.shape[:1] == (self.num_envs,):
                for i in range(self.num_envs):
                    column[i] = old[i]
            elif isinstance(old, dict):  # (maps batched so far: each env's own map again)
                for i in range(self.num_envs):
                    column[i] = _info_row(old, i)
        mask = vector_infos.get(f"_{key}")
        if not (isinstance(mask, np.ndarray) and mask.shape == (self.num_envs,)):
            mask = vector_infos[f"_{key}"] = np.zeros(self.num_envs, dtype=np.bool_)
        column[env_num] = value
        mask[env_num] = True
