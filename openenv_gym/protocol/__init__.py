"""The wire protocol, with no I/O: codecs, stock OpenEnv messages, and the fast path.

- :mod:`.codec`: JSON and msgpack frame codecs, numpy arrays as msgpack ext type 1.
- :mod:`.messages`: the stock OpenEnv ``/ws`` messages (one session per connection).
- :mod:`.multiplex`: the multi-session msgpack protocol ``openenv.msgpack.v1``.
- :mod:`.lane`: a lane's raw frames (lockstep steps of fixed layout, on the fast path).
- :mod:`.kinds`: :class:`RequestKind`, the ``type`` of a request on either protocol.
"""

from .codec import Codec, JsonCodec, MsgpackCodec, make_codec
from .kinds import RequestKind
from .multiplex import SUBPROTOCOL

__all__ = ["Codec", "JsonCodec", "MsgpackCodec", "make_codec", "SUBPROTOCOL", "RequestKind"]
