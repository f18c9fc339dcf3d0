"""The comparison: the pool against its baselines, side by side in one run.

With no URLs, an embedded local fleet (``launch_local``) hosts ``env_id``
(CartPole-v1 by default) and these setups are measured, in interleaved trials
(the median of each metric is reported):

- ``pool, fast path``: :class:`~openenv_gym.OpenEnvVectorEnv` over 2 local
  openenv_gym servers (msgpack frames, one frame per server per step);
- ``pool, send/recv``: the same with ``send``/``recv`` (only with ``batch_size``);
- ``pool, stock server (JSON)``: the pool against openenv's own server;
- ``stock client, stock server``: ``num_envs`` ``openenv.core.GenericEnvClient``
  stepped with ``asyncio.gather``;
- ``gymnasium SyncVectorEnv`` / ``AsyncVectorEnv``: in-process baselines.

The two stock setups need the ``openenv`` package; without it they are left
out (and said so in ``notes``). With URLs, the user's servers are measured
with the pool (``step()``, and ``send``/``recv`` with ``batch_size``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from ..launch import launch_local
from ..vector import OpenEnvVectorEnv
from .measure import Stats, measure, median_stats
from .runners import (
    Runner,
    SendRecvRunner,
    StockClientRunner,
    VectorRunner,
    env_actions,
    include_stock_setups,
)

__all__ = ["CompareResult", "Progress", "Setup", "SetupResult", "probe_codec", "run_compare"]

logger = logging.getLogger(__name__)

#: The env of the ``ceiling`` fleet: CartPole's spaces, no env work.
NULL_ENV = "openenv_gym/Null-v0"

#: ``progress(done, total, label)``: called as work units finish.
Progress = Callable[[int, int, str], None]


def _no_progress(done: int, total: int, label: str) -> None:
    pass


def _worker_context() -> str | None:
    """AsyncVectorEnv's start method: ``forkserver`` where there is one (Python 3.14's default on Linux).

    This process runs threads (the pools' I/O loops), and a ``fork`` copies
    them mid-flight (Python 3.12 and later warn of it). ``None``: the platform's default.
    """
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else None


@dataclass(frozen=True, slots=True)
class Setup:
    """A named way of stepping ``num_envs`` envs; ``build()`` returns a fresh :class:`Runner`."""

    name: str
    build: Callable[[], Runner]


@dataclass(slots=True)
class SetupResult:
    """The result of one setup.

    Attributes:
        name: the setup.
        stats: the median over trials (``None`` if no trial succeeded).
        trials: every trial's stats, in order.
        error: why the setup failed (``"Type: message"``), else ``None``.
    """

    name: str
    stats: Stats | None = None
    trials: list[Stats] = field(default_factory=list)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **(self.stats.as_dict() if self.stats is not None else {}),
            "trials": [t.as_dict() for t in self.trials],
            "error": self.error,
        }


@dataclass(slots=True)
class CompareResult:
    """The comparison's settings and results.

    Attributes:
        env_id: the env (embedded fleet), or ``None`` for the user's servers.
        urls: the user's servers (empty for the embedded fleet).
        num_envs, batch_size, seconds, trials: the settings.
        setups: one result per setup, in the order measured.
        notes: what was left out and why.
    """

    env_id: str | None
    urls: list[str]
    num_envs: int
    batch_size: int | None
    seconds: float
    trials: int
    setups: list[SetupResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pin_cpus: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "urls": self.urls,
            "num_envs": self.num_envs,
            "batch_size": self.batch_size,
            "seconds": self.seconds,
            "trials": self.trials,
            "pin_cpus": self.pin_cpus,
            "setups": [s.as_dict() for s in self.setups],
            "notes": self.notes,
        }


def probe_codec(url: str, timeout: float = 10.0, headers: Mapping[str, str] | None = None) -> str:
    """What the server at ``url`` speaks to the pool: ``"msgpack"`` (fast path) or ``"json"``.

    Opens one WebSocket offering the fast path and closes it at once.
    """
    from ..client.open_socket import open_socket
    from ..config import Limits, Timeouts

    async def probe() -> str:
        transport = await open_socket(url, headers=headers, timeouts=Timeouts(connect=timeout), limits=Limits())
        await transport.ws.close()
        return transport.codec

    return asyncio.run(probe())


def _pool_setups(
    name: str, urls: Sequence[str], num_envs: int, batch_size: int | None, timeout: float, headers: Mapping[str, str] | None = None
) -> list[Setup]:
    options: dict[str, Any] = dict(step_timeout=timeout, headers=headers)
    setups = [Setup(name, lambda: VectorRunner(OpenEnvVectorEnv(list(urls), num_envs, **options)))]
    if batch_size is not None and batch_size < num_envs:
        setups.append(
            Setup(
                f"{name}, send/recv batch {batch_size}",
                lambda: SendRecvRunner(OpenEnvVectorEnv(list(urls), num_envs, batch_size=batch_size, **options)),
            )
        )
    return setups


def run_setups(
    setups: Sequence[Setup], seconds: float, trials: int, progress: Progress, *, done: int = 0, total: int | None = None
) -> list[SetupResult]:
    """Measure each setup ``trials`` times, interleaved (trial 1 of every setup, then trial 2, ...).

    A setup that raises is recorded with its error and not tried again.
    """
    total = done + trials * len(setups) if total is None else total
    results = {s.name: SetupResult(s.name) for s in setups}
    for trial in range(trials):
        for setup in setups:
            result = results[setup.name]
            label = f"{setup.name} (trial {trial + 1}/{trials})"
            if result.error is None:
                progress(done, total, label)
                try:
                    runner = setup.build()
                    try:
                        result.trials.append(measure(runner, runner.env_steps_per_call, seconds))
                    finally:
                        runner.close()
                except Exception as exc:
                    result.error = f"{type(exc).__name__}: {exc}"
                    logger.warning("%s failed: %s", setup.name, result.error)
            done += 1
            progress(done, total, label)
    for result in results.values():
        if result.trials:
            result.stats = median_stats(result.trials)
    return list(results.values())


def run_compare(
    *,
    urls: Sequence[str] = (),
    env_id: str = "CartPole-v1",
    num_envs: int = 64,
    seconds: float = 3.0,
    trials: int = 3,
    batch_size: int | None = None,
    servers: int = 2,
    include_stock: bool | None = None,
    include_gymnasium: bool = True,
    step_timeout: float = 60.0,
    pin_cpus: bool = False,
    unix: bool = False,
    ceiling: bool = False,
    busy_poll: int = 0,
    stock_servers: int = 1,
    progress: Progress = _no_progress,
    headers: Mapping[str, str] | None = None,
) -> CompareResult:
    """Measure the setups (see the module docstring); the embedded fleet when ``urls`` is empty.

    Args:
        urls: the user's servers; empty: start local ones for ``env_id``.
        headers: handshake and HTTP headers for ``urls`` (a bearer token).
        env_id: the Gymnasium env of the embedded fleet.
        num_envs: sessions (envs) per setup.
        seconds: timed seconds per trial and setup.
        trials: interleaved trials; the median is reported.
        batch_size: also measure the pool's ``send``/``recv`` with this batch.
        servers: openenv_gym servers of the embedded fleet.
        include_stock: measure the stock OpenEnv server and client (default:
            when the ``openenv`` package is installed).
        include_gymnasium: measure Sync/AsyncVectorEnv (embedded fleet only).
        step_timeout: the pool's and stock client's step timeout, in seconds.
        pin_cpus: pin each local server (ours and the stock one) to one CPU
            (``launch_local(pin_cpus=True)``); the clients are not pinned.
        unix: also measure the pool (lockstep) on a second local fleet that
            listens on Unix sockets (``launch_local(unix=True)``), next to the
            TCP one.
        ceiling: also measure the pool (lockstep) on a fleet serving
            ``openenv_gym/Null-v0`` (CartPole's spaces, no dynamics): the cost
            of the pool, servers and wire alone, which bounds what any env reaches.
        busy_poll: microseconds; if not 0, also measure the pool (lockstep) on
            a fleet whose servers busy-poll that long (``serve --busy-poll``).
        stock_servers: stock OpenEnv server processes for the stock setups
            (default 1, the issue's comparison; the pool gets ``servers``).
        progress: ``progress(done, total, label)``.
    """
    if num_envs < 1 or trials < 1 or seconds <= 0:
        raise ValueError("num_envs and trials must be >= 1 and seconds > 0")
    if batch_size is not None and not 1 <= batch_size <= num_envs:
        raise ValueError(f"batch_size must be in [1, num_envs={num_envs}], got {batch_size}")
    result = CompareResult(None if urls else env_id, list(urls), num_envs, batch_size, seconds, trials, pin_cpus=pin_cpus and not urls)
    if urls:
        path = "fast path" if probe_codec(urls[0], headers=headers) == "msgpack" else "JSON"
        setups = _pool_setups(f"pool, {path} ({_servers(len(urls))})", urls, num_envs, batch_size, step_timeout, headers)
        result.setups = run_setups(setups, seconds, trials, progress)
        return result
    include_stock = include_stock_setups(include_stock, result.notes)
    pools = len(_pool_setups("", ["u"], num_envs, batch_size, 1)) + unix + ceiling + bool(busy_poll)
    total = 1 + trials * (pools + 2 * include_stock + 2 * include_gymnasium)
    progress(0, total, "starting local servers")
    with contextlib.ExitStack() as stack:
        setups = _fleet_setups(stack, env_id, servers, num_envs, batch_size, step_timeout, pin_cpus, unix, busy_poll, ceiling)
        if include_stock:
            setups += _stock_setups(stack, env_id, stock_servers, num_envs, step_timeout, pin_cpus)
        if include_gymnasium:
            setups += _gymnasium_setups(env_id, num_envs)
        progress(1, total, "local servers up")
        result.setups = run_setups(setups, seconds, trials, progress, done=1, total=total)
    return result


def _servers(n: int) -> str:
    return f"{n} server{'s' * (n > 1)}"


def _fleet_setups(
    stack: contextlib.ExitStack,
    env_id: str,
    servers: int,
    num_envs: int,
    batch_size: int | None,
    step_timeout: float,
    pin_cpus: bool,
    unix: bool,
    busy_poll: int,
    ceiling: bool,
) -> list[Setup]:
    """The pool on local fleets of ``servers`` openenv_gym servers, started in ``stack``.

    The TCP fleet of ``env_id``; then, lockstep only, the fleets that ``unix``,
    ``busy_poll`` and ``ceiling`` add.
    """
    launch = functools.partial(launch_local, servers=servers, max_sessions=num_envs, pin_cpus=pin_cpus)
    name = f"pool, fast path ({_servers(servers)}"
    setups = _pool_setups(f"{name})", stack.enter_context(launch(env_id)), num_envs, batch_size, step_timeout)
    more: list[tuple[str, contextlib.AbstractContextManager[list[str]]]] = []
    if unix:
        more.append((f"{name}, Unix sockets)", launch(env_id, unix=True)))
    if busy_poll:
        more.append((f"{name}, busy-polling {busy_poll} us)", launch(env_id, extra_args=["--busy-poll", str(busy_poll)])))
    if ceiling:
        more.append((f"{name}), {NULL_ENV}: no env work", launch(NULL_ENV)))
    for fleet_name, fleet in more:
        setups += _pool_setups(fleet_name, stack.enter_context(fleet), num_envs, None, step_timeout)
    return setups


def _stock_setups(
    stack: contextlib.ExitStack, env_id: str, stock_servers: int, num_envs: int, step_timeout: float, pin_cpus: bool
) -> list[Setup]:
    """The pool and the stock client against ``stock_servers`` stock OpenEnv servers of ``env_id``, started in ``stack``."""
    # Two setups in turn: room for both, as a closed session may linger a moment.
    stock_urls = stack.enter_context(launch_local(env_id, stock=True, servers=stock_servers, max_sessions=2 * num_envs, pin_cpus=pin_cpus))
    stock_name = "stock server" if stock_servers == 1 else f"{stock_servers} stock servers"
    actions = env_actions(env_id, num_envs)
    return [
        Setup(
            f"pool, {stock_name} (JSON)",
            lambda: VectorRunner(OpenEnvVectorEnv(list(stock_urls), num_envs, step_timeout=step_timeout)),
        ),
        Setup(
            f"stock client, {stock_name}",
            lambda: StockClientRunner(stock_urls, num_envs, actions, timeout=step_timeout),
        ),
    ]


def _gymnasium_setups(env_id: str, num_envs: int) -> list[Setup]:
    """Gymnasium's SyncVectorEnv and AsyncVectorEnv of ``env_id``, in process."""
    make = lambda: gym.make(env_id)
    return [
        Setup("gymnasium SyncVectorEnv", lambda: VectorRunner(gym.vector.SyncVectorEnv([make] * num_envs))),
        Setup(
            "gymnasium AsyncVectorEnv",
            lambda: VectorRunner(gym.vector.AsyncVectorEnv([make] * num_envs, context=_worker_context())),
        ),
    ]
