"""An OpenEnv environment of tool calls, shaped as OpenEnv's MCP ``CallToolAction``.

Nothing here knows about openenv_gym. The action names a tool and gives it
free-form ``arguments`` (``Dict[str, Any]``); the observation carries the
tool's free-form ``result`` (``Any``), an ``error`` text, and the chat so far
(``history: List[Turn]``). The task: find the sum of a hidden list of
numbers, read with the ``read`` tool, added with ``add``, and answered with
``answer``. Reward 1 for the right answer; the episode ends on an answer or
after ``MAX_CALLS`` calls.

Serve it with openenv_gym's server (from the repository root)::

    openenv-gym serve examples.tool_env:ToolEnvironment --port 8000

Needs the ``openenv`` package (``pip install "openenv-gym[openenv]"``).
"""

from __future__ import annotations

import random
import uuid
from typing import Any, Dict, List, Literal, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import BaseModel, Field

MAX_CALLS = 8


class ToolCall(Action):
    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    arguments: Dict[str, Any] = Field(default_factory=dict)


class Turn(BaseModel):
    role: str
    content: str


class ToolObservation(Observation):
    task: str = ""
    history: List[Turn] = Field(default_factory=list)
    result: Any = None
    error: Optional[str] = None


class ToolEnvironment(Environment[ToolCall, ToolObservation, State]):
    """Tools: ``read`` (the hidden numbers), ``add`` (``{"numbers": [...]}``), ``answer`` (``{"value": n}``)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self._numbers: List[int] = []
        self._history: List[Turn] = []

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ToolObservation:
        rng = random.Random(seed)
        self._numbers = [rng.randint(1, 99) for _ in range(rng.randint(2, 5))]
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self._history = [Turn(role="user", content="What is the sum of the numbers? Tools: read, add, answer.")]
        return ToolObservation(task=self._history[0].content, history=list(self._history))

    def step(self, action: ToolCall, timeout_s: Optional[float] = None, **kwargs: Any) -> ToolObservation:
        self._state.step_count += 1
        args, result, error, reward, done = action.arguments, None, None, 0.0, False
        if action.tool_name == "read":
            result = list(self._numbers)
        elif action.tool_name == "add" and isinstance(args.get("numbers"), list):
            result = sum(args["numbers"])
        elif action.tool_name == "answer" and "value" in args:
            reward, done = float(args["value"] == sum(self._numbers)), True
            result = "correct" if reward else "wrong"
        else:
            error = f"unknown tool or arguments: {action.tool_name}({args})"
        self._history.append(Turn(role="tool", content=error or f"{action.tool_name} -> {result}"))
        return ToolObservation(
            history=list(self._history),
            result=result,
            error=error,
            reward=reward,
            done=done or self._state.step_count >= MAX_CALLS,
        )

    @property
    def state(self) -> State:
        return self._state
