"""Data-driven Raft scenarios: a script of commands in, a readable trace out.

Owns: the format of tests/testdata/*.txt (after etcd-io/raft's interaction
tests) and `run_script`, which runs one script against real `RaftCore`s over
the project's in-memory storage (the hand-driven `Cluster` of
tests/sim/harness.py, which persists every Ready before queuing its messages).
tests/test_raft_traces.py compares the trace with the expected output in the
file, or rewrites it (`pytest --rewrite`).

A script is a sequence of blocks: `#` comment lines, one command, `----`, and
the expected output up to the next blank line. Commands:

  add-nodes N [seed=S] [election-ticks=10 pre-vote=true ...]   Config overrides
  campaign N                    tick follower or candidate N until its election
                                timeout fires
  tick-election N...            tick each node election_ticks times
  tick-heartbeat N...           tick each node heartbeat_ticks times
  propose N DATA...             one entry per DATA, proposed on node N as a batch
  conf-change N add-learner|promote|remove M
                                propose a membership change on node N
  start-node M                  start node M, empty, joining the group (it
                                becomes a member through conf-change)
  compact N [INDEX]             node N's storage drops its log up to INDEX
                                (default: all it applied)
  transfer-leadership from=N to=M
  read-index N CTX
  process-ready N...            persist, send, apply and advance one Ready each
  deliver-msgs [N...] [drop=(N,...)]
                                step the queued messages for N... (default: all),
                                dropping those for the nodes in drop=
  stabilize [N...]              process Readies and deliver until nothing moves
  status N...                   role, term, commit; a leader's view of its peers
  membership N...               the configuration in effect (and, if it is not
                                committed yet, the committed one)
  raft-log N                    node N's log

The trace: one line per message (`1->2 MsgApp term=2 index=3 logterm=1
entries=[2/4 "a"] commit=2`: index/logterm are the entry the append follows; an
entry prints as term/index, a configuration entry with its voters and
learners), a block per Ready in the order the driver carries
it out, and a line whenever a node's role, term or leader changes. An error the
core raises for a command (`NotLeader`, ...) is part of the trace; a mistake in
the script is a `ScriptError`. Every random choice comes from `seed=`.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from raft import (
    AppendEntries,
    AppendResponse,
    Config,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    Message,
    RaftCore,
    RaftError,
    ReadIndexRequest,
    ReadIndexResponse,
    Ready,
    RequestVote,
    Role,
    Snapshot,
    TimeoutNow,
    VoteResponse,
)
from raft.membership import ChangeOp, ConfChange, Member, Membership
from tests.sim.harness import Cluster

SEPARATOR = "----"


class ScriptError(Exception):
    """The script itself is wrong (unknown command, bad argument, bad layout)."""


@dataclass(slots=True)
class Case:
    """One block of a script: its comments, its command and the expected output."""

    line: int  # 1-based line of the command in the file
    comments: list[str]
    command: str
    expected: list[str]


def parse(text: str) -> list[Case]:
    lines = text.splitlines()
    cases: list[Case] = []
    comments: list[str] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        if not line.strip():
            if comments:
                comments.append("")  # a blank line inside a comment block stays
            k += 1
        elif line.startswith("#"):
            comments.append(line)
            k += 1
        else:
            if k + 1 >= len(lines) or lines[k + 1] != SEPARATOR:
                raise ScriptError(f"line {k + 1}: {line!r} is not followed by {SEPARATOR!r}")
            end = k + 2
            while end < len(lines) and lines[end].strip():
                end += 1
            while comments and not comments[-1]:
                comments.pop()
            cases.append(Case(k + 1, comments, line, lines[k + 2 : end]))
            comments = []
            k = end
    if any(comments):
        raise ScriptError("the comment at the end of the file precedes no command")
    return cases


def render(cases: Sequence[Case], outputs: Sequence[Sequence[str]]) -> str:
    """The script with `outputs` as the expected output of each case."""
    blocks = []
    for case, out in zip(cases, outputs, strict=True):
        blocks.append("\n".join([*case.comments, case.command, SEPARATOR, *out]))
    return "\n\n".join(blocks) + "\n"


def run_script(cases: Sequence[Case]) -> list[list[str]]:
    """The trace each command of the script produces, in order."""
    env = TraceEnv()
    return [env.run(case.command) for case in cases]


# --- formatting ---------------------------------------------------------------


def quote(data: bytes) -> str:
    return '"' + data.decode("utf-8", "backslashreplace").replace('"', '\\"') + '"'


def fmt_membership(m: Membership) -> str:
    voters = ",".join(map(str, m.voters))
    learners = ",".join(map(str, m.learners))
    return f"voters=({voters})" + (f" learners=({learners})" if learners else "")


def fmt_entry(e: Entry) -> str:
    if e.kind is EntryKind.NOOP:
        return f"{e.term}/{e.index} noop"
    if e.kind is EntryKind.CONFIG:
        return f"{e.term}/{e.index} conf {fmt_membership(Membership.decode(e.data))}"
    return f"{e.term}/{e.index} {quote(e.data)}"


def fmt_entries(entries: Iterable[Entry]) -> str:
    return ", ".join(map(fmt_entry, entries))


def fmt_message(m: Message) -> str:
    head = f"{m.src}->{m.dst}"
    match m:
        case AppendEntries():
            quiet = " quiet" if m.quiet else ""
            return (
                f"{head} MsgApp term={m.term} index={m.prev_index} logterm={m.prev_term} "
                f"entries=[{fmt_entries(m.entries)}] commit={m.commit}{quiet}"
            )
        case AppendResponse():
            hint = f" reject hint_index={m.hint_index} hint_term={m.hint_term}" if m.reject else ""
            return f"{head} MsgAppResp term={m.term} index={m.index}{hint}"
        case Snapshot():
            data = f" data={quote(m.data)}" if m.data else ""
            return (
                f"{head} MsgSnap term={m.term} index={m.index} logterm={m.log_term} "
                f"commit={m.commit}{data}"
            )
        case Heartbeat():
            ctx = f" ctx={quote(m.ctx)}" if m.ctx else ""
            return f"{head} MsgHeartbeat term={m.term} commit={m.commit}{ctx}"
        case HeartbeatResponse():
            ctx = f" ctx={quote(m.ctx)}" if m.ctx else ""
            no_lead = " nolead" if m.no_lead else ""
            return f"{head} MsgHeartbeatResp term={m.term}{ctx}{no_lead}"
        case RequestVote():
            kind = "MsgPreVote" if m.pre_vote else "MsgVote"
            transfer = " transfer" if m.transfer else ""
            return (
                f"{head} {kind} term={m.term} index={m.last_index} logterm={m.last_term}{transfer}"
            )
        case VoteResponse():
            kind = "MsgPreVoteResp" if m.pre_vote else "MsgVoteResp"
            return f"{head} {kind} term={m.term} {'granted' if m.granted else 'rejected'}"
        case TimeoutNow():
            return f"{head} MsgTimeoutNow term={m.term}"
        case ReadIndexRequest():
            return f"{head} MsgReadIndex term={m.term} ctx={quote(m.ctx)}"
        case ReadIndexResponse():
            return f"{head} MsgReadIndexResp term={m.term} ctx={quote(m.ctx)} index={m.index}"


def fmt_ready(rd: Ready) -> list[str]:
    """A Ready's parts in the order the driver carries them out (raft/ready.py)."""
    out = []
    if rd.snapshot is not None:
        out.append(f"Snapshot index={rd.snapshot.index} term={rd.snapshot.term}")
    if rd.entries:
        out.append(f"Entries: {fmt_entries(rd.entries)}")
    if rd.hard_state is not None:
        hs = rd.hard_state
        vote = "none" if hs.vote is None else hs.vote
        out.append(f"HardState term={hs.term} vote={vote} commit={hs.commit}")
    if rd.messages:
        out.append("Messages:")
        out.extend(map(fmt_message, rd.messages))
    if rd.committed_entries:
        out.append(f"Committed: {fmt_entries(rd.committed_entries)}")
    for rs in rd.read_states:
        out.append(f"ReadState ctx={quote(rs.ctx)} index={rs.index}")
    return out


