"""Hosting an OpenEnv ``Environment`` subclass (needs the optional ``openenv`` package).

Behaves as OpenEnv 0.10.0's own server does: actions are read with its
``deserialize_action`` (``ActionCls.model_validate``, and MCP's ``list_tools``
and ``call_tool`` actions for envs whose action class is the generic
``Action`` or an MCP one); observations are sent as ``model_dump()`` without
``reward`` and ``done``; reset keyword arguments that ``reset`` does not accept
are dropped; ``reset_async``/``step_async`` are awaited when the class
overrides them; an env class with ``REQUIRES_SINGLE_THREAD_EXECUTOR`` has all
its calls run on one thread; more than one session needs
``SUPPORTS_CONCURRENT_SESSIONS``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import typing
from typing import Any, Awaitable, Callable, Mapping

from .hosts import Host, HostFactory, StepOutput
from .values import ActionError, pydantic_errors

__all__ = ["OpenEnvHost", "OpenEnvHostFactory", "ConcurrencyError", "environment_classes"]

logger = logging.getLogger(__name__)

#: Seconds to wait for an env's ``mcp_session()`` to open and to close.
_MCP_OPEN_TIMEOUT = 60.0
_MCP_CLOSE_TIMEOUT = 5.0


class ConcurrencyError(ValueError):
    """The env class does not declare ``SUPPORTS_CONCURRENT_SESSIONS`` but several sessions were asked for."""


def _base_environment() -> type[Any]:
    from openenv.core.env_server.interfaces import Environment

    return Environment


def environment_classes(env_cls: type[Any]) -> tuple[type[Any] | None, type[Any] | None, type[Any] | None]:
    """``(ActionCls, ObservationCls, StateCls)`` from ``class E(Environment[A, O, S])``, where given."""
    base = _base_environment()
    for klass in inspect.getmro(env_cls):
        for orig in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(orig) is base:
                args = [a if isinstance(a, type) else None for a in typing.get_args(orig)]
                args += [None] * (3 - len(args))
                return args[0], args[1], args[2]
    return None, None, None


def _valid_kwargs(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``fn`` accepts (all of them if it takes ``**kwargs``), as stock does."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def _plain(value: Any) -> Any:
    """numpy values in action fields become lists and Python scalars, as JSON would carry them."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _json_fields(model: Any, exclude: set[str] | None = None) -> dict[str, Any]:
    """A model's fields as the stock server sends them: JSON values (enums by value,
    datetimes in ISO format; non-finite floats become null when encoded). Models
    whose fields have no JSON form keep their Python values."""
    try:
        return model.model_dump(mode="json", exclude=exclude)
    except Exception:  # (a field type pydantic cannot write as JSON)
        return model.model_dump(exclude=exclude)


