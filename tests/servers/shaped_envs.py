"""Stock OpenEnv test environments shaped as OpenEnv's own envs where the library once stopped short.

Each reproduces one shape found in the ``envs/`` folder of huggingface/OpenEnv
(none of their code: the models' shapes only), served by the stock server:

- ``grid``: an integer action with no range (``move: int``) beside a
  ``legal_actions`` list that changes length within an episode and is empty
  when it ends (maze, connect4, openspiel, atari);
- ``tokens``: a list of integers with no range as the action, and an
  observation list that is empty at reset (chat);
- ``control``: a map of lists of numbers (``Dict[str, List[float]]``) beside
  an optional text that stays null, and an action list whose length the
  schema does not say, but a dm_env-style ``action_spec`` in the state does
  (dm_control); ``BlindControlEnvironment`` without it;
- ``turn``: an integer action with no range and nothing that says which
  integers the env takes (snake);
- ``mcp`` (in ``stock_envs``): an MCP environment whose reset returns a bare
  ``Observation`` while its schema promises ``CallToolObservation`` (echo).

Served as OpenEnv's apps ship (``create_app`` with the default of one session
a server) in ``tests/servers/standalone``.
"""

from __future__ import annotations

import enum
import math
import uuid
from typing import Any, Dict, List, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

__all__ = [
    "GridAction",
    "GridObservation",
    "GridEnvironment",
    "TokensAction",
    "TokensObservation",
    "TokensEnvironment",
    "ControlAction",
    "ControlObservation",
    "ControlState",
    "ControlEnvironment",
    "BlindControlEnvironment",
    "TurnAction",
    "TurnObservation",
    "TurnEnvironment",
]


# grid: a 3x3 grid from (0, 0) to (2, 2); moves 0 up, 1 down, 2 left, 3 right


class Move(enum.IntEnum):
    UP = 0
    DOWN = 1
    LEFT = 2
    RIGHT = 3


_STEPS = {Move.UP: (0, -1), Move.DOWN: (0, 1), Move.LEFT: (-1, 0), Move.RIGHT: (1, 0)}


class GridAction(Action):
    move: int


class GridObservation(Observation):
    legal_actions: List[int] = Field(default_factory=list)
    position: List[int] = Field(default_factory=list)


class GridEnvironment(Environment[GridAction, GridObservation, State]):
    """Reach (2, 2): -0.1 a move, -0.5 into a wall (no move), +1 at the goal. A move outside 0-3 is an error.

    Its state before the first reset is an error (as repl's: "Environment not initialized").
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state: State | None = None
        self._at = (0, 0)

    def _legal(self) -> list[int]:
        x, y = self._at
        return [int(m) for m, (dx, dy) in _STEPS.items() if 0 <= x + dx <= 2 and 0 <= y + dy <= 2]

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GridObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self._at = (0, 0)
        return GridObservation(legal_actions=self._legal(), position=list(self._at))

    def step(self, action: GridAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GridObservation:
        move = Move(action.move)  # (ValueError for a move outside 0-3: the stock server's EXECUTION_ERROR)
        assert self._state is not None
        self._state.step_count += 1
        if int(move) not in self._legal():
            return GridObservation(legal_actions=self._legal(), position=list(self._at), reward=-0.5)
        dx, dy = _STEPS[move]
        self._at = (self._at[0] + dx, self._at[1] + dy)
        done = self._at == (2, 2)
        return GridObservation(
            legal_actions=[] if done else self._legal(), position=list(self._at), reward=1.0 if done else -0.1, done=done
        )

    @property
    def state(self) -> State:
        if self._state is None:
            raise RuntimeError("Environment not initialized. Call reset() first.")
        return self._state


# tokens: token ids in, the text so far out (as a chat env with a tokenizer of code points)


class TokensAction(Action):
    tokens: list[int] = Field(..., min_length=1)


class TokensObservation(Observation):
    tokens: list[int] = Field(default_factory=list)


class TokensEnvironment(Environment[TokensAction, TokensObservation, State]):
    """The tokens said so far ([] after reset); a token is a Unicode code point (``chr``) but a surrogate; 4 turns an episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self._said: list[int] = []

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> TokensObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self._said = []
        return TokensObservation(tokens=[])

    def step(self, action: TokensAction, timeout_s: Optional[float] = None, **kwargs: Any) -> TokensObservation:
        text = "".join(chr(t) for t in action.tokens)  # (ValueError out of range: an EXECUTION_ERROR)
        text.encode("utf-8")  # (UnicodeEncodeError for a surrogate, 0xD800-0xDFFF: a hole in the range)
        self._state.step_count += 1
        self._said += action.tokens
        return TokensObservation(tokens=list(self._said), reward=float(len(text)), done=self._state.step_count >= 4)

    @property
    def state(self) -> State:
        return self._state


