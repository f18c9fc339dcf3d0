"""A Gymnasium env served by the *stock* OpenEnv server (needs the optional ``openenv`` package).

For comparisons and for users who want the reference server: the env is
wrapped as an OpenEnv ``Environment`` with pydantic Action/Observation models
generated from its spaces, and served by ``openenv``'s own
``create_fastapi_app`` under uvicorn (JSON only, one session per connection).
The wire shape matches ``openenv-gym serve``'s stock path: action field
``action``, observation fields ``observation``, ``truncated`` and
``terminated``, Gymnasium's ``info`` as metadata.

    python -m openenv_gym.server.hosting.openenv_app CartPole-v1 --port 8000 --max-sessions 64

or ``launch_local(env_id, stock=True)``. A stock OpenEnv app itself (an
env's ``server/app.py``, ``app = create_app(...)``) is served as it is:

    python -m openenv_gym.server.hosting.openenv_app server.app:app --app-dir envs/maze_env --port 8000

or ``launch_local("server.app:app", stock=True, app_dir="envs/maze_env", servers=4)``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import uuid
from typing import Any, List, Mapping, Optional

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .values import plain_value

__all__ = ["gym_environment", "create_openenv_app", "find_app", "is_app", "main"]


def _annotation(space: spaces.Space) -> tuple[Any, dict[str, Any]]:
    """The pydantic field type and ``Field`` keywords for values of ``space``."""
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return int, {"ge": start, "le": start + int(space.n) - 1}
    if isinstance(space, (spaces.Box, spaces.MultiBinary, spaces.MultiDiscrete)):
        item: Any = float if np.dtype(space.dtype).kind == "f" else int
        if not space.shape:
            return item, {}
        annotation = item
        for _ in space.shape[1:]:
            annotation = List[annotation]  # type: ignore[valid-type]
        # Only the outer length is declared, as a stock env would write it.
        return List[annotation], {"min_length": space.shape[0], "max_length": space.shape[0]}  # type: ignore[valid-type]
    raise ValueError(f"the stock OpenEnv adapter does not handle {type(space).__name__} spaces")


def gym_environment(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> tuple[type, type, type]:
    """``(EnvironmentCls, ActionCls, ObservationCls)`` wrapping ``gymnasium.make(env_id, **env_kwargs)``."""
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field, create_model

    kwargs = dict(env_kwargs or {})
    try:
        probe = gym.make(env_id, **kwargs)
    except gym.error.NameNotFound as exc:  # (an OpenEnv Environment's module:Class, say)
        raise ValueError(
            f"the stock OpenEnv adapter (launch_local(stock=True)) serves Gymnasium env ids only, such as "
            f"CartPole-v1 or module:EnvId; {env_id!r} is none ({exc}). An OpenEnv Environment class is served "
            f"by openenv-gym serve (launch_local without stock=True) or by OpenEnv's own server"
        ) from None
    act_type, act_field = _annotation(probe.action_space)
    obs_type, obs_field = _annotation(probe.observation_space)
    action_space = probe.action_space
    probe.close()
    action_cls = create_model("GymAction", __base__=Action, action=(act_type, Field(**act_field)))
    observation_cls = create_model(
        "GymObservation",
        __base__=Observation,
        observation=(obs_type, Field(**obs_field)),
        truncated=(bool, Field(default=False)),
        terminated=(bool, Field(default=False)),
    )

    class GymEnvironment(Environment):
        """One Gymnasium env per session."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self.env = gym.make(env_id, **kwargs)
            self._state = State(episode_id=None, step_count=0)

        def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **options: Any) -> Any:
            obs, info = self.env.reset(seed=seed, options=options or None)
            self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
            return observation_cls(observation=plain_value(obs, keep_arrays=False), metadata=_info(info))

        def step(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Any:
            value = action.action
            if not isinstance(action_space, spaces.Discrete):
                value = np.asarray(value, dtype=action_space.dtype)
            obs, reward, terminated, truncated, info = self.env.step(value)
            self._state.step_count += 1
            return observation_cls(
                observation=plain_value(obs, keep_arrays=False),
                truncated=bool(truncated),
                terminated=bool(terminated),
                reward=float(reward),
                done=bool(terminated or truncated),
                metadata=_info(info),
            )

        @property
        def state(self) -> Any:
            return self._state

        def close(self) -> None:
            self.env.close()

    return GymEnvironment, action_cls, observation_cls


def _info(info: Mapping[str, Any]) -> dict[str, Any]:
    return plain_value(dict(info), keep_arrays=False) if info else {}


def create_openenv_app(env_id: str, env_kwargs: Mapping[str, Any] | None = None, *, max_sessions: int = 64) -> Any:
    """The stock OpenEnv FastAPI app serving ``env_id``."""
    from openenv.core.env_server.http_server import create_fastapi_app

    env_cls, action_cls, observation_cls = gym_environment(env_id, env_kwargs)
    return create_fastapi_app(env_cls, action_cls, observation_cls, max_concurrent_envs=max_sessions)


def is_app(obj: Any) -> bool:
    """Whether ``obj`` is an ASGI application (a stock OpenEnv server's FastAPI ``app``), not an env or a class."""
    return not isinstance(obj, type) and callable(obj) and hasattr(obj, "router")


def find_app(spec: str, app_dir: str | None = None) -> Any:
    """The ASGI app that ``spec`` (``module:name``) names, importing from ``app_dir`` first; ``None`` if it names none.

    ``app_dir`` goes first on ``sys.path``, as uvicorn's ``--app-dir`` does (an
    env laid out as OpenEnv's are, ``server/app.py`` beside ``models.py``:
    ``server.app:app`` from the env's folder).

    Raises:
        ImportError: the module (or what it imports) cannot be imported.
    """
    if app_dir is not None:
        sys.path.insert(0, os.path.abspath(app_dir))
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        if app_dir is not None:
            raise ValueError(f"with an app folder, name the app as module:name (server.app:app), not {spec!r}")
        return None
    if app_dir is None and importlib.util.find_spec(module_name.partition(".")[0]) is None:
        return None
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if is_app(obj):
        return obj
    if app_dir is not None:
        raise ValueError(f"{spec!r} is no ASGI app (a stock OpenEnv server's `app = create_app(...)`)")
    return None


def main(argv: list[str] | None = None) -> None:
    """``python -m openenv_gym.server.hosting.openenv_app SPEC [--app-dir DIR] [--host] [--port] [--max-sessions] [--env-kwargs]``.

    ``SPEC`` is a Gymnasium env id, served by the stock server through
    :func:`gym_environment`, or the ``module:name`` of a stock OpenEnv app,
    served as it is (its own session limit holds; ``--max-sessions`` and
    ``--env-kwargs`` do not apply to it).
    """
    parser = argparse.ArgumentParser(description="Serve a Gymnasium env, or a stock OpenEnv app, with the stock OpenEnv server (uvicorn).")
    parser.add_argument("env_id")
    parser.add_argument("--app-dir", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=64)
    parser.add_argument("--env-kwargs", type=json.loads, default=None)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    import uvicorn

    if args.parent_pid is not None:
        from ..net.workers import exit_with_parent

        exit_with_parent(args.parent_pid)
    if os.getcwd() not in sys.path and "" not in sys.path:  # (module:name from the current folder, as uvicorn)
        sys.path.insert(0, os.getcwd())
    app = find_app(args.env_id, args.app_dir)
    if app is None:
        app = create_openenv_app(args.env_id, args.env_kwargs, max_sessions=args.max_sessions)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    os._exit(0)


if __name__ == "__main__":
    main()
