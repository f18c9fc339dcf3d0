"""``launch_local``: start local server processes for a block of code, then stop them.

The embedded default for the quickstart, the tests and the benchmarks: no
Docker, no network, loopback ports only.

With ``token=``, the servers require that bearer token (handed over in their
environment, not on their command line); with ``--certfile``/``--keyfile`` in
``extra_args``, they speak TLS and ``launch_local`` yields ``https://`` URLs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Sequence

import httpx

from .errors import OpenEnvGymError
from .server.net.security import TOKEN_ENV, check_token

__all__ = ["launch_local", "LaunchError", "ServerProcess"]

logger = logging.getLogger(__name__)

_PORT_RETRIES = 3


class LaunchError(OpenEnvGymError):
    """A local server process did not become healthy.

    Attributes:
        log_tail: the end of the process's output, where the reason usually is.
    """

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(f"{message}\n--- server log tail ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _child_env(token: str | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a server process: this one's (and ``environ``), with the package importable.

    ``OPENENV_GYM_TOKEN`` is ``token``, or unset: the servers require the token
    given to them, not whatever this process's environment holds.
    """
    env = {**os.environ, **dict(environ or {})}
    env.pop(TOKEN_ENV, None)
    if token is not None:
        env[TOKEN_ENV] = token
    root = str(Path(__file__).resolve().parents[1])  # openenv_gym/launch.py -> repository root
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        paths.insert(0, root)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = ",".join(filter(None, [env.get(key, ""), "127.0.0.1,localhost,::1"]))
    return env


def _certificate_rejected(exc: BaseException) -> bool:
    """Whether ``exc`` was caused by a failed TLS certificate verification."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


#: Whether a log file can lose its name while the child writes to it, and be read without
#: moving the offset the child writes at (POSIX); elsewhere it keeps its name until stop().
_UNNAMED_LOGS = os.name == "posix" and hasattr(os, "pread")
#: Bytes of a server's output kept after stop(), for output() and log_tail().
_KEPT_OUTPUT = 65536


class ServerProcess:
    """One ``python -m openenv_gym.server serve`` child process, logging to a temporary file.

    Args:
        command: the command line.
        host, port: where it listens.
        scheme: ``"https"`` when it serves TLS.
        token: its bearer token, passed in ``OPENENV_GYM_TOKEN``.
        unix_path: the Unix socket it listens on instead of ``host``/``port``.
        environ: more environment variables for it.

    Attributes:
        url: the base URL, ``http://host:port`` (or ``https://``), or ``unix:PATH``.
        log_path: the log file, kept (after :meth:`stop` too) only when the
            environment variable ``OPENENV_GYM_KEEP_SERVER_LOGS`` is set as the
            server starts; otherwise ``None``: on POSIX the file is unnamed as
            soon as the child has it open, so that no log outlives its server
            (elsewhere it is deleted by :meth:`stop`). :meth:`output` reads it either way.
    """

    def __init__(
        self,
        command: Sequence[str],
        host: str,
        port: int,
        *,
        scheme: str = "http",
        token: str | None = None,
        unix_path: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.unix_path = unix_path
        if unix_path is not None:
            self.url = f"unix:{unix_path}"
            self._where = f"on {unix_path}"
        else:
            self.url = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
            self._where = f"on port {port}"
        fd, path = tempfile.mkstemp(prefix=f"openenv-gym-{port or 'unix'}-", suffix=".log")
        self._log: IO[bytes] | None = os.fdopen(fd, "wb")
        self._last_output = b""
        self.log_path: Path | None = Path(path)
        try:
            self.proc = subprocess.Popen(
                list(command),
                env=_child_env(token, environ),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the parent does not hit the server twice
            )
        except BaseException:
            self._log.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        if _UNNAMED_LOGS and not os.environ.get("OPENENV_GYM_KEEP_SERVER_LOGS"):
            # The child writes to its open file, which needs no name: unnamed now, the log
            # cannot be left behind, whether this process stops the server, kills it or dies.
            with contextlib.suppress(OSError):
                os.unlink(path)
                self.log_path = None

    def output(self, max_bytes: int | None = None) -> str:
        """What the process has written to stdout and stderr so far: all of it, or its last ``max_bytes`` bytes.

        After :meth:`stop`, of the last 64 KiB.
        """
        return self._tail(max_bytes).decode("utf-8", errors="replace")

    def _tail(self, max_bytes: int | None) -> bytes:
        log, path = self._log, self.log_path
        if log is None:
            return self._last_output if max_bytes is None else self._last_output[-max_bytes:]
        try:
            if path is not None:  # (named: a file description of our own, so no offset is shared with the child)
                with open(path, "rb") as named:
                    size = os.fstat(named.fileno()).st_size
                    start = 0 if max_bytes is None else max(0, size - max_bytes)
                    named.seek(start)
                    return named.read(size - start)
            fd = log.fileno()  # (unnamed: pread leaves the offset the child writes at alone)
            size = os.fstat(fd).st_size
            start = 0 if max_bytes is None else max(0, size - max_bytes)
            chunks = []
            while start < size:  # (one pread returns at most ~2 GiB)
                chunk = os.pread(fd, size - start, start)
                if not chunk:
                    break
                chunks.append(chunk)
                start += len(chunk)
            return b"".join(chunks)
        except (OSError, ValueError):  # (ValueError: closed by stop() in another thread)
            return b""

    def log_tail(self, max_chars: int = 4000) -> str:
        """The last ``max_chars`` characters of the process's output."""
        return self.output(4 * max_chars)[-max_chars:]

    def wait_healthy(self, client: httpx.Client, deadline: float) -> None:
        """Poll ``GET /health`` until it answers 200.

        Raises:
            LaunchError: the process exited, or ``deadline`` (``time.monotonic()``) passed.
        """
        if self.unix_path is not None:
            with httpx.Client(timeout=client.timeout, transport=httpx.HTTPTransport(uds=self.unix_path)) as local:
                return self._poll_health(local, "http://localhost/health", deadline)
        return self._poll_health(client, f"{self.url}/health", deadline)

    def _poll_health(self, client: httpx.Client, url: str, deadline: float) -> None:
        delay = 0.02
        last: object = None
        while True:
            code = self.proc.poll()
            if code is not None:
                raise LaunchError(f"server {self._where} exited with code {code}", self.log_tail())
            try:
                response = client.get(url)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                if _certificate_rejected(exc):  # no use retrying: the certificate will not change
                    raise LaunchError(
                        f"the server {self._where} presents a certificate the startup wait does not trust "
                        f"({exc}); pass launch_local(ssl_verify=...)",
                        self.log_tail(),
                    ) from None
                last = exc
            if time.monotonic() >= deadline:
                raise LaunchError(f"server {self._where} not healthy in time (last: {last!r})", self.log_tail())
            time.sleep(delay)
            delay = min(delay * 1.5, 0.05)  # (a refused connect costs ~0.1 ms: poll often, start sooner)

    def terminate(self) -> None:
        """Send SIGTERM (a clean shutdown), if the process still runs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. Returns the exit code."""
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("server %s did not stop in %.0f s; killing it", self._where, timeout)
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._last_output = self._tail(_KEPT_OUTPUT)
            self._log.close()
            self._log = None
            if self.log_path is not None and not os.environ.get("OPENENV_GYM_KEEP_SERVER_LOGS"):
                with contextlib.suppress(OSError):  # (where an open file could not be unnamed)
                    self.log_path.unlink()
                self.log_path = None
        return self.proc.returncode


