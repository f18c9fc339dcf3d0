"""Requests a pool hands to its core with its next wait, in order: deferred steps, and the resets within a step.

A :class:`~openenv_gym.vector.batch.Batch` asks for ``SAME_STEP``'s resets
while it writes arrivals (:meth:`Outbox.reset_later`); the pool sends what
the outbox holds when it next waits for its core.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

__all__ = ["CoreRequest", "Outbox"]


@dataclasses.dataclass(slots=True)
class CoreRequest:
    """A request handed to the core (``core.submit``), now or with the next wait; calling it submits it."""

    submit: Callable[..., None]
    kind: str  # "reset", "step" or "final_reset" (SAME_STEP)
    env_ids: np.ndarray
    arguments: dict[str, Any]  # submit's keyword arguments

    def __call__(self) -> None:
        self.submit(self.kind, self.env_ids, **self.arguments)


class Outbox:
    """The requests waiting for the pool's next wait (the pool's side of :class:`~openenv_gym.vector.batch.Requests`).

    Args:
        submit: the core's ``submit``.
    """

    def __init__(self, submit: Callable[..., None]) -> None:
        self._submit = submit
        self.calls: list[CoreRequest] = []

    def request(self, kind: str, env_ids: np.ndarray, **arguments: Any) -> CoreRequest:
        """A request of the core, to send now or to :meth:`add`; every request asks for its answer in parts."""
        return CoreRequest(self._submit, kind, env_ids, {"partial": True, **arguments})

    def add(self, call: CoreRequest) -> None:
        self.calls.append(call)

    def take(self) -> list[CoreRequest]:
        """Every request waiting, oldest first; the outbox is empty after."""
        calls, self.calls = self.calls, []
        return calls

    def __bool__(self) -> bool:
        return bool(self.calls)

    def reset_later(self, env_ids: np.ndarray) -> None:
        """Reset ``env_ids`` with the next wait (``SAME_STEP``'s reset within the step)."""
        self.add(self.request("final_reset", env_ids, split=False))

    def withdraw_resets(self, env_ids: np.ndarray) -> None:
        """Take ``env_ids`` out of the resets waiting to go out (their server reset them already)."""
        kept = []
        for call in self.calls:
            if call.kind == "final_reset":
                call.env_ids = call.env_ids[~np.isin(call.env_ids, env_ids)]
                if not call.env_ids.size:
                    continue
            kept.append(call)
        self.calls = kept

    def drop_resets(self) -> list[np.ndarray]:
        """Drop every request waiting; the envs of the resets among them (``final_reset``), which will not go out."""
        return [call.env_ids for call in self.take() if call.kind == "final_reset"]
