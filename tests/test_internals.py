"""The undocumented internals of asyncio, CPython and websockets are read in one module, and checked at import."""

from __future__ import annotations

import ast
import pathlib
import socket

import pytest

import openenv_gym
from openenv_gym import _internals

pytestmark = pytest.mark.unit  # (the fast tier: no sockets, no server processes)

PACKAGE = pathlib.Path(openenv_gym.__file__).parent

#: Attribute names that belong to asyncio's or websockets' insides (each is read in _internals only).
INTERNAL_ATTRIBUTES = frozenset(
    {
        "_ready",
        "_ssock",
        "_get_running_loop",
        "_set_running_loop",
        "keepalive_task",
        "start_keepalive",
        "recv_messages",
        "connection_lost_waiter",
        "process_event",
        "send_data",
        "close_deadline",
        "response_rcvd",
        "handler_tasks",
        "parser",
        "current_size",
        "gi_yieldfrom",
        "gi_code",
    }
)


def _internal_names(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            own = node.attr.startswith("_") and isinstance(node.value, ast.Name) and node.value.id == "self"
            if node.attr in INTERNAL_ATTRIBUTES and not own:  # (a class of ours may have a private `_ready` of its own)
                found.append(node.attr)
            elif node.attr == "buffer" and isinstance(node.value, ast.Attribute) and node.value.attr == "reader":
                found.append("reader.buffer")
            elif isinstance(node.value, ast.Name) and node.value.id == "asyncio" and node.attr.startswith("_"):
                found.append(f"asyncio.{node.attr}")
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name == "_signal"]
        elif isinstance(node, ast.ImportFrom) and node.module == "websockets.streams":
            found.append("websockets.streams")
        elif isinstance(node, ast.ImportFrom) and node.module in ("asyncio", "asyncio.events"):
            found += [f"asyncio.{alias.name}" for alias in node.names if alias.name.startswith("_")]
    return found


def test_no_module_but_one_names_an_internal_of_asyncio_or_websockets():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_internals.py" and path.parent == PACKAGE:
            continue
        names = _internal_names(ast.parse(path.read_text(), filename=str(path)))
        if names:
            offenders[str(path.relative_to(PACKAGE))] = sorted(set(names))
    assert offenders == {}


def test_the_scan_finds_an_internal_where_one_is_named():
    # (the scan above would pass vacuously if it could not see one)
    tree = ast.parse("import _signal\nloop._ready\nws.recv_messages.frames\nprotocol.reader.buffer\nasyncio._set_running_loop(None)\n")
    assert sorted(_internal_names(tree)) == ["_ready", "_set_running_loop", "_signal", "reader.buffer", "recv_messages"]
    assert _internal_names(ast.parse("from asyncio import _get_running_loop\n")) == ["asyncio._get_running_loop"]
    assert _internal_names(ast.parse((PACKAGE / "_internals.py").read_text()))


def test_the_installed_releases_have_every_internal():
    _internals.check()  # raises DependencyChanged otherwise


def test_an_internal_that_moved_fails_the_check_with_its_name_and_the_fix():
    class Assembler:  # (as a release that renamed its frame queue would have it)
        def __init__(self) -> None:
            self.incoming = []

    expectations = [
        ("Assembler.frames", lambda: not _internals._sets(Assembler.__init__, ["frames"])),
        ("asyncio._set_running_loop", lambda: True),
    ]
    with pytest.raises(ImportError) as caught:
        _internals.check(expectations)
    assert isinstance(caught.value, _internals.DependencyChanged)
    message = str(caught.value)
    assert "Assembler.frames" in message and "_set_running_loop" not in message
    assert "websockets>=17.0.1,<18" in message


def test_the_requirement_bounds_websockets_as_the_check_says():
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert '"websockets>=17.0.1,<18"' in pyproject


def test_the_fast_reply_path_sees_what_websockets_parser_holds():
    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    protocol = ClientProtocol(parse_uri("ws://127.0.0.1:1/ws"))
    assert _internals.unparsed_bytes(protocol) == 0 and _internals.current_size(protocol) is None
    protocol.receive_data(b"HTTP/1.1 101")  # (half a response head: held, not parsed)
    assert _internals.unparsed_bytes(protocol) == len(b"HTTP/1.1 101")


def test_a_unit_test_that_opens_a_socket_fails():
    # (the fast tier's guard, tests/conftest.py: this test is marked unit by its module)
    from tests.conftest import SocketInUnitTest

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(SocketInUnitTest):
            sock.connect(("127.0.0.1", 9))
        with pytest.raises(SocketInUnitTest):
            sock.bind(("127.0.0.1", 0))
    finally:
        sock.close()
