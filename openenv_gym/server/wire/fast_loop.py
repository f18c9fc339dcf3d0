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
answered in parts as its sessions finish (:class:`~.jobs.Stream`). Requests that address different sessions run
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
import inspect
import itertools
import logging
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.frames import DATA_OPCODES, CloseCode, Opcode
from websockets.protocol import OPEN

from ..._internals import connection_lost, current_size, feed_event, parser_between_frames, send_data, set_close_deadline, take_read_frames
from ...errors import ProtocolError
from ...protocol import lane as lane_proto
from ...protocol.codec import MsgpackCodec
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
    closed_reply,
    fast_error_reply,
    opened_reply,
    parse_fast_request,
    states_reply,
)
from ..context import ServerContext
from ..hosting.hosts import Host, LaneOutput
from ..hosting.schema import TERMINATED_KEY, TRUNCATED_KEY
from ..hosting.sessions import CapacityReached
from ..hosting.values import ActionError, describe_error, plain_value
from .framing import FrameSplitter, Message, Raw
from .jobs import ENCODE_ERRORS, Job, Session, Stream, awaitable, encodable_batch, stepping_only

__all__ = ["serve_fast"]

logger = logging.getLogger(__name__)


CONT, TEXT = Opcode.CONT, Opcode.TEXT
_RAW = bytes((lane_proto.RAW_MARK,))
_NONE = object()


class _FastConnection(asyncio.Protocol):
    """The server end of one fast-path connection, on the socket taken over from ``ws``."""

    def __init__(self, ws: ServerConnection, ctx: ServerContext) -> None:
        self.ws = ws
        self.protocol = ws.protocol
        self.transport: asyncio.Transport = ws.transport
        self.ctx = ctx
        self.codec = MsgpackCodec(ctx.config.limits)
        self.sessions: dict[int, Session] = {}
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
                payload = self.codec.encode(encodable_batch(message, self.codec.encode) if message.get("type") == "batch" else error)
            except ENCODE_ERRORS:
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
            job = Job(self, request, sessions)
            reply = job.take_batch(out)
            answer: dict[str, Any] | Job = job if reply is None else reply
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

    def _answered(self, request: FastRequest, sessions: list[Session], answer: dict[str, Any] | Job, size: int, lane: Lane | None) -> None:
        """Send the ``answer`` of a request answered inline; or, a job whose calls turned slow, run the rest in threads."""
        if isinstance(answer, dict):
            self._send_answer(answer, lane)
            return
        # The calls turned slow: the rest run in threads, and the sessions wait for them.
        done = self._loop.create_future()
        for s in sessions:
            s.tail = done
        self._spawn(self._run(request, sessions, [], done, answer), size)

    def _inline(self, request: FastRequest, sessions: list[Session]) -> bool:
        """Whether ``request`` can be answered now, on the loop, without waiting for anything."""
        if request.type == RequestKind.STATE or not sessions:
            return True
        if self.ctx.runner.threaded:
            return False
        return not self._async_hosts(sessions)

    @staticmethod
    def _async_hosts(sessions: list[Session]) -> bool:
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
            self.sessions[sid] = Session(sid, host)
            ids.append(sid)
        self._send(opened_reply(request.id, ids))

    def _answer_now(self, request: FastRequest, sessions: list[Session]) -> dict[str, Any] | Job:
        """Answer a reset, step or state with env calls inline; or the job, if its calls moved to threads."""
        try:
            if request.type == RequestKind.STATE:
                states = [plain_value(s.host.state(), keep_arrays=True) for s in sessions]
                return states_reply(request.id, request.sessions, states)
            job = Job(self, request, sessions)
            reply = job.run_inline(self)
            return job if reply is None else reply
        except Exception as exc:
            logger.exception("%s request %s failed", request.type, request.id)
            return fast_error_reply(request.id, EXECUTION_ERROR, describe_error(exc))

    async def _run(
        self,
        request: FastRequest,
        sessions: list[Session],
        waits: list[asyncio.Future[None]],
        done: asyncio.Future[None],
        started: Job | None = None,
    ) -> None:
        """A request that waits for earlier ones, or (``started``) the rest of a job whose calls moved to threads."""
        try:
            if waits:
                await asyncio.wait(waits)
            try:
                if started is not None:
                    reply = await started.finish(self)
                elif request.type in (RequestKind.STEP, RequestKind.RESET):
                    job = Job(self, request, sessions)
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
        sessions: list[Session],
        waits: list[asyncio.Future[None]],
        tails: list[asyncio.Future[None]],
    ) -> None:
        """A ``partial`` reset or step: the results go out in parts, as sessions finish."""
        try:
            if waits:
                await asyncio.wait(waits)
            job = Job(self, request, sessions)
            awaited = self._async_hosts(sessions)
            if not awaited and not self.ctx.runner.threaded:  # inline: all at once, in one reply
                reply = job.run_inline(self)
                self._send(reply if reply is not None else await job.finish(self))
                return
            stream = Stream(self, job, tails)
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
        calls = stepping_only(calls)
        host = calls[0][0]
        if host.async_reset or host.async_step:
            return list(await asyncio.gather(*(awaitable(h, kind, a) for h, kind, a in calls), return_exceptions=True))
        return await self.ctx.runner.call_many([(getattr(h, kind), a) for h, kind, a in calls])


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


async def serve_fast(ws: ServerConnection, ctx: ServerContext) -> None:
    """Serve one fast-path connection until it closes (and its sessions are closed)."""
    connection = _FastConnection(ws, ctx)
    connection.start()
    await connection.finished
