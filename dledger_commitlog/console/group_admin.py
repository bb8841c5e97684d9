"""The consumer-group admin endpoints: reset offsets, read and resend dead letters.

Owns `GroupAdminApi`: `POST /api/v1/groups/{group}/reset-offsets`, `GET
/api/v1/groups/{group}/dlq` and `POST /api/v1/groups/{group}/dlq/resend`, what
`dledger group reset-offsets` and `dledger group dlq [--resend|--resend-all]` do,
through the same client calls (`group_reset_offsets`, `group_dlq`), on every data
shard the group or the topic lives on (the CLI acts on one shard, `--shard`).

Invariants: a POST keeps the API's CSRF rule (`require_api_content`) and runs as
its caller (with an ACL the cluster checks that user's admin right); its inputs
are all read, each bad one a 400 naming its field, before the cluster is asked;
a group no data shard knows is 404; a reset is refused (409) before any shard is
moved when the group has live members on one of them and `force` is not given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dledger_commitlog.client import AsyncRoutedClient, ClientError
from dledger_commitlog.client.groups import GroupDescription
from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.console.api import PREFIX, call
from dledger_commitlog.console.callers import Callers
from dledger_commitlog.console.http import ApiError, Request, Response, Router, json_response
from dledger_commitlog.console.params import (
    Params,
    bad,
    group_name,
    json_bool,
    json_fields,
    json_int,
    json_str,
    require_api_content,
    topic_name,
)
from dledger_commitlog.console.refusals import refusal
from dledger_commitlog.console.views import dlq_json

_TO = ("earliest", "latest", "offset", "time")
_MAX_READ = 256  # the cluster reads at most this many dead letters a call
_MAX_OFFSET = 2**63 - 1
_RESET_FIELDS = frozenset({"topic", "to", "offset", "time_ms", "queue", "force"})
_RESEND_FIELDS = frozenset({"shard", "offsets", "from_offset", "max"})


class GroupAdminApi:
    """The group admin endpoints (see the module doc)."""

    def __init__(self, callers: Callers) -> None:
        self.callers = callers

    def register(self, router: Router) -> None:
        routes: Sequence[tuple[str, str, Callable[[Request], Awaitable[Response]]]] = (
            ("POST", "/groups/{group}/reset-offsets", self.reset_offsets),
            ("GET", "/groups/{group}/dlq", self.dlq),
            ("POST", "/groups/{group}/dlq/resend", self.resend),
        )
        for method, path, handler in routes:
            router.add(method, PREFIX + path, handler)

    async def reset_offsets(self, request: Request) -> Response:
        """Body `{"topic", "to": earliest|latest|offset|time, "offset"?, "time_ms"?,
        "queue"?, "force"?}`: the group's new offsets of the topic, per queue."""
        require_api_content(request)
        group = group_name(request.params["group"])
        Params(request, ())
        doc = json_fields(request, _RESET_FIELDS)
        topic = topic_name(json_str(doc, "topic"))
        to = json_str(doc, "to")
        if to not in _TO:
            raise bad("to", f"to must be one of {', '.join(_TO)}, not {to[:20]!r}")
        value = 0
        for name, wanted in (("offset", "offset"), ("time_ms", "time")):
            if to == wanted:
                if name not in doc:
                    raise bad(name, f"a reset to {to} needs {name}")
                value = json_int(doc, name, 0, 0, _MAX_OFFSET)
            elif name in doc:
                raise bad(name, f"{name} is only for a reset to {wanted}")
        queue = json_int(doc, "queue", -1, 0, 2**31 - 1) if "queue" in doc else None
        force = json_bool(doc, "force")
        client = (await self.callers.caller(request)).client
        known = await _described(client, group)
        live = sum(d.summary.members for d in known.values())
        if live and not force:
            raise ApiError(
                409,
                "stale_lease",
                f"group {group!r} has {live} live member(s): stop them first, or send "
                '"force": true (their deliveries start over from the new offsets)',
            )
        route = await call(client.route(topic))
        base, first = {}, 0
        for g, count in route.shards:
            base[g], first = first, first + count
        targets: list[tuple[int, int]] = [(g, -1) for g, _ in route.shards]
        if queue is not None:
            try:
                targets = [route.locate(queue)]
            except IndexError as exc:
                raise bad("queue", str(exc)) from None
        moved = []
        for g, queue_id in targets:
            offsets = await call(
                client.client(g).group_reset_offsets(
                    group, topic, to, value, queue_id=queue_id, force=force
                )
            )
            for q, offset in sorted(offsets.items()):
                row = {"queue": base[g] + q, "shard": g, "queue_id": q, "offset": offset}
                moved.append(row)
        return json_response(200, {"group": group, "topic": topic, "to": to, "offsets": moved})

    async def dlq(self, request: Request) -> Response:
        """The group's dead letters per shard (`shard`, `from_offset`, `max`)."""
        group = group_name(request.params["group"])
        p = Params(request, ("shard", "from_offset", "max"))
        shard = p.optional_integer("shard", 1)
        from_offset = p.integer("from_offset", 0)
        most = p.integer("max", 32, 1, _MAX_READ)
        client = (await self.callers.caller(request)).client
        shards = sorted(await _described(client, group, shard))
        rows = []
        for g in shards:
            dead = await call(client.client(g).group_dlq(group, from_offset, most))
            rows.append({"shard": g, **dlq_json(dead)})
        return json_response(200, {"group": group, "shards": rows})

    async def resend(self, request: Request) -> Response:
        """Body `{"shard"?, "offsets"?, "from_offset"?, "max"?}`: put the dead letters at
        `offsets` of `shard` (else every one read from `from_offset`, at most `max`, on
        each shard) to the group's retry topic again. Idempotent: one resent before is
        not put again."""
        require_api_content(request)
        group = group_name(request.params["group"])
        Params(request, ())
        doc = json_fields(request, _RESEND_FIELDS)
        shard = json_int(doc, "shard", 0, 1, 2**31 - 1) if "shard" in doc else None
        offsets = _offsets(doc)
        if offsets and shard is None:
            raise bad("shard", "resending dead letters by offset needs their shard")
        if offsets and ("from_offset" in doc or "max" in doc):
            raise bad("offsets", "give offsets, or from_offset and max, not both")
        from_offset = json_int(doc, "from_offset", 0, 0, _MAX_OFFSET)
        most = json_int(doc, "max", _MAX_READ, 1, _MAX_READ)
        client = (await self.callers.caller(request)).client
        shards = sorted(await _described(client, group, shard))
        rows = []
        for g in shards:
            dead = await call(
                client.client(g).group_dlq(
                    group, from_offset, most, resend=offsets, resend_all=not offsets
                )
            )
            rows.append(
                {
                    "shard": g,
                    "resent": dead.resent,
                    "next_offset": dead.next_offset,
                    "max_offset": dead.max_offset,
                }
            )
        total = sum(int(r["resent"]) for r in rows)
        return json_response(200, {"group": group, "resent": total, "shards": rows})


async def _described(
    client: AsyncRoutedClient, group: str, shard: int | None = None
) -> dict[int, GroupDescription]:
    """The group as each data shard that knows it describes it (only `shard`, when
    given: 400 naming `shard` if it is no data shard); ApiError 404 when none does."""
    routes = await call(client.routes())
    data = [g for g in shard_ids(routes.shard_count) if g != 0]
    if shard is not None:
        if shard not in data:
            raise bad("shard", f"shard {shard} is not a data shard (those are {data})")
        data = [shard]
    found: dict[int, GroupDescription] = {}
    for g in data:
        try:
            found[g] = await client.client(g).group_describe(group)
        except ClientError as exc:
            if refusal(exc).status == 404:
                continue
            raise refusal(exc) from None
    if not found:
        raise ApiError(404, "not_found", f"group {group!r} has no members or offsets")
    return found


def _offsets(doc: dict[str, Any]) -> list[int]:
    value = doc.get("offsets", [])
    if not isinstance(value, list) or not all(
        isinstance(o, int) and not isinstance(o, bool) and 0 <= o <= _MAX_OFFSET for o in value
    ):
        raise bad("offsets", "offsets must be a list of dead-letter offsets (integers >= 0)")
    return list(value)
