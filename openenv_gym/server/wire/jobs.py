"""A request's env calls and its reply: run inline, in threads or awaited, answered whole or in parts.

:class:`Job` holds the calls of one reset, step or state of a fast-path
connection's sessions and turns their outputs into the ``batch`` reply (or an
error reply); :class:`Stream` sends a ``partial`` request's results in parts
as its sessions finish. The connection that reads the frames and writes the
replies is :mod:`.fast_loop`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Coroutine

import numpy as np

from ...protocol.codec import WIRE_DTYPES
from ...protocol.kinds import RequestKind
from ...protocol.messages import (
    EXECUTION_ERROR,
    VALIDATION_ERROR,
)
from ...protocol.multiplex import (
    FastRequest,
    after_reset,
    batch_reply,
    column_item,
    part_reply,
    stack_column,
)
from ..hosting.hosts import BatchOutput, Host, StepOutput
from ..hosting.values import ActionError, describe_error, plain_value

if TYPE_CHECKING:
    from .fast_loop import _FastConnection

logger = logging.getLogger("openenv_gym.server.wire.fast_loop")

_NONE = object()


@dataclass(slots=True, eq=False)
class Session:
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
        if t is int and not -(2**63) <= value < 2**64:  # (beyond msgpack: it would fail the whole reply)
            return plain_value(fields, keep_arrays=True)
    return fields


def _batch(request_id: int, sessions: list[int], outs: list[StepOutput | None], errors: list[dict | None]) -> dict[str, Any]:
    """The ``batch`` reply: one column per observation field, stacked where shapes agree."""
    fields = [_plain_fields(o.fields) if o is not None else None for o in outs]
    names: dict[str, Any] = {}
    for f in fields:
        if f is not None:
            for name, value in f.items():
                names.setdefault(name, value)
    columns = {}
    for name, template in names.items():
        columns[name] = stack_column([f[name] if f is not None and name in f else _filler(template) for f in fields])
    reward = np.array([math.nan if o is None or o.reward is None else o.reward for o in outs], dtype=np.float64)
    done = np.array([o is not None and o.done for o in outs], dtype=np.bool_)
    metadata: list[dict[str, Any]] = []
    for j, o in enumerate(outs):
        try:
            metadata.append(plain_value(o.metadata, keep_arrays=True, numpy_scalars=True) if o is not None and o.metadata else {})
        except Exception as exc:  # (an info no reply can hold, nested past Python's recursion limit, say): this session failed
            metadata.append({})
            errors[j] = _error_entry(EXECUTION_ERROR, f"cannot send its info: {describe_error(exc)}")
            reward[j], done[j] = math.nan, False
    reply = batch_reply(request_id, sessions, columns, reward, done, metadata, errors)
    rows = [j for j, o in enumerate(outs) if o is not None and o.after is not None]
    if rows:  # (an autoreset step: the resets that followed episode ends, also where the step failed after)
        resets: list[StepOutput | None] = []
        reset_errors: list[dict | None] = []
        for j in rows:
            after = outs[j].after  # type: ignore[union-attr]
            if isinstance(after, BaseException):
                logger.debug("env call failed", exc_info=after)
                resets.append(None)
                reset_errors.append(_error_entry(EXECUTION_ERROR, describe_error(after)))
            else:
                resets.append(after)
                reset_errors.append(None)
        sub = _batch(request_id, [sessions[j] for j in rows], resets, reset_errors)
        reply["after"] = after_reset(rows, sub["observation"], sub.get("metadata"), sub.get("errors"))
    return reply


ENCODE_ERRORS = (TypeError, ValueError, OverflowError)


def encodable_batch(message: dict[str, Any], encode: Any) -> dict[str, Any]:
    """A ``batch`` reply (or its ``after``) in which each session whose values ``encode`` refuses has an error instead.

    Its observation entries become nil and its metadata empty (filler, as for
    any failed session); the other sessions' results go as they are.
    """
    observation, metadata = message["observation"], message.get("metadata")
    n = len(message["sessions"]) if "sessions" in message else len(message["rows"])
    errors = list(message.get("errors") or [None] * n)
    failed = False
    for i in range(n):
        try:
            encode({name: column_item(column, i) for name, column in observation.items()})
            if metadata is not None:
                encode(metadata[i])
        except ENCODE_ERRORS as exc:
            failed = True
            errors[i] = _error_entry(EXECUTION_ERROR, f"cannot encode this session's reply: {exc}")
            for name, column in list(observation.items()):
                if type(column) is not list:
                    column = observation[name] = list(column)
                column[i] = None
            if metadata is not None:
                metadata[i] = {}
    if failed:
        message["errors"] = errors
    after = message.get("after")
    if after is not None:
        message["after"] = encodable_batch(after, encode)
    return message


def awaitable(host: Any, kind: str, args: tuple[Any, ...]) -> Coroutine[Any, Any, Any]:
    """``host``'s ``kind`` call (``"reset"``, ``"step"``) as a coroutine: its own ``*_async`` where it has one."""
    return getattr(host, f"{kind}_async")(*args) if getattr(host, f"async_{kind}") else _sync(getattr(host, kind), args)


