"""How fast can Python step remote CartPoles at all? A floor under the pool's per-frame costs.

Side by side, in interleaved trials (median reported), 64 CartPole-v1 envs:

- **floor**: the least a remote lockstep step can do in Python. Two server
  processes, 32 envs each, behind a plain TCP socket; a request is the
  actions as raw int64 bytes, a reply the observations, rewards and flags as
  raw bytes in a fixed layout. No WebSocket, no msgpack, no request ids,
  sessions, errors, infos, timeouts or autoreset bookkeeping: a server resets
  an env on the step after it ended. Not a protocol anyone should use; it
  bounds what one could.
- **lane client**: the least a client can do over openenv_gym's own servers
  and protocol: blocking sockets, the WebSocket handshake by hand, msgpack
  ``open``/``reset``/``bind``, then every step one raw lane frame to each
  server and its raw reply read into the batch (next-step autoreset by the
  lane's reset bytes). No event loop, timeouts, faults, checks of the
  actions or infos. The same servers as the pool's: what it gains over the
  pool is the client's layers.
- **pool**: ``OpenEnvVectorEnv`` on the fast path, over two local servers.
- **SyncVectorEnv**: gymnasium's, in-process.

For each remote setup it also reports the CPU time per step of the client
and of each server (``/proc``), so that the gap between floor and pool can be
split into client and server work.

    python benchmarks/wire_floor.py [--envs 64] [--steps 4000] [--trials 3]

``--check`` first steps the lane client and SyncVectorEnv side by side and
stops unless their observations, rewards and flags are equal.
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np

from openenv_gym import OpenEnvVectorEnv, launch_local
from openenv_gym.bench.machine import describe_machine, machine_line
from openenv_gym.client.websocket import client_frame
from openenv_gym.protocol import lane as lanes
from openenv_gym.protocol.codec import MsgpackCodec
from openenv_gym.protocol.multiplex import SUBPROTOCOL, open_request, reset_batch_request

OBS_SIZE = 4  # CartPole's observation: float32 (4,)


def _reply_bytes(n: int) -> int:
    return n * (OBS_SIZE * 4 + 8 + 1 + 1)  # obs float32, reward float64, terminated, truncated


def _recv_exactly(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            return False
        got += n
    return True


def serve(n: int, first_seed: int) -> None:
    """A floor server on a free loopback port (printed on stdout) for one client: ``n`` CartPoles, seeded from ``first_seed`` on."""
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    obs = np.zeros((n, OBS_SIZE), np.float32)
    rewards = np.zeros(n, np.float64)
    terminated = np.zeros(n, np.bool_)
    truncated = np.zeros(n, np.bool_)
    ended = [False] * n
    for i, env in enumerate(envs):
        obs[i] = env.reset(seed=first_seed + i)[0]  # (as SyncVectorEnv.reset(seed=0) seeds its env first_seed + i)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        print(listener.getsockname()[1], flush=True)
        conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = bytearray(n * 8)
    view = memoryview(request)
    with conn:
        while _recv_exactly(conn, view):
            actions = list(np.frombuffer(request, np.int64))  # numpy scalars, as SyncVectorEnv passes them
            for i, env in enumerate(envs):
                if ended[i]:  # next-step autoreset, as SyncVectorEnv's default
                    obs[i] = env.reset()[0]
                    rewards[i], terminated[i], truncated[i], ended[i] = 0.0, False, False, False
                    continue
                o, r, te, tr, _ = env.step(actions[i])
                obs[i], rewards[i], terminated[i], truncated[i] = o, r, te, tr
                ended[i] = te or tr
            conn.sendall(b"".join((obs.tobytes(), rewards.tobytes(), terminated.tobytes(), truncated.tobytes())))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children() -> list[int]:
    """This process's child processes (Linux: ``/proc``)."""
    pids = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids += [int(pid) for pid in f.read().split()]
    return sorted(pids)


