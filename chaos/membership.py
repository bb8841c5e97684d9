"""Membership-change chaos: nodes added, promoted, removed and replaced under write load.

The scenarios (registered with `scenarios.scenario`):
- `grow-shrink`: 3 -> 5 -> 3 (add two, remove two), the leader killed (SIGKILL, then
  restarted) in the middle of every change: right after the change is proposed, or
  between a node's learner add and its promotion;
- `remove-leader`: the leader is removed (it hands over once the removal commits;
  timed as a failover), then a new node is added to keep the voters;
- `replace-wiped`: a follower's disk dies (kill -9, data directory deleted); it is
  removed and a new node, under a new id and with an empty directory, added
  (docs/operations.md, "replace a dead node");
- `partition-joiner`: the node being added is cut off both ways while a learner
  catching up (then its promotion is asked), or while its promotion is being asked:
  the leader must refuse it or wait (or, were it within the lag bound when asked,
  accept it: a quorum of the others still serves), and the group must keep
  acknowledging puts; then heal, promote, and remove a follower to get back to the
  voters of the start.

Every change goes through the client's member_* calls, as an operator's would, and
is driven to a *state* of the leader's member list (`_drive`): a change whose
answer a fault took away is looked up, never repeated blindly, and a refusal as
things stand (a change pending, a leader elected a moment ago, a learner behind) is
asked again. A node joins as `dledger cluster add-node` makes one (`new_spec`,
`add_spec`: configured to join, the members as peers, the spares' links as routes)
and leaves as `cluster remove-node` leaves one (stopped, its entry marked removed).
Invariants: the steps of a round always complete (each wait has a deadline), so a
schedule never ends with a node half added; the ids a run adds are the nemesis's
`spare_ids` (their fault proxies exist from the start), and a schedule stops when
they run out; the nemesis's `on_join`/`on_leave` hear of every node that joins or
leaves, after it does.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from chaos.network import ToxiproxyNetwork, isolate
from chaos.scenarios import Nemesis, ScenarioError, scenario
from dledger_commitlog.cli.launcher import NodeSpec
from dledger_commitlog.client import ChangeRefused, Client, ClientError, MemberInfo

MEMBER_SCENARIOS = frozenset({"grow-shrink", "remove-leader", "replace-wiped", "partition-joiner"})
SPARE_NODES = 6  # ids a membership run may add (their proxies are made at the start)
CHANGE_TIMEOUT_MS = 5_000  # a change's own commit deadline (the run's settle_s bounds a step)
Members = dict[int, MemberInfo]


def members(n: Nemesis) -> Members:
    """The members as the leader sees them (ClientError if no leader answers)."""
    with n.cluster.client(timeout_s=3.0) as client:
        return {m.id: m for m in client.member_list()}


def voters(n: Nemesis) -> list[int]:
    return sorted(
        i for i, m in _until(n, "the member list", lambda: members(n)).items() if m.role == "voter"
    )


def _until(n: Nemesis, what: str, get: Callable[[], Members]) -> Members:
    deadline = time.monotonic() + n.settle_s
    while True:
        n.supervise()
        try:
            return get()
        except ClientError as exc:
            if time.monotonic() >= deadline:
                raise ScenarioError(f"{what}: no answer in {n.settle_s:g}s ({exc})") from exc
        time.sleep(0.1)


def _drive(
    n: Nemesis, what: str, change: Callable[[Client], object], done: Callable[[Members], bool]
) -> None:
    """Ask for `change` until the member list shows `done` (see the module doc)."""
    deadline = time.monotonic() + n.settle_s
    last = ""
    while True:
        with n.cluster.client(timeout_s=3.0) as client:
            try:
                change(client)
                return
            except ChangeRefused as exc:  # as things stand: maybe done already, else again
                last = f"refused: {exc.message}"
            except ClientError as exc:  # its answer was lost (a kill): look it up
                last = f"{type(exc).__name__}: {exc.message}"
            try:
                if done({m.id: m for m in client.member_list()}):
                    return
            except ClientError:
                pass
        if time.monotonic() >= deadline:
            raise ScenarioError(f"{what} did not happen within {n.settle_s:g}s ({last})")
        time.sleep(0.1)


def spares_left(n: Nemesis) -> int:
    used = max([*n.cluster.specs, *n.cluster.retired])
    return sum(i > used for i in n.spare_ids)


# ------------------------------------------------------------------ the steps


def start_joiner(n: Nemesis) -> NodeSpec:
    """A new node with the next id, configured to join, started and answering."""
    net = n.net
    if not isinstance(net, ToxiproxyNetwork):
        raise ScenarioError("membership scenarios need the toxiproxy network")
    now = _until(n, "the member list", lambda: members(n))
    spec = n.cluster.new_spec({i: (m.raft, m.client) for i, m in now.items()})
    if spec.id not in n.spare_ids:
        raise ScenarioError(f"node id {spec.id} has no links (spares: {n.spare_ids})")
    net.join(spec.id, spec.raft)
    n.cluster.add_spec(spec, {i: (m.raft, m.client) for i, m in now.items()})
    n.cluster.start(spec.id)
    n.fault("join-start", f"n{spec.id} started to join (members {sorted(now)})")
    deadline = time.monotonic() + n.settle_s
    while spec.id not in n.statuses():
        code = n.cluster.exit_code(spec.id)
        if code is not None or time.monotonic() >= deadline:
            tail = n.cluster.log_tail(spec.id, 5)
            raise ScenarioError(f"joining n{spec.id} did not answer (exit {code}): {tail}")
        time.sleep(0.05)
    n.on_join(spec)
    return spec


def add_learner(n: Nemesis, spec: NodeSpec) -> None:
    _drive(
        n,
        f"the learner add of n{spec.id}",
        lambda c: c.member_add(
            spec.id, spec.raft, spec.client, learner=True, timeout_ms=CHANGE_TIMEOUT_MS
        ),
        lambda ms: spec.id in ms,
    )
    n.fault("learner", f"n{spec.id} is a learner")


def promote(n: Nemesis, node: int) -> None:
    _drive(
        n,
        f"the promotion of n{node}",
        lambda c: c.member_promote(node, timeout_ms=CHANGE_TIMEOUT_MS),
        lambda ms: node in ms and ms[node].role == "voter",
    )
    n.fault("promoted", f"n{node} is a voter")


def remove(n: Nemesis, node: int) -> None:
    _drive(
        n,
        f"the removal of n{node}",
        lambda c: c.member_remove(node, timeout_ms=CHANGE_TIMEOUT_MS),
        lambda ms: node not in ms,
    )
    n.fault("removed", f"n{node} left the group")


def retire(n: Nemesis, node: int) -> None:
    """Removed `node` stops for good (as `cluster remove-node` leaves it); its files stay."""
    spec = n.cluster.specs[node]
    if node in n.stopped:
        n.crashed.add(node)
    n.cluster.stop(node)
    n.stopped.discard(node)
    n.paused.discard(node)
    n.cluster.retire(node)
    n.on_leave(spec)


def add_voter(n: Nemesis) -> int:
    """A new node: started, added as a learner, promoted once caught up."""
    spec = start_joiner(n)
    add_learner(n, spec)
    promote(n, spec.id)
    return spec.id


def _background(n: Nemesis, step: Callable[[], None], name: str) -> Callable[[], None]:
    """Run `step` in a thread; the returned function waits for it and re-raises."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            step()
        except BaseException as exc:  # re-raised in the scenario's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"chaos-{name}", daemon=True)
    thread.start()

    def join() -> None:
        thread.join(n.settle_s + 10.0)
        if thread.is_alive():
            raise ScenarioError(f"{name} still running after {n.settle_s + 10:g}s")
        if failed:
            raise failed[0]

    return join


