"""The fast-path connection (``openenv.msgpack.v1``): many sessions, requests in flight.

After websockets' server has done the opening handshake, the connection's
socket is taken over by a plain :class:`asyncio.Protocol`: whole binary frames
are read straight from the stream (:mod:`.framing`), decoded, checked
(:func:`parse_fast_request`) and answered; control frames, fragments and the
closing handshake still go through websockets (its Sans-I/O protocol and its
connection object, which keeps the keepalive pings and the server's shutdown).

A request whose env calls run inline (the common case for fast envs) is
answered from the ``data_received`` callback itself: no task, no future. A
raw step of a lane, then, goes straight from the frame to the env calls and
back to a raw reply (:meth:`HostFactory.run_lane`), with no request, job or
reply map, unless its results need the general reply.
Otherwise (env calls in threads, async hosts, opening and closing sessions)
it runs in a task. A ``partial`` reset or step whose calls run in threads is
answered in parts as its sessions finish (:class:`_Stream`). Requests that address different sessions run
concurrently; the requests of one session run in the order they arrived: each
session keeps the completion future of its latest task (its *tail*) and a
new request first waits for the tails of all its sessions. Ordering is thus
fixed when a frame is read, whatever the tasks do later.

Backpressure: beyond ``max_inflight`` tasks, or while the socket's write
buffer is full (a client that does not read its replies), the connection
stops reading.

Per-session failures (a bad action, an env that raised) go into the batch
reply's ``errors``; the request's other sessions step normally. A frame that
cannot be decoded gets an error reply with ``id`` nil and the connection goes
on. When the connection ends, running requests finish and then every session
it opened is closed.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any, Coroutine

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.frames import DATA_OPCODES, CloseCode, Opcode
from websockets.protocol import OPEN

from ..._internals import connection_lost, current_size, feed_event, parser_between_frames, send_data, set_close_deadline, take_read_frames
from ...errors import ProtocolError
from ...protocol import lane as lane_proto
from ...protocol.codec import WIRE_DTYPES, MsgpackCodec
from ...protocol.kinds import RequestKind
from ...protocol.lane import Lane, bound_reply, pack_batch, pack_batch_rows, raw_header, unpack_step
from ...protocol.messages import (
    CAPACITY_REACHED,
    EXECUTION_ERROR,
    FACTORY_ERROR,
    INVALID_JSON,
    VALIDATION_ERROR,
)
from ...protocol.multiplex import (
    FastRequest,
    FastRequestError,
    after_reset,
    batch_reply,
    closed_reply,
    column_item,
    fast_error_reply,
    opened_reply,
    parse_fast_request,
    part_reply,
    stack_column,
    states_reply,
)
from ..context import ServerContext
from ..hosting.hosts import BatchOutput, Host, LaneOutput, StepOutput
from ..hosting.schema import TERMINATED_KEY, TRUNCATED_KEY
from ..hosting.sessions import CapacityReached
from ..hosting.values import ActionError, describe_error, plain_value
from .framing import FrameSplitter, Message, Raw

__all__ = ["serve_fast"]

logger = logging.getLogger(__name__)


CONT, TEXT = Opcode.CONT, Opcode.TEXT
_RAW = bytes((lane_proto.RAW_MARK,))
_NONE = object()


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


_ENCODE_ERRORS = (TypeError, ValueError, OverflowError)


def _encodable_batch(message: dict[str, Any], encode: Any) -> dict[str, Any]:
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
        except _ENCODE_ERRORS as exc:
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
        message["after"] = _encodable_batch(after, encode)
    return message


class _FastConnection(asyncio.Protocol):
    """The server end of one fast-path connection, on the socket taken over from ``ws``."""

    def __init__(self, ws: ServerConnection, ctx: ServerContext) -> None:
        self.ws = ws
        self.protocol = ws.protocol
        self.transport: asyncio.Transport = ws.transport
        self.ctx = ctx
        self.codec = MsgpackCodec(ctx.config.limits)
        self.sessions: dict[int, _Session] = {}
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._task_bytes: dict[asyncio.Task[None], int] = {}  # the frame size of each running request
        self._running_bytes = 0
        self._max_tasks = ctx.config.max_inflight
        # A request that waits keeps its frame: 256 of 16 MiB each would be 4 GiB. Past this, hold the next ones.
        self._max_running_bytes = ctx.config.max_waiting_bytes
        # Requests read ahead and held (past the two bounds above): past this, reading pauses.
        self._max_held_bytes = ctx.config.max_held_bytes
        self._loop = asyncio.get_running_loop()
        sizes = [n for n in (self.protocol.max_message_size, self.protocol.max_fragment_size) if n is not None]
        self._splitter = FrameSplitter(min(sizes, default=1 << 62))
        self._fragments: list[bytes] | None = None
        self._fragmented_text = False
        self._held: list[Any] = []  # pieces read while processing was held back (backpressure)
        self._held_bytes = 0
        self._write_paused = False
        self._reading = True
        self.finished: asyncio.Future[None] = self._loop.create_future()
        self._winding: asyncio.Task[None] | None = None
        self._through_protocol = False  # every byte to websockets' parser (see start())
        self._close_handle: asyncio.TimerHandle | None = None  # aborts a closing connection its peer keeps open
        self._lane: Lane | None = None  # the sessions bound for raw steps (one lane a connection: a new bind replaces it)
        self._lane_hosts: list[Host] = []  # the hosts of the lane's sessions, in its order
        self._lane_ids = (i & 0xFFFFFFFF for i in itertools.count())  # (a lane id is a u32 on the wire)

    # ------------------------------------------------------------ taking over

    def start(self) -> None:
        """Take the socket over from ``ws`` (right after the opening handshake)."""
        ws = self.ws
        frames = take_read_frames(ws)  # frames websockets read before we took over
        if connection_lost(ws):
            self._winding = self._loop.create_task(self._wind_up())
            return
        # Bytes of a frame websockets began to read stay its to finish: until its
        # parser stands between frames again, everything goes through it.
        self._through_protocol = not self._protocol_between_frames()
        self.transport.set_protocol(self)
        hand_over = getattr(ws, "hand_over_reading", None)
        if hand_over is not None:  # (its pause_writing, which we pass on, must not resume our reading)
            hand_over()
        if not self.transport.is_reading():  # (websockets' queue, or its writes, held reading: ours now)
            self.transport.resume_reading()
        self._on_frames(frames)

    def _protocol_between_frames(self) -> bool:
        return parser_between_frames(self.protocol)

    # ------------------------------------------------------------ asyncio.Protocol

    def data_received(self, data: bytes) -> None:
        if self._through_protocol:
            self._on_raw(data)
            self._through_protocol = not self._protocol_between_frames()
            return
        fast = self.protocol.state is OPEN and self._fragments is None and current_size(self.protocol) is None
        pieces = self._splitter.feed(data, fast)
        if self._held or not self._ready():
            self._hold(pieces)
            return
        self._process(pieces)

    def _process(self, pieces: list[Any]) -> None:
        for n, piece in enumerate(pieces):
            if type(piece) is Message:
                self._dispatch(piece.payload)
            else:
                self._on_raw(piece.data)
            if not self._ready():  # hold the rest until there is room
                self._hold(pieces[n + 1 :], front=True)
                return

    def _hold(self, pieces: list[Any], front: bool = False) -> None:
        """Keep ``pieces`` for later, in order; pings and pongs are answered now (keepalive goes on)."""
        kept = []
        for piece in pieces:
            if type(piece) is Raw and piece.control:
                self._on_raw(piece.data)
            else:
                kept.append(piece)
                self._held_bytes += len(piece.payload if type(piece) is Message else piece.data)
        self._held = kept + self._held if front else self._held + kept
        self._update_reading()

    def eof_received(self) -> bool | None:
        return self.ws.eof_received()  # type: ignore[func-returns-value]  # (the connection's own: may keep the transport open)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lane, self._lane_hosts = None, []
        if self._close_handle is not None:
            self._close_handle.cancel()
        self.ws.connection_lost(exc)
        self._winding = self._loop.create_task(self._wind_up())  # (held: a task nobody holds may vanish)

    def pause_writing(self) -> None:
        logger.debug("the client does not read its replies fast enough: reading paused")
        self._write_paused = True
        self.ws.pause_writing()
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self.ws.resume_writing()
        self._update_reading()
        self._release_held()

    # ------------------------------------------------------------ plumbing

    def _ready(self) -> bool:
        """Whether more requests may be processed now."""
        return len(self._tasks) < self._max_tasks and self._running_bytes < self._max_running_bytes and not self._write_paused

    def _update_reading(self) -> None:
        # Requests beyond max_inflight are read and held, up to max_held_bytes: the socket
        # stays read, so the client's pongs arrive while the server works through its backlog.
        want = not self._write_paused and self._held_bytes <= self._max_held_bytes
        if want != self._reading and not self.transport.is_closing():
            self._reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _release_held(self) -> None:
        if self._held and self._ready():
            held, self._held, self._held_bytes = self._held, [], 0
            self._process(held)
            self._update_reading()

    def _on_raw(self, data: bytes) -> None:
        """Whole frames for websockets' protocol: control frames, fragments, the closing handshake."""
        ws, protocol = self.ws, self.protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        send_data(ws)  # pongs, the close echo, the end of the stream
        self._bound_closing()
        self._on_frames(events)

    def _bound_closing(self) -> None:
        """Once the connection is closing, give the peer ``close_timeout`` seconds to end it, then abort."""
        ws = self.ws
        if self._close_handle is None and self.protocol.close_expected() and ws.close_timeout is not None:
            deadline = self._loop.time() + ws.close_timeout
            set_close_deadline(ws, deadline)
            self._close_handle = self._loop.call_at(deadline, self.transport.abort)

    def _on_frames(self, frames: list[Any]) -> None:
        for frame in frames:
            opcode = frame.opcode
            if opcode not in DATA_OPCODES:
                feed_event(self.ws, frame)  # pongs answer websockets' keepalive pings
            elif opcode is CONT:
                assert self._fragments is not None  # the protocol checks the sequence
                if len(self._fragments) >= self.codec.limits.max_fragments:  # (as websockets' own connections refuse)
                    self._fragments = None
                    self.protocol.fail(CloseCode.MESSAGE_TOO_BIG, "too many fragments")
                    send_data(self.ws)
                    self._bound_closing()
                    return
                self._fragments.append(frame.data)
                if frame.fin:
                    payload, self._fragments = b"".join(self._fragments), None
                    self._fragment_done()
                    self._on_message(payload, self._fragmented_text)
            elif frame.fin:
                self._on_message(frame.data, opcode is TEXT)
            else:
                self._fragments, self._fragmented_text = [frame.data], opcode is TEXT
                begun = getattr(self.ws, "fragment_begun", None)  # (the server's Connection: a deadline to end it)
                if begun is not None:
                    begun(self._fragment_expired)

    def _fragment_done(self) -> None:
        done = getattr(self.ws, "fragment_done", None)
        if done is not None:
            done()

    def _fragment_expired(self) -> None:
        """A fragmented message not finished in time: its frames let go of, the connection closed (1008)."""
        self._fragments = None
        self.ws.fragment_expired()  # type: ignore[attr-defined]  # (the server's Connection, which set the deadline)
        self._bound_closing()

    def _on_message(self, payload: bytes, text: bool) -> None:
        if text:
            try:
                bytes(payload).decode("utf-8")
            except UnicodeDecodeError as exc:  # as websockets' own connection does: close with 1007
                self.protocol.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
                send_data(self.ws)
                self._bound_closing()
                return
            self._send(fast_error_reply(None, INVALID_JSON, "text frame on an openenv.msgpack.v1 connection; send binary msgpack frames"))
        else:
            self._dispatch(payload)

    def _send(self, message: dict[str, Any]) -> None:
        try:
            payload = self.codec.encode(message)
        except (TypeError, ValueError, OverflowError) as exc:
            logger.warning("cannot encode a %s reply: %s", message.get("type"), exc)
            error = fast_error_reply(message.get("id"), EXECUTION_ERROR, f"cannot encode the reply: {exc}")
            try:  # only the sessions whose values cannot go fail
                payload = self.codec.encode(_encodable_batch(message, self.codec.encode) if message.get("type") == "batch" else error)
            except _ENCODE_ERRORS:
                payload = self.codec.encode(error)
        self._write(payload)

    def _write(self, payload: bytes) -> None:
        """Send ``payload`` as one binary frame (dropped if the connection is closing)."""
        if self.protocol.state is not OPEN or self.transport.is_closing():
            return  # closing: the reply has no one to go to
        n = len(payload)
        if n < 126:
            header = bytes((0x82, n))
        elif n < 0x10000:
            header = b"\x82\x7e" + n.to_bytes(2, "big")
        else:
            header = b"\x82\x7f" + n.to_bytes(8, "big")
        if n < 0x10000:
            self.transport.write(header + payload)
        else:  # no copy of a large payload
            self.transport.write(header)
            self.transport.write(payload)

    def _spawn(self, coro: Any, size: int = 0) -> None:
        """Run ``coro`` (a request whose frame was ``size`` bytes) as a task."""
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        if size:
            self._task_bytes[task] = size
            self._running_bytes += size
        task.add_done_callback(self._finished)
        self._update_reading()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._running_bytes -= self._task_bytes.pop(task, 0)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a fast-path request failed", exc_info=task.exception())
        self._update_reading()
        self._release_held()

    async def _wind_up(self) -> None:
        """The connection is gone: let running requests finish, then close every session it opened."""
        try:
            while self._tasks:
                # (Each turn yields to the loop. A task that has ended leaves the set only when its
                # done callback runs, on a later turn; and since Python 3.12 a gather of ended tasks
                # is done at once, so awaiting it never yielded: this loop spun, and the whole
                # server with it.)
                running = [task for task in self._tasks if not task.done()]
                if running:
                    await asyncio.wait(running)
                else:
                    await asyncio.sleep(0)
            sessions, self.sessions = list(self.sessions.values()), {}
            for session in sessions:
                await self.ctx.close_host(session.host)
            self.ctx.table.release(len(sessions))
        finally:
            if not self.finished.done():
                self.finished.set_result(None)

    # ------------------------------------------------------------ reading

    def _dispatch(self, frame: bytes) -> None:
        if frame[:1] == _RAW:
            self._dispatch_raw(frame)
            return
        try:
            message = self.codec.decode(frame)
        except ProtocolError as exc:
            text = str(exc)
            if not text.startswith("invalid msgpack"):
                text = f"invalid msgpack: {text}"
            self._send(fast_error_reply(None, INVALID_JSON, text))
            return
        try:
            request = parse_fast_request(message, max_count=self.ctx.config.max_sessions)
        except FastRequestError as exc:
            self._send(fast_error_reply(exc.id, exc.code, exc.message))
            return
        if request.type == RequestKind.OPEN:
            try:
                self.ctx.table.reserve(request.count)
            except CapacityReached as exc:
                self._send(fast_error_reply(request.id, CAPACITY_REACHED, str(exc), active_sessions=exc.active, max_sessions=exc.limit))
                return
            self._spawn(self._open(request))  # (its frame is small: a count)
            return
        self._handle(request, len(frame))

    def _dispatch_raw(self, frame: bytes) -> None:
        """A raw frame (see :mod:`openenv_gym.protocol.lane`): a step of every session of the connection's lane."""
        try:
            kind, lane_id, rid = raw_header(frame)
        except ProtocolError as exc:
            self._send(fast_error_reply(None, INVALID_JSON, f"invalid raw frame: {exc}"))
            return
        lane = self._lane
        if kind != lane_proto.STEP or lane is None or lane.id != lane_id:
            self._send(fast_error_reply(rid, VALIDATION_ERROR, f"no lane {lane_id} on this connection for a raw frame of kind {kind}"))
            return
        try:
            actions, resets = unpack_step(lane, frame)
        except ProtocolError as exc:
            self._send(fast_error_reply(rid, VALIDATION_ERROR, str(exc)))
            return
        if not self._tasks and not self.ctx.runner.threaded and self._step_lane(lane, rid, actions, resets, len(frame)):
            return
        request = _raw_step_request(lane, rid, actions, resets)
        self._handle(request, len(frame), lane)

    def _step_lane(self, lane: Lane, rid: int, actions: np.ndarray, resets: np.ndarray | None, size: int) -> bool:
        """A raw step by the factory's lane path (:meth:`HostFactory.run_lane`), when nothing runs and it applies.

        Only with no task running (so no session waits for an earlier request)
        and env calls inline. ``False``, having called nothing, where it does
        not apply (a factory without one, an invalid action): the request takes
        the general road.
        """
        factory, runner = self.ctx.factory, self.ctx.runner
        try:
            parsed = factory.parse_action_column({lane.action_field: actions}, len(lane.sessions))
        except Exception:  # (a factory's reader that failed: the general road reads the actions one by one, or answers the error)
            logger.debug("reading a raw step's actions at once failed", exc_info=True)
            return False
        if parsed is None or ActionError in map(type, parsed):
            return False
        try:
            restart = None if resets is None else resets.tolist()
            if lane.autoreset:
                out = factory.run_lane(self._lane_hosts, parsed, restart, lane.observation, runner.observe, autoreset=True)
            else:
                out = factory.run_lane(self._lane_hosts, parsed, restart, lane.observation, runner.observe)
        except Exception as exc:  # (not an env call's failure: those are in the output)
            logger.exception("raw step %s failed", rid)
            self._send(fast_error_reply(rid, EXECUTION_ERROR, describe_error(exc)))
            return True
        if out is None:
            return False
        if isinstance(out, LaneOutput):
            self._write(pack_batch_rows(lane, rid, out.reward, out.done, out.truncated, out.terminated, out.observations, out.after))
            return True
        # Not a clean batch (infos, failures, an observation off the layout, resets after episode ends),
        # or stopped early: as _handle answers it.
        request = _raw_step_request(lane, rid, actions, resets)
        sessions = [self.sessions[sid] for sid in lane.sessions]
        try:
            job = _Job(self, request, sessions)
            reply = job.take_batch(out)
            answer: dict[str, Any] | _Job = job if reply is None else reply
        except Exception as exc:
            logger.exception("raw step %s failed", rid)
            answer = fast_error_reply(rid, EXECUTION_ERROR, describe_error(exc))
        self._answered(request, sessions, answer, size, lane)
        return True

    def _bind(self, request: FastRequest) -> None:
        """Make ``request.sessions`` the connection's lane (replacing any other), or refuse."""
        assert request.bind is not None
        unknown = [sid for sid in request.sessions if sid not in self.sessions]
        if unknown:
            self._send(fast_error_reply(request.id, VALIDATION_ERROR, f"unknown session ids on this connection: {unknown[:16]}"))
            return
        layout = getattr(self.ctx.factory, "lane_observation", None)
        try:
            if layout is None:
                raise ValueError(f"{self.ctx.factory.name} serves no lanes")
            field, observation = layout(*request.bind)
        except ValueError as exc:
            self._send(fast_error_reply(request.id, VALIDATION_ERROR, f"cannot bind a lane: {exc}"))
            return
        # (a factory whose run_lane predates autoreset gets lanes without: its clients reset by msgpack steps)
        autoreset = request.autoreset and "autoreset" in inspect.signature(self.ctx.factory.run_lane).parameters
        lane = Lane(next(self._lane_ids), tuple(request.sessions), *request.bind, field, observation, autoreset, request.partial)
        self._lane = lane
        self._lane_hosts = [self.sessions[sid].host for sid in request.sessions]
        self._send(bound_reply(request.id, request.sessions, lane.id, field, observation, autoreset=lane.autoreset, partial=lane.partial))

    def _send_answer(self, answer: dict[str, Any], lane: Lane | None) -> None:
        """Send a reply: for a raw step, raw if it is a clean batch of the lane's layout."""
        if (
            lane is not None
            and answer.get("type") == "batch"
            and "metadata" not in answer
            and "errors" not in answer
            and "after" not in answer
        ):
            fields, n = answer["observation"], len(lane.sessions)
            observation = fields.get(lane.observation_field)
            layout = lane.observation
            if type(observation) is np.ndarray and observation.dtype == layout.dtype and observation.shape == (n, *layout.shape):
                truncated = fields.get(TRUNCATED_KEY)
                terminated = fields.get(TERMINATED_KEY, _NONE)
                if type(truncated) is np.ndarray and truncated.shape == (n,) and len(fields) == 2 + (terminated is not _NONE):
                    if terminated is _NONE:  # (left out of a batch when none is both: section 5.2)
                        terminated = answer["done"] & ~truncated
                    if type(terminated) is np.ndarray and terminated.shape == (n,):
                        self._write(pack_batch(lane, answer["id"], answer["reward"], answer["done"], truncated, terminated, observation))
                        return
        self._send(answer)

    def _handle(self, request: FastRequest, size: int, lane: Lane | None = None) -> None:
        """A checked request for sessions (``size``: its frame's bytes); ``lane``: it came raw on that lane."""
        if request.type == RequestKind.BIND:
            self._bind(request)
            return
        sessions_by_id = self.sessions
        try:
            sessions = [sessions_by_id[sid] for sid in request.sessions]
        except KeyError:
            unknown = [sid for sid in request.sessions if sid not in sessions_by_id]
            self._send(fast_error_reply(request.id, VALIDATION_ERROR, f"unknown session ids on this connection: {unknown[:16]}"))
            return
        waits = [s.tail for s in sessions if s.tail is not None and not s.tail.done()]
        if request.type == RequestKind.CLOSE:
            for s in sessions:
                del sessions_by_id[s.id]
            if self._lane is not None and not set(self._lane.sessions).isdisjoint(request.sessions):
                self._lane, self._lane_hosts = None, []  # (its sessions are gone: a raw frame for it gets an error)
        elif not waits and self._inline(request, sessions):
            self._answered(request, sessions, self._answer_now(request, sessions), size, lane)
            return
        elif request.partial:
            # Each session answered as it finishes: each gets its own tail.
            tails = [self._loop.create_future() for _ in sessions]
            for s, tail in zip(sessions, tails):
                s.tail = tail
            self._spawn(self._run_partial(request, sessions, waits, tails), size)
            return
        done: asyncio.Future[None] = self._loop.create_future()
        for s in sessions:
            s.tail = done
        self._spawn(self._run(request, sessions, waits, done), size)

    def _answered(
        self, request: FastRequest, sessions: list[_Session], answer: dict[str, Any] | _Job, size: int, lane: Lane | None
    ) -> None:
        """Send the ``answer`` of a request answered inline; or, a job whose calls turned slow, run the rest in threads."""
        if isinstance(answer, dict):
            self._send_answer(answer, lane)
            return
        # The calls turned slow: the rest run in threads, and the sessions wait for them.
        done = self._loop.create_future()
        for s in sessions:
            s.tail = done
        self._spawn(self._run(request, sessions, [], done, answer), size)

    def _inline(self, request: FastRequest, sessions: list[_Session]) -> bool:
        """Whether ``request`` can be answered now, on the loop, without waiting for anything."""
        if request.type == RequestKind.STATE or not sessions:
            return True
        if self.ctx.runner.threaded:
            return False
        return not self._async_hosts(sessions)

    @staticmethod
    def _async_hosts(sessions: list[_Session]) -> bool:
        host = sessions[0].host if sessions else None
        return host is not None and (host.async_reset or host.async_step)

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
            self._send(
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
        self._send(opened_reply(request.id, ids))

    def _answer_now(self, request: FastRequest, sessions: list[_Session]) -> dict[str, Any] | _Job:
        """Answer a reset, step or state with env calls inline; or the job, if its calls moved to threads."""
        try:
            if request.type == RequestKind.STATE:
                states = [plain_value(s.host.state(), keep_arrays=True) for s in sessions]
                return states_reply(request.id, request.sessions, states)
            job = _Job(self, request, sessions)
            reply = job.run_inline(self)
            return job if reply is None else reply
        except Exception as exc:
            logger.exception("%s request %s failed", request.type, request.id)
            return fast_error_reply(request.id, EXECUTION_ERROR, describe_error(exc))

    async def _run(
        self,
        request: FastRequest,
        sessions: list[_Session],
        waits: list[asyncio.Future[None]],
        done: asyncio.Future[None],
        started: _Job | None = None,
    ) -> None:
        """A request that waits for earlier ones, or (``started``) the rest of a job whose calls moved to threads."""
        try:
            if waits:
                await asyncio.wait(waits)
            try:
                if started is not None:
                    reply = await started.finish(self)
                elif request.type in (RequestKind.STEP, RequestKind.RESET):
                    job = _Job(self, request, sessions)
                    reply = job.reply(await self._call_all(job.calls))
                elif request.type == RequestKind.STATE:
                    states = [plain_value(s.host.state(), keep_arrays=True) for s in sessions]
                    reply = states_reply(request.id, request.sessions, states)
                else:
                    for s in sessions:
                        await self.ctx.close_host(s.host)
                    self.ctx.table.release(len(sessions))
                    reply = closed_reply(request.id, request.sessions)
            except Exception as exc:
                logger.exception("%s request %s failed", request.type, request.id)
                reply = fast_error_reply(request.id, EXECUTION_ERROR, describe_error(exc))
            self._send(reply)
        finally:
            if not done.done():
                done.set_result(None)

    async def _run_partial(
        self,
        request: FastRequest,
        sessions: list[_Session],
        waits: list[asyncio.Future[None]],
        tails: list[asyncio.Future[None]],
    ) -> None:
        """A ``partial`` reset or step: the results go out in parts, as sessions finish."""
        try:
            if waits:
                await asyncio.wait(waits)
            job = _Job(self, request, sessions)
            awaited = self._async_hosts(sessions)
            if not awaited and not self.ctx.runner.threaded:  # inline: all at once, in one reply
                reply = job.run_inline(self)
                self._send(reply if reply is not None else await job.finish(self))
                return
            stream = _Stream(self, job, tails)
            await stream.run(awaited)
        except Exception as exc:
            logger.exception("%s request %s failed", request.type, request.id)
            self._send(fast_error_reply(request.id, EXECUTION_ERROR, describe_error(exc)))
        finally:
            for tail in tails:
                if not tail.done():
                    tail.set_result(None)

    async def _call_all(self, calls: list[tuple[Host, str, tuple[Any, ...]]]) -> list[Any]:
        """``host.reset(*a)`` or ``host.step(*a)`` for each call: results or exceptions, in order."""
        if not calls:
            return []
        calls = _stepping_only(calls)
        host = calls[0][0]
        if host.async_reset or host.async_step:
            return list(await asyncio.gather(*(_awaitable(h, kind, a) for h, kind, a in calls), return_exceptions=True))
        return await self.ctx.runner.call_many([(getattr(h, kind), a) for h, kind, a in calls])


async def _sync(fn: Any, args: tuple[Any, ...]) -> Any:
    return fn(*args)


def _awaitable(host: Any, kind: str, args: tuple[Any, ...]) -> Coroutine[Any, Any, Any]:
    """``host``'s ``kind`` call (``"reset"``, ``"step"``) as a coroutine: its own ``*_async`` where it has one."""
    return getattr(host, f"{kind}_async")(*args) if getattr(host, f"async_{kind}") else _sync(getattr(host, kind), args)


def _outcome(task: asyncio.Task[Any]) -> Any:
    """A finished call's result, or its exception (a cancelled one: ``CancelledError``), as ``gather(..., return_exceptions=True)`` gives it."""
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception() or task.result()


def _stepping_only(calls: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
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


class _Stream:
    """The env calls of a ``partial`` request, in threads or awaited; each batch of finished sessions is one reply part.

    Calls that finish while the event loop is busy are sent together: a part
    goes out one loop turn after the first of them finished.
    """

    def __init__(self, conn: _FastConnection, job: _Job, tails: list[asyncio.Future[None]]) -> None:
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
        calls = _stepping_only(job.calls)
        if not awaited:
            self.conn.ctx.runner.call_each([(getattr(h, kind), a) for h, kind, a in calls], self._call_done, self.conn._loop)
            await self.all_sent
            return
        loop = self.conn._loop
        tasks = []
        for k, (h, kind, a) in enumerate(calls):
            task = loop.create_task(_awaitable(h, kind, a))
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
            except _ENCODE_ERRORS:  # only the sessions whose values cannot go fail
                payload = codec.encode(_encodable_batch(message, codec.encode))
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


class _Job:
    """One reset or step request: the env calls it needs, and the reply from their results.

    A step's sessions marked in ``resets`` are reset instead, in the same
    request; a session whose action is invalid gets an error entry and no call.
    """

    __slots__ = ("request", "n", "errors", "calls", "index", "done")

    def __init__(self, conn: _FastConnection, request: FastRequest, sessions: list[_Session]) -> None:
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
        rest = await conn.ctx.runner.call_many(self._pairs(_stepping_only(self.calls[len(self.done) :])))
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


async def serve_fast(ws: ServerConnection, ctx: ServerContext) -> None:
    """Serve one fast-path connection until it closes (and its sessions are closed)."""
    connection = _FastConnection(ws, ctx)
    connection.start()
    await connection.finished


def _raw_step_request(lane: Lane, rid: int, actions: np.ndarray, resets: np.ndarray | None) -> FastRequest:
    """The request a raw step on ``lane`` makes (the lane's ``autoreset`` and ``partial`` are its steps')."""
    return FastRequest(
        RequestKind.STEP,
        rid,
        list(lane.sessions),
        actions={lane.action_field: actions},
        resets=resets,
        autoreset=lane.autoreset,
        partial=lane.partial,
    )
