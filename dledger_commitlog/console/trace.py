"""The trace of one message: `GET /api/v1/messages/{msg_id}/trace`.

Owns `TraceApi`: the events of a message's life (stored; per consumer group
delivered to which member, acked, nacked, each retry with its delay level, dead-
lettered and why, resent), as the leader of the message's shard tells them
(`message_trace` client call, `messaging/message_trace.py` says where each comes
from), written by `views.trace_json`.

Invariants: the trace runs as its caller (with an ACL: SUB on the message's topic,
and only the groups the caller may use); an id that is not one is 400, one that
names no message 404.
"""

from __future__ import annotations

from dledger_commitlog.common.routes import shard_of_msg_id
from dledger_commitlog.console.api import PREFIX, call
from dledger_commitlog.console.callers import Callers
from dledger_commitlog.console.http import Request, Response, Router, json_response
from dledger_commitlog.console.params import Params, msg_id_of
from dledger_commitlog.console.views import trace_json


class TraceApi:
    def __init__(self, callers: Callers) -> None:
        self.callers = callers

    def register(self, router: Router) -> None:
        router.add("GET", PREFIX + "/messages/{msg_id}/trace", self.trace)

    async def trace(self, request: Request) -> Response:
        msg_id = msg_id_of(request.params["msg_id"])
        Params(request, ())
        client = (await self.callers.caller(request)).client
        shard = shard_of_msg_id(msg_id)
        found = await call(client.client(shard).message_trace(msg_id))
        return json_response(200, trace_json(msg_id, shard, found))
