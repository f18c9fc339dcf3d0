"""What the benchmark ran on, and the process limits it needs.

:func:`describe_machine` names the machine in results; :func:`ensure_fd_limit`
raises this process's soft limit on open files (server processes started
afterwards inherit it), since thousands of sessions need thousands of sockets.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FdLimit", "describe_machine", "ensure_fd_limit", "machine_line", "package_version"]

logger = logging.getLogger(__name__)


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None``."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def describe_machine() -> dict[str, Any]:
    """The machine and the versions that matter for the numbers (JSON-able)."""
    memory = _memory_gib()
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": None if memory is None else round(memory, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }
    for name in ("openenv-gym", "gymnasium", "numpy", "websockets", "msgpack", "openenv", "uvicorn"):
        info[name] = package_version(name)
    return info


def machine_line(info: dict[str, Any]) -> str:
    """One line naming the machine, for table headers."""
    memory = f", {info['memory_gib']:.0f} GiB" if info.get("memory_gib") else ""
    return f"{info['cpu']}, {info['cores']} cores{memory}, {info['os']}, Python {info['python']}"


@dataclass(frozen=True, slots=True)
class FdLimit:
    """This process's limit on open files, after :func:`ensure_fd_limit`.

    Attributes:
        soft, hard: the limits (``-1``: unlimited).
        needed: what the caller asked for.
        enough: whether ``soft >= needed``.
    """

    soft: int
    hard: int
    needed: int
    enough: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ensure_fd_limit(needed: int) -> FdLimit:
    """Raise the soft ``RLIMIT_NOFILE`` towards ``needed`` (up to the hard limit).

    Logs a warning when the hard limit is below ``needed``: the sessions
    beyond it will fail to connect, and only root can raise the hard limit
    (``ulimit -Hn``). On platforms without ``resource``, reports ``-1``.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return FdLimit(-1, -1, needed, True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft != unlimited and soft < needed:
        target = needed if hard == unlimited else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            logger.info("raised the open-files soft limit from %d to %d", soft, target)
            soft = target
        except (ValueError, OSError) as exc:  # pragma: no cover - depends on the system
            logger.warning("cannot raise the open-files limit to %d: %s", target, exc)
    as_int = lambda v: -1 if v == unlimited else int(v)
    enough = soft == unlimited or soft >= needed
    if not enough:
        logger.warning(
            "open-files limit %d (hard %s) is below the %d this run needs; sessions beyond it will fail",
            soft,
            "unlimited" if hard == unlimited else hard,
            needed,
        )
    return FdLimit(as_int(soft), as_int(hard), needed, enough)
