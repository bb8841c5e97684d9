"""The cluster admin endpoints: leadership, membership and retention, on the Cluster page.

Owns `ClusterAdminApi`, what `dledger transfer-leader`, `shard balance`, `member
add|promote|remove` and `admin clean-now` do, through the same client calls:

- `POST /api/v1/shards/{shard}/transfer-leader` `{"to", "timeout_ms"?}`: hand the
  shard's leadership to node `to` (a voter of the shard);
- `POST /api/v1/shards/balance` `{"dry_run"?}`: the moves of `common.balance.plan_moves`
  (the plan `dledger shard balance` makes), each a leadership transfer;
- `POST /api/v1/shards/{shard}/members` `{"id", "raft", "client", "learner"?,
  "timeout_ms"?}`, `POST .../members/{node}/promote` and `DELETE .../members/{node}`:
  the shard's membership changes;
- `POST /api/v1/cluster/clean-now` `{"force"?}`: a retention pass now on every node of
  every shard.

Invariants: a POST keeps the API's CSRF rule (`require_api_content`; a DELETE needs a
CORS preflight the console never grants); each runs as its caller, so with an ACL the
cluster requires the admin right of the signed-in user, as the gRPC API does (a user
without it is 403 and nothing changes); its inputs are all read, each bad one a 400
naming its field, before the cluster is asked; an unknown shard is 404; a change the
cluster refuses as things stand is 409 `change_refused` with its reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from dledger_commitlog.client import (
    AsyncClient,
    AsyncRoutedClient,
    ClientError,
    MemberChange,
    NodeStatus,
    PermissionDenied,
    StatusError,
    Unauthenticated,
)
from dledger_commitlog.common.balance import plan_moves
from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.console.api import PREFIX, call, shard_statuses
from dledger_commitlog.console.callers import Callers
from dledger_commitlog.console.http import ApiError, Request, Response, Router, json_response
from dledger_commitlog.console.params import (
    Params,
    bad,
    json_bool,
    json_fields,
    json_int,
    json_str,
    require_api_content,
)
from dledger_commitlog.console.refusals import refusal
from dledger_commitlog.console.views import leader_members, leader_of, member_json

MAX_NODE_ID = (1 << 31) - 1
_MAX_TIMEOUT_MS = 60_000
_TRANSFER_FIELDS = frozenset({"to", "timeout_ms"})
_ADD_FIELDS = frozenset({"id", "raft", "client", "learner", "timeout_ms"})
_CHANGE_FIELDS = frozenset({"timeout_ms"})

Statuses = Mapping[int, Mapping[int, NodeStatus | StatusError]]


class ClusterAdminApi:
    """The cluster admin endpoints (see the module doc)."""

    def __init__(self, callers: Callers) -> None:
        self.callers = callers

    def register(self, router: Router) -> None:
        members = "/shards/{shard}/members"
        routes: Sequence[tuple[str, str, Callable[[Request], Awaitable[Response]]]] = (
            ("POST", "/shards/{shard}/transfer-leader", self.transfer),
            ("POST", "/shards/balance", self.balance),
            ("POST", members, self.member_add),
            ("POST", members + "/{node}/promote", self.member_promote),
            ("DELETE", members + "/{node}", self.member_remove),
            ("POST", "/cluster/clean-now", self.clean_now),
        )
        for method, path, handler in routes:
            router.add(method, PREFIX + path, handler)

    async def _shard(self, request: Request) -> tuple[int, AsyncRoutedClient]:
        """The path's shard (400 if it is no number, 404 if the cluster has no such
        shard) and the caller's client."""
        text = request.params["shard"]
        if not text.isdigit() or len(text) > 9:
            raise bad("shard", f"a shard is a number, not {text[:20]!r}")
        client = (await self.callers.caller(request)).client
        every = shard_ids((await call(client.routes())).shard_count)
        if int(text) not in every:
            raise ApiError(404, "not_found", f"no shard {int(text)} (the shards: {every})")
        return int(text), client

    async def transfer(self, request: Request) -> Response:
        """Body `{"to", "timeout_ms"?}`: the shard's leader after the transfer."""
        require_api_content(request)
        Params(request, ())
        doc = json_fields(request, _TRANSFER_FIELDS)
        if "to" not in doc:
            raise bad("to", "give the node to hand the leadership to")
        to = json_int(doc, "to", 0, 1, MAX_NODE_ID)
        timeout_ms = json_int(doc, "timeout_ms", 5000, 1, _MAX_TIMEOUT_MS)
        shard, client = await self._shard(request)
        try:
            leader = await client.client(shard).transfer_leadership(to, timeout_ms)
        except ClientError as exc:
            failed = refusal(exc)
            if failed.status == 400:  # not a voter of the shard
                failed.field = "to"
            raise failed from None
        return json_response(200, {"shard": shard, "leader": leader})

    async def balance(self, request: Request) -> Response:
        """Body `{"dry_run"?}`: the moves (made, or only planned with `dry_run`), the
        moves that failed, and how many shards each node leads after."""
        require_api_content(request)
        Params(request, ())
        dry_run = json_bool(json_fields(request, frozenset({"dry_run"})), "dry_run")
        client = (await self.callers.caller(request)).client
        statuses = await shard_statuses(client)
        nodes = _nodes(statuses)
        candidates = {
            g: [n for n, st in by.items() if isinstance(st, NodeStatus)]
            for g, by in statuses.items()
        }
        leaders = {g: leader_of(by) for g, by in statuses.items()}
        moves = plan_moves(leaders, candidates, nodes)
        done: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for g, src, dst in moves:
            row: dict[str, Any] = {"shard": g, "from": src, "to": dst}
            if dry_run:
                done.append(row)
                continue
            try:
                row["to"] = await client.client(g).transfer_leadership(dst)
            except (PermissionDenied, Unauthenticated) as exc:
                raise refusal(exc) from None
            except ClientError as exc:
                failed.append({**row, "error": refusal(exc).message})
                continue
            done.append(row)
        if done and not dry_run:
            statuses = await shard_statuses(client)
            leaders = {g: leader_of(by) for g, by in statuses.items()}
        led = Counter(n for n in leaders.values() if n is not None)
        doc = {
            "dry_run": dry_run,
            "moves": done,
            "failed": failed,
            "leads": {str(n): led.get(n, 0) for n in nodes},
        }
        return json_response(200, doc)

    async def member_add(self, request: Request) -> Response:
        """Body `{"id", "raft", "client", "learner"?, "timeout_ms"?}`: add a node to the
        shard (a learner: it gets the log and does not vote until promoted)."""
        require_api_content(request)
        Params(request, ())
        doc = json_fields(request, _ADD_FIELDS)
        for name in ("id", "raft", "client"):
            if name not in doc:
                raise bad(name, f"a new member needs its {name}")
        node = json_int(doc, "id", 0, 1, MAX_NODE_ID)
        addresses = {name: _address(doc, name) for name in ("raft", "client")}
        learner = json_bool(doc, "learner")
        timeout_ms = _timeout_ms(doc)
        shard, client = await self._shard(request)
        add = client.client(shard).member_add(
            node, addresses["raft"], addresses["client"], learner=learner, timeout_ms=timeout_ms
        )
        role = "learner" if learner else "voter"
        return _changed(shard, {"id": node, "role": role}, await call(add))

    async def member_promote(self, request: Request) -> Response:
        """Make learner `{node}` of the shard a voter (409 while it is behind)."""
        node, timeout_ms = _change_input(request)
        shard, client = await self._shard(request)
        change = await call(client.client(shard).member_promote(node, timeout_ms))
        return _changed(shard, {"id": node, "role": "voter"}, change)

    async def member_remove(self, request: Request) -> Response:
        """Remove node `{node}` from the shard (409 for the last voter)."""
        node, timeout_ms = _change_input(request)
        shard, client = await self._shard(request)
        change = await call(client.client(shard).member_remove(node, timeout_ms))
        return _changed(shard, {"id": node, "removed": True}, change)

    async def clean_now(self, request: Request) -> Response:
        """Body `{"force"?}`: a retention pass now on every node of every shard (each
        node cleans its own store); per node and shard what it deleted, or its error."""
        require_api_content(request)
        Params(request, ())
        force = json_bool(json_fields(request, frozenset({"force"})), "force")
        client = (await self.callers.caller(request)).client
        every = shard_ids((await call(client.routes())).shard_count)
        rows = []
        for g in every:
            rows += await _clean_shard(client.client(g), g, force)
        return json_response(200, {"force": force, "nodes": rows})


