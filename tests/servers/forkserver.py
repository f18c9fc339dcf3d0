"""A fork server for the stock OpenEnv test servers: the imports once, a fork per server.

Importing OpenEnv's server side (FastAPI, pydantic models, MCP, gradio) and
uvicorn costs ~4.5 s of CPU here, and the suite starts over a dozen stock
servers. This process does those imports once, then forks a child per
server; each child runs exactly what ``python -m tests.servers.run_stock``
runs (:func:`tests.servers.run_stock.serve`): OpenEnv's own app under uvicorn,
in a session of its own, its output in its own log file.

Protocol, one JSON object per line. In, on stdin: ``{"env", "port",
"max_sessions", "environ", "log"}``, or ``{"argv", "environ", "log"}`` for an
openenv_gym server (``openenv-gym`` with ``argv``: the same imports save the
same seconds for one hosting an OpenEnv ``Environment`` class). Out, on stdout: ``{"pid": n}`` or
``{"error": "..."}`` for each request, in order, and ``{"exit": pid, "code": c}``
when a child has ended (``c`` as :attr:`subprocess.Popen.returncode`: minus the
signal's number if a signal ended it). End of stdin (the test run ended or
died): every child still running gets SIGTERM, and this process leaves.

One thread only, so that forking is safe: children are reaped when SIGCHLD
wakes the ``select`` (``signal.set_wakeup_fd``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import traceback
from typing import Any

from tests.servers.run_stock import exit_now, exit_when_orphaned, serve


def _child(request: dict[str, Any], wakeup: tuple[int, int]) -> None:
    """In the forked child: become the server of ``request``; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wakeup:
            os.close(fd)
        os.setsid()  # (as start_new_session: a Ctrl-C of the test run does not reach it twice)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        if "argv" in request:  # an openenv_gym server: `openenv-gym serve ...`, its token in the environment only
            os.environ.pop("OPENENV_GYM_TOKEN", None)
            os.environ.update(request.get("environ") or {})
            from openenv_gym.cli import main as openenv_gym_main

            code = openenv_gym_main(request["argv"])
            exit_now(code)
        os.environ.update(request.get("environ") or {})
        exit_when_orphaned()
        serve(request["env"], int(request["port"]), int(request["max_sessions"]))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    exit_now(code)


def _say(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def main() -> None:
    import uvicorn  # noqa: F401  (the imports every child needs, done once)

    import openenv_gym.cli  # noqa: F401
    import openenv_gym.server.app  # noqa: F401
    import openenv_gym.server.hosting.openenv_host  # noqa: F401
    import tests.servers.stock_envs  # noqa: F401

    wakeup = os.pipe()
    for fd in wakeup:
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wakeup[1])
    children: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([0, wakeup[0]], [], [])
        if wakeup[0] in ready:
            try:
                while os.read(wakeup[0], 4096):
                    pass
            except BlockingIOError:
                pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            _say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if 0 not in ready:
            continue
        data = os.read(0, 65536)
        if not data:
            break
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            try:
                request = json.loads(line)
                pid = os.fork()
            except Exception as exc:
                _say({"error": repr(exc)})
                continue
            if pid == 0:
                _child(request, wakeup)
            children.add(pid)
            _say({"pid": pid})
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    exit_now(0)


if __name__ == "__main__":
    main()