# --- the environment ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Soft:
    """What a trace reports when it changes: a node's role, term and leader."""

    role: Role
    term: int
    leader: int | None

    @staticmethod
    def of(core: RaftCore) -> Soft:
        return Soft(core.role, core.term, core.leader_id)

    def change(self, node: int, new: Soft) -> str | None:
        if new == self:
            return None
        if (new.role, new.term) != (self.role, self.term):
            lead = f", leader {new.leader}" if new.leader not in (None, node) else ""
            return f"{node} became {new.role.value} at term {new.term}{lead}"
        if new.leader is not None:
            return f"{node} follows leader {new.leader} at term {new.term}"
        return f"{node} lost its leader at term {new.term}"


class TraceEnv:
    def __init__(self) -> None:
        self._cluster: Cluster | None = None
        self._out: list[str] = []

    def run(self, command: str) -> list[str]:
        words = shlex.split(command)
        name, args = words[0], words[1:]
        handler = self._handlers().get(name)
        if handler is None:
            raise ScriptError(f"unknown command {name!r}")
        if name != "add-nodes" and self._cluster is None:
            raise ScriptError(f"{name}: add-nodes first")
        self._out = []
        handler(args)
        return self._out or ["ok"]

    def _handlers(self) -> dict[str, Callable[[list[str]], None]]:
        return {
            "add-nodes": self._add_nodes,
            "campaign": self._campaign,
            "tick-election": lambda a: self._tick_each(a, lambda cfg: cfg.election_ticks),
            "tick-heartbeat": lambda a: self._tick_each(a, lambda cfg: cfg.heartbeat_ticks),
            "propose": self._propose,
            "conf-change": self._conf_change,
            "start-node": self._start_node,
            "compact": self._compact,
            "transfer-leadership": self._transfer_leadership,
            "read-index": self._read_index,
            "process-ready": lambda a: self._each_node(a, self._process_ready, everyone=False),
            "deliver-msgs": self._deliver_msgs,
            "stabilize": self._stabilize,
            "status": lambda a: self._each_node(a, self._status, everyone=True),
            "raft-log": lambda a: self._each_node(a, self._raft_log, everyone=False),
            "membership": lambda a: self._each_node(a, self._membership, everyone=True),
        }

    # --- helpers ---

    @property
    def cluster(self) -> Cluster:
        assert self._cluster is not None
        return self._cluster

    def _print(self, line: str, indent: int = 0) -> None:
        self._out.append(" " * indent + line)

    def _node(self, word: str) -> int:
        if not word.isdigit() or int(word) not in self.cluster.peers:
            raise ScriptError(f"{word!r} is not a node id")
        return int(word)

    def _split(self, args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        positional = [a for a in args if "=" not in a]
        keyed = dict(a.split("=", 1) for a in args if "=" in a)
        return positional, keyed

    def _int(self, key: str, value: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise ScriptError(f"{key}={value}: not a number") from None

    def _ids(self, value: str) -> list[int]:
        """`(1,2)` or `1`: node ids."""
        return [self._node(w) for w in value.strip("()").split(",") if w]

    def _each_node(self, args: Sequence[str], fn: Callable[[int], None], everyone: bool) -> None:
        if not args and not everyone:
            raise ScriptError("which nodes?")
        for i in [self._node(a) for a in args] or self.cluster.peers:
            fn(i)

    def _guarded(self, node: int, indent: int, action: Callable[[], object]) -> None:
        """Run one input of `node`'s core; print the error it raises and what changed."""
        core = self.cluster.core(node)
        before = Soft.of(core)
        try:
            action()
        except RaftError as err:
            self._print(f"error: {type(err).__name__}: {err}", indent)
        change = before.change(node, Soft.of(core))
        if change is not None:
            self._print(change, indent)

    # --- commands ---

    def _add_nodes(self, args: list[str]) -> None:
        if self._cluster is not None:
            raise ScriptError("add-nodes: the cluster exists already")
        positional, keyed = self._split(args)
        if len(positional) != 1 or not positional[0].isdigit():
            raise ScriptError("add-nodes N [seed=S] [config-key=value ...]")
        seed = self._int("seed", keyed.pop("seed", "0"))
        fields = {f.name for f in dataclasses.fields(Config)} - {"id", "peers"}
        overrides: dict[str, Any] = {}
        for key, value in keyed.items():
            field = key.replace("-", "_")
            if field not in fields:
                raise ScriptError(f"add-nodes: {key} is not a Config field")
            words = {"true": True, "false": False, "none": None}
            overrides[field] = words[value] if value in words else self._int(key, value)
        self._cluster = Cluster(int(positional[0]), seed=seed, **overrides)
        cfg = self.cluster.config(1)
        shown = ("election_ticks", "heartbeat_ticks", "pre_vote", "check_quorum")
        settings = " ".join(f"{k.replace('_', '-')}={getattr(cfg, k)}" for k in shown)
        self._print(f"nodes {' '.join(map(str, cfg.peers))}: {settings.lower()}")

    def _campaign(self, args: list[str]) -> None:
        if len(args) != 1:
            raise ScriptError("campaign N")
        node = self._node(args[0])
        core = self.cluster.core(node)
        if core.role in (Role.LEADER, Role.PRE_CANDIDATE):
            # A pre-candidate's new pre-campaign changes neither its role nor its term:
            # nothing would show when it happened (tick-election it instead).
            raise ScriptError(f"campaign: node {node} is a {core.role.value}")
        limit = 2 * self.cluster.config(node).election_ticks
        for ticks in range(1, limit + 1):
            before = Soft.of(core)
            core.tick()
            change = before.change(node, Soft.of(core))
            if change is not None:
                self._print(f"{node} timed out after {ticks} ticks")
                self._print(change)
                return
        self._print(f"{node} did not campaign in {limit} ticks")

    def _tick_each(self, args: list[str], ticks: Callable[[Config], int]) -> None:
        def tick(node: int) -> None:
            for _ in range(ticks(self.cluster.config(node))):
                self._guarded(node, 0, self.cluster.core(node).tick)

        self._each_node(args, tick, everyone=False)

    def _propose(self, args: list[str]) -> None:
        if len(args) < 2:
            raise ScriptError("propose N DATA...")
        node = self._node(args[0])
        data = [a.encode() for a in args[1:]]

        def propose() -> None:
            first, last = self.cluster.core(node).propose(data)
            self._print(f"proposed at {first}" + (f"..{last}" if last > first else ""))

        self._guarded(node, 0, propose)

    def _conf_change(self, args: list[str]) -> None:
        ops = {op.value: op for op in ChangeOp}
        if len(args) != 3 or args[1] not in ops or not args[2].isdigit():
            raise ScriptError("conf-change N add-learner|promote|remove M")
        node, op, target = self._node(args[0]), ops[args[1]], int(args[2])
        member = Member(target) if op is ChangeOp.ADD_LEARNER else None
        change = ConfChange(op, target, member)

        def propose() -> None:
            index = self.cluster.core(node).propose_conf_change(change)
            self._print(f"proposed at {index}")

        self._guarded(node, 0, propose)

    def _start_node(self, args: list[str]) -> None:
        if len(args) != 1 or not args[0].isdigit():
            raise ScriptError("start-node M")
        node = int(args[0])
        if node in self.cluster.peers:
            raise ScriptError(f"start-node: node {node} exists already")
        self.cluster.add_node(node)
        self._print(f"node {node} started, joining the group")

    def _compact(self, args: list[str]) -> None:
        if len(args) not in (1, 2):
            raise ScriptError("compact N [INDEX]")
        node = self._node(args[0])
        applied = self.cluster.core(node).applied
        index = self._int("INDEX", args[1]) if len(args) == 2 else applied
        if not self.cluster.core(node).first_index - 1 <= index <= applied:
            raise ScriptError(f"compact: {index} is not between the log start and {applied}")
        self.cluster.compact(node, index)
        self._print(f"{node}: log starts at {self.cluster.core(node).first_index}")

    def _transfer_leadership(self, args: list[str]) -> None:
        positional, keyed = self._split(args)
        if positional or set(keyed) != {"from", "to"}:
            raise ScriptError("transfer-leadership from=N to=M")
        node, target = self._node(keyed["from"]), self._node(keyed["to"])
        self._guarded(node, 0, lambda: self.cluster.core(node).transfer_leadership(target))

    def _read_index(self, args: list[str]) -> None:
        if len(args) != 2:
            raise ScriptError("read-index N CTX")
        node, ctx = self._node(args[0]), args[1].encode()
        self._guarded(node, 0, lambda: self.cluster.core(node).read_index(ctx))

    def _process_ready(self, node: int) -> None:
        if not self.cluster.process_ready(node):
            self._print(f"> {node} has no Ready")
            return
        self._print(f"> {node} handling Ready")
        for line in fmt_ready(self.cluster.nodes[node].readies[-1]):
            self._print(line, 2)

    def _deliver_msgs(self, args: list[str]) -> None:
        positional, keyed = self._split(args)
        if set(keyed) - {"drop"}:
            raise ScriptError("deliver-msgs [N...] [drop=(N,...)]")
        dropped = set(self._ids(keyed.get("drop", "")))
        to = {self._node(a) for a in positional} or set(self.cluster.peers)
        for node in sorted(to | dropped):
            self._deliver_to(node, drop=node in dropped)

    def _deliver_to(self, node: int, drop: bool = False) -> bool:
        """Step (or drop) the queued messages for `node`, in the order they were sent."""
        msgs = [m for m in self.cluster.mailbox if m.dst == node]
        if not msgs:
            return False
        self._print(f"> {node} {'dropping' if drop else 'receiving'} messages")
        for m in msgs:
            self._print(fmt_message(m), 2)
            self._guarded(node, 2, partial(self._deliver_one, m, drop))
        return True

    def _deliver_one(self, m: Message, drop: bool) -> None:
        self.cluster.deliver(where=lambda x: x is m, drop=lambda _: drop)

    def _stabilize(self, args: list[str]) -> None:
        nodes = [self._node(a) for a in args] or list(self.cluster.peers)
        for _ in range(1000):
            moved = False
            for node in nodes:
                if self.cluster.core(node).has_ready():
                    self._process_ready(node)
                    moved = True
            for node in nodes:
                moved = self._deliver_to(node) or moved
            if not moved:
                return
        raise AssertionError("stabilize: the cluster did not settle in 1000 rounds")

    def _status(self, node: int) -> None:
        core = self.cluster.core(node)
        lead = "none" if core.leader_id is None else core.leader_id
        transfer = "" if core.lead_transferee is None else f" transferee={core.lead_transferee}"
        self._print(
            f"{node}: {core.role.value} term={core.term} lead={lead} "
            f"commit={core.commit_index} applied={core.applied} "
            f"last={core.last_index}{transfer}"
        )
        for peer, pr in sorted(core.progress.items()):
            active = " active" if pr.recent_active else ""
            snap = f" pending_snapshot={pr.pending_snapshot}" if pr.pending_snapshot else ""
            self._print(
                f"{peer}: {pr.state.value} match={pr.match} next={pr.next}{active}{snap}", 2
            )

    def _membership(self, node: int) -> None:
        core = self.cluster.core(node)
        line = f"{node}: {fmt_membership(core.membership)} (entry {core.conf_index})"
        if core.conf_pending:
            line += f", committed: {fmt_membership(core.committed_membership)}"
        self._print(line)

    def _raft_log(self, node: int) -> None:
        core = self.cluster.core(node)
        entries = core.log_slice(core.first_index, core.last_index + 1)
        if not entries:
            self._print(f"{node}: empty log after index {core.first_index - 1}")
        for e in entries:
            self._print(f"{node}: {fmt_entry(e)}")
