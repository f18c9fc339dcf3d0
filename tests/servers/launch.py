"""Start stock OpenEnv servers (``tests.servers.run_stock``) in subprocesses.

No pytest dependency and no ``openenv`` import here: the server code is only
imported in the fork server (:mod:`tests.servers.forkserver`), once for the
whole run, whose forked children are the servers.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

import httpx

__all__ = [
    "REPO_ROOT",
    "free_port",
    "rss_bytes",
    "running",
    "ServerProcess",
    "ForkedProcess",
    "start_fast_server",
    "started_fast_servers",
    "forked_launch",
]

# tests/servers/launch.py -> repository root
REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """Return a TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_fast_server(
    port: int,
    max_sessions: int = 64,
    env: str = "CartPole-v1",
    env_kwargs: Optional[Mapping[str, Any]] = None,
    extra_args: Sequence[str] = (),
) -> Any:
    """``openenv-gym serve`` on ``port``, healthy: its ``openenv_gym.launch.ServerProcess`` (we know its pid, and can start it again on the same port)."""
    from openenv_gym import launch

    command = launch.serve_command(
        env, host="127.0.0.1", port=port, max_sessions=max_sessions, env_kwargs=env_kwargs, extra_args=extra_args
    )
    server = launch.ServerProcess(command, "127.0.0.1", port)
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        server.wait_healthy(client, time.monotonic() + 60)
    return server


@contextlib.contextmanager
def started_fast_servers(*max_sessions: int, **options: Any) -> Iterator[tuple[list[int], list[Any]]]:
    """One :func:`start_fast_server` (with ``options``) per entry of ``max_sessions``, on free ports: yields ``(ports, servers)``.

    Every server in the list on exit is stopped, those a test started again in its place too.
    """
    ports = [free_port() for _ in max_sessions]
    servers: list[Any] = []
    try:
        for port, most in zip(ports, max_sessions):
            servers.append(start_fast_server(port, most, **options))
        yield ports, servers
    finally:
        for server in servers:
            server.stop()


