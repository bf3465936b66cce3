"""The one canonical msgpack encoding of wire messages (frame bodies; framing is `protocol.framing`).

A frame body is a msgpack array:

    [kind: str, body: array]                    for control messages
    [kind: str, body: array, signature: bin]    for `Signed` messages (kind has SIGNED = True)

`body` lists the dataclass fields in declaration order; a nested `PeerInfo` is itself an array of its
fields. Optional fields (those with a default, all at the end) are left off the end of the array while they
hold their default, so a message that does not use a newer field encodes as it did before the field was
added; a decoder fills them in. A signed body whose last field holds its default is refused (it has one
encoding, the shorter one). No maps, no floats, no nil, no ext types anywhere. Ints are unsigned 64-bit; text is msgpack str
(UTF-8), binary is msgpack bin (`use_bin_type=True`), so the two never mix.

Canonical: every value has exactly one encoding (msgpack's shortest form, which is what msgpack-python
emits). `decode` re-encodes what it parsed and refuses the input unless the bytes are identical, so
`encode(decode(x)) == x` for every accepted `x`, and a signed body has exactly one byte string to sign.

Errors: `decode` raises only `RemoteProtocolError` (MALFORMED, TRUNCATED, BAD_SCHEMA);
`encode` raises `LocalProtocolError` when handed a message that violates its own schema.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import msgpack

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.messages import DEFAULT_MAX_LEN, DOMAIN, KINDS, AnyMessage, Message, PeerInfo, Signed, Size

U64_MAX = 2**64 - 1


class _SchemaError(Exception):
    """Internal: a value does not fit the schema. Becomes Local- or RemoteProtocolError at the edge."""


# (value, path, local) -> python value. local=True: checking a caller's object before encoding (nested
# structs must be dataclass instances); local=False: checking decoded wire data (nested structs are arrays).
Check = Callable[[Any, str, bool], Any]


def _check_int(value: Any, path: str, local: bool = False) -> int:
    if type(value) is not int or not 0 <= value <= U64_MAX:
        shown = "out of range" if type(value) is int else type(value).__name__
        raise _SchemaError(f"{path}: expected unsigned 64-bit int, got {shown}")
    return value


def _sized(check_type: type, size: Size) -> Check:
    def check(value: Any, path: str, local: bool = False) -> Any:
        if type(value) is not check_type:
            raise _SchemaError(f"{path}: expected {check_type.__name__}, got {type(value).__name__}")
        if check_type is str:
            try:
                n = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                raise _SchemaError(f"{path}: not encodable as UTF-8") from None
        else:
            n = len(value)
        if not size.lo <= n <= size.hi:
            raise _SchemaError(f"{path}: length {n} outside [{size.lo}, {size.hi}]")
        return value

    return check


def _compile(tp: Any, size: Size | None = None) -> tuple[Check, Callable[[Any], Any]]:
    """Turn a field annotation into (check, to_wire). `check` validates and returns the Python value."""
    if typing.get_origin(tp) is typing.Annotated:
        inner, *extras = typing.get_args(tp)
        sizes = [e for e in extras if isinstance(e, Size)]
        return _compile(inner, sizes[0] if sizes else size)
    size = size or Size(0, DEFAULT_MAX_LEN)
    if tp is int:
        return _check_int, _identity
    if tp in (str, bytes):
        return _sized(tp, size), _identity
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            item_check, item_wire = _compile(args[0])
            length = size

            def check_seq(value: Any, path: str, local: bool = False) -> tuple:
                if type(value) is not tuple:
                    raise _SchemaError(f"{path}: expected array, got {type(value).__name__}")
                if not length.lo <= len(value) <= length.hi:
                    raise _SchemaError(f"{path}: {len(value)} items outside [{length.lo}, {length.hi}]")
                return tuple(item_check(v, f"{path}[{i}]", local) for i, v in enumerate(value))

            return check_seq, lambda v: [item_wire(x) for x in v]
        parts = [_compile(a) for a in args]

        def check_tuple(value: Any, path: str, local: bool = False) -> tuple:
            if type(value) is not tuple or len(value) != len(parts):
                raise _SchemaError(f"{path}: expected array of {len(parts)}")
            checks = [c for c, _ in parts]
            return tuple(c(v, f"{path}[{i}]", local) for i, (c, v) in enumerate(zip(checks, value, strict=True)))

        return check_tuple, lambda v: [w(x) for (_, w), x in zip(parts, v, strict=True)]
    if dataclasses.is_dataclass(tp):
        return _compile_struct(tp)
    raise TypeError(f"no wire encoding for annotation {tp!r}")  # import-time bug in messages.py


def _identity(value: Any) -> Any:
    return value


def _compile_struct(cls: type) -> tuple[Check, Callable[[Any], Any]]:
    hints = typing.get_type_hints(cls, include_extras=True)
    declared = dataclasses.fields(cls)
    fields = [(f.name, *_compile(hints[f.name])) for f in declared]
    defaults = [f.default for f in declared]
    required = max((i + 1 for i, f in enumerate(declared) if f.default is dataclasses.MISSING), default=0)
    signed = getattr(cls, "SIGNED", False)
    shape = f"{required}" if required == len(fields) else f"{required} to {len(fields)}"

    def check(value: Any, path: str, local: bool = False) -> Any:
        if local:  # the caller's object: check every field in place
            if type(value) is not cls:
                raise _SchemaError(f"{path}: expected {cls.__name__}, got {type(value).__name__}")
            for name, c, _ in fields:
                c(getattr(value, name), f"{path}.{name}", True)
            return value
        if type(value) is not tuple or not required <= len(value) <= len(fields):
            raise _SchemaError(f"{path}: expected array of {shape} fields")
        if signed and len(value) > required and value[-1] == defaults[len(value) - 1]:
            raise _SchemaError(f"{path}: optional field {fields[len(value) - 1][0]} sent at its default")
        return cls(*(c(v, f"{path}.{name}") for (name, c, _), v in zip(fields, value, strict=False)))

    def to_wire(value: Any) -> list:
        out = [w(getattr(value, name)) for name, _, w in fields]
        while len(out) > required and getattr(value, fields[len(out) - 1][0]) == defaults[len(out) - 1]:
            out.pop()
        return out

    return check, to_wire


_STRUCTS: dict[type, tuple[Check, Callable[[Any], Any]]] = {
    cls: _compile_struct(cls) for cls in (*KINDS.values(), PeerInfo)
}
_SIGNATURE_CHECK = _sized(bytes, Size(64, 64))


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _local_body(body: Message) -> list:
    """Schema-check a local message and return its wire array. Raises LocalProtocolError."""
    entry = _STRUCTS.get(type(body))
    if entry is None or type(body) is PeerInfo:
        raise LocalProtocolError(f"not a wire message: {type(body).__name__}")
    check, to_wire = entry
    try:
        check(body, body.KIND, True)
    except _SchemaError as exc:
        raise LocalProtocolError(f"invalid {type(body).__name__}: {exc}") from None
    return to_wire(body)


def encode_body(body: Message) -> bytes:
    """Canonical encoding of a message's field array (what signatures cover, after the prefix)."""
    return _pack(_local_body(body))


