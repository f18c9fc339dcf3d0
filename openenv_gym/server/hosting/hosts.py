"""What a server hosts: the interface between the connection loops and the envs.

A :class:`HostFactory` describes one kind of environment (its ``/schema`` and
``/metadata``) and makes one :class:`Host` per session. The connection loops
only ever call these methods; they know nothing about Gymnasium or OpenEnv.

Implementations: :class:`~openenv_gym.server.hosting.gym_host.GymHostFactory` (any
Gymnasium env) and :class:`~openenv_gym.server.hosting.openenv_host.OpenEnvHostFactory`
(any OpenEnv ``Environment`` subclass).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Sequence

import numpy as np

from ...config import Limits
from .runner import Execution
from .values import ActionError

__all__ = ["StepOutput", "BatchOutput", "LaneOutput", "Host", "HostFactory", "ActionError"]


@dataclass(slots=True)
class StepOutput:
    """The result of one reset or step of one session.

    Attributes:
        fields: the observation's fields, as the env produced them (numpy arrays
            and scalars allowed; the connection loop adapts them to its codec).
        reward: the reward, ``None`` when there is none (after reset).
        done: whether the episode ended (Gymnasium: ``terminated or truncated``).
        metadata: extra information (Gymnasium: ``info``).
        after: for a step that ended its episode under ``autoreset``, the reset
            that followed (its output, or the exception it raised); else ``None``.
    """

    fields: dict[str, Any]
    reward: float | None
    done: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    after: "StepOutput | BaseException | None" = None


@dataclass(slots=True)
class BatchOutput:
    """The results of ``n`` resets and steps of different sessions, as columns.

    Attributes:
        fields: the observation's fields, one column (``n`` entries) each,
            ready for the codec (arrays of a wire dtype, or lists of plain values).
        reward: float64 ``(n,)``, NaN where there is none (resets, failures).
        done: bool ``(n,)``.
        metadata: ``n`` plain dicts (empty where the env said nothing), or
            ``None`` when every one would be empty.
        failures: call index -> the exception that call raised (its entries are filler).
        after_rows: for ``step_then_reset`` calls whose step ended the episode,
            the call indices of the resets that followed; else ``None``.
        after: those resets' outputs (one entry per row of ``after_rows``).

    The columns have one entry per call made: fewer than asked when the batch stopped early.
    """

    fields: dict[str, Any]
    reward: np.ndarray
    done: np.ndarray
    metadata: list[dict[str, Any]] | None
    failures: dict[int, BaseException]
    after_rows: list[int] | None = None
    after: "BatchOutput | None" = None


@dataclass(slots=True)
class LaneOutput:
    """The results of one raw step of a lane's ``n`` sessions, every call clean (see :meth:`HostFactory.run_lane`).

    Attributes:
        reward: ``n`` floats, NaN for a reset.
        done: ``n`` bytes, 1 where the episode ended (``terminated or truncated``), else 0.
        truncated: ``n`` bytes, 1 or 0.
        terminated: ``n`` bytes, 1 or 0.
        observations: ``n`` arrays, each of the lane's observation dtype and shape.
        after: for a lane that resets, the reset observations of the sessions
            done, in order (each of the layout, with an empty info); else ``None``.
    """

    reward: list[float]
    done: bytearray
    truncated: bytearray
    terminated: bytearray
    observations: list[np.ndarray]
    after: list[np.ndarray] | None = None


class Host:
    """One session's environment.

    Synchronous methods may block; the connection loops run them through a
    :class:`~openenv_gym.server.hosting.runner.Runner`. A host whose reset or step is
    natively asynchronous sets :attr:`async_reset` / :attr:`async_step` and
    implements :meth:`reset_async` / :meth:`step_async`, which are awaited on
    the event loop instead.

    Attributes:
        limits: what clients may send; set by the server that made the host
            (its ``parse_action`` bounds its work by it).
    """

    async_reset: bool = False
    async_step: bool = False
    #: What clients may send (``parse_action`` bounds its work by it); set by the server when it makes the host.
    limits: Limits = Limits()

    def parse_action(self, fields: Mapping[str, Any]) -> Any:
        """Turn the action's wire fields into what :meth:`step` takes. Cheap, runs on the loop.

        Raises:
            ActionError: the action is invalid (``VALIDATION_ERROR``).
        """
        raise NotImplementedError

    def reset(self, seed: int | None, options: dict[str, Any]) -> StepOutput:
        """Start an episode. ``options`` are the other reset keyword arguments sent."""
        raise NotImplementedError

    def step(self, action: Any) -> StepOutput:
        """Take one step with an action returned by :meth:`parse_action`."""
        raise NotImplementedError

    async def reset_async(self, seed: int | None, options: dict[str, Any]) -> StepOutput:
        raise NotImplementedError

    async def step_async(self, action: Any) -> StepOutput:
        raise NotImplementedError

    def step_then_reset(self, action: Any) -> StepOutput:
        """:meth:`step`; if that ends the episode, :meth:`reset` (no seed, no options) into its ``after``.

        A failed reset does not fail the step: its exception goes in ``after``.
        """
        out = self.step(action)
        if out.done:
            try:
                out.after = self.reset(None, {})
            except Exception as exc:
                out.after = exc
        return out

    def state(self) -> dict[str, Any]:
        """The session's state fields (``episode_id``, ``step_count``, ...). Cheap."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the env. Called once."""
        raise NotImplementedError

    async def open_async(self) -> None:
        """Called on the event loop once the host is made, before its first call (default: nothing)."""

    async def close_async(self) -> None:
        """Called on the event loop before :meth:`close` (default: nothing). Must not raise."""

    async def list_tools(self, run: Callable[..., Awaitable[Any]]) -> list[dict[str, Any]]:
        """The env's MCP tools, as JSON (``name``, ``description``, ``inputSchema``, ...).

        ``run(fn, *args)`` runs a blocking call the way the server runs env calls.

        Raises:
            NotImplementedError: the env has no MCP tools.
        """
        raise NotImplementedError("Environment does not support MCP")

    async def call_tool(self, run: Callable[..., Awaitable[Any]], name: str, arguments: dict[str, Any]) -> Any:
        """Call MCP tool ``name`` with ``arguments``; its result, as JSON (see :meth:`list_tools`)."""
        raise NotImplementedError("Environment does not support MCP")


