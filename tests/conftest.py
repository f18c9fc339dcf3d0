"""Shared pytest fixtures: real stock OpenEnv servers on loopback ports.

Each ``stock_*_url`` fixture is session-scoped and lazy: the server process is
started the first time a test requests it and stopped at session end (also
when tests fail or the run is interrupted).
"""

from __future__ import annotations

import atexit
import socket
from typing import Dict, Iterator

import pytest
from hypothesis import settings

from tests.servers.launch import ServerProcess

# No per-example time limit in property tests (Hypothesis's default is 200 ms): the suite runs on
# shared 2-core machines, where a limit measures the load, not the code.
settings.register_profile("openenv_gym", deadline=None)
settings.load_profile("openenv_gym")

# name -> (env, max_sessions, extra environment variables)
STOCK_SERVERS: Dict[str, tuple] = {
    "cartpole": ("cartpole", 64, {}),
    "mixed": ("mixed", 64, {}),
    "cartpole_single": ("cartpole", 1, {}),
    "slow": ("slow", 8, {"SLOW_STEP_SECONDS": "30"}),
    "guess": ("guess", 4, {}),
    "echo": ("echo", 8, {}),
    "arena": ("arena", 8, {}),
    "tools": ("tools", 8, {}),
    "moves": ("moves", 8, {}),
    "page": ("page", 8, {}),
    "mcp": ("mcp", 8, {}),
    "gear": ("gear", 8, {}),
    "form": ("form", 4, {}),
    "dial": ("dial", 4, {}),
    "grid": ("grid", 8, {}),
    "tokens": ("tokens", 8, {}),
    "control": ("control", 8, {}),
    "turn": ("turn", 8, {}),
}

_started: list[ServerProcess] = []


def _stop_all() -> None:
    while _started:
        _started.pop().stop()


# Belt and braces: fixture finalizers normally stop servers; this covers an
# interpreter exit that skips them.
atexit.register(_stop_all)


def _serve(key: str) -> Iterator[str]:
    env, max_sessions, extra_env = STOCK_SERVERS[key]
    server = ServerProcess(env, max_sessions=max_sessions, extra_env=extra_env)
    _started.append(server)
    try:
        server.start_healthy(timeout=60)
        yield server.url
    finally:
        server.stop()
        if server in _started:
            _started.remove(server)


@pytest.fixture(scope="session")
def stock_cartpole_url() -> Iterator[str]:
    """CartPole-v1 stock server, up to 64 concurrent sessions."""
    yield from _serve("cartpole")


@pytest.fixture(scope="session")
def stock_mixed_url() -> Iterator[str]:
    """Mixed-type (enum action, int/float/str/list observation) server, 64 sessions."""
    yield from _serve("mixed")


@pytest.fixture(scope="session")
def stock_cartpole_single_url() -> Iterator[str]:
    """Separate CartPole server admitting a single session (capacity tests)."""
    yield from _serve("cartpole_single")


@pytest.fixture(scope="session")
def stock_slow_url() -> Iterator[str]:
    """CartPole server whose step sleeps 30 s before replying (timeout tests), 8 sessions."""
    yield from _serve("slow")


@pytest.fixture(scope="session")
def fast_cartpole_urls() -> Iterator[list[str]]:
    """Two openenv_gym servers hosting CartPole-v1 (fast path and stock JSON)."""
    from openenv_gym import launch_local

    with launch_local("CartPole-v1", servers=2, max_sessions=64) as urls:
        yield urls


@pytest.fixture(scope="session")
def fast_info_cartpole_urls() -> Iterator[list[str]]:
    """Two openenv_gym servers hosting InfoCartPole-v1 (CartPole with varied infos)."""
    from openenv_gym import launch_local

    with launch_local("tests.servers.gym_envs:InfoCartPole-v1", servers=2, max_sessions=64) as urls:
        yield urls


@pytest.fixture(scope="session")
def stock_guess_url() -> Iterator[str]:
    """A digit-guessing env whose reset observation model lacks fields of the step one, 4 sessions."""
    yield from _serve("guess")


@pytest.fixture(scope="session")
def stock_dial_url() -> Iterator[str]:
    """An env with a bounded float action (``temperature``, 0.1 to 0.3) that it says back, 4 sessions."""
    yield from _serve("dial")


@pytest.fixture(scope="session")
def stock_echo_url() -> Iterator[str]:
    """An env with a text action (``message: str``) that it echoes back, 8 sessions."""
    yield from _serve("echo")


@pytest.fixture(scope="session")
def stock_arena_url() -> Iterator[str]:
    """A chat-style env (TextArena's models: a list of messages, a free-form ``info``), 8 sessions."""
    yield from _serve("arena")


@pytest.fixture(scope="session")
def stock_tools_url() -> Iterator[str]:
    """Tool calls shaped as OpenEnv's MCP CallToolAction (``tool_name``, free-form ``arguments``), 8 sessions."""
    yield from _serve("tools")


@pytest.fixture(scope="session")
def stock_moves_url() -> Iterator[str]:
    """A list of legal moves that shrinks each step (its length varies), 8 sessions."""
    yield from _serve("moves")


@pytest.fixture(scope="session")
def stock_page_url() -> Iterator[str]:
    """An image field that is null in the reset observation (a screenshot not taken yet), 8 sessions."""
    yield from _serve("page")


@pytest.fixture(scope="session")
def stock_form_url() -> Iterator[str]:
    """List bounds, a union, an aliased field and an Optional[bool] ``truncated`` (``FormEnvironment``), 4 sessions."""
    yield from _serve("form")


@pytest.fixture(scope="session")
def stock_mcp_url() -> Iterator[str]:
    """An OpenEnv MCPEnvironment with one tool, ``add``, called through steps (MCP's ``list_tools``/``call_tool``), 8 sessions."""
    yield from _serve("mcp")


@pytest.fixture(scope="session")
def stock_gear_url() -> Iterator[str]:
    """An enum action and observation (``Literal[2, 1, 0]``) whose values are not their indices, 8 sessions."""
    yield from _serve("gear")


@pytest.fixture(scope="session")
def stock_grid_url() -> Iterator[str]:
    """``move: int`` (no range) beside a ``legal_actions`` list that varies and ends empty (maze's shape), 8 sessions."""
    yield from _serve("grid")


@pytest.fixture(scope="session")
def stock_tokens_url() -> Iterator[str]:
    """``tokens: list[int]`` (no range) in, a token list that is empty at reset out (chat's shape), 8 sessions."""
    yield from _serve("tokens")


@pytest.fixture(scope="session")
def stock_control_url() -> Iterator[str]:
    """``observations: Dict[str, List[float]]`` beside a null ``pixels``; a one-value ``values`` action (dm_control's shape), 8 sessions."""
    yield from _serve("control")


@pytest.fixture(scope="session")
def stock_turn_url() -> Iterator[str]:
    """``action: int`` (no range) and nothing that bounds it (snake's shape), 8 sessions."""
    yield from _serve("turn")


class SocketInUnitTest(AssertionError):
    """A test of the fast tier (``unit`` marker) connected or bound a socket."""


@pytest.fixture(autouse=True)
def _unit_tests_open_no_sockets(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``unit`` test may not connect or bind a socket (event loops' socket pairs do neither)."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise SocketInUnitTest(f"{request.node.nodeid} is marked unit and opened a socket: drop the marker or the socket")

    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, refuse)