def signing_input(body: Message) -> bytes:
    """`DOMAIN + b":" + KIND + b":" + encode_body(body)`: the bytes an origin signs (see PROTOCOL.md)."""
    return DOMAIN + b":" + body.KIND.encode("ascii") + b":" + encode_body(body)


def encode(message: AnyMessage) -> bytes:
    """Canonical frame body of a control message or a `Signed` message. Raises LocalProtocolError if
    the message violates its schema (wrong types, lists instead of tuples, lengths out of bounds), or
    if a signed kind is passed without its `Signed` wrapper."""
    if isinstance(message, Signed):
        wire_body = _local_body(message.body)
        if not message.body.SIGNED:
            raise LocalProtocolError(f"{message.body.KIND} is not a signed kind")
        try:
            _SIGNATURE_CHECK(message.signature, "signature", True)
        except _SchemaError as exc:
            raise LocalProtocolError(str(exc)) from None
        return _pack([message.body.KIND, wire_body, message.signature])
    wire_body = _local_body(message)
    if message.SIGNED:
        raise LocalProtocolError(f"{message.KIND} must be sent as Signed(body, signature)")
    return _pack([message.KIND, wire_body])


_DECODE_ERRORS = (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException)


def decode(data: bytes) -> AnyMessage:
    """Parse a frame body. Refuses (RemoteProtocolError) anything that is not the canonical encoding
    of a schema-valid message: TRUNCATED if the bytes end early, MALFORMED for bad or non-canonical
    msgpack, BAD_SCHEMA for unknown kinds or wrong field types/lengths. Never raises anything else."""
    if not isinstance(data, bytes):
        data = bytes(data)  # bytearray / memoryview from a transport buffer
    # max_buffer_size also caps every declared array/str/bin length at len(data): no over-allocation.
    unpacker = msgpack.Unpacker(
        raw=False, use_list=False, strict_map_key=True, timestamp=0, max_buffer_size=max(len(data), 1)
    )
    try:
        unpacker.feed(data)
        obj = unpacker.unpack()
    except msgpack.OutOfData:
        raise RemoteProtocolError(Reason.TRUNCATED, "frame body ends inside a msgpack value") from None
    except _DECODE_ERRORS as exc:
        raise RemoteProtocolError(Reason.MALFORMED, f"not msgpack: {type(exc).__name__}") from None
    if unpacker.tell() != len(data):
        raise RemoteProtocolError(Reason.MALFORMED, "trailing bytes after the message")
    try:
        canonical = _pack(obj) == data
    except _DECODE_ERRORS:
        canonical = False
    if not canonical:
        raise RemoteProtocolError(Reason.MALFORMED, "non-canonical msgpack encoding")
    if type(obj) is not tuple or len(obj) not in (2, 3) or type(obj[0]) is not str:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, "frame body is not [kind, body(, signature)]")
    cls = KINDS.get(obj[0])
    if cls is None:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, f"unknown kind {obj[0][:32]!r}")
    if len(obj) != (3 if cls.SIGNED else 2):
        raise RemoteProtocolError(Reason.BAD_SCHEMA, f"{cls.KIND}: signed kinds, and only they, carry a signature")
    check, _ = _STRUCTS[cls]
    try:
        body = check(obj[1], cls.KIND)
        if not cls.SIGNED:
            return body
        return Signed(body, _SIGNATURE_CHECK(obj[2], "signature"))
    except _SchemaError as exc:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, str(exc)) from None


def signed_message_id(data: bytes) -> bytes | None:
    """The message id of a frame body that decodes to a signed (gossiped) message, else None."""
    try:
        message = decode(data)
    except RemoteProtocolError:
        return None
    return message.message_id if isinstance(message, Signed) else None
