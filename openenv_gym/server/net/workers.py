"""Several server processes on one port (``--workers N``), and process hygiene.

Each worker binds the same address with ``SO_REUSEPORT``; the kernel spreads
new connections over them. Sessions live in one worker, so capacity is per
worker. The parent holds a bound (not listening) socket on the port for as
long as the workers run, so that port ``0`` resolves to one port for all of
them; it forwards SIGTERM/SIGINT to the workers and waits for them.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Mapping, Sequence

__all__ = ["listening_socket", "run_workers", "exit_with_parent"]

logger = logging.getLogger(__name__)


def _bound_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio only sets TCP_NODELAY on accepted sockets whose
    # proto is IPPROTO_TCP. With proto 0, Nagle holds a second reply until the
    # client's delayed ACK, 40 ms later, whenever two replies are in flight.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def listening_socket(host: str, port: int, *, reuse_port: bool, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on ``host:port`` (with ``SO_REUSEPORT`` if asked)."""
    sock = _bound_socket(host, port, reuse_port)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def run_workers(worker_command: Sequence[str], workers: int, host: str, port: int, *, env: Mapping[str, str] | None = None) -> int:
    """Run ``workers`` copies of ``worker_command + ["--port", P, "--reuse-port", "--parent-pid", ...]``.

    ``env`` is the workers' environment (default: ours); secrets such as the
    bearer token travel there, never on a command line.

    Returns when every worker has exited: 0 if all exited with 0, else the
    first non-zero exit code (128 + N for a worker killed by signal N). A
    worker that dies takes the others down.
    """
    if port != 0:
        # Another server's workers on this port would take ours into their SO_REUSEPORT group, and
        # the kernel would spread clients over both servers: a plain bind fails while they listen.
        _bound_socket(host, port, reuse_port=False).close()
    reserve = _bound_socket(host, port, reuse_port=True)
    port = reserve.getsockname()[1]
    command = [*worker_command, "--port", str(port), "--reuse-port", "--parent-pid", str(os.getpid())]
    # Their own sessions: a terminal's Ctrl-C reaches us only, and we pass it on once (twice, a
    # worker would be interrupted in the middle of its clean shutdown).
    procs = [subprocess.Popen(command, env=dict(env) if env is not None else None, start_new_session=True) for _ in range(workers)]
    logger.info("started %d workers on %s:%d", workers, host, port)

    stopping: list[int] = []  # the signal we were asked to stop by, once we were

    def forward(signum: int, _frame: object) -> None:
        if _frame is not None:  # (a signal to us, not a worker's death)
            stopping.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = 0
        remaining = list(procs)
        while remaining:
            for proc in list(remaining):
                rc = proc.poll()
                if rc is None:
                    continue
                remaining.remove(proc)
                if stopping and rc in (0, -signal.SIGTERM, -signal.SIGINT):
                    # (asked to stop: a worker still starting dies of the signal it was passed; that is a clean stop)
                    logger.info("worker %d stopped (code %d)", proc.pid, rc)
                elif rc != 0:
                    code = code or (128 - rc if rc < 0 else rc)  # killed by signal N: 128 + N, as a shell says
                    logger.error("worker %d exited with code %d; stopping the others", proc.pid, rc)
                    if not stopping:
                        stopping.append(signal.SIGTERM)
                        forward(signal.SIGTERM, None)
            time.sleep(0.1)
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        reserve.close()


def exit_with_parent(parent_pid: int, poll_seconds: float = 0.5) -> None:
    """Send ourselves SIGTERM (a clean shutdown) when ``parent_pid`` is no longer our parent."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_seconds)
        logger.warning("parent process %d is gone; shutting down", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="openenv-gym-parent-watch", daemon=True).start()