class Floor:
    """A client of ``servers`` floor servers; :meth:`step` steps all their envs once."""

    def __init__(self, num_envs: int, servers: int = 2) -> None:
        if num_envs % servers:
            raise ValueError(f"{num_envs} envs do not split evenly over {servers} servers")
        self.per_server = num_envs // servers
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--serve", str(self.per_server), "--first-seed", str(j * self.per_server)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for j in range(servers)
        ]
        self.socks = []
        for proc in self.procs:
            port = int(proc.stdout.readline())  # type: ignore[union-attr]
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks.append(sock)
        n = self.per_server * servers
        self.obs = np.zeros((n, OBS_SIZE), np.float32)
        self.rewards = np.zeros(n)
        self.terminated = np.zeros(n, np.bool_)
        self.truncated = np.zeros(n, np.bool_)
        self.buffers = [bytearray(_reply_bytes(self.per_server)) for _ in self.socks]
        self.pids = [p.pid for p in self.procs]

    def step(self, actions: np.ndarray) -> None:
        k = self.per_server
        actions = np.ascontiguousarray(actions, dtype=np.int64)
        for j, sock in enumerate(self.socks):
            sock.sendall(actions[j * k : (j + 1) * k].tobytes())
        for j, sock in enumerate(self.socks):
            buffer = self.buffers[j]
            if not _recv_exactly(sock, memoryview(buffer)):
                raise ConnectionError("floor server closed")
            rows = slice(j * k, (j + 1) * k)
            self.obs[rows] = np.frombuffer(buffer, np.float32, k * OBS_SIZE).reshape(k, OBS_SIZE)
            self.rewards[rows] = np.frombuffer(buffer, np.float64, k, k * OBS_SIZE * 4)
            self.terminated[rows] = np.frombuffer(buffer, np.bool_, k, k * (OBS_SIZE * 4 + 8))
            self.truncated[rows] = np.frombuffer(buffer, np.bool_, k, k * (OBS_SIZE * 4 + 9))

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        for proc in self.procs:
            proc.wait(timeout=30)


_MASK = os.urandom(4)  # (one masking key for all frames: enough for a benchmark on loopback)


def _ws_frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """A masked, unfragmented client frame."""
    return client_frame(payload, opcode, _MASK)


class _LaneConnection:
    """One blocking WebSocket to an openenv_gym server, its sessions bound into one lane."""

    def __init__(self, url: str, count: int, first_seed: int) -> None:
        host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray(1 << 16)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n", 1)[0] or SUBPROTOCOL.encode() not in head:
            raise ConnectionError(f"{url}: no {SUBPROTOCOL} WebSocket: {head[:200]!r}")
        codec = MsgpackCodec()
        self.sock.sendall(_ws_frame(codec.encode(open_request(1, count))))
        sessions = codec.decode(self._read())["sessions"]
        self.sock.sendall(_ws_frame(codec.encode(reset_batch_request(2, sessions, list(range(first_seed, first_seed + count))))))
        codec.decode(self._read())
        layout = lanes.Layout(np.dtype(np.int64), ())
        self.sock.sendall(_ws_frame(codec.encode(lanes.bind_request(3, sessions, "action", layout))))
        self.lane = lanes.parse_bound(codec.decode(self._read()), sessions, "action", layout, 1 << 20)
        self.request_id = 3

    def _exactly(self, n: int) -> memoryview:
        if n > len(self.buffer):
            self.buffer = bytearray(n)
        view = memoryview(self.buffer)[:n]
        if not _recv_exactly(self.sock, view):
            raise ConnectionError("the server closed the connection")
        return view

    def _read(self) -> bytes:
        """The next binary message (pings answered on the way)."""
        while True:
            first, second = bytes(self._exactly(2))
            n = second & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._exactly(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._exactly(8))[0]
            payload = bytes(self._exactly(n))
            if first == 0x89:  # ping: pong
                self.sock.sendall(_ws_frame(payload, 0xA))
                continue
            if first != 0x82:
                raise ConnectionError(f"unexpected frame 0x{first:02x}")
            return payload

    def send_step(self, actions: np.ndarray, resets: np.ndarray) -> None:
        self.request_id += 1
        self.sock.sendall(_ws_frame(lanes.pack_step(self.lane, self.request_id, actions, resets)))

    def read_step(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        payload = self._read()
        _, lane, request_id = lanes.raw_header(payload)
        if request_id != self.request_id:
            raise ConnectionError(f"a reply to request {request_id}, expected {self.request_id} (not a raw batch?)")
        return lanes.RawBatch(request_id, lane, payload).columns(self.lane)


class LaneClient:
    """A minimal blocking client of ``urls`` (openenv_gym servers) over lanes; :meth:`step` returns as SyncVectorEnv's."""

    def __init__(self, urls: list[str], num_envs: int) -> None:
        if num_envs % len(urls):
            raise ValueError(f"{num_envs} envs do not split evenly over {len(urls)} servers")
        self.per_server = k = num_envs // len(urls)
        self.connections = [_LaneConnection(url, k, j * k) for j, url in enumerate(urls)]
        self.obs = np.zeros((num_envs, OBS_SIZE), np.float32)
        self.rewards = np.zeros(num_envs)
        self.terminated = np.zeros(num_envs, np.bool_)
        self.truncated = np.zeros(num_envs, np.bool_)
        self.resets = np.zeros(num_envs, np.bool_)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        k = self.per_server
        actions = np.ascontiguousarray(actions, dtype=np.int64)
        for j, connection in enumerate(self.connections):
            connection.send_step(actions[j * k : (j + 1) * k], self.resets[j * k : (j + 1) * k])
        for j, connection in enumerate(self.connections):
            fields, reward, done = connection.read_step()
            rows = slice(j * k, (j + 1) * k)
            self.obs[rows] = fields[connection.lane.observation_field]
            self.rewards[rows] = np.nan_to_num(reward)  # (NaN: no reward, a reset's)
            self.terminated[rows] = fields["terminated"]
            self.truncated[rows] = fields["truncated"]
            self.resets[rows] = done
        return self.obs.copy(), self.rewards.copy(), self.terminated.copy(), self.truncated.copy(), {}

    def close(self) -> None:
        for connection in self.connections:
            connection.sock.close()


def check_lane_client(actions: np.ndarray) -> None:
    """Step the lane client and SyncVectorEnv side by side; ``SystemExit`` at the first difference."""
    n = actions.shape[1]
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)
    sync.reset(seed=0)
    with launch_local("CartPole-v1", servers=2, max_sessions=n) as urls:
        client = LaneClient(urls, n)
        try:
            for t in range(min(len(actions), 500)):
                ours, theirs = client.step(actions[t]), sync.step(actions[t])
                for a, b in zip(ours[:4], theirs[:4]):
                    if not np.array_equal(a, b):
                        sys.exit(f"the lane client and SyncVectorEnv differ at step {t}")
        finally:
            client.close()
    sync.close()
    print("lane client == SyncVectorEnv for 500 steps", flush=True)