def serve_command(
    env_id: str,
    *,
    host: str,
    port: int,
    max_sessions: int,
    env_kwargs: Mapping[str, Any] | None,
    extra_args: Sequence[str],
    stock: bool = False,
    unix_path: str | None = None,
    app_dir: str | os.PathLike[str] | None = None,
    python: str | os.PathLike[str] | None = None,
) -> list[str]:
    """The command line of one local server process (``stock``: openenv's own server).

    With ``unix_path``, it listens on that Unix socket instead of ``host``/``port``.
    With ``app_dir`` (``stock`` only), ``env_id`` is imported from that folder.
    ``python``: the interpreter (default: this one).
    """
    exe = sys.executable if python is None else os.fspath(python)
    if stock:
        cmd = [exe, "-m", "openenv_gym.server.hosting.openenv_app", env_id, "--host", host, "--port", str(port)]
        if app_dir is not None:
            cmd += ["--app-dir", os.fspath(app_dir)]
    elif unix_path is not None:
        cmd = [exe, "-m", "openenv_gym.server", "serve", env_id, "--unix", unix_path]
    else:
        cmd = [exe, "-m", "openenv_gym.server", "serve", env_id, "--host", host, "--port", str(port)]
    cmd += ["--max-sessions", str(max_sessions), "--parent-pid", str(os.getpid())]
    if env_kwargs is not None:
        cmd += ["--env-kwargs", json.dumps(dict(env_kwargs))]
    return cmd + list(extra_args)


