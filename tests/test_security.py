"""Bearer tokens and TLS: who may use a server, and over what.

Real server processes on loopback ports; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest

from openenv_gym import CapacityError, ConnectError, LaunchError, OpenEnvEnv, OpenEnvVectorEnv, Session, launch_local
from openenv_gym.launch import ServerProcess
from openenv_gym.server import ServerConfig
from tests.certs import NoCertificateTool, self_signed_certificate
from tests.servers.launch import free_port
from tests.vector_conformance import step_side_by_side

TIMEOUT = 20.0
TOKEN = "test-" + secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


def get(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url, timeout=TIMEOUT, trust_env=False, **kwargs)


async def _codec_after_reset_and_step(url: str, **kwargs: Any) -> str:
    async with await Session.connect(url, **kwargs) as session:
        await session.reset(seed=0)
        await session.step({"action": 1})
        return session.codec


def _command_lines() -> list[bytes]:
    lines = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(path.read_bytes())
        except OSError:  # the process is gone
            continue
    return lines


@pytest.fixture(scope="module")
def token_url():
    with launch_local("CartPole-v1", max_sessions=8, token=TOKEN, startup_timeout=TIMEOUT) as urls:
        yield urls[0]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    try:
        return self_signed_certificate(tmp_path_factory.mktemp("tls"))
    except NoCertificateTool as exc:
        pytest.skip(f"cannot make a TLS certificate: {exc}")


@pytest.fixture(scope="module")
def tls_url(certificate):
    cert, key = certificate
    tls_args = ["--certfile", str(cert), "--keyfile", str(key)]
    with launch_local("CartPole-v1", max_sessions=8, extra_args=tls_args, startup_timeout=TIMEOUT) as urls:
        yield urls[0]


@pytest.fixture
def trusting(certificate) -> ssl.SSLContext:
    """A client context that trusts the self-signed certificate."""
    return ssl.create_default_context(cafile=str(certificate[0]))


# ---------------------------------------------------------------- the token


def test_handshake_without_the_token_is_refused_with_401(token_url):
    with pytest.raises(ConnectError, match="HTTP 401 \\(the server wants a bearer token: headers="):
        run(_codec_after_reset_and_step(token_url))


@pytest.mark.parametrize(
    "authorization",
    ["Bearer wrong-token-0123456789", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN, "Bearer"],
    ids=["wrong", "longer", "shorter", "basic-scheme", "no-scheme", "no-token"],
)
def test_handshake_with_a_wrong_authorization_is_refused_with_401(token_url, authorization):
    with pytest.raises(ConnectError, match="HTTP 401"):
        run(_codec_after_reset_and_step(token_url, headers={"Authorization": authorization}))


@pytest.mark.parametrize("offer_msgpack, codec", [(True, "msgpack"), (False, "json")])
def test_env_with_the_token_resets_and_steps(token_url, offer_msgpack, codec):
    env = OpenEnvEnv(token_url, headers=AUTH, offer_msgpack=offer_msgpack, connect_timeout=TIMEOUT)
    try:
        assert env.codec == codec
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4,)
        _, reward, _, _, _ = env.step(1)
        assert reward == 1.0
    finally:
        env.close()


def test_the_token_shows_in_no_client_log_even_at_debug(token_url, caplog):
    import logging

    # Every logger at DEBUG, also those a server run in this process set to WARNING (websockets, httpx).
    for name in (None, "websockets", "httpx", "httpcore", "openenv_gym"):
        caplog.set_level(logging.DEBUG, logger=name)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with OpenEnvEnv(token_url, headers=headers) as env:
        env.reset(seed=0)
    with OpenEnvVectorEnv(token_url, 2, headers=headers) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
    assert caplog.records and TOKEN not in caplog.text


def test_the_bearer_scheme_name_is_case_insensitive(token_url):
    assert run(_codec_after_reset_and_step(token_url, headers={"Authorization": f"bearer {TOKEN}"})) == "msgpack"


@pytest.mark.parametrize("path", ["/schema", "/metadata", "/ws", "/no-such-path"])
def test_gets_without_the_token_get_401_with_a_bearer_challenge(token_url, path):
    response = get(token_url + path)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json() == {"detail": "missing or wrong bearer token"}


def test_schema_with_the_token_is_served(token_url):
    response = get(token_url + "/schema", headers=AUTH)
    assert response.status_code == 200
    assert "observation" in response.json()


def test_env_without_the_token_fails_on_the_schema_with_401(token_url):
    with pytest.raises(ConnectError, match="HTTP 401 \\(the server wants a bearer token: headers="):
        OpenEnvEnv(token_url, connect_timeout=TIMEOUT)


def test_health_needs_no_token_and_tells_only_status_and_capacity(token_url):
    response = get(token_url + "/health")
    assert response.status_code == 200
    assert response.json() == {"status": "healthy", "active_sessions": 0, "max_sessions": 8}


def test_stock_openenv_client_with_the_token_resets_and_steps(token_url):
    from openenv.core.generic_client import GenericEnvClient

    async def reset_and_step():
        client = GenericEnvClient(base_url=token_url, headers=AUTH, connect_timeout_s=TIMEOUT, message_timeout_s=TIMEOUT)
        async with client as c:
            first = await c.reset(seed=3)
            second = await c.step({"action": 1})
        return first, second

    first, second = run(reset_and_step())
    assert len(first.observation["observation"]) == 4
    assert second.reward == 1.0


def test_stock_openenv_client_without_the_token_is_refused(token_url):
    from openenv.core.generic_client import GenericEnvClient

    async def connect():
        async with GenericEnvClient(base_url=token_url, connect_timeout_s=TIMEOUT):
            pass  # pragma: no cover - never reached

    with pytest.raises(ConnectionError, match="401"):
        run(connect())


def test_the_token_shows_in_no_command_line(token_url):
    assert not any(TOKEN.encode() in line for line in _command_lines())


def test_the_token_flag_wins_over_the_environment():
    flag_token = "flag-" + secrets.token_urlsafe(24)
    with launch_local("CartPole-v1", max_sessions=2, token=TOKEN, extra_args=["--token", flag_token]) as urls:
        with pytest.raises(ConnectError, match="HTTP 401"):
            run(_codec_after_reset_and_step(urls[0], headers=AUTH))
        flag_auth = {"Authorization": f"Bearer {flag_token}"}
        assert run(_codec_after_reset_and_step(urls[0], headers=flag_auth)) == "msgpack"


def test_server_config_hides_the_token_from_its_repr():
    assert TOKEN not in repr(ServerConfig(token=TOKEN))


@pytest.mark.parametrize("token", ["", "has space-0123456789", "naïve-0123456789abcdef"])
def test_server_config_refuses_a_token_no_header_can_carry(token):
    with pytest.raises(ValueError) as refused:
        ServerConfig(token=token)
    assert token == "" or token not in str(refused.value)


def test_servers_bind_loopback_unless_told_otherwise():
    assert ServerConfig().host == "127.0.0.1"


# ---------------------------------------------------------------- TLS


def test_launch_local_reports_https_urls_for_tls_servers(tls_url):
    assert tls_url.startswith("https://127.0.0.1:")


@pytest.mark.parametrize("scheme", ["https", "wss"])
def test_env_over_tls_negotiates_msgpack_resets_and_steps(tls_url, trusting, scheme):
    base_url = tls_url.replace("https://", f"{scheme}://")
    env = OpenEnvEnv(base_url, ssl=trusting, connect_timeout=TIMEOUT)
    try:
        assert env.codec == "msgpack"
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4,)
        assert env.step(0)[1] == 1.0
    finally:
        env.close()


def test_launch_local_fails_fast_when_its_startup_wait_cannot_trust_the_certificate(certificate):
    cert, key = certificate
    tls_args = ["--certfile", str(cert), "--keyfile", str(key)]
    start = time.monotonic()
    with pytest.raises(LaunchError, match="does not trust"):
        with launch_local("CartPole-v1", extra_args=tls_args, ssl_verify=ssl.create_default_context()):
            pass  # pragma: no cover - never reached
    assert time.monotonic() - start < TIMEOUT


def test_a_client_that_does_not_trust_the_certificate_is_refused(tls_url):
    with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        OpenEnvEnv(tls_url, connect_timeout=TIMEOUT)
    with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        run(_codec_after_reset_and_step(tls_url.replace("https://", "wss://")))


def test_plain_http_to_a_tls_server_fails(tls_url):
    with pytest.raises(ConnectError):
        run(_codec_after_reset_and_step(tls_url.replace("https://", "http://")))


# ---------------------------------------------------------------- both, with workers


def test_workers_serve_tls_and_require_the_token(certificate, trusting):
    cert, key = certificate
    port = free_port()
    command = [sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1", "--port", str(port)]
    command += ["--workers", "2", "--max-sessions", "1", "--certfile", str(cert), "--keyfile", str(key)]
    command += ["--log-level", "DEBUG"]
    server = ServerProcess(command, "127.0.0.1", port, scheme="https", token=TOKEN)
    try:
        deadline = time.monotonic() + TIMEOUT
        with httpx.Client(timeout=2.0, trust_env=False, verify=trusting) as client:
            server.wait_healthy(client, deadline)

        async def hold_one_session_per_worker():
            held: list[Session] = []
            try:
                while len(held) < 2:
                    assert time.monotonic() < deadline, "could not open a session on each worker in time"
                    try:
                        held.append(await Session.connect(server.url, headers=AUTH, ssl=trusting))
                    except CapacityError:  # the kernel picked the worker that is full
                        pass
                for session in held:
                    await session.reset(seed=0)
                for _ in range(8):  # refused before any capacity check, by whichever worker
                    with pytest.raises(ConnectError, match="HTTP 401"):
                        await Session.connect(server.url, ssl=trusting)
            finally:
                for session in held:
                    await session.close()

        run(hold_one_session_per_worker())
        assert not any(TOKEN.encode() in line for line in _command_lines())
    finally:
        server.terminate()
        try:
            code = server.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        log = server.log_tail(100_000)
        server.stop()
    assert code == 0, log
    assert "bearer token required" in log
    assert TOKEN not in log


def test_a_pool_over_tls_steps_through_the_loop_never_reading_its_sockets_itself(tls_url, trusting):
    # (a direct wait would read encrypted bytes: a TLS connection has no readable fd)
    with OpenEnvVectorEnv([tls_url], 2, ssl=trusting, connect_timeout=TIMEOUT) as envs:
        envs.reset(seed=0)
        assert all(link.connection.direct_reader() is None for link in envs._core.links)
        before = envs._io.direct_waits
        sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
        sync.reset(seed=0)
        step_side_by_side(envs, sync, 20)
        sync.close()
        assert envs._io.direct_waits == before