def kill_leader(n: Nemesis, why: str, keep_down: int | None = None) -> int:
    """kill -9 the leader, wait for the next one, restart the old one (unless it is
    `keep_down`, a node on its way out); the old leader's id."""
    old = n.leader()
    n.kill(old, leader=True, why=why)
    n.leader(exclude={old}, timeout_s=n.settle_s)
    n.pause_for(0.2, 0.6)
    if old != keep_down:
        n.start(old)
    return old


def kill_leader_while(n: Nemesis, what: str, step: Callable[[], None], target: int) -> None:
    """Start `step` (a change) and kill the leader right after it was proposed."""
    join = _background(n, step, what)
    n.stop_event.wait(n.rng.uniform(0.0, 0.03))  # the schedule's gap: before or after commit
    kill_leader(n, f"right after the {what} was asked", keep_down=target)
    join()


# ------------------------------------------------------------------ the scenarios


@scenario(
    "grow-shrink",
    "3 -> 5 -> 3 under load, the leader killed in the middle of each change",
    "membership",
)
def grow_shrink(n: Nemesis) -> None:
    while n.running() and spares_left(n) >= 2:
        for _ in range(2):
            spec = start_joiner(n)
            if n.rng.random() < 0.5:
                kill_leader_while(
                    n, f"learner add of n{spec.id}", partial(add_learner, n, spec), target=spec.id
                )
            else:
                add_learner(n, spec)
                kill_leader(n, f"between the learner add and the promotion of n{spec.id}")
            promote(n, spec.id)
            n.wait_caught_up()
        for _ in range(2):
            node = n.rng.choice(voters(n))
            kill_leader_while(n, f"removal of n{node}", partial(remove, n, node), target=node)
            retire(n, node)
            n.wait_caught_up()
        n.pause_for(0.3, 1.0)


