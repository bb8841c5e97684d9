"""Delayed and half messages waiting: `GET /api/v1/backlog`.

Owns `BacklogApi`: per data shard, the delayed messages stored and not yet
delivered per delay level (level 0: deliver-at times) and the half messages not
yet committed or rolled back per producer group, each with its count and the store
time and age of the oldest (`backlog` client call: a node answers from its log,
messaging/schedule.py and transactions.py `waiting`). One endpoint for both: one
call per shard, and the Topics page shows them together.

Invariants: counts only, never a message's content (any signed-in caller may read
them); an age is the console's clock at the answer less the store time (0: none).
"""

from __future__ import annotations

import asyncio
import time

from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.console.api import PREFIX, call
from dledger_commitlog.console.callers import Callers
from dledger_commitlog.console.http import Request, Response, Router, json_response
from dledger_commitlog.console.params import Params
from dledger_commitlog.console.views import age_ms


class BacklogApi:
    def __init__(self, callers: Callers) -> None:
        self.callers = callers

    def register(self, router: Router) -> None:
        router.add("GET", PREFIX + "/backlog", self.backlog)

    async def backlog(self, request: Request) -> Response:
        Params(request, ())
        client = (await self.callers.caller(request)).client
        routes = await call(client.routes())
        data = [g for g in shard_ids(routes.shard_count) if g != 0]
        answers = await asyncio.gather(*(call(client.client(g).backlog()) for g in data))
        now = int(time.time() * 1000)
        delayed, halves = [], []
        for g, b in zip(data, answers, strict=True):
            for level, delay_ms, w in b.delayed:
                delayed.append(
                    {
                        "shard": g,
                        "level": level,
                        "delay_ms": delay_ms,
                        "messages": w.messages,
                        "oldest_stored_ms": w.oldest_stored_ms,
                        "oldest_age_ms": age_ms(w.oldest_stored_ms, now),
                    }
                )
            for group, w in b.halves:
                halves.append(
                    {
                        "shard": g,
                        "producer_group": group,
                        "messages": w.messages,
                        "oldest_stored_ms": w.oldest_stored_ms,
                        "oldest_age_ms": age_ms(w.oldest_stored_ms, now),
                    }
                )
        return json_response(200, {"time_ms": now, "delayed": delayed, "halves": halves})
