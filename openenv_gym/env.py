"""``OpenEnvEnv``: a ``gymnasium.Env`` that drives one remote OpenEnv session.

The env is a thin synchronous face over the asyncio :class:`~openenv_gym.client.Session`,
run on the process's background I/O loop. Spaces come from the server's
``/schema``: from the exact Gymnasium descriptions that openenv_gym servers add,
or else mapped from the JSON Schemas every OpenEnv server publishes.
"""

from __future__ import annotations

import functools
import logging
import math
import reprlib
import ssl as ssl_module
from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from ._actions import coerce_action, refusal
from ._loop import LoopThread
from .client.session import Session
from .config import Limits, Timeouts
from .errors import ConnectionLost, ServerError
from .protocol.messages import StepReply, check_reset_options
from .registration import with_time_limit
from .remote import Tool, fetch_schema, list_tools, resolve_spaces

__all__ = ["OpenEnvEnv"]

logger = logging.getLogger(__name__)

#: Shortens a refused action in its error (a 100,000-character text), not a small array or dict.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 160
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = 16


class OpenEnvEnv(gym.Env):
    """A Gymnasium environment whose dynamics run on a remote OpenEnv server.

    One instance holds one server-side session (one WebSocket). ``reset`` starts
    a new episode on it; if the session was lost (server gone, timeout), ``reset``
    opens a fresh one first.

    Args:
        base_url: the server, ``http(s)://host:port`` or ``ws(s)://host:port[/ws]``.
        observation_space: use this space instead of the one from ``/schema``.
        action_space: use this space instead of the one from ``/schema``.
        obs_key: the observation field that is the observation (for a
            non-``Dict`` observation space when the schema has several fields).
        action_key: the action field that a non-``Dict`` action fills.
        truncated_key: an observation or metadata field that is true when the
            episode was cut short; the step's ``done`` then maps to
            ``truncated`` instead of ``terminated``.
        variable_fields: observation fields (dotted paths) that are lists of
            numbers whose length varies (``("legal_actions",)``): ``Sequence``
            spaces, not ``Box`` shapes taken from the first observation.
        headers: extra handshake and HTTP headers (for example ``Authorization``).
        connect_timeout: seconds to connect (HTTP schema fetch and WebSocket).
        step_timeout: seconds to wait for each reply.
        limits: bounds on what the server may send.
        offer_msgpack: offer the binary fast path (used only if the server selects it).
        ssl: TLS context for ``https``/``wss`` servers.
        render_mode: ``None`` only: remote envs do not render.

    Observations are new objects on every call. ``reward`` is a float (0.0 when
    the server sends none); ``info`` is the server's metadata for the step.
    """

    _spec: EnvSpec | None = None

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        base_url: str,
        *,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        obs_key: str | None = None,
        action_key: str | None = None,
        truncated_key: str | None = None,
        variable_fields: Sequence[str] = (),
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
        step_timeout: float = 60.0,
        limits: Limits | None = None,
        offer_msgpack: bool = True,
        ssl: ssl_module.SSLContext | None = None,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None:  # (gymnasium.make passes render_mode=None along; a mode cannot be served)
            raise ValueError(f"remote envs do not render (the OpenEnv protocol has no frames to give); got render_mode={render_mode!r}")
        if not isinstance(base_url, str):
            many = " (a list of URLs, as launch_local yields, is for OpenEnvVectorEnv)" if isinstance(base_url, (list, tuple)) else ""
            raise TypeError(f"OpenEnvEnv takes one server's base URL, a str; got {type(base_url).__name__}{many}")
        self.base_url = base_url
        self._headers = dict(headers or {})
        self._timeouts = Timeouts(connect=connect_timeout, step=step_timeout)
        self._limits = limits or Limits()
        self._offer_msgpack = offer_msgpack
        self._ssl = ssl
        self._io = LoopThread.shared()
        self._session: Session | None = None
        self._closed = False

        self.schema = fetch_schema(
            base_url,
            headers=self._headers,
            timeout=connect_timeout,
            ssl=ssl,
            max_bytes=self._limits.max_frame_bytes,
            max_containers=self._limits.max_json_containers,
        )
        resolve = functools.partial(
            resolve_spaces,
            self.schema,
            observation_space=observation_space,
            action_space=action_space,
            obs_key=obs_key,
            action_key=action_key,
            truncated_key=truncated_key,
            variable_fields=(variable_fields,) if isinstance(variable_fields, str) else tuple(variable_fields),
            limits=self._limits,
        )
        resolved = resolve()
        session = self._connect()
        if resolved.needs_first_observation:
            # The schema leaves some of it open (a list's length, a map's keys): the first observation says.
            first = self._call(session.reset()).observation
            resolved = resolve(first_observation=first, state=self._state_of(session) if resolved.needs_state else None)
        self._spaces = resolved
        self._obs, self._act = resolved.observation, resolved.action
        self.truncated_key = resolved.truncated_key
        self._terminated_key = resolved.terminated_key
        self._server_time_limit = resolved.max_episode_steps
        self.action_space = self._act.space
        self.observation_space = self._obs.space

    # ------------------------------------------------------------ plumbing

    @property
    def spec(self) -> EnvSpec | None:
        """The env's spec (set by ``gymnasium.make``).

        Where the make call gave no ``max_episode_steps`` and the server says
        that its env has a time limit (an openenv_gym server of a Gymnasium env
        whose spec has one: Pendulum's 200 steps), the spec says it too, as a
        local env's does: tools that read it (``TimeAwareObservation``) work.
        The server truncates there; ``gymnasium.make`` adds no limit of its own.
        """
        return self._spec

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        self._spec = with_time_limit(value, getattr(self, "_server_time_limit", None))

    @property
    def codec(self) -> str | None:
        """``"msgpack"`` on the fast path, ``"json"`` against a stock server, ``None`` when closed."""
        return self._session.codec if self._session is not None else None

    def _call(self, coro: Any, finish: bool = False) -> Any:
        # The session enforces its own timeouts; the outer bound only guards
        # against a bug leaving the caller waiting forever.
        bound = self._timeouts.connect + self._timeouts.step + self._timeouts.close + 5
        return self._io.run(coro, timeout=bound, finish=finish)

    def _request(self, session: Session, start: Any, coroutine: Any) -> StepReply:
        """A step or reset of ``session``: sent by ``start`` and waited for without a task (the hot path).

        The session bounds that wait by its step timeout. While another
        request of the session is in flight, ``coroutine()`` is awaited instead.
        """
        if session._can_start_step():
            return self._io.run_started(start, readers=session._direct_readers)
        return self._call(coroutine())

    def _connect(self) -> Session:
        session = self._session = self._call(
            Session.connect(
                self.base_url,
                headers=self._headers,
                timeouts=self._timeouts,
                limits=self._limits,
                offer_msgpack=self._offer_msgpack,
                ssl=self._ssl,
            )
        )
        return session

    def _state_of(self, session: Session) -> dict[str, Any] | None:
        """The session's state, or ``None`` where the server refuses it (an env whose state fails)."""
        try:
            return self._call(session.state())
        except ServerError:
            return None

    def _live_session(self) -> Session:
        if self._closed:
            raise gym.error.ClosedEnvironmentError("OpenEnvEnv is closed")
        session = self._session
        if session is not None and not session.closed:
            return session
        if session is not None:
            self._call(session.close())
        return self._connect()

    def _to_result(self, reply: StepReply) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs = self._obs.from_wire(reply.observation)
        info = dict(reply.metadata)
        if self._spaces.adds_info(reply.observation):  # fields no space holds, and an action mask
            info.update(self._spaces.info_of(reply.observation))
        truncated = False
        if self.truncated_key is not None:
            flag = reply.observation.get(self.truncated_key, info.get(self.truncated_key, False))
            truncated = bool(flag) and reply.done
        terminated = reply.done and not truncated
        if self._terminated_key is not None and reply.done:  # (both: a time limit on the terminal step)
            terminated = bool(reply.observation.get(self._terminated_key)) or not truncated
        reward = 0.0 if reply.reward is None or math.isnan(reply.reward) else float(reply.reward)
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Start a new episode on the server.

        ``seed`` is sent to the server's ``reset``; ``options`` are sent as extra
        reset keyword arguments. Returns ``(observation, info)``.
        """
        if options and "seed" in options:
            raise ValueError("pass the seed as reset(seed=...), not in options")
        super().reset(seed=seed)
        session = self._live_session()
        options = options or {}
        check_reset_options(options, self._limits.max_depth, msgpack=session.codec == "msgpack")
        reply = self._request(session, functools.partial(session._start_reset, seed, options), lambda: session.reset(seed=seed, **options))
        obs, _, _, _, info = self._to_result(reply)
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Send ``action`` and return ``(obs, reward, terminated, truncated, info)``.

        Raises:
            ValueError: ``action`` is not in ``action_space`` (nothing is sent).
            SessionTimeout, ConnectionLost: the session is gone; call ``reset``.
            ServerError: the server refused the step (the session stays usable).
        """
        if not isinstance(action, np.ndarray) or not self.action_space.contains(action):
            # (lists first: Gymnasium's contains casts them, so [1.7] would pass for an int Box and be sent as 1)
            action = coerce_action(self.action_space, action)
        if not self.action_space.contains(action):
            raise ValueError(
                f"action {_SHORT.repr(action)} is not in the action space {self.action_space}: {refusal(self.action_space, action)}"
            )
        if self._closed:
            raise gym.error.ClosedEnvironmentError("OpenEnvEnv is closed")
        if self._session is None or self._session.closed:
            raise ConnectionLost(f"the session on {self.base_url} was lost; call reset() to start a new episode", url=self.base_url)
        session, wire = self._session, self._act.to_wire(action)
        return self._to_result(self._request(session, functools.partial(session._start_step, wire), lambda: session.step(wire)))

    def state(self) -> dict[str, Any]:
        """The server's state fields for this session (for example ``episode_id``, ``step_count``).

        Raises:
            ConnectionLost: the session was lost, as :meth:`step` raises it
                (only ``reset()`` opens a new one: a new session's state is not
                this episode's, and a step after it would play an env never reset).
        """
        if self._session is not None and self._session.closed and not self._closed:
            raise ConnectionLost(f"the session on {self.base_url} was lost; call reset() to start a new episode", url=self.base_url)
        return self._call(self._live_session().state())

    def list_tools(self) -> list[Tool]:
        """The tools of the server's MCP environment (name, description, JSON Schema of the arguments).

        What OpenEnv's ``MCPToolClient.list_tools()`` gives: MCP's
        ``tools/list`` (on ``POST /mcp``, outside the episode). A tool is
        called with a step: ``env.step({"tool_name": name, "arguments": json_text})``.

        Raises:
            ServerError: the env has no tools (it is no MCP environment).
            ConnectError: no answer within the connect timeout.
        """
        return list_tools(
            self.base_url,
            headers=self._headers,
            timeout=self._timeouts.connect,
            ssl=self._ssl,
            max_bytes=self._limits.max_frame_bytes,
            max_containers=self._limits.max_json_containers,
        )

    def render(self) -> None:
        """``None``, with a warning, as a local env made with ``render_mode=None`` does: remote envs do not render."""
        gym.logger.warn(f"OpenEnvEnv.render: remote envs do not render (the OpenEnv protocol has no frames); {self.base_url} gives none")
        return None

    def close(self) -> None:
        """End the session and close the connection. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            try:
                self._call(session.close(), finish=True)  # (a Ctrl-C waits for it)
            except Exception:  # pragma: no cover - close never raises by contract
                logger.debug("closing session on %s failed", self.base_url, exc_info=True)
        super().close()

    def __reduce_ex__(self, protocol: Any) -> Any:
        # (copy.copy would share the live session between two envs; deepcopy failed on a generator)
        raise TypeError(
            f"an OpenEnvEnv is a live session on {self.base_url} and cannot be copied or pickled; "
            "make another with the same arguments (for other processes, pass a function that makes it)"
        )

    def __del__(self) -> None:
        # Never closed: end the session in the background (its server slot is freed).
        try:
            io = self._io
            if not self._closed and self._session is not None and not io._closed and not io.loop.is_closed():
                io.submit(self._session.close())
        except Exception:
            pass
