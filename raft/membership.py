"""STUB (i22-ops): the membership types the lead's Raft core defines (i22-core).

Owns `Member`, one member of the group as its configuration entries name it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Member:
    id: int
    raft: str = ""  # HOST:PORT of its Raft port
    client: str = ""  # HOST:PORT of its client port
    learner: bool = False