@contextlib.contextmanager
def forked_launch(
    env: str,
    *,
    servers: int = 1,
    max_sessions: int = 256,
    env_kwargs: Optional[Mapping[str, Any]] = None,
    extra_args: Sequence[str] = (),
    token: Optional[str] = None,
    startup_timeout: float = 60.0,
) -> Iterator[list[str]]:
    """As ``openenv_gym.launch_local`` (the same ``openenv-gym serve`` command lines), but forked from the fork server.

    For tests that need an openenv_gym server hosting an OpenEnv ``Environment``
    class and test something else than launching it: its process starts with
    OpenEnv's imports done (~4.5 s of CPU each otherwise). Yields the URLs.
    """
    from openenv_gym import launch

    started: list[tuple[ForkedProcess, str, str]] = []
    try:
        for _ in range(servers):
            port = free_port()
            command = launch.serve_command(
                env, host="127.0.0.1", port=port, max_sessions=max_sessions, env_kwargs=env_kwargs, extra_args=extra_args
            )
            argv = command[command.index("openenv_gym.server") + 1 :]
            forks = _ForkServer.get()
            argv[argv.index("--parent-pid") + 1] = str(forks.proc.pid)  # (its parent: the fork server, which outlives no test run)
            fd, log = tempfile.mkstemp(prefix=f"openenv-gym-{port}-", suffix=".log")
            os.close(fd)
            environ = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
            if token is not None:
                environ["OPENENV_GYM_TOKEN"] = token
            proc = forks.spawn({"argv": argv, "environ": environ, "log": log})
            started.append((proc, f"http://127.0.0.1:{port}", log))
        deadline = time.monotonic() + startup_timeout
        with httpx.Client(timeout=httpx.Timeout(1.0), trust_env=False) as client:
            for proc, url, log in started:
                while True:
                    if proc.poll() is not None:
                        raise RuntimeError(f"{env} on {url} exited with code {proc.poll()}:\n{Path(log).read_text()[-4000:]}")
                    try:
                        if client.get(f"{url}/health").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{env} on {url} was not healthy within {startup_timeout} s")
                    time.sleep(0.05)  # (polling a process that says nothing when it is ready)
        yield [url for _, url, _ in started]
    finally:
        for proc, _, log in started:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except Exception:
                    proc.kill()
            with contextlib.suppress(OSError):
                os.unlink(log)


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid``, in bytes (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux; a zombie, ended but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class ForkedProcess:
    """A server forked by the fork server, with the parts of :class:`subprocess.Popen` the tests use."""

    def __init__(self, forks: "_ForkServer", pid: int) -> None:
        self._forks = forks
        self.pid = pid
        self.args = f"stock server (pid {pid})"

    @property
    def returncode(self) -> Optional[int]:
        return self._forks.exit_code(self.pid)

    def poll(self) -> Optional[int]:
        return self._forks.exit_code(self.pid)

    def wait(self, timeout: Optional[float] = None) -> int:
        code = self._forks.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (once reaped, the pid may be another process's)
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _ForkServer:
    """The pytest side of :mod:`tests.servers.forkserver`: one per test run, started at the first server."""

    _current: Optional["_ForkServer"] = None
    _starting = threading.Lock()

    @classmethod
    def get(cls) -> "_ForkServer":
        with cls._starting:
            if cls._current is None or cls._current.proc.poll() is not None:
                cls._current = cls()
            return cls._current

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="openenv-forkserver-", suffix=".log")
        self.log_path = Path(path)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.servers.forkserver"],
            cwd=str(REPO_ROOT),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fd,
            start_new_session=True,
        )
        os.close(fd)
        self._asking = threading.Lock()  # one request at a time: replies come in order
        self._changed = threading.Condition()
        self._replies: list[dict] = []
        self._exits: dict[int, int] = {}
        self._gone = False
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()
        atexit.register(self.close)

    def close(self) -> None:
        """End the fork server (its servers get SIGTERM) and remove its log."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        try:
            self.log_path.unlink()
        except OSError:
            pass

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._changed:
                if "exit" in message:
                    self._exits[int(message["exit"])] = int(message["code"])
                else:
                    self._replies.append(message)
                self._changed.notify_all()
        with self._changed:
            self._gone = True
            self._changed.notify_all()

    def spawn(self, request: dict, timeout: float = 120.0) -> ForkedProcess:
        """A new server for ``request`` (see the fork server's protocol)."""
        assert self.proc.stdin is not None
        with self._asking:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            with self._changed:
                if not self._changed.wait_for(lambda: self._replies or self._gone, timeout):
                    self.proc.kill()  # (a late reply would answer the next request: the next server gets a new fork server)
                    raise RuntimeError(f"the fork server did not answer within {timeout} s.\n--- its log ---\n{self._log()}")
                if not self._replies:
                    raise RuntimeError(f"the fork server ended.\n--- its log ---\n{self._log()}")
                reply = self._replies.pop(0)
        if "pid" not in reply:
            raise RuntimeError(f"the fork server could not start a server: {reply.get('error')}")
        return ForkedProcess(self, int(reply["pid"]))

    def exit_code(self, pid: int) -> Optional[int]:
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
            if not self._gone:
                return None
        # The fork server is gone (it sent its children SIGTERM): its code is unknown.
        return None if running(pid) else -signal.SIGTERM

    def wait_exit(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        """``pid``'s exit code once it has ended, or ``None`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:  # its exit is reported, unless the fork server itself ended first
            self._changed.wait_for(lambda: pid in self._exits or self._gone, timeout)
        while True:
            code = self.exit_code(pid)
            if code is not None or (deadline is not None and time.monotonic() >= deadline):
                return code
            time.sleep(0.05)

    def _log(self) -> str:
        try:
            return self.log_path.read_bytes()[-4000:].decode("utf-8", "replace")
        except OSError:
            return ""


class ServerProcess:
    """A stock OpenEnv server process (what ``python -m tests.servers.run_stock`` runs).

    Usage::

        with ServerProcess("cartpole", max_sessions=8) as srv:
            ...  # srv.url == "http://127.0.0.1:<port>", already healthy

    ``start()`` only spawns the process; ``__enter__`` also waits until
    ``GET /health`` answers. ``stop()`` is idempotent. ``forks``: the fork
    server to start it from (default: the test run's own).
    """

    def __init__(
        self,
        env: str,
        *,
        max_sessions: int = 64,
        port: Optional[int] = None,
        extra_env: Optional[Mapping[str, str]] = None,
        startup_timeout: float = 60.0,
        forks: Optional[_ForkServer] = None,
    ) -> None:
        self.env_name = env
        self._forks = forks  # (None: the test run's own fork server)
        self.max_sessions = int(max_sessions)
        self.port = int(port) if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = dict(extra_env or {})
        self._auto_port = port is None
        self.startup_timeout = float(startup_timeout)
        self.proc: Optional["ForkedProcess"] = None
        self.log_path: Optional[Path] = None
        self._stopped = False
        self._last_log = ""

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> "ServerProcess":
        if self.proc is not None:
            return self
        fd, path = tempfile.mkstemp(prefix=f"openenv-{self.env_name}-{self.port}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(path)
        environ = dict(self.extra_env)
        # Loopback only: never route 127.0.0.1 through a proxy.
        environ["NO_PROXY"] = environ["no_proxy"] = "127.0.0.1,localhost"
        self.proc = (self._forks or _ForkServer.get()).spawn(
            {
                "env": self.env_name,
                "port": self.port,
                "max_sessions": self.max_sessions,
                "environ": environ,
                "log": path,
            }
        )
        return self

    def log_tail(self, max_chars: int = 4000) -> str:
        """Last ``max_chars`` characters of the server's stdout+stderr."""
        if self.log_path is None:
            return self._last_log[-max_chars:]
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_chars:].decode("utf-8", errors="replace")

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Poll ``GET /health`` until it answers ``200``; RuntimeError otherwise."""
        if self.proc is None:
            raise RuntimeError("server not started")
        deadline = time.monotonic() + timeout
        delay = 0.05
        last_error: Optional[BaseException] = None
        # trust_env=False: ignore proxy env vars, loopback only.
        with httpx.Client(timeout=httpx.Timeout(1.0), trust_env=False) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise RuntimeError(
                        f"stock server {self.env_name!r} on port {self.port} exited "
                        f"with code {code} before becoming healthy.\n"
                        f"--- log tail ({self.log_path}) ---\n{self.log_tail()}"
                    )
                try:
                    r = client.get(f"{self.url}/health")
                    if r.status_code == 200:
                        return
                    last_error = RuntimeError(f"/health returned {r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as e:
                    last_error = e
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"stock server {self.env_name!r} on port {self.port} not healthy "
                        f"after {timeout:.0f}s (last error: {last_error!r}).\n"
                        f"--- log tail ({self.log_path}) ---\n{self.log_tail()}"
                    )
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 1.5, 0.5)

    def stop(self) -> None:
        """SIGTERM, wait up to 5 s, then SIGKILL. Safe to call repeatedly."""
        if self._stopped:
            return
        self._stopped = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:  # pragma: no cover - should not happen
                    pass
        if not os.environ.get("OPENENV_GYM_KEEP_SERVER_LOGS"):
            # Keep self.log_path for messages, but do not litter /tmp.
            path, self.log_path = self.log_path, None
            if path is not None:
                try:
                    self._last_log = path.read_bytes()[-4000:].decode("utf-8", "replace")
                    path.unlink()
                except OSError:
                    pass

    # -- context manager ---------------------------------------------------

    def start_healthy(self, timeout: Optional[float] = None, port_retries: int = 3) -> "ServerProcess":
        """``start()`` + ``wait_healthy()``; stops the process on failure.

        If the port was picked automatically and another process grabbed it
        between ``free_port()`` and the child's bind, retry on a new port.
        """
        timeout = self.startup_timeout if timeout is None else float(timeout)
        attempt = 0
        while True:
            self.start()
            try:
                self.wait_healthy(timeout)
                return self
            except BaseException as e:
                tail = self.log_tail()
                self.stop()
                if isinstance(e, RuntimeError) and self._auto_port and attempt < port_retries and "address already in use" in tail.lower():
                    attempt += 1
                    self._reset_for_retry(free_port())
                    continue
                raise

    def _reset_for_retry(self, port: int) -> None:
        self._discard_log()
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self._stopped = False

    def _discard_log(self) -> None:
        if self.log_path is not None:
            try:
                self.log_path.unlink()
            except OSError:
                pass
            self.log_path = None

    def __enter__(self) -> "ServerProcess":
        return self.start_healthy()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()

    def __del__(self) -> None:  # last-resort cleanup
        try:
            self.stop()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else ("running" if self.proc else "new")
        return f"ServerProcess({self.env_name!r}, url={self.url!r}, {state})"