@contextlib.contextmanager
def launch_local(
    env_id: str,
    *,
    servers: int = 1,
    max_sessions: int = 256,
    env_kwargs: Mapping[str, Any] | None = None,
    host: str = "127.0.0.1",
    startup_timeout: float = 60.0,
    extra_args: Sequence[str] = (),
    stock: bool = False,
    token: str | None = None,
    ssl_verify: ssl.SSLContext | str | os.PathLike[str] | None = None,
    pin_cpus: bool = False,
    unix: bool = False,
    app_dir: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    python: str | os.PathLike[str] | None = None,
) -> Iterator[list[str]]:
    """Start ``servers`` local server processes for ``env_id``; yield their base URLs.

    Each process listens on its own free port of ``host`` and hosts up to
    ``max_sessions`` sessions. The block runs once every ``/health`` answers.
    On exit (also when the block raises) every process gets SIGTERM, then
    SIGKILL if it has not exited after 10 s.

    Args:
        env_id: ``CartPole-v1``, ``module:EnvId``, ``module:EnvironmentClass`` or
            ``module:name`` of a ``gymnasium.Env`` class or factory (see ``openenv-gym serve``);
            with ``stock``, also the ``module:app`` of a stock OpenEnv app
            (an env's ``server/app.py``: ``server.app:app``), served as it is.
        servers: how many processes.
        max_sessions: sessions per process.
        env_kwargs: JSON-able keyword arguments for the env.
        host: the address to bind (loopback by default).
        startup_timeout: seconds to wait for all servers to become healthy.
        extra_args: more ``openenv-gym serve`` options, e.g. ``["--ping-interval", "1"]``;
            with ``["--certfile", PEM, "--keyfile", PEM]`` the servers speak TLS
            and the URLs are ``https://``.
        stock: serve a Gymnasium ``env_id`` with the stock OpenEnv server
            (``openenv``'s FastAPI app under uvicorn, JSON only) instead, for
            comparisons, or a stock OpenEnv app as it is (its own session limit
            holds: OpenEnv's default is one session a server, so start as many
            ``servers`` as the pool has envs, or raise the limit where the app
            reads one, as ``MAX_CONCURRENT_ENVS`` in ``environ``); needs the ``openenv`` extra.
        token: the bearer token the servers require (given to them in
            ``OPENENV_GYM_TOKEN``, so it shows in no command line); ``None``:
            no token, whatever this process's ``OPENENV_GYM_TOKEN`` says.
            ``/health`` needs no token, so the startup wait does not either.
        ssl_verify: with TLS, what the ``/health`` startup wait trusts: an
            ``ssl.SSLContext`` or the path of a CA file. Default: the
            certificate in ``--certfile`` itself (right for a self-signed
            certificate, and for a chain whose first certificate is the
            server's). Clients of the yielded URLs need their own ``ssl=``.
        pin_cpus: run server ``i`` only on the ``i``-th CPU this process may
            use (round robin; as ``openenv-gym serve --cpus``). A server then
            keeps its core and its caches, which pays when the servers and the
            trainer share few cores (about +7-10% steps/s for 2 CartPole servers
            on 2 cores). Linux only; ignored with a warning elsewhere. Off by
            default: two pinned launches would share the same CPUs.
        unix: listen on Unix sockets (mode 0600, in a new private temporary
            directory) instead of TCP ports: only this user can connect, and a
            message costs less than over loopback TCP. The URLs are then
            ``unix:PATH``, which the stock OpenEnv client cannot use. Not with
            ``stock``.
        app_dir: the folder a stock app's ``module:app`` is imported from
            (first on ``sys.path``, as uvicorn's ``--app-dir``); implies ``stock``.
        environ: more environment variables for the server processes (an
            app's settings: ``{"MAX_CONCURRENT_ENVS": "8"}``).
        python: the Python interpreter of the server processes, for an env
            whose dependencies live in a virtual environment of their own
            (``envs/snake_env/.venv/bin/python``); it needs ``openenv-gym``
            (and for ``stock``, ``openenv``) installed. Default: this one.

    Yields:
        the base URLs, ``["http://127.0.0.1:PORT", ...]`` (``https://`` with TLS;
        ``unix:PATH`` with ``unix``).

    Raises:
        LaunchError: a server exited or did not become healthy in time (with its log tail).
        ValueError: a bad argument (``servers < 1``, a bad ``token``,
            ``ssl_verify`` without TLS, ``token`` or TLS with ``stock``).
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    stock = stock or app_dir is not None
    if token is not None:
        check_token(token)
    certfile = _option_value(extra_args, "--certfile")
    _check_launch(stock=stock, unix=unix, token=token, certfile=certfile, ssl_verify=ssl_verify)
    verify: ssl.SSLContext | bool = _health_trust(certfile, ssl_verify) if certfile is not None else True
    socket_dir = tempfile.mkdtemp(prefix="openenv-gym-") if unix else None  # mode 0700
    launcher = _Launcher(
        env_id,
        host,
        max_sessions,
        env_kwargs,
        extra_args,
        stock,
        scheme="https" if certfile is not None else "http",
        token=token,
        socket_dir=socket_dir,
        app_dir=app_dir,
        environ=environ,
        python=python,
        cpus=_cpus_to_pin() if pin_cpus else [],
    )
    started: list[ServerProcess] = []
    try:
        with httpx.Client(timeout=httpx.Timeout(2.0), trust_env=False, verify=verify) as client:
            launcher.start_healthy(started, servers, client, time.monotonic() + startup_timeout)
        urls = [s.url for s in started]
        logger.info("local servers for %s: %s", env_id, ", ".join(urls))
        yield urls
    finally:
        for server in started:
            server.terminate()
        try:
            for server in started:
                server.stop()
        finally:
            if socket_dir is not None:
                shutil.rmtree(socket_dir, ignore_errors=True)


def _check_launch(
    *, stock: bool, unix: bool, token: str | None, certfile: str | None, ssl_verify: ssl.SSLContext | str | os.PathLike[str] | None
) -> None:
    """Refuse the options of :func:`launch_local` that do not go together (``ValueError``)."""
    if stock and (token is not None or certfile is not None):
        raise ValueError("the stock OpenEnv server takes no bearer token and no TLS options")
    if stock and unix:
        raise ValueError("launch_local(unix=True) serves openenv_gym servers only: stock OpenEnv clients need TCP")
    if unix and certfile is not None:
        raise ValueError("a Unix socket is local to this machine: TLS options do not apply to it")
    if ssl_verify is not None and certfile is None:
        raise ValueError("ssl_verify applies only to TLS servers (--certfile in extra_args)")


def _cpus_to_pin() -> list[int]:
    """The CPUs this process may use, in order (empty, with a warning, where that cannot be known)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    logger.warning("pin_cpus needs Linux (sched_setaffinity); the servers are not pinned")  # pragma: no cover - not Linux
    return []  # pragma: no cover - not Linux


