"""A pool's actions: a batch checked against the action space, then one wire column per action field."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import iterate

from .._actions import coerce_action, refusal
from .._numbers import ARRAY_SPACES
from ..spaces import SchemaSpace
from .rows import batched_space, same_on_the_wire


class ActionColumns:
    """Batches of actions of ``num_envs`` envs (or fewer), checked and turned into request columns.

    Args:
        act: the action space and its codec.
        num_envs: the pool's size.
        action_space: the batch action space of ``num_envs`` envs.
    """

    def __init__(self, act: SchemaSpace, num_envs: int, action_space: gym.Space) -> None:
        self._act = act
        self.single = act.space
        self._spaces: dict[int, gym.Space] = {num_envs: action_space}
        # One column, the batch itself, when the action is one field whose wire value is the space's value.
        direct = isinstance(self.single, ARRAY_SPACES) and same_on_the_wire(act.codec)
        self._direct = act.single_field if direct else None

    def space(self, n: int) -> gym.Space:
        """The action space of a batch of ``n`` envs (made once per size)."""
        space = self._spaces.get(n)
        if space is None:
            space = self._spaces[n] = batched_space(self.single, n)
        return space

    def checked(self, actions: Any, n: int) -> Any:
        """``actions`` as a batch of ``n`` actions of the action space (lists converted).

        Raises:
            ValueError: an action outside the action space, saying which and why.
        """
        if isinstance(actions, np.ndarray) and self.fits(actions, n):
            return actions
        # (lists first: Gymnasium's contains casts them, so [1.7] would pass for an int Box and be sent as 1)
        actions = coerce_action(self.space(n), actions)
        if not self.fits(actions, n):
            space = self.space(n)
            raise ValueError(f"actions are not in the action space {space}: {refusal(space, actions, batched=True)}")
        return actions

    def fits(self, actions: Any, n: int) -> bool:
        """Whether ``actions`` is a batch of ``n`` actions of the action space."""
        single = self.single
        if type(single) is spaces.Discrete and type(actions) is np.ndarray:
            # As MultiDiscrete.contains, in three array operations.
            if actions.shape != (n,) or not np.can_cast(actions.dtype, single.dtype):
                return False
            low = int(single.start)
            values = actions.tolist()  # (min and max of a list: cheaper than numpy's reductions at these sizes)
            return n == 0 or (min(values) >= low and max(values) < low + int(single.n))
        return self.space(n).contains(actions)

    def columns(self, actions: Any, n: int) -> dict[str, Any]:
        """The request columns of a checked batch of ``n`` actions: field name -> ``n`` wire values (or one array).

        Raises:
            ValueError: the envs' actions name different fields (a column cannot say "absent").
        """
        if self._direct is not None:
            # No copy: the request is encoded before send()/step() return (and parked requests copy their rows).
            return {self._direct: np.asarray(actions, dtype=self.single.dtype)}
        # Every env sends the same fields (a column each): an optional field is left out
        # only when it says nothing for every env (one env's null would not mean "unset").
        wire = [self._act.to_wire(a, omit=False) for a in iterate(self.space(n), actions)]
        unsets = [self._act.unset_fields(w) for w in wire]
        unset = set.intersection(*unsets) if wire else set()
        names = {name for w in wire for name in w} - unset
        if any(len(names & w.keys()) != len(names) for w in wire):
            # (an action that is one of several models, as JSON text: a column cannot say "absent")
            raise ValueError(
                "the envs' actions name different fields; OpenEnvVectorEnv sends one column per field, "
                "so every env's action in a step must name the same ones"
            )
        columns = {name: [w[name] for w in wire] for name in names}
        if any(unsets):
            # An env whose optional field says nothing, where others' say something, sends the field's
            # default: what the server fills in when the field is left out, as a lone env leaves it out.
            defaults = {key: child.default for key, child in self._act.codec.children if child.has_default}
            for j, says_nothing in enumerate(unsets):
                for name in says_nothing & names:
                    if name in defaults:
                        columns[name][j] = defaults[name]
        return columns