class OpenEnvHost(Host):
    """One session: one OpenEnv ``Environment`` instance."""

    def __init__(self, env: Any, action_cls: type[Any]) -> None:
        base = _base_environment()
        self.env = env
        self._action_cls = action_cls
        self.async_reset = getattr(type(env).reset_async, "__func__", type(env).reset_async) is not base.reset_async
        self.async_step = getattr(type(env).step_async, "__func__", type(env).step_async) is not base.step_async

    def parse_action(self, fields: Mapping[str, Any]) -> Any:
        from openenv.core.env_server.serialization import deserialize_action
        from pydantic import ValidationError

        data = _plain(dict(fields))
        try:
            if isinstance(data.get("type"), str):
                # As the stock server: an env whose action class is the generic ``Action``
                # or an MCP one also takes MCP's ``{"type": "list_tools"}`` and
                # ``{"type": "call_tool", ...}``. (Only for a string ``type``: openenv's
                # lookup fails on an unhashable one, which the model may well accept.)
                return deserialize_action(data, self._action_cls)
            return self._action_cls.model_validate(data)
        except ValidationError as exc:
            raise ActionError("Invalid message", errors=pydantic_errors(exc)) from None

    @staticmethod
    def _output(observation: Any) -> StepOutput:
        fields = _json_fields(observation, exclude={"reward", "done"})
        metadata = fields.pop("metadata", None) or {}
        reward = observation.reward
        return StepOutput(fields, None if reward is None else float(reward), bool(observation.done), dict(metadata))

    def _reset_kwargs(self, fn: Callable[..., Any], seed: int | None, options: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(options)
        if seed is not None:
            kwargs["seed"] = seed
        return _valid_kwargs(fn, kwargs)

    def reset(self, seed: int | None, options: dict[str, Any]) -> StepOutput:
        return self._output(self.env.reset(**self._reset_kwargs(self.env.reset, seed, options)))

    async def reset_async(self, seed: int | None, options: dict[str, Any]) -> StepOutput:
        kwargs = self._reset_kwargs(self.env.reset_async, seed, options)
        return self._output(await self.env.reset_async(**kwargs))

    def step(self, action: Any) -> StepOutput:
        return self._output(self.env.step(action))

    async def step_async(self, action: Any) -> StepOutput:
        return self._output(await self.env.step_async(action))

    def state(self) -> dict[str, Any]:
        state = self.env.state
        if hasattr(state, "model_dump"):
            return _json_fields(state)
        return dict(state) if state else {}

    def close(self) -> None:
        self.env.close()

    async def open_async(self) -> None:
        """Hold the env's ``mcp_session()`` open for the session, as the stock server does.

        An MCP env's tool calls then reuse one client session instead of
        opening one each (half the time of a tool call, measured). The context
        is entered and left by one task of its own, as MCP clients require.
        """
        factory = getattr(self.env, "mcp_session", None)
        if not callable(factory):
            return
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._release = asyncio.Event()

        async def hold() -> None:
            try:
                async with factory():
                    ready.set_result(None)
                    await self._release.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                    return
                raise

        self._holder: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(hold(), name="mcp_session")
        try:
            async with asyncio.timeout(_MCP_OPEN_TIMEOUT):
                await ready
        except TimeoutError:
            await self.close_async()
            raise TimeoutError(f"the env's mcp_session() did not open in {_MCP_OPEN_TIMEOUT:.0f} s") from None

    async def close_async(self) -> None:
        holder = getattr(self, "_holder", None)
        if holder is None:
            return
        self._holder = None
        self._release.set()
        try:
            async with asyncio.timeout(_MCP_CLOSE_TIMEOUT):
                await holder
        except Exception:
            logger.warning("closing the MCP session of a %s env failed", type(self.env).__name__, exc_info=True)

    # ------------------------------------------------------------ MCP over HTTP (POST /mcp)

    def _mcp_style_actions(self) -> bool:
        from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction

        return self._action_cls in (CallToolAction, ListToolsAction)

    async def _mcp_style_step(self, run: Callable[..., Awaitable[Any]], action: Any) -> Any:
        if self.async_step:
            return await self.env.step_async(action)
        return await run(self.env.step, action)

    async def list_tools(self, run: Callable[..., Awaitable[Any]]) -> list[dict[str, Any]]:
        """As the stock server's ``tools/list``: the env's MCP client, else its MCP server, else a step."""
        from openenv.core.env_server.mcp_types import ListToolsAction, ListToolsObservation

        client, server = getattr(self.env, "mcp_client", None), getattr(self.env, "mcp_server", None)
        if client is not None:
            tools = await self._with_mcp_client(client, client.list_tools)
            return [t.model_dump() if hasattr(t, "model_dump") else dict(t) for t in tools]
        if server is not None:
            from openenv.core.env_server.mcp_environment import get_server_tools

            return [
                {"name": tool.name, "description": tool.description or "", "inputSchema": tool.parameters or {}}
                for tool in get_server_tools(server).values()
            ]
        if self._mcp_style_actions():
            observation = await self._mcp_style_step(run, ListToolsAction())
            if isinstance(observation, ListToolsObservation):
                return [tool.model_dump() for tool in observation.tools]
            raise RuntimeError(f"MCP-style tools/list step returned {type(observation).__name__}, expected ListToolsObservation")
        raise NotImplementedError("Environment does not support MCP")

    async def call_tool(self, run: Callable[..., Awaitable[Any]], name: str, arguments: dict[str, Any]) -> Any:
        """As the stock server's ``tools/call`` (the result made JSON by openenv's own rules)."""
        from openenv.core.env_server.http_server import _make_json_serializable
        from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

        client, server = getattr(self.env, "mcp_client", None), getattr(self.env, "mcp_server", None)
        if client is not None:
            result = await self._with_mcp_client(client, lambda: client.call_tool(name=name, arguments=arguments))
        elif server is not None:
            from openenv.core.env_server.mcp_environment import get_server_tools

            tool = get_server_tools(server).get(name)
            if tool is None:
                raise LookupError(f"Tool not found: {name}")
            if inspect.iscoroutinefunction(tool.fn):
                result = await tool.fn(**arguments)
            else:  # (a blocking tool runs where env calls run, not on the event loop)
                result = await run(functools.partial(tool.fn, **arguments))
                if inspect.isawaitable(result):
                    result = await result
        elif self._mcp_style_actions():
            observation = await self._mcp_style_step(run, CallToolAction(tool_name=name, arguments=arguments))
            if not isinstance(observation, CallToolObservation):
                raise RuntimeError(f"MCP-style tools/call step returned {type(observation).__name__}, expected CallToolObservation")
            result = observation
        else:
            raise NotImplementedError("Environment does not support MCP")
        return _make_json_serializable(result)

    async def _with_mcp_client(self, client: Any, operation: Callable[[], Awaitable[Any]]) -> Any:
        """``operation()`` in the env's MCP client session: the one held open for the session, else a new one."""
        if client.is_connected():
            return await operation()
        factory = getattr(self.env, "mcp_session", None)
        if callable(factory):
            async with factory():
                return await operation()
        async with client:
            return await operation()


class OpenEnvHostFactory(HostFactory):
    """Hosts an OpenEnv ``Environment``.

    Args:
        env: the ``Environment`` subclass, or a callable returning a new instance.
        action_cls: the ``Action`` subclass (default: from ``Environment[A, O, S]``).
        observation_cls: the ``Observation`` subclass (default: likewise).
        state_cls: the ``State`` subclass for ``/schema`` (default: likewise, else ``State``).
        name: the name in ``/metadata`` and logs (default: the class name).
        max_sessions: the server's session limit, checked against
            ``SUPPORTS_CONCURRENT_SESSIONS``.

    Raises:
        ValueError: the Action or Observation class cannot be found.
        ConcurrencyError: ``max_sessions > 1`` for an env class that does not
            declare ``SUPPORTS_CONCURRENT_SESSIONS = True``.
    """

    def __init__(
        self,
        env: type[Any] | Callable[[], Any],
        action_cls: type[Any] | None = None,
        observation_cls: type[Any] | None = None,
        *,
        state_cls: type[Any] | None = None,
        name: str | None = None,
        max_sessions: int = 1,
    ) -> None:
        from openenv.core.env_server.types import State

        self._factory = env
        target = env.func if isinstance(env, functools.partial) else env
        env_cls: type[Any] | None = target if inspect.isclass(target) else None
        if env_cls is not None:
            a, o, s = environment_classes(env_cls)
            action_cls = action_cls or a
            observation_cls = observation_cls or o
            state_cls = state_cls or s
        if action_cls is None or observation_cls is None:
            raise ValueError(
                "cannot tell the env's Action and Observation classes; pass action_cls= and observation_cls= "
                "(CLI: --action-class module:Name --observation-class module:Name)"
            )
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.state_cls = state_cls or State
        self.name = name or str(getattr(env_cls or env, "__name__", "environment"))
        if max_sessions > 1 and env_cls is not None and not getattr(env_cls, "SUPPORTS_CONCURRENT_SESSIONS", False):
            raise ConcurrencyError(
                f"Environment {env_cls.__name__!r} is not marked as SUPPORTS_CONCURRENT_SESSIONS; "
                f"cannot run with max_sessions={max_sessions}. Use max_sessions=1, or set "
                "SUPPORTS_CONCURRENT_SESSIONS = True if its sessions are isolated."
            )
        # As OpenEnv's own server: each session's env made, reset, stepped and closed on a thread of
        # its own (an env may hold what belongs to the thread that made it: an sqlite3 connection;
        # or run an event loop of its own in a step: asyncio.run), unless the server is told otherwise.
        self.default_execution = "session"
        if env_cls is not None and getattr(env_cls, "REQUIRES_SINGLE_THREAD_EXECUTOR", False):
            self.execution = "thread"
            self.threads = 1
        self._metadata: dict[str, Any] | None = None

    def make(self) -> OpenEnvHost:
        return OpenEnvHost(self._factory(), self.action_cls)

    def schema(self) -> dict[str, Any]:
        observation = self.observation_cls.model_json_schema()
        return {
            "action": self.action_cls.model_json_schema(),
            "observation": observation,
            "reset_observation": observation,
            "state": self.state_cls.model_json_schema(),
        }

    def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            env = self._factory()
            try:
                self._metadata = env.get_metadata().model_dump(mode="json")
            finally:
                env.close()
        return self._metadata
