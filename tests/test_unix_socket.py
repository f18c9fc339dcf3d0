"""Servers on Unix sockets: ``openenv-gym serve --unix``, ``launch_local(unix=True)``, ``unix:`` URLs."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from openenv_gym import ConnectError, OpenEnvEnv, OpenEnvVectorEnv, launch_local
from openenv_gym._urls import http_url, is_loopback, unix_path, ws_url
from openenv_gym.bench.compare import probe_codec
from openenv_gym.client.open_socket import open_socket
from openenv_gym.config import Limits, Timeouts
from openenv_gym.remote import fetch_health, fetch_schema
from openenv_gym.server.net.unix import UnixListener

TIMEOUT = 20.0
TOKEN = "unix-socket-token-0123456789"


@pytest.fixture(scope="module")
def unix_urls():
    with launch_local("CartPole-v1", servers=2, max_sessions=16, unix=True) as urls:
        yield urls


def _socket_file(url: str) -> str:
    path = unix_path(url)
    assert path is not None
    return path


def test_launch_local_unix_yields_sockets_only_this_user_may_use(unix_urls):
    for url in unix_urls:
        assert url.startswith("unix:/")
        mode = os.stat(_socket_file(url)).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(_socket_file(url))).st_mode) == 0o700
    assert fetch_health(unix_urls[0], timeout=TIMEOUT) == {"status": "healthy", "active_sessions": 0, "max_sessions": 16}
    assert fetch_schema(unix_urls[0], timeout=TIMEOUT)["x-openenv-gym"]["observation_space"]["type"] == "Box"


def test_launch_local_unix_removes_its_sockets_on_exit():
    with launch_local("CartPole-v1", unix=True) as urls:
        path = _socket_file(urls[0])
        assert os.path.exists(path)
    assert not os.path.exists(path)
    assert not os.path.exists(os.path.dirname(path))


@pytest.mark.parametrize("offer_msgpack, codec", [(True, "msgpack"), (False, "json")])
def test_env_over_a_unix_socket_matches_local_cartpole(unix_urls, offer_msgpack, codec):
    local = gym.make("CartPole-v1")
    env = OpenEnvEnv(unix_urls[0], offer_msgpack=offer_msgpack, connect_timeout=TIMEOUT)
    try:
        assert env.codec == codec
        obs, _ = env.reset(seed=3)
        expected, _ = local.reset(seed=3)
        np.testing.assert_array_equal(obs, expected)
        for action in (0, 1, 1, 0):
            got = env.step(action)
            want = local.step(action)
            np.testing.assert_array_equal(got[0], want[0])
            assert got[1:4] == want[1:4]
    finally:
        env.close()
        local.close()


def test_vector_env_over_unix_sockets_matches_sync_vector_env(unix_urls):
    envs = OpenEnvVectorEnv(unix_urls, 8, step_timeout=TIMEOUT)
    local = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 8)
    try:
        obs, _ = envs.reset(seed=0)
        np.testing.assert_array_equal(obs, local.reset(seed=0)[0])
        assert sorted(fetch_health(u, timeout=TIMEOUT)["active_sessions"] for u in unix_urls) == [4, 4]
        actions = np.random.default_rng(0).integers(0, 2, size=(40, 8))
        for step_actions in actions:  # episodes end and restart on the way
            got, want = envs.step(step_actions), local.step(step_actions)
            for g, w in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(g, w)
            assert "openenv_error" not in got[4]
    finally:
        envs.close()
        local.close()


def test_a_unix_socket_server_requires_its_token():
    with launch_local("CartPole-v1", unix=True, token=TOKEN) as (url,):
        with pytest.raises(ConnectError, match="401"):
            OpenEnvEnv(url, connect_timeout=TIMEOUT)
        env = OpenEnvEnv(url, headers={"Authorization": f"Bearer {TOKEN}"}, connect_timeout=TIMEOUT)
        try:
            assert env.reset(seed=0)[0].shape == (4,)
        finally:
            env.close()


def test_nothing_listening_on_a_unix_socket_is_a_connect_error(tmp_path):
    with pytest.raises(ConnectError, match="no-server.sock"):
        OpenEnvEnv(f"unix:{tmp_path / 'no-server.sock'}", connect_timeout=TIMEOUT)


def test_unix_urls_name_localhost_over_the_socket():
    assert unix_path("unix:/run/env.sock") == "/run/env.sock"
    assert unix_path("unix:///run/env.sock") == "/run/env.sock"
    assert unix_path("http://127.0.0.1:8000") is None
    assert ws_url("unix:/run/env.sock") == "ws://localhost/ws"
    assert http_url("unix:/run/env.sock", "/health") == "http://localhost/health"
    assert is_loopback("unix:/run/env.sock")


@pytest.mark.parametrize("url", ["unix:run/env.sock", "unix://host/run/env.sock", "unix:"])
def test_a_unix_url_needs_an_absolute_path_and_no_host(url):
    with pytest.raises(ValueError, match="unix:/absolute/path"):
        unix_path(url)
    with pytest.raises(ConnectError):
        OpenEnvEnv(url, connect_timeout=TIMEOUT)


def test_a_socket_left_by_a_server_that_is_gone_is_replaced(tmp_path):
    path = str(tmp_path / "stale.sock")
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(path)
    left.close()  # the file stays, nothing listens
    listener = UnixListener(path)
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(TIMEOUT)
        client.connect(path)
        client.close()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        listener.sock.close()
        listener.release()
    assert not os.path.exists(path)


def test_a_socket_in_use_or_a_file_that_is_not_a_socket_is_refused(tmp_path):
    path = str(tmp_path / "live.sock")
    live = UnixListener(path)
    try:
        with pytest.raises(OSError, match="in use by another server"):  # the lock says so
            UnixListener(path)
        os.unlink(path + ".lock")  # a server of another kind, or an older one: no lock file, a live socket
        with pytest.raises(OSError, match="in use by a running server"):
            UnixListener(path)
    finally:
        live.sock.close()
        live.release()
    plain = tmp_path / "plain"
    plain.write_text("data")
    with pytest.raises(OSError, match="not a socket"):
        UnixListener(str(plain))
    assert plain.read_text() == "data" and not (tmp_path / "plain.lock").exists()  # (a refusal leaves no lock file)
    with pytest.raises(OSError, match="directory does not exist"):
        UnixListener(str(tmp_path / "nowhere" / "s.sock"))
    with pytest.raises(OSError, match="at most 107 bytes"):
        UnixListener(str(tmp_path / ("x" * 120)))


def test_a_server_removes_only_the_socket_file_it_made(tmp_path):
    path = str(tmp_path / "s.sock")
    first = UnixListener(path)
    first.sock.close()
    os.rename(path, path + ".old")  # replaced behind its back (the old inode lives on, so the new one differs)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(path)
    try:
        first.release()
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        second = UnixListener(str(tmp_path / "t.sock"))  # the lock of one path does not hold another
        second.sock.close()
        second.release()
    finally:
        other.close()


def test_a_stopping_server_lets_its_successor_take_the_path_at_once(tmp_path):
    path = tmp_path / "restart.sock"
    url = f"unix:{path}"
    env_vars = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    serve = [sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1", "--unix", str(path)]
    slow = ["--shutdown-timeout", "60", "--close-timeout", "60"]
    first = subprocess.Popen(serve + slow, env=env_vars, stderr=subprocess.PIPE, text=True)
    second = None
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.settimeout(TIMEOUT)
    try:
        _wait_healthy(url, first)
        # A peer that opens a WebSocket and never answers the closing handshake:
        # the first server keeps draining it, after it stopped listening, until it hangs up.
        peer.connect(str(path))
        peer.sendall(
            b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        assert peer.recv(4096).startswith(b"HTTP/1.1 101")
        first.terminate()
        _wait_gone(path, first)
        second = subprocess.Popen(serve, env=env_vars, stderr=subprocess.PIPE, text=True)
        _wait_healthy(url, second)
        assert first.poll() is None  # still draining
        peer.close()
        first.wait(TIMEOUT)
        assert fetch_health(url, timeout=TIMEOUT)["status"] == "healthy"  # the first did not remove its successor's file
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait(TIMEOUT)


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            fetch_health(url, timeout=2.0)
            return
        except ConnectError:
            time.sleep(0.05)
    raise AssertionError(f"{url} not healthy in {timeout} s")


def _wait_gone(path: Path, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while path.exists():
        assert time.monotonic() < deadline, "the socket file was not removed on SIGTERM"
        time.sleep(0.02)


def test_unix_paths_are_taken_as_written(tmp_path):
    odd = tmp_path / "p%41#x?y"  # no percent-decoding, no fragment, no query
    odd.mkdir()
    path = odd / "s.sock"
    assert unix_path(f"unix:{path}") == str(path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1", "--unix", str(path)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_healthy(f"unix:{path}", proc)
    finally:
        proc.kill()
        proc.wait(TIMEOUT)


def test_tls_does_not_apply_to_a_unix_socket(unix_urls):
    context = ssl.create_default_context()
    with pytest.raises(ConnectError, match="TLS"):
        OpenEnvEnv(unix_urls[0], ssl=context, connect_timeout=TIMEOUT)
    with pytest.raises(ConnectError, match="TLS"):
        asyncio.run(open_socket(unix_urls[0], timeouts=Timeouts(), limits=Limits(), ssl=context))


def test_open_socket_negotiates_over_a_unix_socket(unix_urls):
    assert probe_codec(unix_urls[0], timeout=TIMEOUT) == "msgpack"


def test_errors_name_the_socket(tmp_path):
    missing = f"unix:{tmp_path / 'gone.sock'}"
    with pytest.raises(ConnectError) as failure:
        fetch_health(missing, timeout=TIMEOUT)
    assert failure.value.url == missing and "gone.sock" in str(failure.value)


@pytest.mark.parametrize("option", [["--workers", "2"], ["--certfile", "cert.pem"]], ids=["workers", "tls"])
def test_serve_unix_refuses_workers_and_tls(tmp_path, option):
    result = subprocess.run(
        [sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1", "--unix", str(tmp_path / "s.sock"), *option],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert result.returncode == 2
    assert option[0] in result.stderr


@pytest.mark.parametrize("kwargs", [{"stock": True}, {"extra_args": ["--certfile", "cert.pem"]}])
def test_launch_local_unix_refuses_stock_servers_and_tls(kwargs):
    with pytest.raises(ValueError):
        with launch_local("CartPole-v1", unix=True, **kwargs):
            pass  # pragma: no cover - never reached


def test_bench_unix_is_for_the_local_fleet_only():
    from openenv_gym.cli import main

    assert main(["bench", "--unix", "--url", "http://127.0.0.1:9"]) == 2
