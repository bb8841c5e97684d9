"""HTTP/2 frames and the gRPC conventions on them (RFC 9113, RFC 7541, gRPC's PROTOCOL-HTTP2).

Owns the byte layouts: the 9-byte frame header, the control frames (SETTINGS,
PING, WINDOW_UPDATE, RST_STREAM, GOAWAY), the header blocks this side sends
(HPACK literals without indexing: stateless, so nothing here keeps a dynamic table
the peer must mirror; decoding the peer's blocks is `hpack.Decoder`'s), the gRPC
message prefix, `grpc-timeout` and `grpc-message` encodings, and the status codes.
Nothing here does I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from urllib.parse import quote, unquote

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
# Flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Settings
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6
# Error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = (1 << 31) - 1
MAX_FRAME_LIMIT = (1 << 24) - 1

HEADER = struct.Struct(">BHBBI")  # length (high byte, low 16 bits), type, flags, stream id
MESSAGE_PREFIX = struct.Struct(">BI")  # gRPC: compressed flag, length
_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_SETTING = struct.Struct(">HI")

# gRPC status codes (the numbers of grpc.StatusCode)
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
NOT_FOUND, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 5, 8, 12, 13, 14
STATUS_NAMES = (
    *("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND"),
    *("ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"),
    *("ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"),
    "UNAUTHENTICATED",
)


def frame_header(length: int, ftype: int, flags: int, stream_id: int) -> bytes:
    return HEADER.pack(length >> 16, length & 0xFFFF, ftype, flags, stream_id)


def settings_frame(settings: Iterable[tuple[int, int]]) -> bytes:
    body = b"".join(_SETTING.pack(k, v) for k, v in settings)
    return frame_header(len(body), SETTINGS, 0, 0) + body


SETTINGS_ACK = frame_header(0, SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame_header(4, WINDOW_UPDATE, 0, stream_id) + _U32.pack(increment)


def ping(payload: bytes, ack: bool = False) -> bytes:
    return frame_header(8, PING, ACK if ack else 0, 0) + payload


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame_header(4, RST_STREAM, 0, stream_id) + _U32.pack(code)


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    body = _U32X2.pack(last_stream_id, code) + debug
    return frame_header(len(body), GOAWAY, 0, 0) + body


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload) - 5, 6)]


def u32(payload: bytes, at: int = 0) -> int:
    value: int = _U32.unpack_from(payload, at)[0]
    return value


# -- header blocks (HPACK, RFC 7541) ------------------------------------------------


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """HPACK's integer with an N-bit prefix, OR-ed into `first`'s high bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _integer(len(raw), 7, 0) + raw


# Static-table indexes (RFC 7541 appendix A) of the fields sent most.
_INDEXED = {
    (":method", "POST"): 3,
    (":scheme", "http"): 6,
    (":scheme", "https"): 7,
    (":status", "200"): 8,
}
_NAME_INDEX = {":authority": 1, ":path": 4, ":status": 8, "content-type": 31, "user-agent": 58}


def encode_headers(headers: Iterable[tuple[str, str]]) -> bytes:
    """A header block of literals without indexing (names from the static table where
    it has them): the peer's decoder keeps no state for it."""
    out: list[bytes] = []
    for name, value in headers:
        index = _INDEXED.get((name, value))
        if index is not None:
            out.append(bytes((0x80 | index,)))
            continue
        name_index = _NAME_INDEX.get(name)
        if name_index is not None:
            out.append(_integer(name_index, 4, 0x00) + _string(value))
        else:
            out.append(b"\x00" + _string(name) + _string(value))
    return b"".join(out)


# -- gRPC ---------------------------------------------------------------------------

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(text: str) -> float | None:
    """Seconds of a `grpc-timeout` value (None if it does not parse)."""
    if not 2 <= len(text) <= 9 or not text[:-1].isdigit() or text[-1] not in _TIMEOUT_UNITS:
        return None
    return int(text[:-1]) * _TIMEOUT_UNITS[text[-1]]


def format_timeout(seconds: float) -> str:
    """A `grpc-timeout` value for `seconds` (at most 8 digits, rounded up)."""
    micros = max(1, int(seconds * 1e6 + 0.999))
    if micros < 100_000_000:
        return f"{micros}u"
    millis = (micros + 999) // 1000
    if millis < 100_000_000:
        return f"{millis}m"
    return f"{min(99_999_999, (millis + 999) // 1000)}S"


def encode_message_text(text: str) -> str:
    """`grpc-message`: percent-encoded UTF-8 (printable ASCII but '%' left as is)."""
    return quote(text, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")


def decode_message_text(text: str) -> str:
    return unquote(text, errors="replace")


def status_name(code: int) -> str:
    return STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES) else "UNKNOWN"


def status_code(name: str) -> int:
    return STATUS_NAMES.index(name)


def prefixed(message: bytes) -> bytes:
    """A gRPC length-prefixed message (not compressed)."""
    return MESSAGE_PREFIX.pack(0, len(message)) + message
