"""The stock OpenEnv ``/ws`` connection loop (JSON text frames, one session).

What OpenEnv 0.10.0's server does, message for message: the session is created
when the connection opens (``CAPACITY_REACHED`` or ``FACTORY_ERROR`` and a
close with code 1000 if it cannot be); then one request at a time, each
answered before the next is read; ``close`` ends the session and the
connection. ``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR`` and
``EXECUTION_ERROR`` keep the connection open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from ...errors import ProtocolError
from ...protocol.codec import JsonCodec
from ...protocol.kinds import RequestKind
from ...protocol.messages import (
    EXECUTION_ERROR,
    FACTORY_ERROR,
    INVALID_JSON,
    SESSION_ERROR,
    VALIDATION_ERROR,
    RequestError,
    error_reply,
    observation_reply,
    parse_request,
    reply_error,
    state_reply,
)
from ...protocol.multiplex import MAX_EPISODE_ID
from ..context import ServerContext
from ..hosting.hosts import Host, StepOutput
from ..hosting.sessions import CapacityReached
from ..hosting.values import ActionError, describe_error, plain_value, pydantic_errors
from .mcp_http import SessionUnavailable

__all__ = ["serve_stock"]

logger = logging.getLogger(__name__)


def _observation(out: StepOutput) -> dict[str, Any]:
    return observation_reply(
        plain_value(out.fields, keep_arrays=False),
        out.reward,
        out.done,
        plain_value(out.metadata, keep_arrays=False),
    )


def check_seed(seed: Any) -> int | None:
    """A reset seed: ``None`` or a non-negative int.

    Raises:
        RequestError: ``VALIDATION_ERROR`` for anything else.
    """
    if seed is None or (type(seed) is int and seed >= 0):
        return seed
    raise RequestError(VALIDATION_ERROR, f"Invalid message: 'seed' must be a non-negative integer, got {seed!r:.40}")


async def _handle(ctx: ServerContext, host: Host, message: Any) -> dict[str, Any] | None:
    """The reply to one decoded message; ``None`` for ``close``."""
    try:
        request = parse_request(message)
        if request.type == RequestKind.CLOSE:
            return None
        if request.type == RequestKind.STATE:
            return state_reply(plain_value(host.state(), keep_arrays=False))
        if request.type == RequestKind.RESET:
            options = dict(request.data)
            seed = check_seed(options.pop("seed", None))
            episode_id = options.get("episode_id")
            if type(episode_id) is str and len(episode_id) > MAX_EPISODE_ID:  # (as on the fast path)
                message = f"Invalid message: 'episode_id' must be a string of at most {MAX_EPISODE_ID} characters"
                raise RequestError(VALIDATION_ERROR, message)
            if host.async_reset:
                out = await host.reset_async(seed, options)
            else:
                out = await ctx.runner.call(host.reset, seed, options)
            return _observation(out)
        action = host.parse_action(request.data)
        out = await (host.step_async(action) if host.async_step else ctx.runner.call(host.step, action))
        return _observation(out)
    except RequestError as exc:
        return reply_error(exc)
    except ActionError as exc:
        extra = {"errors": exc.errors} if exc.errors is not None else {}
        return error_reply(VALIDATION_ERROR, exc.message, **extra)
    except Exception as exc:
        logger.debug("%s: request failed", ctx.factory.name, exc_info=True)
        errors = pydantic_errors(exc)
        if errors is not None:  # as the stock server: a model the env built from our input refused it
            return error_reply(VALIDATION_ERROR, "Invalid message", errors=errors)
        return error_reply(EXECUTION_ERROR, describe_error(exc))


async def _loop(ws: ServerConnection, ctx: ServerContext, host: Host, codec: JsonCodec, calls: asyncio.Lock | None = None) -> None:
    """Answer the connection's requests, one at a time, until it closes or sends ``close``.

    ``calls``: a lock the env's calls take (a session shared with ``POST /mcp``).
    """
    async for frame in ws:
        try:
            message = codec.decode(frame)
        except ProtocolError as exc:
            text = str(exc).removeprefix("invalid JSON: ")
            reply: dict[str, Any] | None = error_reply(INVALID_JSON, f"Invalid JSON: {text}")
        else:
            async with calls or contextlib.nullcontext():
                reply = await _handle(ctx, host, message)
        if reply is None:
            await ws.close(1000)
            break
        try:
            text = codec.encode(reply)
        except (TypeError, ValueError, RecursionError) as exc:
            text = codec.encode(error_reply(EXECUTION_ERROR, f"cannot encode the reply as JSON: {exc}"))
        await ws.send(text)


def _session_id(ws: ServerConnection) -> str | None:
    """The ``session_id`` of ``/ws?session_id=...`` (a session made by ``POST /mcp``), if any."""
    request = ws.request
    query = urlsplit(request.path).query if request is not None else ""
    values = parse_qs(query).get("session_id") if query else None  # (the request line is bounded by websockets)
    return values[0] if values else None


async def _serve_attached(ws: ServerConnection, ctx: ServerContext, session_id: str, codec: JsonCodec) -> None:
    """Serve a connection attached to a ``POST /mcp`` session: its env, which outlives the connection."""
    try:
        host, calls = ctx.mcp.attach(session_id)
    except SessionUnavailable as exc:
        await ws.send(codec.encode(error_reply(SESSION_ERROR, str(exc))))
        await ws.close(1000)
        return
    try:
        await _loop(ws, ctx, host, codec, calls)
    except ConnectionClosed:
        pass
    finally:
        await ctx.mcp.detach(session_id)


async def serve_stock(ws: ServerConnection, ctx: ServerContext) -> None:
    """Serve one stock-protocol connection until it closes."""
    codec = JsonCodec(ctx.config.limits, finite=True)
    session_id = _session_id(ws)
    if session_id and ctx.mcp is not None:
        await _serve_attached(ws, ctx, session_id, codec)
        return
    try:
        ctx.table.reserve(1)
    except CapacityReached as exc:
        logger.info("refusing a session: %s", exc)
        try:
            await ws.send(codec.encode(exc.reply()))
            await ws.close(1000, "server at capacity")
        except ConnectionClosed:
            pass
        return
    host: Host | None = None
    try:
        try:
            host = await ctx.make_host()
        except Exception:
            logger.exception("the %s factory failed", ctx.factory.name)
            name = ctx.factory.name
            reply = error_reply(FACTORY_ERROR, f"Environment factory '{name}' failed to create instance.", factory_name=name)
            await ws.send(codec.encode(reply))
            await ws.close(1000, "environment factory failed")
            return
        await _loop(ws, ctx, host, codec)
    except ConnectionClosed:
        pass
    finally:
        if host is not None:
            await ctx.close_host(host)
        ctx.table.release(1)
