"""An environment written for the ``openenv`` package: guess a secret number.

Nothing here knows about openenv_gym: it is a plain OpenEnv ``Environment``
with pydantic Action and Observation models, as OpenEnv environments are
written. ``examples/openenv_environment.py`` serves it two ways and drives
it as a Gymnasium env.

The secret is an integer in ``[LOW, HIGH]``, drawn at ``reset`` from the seed.
Each step guesses a number; the hint says whether the secret is ``higher`` or
``lower``, or the guess was ``correct``. Reward 1 for the correct guess, 0
otherwise; the episode is done when the guess is correct or after
``MAX_GUESSES`` guesses.

Serve it with OpenEnv's own server (from the repository root)::

    python -m uvicorn --factory examples.guess_number_env:create_app --port 8000

or with openenv_gym's server (adds the binary fast path)::

    openenv-gym serve examples.guess_number_env:GuessNumberEnvironment \\
        --action-class examples.guess_number_env:GuessAction \\
        --observation-class examples.guess_number_env:GuessObservation --port 8000

Needs the ``openenv`` package (``pip install "openenv-gym[openenv]"``).
"""

from __future__ import annotations

import random
import uuid
from typing import Any, Literal

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

LOW, HIGH = 1, 100
MAX_GUESSES = 10

Hint = Literal["start", "higher", "lower", "correct"]


class GuessAction(Action):
    guess: int = Field(ge=LOW, le=HIGH, description="the number guessed")


class GuessObservation(Observation):
    hint: Hint = Field(default="start", description="where the secret is relative to the last guess")
    guesses_left: int = Field(ge=0, le=MAX_GUESSES, description="guesses before the episode ends")


class GuessNumberEnvironment(Environment[GuessAction, GuessObservation, State]):
    """One secret number per episode; one instance per session."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._rng = random.Random()
        self._secret = LOW
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        if seed is not None:
            self._rng.seed(seed)
        self._secret = self._rng.randint(LOW, HIGH)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return GuessObservation(hint="start", guesses_left=MAX_GUESSES, reward=0.0, done=False)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        left = MAX_GUESSES - self._state.step_count
        if action.guess == self._secret:
            return GuessObservation(hint="correct", guesses_left=left, reward=1.0, done=True)
        hint: Hint = "higher" if self._secret > action.guess else "lower"
        return GuessObservation(hint=hint, guesses_left=left, reward=0.0, done=left == 0)

    @property
    def state(self) -> State:
        return self._state


def create_app(max_sessions: int = 16) -> Any:
    """OpenEnv's own FastAPI app for this environment (JSON over ``/ws``), for uvicorn."""
    from openenv.core.env_server.http_server import create_fastapi_app

    return create_fastapi_app(GuessNumberEnvironment, GuessAction, GuessObservation, max_concurrent_envs=max_sessions)
