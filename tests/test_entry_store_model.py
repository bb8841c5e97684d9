"""Property test: random append / truncate / delete-prefix / reopen against a model."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dledger_commitlog.log.entry_store import EntryStore
from raft.types import Entry

SEG = 2048


class EntryStoreMachine(RuleBasedStateMachine):
    """The model is a dict index -> (term, body) plus the first index."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="entry-model-"))
        self.store = self._open()
        self.model: dict[int, tuple[int, bytes]] = {}
        self.first = 1
        self.term = 1
        self.committed = 0

    def _open(self) -> EntryStore:
        return EntryStore(self.dir, data_segment_bytes=SEG, index_segment_bytes=32 * 16)

    @property
    def last(self) -> int:
        return max(self.model, default=self.first - 1)

    @rule(sizes=st.lists(st.integers(0, 700), min_size=1, max_size=8), bump=st.booleans())
    def append(self, sizes: list[int], bump: bool) -> None:
        self.term += bump
        start = self.last + 1
        batch = [Entry(start + k, self.term, bytes([k % 256]) * n) for k, n in enumerate(sizes)]
        self.store.append(batch)
        for e in batch:
            self.model[e.index] = (e.term, e.data)

    @precondition(lambda self: self.last > max(self.first, self.committed))
    @rule(data=st.data())
    def overwrite_suffix(self, data: st.DataObject) -> None:
        at = data.draw(st.integers(max(self.first, self.committed + 1), self.last))
        self.term += 1
        self.store.append([Entry(at, self.term, b"over")])
        for i in [i for i in self.model if i >= at]:
            del self.model[i]
        self.model[at] = (self.term, b"over")

    @precondition(lambda self: self.last > self.first)
    @rule(data=st.data())
    def delete_prefix(self, data: st.DataObject) -> None:
        at = data.draw(st.integers(self.first, self.last))
        new_first = self.store.delete_prefix(at)
        assert self.first <= new_first <= max(at, self.first)
        for i in [i for i in self.model if i < new_first]:
            del self.model[i]
        self.first = new_first

    @rule(flush=st.booleans())
    def reopen(self, flush: bool) -> None:
        self.store.flush()  # a clean close; crashes are covered by the crash tests
        if flush and self.last >= self.first:
            self.store.write_checkpoint(self.last)
            self.committed = self.last
        self.store.close()
        self.store = self._open()

    @invariant()
    def reads_equal_the_model(self) -> None:
        s = self.store
        assert (s.first_index(), s.last_index()) == (self.first, self.last)
        if self.last >= self.first:
            got = s.entries(self.first, self.last + 1, 1 << 30)
            assert [(e.index, e.term, e.data) for e in got] == [
                (i, *self.model[i]) for i in range(self.first, self.last + 1)
            ]
            assert s.term(self.last) == self.model[self.last][0]

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


EntryStoreMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
TestEntryStoreModel = EntryStoreMachine.TestCase
