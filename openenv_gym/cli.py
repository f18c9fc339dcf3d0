"""The ``openenv-gym`` command.

::

    openenv-gym serve ENV_ID [--host 127.0.0.1] [--port 8000] [--workers N] [--max-sessions M]
                             [--env-kwargs JSON] [--ping-interval S] [--ping-timeout S]
                             [--token TOKEN] [--certfile PEM [--keyfile PEM]] ...

    openenv-gym bench [--url URL ...] [--num-envs 64] [--seconds 3] [--trials 3] [--batch-size B]
                      [--json PATH] [--plot PATH.png] [--sweep] [--frames] ...

``serve``'s ``ENV_ID`` is a Gymnasium id (``CartPole-v1``), ``module:EnvId`` (the module
registers the id), ``module:EnvironmentClass`` (an OpenEnv Environment), or
``module:name`` of a ``gymnasium.Env`` class or factory (called with ``--env-kwargs``).

The bearer token comes from ``--token`` or, better, from the environment
variable ``OPENENV_GYM_TOKEN``: a command line is visible to every user of
the machine in ``ps``, an environment is not. The command never prints the
token; ``--workers`` hands it to the workers in their environment.

``bench`` with no arguments starts local servers and compares the pool with
its baselines (see :mod:`openenv_gym.bench`); ``--url`` measures your own
servers instead; ``--sweep`` runs the scaling sweep, ``--frames`` the
large-observation study.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from .cli_types import busy_poll_us, cpu_list, json_object, port, positive_float, positive_int, seconds_or_none, sizes

if TYPE_CHECKING:
    import ssl

    from .bench import BenchReport
    from .server.context import ServerConfig

__all__ = ["main", "build_parser"]

T = TypeVar("T")


def _bench_headers(args: argparse.Namespace) -> dict[str, str] | None:
    """The bearer token for ``bench --url`` servers: ``--token``, else ``$OPENENV_GYM_TOKEN``."""
    from .server.net.security import TOKEN_ENV

    token = args.token or os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token and args.url else None


def _add_log_level(command: argparse.ArgumentParser, default: str) -> None:
    command.add_argument("--log-level", default=default, help=f"DEBUG, INFO, WARNING, ... (default: {default})")


#: The server's Limits fields that ``serve`` takes as options (``--max-frame-bytes``, ...), with their help.
_LIMIT_OPTIONS = (
    ("max_frame_bytes", "largest WebSocket message accepted"),
    ("max_array_bytes", "largest array in a msgpack frame"),
    ("max_depth", "deepest nesting of lists and maps"),
    ("max_sequence_length", "most items of a Sequence action"),
    ("max_ndim", "most dimensions of an array"),
    ("max_containers", "most lists and maps in a message"),
    ("max_json_containers", "most lists and objects in a JSON message"),
    ("max_fragments", "most frames of a fragmented message (fast path)"),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``openenv-gym``."""
    parser = argparse.ArgumentParser(prog="openenv-gym", description="Gymnasium and OpenEnv, over the network.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_serve_parser(commands)
    _add_bench_parser(commands)
    _add_check_parser(commands)
    return parser


def _add_serve_parser(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve an env over the OpenEnv protocol (with the msgpack fast path)",
        description="Serve a Gymnasium env or an OpenEnv Environment on /ws (stock OpenEnv JSON protocol, "
        "and the openenv.msgpack.v1 fast path for clients that offer it), with GET /health, /schema, /metadata.",
    )
    serve.add_argument(
        "env_id", metavar="ENV_ID", help="CartPole-v1 | module:EnvId | module:EnvironmentClass | module:env_class_or_factory"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    serve.add_argument("--port", type=port, default=8000, help="TCP port (default: 8000; 0 = any free port)")
    serve.add_argument(
        "--unix",
        metavar="PATH",
        default=None,
        help="listen on this Unix socket (mode 0600) instead of --host/--port; clients use the URL unix:PATH",
    )
    serve.add_argument("--workers", type=positive_int, default=1, help="server processes sharing the port (default: 1)")
    serve.add_argument("--max-sessions", type=positive_int, default=256, help="sessions per process (default: 256)")
    serve.add_argument("--env-kwargs", type=json_object, default=None, help="JSON object of env keyword arguments")
    serve.add_argument("--action-class", help="module:Name of an OpenEnv env's Action class")
    serve.add_argument("--observation-class", help="module:Name of an OpenEnv env's Observation class")
    serve.add_argument("--state-class", help="module:Name of an OpenEnv env's State class")
    serve.add_argument("--ping-interval", type=seconds_or_none, default=20.0, help="keepalive ping period, s (default: 20; 0: off)")
    serve.add_argument("--ping-timeout", type=seconds_or_none, default=20.0, help="pong deadline, s (default: 20; 0: none)")
    serve.add_argument("--close-timeout", type=float, default=2.0, help="closing handshake deadline, s (default: 2)")
    _add_serve_limit_arguments(serve)
    _add_serve_execution_arguments(serve)
    _add_serve_security_arguments(serve)
    _add_serve_app_arguments(serve)


def _add_serve_limit_arguments(serve: argparse.ArgumentParser) -> None:
    """``serve``'s bounds on what a connection may send and hold."""
    from .server.context import SERVER_LIMITS

    for field, what in _LIMIT_OPTIONS:
        default = getattr(SERVER_LIMITS, field)
        serve.add_argument("--" + field.replace("_", "-"), type=positive_int, default=None, help=f"{what} (default: {default})")
    serve.add_argument(
        "--max-waiting-bytes",
        type=positive_int,
        default=8 << 20,
        help="bytes of a connection's requests that wait for their sessions before it reads no more (default: 8 MiB)",
    )
    serve.add_argument(
        "--max-held-bytes",
        type=positive_int,
        default=1 << 20,
        help="bytes of a connection's requests read ahead and held before it reads no more (default: 1 MiB)",
    )
    serve.add_argument(
        "--max-connections",
        type=positive_int,
        default=None,
        help="connections open at once, per worker; one more gets HTTP 503 (default: 2 x --max-sessions + 64)",
    )
    serve.add_argument(
        "--fragment-timeout",
        type=seconds_or_none,
        default=10.0,
        help="seconds a fragmented WebSocket message may take to arrive whole; then the connection is closed (default: 10; 0: no bound)",
    )
    serve.add_argument(
        "--max-pending-connections",
        type=positive_int,
        default=None,
        help="connections kept open that have not passed a handshake (with the token) yet; a new one takes the "
        "place of the oldest beyond it (default: half of --max-connections)",
    )


def _add_serve_execution_arguments(serve: argparse.ArgumentParser) -> None:
    """``serve``'s options of where and how env calls run."""
    serve.add_argument(
        "--busy-poll",
        type=busy_poll_us,
        default=0,
        metavar="MICROSECONDS",
        help="poll the sockets this long before sleeping, after a wait no longer than that; spends CPU for lower "
        "latency (default: 0, off; 500 suits a pool's lockstep steps)",
    )
    serve.add_argument(
        "--stock-read-ahead",
        type=positive_int,
        default=2,
        help="frames a stock-path connection reads ahead of the one being answered (default: 2)",
    )
    serve.add_argument(
        "--mcp-session-timeout",
        type=positive_float,
        default=600.0,
        help="close a POST /mcp session unused this long with no WebSocket attached, s (default: 600)",
    )
    serve.add_argument(
        "--execution",
        choices=("auto", "inline", "thread", "session"),
        default=None,
        help="where env calls run: auto (inline until calls are slow, then threads), inline, thread, "
        "session (a thread per session, as OpenEnv's server runs envs) (default: session for OpenEnv "
        "Environment classes, auto for Gymnasium envs)",
    )
    serve.add_argument(
        "--thread-threshold-ms",
        type=float,
        default=5.0,
        help="auto: when env calls average longer than this, they move to threads (default: 5)",
    )
    serve.add_argument("--threads", type=positive_int, default=64, help="env-call threads per process (default: 64)")
    serve.add_argument(
        "--cpus",
        type=cpu_list,
        default=None,
        metavar="LIST",
        help="run only on these CPUs, e.g. 0 or 0,2 or 0-3 (Linux; default: wherever the OS schedules)",
    )


def _add_serve_security_arguments(serve: argparse.ArgumentParser) -> None:
    """``serve``'s token, TLS, shutdown and logging options."""
    serve.add_argument("--compression", action="store_true", help="offer permessage-deflate (off by default)")
    serve.add_argument(
        "--token",
        default=None,
        help="require 'Authorization: Bearer TOKEN' on every WebSocket handshake and GET but /health "
        "(default: $OPENENV_GYM_TOKEN; prefer the variable, a command line shows in ps)",
    )
    serve.add_argument("--certfile", metavar="PEM", help="serve TLS (wss://, https://) with this certificate chain")
    serve.add_argument("--keyfile", metavar="PEM", help="the certificate's unencrypted private key (default: in CERTFILE)")
    serve.add_argument("--shutdown-timeout", type=float, default=5.0, help="seconds to wait for clean shutdown (default: 5)")
    _add_log_level(serve, "INFO")


def _add_serve_app_arguments(serve: argparse.ArgumentParser) -> None:
    """``serve``'s options for a stock OpenEnv app, and the hidden ones ``--workers`` passes on."""
    serve.add_argument(
        "--app-dir",
        metavar="DIR",
        default=None,
        help="a stock OpenEnv app's folder: ENV_ID is then its module:app (server.app:app), imported from DIR and "
        "served as it is, under uvicorn (default: none; a module:app found from the current folder is served so too)",
    )
    serve.add_argument(
        "--copies",
        type=positive_int,
        default=1,
        help="a stock OpenEnv app: serve this many copies, one process each, on ports PORT, PORT+1, ... "
        "(an app holds its own sessions: OpenEnv's allow one unless they read MAX_CONCURRENT_ENVS) (default: 1)",
    )
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)


def _add_check_parser(commands: Any) -> None:
    check = commands.add_parser(
        "check",
        help="drive a server as a user would: spaces, random play, check_env, a pool; and what to pass where it fails",
        description="Read URL's /schema and say where each field goes (observation, info, flags, action) and why; "
        "play random steps through OpenEnvEnv, run Gymnasium's check_env, and step a small OpenEnvVectorEnv. "
        "Where the schema does not say what the env takes (an integer with no range, a list with no length), "
        "probe the env on a session of its own and try again with the override found. Exit code 0 when every "
        "check passes (with the overrides it prints), 1 otherwise.",
    )
    check.add_argument("urls", metavar="URL", nargs="+", help="the server; several hosting the same env for the pool check")
    check.add_argument("--steps", type=int, default=50, help="random steps of the single env (default: 50)")
    check.add_argument("--envs", type=int, default=8, help="envs of the pool (default: 8; 0: no pool check)")
    check.add_argument("--pool-steps", type=int, default=30, help="steps of the pool (default: 30)")
    check.add_argument("--seed", type=int, default=0, help="seed of the resets and the action samples (default: 0)")
    check.add_argument("--no-probe", action="store_true", help="do not probe the env for what its schema leaves open")
    check.add_argument("--json", action="store_true", help="print the report as JSON (for scripts)")
    check.add_argument(
        "--token",
        default=None,
        help="bearer token for the servers (default: $OPENENV_GYM_TOKEN; prefer the variable, a command line shows in ps)",
    )
    check.add_argument("--step-timeout", type=positive_float, default=60.0, help="seconds to wait for a reply (default: 60)")
    _add_log_level(check, "ERROR")


def _add_bench_parser(commands: Any) -> None:
    bench = commands.add_parser(
        "bench",
        help="measure the pool against its baselines, or your own servers",
        description="With no arguments: start local servers (CartPole-v1) and compare, in one run, the pool on "
        "the fast path, the pool against a stock OpenEnv server (JSON), the stock OpenEnv client (with the openenv "
        "package) and gymnasium's SyncVectorEnv/AsyncVectorEnv; print steps/s, p50/p99 step latency and client "
        "CPU per step. --url measures your servers with the pool. --sweep: concurrent sessions 32..4096 on an env "
        "whose step sleeps (stock client against pool). --frames: 210x160x3 frames, time and bytes per step.",
    )
    bench.add_argument("--url", action="append", default=[], metavar="URL", help="a server to measure (repeatable)")
    bench.add_argument(
        "--token", default=None, help="the --url servers' bearer token (default: $OPENENV_GYM_TOKEN; better there: a flag shows in ps)"
    )
    bench.add_argument("--num-envs", type=positive_int, default=64, help="envs (sessions) per setup (default: 64)")
    bench.add_argument("--seconds", type=positive_float, default=3.0, help="timed seconds per trial (default: 3)")
    bench.add_argument("--trials", type=positive_int, default=3, help="interleaved trials, median reported (default: 3)")
    bench.add_argument("--batch-size", type=positive_int, default=None, help="also measure send/recv with this batch")
    bench.add_argument("--json", metavar="PATH", default=None, help="write the results as JSON")
    bench.add_argument("--plot", metavar="PATH.png", default=None, help="draw the results (needs matplotlib: [plot] extra)")
    bench.add_argument("--sweep", action="store_true", help="run the scaling sweep instead of the comparison")
    bench.add_argument("--frames", action="store_true", help="run the large-observation study instead of the comparison")
    bench.add_argument("--env", default="CartPole-v1", metavar="ENV_ID", help="the local fleet's env (default: CartPole-v1)")
    bench.add_argument("--servers", type=positive_int, default=2, help="local openenv_gym servers (default: 2)")
    bench.add_argument("--step-timeout", type=positive_float, default=60.0, help="seconds a step may take (default: 60)")
    bench.add_argument("--unix", action="store_true", help="also measure the pool on local servers listening on Unix sockets")
    bench.add_argument(
        "--busy-poll",
        type=busy_poll_us,
        default=0,
        metavar="MICROSECONDS",
        help="also measure the pool on local servers that busy-poll this long (serve --busy-poll; default: 0, not measured)",
    )
    bench.add_argument("--stock-servers", type=positive_int, default=1, help="stock OpenEnv servers for the stock setups (default: 1)")
    bench.add_argument(
        "--ceiling", action="store_true", help="also measure the pool over openenv_gym/Null-v0 (no env work): the ceiling of any env"
    )
    bench.add_argument("--pin-cpus", action="store_true", help="pin each local server to one CPU (Linux; clients stay unpinned)")
    bench.add_argument(
        "--sweep-sizes",
        type=sizes,
        default=[32, 128, 512, 1024, 2048, 4096],
        metavar="N,N,...",
        help="sweep: session counts (default: 32,128,512,1024,2048,4096)",
    )
    bench.add_argument("--sweep-sleep-ms", type=float, default=100.0, help="sweep: the env's step time, ms (default: 100)")
    bench.add_argument("--sweep-rounds", type=positive_int, default=3, help="sweep: rounds per size (default: 3)")
    bench.add_argument("--sweep-timeout", type=positive_float, default=30.0, help="sweep: per-request timeout, s (default: 30)")
    bench.add_argument(
        "--sweep-time-cap", type=positive_float, default=60.0, help="sweep: no new round of a size after this, s (default: 60)"
    )
    bench.add_argument("--sweep-servers", type=positive_int, default=4, help="sweep: server processes per client (default: 4)")
    bench.add_argument("--frames-envs", type=positive_int, default=8, help="frames: envs per setup (default: 8)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _add_log_level(bench, "WARNING")


def _worker_command(args: argparse.Namespace) -> list[str]:
    """The command line of one worker process (everything but port and worker flags)."""
    cmd = [sys.executable, "-m", "openenv_gym.server", "serve", args.env_id, "--host", args.host]
    cmd += ["--max-sessions", str(args.max_sessions)]
    if args.execution is not None:
        cmd += ["--execution", args.execution]
    cmd += ["--thread-threshold-ms", str(args.thread_threshold_ms), "--threads", str(args.threads)]
    cmd += ["--ping-interval", str(args.ping_interval or 0), "--ping-timeout", str(args.ping_timeout or 0)]
    cmd += ["--shutdown-timeout", str(args.shutdown_timeout), "--log-level", args.log_level]
    cmd += ["--close-timeout", str(args.close_timeout), "--mcp-session-timeout", str(args.mcp_session_timeout)]
    cmd += ["--max-waiting-bytes", str(args.max_waiting_bytes), "--max-held-bytes", str(args.max_held_bytes)]
    cmd += ["--stock-read-ahead", str(args.stock_read_ahead), "--busy-poll", str(args.busy_poll)]
    cmd += ["--fragment-timeout", str(args.fragment_timeout or 0)]
    # Never the token: the workers read it from their environment (see _worker_env).
    for flag, value in (
        ("--env-kwargs", json.dumps(args.env_kwargs) if args.env_kwargs is not None else None),
        ("--action-class", args.action_class),
        ("--observation-class", args.observation_class),
        ("--state-class", args.state_class),
        ("--max-frame-bytes", args.max_frame_bytes),
        ("--max-array-bytes", args.max_array_bytes),
        ("--max-depth", args.max_depth),
        ("--max-ndim", args.max_ndim),
        ("--max-sequence-length", args.max_sequence_length),
        ("--max-containers", args.max_containers),
        ("--max-json-containers", args.max_json_containers),
        ("--max-fragments", args.max_fragments),
        ("--max-connections", args.max_connections),
        ("--max-pending-connections", args.max_pending_connections),
        ("--certfile", args.certfile),
        ("--keyfile", args.keyfile),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    if args.compression:
        cmd.append("--compression")
    return cmd


def _token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``$OPENENV_GYM_TOKEN`` (an empty variable means no token)."""
    from .server.net.security import TOKEN_ENV

    if args.token is not None:
        return args.token
    return os.environ.get(TOKEN_ENV) or None


def _worker_env(token: str | None) -> dict[str, str]:
    """The environment of the workers: ours, with the token (if any) in ``OPENENV_GYM_TOKEN``."""
    from .server.net.security import TOKEN_ENV

    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    if token is not None:
        env[TOKEN_ENV] = token
    return env


def _serve(args: argparse.Namespace) -> int:
    from .server.hosting.openenv_app import find_app
    from .server.net.workers import exit_with_parent, run_workers

    # module:Name is looked up in the current directory too, as with `python -m` (and uvicorn).
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    token = _token(args)
    tls = _serve_tls(args, token)
    if isinstance(tls, int):
        return tls
    if args.cpus is not None and not _run_on_cpus(args.cpus):
        return 2
    if args.parent_pid is not None:  # (with workers too: they go when we go)
        exit_with_parent(args.parent_pid)

    if args.app_dir is not None and (args.token is not None or args.certfile is not None or args.unix is not None or args.workers > 1):
        return _serve_app(args, None)  # (refused before the app is imported)
    try:
        app = find_app(args.env_id, args.app_dir) if args.app_dir is not None or ":" in args.env_id else None
    except (ImportError, ValueError) as exc:
        print(f"openenv-gym serve: cannot serve {args.env_id!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if app is not None:
        return _serve_app(args, app)
    if args.copies > 1:
        print("openenv-gym serve: --copies is for stock OpenEnv apps (module:app); --workers serves more of this env", file=sys.stderr)
        return 2
    if args.unix is not None and args.workers > 1:
        print("openenv-gym serve: --unix serves one process; --workers needs a TCP port", file=sys.stderr)
        return 2
    if args.workers > 1:
        try:
            return run_workers(_worker_command(args), args.workers, args.host, args.port, env=_worker_env(token))
        except OSError as exc:  # (the port is taken, the host is not ours, ...)
            print(f"openenv-gym serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 2
    return _serve_here(args, _server_config(args, token, tls))


def _serve_tls(args: argparse.Namespace, token: str | None) -> ssl.SSLContext | None | int:
    """The TLS context of ``--certfile`` (``None`` without it), once the token and TLS options are checked; else exit code 2."""
    import ssl

    from .server.net.security import check_token, server_ssl_context

    if args.keyfile is not None and args.certfile is None:
        print("openenv-gym serve: --keyfile needs --certfile", file=sys.stderr)
        return 2
    if args.unix is not None and args.certfile is not None:
        print("openenv-gym serve: a Unix socket is local to this machine; --certfile does not apply to it", file=sys.stderr)
        return 2
    try:
        if token is not None:
            check_token(token)  # the message never quotes the token
    except ValueError as exc:
        print(f"openenv-gym serve: bad token: {exc}", file=sys.stderr)
        return 2
    try:
        return server_ssl_context(args.certfile, args.keyfile) if args.certfile is not None else None
    except (OSError, ssl.SSLError, ValueError) as exc:
        files = args.certfile if args.keyfile is None else f"{args.certfile}, {args.keyfile}"
        print(f"openenv-gym serve: cannot load the TLS certificate and key ({files}): {exc}", file=sys.stderr)
        return 2


def _run_on_cpus(cpus: set[int]) -> bool:
    """Keep this process (and the workers, which inherit it) on ``cpus``; ``False`` (said on stderr) where it cannot."""
    if not hasattr(os, "sched_setaffinity"):
        print("openenv-gym serve: --cpus needs Linux (sched_setaffinity)", file=sys.stderr)
        return False
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        print(f"openenv-gym serve: cannot run on CPUs {sorted(cpus)}: {exc}", file=sys.stderr)
        return False
    return True


def _server_config(args: argparse.Namespace, token: str | None, tls: ssl.SSLContext | None) -> ServerConfig:
    """The :class:`ServerConfig` of ``serve``'s options."""
    from dataclasses import replace

    from .server.context import SERVER_LIMITS, ServerConfig

    limits = replace(SERVER_LIMITS, **{f: getattr(args, f) for f, _ in _LIMIT_OPTIONS if getattr(args, f) is not None})
    return ServerConfig(
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        limits=limits,
        ping_interval=args.ping_interval,
        ping_timeout=args.ping_timeout,
        close_timeout=args.close_timeout,
        shutdown_timeout=args.shutdown_timeout,
        execution=args.execution,
        thread_threshold=args.thread_threshold_ms / 1e3,
        threads=args.threads,
        compression=args.compression,
        token=token,
        ssl=tls,
        mcp_session_timeout=args.mcp_session_timeout,
        max_waiting_bytes=args.max_waiting_bytes,
        max_held_bytes=args.max_held_bytes,
        stock_read_ahead=args.stock_read_ahead,
        max_connections=args.max_connections,
        max_pending_connections=args.max_pending_connections,
        fragment_timeout=args.fragment_timeout,
        busy_poll=args.busy_poll / 1e6,
    )


def _serve_here(args: argparse.Namespace, config: ServerConfig) -> int:
    """Serve ``args.env_id`` in this process until SIGTERM/SIGINT; the exit code."""
    from .server.app import run
    from .server.hosting.resolve import resolve_factory
    from .server.net.unix import UnixListener
    from .server.net.workers import listening_socket

    try:
        factory = resolve_factory(
            args.env_id,
            env_kwargs=args.env_kwargs,
            action_class=args.action_class,
            observation_class=args.observation_class,
            state_class=args.state_class,
            max_sessions=args.max_sessions,
        )
        factory.schema()  # fail now, not on the first GET /schema
        factory.metadata()
    except Exception as exc:
        print(f"openenv-gym serve: cannot serve {args.env_id!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        listener = UnixListener(args.unix) if args.unix is not None else None
        sock = listener.sock if listener is not None else listening_socket(args.host, args.port, reuse_port=args.reuse_port)
    except OSError as exc:  # (the port is taken, the host is not ours, ...)
        where = args.unix if args.unix is not None else f"{args.host}:{args.port}"
        print(f"openenv-gym serve: cannot listen on {where}: {exc}", file=sys.stderr)
        return 2
    try:
        run(factory, config, sock=sock, after_close=listener.release if listener is not None else None)
    finally:
        if listener is not None:
            listener.release()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        # An env call still blocks a worker thread; the interpreter would wait for it at exit.
        logging.getLogger(__name__).warning("env calls still running at exit; not waiting for them")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _check(args: argparse.Namespace) -> int:
    from .check import check
    from .server.net.security import TOKEN_ENV

    token = args.token or os.environ.get(TOKEN_ENV)
    report = check(
        args.urls,
        steps=args.steps,
        num_envs=args.envs,
        pool_steps=args.pool_steps,
        seed=args.seed,
        probe=not args.no_probe,
        headers={"Authorization": f"Bearer {token}"} if token else None,
        step_timeout=args.step_timeout,
    )
    print(json.dumps(report.to_json(), indent=2) if args.json else report.text())
    return 0 if report.ok else 1


def _serve_app(args: argparse.Namespace, app: Any) -> int:
    """Serve a stock OpenEnv app as it is: ``--copies`` processes under uvicorn, on ``--port`` and the ports after it."""
    if args.token is not None or args.certfile is not None or args.unix is not None or args.workers > 1:
        print(
            "openenv-gym serve: a stock app is served as it is (uvicorn, TCP, no token, no TLS, one process a copy); "
            "to serve its Environment class with those, name the class: openenv-gym serve module:EnvironmentClass",
            file=sys.stderr,
        )
        return 2
    if args.copies == 1:
        import uvicorn

        uvicorn.run(app, host=args.host, port=args.port, log_level=str(args.log_level).lower(), timeout_graceful_shutdown=2)
        return 0
    import signal

    import httpx

    from .launch import LaunchError, ServerProcess, _free_port, serve_command

    started: list[ServerProcess] = []
    try:
        for i in range(args.copies):
            port = args.port + i if args.port else _free_port(args.host)
            command = serve_command(
                args.env_id, host=args.host, port=port, max_sessions=1, env_kwargs=None, extra_args=(), stock=True, app_dir=args.app_dir
            )
            started.append(ServerProcess(command, args.host, port))
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            deadline = time.monotonic() + 60
            for server in started:
                server.wait_healthy(client, deadline)
        for server in started:
            print(server.url, flush=True)
        if hasattr(signal, "sigwait"):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        else:  # pragma: no cover - not POSIX
            threading.Event().wait()
    except LaunchError as exc:
        print(f"openenv-gym serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    finally:
        for server in started:
            server.stop()
    return 0


def _bench(args: argparse.Namespace, argv: list[str]) -> int:
    from . import bench

    refusal = _bench_refusal(args)
    if refusal is not None:
        print(f"openenv-gym bench: {refusal}", file=sys.stderr)
        return 2
    machine = bench.describe_machine()
    report = bench.BenchReport(machine, command=["openenv-gym", *argv])
    start = time.monotonic()
    try:
        failed = _bench_run(args, report)
    except KeyboardInterrupt:
        print("openenv-gym bench: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"openenv-gym bench: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    report.seconds = time.monotonic() - start
    print(f"\n({report.seconds:.0f} s)")
    try:
        if args.json is not None:
            bench.write_json(report, args.json)
            print(f"wrote {args.json}")
        if args.plot is not None:
            bench.plot_report(report, args.plot)
            print(f"wrote {args.plot}")
    except (OSError, ValueError) as exc:
        print(f"openenv-gym bench: cannot write the output: {exc}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def _bench_refusal(args: argparse.Namespace) -> str | None:
    """Why ``bench``'s options do not go together, or ``None``."""
    from . import bench

    if args.url and (args.sweep or args.frames):
        return "--url measures your servers with the pool; --sweep and --frames start their own"
    if (args.unix or args.ceiling or args.busy_poll) and (args.url or args.sweep or args.frames):
        return "--unix, --ceiling and --busy-poll add rows to the comparison of the local fleet; not with --url, --sweep or --frames"
    if args.batch_size is not None and args.batch_size > args.num_envs:
        return f"--batch-size must be <= --num-envs ({args.num_envs})"
    if args.plot is not None and not bench.plot_available():
        return "--plot needs matplotlib: pip install -e '.[plot]' in a checkout"
    return None


def _bench_run(args: argparse.Namespace, report: BenchReport) -> bool:
    """Run the studies ``args`` ask for into ``report``, printing each table; whether a setup failed."""
    from . import bench

    machine = report.machine
    failed = False

    def measured(title: str, run: Callable[[bench.ProgressBar], T]) -> T:
        """``run(progress)`` with a progress bar on stderr, closed however it ends."""
        progress = bench.ProgressBar(title, sys.stderr, enabled=not args.no_progress)
        try:
            return run(progress)
        finally:
            progress.close()

    if not (args.sweep or args.frames):
        report.compare = measured("bench", lambda progress: bench.run_compare(progress=progress, **_compare_options(args)))
        print(bench.format_compare(report.compare, machine), flush=True)
        failed = any(s.stats is None for s in report.compare.setups)
    if args.sweep:
        report.sweep = measured(
            "sweep",
            lambda progress: bench.run_sweep(
                args.sweep_sizes,
                sleep_ms=args.sweep_sleep_ms,
                rounds=args.sweep_rounds,
                timeout=args.sweep_timeout,
                time_cap=args.sweep_time_cap,
                servers=args.sweep_servers,
                progress=progress,
            ),
        )
        print(bench.format_sweep(report.sweep, machine), flush=True)
    if args.frames:
        report.frames = measured(
            "frames",
            lambda progress: bench.run_frames(
                num_envs=args.frames_envs,
                seconds=args.seconds,
                trials=args.trials,
                step_timeout=args.step_timeout,
                progress=progress,
            ),
        )
        if report.sweep is not None:
            print()
        print(bench.format_frames(report.frames, machine), flush=True)
        failed = failed or any(r.timing.stats is None for r in report.frames.rows)
    return failed


def _compare_options(args: argparse.Namespace) -> dict[str, Any]:
    """``bench.run_compare``'s arguments from ``bench``'s options."""
    return dict(
        urls=args.url,
        env_id=args.env,
        num_envs=args.num_envs,
        seconds=args.seconds,
        trials=args.trials,
        batch_size=args.batch_size,
        servers=args.servers,
        step_timeout=args.step_timeout,
        pin_cpus=args.pin_cpus,
        unix=args.unix,
        ceiling=args.ceiling,
        busy_poll=args.busy_poll,
        stock_servers=args.stock_servers,
        headers=_bench_headers(args),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``openenv-gym`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )
    # websockets logs every answered HTTP request and handshake at INFO, MCP every tool call.
    for chatty in ("websockets", "mcp", "fastmcp", "httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    if args.command == "serve":
        return _serve(args)
    if args.command == "bench":
        return _bench(args, list(argv) if argv is not None else sys.argv[1:])
    if args.command == "check":
        return _check(args)
    return 2  # pragma: no cover - argparse enforces the subcommand


if __name__ == "__main__":  # pragma: no cover
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
