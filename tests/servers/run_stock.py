"""Serve one stock OpenEnv test environment with uvicorn on loopback.

Usage (cwd = repository root)::

    python -m tests.servers.run_stock --env cartpole --port 8123 [--max-sessions 64]

The test-suite starts these servers through :mod:`tests.servers.forkserver`
(which calls :func:`serve` in a forked child, the imports already done);
this command line runs the same server by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time


def exit_when_orphaned(poll_seconds: float = 1.0) -> None:
    """Exit if the launching process dies (e.g. pytest was SIGKILLed)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def serve(env: str, port: int, max_sessions: int) -> None:
    """Run OpenEnv's stock app for ``env`` under uvicorn until SIGTERM."""
    import uvicorn

    from tests.servers.stock_envs import create_app

    app = create_app(env, max_sessions)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        # Do not wait forever for open WebSockets on SIGTERM.
        timeout_graceful_shutdown=2,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env", required=True, help="cartpole | mixed | slow | guess | ...")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-sessions", type=int, default=64)
    args = parser.parse_args(argv)
    exit_when_orphaned()
    serve(args.env, args.port, args.max_sessions)
    return 0


def exit_now(code: int) -> None:
    """Flush and leave at once: session executors are non-daemon threads, and a step
    still sleeping in the "slow" env would otherwise keep the interpreter alive."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
