"""Reading a request's inputs strictly: each bad one is a 400 naming its field.

Owns `Params` (a request's query parameters, and the `X-Dledger-*` headers that may
stand for them: `key` is `?key=` or `X-Dledger-Key`), `topic_name`, `msg_id_of`,
`json_body` and its fields (`json_fields`, `json_int`, `json_str`, `json_bool`), and
the CSRF rule of state-changing requests (`require_api_content`).
Invariants: every text is UTF-8 (else 400 naming the field), every integer a
decimal in its range; a query parameter a handler does not name is refused, so a
typo (`?delay=3`) never passes silently; nothing here does I/O.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any

from dledger_commitlog.console.http import ApiError, Request
from store.errors import InvalidMessage
from store.message import check_name

_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}")
_INT = re.compile(r"-?[0-9]{1,19}")
# A form can post these cross-site without a preflight; the API never takes them.
_API_TYPES = (b"application/json", b"application/octet-stream")
API_HEADER = "x-dledger-request"  # any value: a cross-site form cannot set a header


def bad(field: str, message: str) -> ApiError:
    return ApiError(400, "invalid_argument", message, field)


def require_api_content(request: Request) -> None:
    """Refuse a state-changing request a cross-site form could send (CSRF): it must say
    `Content-Type: application/json` or `application/octet-stream`, or carry the
    `X-Dledger-Request` header (which needs a CORS preflight the console never grants)."""
    if request.header(API_HEADER) is not None:
        return
    kind = (request.header("content-type") or b"").split(b";", 1)[0].strip().lower()
    if kind not in _API_TYPES:
        raise ApiError(
            415,
            "unsupported_media_type",
            "send Content-Type: application/json or application/octet-stream "
            "(or the X-Dledger-Request header)",
            "content-type",
        )


class Params:
    """A request's named inputs: query parameters, else the `X-Dledger-<Name>` headers
    (`delay_level` <-> `X-Dledger-Delay-Level`)."""

    def __init__(self, request: Request, allowed: Iterable[str]) -> None:
        self.request = request
        self.allowed = frozenset(allowed)
        unknown = sorted(request.query_names() - self.allowed)
        if unknown:
            raise bad(unknown[0], f"unknown parameter {unknown[0]!r}")
        # Each allowed name's values, query first, in one pass over query and headers.
        self._values: dict[str, list[bytes]] = {}
        for name, value in request.query:
            self._values.setdefault(name, []).append(value)
        for key, value in request.headers:
            if key.startswith(b"x-dledger-"):
                carried = _header_names(self.allowed).get(key)
                if carried is not None:
                    self._values.setdefault(carried, []).append(value)

    def _raw(self, name: str) -> list[bytes]:
        if name not in self.allowed:  # a handler's mistake, not the caller's
            raise KeyError(f"{name!r} is not among the parameters this request takes")
        return self._values.get(name, [])

    def strings(self, name: str) -> list[str]:
        out = []
        for raw in self._raw(name):
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise bad(name, f"{name} is not valid UTF-8") from None
        return out

    def string(self, name: str, default: str = "") -> str:
        values = self.strings(name)
        if len(values) > 1:
            raise bad(name, f"{name} given {len(values)} times; give it once")
        return values[0] if values else default

    def integer(self, name: str, default: int, low: int = 0, high: int = 2**63 - 1) -> int:
        text = self.string(name)
        if not text:
            return default
        if _INT.fullmatch(text) is None:
            raise bad(name, f"{name} must be an integer, not {text[:40]!r}")
        value = int(text)
        if not low <= value <= high:
            raise bad(name, f"{name} must be in [{low}, {high}], not {value}")
        return value

    def optional_integer(self, name: str, low: int = 0, high: int = 2**31 - 1) -> int | None:
        return self.integer(name, -1, low, high) if self.string(name) else None

    def flag(self, name: str) -> bool:
        text = self.string(name).lower()
        if text in ("", "0", "false", "no"):
            return False
        if text in ("1", "true", "yes"):
            return True
        raise bad(name, f"{name} must be 1 or 0, not {text[:20]!r}")

    def properties(self, name: str = "property") -> dict[str, str]:
        """`NAME=VALUE` pairs (the parameter or header repeated)."""
        out: dict[str, str] = {}
        for text in self.strings(name):
            key, sep, value = text.partition("=")
            if not sep or not key:
                raise bad(name, f"{name} must be NAME=VALUE, not {text[:40]!r}")
            out[key] = value
        return out


@functools.lru_cache(maxsize=64)
def _header_names(allowed: frozenset[str]) -> dict[bytes, str]:
    """The header that carries each of `allowed` (`delay_level` <- `x-dledger-delay-level`)."""
    return {("x-dledger-" + name.replace("_", "-")).encode(): name for name in allowed}


def _checked_name(text: str, what: str) -> str:
    """`text` as a name of `what` ("topic", "group"); else 400 naming `what`."""
    try:
        check_name(text, what)
    except InvalidMessage as exc:
        raise bad(what, str(exc)) from None
    return text


def topic_name(text: str) -> str:
    """A topic from the path (400 naming `topic` if it is no topic name)."""
    return _checked_name(text, "topic")


def group_name(text: str) -> str:
    """A consumer group from the path (400 naming `group` if it is no group name)."""
    return _checked_name(text, "group")


def msg_id_of(text: str) -> str:
    if _MSG_ID.fullmatch(text) is None:
        raise bad("msg_id", f"a message id is 32 hex digits, not {text[:40]!r}")
    return text.upper()


def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (400 naming `body` if it is not one)."""
    if not request.body.strip():
        return {}
    try:
        doc = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise bad("body", "the body is not JSON") from None
    if not isinstance(doc, dict):
        raise bad("body", "the body must be a JSON object")
    return doc


def json_fields(request: Request, allowed: frozenset[str]) -> dict[str, Any]:
    """The request's JSON object, refusing a field not in `allowed` (400 naming it)."""
    doc = json_body(request)
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise bad(unknown[0], f"unknown field {unknown[0]!r}")
    return doc


def json_bool(doc: dict[str, Any], name: str, default: bool = False) -> bool:
    value = doc.get(name, default)
    if not isinstance(value, bool):
        raise bad(name, f"{name} must be true or false")
    return value


def json_int(doc: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = doc.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(name, f"{name} must be an integer in [{low}, {high}]")
    return value


def json_str(doc: dict[str, Any], name: str, default: str = "") -> str:
    value = doc.get(name, default)
    if not isinstance(value, str):
        raise bad(name, f"{name} must be a string")
    return value