@dataclass(frozen=True)
class _Launcher:
    """How :func:`launch_local` starts its server ``i``: the same command for each, on a port or socket of its own."""

    env_id: str
    host: str
    max_sessions: int
    env_kwargs: Mapping[str, Any] | None
    extra_args: Sequence[str]
    stock: bool
    scheme: str
    token: str | None
    socket_dir: str | None
    app_dir: str | os.PathLike[str] | None
    environ: Mapping[str, str] | None
    python: str | os.PathLike[str] | None
    cpus: list[int]

    def start(self, i: int) -> ServerProcess:
        """Start server ``i`` (pinned to a CPU of :attr:`cpus`, round robin, if any)."""
        unix_path = os.path.join(self.socket_dir, f"server-{i}.sock") if self.socket_dir is not None else None
        port = _free_port(self.host) if unix_path is None else 0
        command = serve_command(
            self.env_id,
            host=self.host,
            port=port,
            max_sessions=self.max_sessions,
            env_kwargs=self.env_kwargs,
            extra_args=self.extra_args,
            stock=self.stock,
            unix_path=unix_path,
            app_dir=self.app_dir,
            python=self.python,
        )
        server = ServerProcess(command, self.host, port, scheme=self.scheme, token=self.token, unix_path=unix_path, environ=self.environ)
        if self.cpus:
            # Right after the start, before the server makes threads or workers (they inherit it).
            try:
                os.sched_setaffinity(server.proc.pid, {self.cpus[i % len(self.cpus)]})
            except OSError as exc:  # it already exited: the health wait reports why
                logger.debug("cannot pin server %d: %s", i, exc)
        return server

    def start_healthy(self, started: list[ServerProcess], servers: int, client: httpx.Client, deadline: float) -> None:
        """Start ``servers`` servers into ``started`` and wait until each is healthy.

        One whose port another process took meanwhile is started again, on another port.
        """
        for i in range(servers):
            started.append(self.start(i))
        for i, server in enumerate(started):
            for attempt in range(_PORT_RETRIES + 1):
                try:
                    server.wait_healthy(client, deadline)
                    break
                except LaunchError as exc:
                    if attempt == _PORT_RETRIES or "address already in use" not in exc.log_tail.lower():
                        raise
                    server.stop()
                    server = started[i] = self.start(i)


def _option_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``[flag, value]`` or ``[flag=value]``), the last one winning."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def _health_trust(certfile: str, ssl_verify: ssl.SSLContext | str | os.PathLike[str] | None) -> ssl.SSLContext:
    """The TLS context of the ``/health`` startup wait (see ``launch_local``'s ``ssl_verify``)."""
    if isinstance(ssl_verify, ssl.SSLContext):
        return ssl_verify
    if ssl_verify is not None:
        return ssl.create_default_context(cafile=os.fspath(ssl_verify))
    context = ssl.create_default_context(cafile=certfile)
    # Trust the server's own certificate even when it is not self-signed.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context