async def _clean_shard(client: AsyncClient, shard: int, force: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for server in client.servers:
        row: dict[str, Any] = {"shard": shard, "server": server}
        try:
            r = await client.clean_now(server, force=force)
        except (PermissionDenied, Unauthenticated) as exc:
            raise refusal(exc) from None
        except ClientError as exc:
            rows.append({**row, "error": exc.message})
            continue
        rows.append(
            {
                **row,
                "deleted_segments": r.deleted_segments,
                "min_offset": r.min_offset,
                "reason": r.reason,
            }
        )
    return rows


def _nodes(statuses: Statuses) -> list[int]:
    """The cluster's nodes: the members of any shard, and any node that answered."""
    found: set[int] = set()
    for by in statuses.values():
        found |= {n for n in by if n > 0}
        found |= {m.id for m in leader_members(list(by.values()))}
    return sorted(found)


def _address(doc: dict[str, Any], name: str) -> str:
    text = json_str(doc, name)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad(name, f"{name} must be HOST:PORT, not {text[:60]!r}")
    return text


def _timeout_ms(doc: dict[str, Any]) -> int:
    return json_int(doc, "timeout_ms", 10_000, 1, _MAX_TIMEOUT_MS)


def _change_input(request: Request) -> tuple[int, int]:
    """(node, timeout_ms) of a promote or remove: the path's node, the body's timeout."""
    if request.method == "POST":
        require_api_content(request)
    Params(request, ())
    text = request.params["node"]
    if not text.isdigit() or len(text) > 10 or not 1 <= int(text) <= MAX_NODE_ID:
        raise bad("node", f"a node id is 1..{MAX_NODE_ID}, not {text[:20]!r}")
    return int(text), _timeout_ms(json_fields(request, _CHANGE_FIELDS))


def _changed(shard: int, what: dict[str, Any], change: MemberChange) -> Response:
    doc = {
        "shard": shard,
        **what,
        "config_index": change.config_index,
        "members": [member_json(m) for m in change.members],
    }
    return json_response(200, doc)
