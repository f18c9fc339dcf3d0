"""``POST /mcp`` and ``/ws?session_id=``: OpenEnv's MCPToolClient against our server, next to the stock one."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from openenv_gym import launch_local
from tests.servers.launch import forked_launch

TIMEOUT = 30.0
MCP_CLASSES = [
    "--action-class",
    "openenv.core.env_server.mcp_types:CallToolAction",
    "--observation-class",
    "openenv.core.env_server.mcp_types:CallToolObservation",
]
CALC = "tests.servers.stock_envs:CalcEnvironment"


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


def active_sessions(url: str) -> int:
    return httpx.get(url + "/health", timeout=TIMEOUT).json()["active_sessions"]


async def _tool_client_session(url: str, during: Any = None) -> list[Any]:
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient

    out: list[Any] = []
    async with MCPToolClient(base_url=url, connect_timeout_s=10.0, message_timeout_s=TIMEOUT) as client:
        out.append(sorted(tool.name for tool in await client.list_tools()))  # POST /mcp, in a session it creates
        out.append(await client.call_tool("add", a=2, b=3))
        result = await client.reset(seed=0)  # over /ws?session_id=...: the same env
        out.append((result.reward, result.done))
        result = await client.step(CallToolAction(tool_name="add", arguments={"a": 40, "b": 2}))
        out.append((result.observation.result["structured_content"], result.reward))
        out.append(await client.call_tool("opened"))  # one MCP client session for it all
        if during is not None:
            out.append(during())
    return out


def test_the_stock_mcp_tool_client_works_against_our_server_as_against_the_stock_one(stock_mcp_url):
    with forked_launch(CALC, max_sessions=2, extra_args=MCP_CLASSES) as (url,):
        ours = run(_tool_client_session(url, during=lambda: active_sessions(url)))
        assert (
            ours[:3] == [["add", "opened"], 5, (0.0, False)] and ours[3][0] == {"result": 42} and ours[4:] == [1, 1]
        )  # the session counts while open
        assert active_sessions(url) == 0  # and is closed with the client
    stock = run(_tool_client_session(stock_mcp_url))
    assert ours[:-1] == stock


def _rpc(url: str, method: str, params: Any = None, **kwargs: Any) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "method": method, "id": 7, **({} if params is None else {"params": params})}
    response = httpx.post(url + "/mcp", json=body, timeout=TIMEOUT, **kwargs)
    assert response.status_code == 200
    return response.json()


def test_json_rpc_answers_and_errors_are_the_stock_servers(stock_mcp_url):
    cases = [
        ("tools/list", {}),  # no session: a temporary env
        ("tools/call", {"name": "add", "arguments": {"a": 1, "b": 1}}),
        ("tools/call", {"arguments": {}}),  # no name
        ("tools/call", {"name": "add", "session_id": "nope"}),
        ("openenv/session/close", {"session_id": "nope"}),
        ("openenv/session/close", {}),
        ("no/such/method", {}),
        ("tools/list", [1, 2]),  # params not an object
    ]
    with forked_launch(CALC, max_sessions=2, extra_args=MCP_CLASSES) as (url,):
        for method, params in cases:
            ours, stock = _rpc(url, method, params), _rpc(stock_mcp_url, method, params)
            assert ours.keys() == stock.keys() and ours["id"] == stock["id"], (method, ours, stock)
            if "error" in ours:
                assert ours["error"]["code"] == stock["error"]["code"], (method, ours, stock)
            else:
                assert ours == stock
        bad = httpx.post(url + "/mcp", content=b"{not json", timeout=TIMEOUT).json()
        assert bad["error"]["code"] == -32700 and bad["id"] is None
        assert active_sessions(url) == 0  # the temporary envs are gone


def test_a_gym_env_has_no_tools_and_sessions_are_counted_and_expire():
    extra = ["--mcp-session-timeout", "1.0"]  # (long enough that a stalled VM does not end it between two calls)
    with launch_local("CartPole-v1", max_sessions=1, extra_args=extra) as (url,):
        listed = _rpc(url, "tools/list", {})
        assert listed["error"]["code"] == -32603 and "does not support MCP" in listed["error"]["message"]
        session_id = _rpc(url, "openenv/session/create")["result"]["session_id"]
        full = _rpc(url, "openenv/session/create")  # max_sessions=1: that one holds the only slot
        assert full["error"]["code"] == -32000 and full["error"]["data"] == {"active_sessions": 1, "max_sessions": 1}
        deadline = time.monotonic() + TIMEOUT
        while active_sessions(url) and time.monotonic() < deadline:  # unused for 1 s: closed
            time.sleep(0.05)
        assert active_sessions(url) == 0
        assert "Unknown session_id" in _rpc(url, "openenv/session/close", {"session_id": session_id})["error"]["message"]


def test_a_websocket_attaches_to_a_session_once_and_only_to_one_that_exists():
    import json

    from websockets.sync.client import connect

    with forked_launch(CALC, max_sessions=2, extra_args=MCP_CLASSES) as (url,):
        ws_url = url.replace("http", "ws", 1) + "/ws"
        with connect(ws_url + "?session_id=nope", open_timeout=TIMEOUT) as ws:
            reply = json.loads(ws.recv(timeout=TIMEOUT))
            assert reply["type"] == "error" and reply["data"]["code"] == "SESSION_ERROR"
        session_id = _rpc(url, "openenv/session/create")["result"]["session_id"]
        with connect(f"{ws_url}?session_id={session_id}", open_timeout=TIMEOUT) as first:
            first.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(first.recv(timeout=TIMEOUT))["type"] == "observation"
            with connect(f"{ws_url}?session_id={session_id}", open_timeout=TIMEOUT) as second:
                reply = json.loads(second.recv(timeout=TIMEOUT))
                assert reply["data"]["code"] == "SESSION_ERROR" and "already" in reply["data"]["message"]
            # Closing the session while a WebSocket holds it: closed when that lets go.
            closing = _rpc(url, "openenv/session/close", {"session_id": session_id})["result"]
            assert closing == {"session_id": session_id, "closed": False, "closing": True}  # as stock answers
            first.send(json.dumps({"type": "state"}))
            assert json.loads(first.recv(timeout=TIMEOUT))["type"] == "state"
            assert active_sessions(url) == 1
        deadline = time.monotonic() + TIMEOUT
        while active_sessions(url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert active_sessions(url) == 0


def _raw(url: str, data: bytes, *, half_close: bool = False) -> bytes:
    """Send ``data`` on a new connection (then ``half_close``: no more); all the server answers before it closes."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


