"""The server's port and processes: connections, plain HTTP, who may connect, Unix sockets, workers, busy polling.

Nothing here knows the fast path's or the stock protocol's messages: it takes
bytes and requests in, hands WebSocket connections to :mod:`..wire` and plain
HTTP requests to :mod:`.routes` and the MCP service.
"""
