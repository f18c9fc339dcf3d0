"""Where the wall time of one lockstep step goes, across the client and both servers.

Timestamps (``CLOCK_MONOTONIC``, shared by the processes of one machine) at
each edge of a step of ``OpenEnvVectorEnv`` over two local servers,
CartPole-v1, 64 envs, on the lockstep path with raw frames:

- client: ``step()`` called; each server's request written; each raw reply
  handed to its connection (its WebSocket frame read); ``step()`` returned;
- each server: the request's frame handed to its protocol; its reply written.

Medians over ``--steps`` steps (after 300 warm-up steps) of the spans
between them: the client's work before the first request goes out, a
server's wake-up (request written -> read), its frame (read -> reply
written), the client's wake-up and queue (reply written -> read; a reply
that comes while the client handles the other one waits here), and the
client's work after the last reply.

The servers run in this script's own wrapper (``--serve``), which hooks the
two edges of a frame into the fast path's connection; the client's edges are
hooked the same way. The hooks are private names of openenv_gym: the script
stops with an error if they are gone.

    python benchmarks/step_timeline.py [--steps 3000] [--busy-poll 0]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

RAW_MARK = b"\xc1"
WARM_UP = 300


def _hook(owner: type, name: str, before: Any) -> Any:
    """Call ``before(self, *args)`` at each call of ``owner.name``; returns what undoes it."""
    real = owner.__dict__.get(name)
    if real is None:
        raise SystemExit(f"step_timeline.py: {owner.__name__}.{name} is gone; update the hooks")

    def hooked(self: Any, *args: Any) -> Any:
        before(self, *args)
        return real(self, *args)

    setattr(owner, name, hooked)
    return lambda: setattr(owner, name, real)


def serve(out: str, argv: list[str]) -> None:
    """``openenv-gym serve`` with the edges of each raw frame timed; written to ``out`` as JSON at exit."""
    from openenv_gym.cli import main
    from openenv_gym.server.hosting.gym_host import GymHostFactory
    from openenv_gym.server.wire import fast_loop as fast

    frames: list[tuple[int, int, int, int]] = []  # (request id, read, reply written, ns in the env calls) of each raw step
    clock = time.monotonic_ns
    in_batch = [0]  # ns in the factory's run_batch or run_lane (the env calls) since the last reply

    def timed(real: Any) -> Any:
        def run(factory: Any, *args: Any) -> Any:
            start = clock()
            try:
                return real(factory, *args)
            finally:
                in_batch[0] += clock() - start

        return run

    GymHostFactory.run_batch = timed(GymHostFactory.run_batch)  # type: ignore[method-assign]
    GymHostFactory.run_lane = timed(GymHostFactory.run_lane)  # type: ignore[method-assign]

    def on_data(conn: Any, data: bytes) -> None:
        conn.timeline_read = clock()  # (the last bytes in before a reply: the request's)

    def on_write(conn: Any, payload: bytes) -> None:
        if payload[:1] == RAW_MARK:
            frames.append((int.from_bytes(payload[8:16], "little"), conn.timeline_read, clock(), in_batch[0]))
        in_batch[0] = 0

    _hook(fast._FastConnection, "data_received", on_data)
    _hook(fast._FastConnection, "_write", on_write)

    def dump() -> None:
        with open(out, "w") as f:
            json.dump(frames, f)

    atexit.register(dump)  # (the server stops cleanly on SIGTERM: its own handler)
    sys.argv = ["openenv-gym", "serve", *argv]
    main()


def measure(steps: int, busy_poll: int = 0) -> tuple[float, dict[str, float]]:
    """Run the pool for ``steps`` timed steps; its steps/s and the median of each span (us), by name.

    ``busy_poll``: the servers' ``--busy-poll`` (microseconds; 0: they sleep between frames).
    """
    import httpx

    from openenv_gym import OpenEnvVectorEnv
    from openenv_gym.client import FastConnection, websocket
    from openenv_gym.launch import ServerProcess, _free_port

    n = 64
    work = tempfile.mkdtemp(prefix="step-timeline-")
    servers, dumps = [], []
    try:
        for k in range(2):
            port = _free_port("127.0.0.1")
            dumps.append(os.path.join(work, f"server{k}.json"))
            argv = ["CartPole-v1", "--host", "127.0.0.1", "--port", str(port), "--max-sessions", str(n)]
            if busy_poll:
                argv += ["--busy-poll", str(busy_poll)]
            servers.append(ServerProcess([sys.executable, __file__, "--serve", dumps[k], *argv], "127.0.0.1", port))
        with httpx.Client(timeout=2) as client:
            for server in servers:
                server.wait_healthy(client, time.monotonic() + 60)
        urls = [server.url for server in servers]
        envs = OpenEnvVectorEnv(urls, n)
        envs.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 2, (steps + WARM_UP, n))
        for t in range(WARM_UP):
            envs.step(actions[t])

        clock = time.monotonic_ns
        written: dict[str, list[tuple[int, int]]] = {}  # per server URL: (request id, written) of each raw step
        read: dict[str, dict[int, int]] = {}  # per server URL: request id -> its raw reply read

        def on_send(conn: Any, payload: bytes, text: bool) -> None:
            if payload[:1] == RAW_MARK:
                written.setdefault(conn.url, []).append((int.from_bytes(payload[8:16], "little"), clock()))

        def on_raw(conn: Any, payload: bytes) -> None:
            read.setdefault(conn.url, {})[int.from_bytes(payload[8:16], "little")] = clock()

        undo = [
            _hook(websocket.WebSocketConnection, "_send_message", on_send),
            _hook(FastConnection, "_on_raw", on_raw),
        ]
        called, returned = [], []
        try:
            start = time.perf_counter()
            for t in range(WARM_UP, WARM_UP + steps):
                called.append(clock())
                envs.step(actions[t])
                returned.append(clock())
            wall = time.perf_counter() - start
        finally:
            for step_back in undo:
                step_back()
        envs.close()
    finally:
        for server in servers:
            server.stop(timeout=30)  # (one SIGTERM: a clean stop, in which it writes its timestamps; a second would cut that short)

    order = list(written)
    if len(order) != 2 or any(len(written[url]) != steps for url in order):
        raise SystemExit("step_timeline.py: not every step went out as one raw frame to each server (no lanes?)")
    served = []  # per server: request id -> (read, reply written)
    for dump in dumps:
        with open(dump) as f:
            served.append({rid: (got, sent, batch) for rid, got, sent, batch in json.load(f)})

    ports = [url.rsplit(":", 1)[1] for url in urls]  # (the k-th dump is the server at urls[k])
    by_url = {url: served[ports.index(url.split(":")[2].split("/")[0])] for url in order}
    # Per step and URL: written, read by the server, reply written, reply read by the client.
    steps_of = {url: [(t, *by_url[url][rid][:2], read[url][rid], by_url[url][rid][2]) for rid, t in written[url]] for url in order}

    def median_us(values: list[int]) -> float:
        return statistics.median(values) / 1000

    a, b = steps_of[order[0]], steps_of[order[1]]
    spans: dict[str, float] = {
        "step() call to return": median_us([r - c for c, r in zip(called, returned)]),
        "call to first request written": median_us([min(a[i][0], b[i][0]) - called[i] for i in range(steps)]),
        "first to second request written": median_us([abs(b[i][0] - a[i][0]) for i in range(steps)]),
    }
    for k, url in enumerate(order):
        edges = steps_of[url]
        spans[f"server {k}: request written to read (wake-up)"] = median_us([e[1] - e[0] for e in edges])
        spans[f"server {k}: frame, read to reply written"] = median_us([e[2] - e[1] for e in edges])
        spans[f"server {k}:   of which running the envs (run_lane)"] = median_us([e[4] for e in edges])
        spans[f"server {k}: reply written to read by the client"] = median_us([e[3] - e[2] for e in edges])
    spans["last reply read to step() return"] = median_us([returned[i] - max(a[i][3], b[i][3]) for i in range(steps)])
    return n * steps / wall, spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--busy-poll", type=int, default=0, help="the servers' --busy-poll, microseconds (default: 0, they sleep)")
    parser.add_argument("--serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve[0], args.serve[1:])
        return

    from openenv_gym.bench.machine import describe_machine, machine_line

    rate, spans = measure(args.steps, args.busy_poll)
    polling = f", servers busy-polling {args.busy_poll} us" if args.busy_poll else ""
    print(
        f"CartPole-v1, 64 envs on 2 local servers{polling}, lockstep step(), {args.steps} steps: {rate:,.0f} steps/s; "
        f"{machine_line(describe_machine())}"
    )
    print(f"{'span (median)':<52} {'us':>7}")
    for name, value in spans.items():
        print(f"{name:<52} {value:>7.1f}")


if __name__ == "__main__":
    main()