BAD_REQUESTS = [
    (b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", b"413"),
    (b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"501"),
    (b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", b"400"),
    (b"POST /mcp HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
    (b"POST /mcp HTTP/2.0\r\nHost: x\r\n\r\n", b"505"),
    (b"POST /elsewhere HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", b"404"),
]


def test_bad_http_requests_get_a_status_and_cost_nothing_else():
    with forked_launch(CALC, max_sessions=2, extra_args=MCP_CLASSES + ["--max-frame-bytes", "65536"]) as (url,):
        for request_bytes, status in BAD_REQUESTS:
            answer = _raw(url, request_bytes)
            assert answer.split(b" ", 2)[1] == status, answer[:200]
        assert _rpc(url, "tools/list", {})["result"]["tools"]  # the server goes on
        assert httpx.get(url + "/health", timeout=TIMEOUT).status_code == 200
        # Requests before a bad one are answered, in order, then the refusal; a half-close still gets its answer;
        # a result JSON cannot hold (an int of 4,301 digits) is an error reply, not a dropped connection.
        body = b'{"jsonrpc": "2.0", "method": "no/such", "id": 1}'
        post = b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        answer = _raw(url, post + post + b"BOGUS LINE\r\n\r\n")
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [b"200", b"200", b"400"]
        assert _raw(url, post, half_close=True).startswith(b"HTTP/1.1 200")
        huge = {"name": "add", "arguments": {"a": 10**4299, "b": 9 * 10**4299}}
        assert "cannot encode" in _rpc(url, "tools/call", huge)["error"]["message"]


def test_keep_alive_serves_several_requests_on_one_connection_and_the_token_guards_them():
    token = "t" * 32
    with forked_launch(CALC, max_sessions=2, extra_args=MCP_CLASSES, token=token) as (url,):
        assert httpx.post(url + "/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "id": 1}, timeout=TIMEOUT).status_code == 401
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(headers=headers, timeout=TIMEOUT) as client:
            answers = [
                client.post(
                    url + "/mcp",
                    json={"jsonrpc": "2.0", "method": "tools/call", "id": i, "params": {"name": "add", "arguments": {"a": i, "b": 1}}},
                ).json()
                for i in range(3)
            ]
            health = client.get(url + "/health")  # a GET on the same kept-alive connection, as pooling clients send
        assert [a["result"]["structured_content"]["result"] for a in answers] == [1, 2, 3]
        assert health.status_code == 200 and health.json()["status"] == "healthy"


def test_the_request_reader_takes_bytes_however_they_are_cut():
    from openenv_gym.server.net.http1 import RequestReader

    one = b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    two = b"POST /mcp?a=1 HTTP/1.0\r\ncontent-length: 3\r\nConnection: keep-alive\r\n\r\n[1]"
    three = b"POST /mcp HTTP/1.1\r\nConnection: close\r\n\r\n"
    reader = RequestReader(max_body=16)
    got = []
    for byte in one + two + three:  # one byte at a time
        got += reader.feed(bytes([byte]))
    assert [(r.path, r.body, r.keep_alive) for r in got] == [("/mcp", b"{}", True), ("/mcp", b"[1]", True), ("/mcp", b"", False)]
    assert reader.idle and got[1].target == "/mcp?a=1"
    assert [r.body for r in RequestReader(max_body=16).feed(one + two)] == [b"{}", b"[1]"]  # two at once


def test_the_request_reader_refuses_after_the_requests_before_and_counts_the_head_alone():
    from openenv_gym.server.net.http1 import RequestReader

    good = b"POST /mcp HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    reader = RequestReader(max_body=16)
    assert [r.body for r in reader.feed(good + good + b"BOGUS\r\n\r\n" + good)] == [b"{}", b"{}"]
    assert reader.error is not None and reader.error.status == 400 and reader.feed(good) == []
    head = b"POST /mcp HTTP/1.1\r\nX: " + b"a" * (200 - len(b"POST /mcp HTTP/1.1\r\nX: "))
    assert len(head) == 200
    for cut in (len(head) + 1, len(head) + 4):  # however the blank line is cut, a head of max_head bytes is taken
        reader = RequestReader(max_body=16, max_head=200)
        data = head + b"\r\n\r\n"
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) and reader.error is None
