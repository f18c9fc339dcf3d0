"""The scaling sweep: how many concurrent sessions, at what latency, for the stock client and the pool.

Modelled on OpenEnv's scaling study (``tutorial/03-scaling.md``): local
servers host an env whose step sleeps ``sleep_ms`` (``openenv_gym/Sleep-v0``),
and for each size ``n`` in ``sizes``:

- **stock client**: ``n`` ``openenv.core.GenericEnvClient`` sessions at once
  (``asyncio.gather``), each doing OpenEnv's pattern, connect, reset, one step,
  close, spread round-robin over ``servers`` stock OpenEnv servers. A request
  is the connect + reset + step, and succeeds when it completes without error
  within ``timeout``; its latency is that span (the close is not counted).
- **pool**: one ``OpenEnvVectorEnv`` of ``n`` sessions over ``servers``
  openenv_gym servers, opened and reset once, then stepped. A request is one
  env's step; it succeeds when it returns without ``info["openenv_error"]``
  within ``timeout``; its latency is the whole ``step()`` call (lockstep: an
  env's result is handed back with the slowest one's).

Each size runs up to ``rounds`` rounds, stopping early after ``time_cap``
seconds; a client's larger sizes are skipped once its success rate falls
below :data:`SUCCESS_THRESHOLD`. Steps/s is successful requests per second of
wall time (each stock request carries one step).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..launch import launch_local
from ..vector import OpenEnvVectorEnv
from .compare import Progress, _no_progress
from .machine import FdLimit, ensure_fd_limit
from .measure import percentile
from .runners import stock_available

__all__ = ["DEFAULT_SIZES", "POOL", "STOCK", "SUCCESS_THRESHOLD", "SweepPoint", "SweepResult", "run_sweep"]

logger = logging.getLogger(__name__)

SUCCESS_THRESHOLD = 0.95
DEFAULT_SIZES = (32, 128, 512, 1024, 2048, 4096)
STOCK = "stock client"
POOL = "pool"
#: Most rounds per size, whatever ``rounds`` says.
MAX_ROUNDS = 100
SLEEP_ENV = "openenv_gym/Sleep-v0"


@dataclass(slots=True)
class SweepPoint:
    """One client at one size.

    Attributes:
        client: :data:`STOCK` or :data:`POOL`.
        sessions: concurrent sessions.
        rounds: rounds run.
        requests, successes: requests made and those that succeeded.
        success_rate: ``successes / requests`` (0 when nothing ran).
        p50_s, p99_s: latency percentiles of the successful requests, seconds.
        steps_per_s: successful requests per second of wall time.
        wall_s: wall time of the rounds, seconds.
        open_s: pool only, opening and resetting the sessions, seconds.
        errors: failed requests by error type.
        skipped: why the point was not run (then nothing else is set).
    """

    client: str
    sessions: int
    rounds: int = 0
    requests: int = 0
    successes: int = 0
    success_rate: float = 0.0
    p50_s: float | None = None
    p99_s: float | None = None
    steps_per_s: float = 0.0
    wall_s: float = 0.0
    open_s: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return self.skipped is None and self.requests > 0 and self.success_rate >= SUCCESS_THRESHOLD

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class SweepResult:
    """The sweep's settings, points and verdicts.

    Attributes:
        max_ok: per client, the largest size with success rate >= 95% (``None``: none).
        fd_limit: the open-files limit the run had.
    """

    sizes: list[int]
    sleep_ms: float
    rounds: int
    timeout: float
    time_cap: float
    servers: int
    clients: list[str]
    fd_limit: FdLimit
    points: list[SweepPoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def max_ok(self) -> dict[str, int | None]:
        best: dict[str, int | None] = {c: None for c in self.clients}
        for p in self.points:
            if p.ok and (best[p.client] is None or p.sessions > best[p.client]):  # type: ignore[operator]
                best[p.client] = p.sessions
        return best

    def point(self, client: str, sessions: int) -> SweepPoint | None:
        return next((p for p in self.points if p.client == client and p.sessions == sessions), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sizes": self.sizes,
            "sleep_ms": self.sleep_ms,
            "rounds": self.rounds,
            "timeout_s": self.timeout,
            "time_cap_s": self.time_cap,
            "servers": self.servers,
            "clients": self.clients,
            "success_threshold": SUCCESS_THRESHOLD,
            "fd_limit": self.fd_limit.as_dict(),
            "max_sessions_ok": self.max_ok,
            "points": [p.as_dict() for p in self.points],
            "notes": self.notes,
        }


def _finish(point: SweepPoint, latencies: list[float], errors: Counter[str]) -> SweepPoint:
    point.success_rate = point.successes / point.requests if point.requests else 0.0
    point.p50_s = percentile(latencies, 50) if latencies else None
    point.p99_s = percentile(latencies, 99) if latencies else None
    point.steps_per_s = point.successes / point.wall_s if point.wall_s > 0 else 0.0
    point.errors = dict(errors.most_common())
    return point


# ------------------------------------------------------------------ stock client


async def _stock_session(url: str, seed: int, timeout: float) -> float:
    """One stock session: connect, reset, one step (timed, seconds), then close."""
    from openenv.core.generic_client import GenericEnvClient

    client = GenericEnvClient(base_url=url, connect_timeout_s=timeout, message_timeout_s=timeout)
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            await client.connect()
            await client.reset(seed=seed)
            await client.step({"action": 0})
        return time.perf_counter() - start
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5.0):
                await client.close()


async def _stock_round(urls: Sequence[str], n: int, timeout: float) -> list[float | BaseException]:
    calls = [_stock_session(urls[i % len(urls)], i, timeout) for i in range(n)]
    return await asyncio.gather(*calls, return_exceptions=True)


def _stock_point(urls: Sequence[str], n: int, rounds: int, timeout: float, time_cap: float) -> SweepPoint:
    point = SweepPoint(STOCK, n)
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    start = time.perf_counter()
    while point.rounds < min(rounds, MAX_ROUNDS) and (point.rounds == 0 or time.perf_counter() - start < time_cap):
        t = time.perf_counter()
        outcomes = asyncio.run(_stock_round(urls, n, timeout))
        point.wall_s += time.perf_counter() - t
        point.rounds += 1
        point.requests += n
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                errors[type(outcome).__name__] += 1
            else:
                point.successes += 1
                latencies.append(outcome)
    return _finish(point, latencies, errors)


# ------------------------------------------------------------------ pool


def _pool_point(urls: Sequence[str], n: int, rounds: int, timeout: float, time_cap: float) -> SweepPoint:
    point = SweepPoint(POOL, n)
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    start = time.perf_counter()
    try:
        envs = OpenEnvVectorEnv(list(urls), n, step_timeout=timeout, connect_timeout=timeout, grace_period=timeout)
    except Exception as exc:
        point.requests = n
        errors[type(exc).__name__] += n
        return _finish(point, latencies, errors)
    try:
        envs.reset(seed=0)
        point.open_s = time.perf_counter() - start
        actions = np.zeros(n, dtype=np.int64)
        while point.rounds < min(rounds, MAX_ROUNDS) and (point.rounds == 0 or time.perf_counter() - start < time_cap):
            t = time.perf_counter()
            try:
                *_, infos = envs.step(actions)
            except Exception as exc:
                point.wall_s += time.perf_counter() - t
                point.rounds += 1
                point.requests += n
                errors[type(exc).__name__] += n
                break
            elapsed = time.perf_counter() - t
            point.wall_s += elapsed
            point.rounds += 1
            point.requests += n
            failed = np.asarray(infos.get("_openenv_error", np.zeros(n, dtype=bool)), dtype=bool)
            if failed.any():
                types = infos["openenv_error"]["type"][failed]
                errors.update(str(t) for t in types)
            ok = n - int(failed.sum())
            point.successes += ok
            latencies.extend([elapsed] * ok)
    except Exception as exc:  # the reset failed for good
        point.requests = max(point.requests, n)
        errors[type(exc).__name__] += n
    finally:
        envs.close()
    return _finish(point, latencies, errors)


# ------------------------------------------------------------------ the sweep


def _start_fleets(stack: contextlib.ExitStack, clients: list[str], servers: int, per_server: int, sleep_ms: float) -> dict[str, list[str]]:
    """Per client, the URLs of its ``servers`` local servers of Sleep-v0 (``sleep_ms`` a step), started in ``stack``.

    Each has room for ``per_server`` sessions of a size twice over, as the previous size's are still being released.
    """
    env_kwargs = {"min_ms": sleep_ms, "max_ms": sleep_ms, "episode_length": 1_000_000}
    capacity = 2 * per_server + 16
    urls: dict[str, list[str]] = {}
    if POOL in clients:
        urls[POOL] = stack.enter_context(
            launch_local(
                SLEEP_ENV,
                servers=servers,
                max_sessions=capacity,
                env_kwargs=env_kwargs,
                extra_args=["--execution", "thread", "--threads", str(per_server + 16)],
            )
        )
    if STOCK in clients:
        import openenv.core.generic_client  # noqa: F401  (seconds to import: not in the first round)

        urls[STOCK] = stack.enter_context(
            launch_local(SLEEP_ENV, servers=servers, max_sessions=capacity, env_kwargs=env_kwargs, stock=True)
        )
    return urls


def run_sweep(
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    sleep_ms: float = 100.0,
    rounds: int = 3,
    timeout: float = 30.0,
    time_cap: float = 60.0,
    servers: int = 4,
    clients: Sequence[str] | None = None,
    progress: Progress = _no_progress,
) -> SweepResult:
    """Run the sweep (see the module docstring) on local servers started here.

    Args:
        sizes: session counts, run in increasing order.
        sleep_ms: the env's step duration, milliseconds.
        rounds: rounds per size (each: every session does one request).
        timeout: per-request timeout, seconds.
        time_cap: no new round of a size starts after this many seconds.
        servers: server processes per client kind.
        clients: ``[STOCK, POOL]`` by default (the stock client only when the
            ``openenv`` package is installed).
        progress: ``progress(done, total, label)``.
    """
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] < 1 or rounds < 1 or servers < 1 or timeout <= 0 or time_cap <= 0:
        raise ValueError("sizes, rounds and servers must be >= 1; timeout and time_cap > 0")
    notes: list[str] = []
    if clients is None:
        clients = [STOCK, POOL] if stock_available() else [POOL]
        if STOCK not in clients:
            notes.append("the stock client was left out: it needs openenv (`pip install -e '.[openenv]'` in a checkout)")
    clients = list(clients)
    largest = sizes[-1]
    per_server = math.ceil(largest / servers)
    # Sockets: the stock client holds `largest` at once; each server process inherits
    # the limit and holds its share; plus files, pipes and slack.
    fd = ensure_fd_limit(largest + per_server * 2 + 512)
    if not fd.enough:
        notes.append(f"open-files limit {fd.soft} (hard {fd.hard}) < {fd.needed} needed: large sizes may fail")
    result = SweepResult(sizes, sleep_ms, rounds, timeout, time_cap, servers, clients, fd, notes=notes)
    total = 1 + len(sizes) * len(clients)
    done = 0
    progress(done, total, "starting local servers")
    with contextlib.ExitStack() as stack:
        urls = _start_fleets(stack, clients, servers, per_server, sleep_ms)
        done += 1
        failed: dict[str, int] = {}
        for n in sizes:
            for client in clients:
                label = f"{client}, {n} sessions"
                progress(done, total, label)
                if client in failed:
                    point = SweepPoint(client, n, skipped=f"success below {SUCCESS_THRESHOLD:.0%} at {failed[client]} sessions")
                else:
                    run = _stock_point if client == STOCK else _pool_point
                    point = run(urls[client], n, rounds, timeout, time_cap)
                    logger.info(
                        "%s: %d sessions, success %.3f, p99 %s s, %.0f steps/s",
                        client,
                        n,
                        point.success_rate,
                        point.p99_s,
                        point.steps_per_s,
                    )
                    if not point.ok:
                        failed[client] = n
                result.points.append(point)
                done += 1
                progress(done, total, label)
    return result
