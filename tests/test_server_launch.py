"""launch_local and the ``openenv-gym serve`` command line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from openenv_gym import LaunchError, launch_local
from openenv_gym.cli import build_parser
from openenv_gym.client import Session
from openenv_gym.launch import ServerProcess
from tests.clients import run
from tests.servers.launch import free_port

TIMEOUT = 20.0


def _refuses(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=2.0).close()
    except OSError:
        return True
    return False


async def _one_step(url: str) -> str:
    async with await Session.connect(url) as session:
        await session.reset(seed=0)
        await session.step({"action": 1})
        return session.codec


def test_every_option_with_a_default_says_it_in_its_help_and_the_version_is_printed(capsys):
    import argparse

    import openenv_gym

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [
        f"{name} {action.option_strings[-1]}"
        for name, command in commands.choices.items()
        for action in command._actions
        if action.option_strings
        and action.help
        and "default" not in action.help
        and not (action.default is None or action.default is False or action.default == [] or action.default == argparse.SUPPRESS)
    ]
    assert silent == []
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"openenv-gym {openenv_gym.__version__}"


def test_serve_on_a_taken_port_names_the_address_not_the_env():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "openenv_gym.cli", "serve", "CartPole-v1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "address already in use" in done.stderr.lower(), done.stderr


def test_stock_launch_of_an_openenv_environment_class_says_it_takes_gymnasium_ids():
    pytest.importorskip("openenv")
    with pytest.raises(LaunchError) as failure:
        with launch_local("tests.servers.stock_envs:EchoEnvironment", stock=True):
            pass  # pragma: no cover - never reached
    assert "serves Gymnasium env ids only" in failure.value.log_tail  # (was Gymnasium's bare NameNotFound)


def test_launch_local_yields_healthy_servers_and_stops_them():
    with launch_local("CartPole-v1", servers=2, max_sessions=4) as urls:
        assert len(urls) == 2 and len(set(urls)) == 2
        for url in urls:
            assert url.startswith("http://127.0.0.1:")
            assert httpx.get(url + "/health", trust_env=False, timeout=TIMEOUT).json()["status"] == "healthy"
            assert run(_one_step(url)) == "msgpack"
    assert all(_refuses(url) for url in urls)


def test_launch_local_stops_servers_when_the_body_raises():
    with pytest.raises(RuntimeError, match="body failed"):
        with launch_local("tests.servers.gym_envs:Frames-v0", max_sessions=2) as urls:
            raise RuntimeError("body failed")
    assert _refuses(urls[0])


def test_launch_local_reports_a_server_that_cannot_start():
    start = time.monotonic()
    with pytest.raises(LaunchError) as failure:
        with launch_local("NoSuchEnv-v0"):
            pass  # pragma: no cover - never reached
    assert time.monotonic() - start < 30.0
    assert "NoSuchEnv" in failure.value.log_tail
    assert "exited with code 2" in str(failure.value)


@pytest.mark.parametrize("keep", [False, True])
def test_a_server_killed_and_never_stopped_leaves_no_log_file_unless_logs_are_kept(keep, monkeypatch, tmp_path):
    import tempfile

    from openenv_gym.launch import serve_command

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkstemp puts the log
    if keep:
        monkeypatch.setenv("OPENENV_GYM_KEEP_SERVER_LOGS", "1")
    else:
        monkeypatch.delenv("OPENENV_GYM_KEEP_SERVER_LOGS", raising=False)
    port = free_port()
    command = serve_command("CartPole-v1", host="127.0.0.1", port=port, max_sessions=2, env_kwargs=None, extra_args=[])
    server = ServerProcess(command, "127.0.0.1", port)
    with httpx.Client(trust_env=False) as client:
        server.wait_healthy(client, time.monotonic() + 60)
    os.kill(server.proc.pid, signal.SIGKILL)  # (a fault test's way: the object is then dropped, unstopped)
    server.proc.wait(timeout=TIMEOUT)
    assert "serving CartPole-v1" in server.output() and "serving CartPole-v1" in server.log_tail(200)
    assert [p.name for p in tmp_path.iterdir()] == ([server.log_path.name] if keep else [])
    assert (server.log_path is not None) == keep
    server.stop()
    assert "serving CartPole-v1" in server.output()  # (kept from before the file was closed)


@pytest.mark.parametrize("target", ["tests.servers.gym_envs:SlowEnv", "tests.servers.gym_envs:make_slow_env"])
def test_a_gymnasium_env_class_or_factory_is_served_by_its_module_path(target):
    from openenv_gym import OpenEnvEnv

    with launch_local(target, max_sessions=2, env_kwargs={"delay": 0.0}) as (url,):
        metadata = httpx.get(url + "/metadata", trust_env=False, timeout=TIMEOUT).json()
        assert metadata["name"] == target.partition(":")[2]
        with OpenEnvEnv(url) as env:
            assert env.codec == "msgpack" and env.action_space.n == 2
            obs, _ = env.reset(seed=0)
            assert obs.tolist() == [0.0, 0.0]
            obs, reward, terminated, truncated, _ = env.step(1)
            assert obs.tolist() == [0.5, 0.5] and (reward, terminated, truncated) == (1.0, False, False)


def test_a_module_name_gymnasium_makes_is_made_as_gymnasium_makes_it_not_called():
    # InfoCartPole is a class and, versionless, the id InfoCartPole-v1: gymnasium.make("module:InfoCartPole")
    # makes the registered env (its spec, its wrappers), so the server does too.
    target = "tests.servers.gym_envs:InfoCartPole"
    with launch_local(target, max_sessions=2) as (url,):
        assert httpx.get(url + "/metadata", trust_env=False, timeout=TIMEOUT).json()["name"] == target


def test_a_factory_that_makes_no_env_is_refused_at_startup():
    with pytest.raises(LaunchError) as failure:
        with launch_local("tests.servers.gym_envs:make_nothing"):
            pass  # pragma: no cover - never reached
    assert "make_nothing made a object, not a gymnasium.Env" in failure.value.log_tail


def test_serve_binds_loopback_by_default():
    args = build_parser().parse_args(["serve", "CartPole-v1"])
    assert (args.host, args.port, args.workers, args.max_sessions) == ("127.0.0.1", 8000, 1, 256)
    with pytest.raises(SystemExit):  # a usage error, not a traceback from deeper down
        build_parser().parse_args(["serve", "CartPole-v1", "--port", "70000"])


def _children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def test_workers_share_one_port_and_stop_on_sigterm():
    port = free_port()
    command = [sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1", "--port", str(port)]
    command += ["--workers", "2", "--max-sessions", "1"]
    server = ServerProcess(command, "127.0.0.1", port)
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            server.wait_healthy(client, deadline)
            workers = _children(server.proc.pid)
            assert len(workers) == 2

            async def sessions():
                # Each worker hosts one session: keep connecting until both hold one.
                held = []
                while len(held) < 2:
                    assert time.monotonic() < deadline
                    try:
                        held.append(await Session.connect(server.url))
                    except Exception:  # CapacityError: the kernel picked the full worker
                        pass
                for session in held:
                    await session.reset(seed=0)
                    await session.close()

            run(sessions())
            # Another server's workers on the same port are refused (SO_REUSEPORT would let them share it).
            other = subprocess.run(
                [sys.executable, "-m", "openenv_gym.server", "serve", "MountainCar-v0", "--port", str(port), "--workers", "2"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert other.returncode == 2 and "Address already in use" in other.stderr, other.stderr[-500:]
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(TIMEOUT)
    finally:
        server.stop()
    assert code == 0, server.log_tail()
    assert _refuses(server.url)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_workers_go_when_their_launcher_is_killed():
    # launch_local passes --parent-pid; with --workers too, nothing may outlive the launcher.
    port = free_port()
    launcher_code = (
        "import os, subprocess, sys, time\n"
        f"command = [sys.executable, '-m', 'openenv_gym.server', 'serve', 'CartPole-v1', '--port', '{port}',"
        " '--workers', '2', '--parent-pid', str(os.getpid())]\n"
        "print(subprocess.Popen(command).pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code], stdout=subprocess.PIPE, text=True)
    server_pid = 0
    try:
        server_pid = int(launcher.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.05)
        workers = _children(server_pid)
        assert len(workers) == 2
        launcher.kill()
        launcher.wait(TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while _alive(server_pid) or any(_alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "the server or a worker outlived its launcher"
            time.sleep(0.05)
        assert _refuses(url)
    finally:
        launcher.kill()
        if server_pid and _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)


def test_server_sockets_disable_nagle():
    """Accepted sockets must have TCP_NODELAY, or two replies in flight wait for a delayed ACK (40 ms)."""
    import asyncio
    import socket

    from openenv_gym.server.net.workers import listening_socket

    async def main():
        seen = asyncio.get_running_loop().create_future()

        async def on_connect(reader, writer):
            sock = writer.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        sock = listening_socket("127.0.0.1", 0, reuse_port=False)
        server = await asyncio.start_server(on_connect, sock=sock)
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert await asyncio.wait_for(seen, 5) != 0
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")
def test_serve_cpus_pins_the_server_and_its_workers():
    cpu = min(os.sched_getaffinity(0))
    port = free_port()
    command = [sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1", "--port", str(port)]
    command += ["--workers", "2", "--cpus", str(cpu)]
    server = ServerProcess(command, "127.0.0.1", port)
    try:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            server.wait_healthy(client, time.monotonic() + 60)
        assert os.sched_getaffinity(server.proc.pid) == {cpu}
        workers = _children(server.proc.pid)
        assert len(workers) == 2 and all(os.sched_getaffinity(w) == {cpu} for w in workers)
    finally:
        server.stop()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")
def test_serve_refuses_cpus_it_cannot_run_on():
    port = free_port()
    command = [sys.executable, "-m", "openenv_gym.server", "serve", "CartPole-v1", "--port", str(port)]
    done = subprocess.run([*command, "--cpus", "100000"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot run on CPUs [100000]" in done.stderr
    done = subprocess.run([*command, "--cpus", "zero"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "CPU numbers and ranges" in done.stderr


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")
def test_launch_local_pin_cpus_puts_each_server_on_its_own_cpu():
    cpus = sorted(os.sched_getaffinity(0))
    with launch_local("CartPole-v1", servers=2, max_sessions=2, pin_cpus=True) as urls:
        ports = [int(url.rsplit(":", 1)[1]) for url in urls]
        pins = []
        for port in ports:
            (pid,) = [p for p in _children(os.getpid()) if f"--port\x00{port}\x00" in Path(f"/proc/{p}/cmdline").read_text()]
            pins.append(os.sched_getaffinity(pid))
        assert pins == [{cpus[0]}, {cpus[1 % len(cpus)]}]
        assert run(_one_step(urls[1])) == "msgpack"


def test_a_server_process_starts_without_the_client_side():
    # What `openenv-gym serve` imports, in a fresh interpreter: none of httpx or the client modules
    # (they cost a server ~0.2 s of start-up on this 2-core machine, for nothing).
    code = (
        "import sys\n"
        "import openenv_gym.cli, openenv_gym.server.app, openenv_gym.server.net.workers, openenv_gym.server.net.unix\n"
        "from openenv_gym.server.hosting.resolve import resolve_factory\n"
        "resolve_factory('CartPole-v1').make()\n"
        "client = ('httpx', 'openenv_gym.client', 'openenv_gym.vector', 'openenv_gym.env', 'openenv_gym.remote')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'httpx' or m.startswith(client[1:])))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    # ...and the package still offers them, loaded on first use.
    import openenv_gym

    assert openenv_gym.OpenEnvVectorEnv.__module__ == "openenv_gym.vector.env"
    assert set(openenv_gym.__all__) <= set(dir(openenv_gym))
