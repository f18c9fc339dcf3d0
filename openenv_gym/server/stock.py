"""The stock OpenEnv ``/ws`` connection loop (JSON text frames, one session).

What OpenEnv 0.10.0's server does, message for message: the session is created
when the connection opens (``CAPACITY_REACHED`` or ``FACTORY_ERROR`` and a
close with code 1000 if it cannot be); then one request at a time, each
answered before the next is read; ``close`` ends the session and the
connection. ``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR`` and
``EXECUTION_ERROR`` keep the connection open.
"""

from __future__ import annotations

import logging
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from ..errors import ProtocolError
from ..protocol.codec import JsonCodec
from ..protocol.messages import (
    EXECUTION_ERROR,
    FACTORY_ERROR,
    INVALID_JSON,
    VALIDATION_ERROR,
    RequestError,
    error_reply,
    observation_reply,
    parse_request,
    reply_error,
    state_reply,
)
from .context import ServerContext
from .hosts import Host, StepOutput
from .sessions import CapacityReached
from .values import ActionError, describe_error, plain_value, pydantic_errors

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
        if request.type == "close":
            return None
        if request.type == "state":
            return state_reply(plain_value(host.state(), keep_arrays=False))
        if request.type == "reset":
            options = dict(request.data)
            seed = check_seed(options.pop("seed", None))
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


async def serve_stock(ws: ServerConnection, ctx: ServerContext) -> None:
    """Serve one stock-protocol connection until it closes."""
    codec = JsonCodec(ctx.config.limits, finite=True)
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
            reply = error_reply(
                FACTORY_ERROR, f"Environment factory '{name}' failed to create instance.", factory_name=name
            )
            await ws.send(codec.encode(reply))
            await ws.close(1000, "environment factory failed")
            return
        async for frame in ws:
            try:
                message = codec.decode(frame)
            except ProtocolError as exc:
                text = str(exc).removeprefix("invalid JSON: ")
                reply: dict[str, Any] | None = error_reply(INVALID_JSON, f"Invalid JSON: {text}")
            else:
                reply = await _handle(ctx, host, message)
            if reply is None:
                await ws.close(1000)
                break
            try:
                text = codec.encode(reply)
            except (TypeError, ValueError, RecursionError) as exc:
                text = codec.encode(error_reply(EXECUTION_ERROR, f"cannot encode the reply as JSON: {exc}"))
            await ws.send(text)
    except ConnectionClosed:
        pass
    finally:
        if host is not None:
            await ctx.close_host(host)
        ctx.table.release(1)
