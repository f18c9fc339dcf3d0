"""Frame codecs: JSON text frames (stock OpenEnv) and msgpack binary frames.

No I/O here: a codec turns a message (plain dicts, lists, scalars and numpy
arrays) into the payload of one WebSocket frame and back.

msgpack array extension (ext type 1, ``NDARRAY``)
-------------------------------------------------
A numpy array travels as a msgpack ext object of type 1 whose data is::

    offset 0        u8      L, length of the dtype string (1..8)
    offset 1        L bytes dtype in numpy's array-interface form, ASCII:
                            "|b1" "|i1" "<i2" "<i4" "<i8" "|u1" "<u2" "<u4"
                            "<u8" "<f2" "<f4" "<f8"  (little-endian only)
    offset 1+L      u8      ndim (0..Limits.max_ndim)
    offset 2+L      8*ndim  shape, each dimension a little-endian u64
    then            0..7    zero bytes, padding the header to a multiple of 8
    then            N bytes the elements in C order, N = prod(shape) * itemsize

The payload length must equal N exactly. A decoder checks the dtype against the
list above, ``ndim`` and ``N`` against :class:`~openenv_gym.config.Limits`
before it touches the data, and then views the bytes with ``np.frombuffer``:
no copy, and no allocation sized by what the peer declared. Arrays decoded this
way are read-only views of the received frame.

Anything else (dicts with str keys, lists, str, bytes, int, float, bool, None)
is plain msgpack. Nothing is ever unpickled, eval'd or imported.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import re
import struct
from itertools import chain
from typing import Any, Callable, Iterator, Literal

import msgpack
import numpy as np

from ..config import Limits
from ..errors import LimitExceeded, ProtocolError

__all__ = [
    "NDARRAY_EXT",
    "CodecName",
    "Codec",
    "JsonCodec",
    "MsgpackCodec",
    "encode_ndarray",
    "decode_ndarray",
    "check_depth",
    "make_codec",
]

CodecName = Literal["json", "msgpack"]

NDARRAY_EXT = 1

#: dtypes allowed on the wire, by their array-interface string.
WIRE_DTYPES: dict[str, np.dtype] = {
    s: np.dtype(s) for s in ("|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8")
}

_U64 = struct.Struct("<Q")
_WIRE_DTYPES_BY_BYTES = {key.encode("ascii"): dtype for key, dtype in WIRE_DTYPES.items()}
_SHAPES = [struct.Struct(f"<{n}Q") for n in range(5)]


_HEADER_CACHE_SIZE = 256
_encode_headers: dict[tuple[str, tuple[int, ...]], bytes] = {}


def _header(key: str, shape: tuple[int, ...]) -> bytes:
    head = bytearray()
    head.append(len(key))
    head += key.encode("ascii")
    head.append(len(shape))
    for dim in shape:
        head += _U64.pack(dim)
    head += bytes(-len(head) % 8)
    return bytes(head)


def encode_ndarray(array: np.ndarray) -> msgpack.ExtType:
    """Pack a numeric numpy array as an ``NDARRAY`` ext object.

    Big-endian arrays are converted to little-endian; non-contiguous arrays are
    copied to C order. Object, string and structured dtypes raise ``TypeError``.
    """
    dtype = array.dtype
    if dtype.byteorder == ">":
        dtype = dtype.newbyteorder("<")
        array = array.astype(dtype)
    key = dtype.str
    head = _encode_headers.get((key, array.shape))
    if head is None:
        if key not in WIRE_DTYPES:
            raise TypeError(f"cannot send numpy arrays of dtype {array.dtype} (allowed: {', '.join(WIRE_DTYPES)})")
        if len(_encode_headers) >= _HEADER_CACHE_SIZE:
            _encode_headers.clear()
        head = _encode_headers[(key, array.shape)] = _header(key, array.shape)
    return msgpack.ExtType(NDARRAY_EXT, head + np.ascontiguousarray(array).tobytes())


def decode_ndarray(data: bytes, limits: Limits, cache: dict[bytes, tuple] | None = None) -> np.ndarray:
    """Unpack the data of an ``NDARRAY`` ext object into a read-only array view.

    ``cache`` (optional) remembers checked headers, so that frames of the same
    shapes skip the header checks; it must belong to one set of ``limits``.

    Raises:
        ProtocolError: malformed header, unknown dtype, or payload length that
            does not match the declared shape.
        LimitExceeded: more dimensions or bytes than ``limits`` allow.
    """
    size = len(data)
    if size < 2:
        raise ProtocolError("ndarray ext: truncated header")
    dlen = data[0]
    if not 1 <= dlen <= 8 or size < 2 + dlen:
        raise ProtocolError("ndarray ext: bad dtype length")
    ndim = data[1 + dlen]
    end = 2 + dlen + 8 * ndim
    offset = end + (-end % 8)
    if cache is not None:
        known = cache.get(data[:offset])
        if known is not None and size - offset == known[2]:
            dtype, shape, _ = known
            return np.ndarray(shape, dtype, buffer=data, offset=offset)
    dtype = _WIRE_DTYPES_BY_BYTES.get(data[1 : 1 + dlen])
    if dtype is None:
        raise ProtocolError(f"ndarray ext: dtype {data[1 : 1 + dlen]!r:.60} not allowed")
    if ndim > limits.max_ndim:
        raise LimitExceeded(f"ndarray ext: {ndim} dimensions, limit is {limits.max_ndim}")
    if size < end:
        raise ProtocolError("ndarray ext: truncated shape")
    shape = _SHAPES[ndim].unpack_from(data, 2 + dlen) if ndim < len(_SHAPES) else struct.unpack_from(f"<{ndim}Q", data, 2 + dlen)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > limits.max_array_bytes:
        raise LimitExceeded(f"ndarray ext: shape {shape} of {dtype.str} is {nbytes} bytes, limit is {limits.max_array_bytes}")
    if size - offset != nbytes:
        raise ProtocolError(f"ndarray ext: shape {shape} of {dtype.str} needs {nbytes} bytes, frame carries {max(size - offset, 0)}")
    try:
        array = np.ndarray(shape, dtype, buffer=data, offset=offset)
    except ValueError as exc:  # an empty array with a dimension numpy cannot index, or too many dimensions
        raise ProtocolError(f"ndarray ext: shape {shape} of {dtype.str}: {exc}") from None
    if cache is not None:
        if len(cache) >= _HEADER_CACHE_SIZE:
            cache.clear()
        cache[data[:offset]] = (dtype, shape, nbytes)
    return array


def check_depth(obj: Any, max_depth: int) -> None:
    """Raise :class:`LimitExceeded` if lists/dicts in ``obj`` nest deeper than ``max_depth``.

    Iterative, so a hostile message cannot exhaust the Python stack.
    Arrays and scalars are leaves.
    """
    _check_tree(obj, max_depth, None)


def _check_tree(obj: Any, max_depth: int, refused: type | None) -> None:
    """:func:`check_depth`, and a :class:`ProtocolError` for any value of type ``refused``.

    Depth first, one iterator per open level: the walk holds at most
    ``max_depth`` iterators, however many containers the message has. The
    fastest walk for the small messages of the hot path; a big frame's
    message goes to :func:`_check_wide_tree` instead.
    """
    t = type(obj)
    if t is not dict and t is not list:
        if t is refused:
            raise ProtocolError(f"{refused.__name__} values are not allowed")
        return
    stack = [iter(obj.values() if t is dict else obj)]
    push, pop = stack.append, stack.pop
    while stack:
        for child in stack[-1]:
            t = type(child)
            if t is dict or t is list:
                if len(stack) >= max_depth:
                    raise LimitExceeded(f"message nests deeper than {max_depth} levels")
                if t is list:
                    # A list of scalars (a JSON observation of 100,800 ints) is checked in C.
                    kinds = set(map(type, child))
                    if list not in kinds and dict not in kinds:
                        if refused is not None and refused in kinds:
                            raise ProtocolError(f"{refused.__name__} values are not allowed")
                        continue
                push(iter(child.values() if t is dict else child))
                break
            if t is refused:
                raise ProtocolError(f"{refused.__name__} values are not allowed")
        else:
            pop()


def _check_wide_tree(obj: Any, max_depth: int, refused: type | None) -> None:
    """:func:`_check_tree` for big frames: level by level, the per-object work in C.

    Flattening a level and collecting its types are C loops: a frame of
    millions of tiny containers costs Python a few passes, not a loop turn
    per container (16 MiB of empty lists: 5 s item by item). Holds a list
    of references to one level's objects at a time.
    """
    t = type(obj)
    if t is not dict and t is not list:
        if t is refused:
            raise ProtocolError(f"{refused.__name__} values are not allowed")
        return
    level: list[Any] = [obj]  # the containers at this depth
    level_kinds: set[type] = {t}
    depth = 1
    while True:
        if dict in level_kinds:  # (views made one at a time: a level of a million dicts makes no million views at once)
            views = map(dict.values, level) if list not in level_kinds else map(_values_of, level)
            children = list(chain.from_iterable(views))
        elif len(level) == 1:
            children = level[0]  # (a list: read, not copied)
        else:
            children = list(chain.from_iterable(level))
        kinds = set(map(type, children))
        if refused is not None and refused in kinds:
            raise ProtocolError(f"{refused.__name__} values are not allowed")
        if dict not in kinds and list not in kinds:
            return
        if depth >= max_depth:
            raise LimitExceeded(f"message nests deeper than {max_depth} levels")
        if kinds <= _TREE_CONTAINERS:  # (only containers: the level is all of them)
            level = children
        else:
            level = [c for c in children if type(c) is list or type(c) is dict]
        level_kinds = kinds & _TREE_CONTAINERS
        depth += 1


_TREE_CONTAINERS = frozenset({dict, list})


def _values_of(container: dict | list) -> Any:
    return container.values() if type(container) is dict else container


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def _msgpack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return encode_ndarray(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as msgpack")


#: Frames of at least this many bytes are decoded with Python's garbage collector paused. A frame
#: of many tiny containers makes millions of objects, and the collector, which runs as they are
#: made, then walks them all again and again: 7.5 s instead of 0.8 s for 16 MiB of empty lists.
GC_PAUSE_BYTES = 1 << 16


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Codec:
    """Turns messages into frame payloads and back, enforcing :class:`Limits`.

    Attributes:
        name: ``"json"`` or ``"msgpack"``.
        binary: whether frames are binary (``bytes``) or text (``str``).
    """

    name: CodecName
    binary: bool

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()

    def encode(self, message: Any) -> str | bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def decode(self, frame: str | bytes) -> Any:
        """The message in ``frame``, checked against :class:`Limits`."""
        self._check_size(frame)
        if len(frame) < GC_PAUSE_BYTES:
            return self._decode(frame, _check_tree)
        with _collector_paused():
            return self._decode(frame, _check_wide_tree)

    def _decode(self, frame: Any, check: Callable[[Any, int, type | None], None]) -> Any:  # pragma: no cover - abstract
        """Decode ``frame`` and check the message with ``check(message, max_depth, refused)``."""
        raise NotImplementedError

    def _check_size(self, frame: str | bytes) -> None:
        if len(frame) > self.limits.max_frame_bytes:
            raise LimitExceeded(f"frame of {len(frame)} bytes, limit is {self.limits.max_frame_bytes}")


def _nulls(value: Any) -> Any:
    """``value`` with every non-finite float (numpy arrays included) as ``None``."""
    if isinstance(value, float) or isinstance(value, np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulls(v) for v in value]
    if isinstance(value, np.ndarray):
        return _nulls(value.tolist())
    return value


#: A JSON string, escapes included (what a bracket inside one is part of).
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_STRING_BYTES = re.compile(rb'"(?:[^"\\]|\\.)*"')


def check_json_containers(text: str | bytes, max_containers: int) -> None:
    """Refuse JSON ``text`` of more than ``max_containers`` lists and objects, before it is parsed.

    Each container opens with a bracket: a text with no more brackets than the
    limit is let through at the cost of two counts in C; only one with more has
    its strings taken out (a bracket in a string opens nothing) and is counted
    again. 60 MiB of ``[[],[],...]`` would otherwise make 30 million lists
    (1.6 GB) before any check could see them.

    Raises:
        LimitExceeded: more than ``max_containers`` lists and objects.
    """
    if isinstance(text, str):
        if text.count("{") + text.count("[") <= max_containers:
            return
        bare = _JSON_STRING.sub("", text)
        count = bare.count("{") + bare.count("[")
    else:
        if text.count(b"{") + text.count(b"[") <= max_containers:
            return
        bare_bytes = _JSON_STRING_BYTES.sub(b"", text)
        count = bare_bytes.count(b"{") + bare_bytes.count(b"[")
    if count > max_containers:
        raise LimitExceeded(f"message of {count} lists and objects, limit is {max_containers} (Limits.max_json_containers)")


class JsonCodec(Codec):
    """JSON text frames, as every stock OpenEnv server speaks.

    numpy arrays and scalars are encoded as lists and numbers. Non-finite floats
    are written as ``NaN``/``Infinity``, which Python's ``json`` (and so the stock
    server) reads back; with ``finite=True`` (a server's replies) they are
    ``null``, as the stock server writes them (strict JSON).
    """

    name: CodecName = "json"
    binary = False

    def __init__(self, limits: Limits | None = None, *, finite: bool = False) -> None:
        super().__init__(limits)
        self.finite = finite

    def encode(self, message: Any) -> str:
        """``message`` as JSON text, non-ASCII as itself (UTF-8 on the wire: ``é`` is 2 bytes, not the 6 of ``\\u00e9``).

        Text with lone surrogates (``os.fsdecode`` of undecodable bytes), which
        UTF-8 cannot carry, is written with ``\\u`` escapes instead, as JSON allows.
        """
        text = self._dumps(message, False)
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                text = self._dumps(message, True)
        return text

    def _dumps(self, message: Any, ascii: bool) -> str:
        if not self.finite:
            return json.dumps(message, ensure_ascii=ascii, separators=(",", ":"), default=_json_default)
        try:
            return json.dumps(message, ensure_ascii=ascii, separators=(",", ":"), default=_json_default, allow_nan=False)
        except ValueError:  # a non-finite float somewhere: null, as the stock server writes it
            return json.dumps(_nulls(message), ensure_ascii=ascii, separators=(",", ":"), default=_json_default, allow_nan=False)

    def _decode(self, frame: str | bytes, check: Callable[[Any, int, type | None], None]) -> Any:
        check_json_containers(frame, self.limits.max_json_containers)
        try:
            message = json.loads(frame)
        except RecursionError:
            raise LimitExceeded(f"message nests deeper than {self.limits.max_depth} levels") from None
        except (ValueError, TypeError) as exc:
            raise ProtocolError(f"invalid JSON: {exc}") from None
        max_depth = self.limits.max_depth
        if type(message) is dict or type(message) is list:
            # Each level opens with a bracket: a frame with no more brackets than
            # max_depth (those in strings included) cannot nest deeper. Counted in C.
            brackets = frame.count("{") + frame.count("[") if isinstance(frame, str) else frame.count(b"{") + frame.count(b"[")
            if brackets > max_depth:
                check(message, max_depth, None)
        return message


class MsgpackCodec(Codec):
    """msgpack binary frames with numpy arrays as raw bytes (ext type 1)."""

    name: CodecName = "msgpack"
    binary = True

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__(limits)
        # Strings with lone surrogates (os.fsdecode of a non-UTF-8 file name, say) travel as JSON
        # carries them ("\ud800"): as their surrogatepass bytes, read back the same way.
        self._packer = msgpack.Packer(default=_msgpack_default, use_bin_type=True, autoreset=True, unicode_errors="surrogatepass")
        limits = self.limits
        headers: dict[bytes, tuple] = {}

        def ext_hook(code: int, data: bytes) -> Any:
            if code == NDARRAY_EXT:
                return decode_ndarray(data, limits, headers)
            raise ProtocolError(f"unknown msgpack ext type {code}")

        self._ext_hook = ext_hook

    def encode(self, message: Any) -> bytes:
        return self._packer.pack(message)

    def decode(self, frame: str | bytes) -> Any:
        if isinstance(frame, str):
            raise ProtocolError("expected a binary frame, got text")
        return super().decode(frame)

    def _decode(self, frame: bytes, check: Callable[[Any, int, type | None], None]) -> Any:
        hooks: dict[str, Callable[[Any], Any]] = {}
        limit = self.limits.max_containers
        if len(frame) > limit:  # (a container takes a byte at least: a shorter frame holds few enough)
            left = [limit]

            def counted(container: Any) -> Any:
                left[0] -= 1
                if left[0] < 0:
                    raise LimitExceeded(f"message of more than {limit} lists and maps, limit is {limit}")
                return container

            hooks = {"list_hook": counted, "object_hook": counted}
        try:
            message = msgpack.unpackb(
                frame,
                ext_hook=self._ext_hook,
                raw=False,
                unicode_errors="surrogatepass",
                strict_map_key=True,
                use_list=True,
                **hooks,
            )
        except ProtocolError:
            raise
        except msgpack.StackError:
            raise LimitExceeded(f"message nests deeper than {self.limits.max_depth} levels") from None
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ProtocolError(f"invalid msgpack: {exc}") from None
        # msgpack decodes ext type -1 (timestamp) itself, without the ext hook; no ext type but 1 is allowed.
        check(message, self.limits.max_depth, msgpack.Timestamp)
        return message


def make_codec(name: CodecName, limits: Limits | None = None) -> Codec:
    """The codec called ``name`` (``"json"`` or ``"msgpack"``)."""
    if name == "json":
        return JsonCodec(limits)
    if name == "msgpack":
        return MsgpackCodec(limits)
    raise ValueError(f"unknown codec {name!r}")
