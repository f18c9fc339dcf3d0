"""A fast-path connection's wind-up yields to the event loop while it waits for the connection's requests.

When a connection is gone, the server waits for its running requests, then
closes its sessions. A request task leaves the connection's set only when its
done callback runs, on a later turn of the loop; and since Python 3.12 a
``gather`` of tasks that have all ended completes at once, without yielding.
Awaiting such a gather in a loop until the set was empty spun forever,
freezing the whole server (its other connections, ``/health``, SIGTERM): the
chaos test found it on Python 3.13 with env calls in threads. On 3.11 the old
loop yielded, so there this test passes either way.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from openenv_gym.server.wire.fast_loop import _FastConnection

pytestmark = pytest.mark.unit  # (the fast tier: no sockets, no server processes)


def test_wind_up_with_an_ended_task_whose_callback_is_queued_returns() -> None:
    outcome: dict[str, object] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        released: list[int] = []
        conn = _FastConnection.__new__(_FastConnection)
        conn.sessions = {}
        conn.ctx = SimpleNamespace(table=SimpleNamespace(release=released.append))
        conn.finished = loop.create_future()
        ended = loop.create_future()
        ended.set_result(None)
        conn._tasks = {ended}
        loop.call_soon(conn._tasks.discard, ended)  # (as the task's done callback would, a turn later)
        await conn._wind_up()
        outcome["released"] = released
        outcome["finished"] = conn.finished.done()

    # In a thread of its own: the bug spun without yielding, and no timeout inside the loop could end it.
    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the wind-up spun: it never yielded to the loop"
    assert outcome == {"released": [0], "finished": True}
