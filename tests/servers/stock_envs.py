"""Stock OpenEnv environments used by the test-suite.

These are plain ``openenv.core.env_server.interfaces.Environment`` subclasses,
served by OpenEnv's own ``create_fastapi_app`` (see ``run_stock.py``).  This
module imports ``openenv`` at import time, so it is meant to be imported only
inside the server subprocess; the test process starts servers through
``tests.servers.launch`` which never imports it.

Environments (all ``SUPPORTS_CONCURRENT_SESSIONS = True``):

* ``cartpole`` -- ``gymnasium.make("CartPole-v1")`` (TimeLimit 500).  Action
  ``{"action": 0|1}``; observation ``{"state": [4 floats], "truncated": bool}``;
  metadata is Gymnasium's ``info`` (empty for CartPole).
* ``mixed`` -- string-enum action ``{"command": "left"|"right"|"stay"}``;
  observation with an int, a float, a str and a 2-float list.  Deterministic
  for a given seed; ``done`` after 20 steps.
* ``slow`` -- ``cartpole`` whose ``step`` first sleeps
  ``SLOW_STEP_SECONDS`` (default 30) seconds.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
import uuid
from typing import Any, Dict, List, Literal, Optional, Tuple, Type, Union

import gymnasium as gym
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from pydantic import BaseModel, Field, model_validator

__all__ = [
    "CartPoleAction",
    "CartPoleObservation",
    "CartPoleState",
    "CartPoleEnvironment",
    "MixedAction",
    "MixedObservation",
    "MixedState",
    "MixedEnvironment",
    "SlowCartPoleEnvironment",
    "ENVIRONMENTS",
    "MIXED_EPISODE_LENGTH",
    "create_app",
]


# --------------------------------------------------------------------------
# cartpole
# --------------------------------------------------------------------------


class CartPoleAction(Action):
    action: int = Field(ge=0, le=1, description="0 = push left, 1 = push right")


class CartPoleObservation(Observation):
    state: List[float] = Field(
        min_length=4,
        max_length=4,
        description="cart position, cart velocity, pole angle, pole angular velocity",
    )
    truncated: bool = Field(default=False, description="the episode was cut by the time limit")


class CartPoleState(State):
    """Base ``episode_id`` / ``step_count`` only."""


class CartPoleEnvironment(Environment[CartPoleAction, CartPoleObservation, CartPoleState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._env = gym.make("CartPole-v1")
        self._state = CartPoleState()

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        **kwargs: Any,
    ) -> CartPoleObservation:
        obs, _info = self._env.reset(seed=seed)
        self._state = CartPoleState(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return CartPoleObservation(state=[float(x) for x in obs], done=False, reward=None)

    def step(self, action: CartPoleAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CartPoleObservation:
        obs, reward, terminated, truncated, info = self._env.step(int(action.action))
        self._state.step_count += 1
        return CartPoleObservation(
            state=[float(x) for x in obs],
            truncated=bool(truncated),
            reward=float(reward),
            done=bool(terminated or truncated),
            metadata=dict(info),
        )

    @property
    def state(self) -> CartPoleState:
        return self._state

    def close(self) -> None:
        try:
            self._env.close()
        except Exception:  # pragma: no cover - best effort
            pass


class AwaitedCartPoleEnvironment(CartPoleEnvironment):
    """CartPole with a ``step_async`` that awaits ``AWAITED_PAUSE_SECONDS`` before a push right (action 1)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    async def step_async(self, action: CartPoleAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CartPoleObservation:
        import asyncio

        if action.action == 1:
            await asyncio.sleep(AWAITED_PAUSE_SECONDS)
        return self.step(action)


AWAITED_PAUSE_SECONDS = 2.0


class SlowCartPoleEnvironment(CartPoleEnvironment):
    """CartPole whose ``step`` sleeps ``SLOW_STEP_SECONDS`` before answering."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def step(self, action: CartPoleAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CartPoleObservation:
        time.sleep(float(os.environ.get("SLOW_STEP_SECONDS", "30")))
        return super().step(action, timeout_s=timeout_s, **kwargs)


# --------------------------------------------------------------------------
# mixed
# --------------------------------------------------------------------------

MIXED_EPISODE_LENGTH = 20


class MixedAction(Action):
    command: Literal["left", "right", "stay"]


class MixedObservation(Observation):
    position: int = Field(ge=0, le=10)
    energy: float = Field(ge=0.0, le=1.0)
    label: str
    velocity: List[float] = Field(min_length=2, max_length=2)


class MixedState(State):
    """Base ``episode_id`` / ``step_count`` only."""


class MixedEnvironment(Environment[MixedAction, MixedObservation, MixedState]):
    """Small deterministic (given the seed) env with a mixed-type observation.

    * reset: ``position`` drawn from ``random.Random(seed)`` in [0, 10],
      ``energy`` 1.0, ``label`` "start", ``velocity`` [0.0, noise].
    * step: left/right move ``position`` by one (clamped to [0, 10]); ``energy``
      decreases by 0.05 per step (clamped at 0); ``label`` is
      "<command>-<step>"; ``velocity`` is [move, noise]; reward is 1.0 when
      the move changed the position, else 0.0; ``done`` once 20 steps were
      taken (further steps are accepted and stay done).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    _MOVES = {"left": -1, "right": 1, "stay": 0}

    def __init__(self) -> None:
        super().__init__()
        self._rng = random.Random()
        self._position = 0
        self._energy = 1.0
        self._state = MixedState()

    def _noise(self) -> float:
        return round(self._rng.uniform(-1.0, 1.0), 6)

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        **kwargs: Any,
    ) -> MixedObservation:
        self._rng = random.Random(seed)
        self._position = self._rng.randint(0, 10)
        self._energy = 1.0
        self._state = MixedState(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return MixedObservation(
            position=self._position,
            energy=self._energy,
            label="start",
            velocity=[0.0, self._noise()],
            done=False,
            reward=None,
        )

    def step(self, action: MixedAction, timeout_s: Optional[float] = None, **kwargs: Any) -> MixedObservation:
        move = self._MOVES[action.command]
        new_position = min(10, max(0, self._position + move))
        moved = new_position != self._position
        self._position = new_position
        self._state.step_count += 1
        n = self._state.step_count
        self._energy = max(0.0, round(1.0 - 0.05 * n, 6))
        return MixedObservation(
            position=self._position,
            energy=self._energy,
            label=f"{action.command}-{n}",
            velocity=[float(move), self._noise()],
            reward=1.0 if moved else 0.0,
            done=n >= MIXED_EPISODE_LENGTH,
            metadata={"step": n},
        )

    @property
    def state(self) -> MixedState:
        return self._state


# --------------------------------------------------------------------------
# app factory
# --------------------------------------------------------------------------

# --------------------------------------------------------------------------
# guess: a reset observation model of its own (OpenEnv's reset_observation_cls)
# --------------------------------------------------------------------------


class GuessAction(Action):
    guess: int = Field(ge=0, le=9)


class GuessResetObservation(Observation):
    prompt: str
    rules: str  # (only the reset model has it)


class GuessObservation(Observation):
    prompt: str
    feedback: str
    tries: int = Field(ge=0)


class GuessEnvironment(Environment):
    """Guess a digit; the reset observation has no ``feedback`` or ``tries``, and ``rules`` of its own."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self._target = 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessResetObservation:
        self._target = random.Random(seed).randrange(10)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return GuessResetObservation(prompt="guess a digit", rules="one digit, 0 to 9")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        right = action.guess == self._target
        feedback = "right" if right else ("higher" if action.guess < self._target else "lower")
        return GuessObservation(prompt="guess a digit", feedback=feedback, tries=self._state.step_count, done=right, reward=float(right))

    @property
    def state(self) -> State:
        return self._state


# --------------------------------------------------------------------------
# echo: a text action, as an LLM would send
# --------------------------------------------------------------------------

ECHO_EPISODE_LENGTH = 3


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed: str
    length: int = Field(ge=0)


class EchoEnvironment(Environment[EchoAction, EchoObservation, State]):
    """Echoes the action's ``message``; reward is its length in characters; done after 3 steps."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return EchoObservation(echoed="", length=0)

    def step(self, action: EchoAction, timeout_s: Optional[float] = None, **kwargs: Any) -> EchoObservation:
        self._state.step_count += 1
        n = len(action.message)
        return EchoObservation(echoed=action.message, length=n, reward=float(n), done=self._state.step_count >= ECHO_EPISODE_LENGTH)

    @property
    def state(self) -> State:
        return self._state


class BigIntAction(Action):
    which: int = Field(ge=0, le=2)


class BigIntObservation(Observation):
    count: int


#: What a step of ``BigIntEnvironment`` returns for each ``which``: within int64, beyond it
#: (within msgpack's uint64), beyond msgpack.
BIG_INT_COUNTS = (5, 2**63, 2**70)


class BigIntEnvironment(Environment[BigIntAction, BigIntObservation, State]):
    """An int observation field that a step may fill beyond int64: ``BIG_INT_COUNTS[action.which]``."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> BigIntObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return BigIntObservation(count=0)

    def step(self, action: BigIntAction, timeout_s: Optional[float] = None, **kwargs: Any) -> BigIntObservation:
        self._state.step_count += 1
        return BigIntObservation(count=BIG_INT_COUNTS[action.which], reward=1.0)

    @property
    def state(self) -> State:
        return self._state


class ThreadBoundAction(Action):
    pause_ms: int = Field(default=0, ge=0, le=100)


class ThreadBoundObservation(Observation):
    steps: int
    same_thread: bool


class ThreadBoundEnvironment(Environment[ThreadBoundAction, ThreadBoundObservation, State]):
    """Made with an ``sqlite3`` connection (usable only on the thread that made it); each step runs
    ``asyncio.run`` (which refuses to run inside a running event loop) and counts its steps in sqlite.

    ``same_thread``: the call ran on the thread that made the env. OpenEnv's own server runs every
    call of a session there.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        import sqlite3
        import threading

        super().__init__()
        self._made_on = threading.get_ident()
        self._db = sqlite3.connect(":memory:")
        self._db.execute("create table steps (n integer)")
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def _observe(self, done: bool = False) -> ThreadBoundObservation:
        import threading

        (steps,) = self._db.execute("select count(*) from steps").fetchone()
        return ThreadBoundObservation(steps=steps, same_thread=threading.get_ident() == self._made_on, reward=1.0, done=done)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ThreadBoundObservation:
        self._db.execute("delete from steps")
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return self._observe()

    def step(self, action: ThreadBoundAction, timeout_s: Optional[float] = None, **kwargs: Any) -> ThreadBoundObservation:
        import asyncio

        async def pause() -> int:
            await asyncio.sleep(action.pause_ms / 1e3)
            return 1

        self._db.execute("insert into steps values (?)", (asyncio.run(pause()),))
        self._state.step_count += 1
        return self._observe()

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._db.close()  # (on another thread, sqlite3 raises ProgrammingError)


# --------------------------------------------------------------------------
# arena: a chat-style observation, as OpenEnv's TextArena env has
# --------------------------------------------------------------------------

ARENA_EPISODE_LENGTH = 3


class ArenaMessage(BaseModel):
    sender_id: int
    content: str
    category: str


class ArenaAction(Action):
    message: str


class ArenaObservation(Observation):
    prompt: str
    messages: List[ArenaMessage] = Field(default_factory=list)
    current_player_id: int = 0
    legal_players: List[int] = Field(default_factory=list)
    info: Dict[str, Any] = Field(default_factory=dict)


class ArenaEnvironment(Environment[ArenaAction, ArenaObservation, State]):
    """Say "hello" (reward 1); every step adds the message and a reply to ``messages``; done after 3 steps.

    ``messages`` grows by two per step; ``info`` is free-form (``turn`` and a nested ``detail``).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self._messages: List[ArenaMessage] = []

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ArenaObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self._messages = []
        return ArenaObservation(prompt="say hello", legal_players=[0], info={"turn": 0})

    def step(self, action: ArenaAction, timeout_s: Optional[float] = None, **kwargs: Any) -> ArenaObservation:
        self._state.step_count += 1
        n = self._state.step_count
        self._messages += [
            ArenaMessage(sender_id=0, content=action.message, category="ACTION"),
            ArenaMessage(sender_id=-1, content=f"you said {action.message}", category="FEEDBACK"),
        ]
        return ArenaObservation(
            prompt="say hello",
            messages=list(self._messages),
            legal_players=[0],
            info={"turn": n, "detail": {"said": [action.message]}},
            reward=float(action.message == "hello"),
            done=n >= ARENA_EPISODE_LENGTH,
        )

    @property
    def state(self) -> State:
        return self._state


# --------------------------------------------------------------------------
# tools: a tool call with free-form arguments, shaped as OpenEnv's MCP CallToolAction
# --------------------------------------------------------------------------


class ToolAction(Action):
    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    arguments: Dict[str, Any] = Field(default_factory=dict)


class ToolObservation(Observation):
    tool_name: str = ""
    result: Any = None
    error: Optional[str] = None


class ToolEnvironment(Environment[ToolAction, ToolObservation, State]):
    """Tools ``add`` (``a + b``) and ``upper`` (``text.upper()``); unknown tools or arguments give ``error``."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ToolObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return ToolObservation()

    def step(self, action: ToolAction, timeout_s: Optional[float] = None, **kwargs: Any) -> ToolObservation:
        self._state.step_count += 1
        args = action.arguments
        try:
            if action.tool_name == "add":
                result: Any = args["a"] + args["b"]
            elif action.tool_name == "upper":
                result = {"text": args["text"].upper()}
            else:
                return ToolObservation(tool_name=action.tool_name, error=f"no tool {action.tool_name!r}", reward=0.0)
        except (KeyError, TypeError) as exc:
            return ToolObservation(tool_name=action.tool_name, error=f"bad arguments: {exc}", reward=0.0)
        return ToolObservation(tool_name=action.tool_name, result=result, reward=1.0)

    @property
    def state(self) -> State:
        return self._state


class NoteAction(Action):
    guess: str
    note: Optional[str] = None


class NoteObservation(Observation):
    got: str = ""


class NoteEnvironment(Environment[NoteAction, NoteObservation, State]):
    """Answers with ``repr`` of the ``(guess, note)`` it got: whether an optional field came as None or as a value."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> NoteObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return NoteObservation()

    def step(self, action: NoteAction, timeout_s: Optional[float] = None, **kwargs: Any) -> NoteObservation:
        self._state.step_count += 1
        return NoteObservation(got=repr((action.guess, action.note)), reward=1.0)

    @property
    def state(self) -> State:
        return self._state


# --------------------------------------------------------------------------
# moves: a list of legal moves that shrinks as the game goes on
# --------------------------------------------------------------------------


class MovesAction(Action):
    move: int = Field(ge=0, le=3)


class MovesObservation(Observation):
    legal: List[int] = Field(default_factory=list)


class MovesEnvironment(Environment[MovesAction, MovesObservation, State]):
    """Four moves; each step takes one (reward 1 if it was legal); done when none is left."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self._legal = [0, 1, 2, 3]

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> MovesObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self._legal = [0, 1, 2, 3]
        return MovesObservation(legal=list(self._legal))

    def step(self, action: MovesAction, timeout_s: Optional[float] = None, **kwargs: Any) -> MovesObservation:
        self._state.step_count += 1
        legal = action.move in self._legal
        self._legal = [m for m in self._legal if m != action.move] if legal else self._legal[1:]
        return MovesObservation(legal=list(self._legal), reward=float(legal), done=not self._legal)

    @property
    def state(self) -> State:
        return self._state


# --------------------------------------------------------------------------
# page: an image field that is null until the first step (a browser's screenshot)
# --------------------------------------------------------------------------


class PageAction(Action):
    url: str


class PageObservation(Observation):
    text: str = ""
    screenshot: Optional[List[List[int]]] = None


class PageEnvironment(Environment[PageAction, PageObservation, State]):
    """``text`` is the url visited; ``screenshot`` is null after reset, then a 2x2 image of the step count."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> PageObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return PageObservation(text="blank")

    def step(self, action: PageAction, timeout_s: Optional[float] = None, **kwargs: Any) -> PageObservation:
        self._state.step_count += 1
        n = self._state.step_count
        return PageObservation(text=action.url, screenshot=[[n, n], [n, n]], reward=1.0)

    @property
    def state(self) -> State:
        return self._state


# gear: an enum action and observation whose values are not their indices
class GearAction(Action):
    gear: Literal[2, 1, 0]


class GearObservation(Observation):
    gear: Literal[2, 1, 0]


class GearEnvironment(Environment[GearAction, GearObservation, State]):
    """The observation is the gear last chosen (2 after reset); reward is the gear's value."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GearObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return GearObservation(gear=2)

    def step(self, action: GearAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GearObservation:
        self._state.step_count += 1
        return GearObservation(gear=action.gear, reward=float(action.gear))

    @property
    def state(self) -> State:
        return self._state


# mcp: an OpenEnv MCPEnvironment (a FastMCP server's tools, called through step)
class CalcEnvironment(MCPEnvironment):
    """An MCP env with tools ``add(a, b)`` and ``opened()`` (how many times its MCP client session was opened).

    Its actions are MCP's ``list_tools`` and ``call_tool``.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("calc")

        @mcp.tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool
        def opened() -> int:
            """How many times this env's MCP client session was opened (not counting nested uses)."""
            return self.sessions_opened

        super().__init__(mcp)
        self._state = State(episode_id=None, step_count=0)
        self.sessions_opened = 0
        self._depth = 0

    @contextlib.asynccontextmanager
    async def mcp_session(self):
        self._depth += 1
        if self._depth == 1:
            self.sessions_opened += 1
        try:
            async with super().mcp_session() as client:
                yield client
        finally:
            self._depth -= 1

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return Observation(done=False, reward=0.0)

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"not an MCP action: {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state


# --------------------------------------------------------------------------
# form: field forms that real models use (list bounds, a union, an alias, Optional[bool])
# --------------------------------------------------------------------------

FORM_EPISODE_LENGTH = 3


class FormAction(Action):
    words: List[str] = Field(min_length=1, max_length=2)
    value: Union[int, str]


class FormObservation(Observation):
    board_size: int = Field(alias="boardSize", ge=0, le=10)  # /schema says boardSize; model_dump() sends board_size
    last_value: str = ""
    truncated: Optional[bool] = None


class FormEnvironment(Environment[FormAction, FormObservation, State]):
    """``boardSize`` is the number of words sent; the episode is cut (``truncated``) after 3 steps."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> FormObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return FormObservation(boardSize=0)

    def step(self, action: FormAction, timeout_s: Optional[float] = None, **kwargs: Any) -> FormObservation:
        self._state.step_count += 1
        cut = self._state.step_count >= FORM_EPISODE_LENGTH
        return FormObservation(boardSize=len(action.words), last_value=repr(action.value), truncated=cut or None, done=cut, reward=1.0)

    @property
    def state(self) -> State:
        return self._state


class DialAction(Action):
    temperature: float = Field(ge=0.1, le=0.3)


class DialObservation(Observation):
    heard: float


class DialEnvironment(Environment[DialAction, DialObservation, State]):
    """Says back the ``temperature`` it was sent; reward 1.0 when that is exactly 0.3, the schema's maximum."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> DialObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return DialObservation(heard=0.0)

    def step(self, action: DialAction, timeout_s: Optional[float] = None, **kwargs: Any) -> DialObservation:
        self._state.step_count += 1
        return DialObservation(heard=action.temperature, reward=float(action.temperature == 0.3))

    @property
    def state(self) -> State:
        return self._state


from tests.servers.shaped_envs import (  # noqa: E402  (shapes of OpenEnv's own envs)
    ControlAction,
    ControlEnvironment,
    ControlObservation,
    ControlState,
    GridAction,
    GridEnvironment,
    GridObservation,
    TokensAction,
    TokensEnvironment,
    TokensObservation,
    TurnAction,
    TurnEnvironment,
    TurnObservation,
)

ENVIRONMENTS: Dict[str, Tuple[type, Type[Action], Type[Observation], Type[State]]] = {
    "grid": (GridEnvironment, GridAction, GridObservation, State),
    "tokens": (TokensEnvironment, TokensAction, TokensObservation, State),
    "control": (ControlEnvironment, ControlAction, ControlObservation, ControlState),
    "turn": (TurnEnvironment, TurnAction, TurnObservation, State),
    "mcp": (CalcEnvironment, CallToolAction, CallToolObservation, State),
    "gear": (GearEnvironment, GearAction, GearObservation, State),
    "page": (PageEnvironment, PageAction, PageObservation, State),
    "moves": (MovesEnvironment, MovesAction, MovesObservation, State),
    "tools": (ToolEnvironment, ToolAction, ToolObservation, State),
    "arena": (ArenaEnvironment, ArenaAction, ArenaObservation, State),
    "echo": (EchoEnvironment, EchoAction, EchoObservation, State),
    "cartpole": (CartPoleEnvironment, CartPoleAction, CartPoleObservation, CartPoleState),
    "mixed": (MixedEnvironment, MixedAction, MixedObservation, MixedState),
    "slow": (SlowCartPoleEnvironment, CartPoleAction, CartPoleObservation, CartPoleState),
    "guess": (GuessEnvironment, GuessAction, GuessObservation, State),
    "form": (FormEnvironment, FormAction, FormObservation, State),
    "dial": (DialEnvironment, DialAction, DialObservation, State),
}
#: environments whose reset observation model differs from the step one
RESET_OBSERVATIONS: Dict[str, Type[Observation]] = {"guess": GuessResetObservation}


def create_app(name: str, max_concurrent_envs: int):
    """Return OpenEnv's stock FastAPI app serving environment ``name``."""
    try:
        env_cls, action_cls, obs_cls, state_cls = ENVIRONMENTS[name]
    except KeyError:
        raise ValueError(f"unknown stock env {name!r}; choose from {sorted(ENVIRONMENTS)}") from None
    return create_fastapi_app(
        env_cls,
        action_cls,
        obs_cls,
        max_concurrent_envs=max_concurrent_envs,
        env_name=name,
        state_cls=state_cls,
        reset_observation_cls=RESET_OBSERVATIONS.get(name),
    )


class TrapAction(MixedAction):
    """``MixedAction`` with a ``note``; the note ``"boom"`` makes validation raise a RuntimeError, which pydantic
    does not turn into a ValidationError (a validator with a bug)."""

    note: str = ""

    @model_validator(mode="before")
    @classmethod
    def _trap(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("note") == "boom":
            raise RuntimeError("the action's validator failed")
        return data


class TrapEnvironment(MixedEnvironment):
    """``MixedEnvironment`` serving :class:`TrapAction` (serve with ``--action-class``)."""


class SilentMixedEnvironment(MixedEnvironment):
    """``MixedEnvironment`` whose steps carry no reward (``reward=None``), as OpenEnv allows."""

    def step(self, action: MixedAction, timeout_s: Optional[float] = None, **kwargs: Any) -> MixedObservation:
        observation = super().step(action, timeout_s, **kwargs)
        observation.reward = None
        return observation
