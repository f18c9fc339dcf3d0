"""The fast-path connection loop (``openenv.msgpack.v1``): many sessions, requests in flight.

The reader decodes each binary frame, checks it (:func:`parse_fast_request`)
and hands it to a task. Requests that address different sessions run
concurrently; the requests of one session run in the order they arrived: each
session keeps the completion future of its latest request (its *tail*) and a
new request first waits for the tails of all its sessions. Ordering is thus
fixed when a frame is read, whatever the tasks do later.

Per-session failures (a bad action, an env that raised) go into the batch
reply's ``errors``; the request's other sessions step normally. A frame that
cannot be decoded gets an error reply with ``id`` nil and the connection goes
on. When the connection ends, running requests finish and then every session
it opened is closed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from ..errors import ProtocolError
from ..protocol.codec import WIRE_DTYPES, MsgpackCodec
from ..protocol.fast import (
    FastRequest,
    FastRequestError,
    batch_reply,
    closed_reply,
    column_item,
    fast_error_reply,
    opened_reply,
    parse_fast_request,
    stack_column,
    states_reply,
)
from ..protocol.messages import (
    CAPACITY_REACHED,
    EXECUTION_ERROR,
    FACTORY_ERROR,
    INVALID_JSON,
    VALIDATION_ERROR,
)
from .context import ServerContext
from .hosts import Host, StepOutput
from .sessions import CapacityReached
from .values import ActionError, plain_value

__all__ = ["serve_fast"]

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class _Session:
    id: int
    host: Host
    tail: asyncio.Future[None] | None = None


def _filler(template: Any) -> Any:
    """A stand-in value shaped like ``template``, for a session whose entry failed."""
    if isinstance(template, np.ndarray):
        return np.zeros_like(template)
    if isinstance(template, bool):
        return False
    if isinstance(template, int):
        return 0
    if isinstance(template, float):
        return math.nan
    if isinstance(template, str):
        return ""
    if isinstance(template, dict):
        return {k: _filler(v) for k, v in template.items()}
    return None


def _error_entry(code: str, message: str, errors: list[Any] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"code": code, "message": message}
    if errors is not None:
        entry["errors"] = errors
    return entry


_PLAIN = frozenset({bool, int, float, str, type(None)})
_ARRAY_DTYPES = frozenset(WIRE_DTYPES.values())


def _plain_fields(fields: dict[str, Any]) -> dict[str, Any]:
    # Wire-dtype arrays and scalars (the usual fields) pass as they are; anything else is made plain.
    for value in fields.values():
        t = type(value)
        if t not in _PLAIN and not (t is np.ndarray and value.dtype in _ARRAY_DTYPES):
            return plain_value(fields, keep_arrays=True)
    return fields


def _batch(request: FastRequest, outs: list[StepOutput | None], errors: list[dict | None]) -> dict[str, Any]:
    """The ``batch`` reply: one column per observation field, stacked where shapes agree."""
    fields = [_plain_fields(o.fields) if o is not None else None for o in outs]
    names: dict[str, Any] = {}
    for f in fields:
        if f is not None:
            for name, value in f.items():
                names.setdefault(name, value)
    columns = {}
    for name, template in names.items():
        columns[name] = stack_column(
            [f[name] if f is not None and name in f else _filler(template) for f in fields]
        )
    reward = np.array(
        [math.nan if o is None or o.reward is None else o.reward for o in outs], dtype=np.float64
    )
    done = np.array([o is not None and o.done for o in outs], dtype=np.bool_)
    metadata = [plain_value(o.metadata, keep_arrays=True) if o is not None and o.metadata else {} for o in outs]
    return batch_reply(request.id, request.sessions, columns, reward, done, metadata, errors)


class _FastConnection:
    """The server end of one fast-path connection."""

    def __init__(self, ws: ServerConnection, ctx: ServerContext) -> None:
        self.ws = ws
        self.ctx = ctx
        self.codec = MsgpackCodec(ctx.config.limits)
        self.sessions: dict[int, _Session] = {}
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(ctx.config.max_inflight)

    # ------------------------------------------------------------ plumbing

    async def run(self) -> None:
        try:
            async for frame in self.ws:
                await self._dispatch(frame)
        except ConnectionClosed:
            pass
        finally:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            sessions, self.sessions = list(self.sessions.values()), {}
            for session in sessions:
                await self.ctx.close_host(session.host)
            self.ctx.table.release(len(sessions))

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            frame = self.codec.encode(message)
        except (TypeError, ValueError, OverflowError) as exc:
            logger.warning("cannot encode a %s reply: %s", message.get("type"), exc)
            frame = self.codec.encode(
                fast_error_reply(message.get("id"), EXECUTION_ERROR, f"cannot encode the reply: {exc}")
            )
        try:
            await self.ws.send(frame)
        except ConnectionClosed:
            pass

    async def _spawn(self, coro: Any) -> None:
        await self._slots.acquire()
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            logger.error("a fast-path request failed", exc_info=task.exception())

    # ------------------------------------------------------------ reading

    async def _dispatch(self, frame: str | bytes) -> None:
        if isinstance(frame, str):
            await self._send(
                fast_error_reply(None, INVALID_JSON, "text frame on an openenv.msgpack.v1 connection; send binary msgpack frames")
            )
            return
        try:
            message = self.codec.decode(frame)
        except ProtocolError as exc:
            text = str(exc)
            if not text.startswith("invalid msgpack"):
                text = f"invalid msgpack: {text}"
            await self._send(fast_error_reply(None, INVALID_JSON, text))
            return
        try:
            request = parse_fast_request(message, max_count=self.ctx.config.max_sessions)
        except FastRequestError as exc:
            await self._send(fast_error_reply(exc.id, exc.code, exc.message))
            return
        if request.type == "open":
            try:
                self.ctx.table.reserve(request.count)
            except CapacityReached as exc:
                await self._send(
                    fast_error_reply(
                        request.id, CAPACITY_REACHED, str(exc), active_sessions=exc.active, max_sessions=exc.limit
                    )
                )
                return
            await self._spawn(self._open(request))
            return
        unknown = [sid for sid in request.sessions if sid not in self.sessions]
        if unknown:
            await self._send(
                fast_error_reply(request.id, VALIDATION_ERROR, f"unknown session ids on this connection: {unknown[:16]}")
            )
            return
        sessions = [self.sessions[sid] for sid in request.sessions]
        waits = [s.tail for s in sessions if s.tail is not None and not s.tail.done()]
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for s in sessions:
            s.tail = done
        if request.type == "close":
            for s in sessions:
                del self.sessions[s.id]
        await self._spawn(self._run(request, sessions, waits, done))

    # ------------------------------------------------------------ requests

    async def _open(self, request: FastRequest) -> None:
        count = request.count
        hosts: list[Host] = []
        try:
            for _ in range(count):
                hosts.append(await self.ctx.make_host())
        except Exception:
            logger.exception("the %s factory failed", self.ctx.factory.name)
            for host in hosts:
                await self.ctx.close_host(host)
            self.ctx.table.release(count)
            name = self.ctx.factory.name
            await self._send(
                fast_error_reply(
                    request.id,
                    FACTORY_ERROR,
                    f"Environment factory '{name}' failed to create instance.",
                    factory_name=name,
                )
            )
            return
        ids = []
        for host in hosts:
            sid = next(self._ids)
            self.sessions[sid] = _Session(sid, host)
            ids.append(sid)
        await self._send(opened_reply(request.id, ids))

    async def _run(
        self,
        request: FastRequest,
        sessions: list[_Session],
        waits: list[asyncio.Future[None]],
        done: asyncio.Future[None],
    ) -> None:
        try:
            if waits:
                await asyncio.wait(waits)
            try:
                if request.type == "step":
                    reply = await self._step(request, sessions)
                elif request.type == "reset":
                    reply = await self._reset(request, sessions)
                elif request.type == "state":
                    states = [plain_value(s.host.state(), keep_arrays=True) for s in sessions]
                    reply = states_reply(request.id, request.sessions, states)
                else:
                    for s in sessions:
                        await self.ctx.close_host(s.host)
                    self.ctx.table.release(len(sessions))
                    reply = closed_reply(request.id, request.sessions)
            except Exception as exc:
                logger.exception("%s request %s failed", request.type, request.id)
                reply = fast_error_reply(request.id, EXECUTION_ERROR, str(exc) or type(exc).__name__)
            await self._send(reply)
        finally:
            if not done.done():
                done.set_result(None)

    async def _call_all(self, hosts: list[Host], kind: str, args: list[tuple[Any, ...]]) -> list[Any]:
        """``host.reset(*a)`` or ``host.step(*a)`` for each host: results or exceptions, in order."""
        if not hosts:
            return []
        if getattr(hosts[0], f"async_{kind}"):
            coros = [getattr(h, f"{kind}_async")(*a) for h, a in zip(hosts, args)]
            return list(await asyncio.gather(*coros, return_exceptions=True))
        return await self.ctx.runner.call_many([(getattr(h, kind), a) for h, a in zip(hosts, args)])

    def _collect(
        self, n: int, index: list[int], results: list[Any], errors: list[dict | None]
    ) -> list[StepOutput | None]:
        outs: list[StepOutput | None] = [None] * n
        for i, result in zip(index, results):
            if isinstance(result, BaseException):
                logger.debug("env call failed", exc_info=result)
                errors[i] = _error_entry(EXECUTION_ERROR, str(result) or type(result).__name__)
            else:
                outs[i] = result
        return outs

    async def _reset(self, request: FastRequest, sessions: list[_Session]) -> dict[str, Any]:
        n = len(sessions)
        seeds = request.seeds or [None] * n
        options = request.options or {}
        results = await self._call_all([s.host for s in sessions], "reset", [(seed, options) for seed in seeds])
        errors: list[dict | None] = [None] * n
        outs = self._collect(n, list(range(n)), results, errors)
        return _batch(request, outs, errors)

    async def _step(self, request: FastRequest, sessions: list[_Session]) -> dict[str, Any]:
        n = len(sessions)
        actions = request.actions or {}
        errors: list[dict | None] = [None] * n
        index: list[int] = []
        hosts: list[Host] = []
        args: list[tuple[Any, ...]] = []
        resets = request.resets
        restarted: list[int] = []
        if resets is not None and resets.any():
            # Sessions marked in `resets` are reset instead of stepped, in the same frame.
            restarted = np.flatnonzero(resets).tolist()
        outs: list[StepOutput | None] = [None] * n
        if restarted:
            results = await self._call_all([sessions[i].host for i in restarted], "reset", [(None, {})] * len(restarted))
            for i, result in zip(restarted, results):
                if isinstance(result, BaseException):
                    logger.debug("env reset failed", exc_info=result)
                    errors[i] = _error_entry(EXECUTION_ERROR, str(result) or type(result).__name__)
                else:
                    outs[i] = result
        skip = set(restarted)
        # A factory may read the whole action column at once (numpy, no per-session dicts).
        parse_column = getattr(self.ctx.factory, "parse_action_column", None)
        parsed = parse_column(actions, n) if parse_column is not None else None
        for i, s in enumerate(sessions):
            if i in skip:
                continue
            try:
                if parsed is not None:
                    action = parsed[i]
                    if isinstance(action, ActionError):
                        raise action
                else:
                    action = s.host.parse_action({name: column_item(column, i) for name, column in actions.items()})
            except ActionError as exc:
                errors[i] = _error_entry(VALIDATION_ERROR, exc.message, exc.errors)
                continue
            index.append(i)
            hosts.append(s.host)
            args.append((action,))
        results = await self._call_all(hosts, "step", args)
        stepped = self._collect(n, index, results, errors)
        for i in index:
            outs[i] = stepped[i]
        return _batch(request, outs, errors)


async def serve_fast(ws: ServerConnection, ctx: ServerContext) -> None:
    """Serve one fast-path connection until it closes."""
    await _FastConnection(ws, ctx).run()
