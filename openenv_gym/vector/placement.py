"""Where a pool's sessions go: each server's free room (from ``/health``), a placement by it, and the pool's core opened on it."""

from __future__ import annotations

import math
import ssl as ssl_module
from typing import Any, Mapping, Sequence

import numpy as np

from ..config import Limits, Timeouts
from ..errors import CapacityError, OpenEnvGymError, ServerError
from ..remote import fetch_health
from .core import PoolCore
from .links import FastLink, Link, connect_link

__all__ = ["first_observation", "first_state", "free_capacity", "no_room", "open_core", "placement"]

#: How often the pool places its sessions at its start when servers refuse some (room taken by other clients meanwhile).
_PLACEMENT_TRIES = 3


def free_capacity(
    urls: Sequence[str], *, headers: Mapping[str, str], timeouts: Timeouts, limits: Limits, ssl: ssl_module.SSLContext | None
) -> tuple[list[float], list[int | None]]:
    """Per server, the sessions it has room for (``inf`` when it does not say), and its limit (``None``: unknown)."""
    free: list[float] = []
    limit: list[int | None] = []
    for url in urls:
        try:
            health = fetch_health(
                url,
                headers=headers,
                timeout=timeouts.connect,
                ssl=ssl,
                max_bytes=limits.max_frame_bytes,
                max_containers=limits.max_json_containers,
            )
        except OpenEnvGymError:
            health = {}
        active, most = health.get("active_sessions"), health.get("max_sessions")
        if isinstance(active, int) and isinstance(most, int):
            free.append(max(most - active, 0))
            limit.append(most)
        else:
            free.append(math.inf)
            limit.append(None)
    return free, limit


def placement(free: Sequence[float], n: int, num_envs: int, urls: Sequence[str]) -> list[int]:
    """How many of ``n`` sessions (of a pool of ``num_envs``) each server gets: by free room where a server tells it, else evenly.

    Raises:
        CapacityError: the servers have no room for them (:func:`no_room`).
    """
    k = len(free)
    counts = [0] * k
    for _ in range(n):  # round-robin over servers with room, most free first
        j = min(range(k), key=lambda j: (-(free[j] - counts[j]), counts[j], j))
        if free[j] - counts[j] <= 0:
            raise no_room(num_envs, num_envs - n + sum(max(min(f, n), 0) for f in free), urls)
        counts[j] += 1
    return counts


def no_room(num_envs: int, room: float, urls: Sequence[str]) -> CapacityError:
    """The error of a pool whose servers have room for ``room`` of its ``num_envs`` sessions, naming both fixes."""
    return CapacityError(
        "CAPACITY_REACHED",
        f"{num_envs} sessions asked for, and the servers have room for {room:.0f}: start more servers "
        "(more URLs, or launch_local(..., servers=N)), or raise their session limit (openenv-gym serve "
        "--max-sessions; a stock OpenEnv app's max_concurrent_envs, which OpenEnv's apps leave at 1 unless "
        "they read MAX_CONCURRENT_ENVS)",
        url=", ".join(urls),
    )


async def open_core(
    urls: Sequence[str],
    num_envs: int,
    free: Sequence[float],
    limit: Sequence[int | None],
    *,
    headers: Mapping[str, str],
    timeouts: Timeouts,
    limits: Limits,
    ssl: ssl_module.SSLContext | None,
    grace: float,
    server_autoreset: bool = False,
) -> PoolCore:
    """Connect to every server, open ``num_envs`` sessions placed by free room, and the core over them.

    ``server_autoreset``: ask fast-path servers to reset the envs whose step
    ends their episode within the step's request (``SAME_STEP``).

    Raises:
        CapacityError: the servers have no room for ``num_envs`` sessions (after
            placing again where room was taken by others meanwhile).
    """
    links: list[Link] = []
    try:
        for url in urls:
            links.append(await connect_link(url, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl))
            if isinstance(links[-1], FastLink) and server_autoreset:
                links[-1].autoreset = True  # (its server resets ended envs within the step's request)
        free = list(free)
        opened: list[list[Any]] = [[] for _ in links]
        for _ in range(_PLACEMENT_TRIES):
            left = num_envs - sum(map(len, opened))
            if left == 0:
                break
            counts = placement([f - len(o) for f, o in zip(free, opened)], left, num_envs, urls)
            for j, count in enumerate(counts):
                if not count:
                    continue
                try:
                    got = await links[j].open(int(count))
                except CapacityError as exc:
                    # Another client took room since /health said it was free (two pools starting
                    # at once, say): learn what is left there, and place the rest again.
                    most, active = exc.max_sessions, exc.active_sessions
                    free[j] = len(opened[j]) + (max(most - active, 0) if most is not None and active is not None else 0)
                    continue
                opened[j].extend(got)
                if len(got) < count:  # (a stock server refuses sessions one by one: it is full now)
                    free[j] = len(opened[j])
        if sum(map(len, opened)) < num_envs:
            raise no_room(num_envs, sum(map(len, opened)), urls)
        link_of = np.repeat(np.arange(len(links)), [len(o) for o in opened])
        handles = [handle for o in opened for handle in o]
        capacity = [None if f == math.inf else int(f) for f in free]
        return PoolCore(links, link_of, handles, step_timeout=timeouts.step, grace=grace, capacity=capacity, limit=list(limit))
    except BaseException:
        for link in links:
            await link.close()
        raise


async def first_observation(core: PoolCore, timeout: float) -> dict[str, Any]:
    """The fields of env 0's reset observation, before the user's first reset (its session is reset again then).

    Raises:
        OpenEnvGymError: the reset failed.
    """
    core.submit("probe", np.array([0]))
    (arrival,) = await core.collect(1, timeout)
    results = arrival.results
    if isinstance(results, OpenEnvGymError):
        raise results
    if results.errors is not None and results.errors[0] is not None:
        raise results.errors[0]
    return {name: column[0] for name, column in results.observation.items()}


async def first_state(core: PoolCore) -> dict[str, Any] | None:
    """Env 0's state after :func:`first_observation`, or ``None`` where its server refuses it."""
    try:
        return await core.state(0)
    except ServerError:
        return None
