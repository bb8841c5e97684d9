"""What every chaos client saw: a history of invocations and their outcomes.

Each client operation is an `invoke` event followed by exactly one completion:
`ok` (it happened; a put's offset, a read's result), `fail` (it definitely did
not happen) or `unknown` (it may have happened: a put whose outcome was lost).
An operation still open when the history is read counts as `unknown`. Fault
injections are `info` events of process -1 (the "nemesis"). Times are seconds
since the run started, on the monotonic clock, so they compare across threads.
Invariants: events only append; one lock orders them, so an operation's
completion always follows its invocation; op ids are dense from 0.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

NEMESIS = -1
INVOKE, OK, FAIL, UNKNOWN, INFO = "invoke", "ok", "fail", "unknown", "info"


@dataclass(frozen=True, slots=True)
class Event:
    op: int  # the operation (invocation and completion share it)
    process: int  # the client; NEMESIS for faults
    type: str  # invoke | ok | fail | unknown | info
    f: str  # put | read | the fault's name
    time: float  # seconds since the run started
    key: str = ""  # the put's UNIQ_KEY; for a read, the key found
    offset: int = -1  # the put's acknowledged offset; the offset read
    crc: int = 0  # crc32 of the body put or read
    detail: str = ""  # the error, or the fault's description


@dataclass(frozen=True, slots=True)
class Operation:
    """An invocation with its completion (type `unknown` and end -1.0 if none arrived)."""

    op: int
    process: int
    f: str
    key: str
    start: float
    type: str
    end: float
    offset: int
    crc: int
    detail: str


class History:
    """A thread-safe, append-only history (see the module doc)."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._open: dict[int, Event] = {}
        self._next_op = 0

    def now(self) -> float:
        return time.monotonic() - self.started

    def invoke(self, process: int, f: str, key: str = "", offset: int = -1, crc: int = 0) -> int:
        with self._lock:
            op = self._next_op
            self._next_op += 1
            event = Event(op, process, INVOKE, f, self.now(), key, offset, crc)
            self._events.append(event)
            self._open[op] = event
            return op

    def complete(
        self,
        op: int,
        type_: str,
        *,
        key: str | None = None,
        offset: int | None = None,
        crc: int | None = None,
        detail: str = "",
    ) -> None:
        if type_ not in (OK, FAIL, UNKNOWN):
            raise ValueError(f"a completion is ok, fail or unknown, not {type_!r}")
        with self._lock:
            inv = self._open.pop(op)  # KeyError: completed twice or never invoked
            self._events.append(
                Event(
                    op,
                    inv.process,
                    type_,
                    inv.f,
                    self.now(),
                    inv.key if key is None else key,
                    inv.offset if offset is None else offset,
                    inv.crc if crc is None else crc,
                    detail,
                )
            )

    def info(self, f: str, detail: str = "") -> float:
        """Record a fault (or any nemesis step); returns its time."""
        with self._lock:
            op = self._next_op
            self._next_op += 1
            at = self.now()
            self._events.append(Event(op, NEMESIS, INFO, f, at, detail=detail))
            return at

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def operations(self, f: str | None = None) -> list[Operation]:
        """Client operations (of kind `f` if given), in invocation order."""
        with self._lock:
            events = list(self._events)
        done = {e.op: e for e in events if e.type in (OK, FAIL, UNKNOWN)}
        out = []
        for inv in events:
            if inv.type != INVOKE or (f is not None and inv.f != f):
                continue
            c = done.get(inv.op)
            if c is None:
                out.append(
                    Operation(
                        inv.op,
                        inv.process,
                        inv.f,
                        inv.key,
                        inv.time,
                        UNKNOWN,
                        -1.0,
                        inv.offset,
                        inv.crc,
                        "still open",
                    )
                )
            else:
                out.append(
                    Operation(
                        inv.op,
                        inv.process,
                        inv.f,
                        c.key,
                        inv.time,
                        c.type,
                        c.time,
                        c.offset,
                        c.crc,
                        c.detail,
                    )
                )
        return out

    def faults(self) -> list[Event]:
        return [e for e in self.events if e.type == INFO]

    def write_jsonl(self, path: str | Path) -> None:
        with Path(path).open("w") as out:
            for e in self.events:
                out.write(json.dumps(asdict(e), separators=(",", ":")) + "\n")