class HostFactory:
    """One kind of environment: makes a :class:`Host` per session.

    Attributes:
        name: the env's name, in logs and ``/metadata``.
        execution: the execution mode this kind of env needs (``"thread"`` for
            envs that must not run on the event loop thread); ``None`` leaves the
            choice to the server's configuration.
        threads: a thread count this kind of env needs (``1`` for envs that must
            always run on the same thread), or ``None``.
        default_execution: the execution mode this kind of env runs in when the
            server's configuration names none (``"session"`` for OpenEnv envs,
            as OpenEnv's own server runs them), or ``None`` (``"auto"``).
    """

    name: str = "env"
    execution: Execution | None = None
    threads: int | None = None
    default_execution: Execution | None = None

    def make(self) -> Host:
        """A new host, for a new session. May block (runs through the runner)."""
        raise NotImplementedError

    def run_batch(self, calls: Sequence[tuple[Host, str, tuple[Any, ...]]], observe: Callable[[float], bool]) -> BatchOutput | None:
        """Run ``calls`` (``(host, "reset" | "step" | "step_then_reset", args)``, different sessions) inline, in order.

        An optional fast path for envs whose calls are cheap: the results come
        back as columns, without a :class:`StepOutput` per call. Each call's
        duration (seconds) goes to ``observe``; when it returns true, the
        batch stops after that call and the output holds the calls made so
        far (the caller runs the rest elsewhere). Returns ``None`` (before
        calling anything) when this factory has no such path.
        """
        return None

    def parse_action_column(self, actions: Mapping[str, Any], n: int) -> list[Any] | None:
        """Read a whole batch of ``n`` actions (wire columns) at once, without :meth:`Host.parse_action` per session.

        An optional fast path: one action (or :class:`ActionError`) per
        session, or ``None`` when it does not apply and actions are read one
        by one.
        """
        return None

    def run_lane(
        self,
        hosts: Sequence[Host],
        actions: Sequence[Any],
        restart: Sequence[bool] | None,
        observation: Any,
        observe: Callable[[float], bool],
        *,
        autoreset: bool = False,
    ) -> "LaneOutput | BatchOutput | None":
        """One raw step of a lane's sessions, inline, in order: the hot path of a lockstep pool.

        ``hosts[i]`` steps with ``actions[i]`` (from :meth:`parse_action_column`,
        all valid) or, where ``restart[i]``, resets (no seed, no options).
        ``observation`` is the lane's observation
        :class:`~openenv_gym.protocol.lane.Layout`. Returns a
        :class:`LaneOutput` when every call went cleanly (no exception, no
        info, each observation of the layout); else the :class:`BatchOutput`
        of the calls made, as :meth:`run_batch` would (stopping early as it
        does when ``observe`` says so). Returns ``None`` (before calling
        anything) when this factory has no such path. ``autoreset``: a
        session whose step is done is reset right after it, as by a
        ``step_then_reset`` call: a :class:`LaneOutput` holds their
        observations in its ``after`` where they are clean too, else the
        output is a :class:`BatchOutput` with the resets in its ``after``.
        """
        return None

    def schema(self) -> dict[str, Any]:
        """The ``/schema`` response body (JSON-able, finite numbers only)."""
        raise NotImplementedError

    def metadata(self) -> dict[str, Any]:
        """The ``/metadata`` response body (openenv's ``EnvironmentMetadata`` fields)."""
        raise NotImplementedError
