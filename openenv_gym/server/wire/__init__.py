"""What the server says on a connection: the fast path, the stock ``/ws`` loop, and MCP's ``POST /mcp``.

Each module here reads requests from one connection, calls the hosts of
:mod:`..hosting` and writes the replies; the messages themselves are built
and parsed in :mod:`openenv_gym.protocol`.
"""
