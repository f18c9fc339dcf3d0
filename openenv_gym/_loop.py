"""One background event loop that runs all network I/O for the sync faces.

``OpenEnvEnv`` and ``OpenEnvVectorEnv`` are synchronous; the session client is
asyncio. They meet here: a daemon thread runs one event loop for the whole
process, and sync code submits coroutines to it and waits for the result.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from concurrent.futures import Future
from typing import Any, Awaitable, Coroutine, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """A daemon thread running an asyncio event loop.

    Use :meth:`shared` for the process-wide instance.
    """

    _shared: "LoopThread | None" = None
    _shared_lock = threading.Lock()

    def __init__(self, name: str = "openenv-gym-io") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @classmethod
    def shared(cls) -> "LoopThread":
        """The process-wide loop thread, started on first use."""
        with cls._shared_lock:
            if cls._shared is None or not cls._shared._thread.is_alive():
                cls._shared = cls()
                atexit.register(cls._shared.stop)
            return cls._shared

    def submit(self, coro: Coroutine[Any, Any, T]) -> "Future[T]":
        """Schedule ``coro`` on the loop; returns a concurrent future."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("cannot wait for the I/O loop from inside it")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (``timeout`` in seconds).

        On timeout the coroutine is cancelled and ``TimeoutError`` raised.
        """
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        """Stop the loop and join the thread (bounded)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