def _outcome(task: asyncio.Task[Any]) -> Any:
    """A finished call's result, or its exception (a cancelled one: ``CancelledError``), as ``gather(..., return_exceptions=True)`` gives it."""
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception() or task.result()


def stepping_only(calls: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``calls`` with each ``step_then_reset`` made a plain ``step``: for calls that run in threads or are awaited.

    A session's reset within its step's request is for calls answered
    inline (fast envs), where it saves a round trip. A slow call's step is
    answered as soon as it is made: its client sends the reset as a request
    of its own, under its own timeout, and a server that dies in that reset
    does not take the step's results with it.
    """
    if not any(kind == "step_then_reset" for _, kind, _ in calls):
        return calls
    return [(h, "step" if kind == "step_then_reset" else kind, a) for h, kind, a in calls]


def _step_outputs(out: BatchOutput) -> list[Any]:
    """A batch's rows as per-call results (:class:`StepOutput` or the exception)."""
    results: list[Any] = []
    for i in range(len(out.reward)):
        failure = out.failures.get(i)
        if failure is not None:
            results.append(failure)
            continue
        reward = float(out.reward[i])
        fields = {name: column[i] for name, column in out.fields.items()}
        info = {} if out.metadata is None else out.metadata[i]
        results.append(StepOutput(fields, None if math.isnan(reward) else reward, bool(out.done[i]), info))
    if out.after_rows and out.after is not None:  # (the resets after episode ends, on their steps' outputs)
        for i, after in zip(out.after_rows, _step_outputs(out.after)):
            if isinstance(results[i], StepOutput):
                results[i].after = after
    return results


class Stream:
    """The env calls of a ``partial`` request, in threads or awaited; each batch of finished sessions is one reply part.

    Calls that finish while the event loop is busy are sent together: a part
    goes out one loop turn after the first of them finished.
    """

    def __init__(self, conn: _FastConnection, job: Job, tails: list[asyncio.Future[None]]) -> None:
        self.conn, self.job, self.tails = conn, job, tails
        self.left = job.n
        self.finished: list[tuple[int, Any]] = []  # (session position, result), not yet sent
        self.flushing = False
        self.all_sent: asyncio.Future[None] = conn._loop.create_future()

    async def run(self, awaited: bool = False) -> None:
        """Start the calls (``awaited``: the hosts' coroutines, as tasks; else in threads) and send their parts."""
        job = self.job
        called = set(job.index)
        # Sessions without a call (an invalid action) are answered with the first part.
        self.finished = [(i, None) for i in range(job.n) if i not in called]
        if self.finished and not job.calls:
            self._schedule()
        calls = stepping_only(job.calls)
        if not awaited:
            self.conn.ctx.runner.call_each([(getattr(h, kind), a) for h, kind, a in calls], self._call_done, self.conn._loop)
            await self.all_sent
            return
        loop = self.conn._loop
        tasks = []
        for k, (h, kind, a) in enumerate(calls):
            task = loop.create_task(awaitable(h, kind, a))
            task.add_done_callback(functools.partial(self._task_done, k))
            tasks.append(task)
        try:
            await self.all_sent
        except asyncio.CancelledError:  # (the connection went: its calls go too, as a gather's would)
            for task in tasks:
                task.cancel()
            raise

    def _task_done(self, k: int, task: asyncio.Task[Any]) -> None:
        self._call_done(k, _outcome(task))

    def _call_done(self, k: int, result: Any) -> None:
        self.finished.append((self.job.index[k], result))
        self._schedule()

    def _schedule(self) -> None:
        if not self.flushing:
            self.flushing = True
            self.conn._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flushing = False
        finished, self.finished = self.finished, []
        if not finished:
            return
        finished.sort()
        job = self.job
        positions = [i for i, _ in finished]
        outs: list[StepOutput | None] = []
        errors: list[dict | None] = []
        for i, result in finished:
            error = job.errors[i]
            if isinstance(result, BaseException):
                logger.debug("env call failed", exc_info=result)
                error = _error_entry(EXECUTION_ERROR, describe_error(result))
                result = None
            outs.append(result)
            errors.append(error)
        self.left -= len(finished)
        last = self.left == 0
        request = job.request
        sessions = [request.sessions[i] for i in positions]
        codec = self.conn.codec
        message = part_reply(_batch(request.id, sessions, outs, errors), positions, last)
        try:
            try:
                payload = codec.encode(message)
            except ENCODE_ERRORS:  # only the sessions whose values cannot go fail
                payload = codec.encode(encodable_batch(message, codec.encode))
        except Exception as exc:  # the env gave what a reply cannot hold: these sessions failed, the others go on
            logger.exception("%s request %s: cannot build a reply part", request.type, request.id)
            error = _error_entry(EXECUTION_ERROR, f"cannot encode the reply: {exc}")
            failed = _batch(request.id, sessions, [None] * len(sessions), [error] * len(sessions))
            payload = codec.encode(part_reply(failed, positions, last))
        self.conn._write(payload)
        for i in positions:
            if not self.tails[i].done():
                self.tails[i].set_result(None)
        if self.left == 0 and not self.all_sent.done():
            self.all_sent.set_result(None)


class Job:
    """One reset or step request: the env calls it needs, and the reply from their results.

    A step's sessions marked in ``resets`` are reset instead, in the same
    request; a session whose action is invalid gets an error entry and no call.
    """

    __slots__ = ("request", "n", "errors", "calls", "index", "done")

    def __init__(self, conn: _FastConnection, request: FastRequest, sessions: list[Session]) -> None:
        self.request = request
        n = self.n = len(sessions)
        self.errors: list[dict | None] = [None] * n
        self.calls: list[tuple[Any, ...]] = []  # (host, "reset" | "step", args)
        self.index: list[int] = []  # the session of each call
        self.done: list[Any] = []  # results of the calls made so far (when run_inline stopped early)
        if request.type == RequestKind.RESET:
            seeds = request.seeds or [None] * n
            options = request.options or {}
            self.calls = [(s.host, "reset", (seed, options)) for s, seed in zip(sessions, seeds)]
            self.index = list(range(n))
            return
        actions = request.actions or {}
        resets = request.resets
        restarted: set[int] = set()
        if resets is not None and resets.any():
            restarted = set(np.flatnonzero(resets).tolist())
        parsed = conn.ctx.factory.parse_action_column(actions, n)  # (the whole column at once, if the factory can)
        calls, index = self.calls, self.index
        step = "step_then_reset" if request.autoreset else "step"
        if not restarted and parsed is not None and ActionError not in map(type, parsed):
            # The common case: every session steps with a valid action.
            self.calls = [(s.host, step, (a,)) for s, a in zip(sessions, parsed)]
            self.index = list(range(n))
            return
        for i, s in enumerate(sessions):
            if restarted and i in restarted:
                calls.append((s.host, "reset", (None, {})))
                index.append(i)
                continue
            try:
                if parsed is not None:
                    action = parsed[i]
                    if isinstance(action, ActionError):
                        raise action
                else:
                    action = s.host.parse_action({name: column_item(column, i) for name, column in actions.items()})
            except ActionError as exc:
                self.errors[i] = _error_entry(VALIDATION_ERROR, exc.message, exc.errors)
                continue
            except Exception as exc:  # a host's reader that failed otherwise: this session's action only
                logger.debug("reading a %s action failed", conn.ctx.factory.name, exc_info=True)
                self.errors[i] = _error_entry(VALIDATION_ERROR, f"cannot read the action: {describe_error(exc)}", None)
                continue
            calls.append((s.host, step, (action,)))
            index.append(i)

    def run_inline(self, conn: _FastConnection) -> dict[str, Any] | None:
        """Make the env calls on this thread; the reply.

        ``None`` when the calls turned out slow and the runner moved to
        threads part way: :attr:`done` holds the results so far, and
        :meth:`finish` runs the rest.
        """
        runner = conn.ctx.runner
        if len(self.calls) == self.n:  # every session has a call: the factory may run them as one batch
            out = conn.ctx.factory.run_batch(self.calls, runner.observe)
            if out is not None:
                return self.take_batch(out)
        self.done = runner.call_many_inline(self._pairs(self.calls))
        if len(self.done) == len(self.calls):
            return self.reply(self.done)
        return None

    def take_batch(self, out: BatchOutput) -> dict[str, Any] | None:
        """The reply from the output of this job's calls run as a batch (in order, every session one).

        ``None`` when the batch stopped early: :attr:`done` holds its results,
        and :meth:`finish` runs the rest.
        """
        if len(out.reward) == self.n:
            return self.reply_batch(out)
        self.done = _step_outputs(out)
        return None

    async def finish(self, conn: _FastConnection) -> dict[str, Any]:
        """The reply, once the calls :meth:`run_inline` left are made (in threads)."""
        rest = await conn.ctx.runner.call_many(self._pairs(stepping_only(self.calls[len(self.done) :])))
        return self.reply(self.done + rest)

    @staticmethod
    def _pairs(calls: list[tuple[Any, ...]]) -> list[tuple[Any, tuple[Any, ...]]]:
        return [(getattr(h, kind), a) for h, kind, a in calls]

    def reply_batch(self, out: BatchOutput) -> dict[str, Any]:
        errors = self.errors
        for i, exc in out.failures.items():
            logger.debug("env call failed", exc_info=exc)
            errors[i] = _error_entry(EXECUTION_ERROR, describe_error(exc))
        request = self.request
        reply = batch_reply(request.id, request.sessions, out.fields, out.reward, out.done, out.metadata, errors)
        after = out.after
        if out.after_rows and after is not None:  # (step_then_reset calls: the resets after episode ends)
            reset_errors: list[dict | None] = [None] * len(out.after_rows)
            for k, exc in after.failures.items():
                logger.debug("env call failed", exc_info=exc)
                reset_errors[k] = _error_entry(EXECUTION_ERROR, describe_error(exc))
            reply["after"] = after_reset(out.after_rows, after.fields, after.metadata, reset_errors)
        return reply

    def reply(self, results: list[Any]) -> dict[str, Any]:
        outs: list[StepOutput | None] = [None] * self.n
        errors = self.errors
        for i, result in zip(self.index, results):
            if isinstance(result, BaseException):
                logger.debug("env call failed", exc_info=result)
                errors[i] = _error_entry(EXECUTION_ERROR, describe_error(result))
            else:
                outs[i] = result
        return _batch(self.request.id, self.request.sessions, outs, errors)


async def _sync(fn: Any, args: tuple[Any, ...]) -> Any:
    return fn(*args)
