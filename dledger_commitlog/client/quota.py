"""`Quota`: the `max_messages` that consumers run together share (`async_consumer.run_together`,
one consumer per shard of a multi-shard cluster; a lone consumer has its own).

Invariant: the deliveries taken (being handled, or handled) never exceed the limit;
one taken and then not handled after all (an orderly run that stopped, a queue that
moved) is given back.
"""

from __future__ import annotations


class Quota:
    """The `max_messages` of consumers run together (`run_together`: one per
    shard): the handler calls they may make between them (0: no limit). Each fetch
    asks for the room left; when fetches running at once bring more, what the quota
    cannot `take` is never handled nor acked, and the server hands it out again: at
    once when the consumer leaves its group, as it does at the end, else after the
    ack wait (an orderly queue waits that long too)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0  # deliveries being handled or handled
        self.handled = 0  # handler calls ended

    def room(self, count: int) -> int:
        """How many of `count` messages a fetch may ask for now."""
        return min(count, self.limit - self.taken) if self.limit else count

    def take(self, count: int) -> int:
        """How many of `count` deliveries may be handled (they are taken)."""
        took = self.room(count)
        self.taken += took
        return took

    def give_back(self) -> None:
        """A delivery taken and not handled after all (it comes again)."""
        self.taken -= 1

    def reached(self) -> bool:
        return bool(self.limit) and self.handled >= self.limit
