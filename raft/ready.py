"""The driver contract: what `RaftCore.ready()` hands out and in which order
it must be carried out. Plain data; see `Ready`."""

from __future__ import annotations

from dataclasses import dataclass

from raft.messages import Message
from raft.types import Entry, HardState, ReadState


@dataclass(frozen=True, slots=True)
class Ready:
    """Work for the driver, to be done in this order:

    1. persist `entries` (append them to the `LogStorage` the core reads;
       they may overwrite a suffix) and then `hard_state` (if not None), and
       make both durable;
    2. send `messages` (only now: they may promise what step 1 stored);
    3. apply `committed_entries` to the state machine, and hand `read_states`
       to waiting readers (serve each once applied >= its index);
    4. call `advance(ready)`.

    Only one Ready is outstanding at a time; `tick`, `step`, `propose` and the
    other inputs may be called between `ready()` and `advance()`.
    """

    entries: tuple[Entry, ...]
    hard_state: HardState | None
    messages: tuple[Message, ...]
    committed_entries: tuple[Entry, ...]
    read_states: tuple[ReadState, ...]