@scenario(
    "remove-leader",
    "remove the leader under load (it hands over), then add a node back",
    "membership",
)
def remove_leader(n: Nemesis) -> None:
    while n.running() and spares_left(n) >= 1:
        old = n.leader()
        asked = n.fault("remove-leader", f"removing leader n{old}")
        remove(n, old)
        at = n.fault("leader-removed", f"n{old}'s removal committed", leader=True)
        new = n.leader(exclude={old}, timeout_s=n.settle_s)
        n.fault(
            "handed-over",
            f"n{new} leads {n.history.now() - at:.2f}s after the commit "
            f"({n.history.now() - asked:.2f}s after the removal was asked)",
        )
        retire(n, old)
        add_voter(n)
        n.wait_caught_up()
        n.pause_for(0.3, 1.0)


@scenario(
    "replace-wiped", "a follower's disk dies: remove it, add a new node with a new id", "membership"
)
def replace_wiped(n: Nemesis) -> None:
    while n.running() and spares_left(n) >= 1:
        leader = n.leader()
        dead = n.rng.choice([i for i in voters(n) if i != leader])
        n.kill(dead)
        data = Path(n.cluster.specs[dead].data_dir)
        shutil.rmtree(data)
        n.wiped.add(dead)
        n.fault("wipe", f"n{dead}'s data directory deleted ({data})")
        remove(n, dead)
        retire(n, dead)
        add_voter(n)
        n.wait_caught_up()
        n.pause_for(0.3, 1.0)


@scenario(
    "partition-joiner",
    "the node being added is cut off while it catches up and while its promotion is asked",
    "membership",
)
def partition_joiner(n: Nemesis) -> None:
    while n.running() and spares_left(n) >= 1:
        spec = start_joiner(n)
        add_learner(n, spec)
        n.pause_for(0.0, 0.8)  # part of the way
        cut_first = n.rng.random() < 0.5  # else cut while the promotion is being asked
        if cut_first:
            _isolate(n, spec.id, "while a learner catching up")
            n.pause_for(0.3, 1.0)
        asked = n.fault("promote-cut-off", f"promotion of n{spec.id} asked")
        join = _background(n, partial(_promote_cut_off, n, spec.id), f"promotion of n{spec.id}")
        if not cut_first:
            n.stop_event.wait(n.rng.uniform(0.0, 0.05))
            _isolate(n, spec.id, "while its promotion is asked")
        n.wait_put_acked_after(asked, 5.0, f"the promotion of cut-off n{spec.id} was asked")
        join()
        n.wait_put_acked_after(n.history.now(), 5.0, f"cut-off n{spec.id}'s promotion answered")
        n.fault("heal", "links healed")
        n.net.heal()
        promote(n, spec.id)
        n.wait_caught_up()
        leader = n.leader()
        node = n.rng.choice([i for i in voters(n) if i != leader])
        remove(n, node)
        retire(n, node)
        n.wait_caught_up()
        n.pause_for(0.3, 1.0)


def _isolate(n: Nemesis, node: int, when: str) -> None:
    isolate(n.net, node, n.nodes)
    n.fault("isolate", f"joining n{node} cut off both ways {when}")


def _promote_cut_off(n: Nemesis, node: int) -> None:
    """One promotion of a cut-off learner: refused, waited out, or (were it within the
    lag bound when cut) accepted. Recorded; the group must serve meanwhile."""
    with n.cluster.client(timeout_s=3.0) as client:
        try:
            change = client.member_promote(node, timeout_ms=2_000)
        except ChangeRefused as exc:
            n.fault("promotion-refused", f"n{node}: {exc.message}")
        except ClientError as exc:
            n.fault("promotion-unknown", f"n{node}: {type(exc).__name__}: {exc.message}")
        else:
            n.fault(
                "promotion-accepted",
                f"n{node} a voter (entry {change.config_index}): "
                "it was within the lag bound when asked",
            )