def run(step: Any, actions: np.ndarray, pids: list[int]) -> dict[str, Any]:
    """Step through ``actions`` (after 100 warm-up steps); steps/s and CPU us per step of the client and each pid."""
    for t in range(100):
        step(actions[t])
    steps = len(actions) - 100
    before = [_cpu_seconds(pid) for pid in pids]
    start, cpu = time.perf_counter(), time.process_time()
    for t in range(100, len(actions)):
        step(actions[t])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    after = [_cpu_seconds(pid) for pid in pids]
    return {
        "steps_per_s": steps * actions.shape[1] / wall,
        "client_cpu_us": cpu / steps * 1e6,
        "server_cpu_us": [(b - a) / steps * 1e6 for a, b in zip(before, after)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="first check the lane client against SyncVectorEnv")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--first-seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.first_seed)
        return
    n = args.envs
    actions = np.random.default_rng(0).integers(0, 2, (args.steps + 100, n))
    if args.check:
        check_lane_client(actions)
    results: dict[str, list[dict[str, Any]]] = {
        "floor (2 servers)": [],
        "lane client": [],
        "pool (2 servers)": [],
        "SyncVectorEnv": [],
    }
    for _ in range(args.trials):
        floor = Floor(n)
        try:
            results["floor (2 servers)"].append(run(floor.step, actions, floor.pids))
        finally:
            floor.close()
        with launch_local("CartPole-v1", servers=2, max_sessions=n) as urls:
            pids = _children()  # (the floor servers have exited)
            client = LaneClient(urls, n)
            try:
                results["lane client"].append(run(client.step, actions, pids))
            finally:
                client.close()
        with launch_local("CartPole-v1", servers=2, max_sessions=n) as urls:
            envs = OpenEnvVectorEnv(urls, n)
            try:
                envs.reset(seed=0)
                pids = _children()
                results["pool (2 servers)"].append(run(envs.step, actions, pids))
            finally:
                envs.close()
        results["SyncVectorEnv"].append(run_sync(actions))
    print(f"CartPole-v1, {n} envs, {args.trials} interleaved trials of {args.steps} steps, median; {machine_line(describe_machine())}")
    print_table(results)


def run_sync(actions: np.ndarray) -> dict[str, Any]:
    """:func:`run` of gymnasium's SyncVectorEnv, one CartPole-v1 per column of ``actions``, reset with seed 0."""
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * actions.shape[1])
    try:
        sync.reset(seed=0)
        return run(sync.step, actions, [])
    finally:
        sync.close()


def print_table(results: dict[str, list[dict[str, Any]]], width: int = 20) -> None:
    """The median of each setup's runs (:func:`run`), against the ``"SyncVectorEnv"`` setup's steps/s."""
    sync_rate = statistics.median(r["steps_per_s"] for r in results["SyncVectorEnv"])
    print(f"{'setup':<{width}} {'steps/s':>9} {'/ Sync':>7} {'client us/step':>15} {'server us/step':>16}")
    for name, runs in results.items():
        rate = statistics.median(r["steps_per_s"] for r in runs)
        client = statistics.median(r["client_cpu_us"] for r in runs)
        servers = [statistics.median(s) for s in zip(*(r["server_cpu_us"] for r in runs))]
        shown = " / ".join(f"{s:.0f}" for s in servers) if servers else "-"
        print(f"{name:<{width}} {rate:>9,.0f} {rate / sync_rate:>6.2f}x {client:>15.0f} {shown:>16}")


if __name__ == "__main__":
    main()