# control: named arrays of numbers, a rendering that is null unless asked for, a force of one value


class ControlAction(Action):
    values: List[float] = Field(default_factory=list)


class ControlObservation(Observation):
    observations: Dict[str, List[float]] = Field(default_factory=dict)
    pixels: Optional[str] = None


class ControlState(State):
    action_spec: Dict[str, Any] = Field(default_factory=dict)


class ControlEnvironment(Environment[ControlAction, ControlObservation, ControlState]):
    """A cart pushed by ``values[0]`` (exactly one value, else an error); 10 steps an episode.

    Its state describes the action as dm_control's does (a dm_env ``BoundedArray``: shape, bounds).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    ACTION_SPEC: Dict[str, Any] = {"shape": [1], "dtype": "float64", "minimum": [-1.0], "maximum": [1.0], "name": "force"}

    def __init__(self) -> None:
        super().__init__()
        self._state = ControlState(episode_id=str(uuid.uuid4()), step_count=0, action_spec=dict(self.ACTION_SPEC))
        self._x = self._v = 0.0

    def _observe(self, reward: float = 0.0, done: bool = False) -> ControlObservation:
        angle = self._x / 4
        return ControlObservation(
            observations={"position": [self._x, math.cos(angle), math.sin(angle)], "velocity": [self._v, -self._v]},
            reward=reward,
            done=done,
        )

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ControlObservation:
        self._state = ControlState(episode_id=episode_id or str(uuid.uuid4()), step_count=0, action_spec=dict(self.ACTION_SPEC))
        self._x = float(seed or 0) / 10
        self._v = 0.0
        return self._observe()

    def step(self, action: ControlAction, timeout_s: Optional[float] = None, **kwargs: Any) -> ControlObservation:
        if len(action.values) != 1:
            raise ValueError(f"Action shape ({len(action.values)},) doesn't match expected shape (1,)")
        self._state.step_count += 1
        self._v += max(-1.0, min(1.0, action.values[0])) / 10
        self._x += self._v
        return self._observe(reward=1.0 - abs(self._x), done=self._state.step_count >= 10)

    @property
    def state(self) -> ControlState:
        return self._state


class BlindControlEnvironment(ControlEnvironment):
    """:class:`ControlEnvironment` whose state says nothing of its action (nothing says its length)."""

    ACTION_SPEC: Dict[str, Any] = {}


# turn: a snake's turn (0 straight, 1 left, 2 right), an integer the schema does not bound


class TurnAction(Action):
    action: int


class TurnObservation(Observation):
    heading: int = 0
    grid: List[List[int]] = Field(default_factory=list)


class TurnEnvironment(Environment[TurnAction, TurnObservation, State]):
    """Turns a heading (0-3) left or right or not; a turn outside 0-2 is an error; 8 steps an episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self._heading = 0

    def _observe(self, reward: float = 0.0, done: bool = False) -> TurnObservation:
        grid = [[int(i == self._heading and j == 0) for j in range(4)] for i in range(4)]
        return TurnObservation(heading=self._heading, grid=grid, reward=reward, done=done)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> TurnObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self._heading = 0
        return self._observe()

    def step(self, action: TurnAction, timeout_s: Optional[float] = None, **kwargs: Any) -> TurnObservation:
        if action.action not in (0, 1, 2):
            raise ValueError(str(action.action))
        self._state.step_count += 1
        self._heading = (self._heading + (0, -1, 1)[action.action]) % 4
        return self._observe(reward=float(self._heading == 2), done=self._state.step_count >= 8)

    @property
    def state(self) -> State:
        return self._state
