"""Transactional messages: half messages, ending a transaction, the producers' checks.

Owns `TransactionRpcs` (docs/delayed-and-transactional.md). A half message is a
put to the half topic (`WriteRpcs._spec`); ending a transaction and the check
streams go to the node's `TransactionService`. A check stream's answer decides
only what that stream was asked about.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator

import grpc

from dledger_commitlog.log.commitlog import OutcomeUnknown, Overloaded, PutFailed
from dledger_commitlog.messaging.transactions import (
    HALF_KEY_PREFIX,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    TransactionConflict,
    UnknownTransaction,
)
from dledger_commitlog.node.acl import AuthError, Perm, require_topics
from dledger_commitlog.service.base import Context, Refused, result_pb, stored_message_pb
from dledger_commitlog.service.writes import WriteRpcs
from proto import dledger_pb2 as pb
from raft import NotLeader
from store.errors import InvalidMessage
from store.message import StoredMessage

log = logging.getLogger(__name__)


class TransactionRpcs(WriteRpcs):
    async def Backlog(self, request: pb.BacklogRequest, context: Context) -> pb.BacklogResponse:
        """Delayed messages per level and halves per producer group, waiting (counts and
        the oldest's store time; no message content: any signed-in caller)."""
        await self._caller(context, "Backlog")
        schedule, levels = self.services.schedule, self.services.schedule.levels
        waiting = schedule.waiting()  # on the loop, as the services read the log (bounded)
        halves = self.services.transactions.waiting()
        delayed = [
            pb.DelayedBacklog(
                level=q + 1 if q < len(levels) else 0,
                delay_ms=levels[q] if q < len(levels) else 0,
                messages=n,
                oldest_stored_ms=oldest,
            )
            for q, n, oldest in waiting
        ]
        return pb.BacklogResponse(
            delayed=delayed,
            halves=[
                pb.HalfBacklog(producer_group=g, messages=n, oldest_stored_ms=oldest)
                for g, (n, oldest) in sorted(halves.items())
            ],
        )

    async def PutHalf(self, request: pb.PutHalfRequest, context: Context) -> pb.PutHalfResponse:
        m = request.message
        account = await self._allow(
            context, "PutHalf", lambda a: require_topics(a, [m.topic], Perm.PUB)
        )
        wrong = self._check_cluster(request.cluster)
        if wrong:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
        try:
            spec = self._spec(m, producer_group=request.producer_group)
        except InvalidMessage as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            (result,) = await self._commit([spec], self._timeout(context))
        except NotLeader as exc:
            reply: pb.PutHalfResponse = await self._forward_to_leader(
                exc, context, "PutHalf", request, account
            )
            return reply
        except Refused as exc:
            await context.abort(exc.code, exc.message)
        return pb.PutHalfResponse(result=result_pb(result), transaction_id=m.uniq_key)

    async def EndTransaction(
        self, request: pb.EndTransactionRequest, context: Context
    ) -> pb.EndTransactionResponse:
        r, leadership = request, self.node
        account = await self._caller(context, "EndTransaction")
        wrong = self._check_cluster(r.cluster)
        if wrong:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, wrong)
        if not leadership.is_leader():
            reply: pb.EndTransactionResponse = await self._forward_to_leader(
                NotLeader(leadership.leader_id), context, "EndTransaction", request, account
            )
            return reply
        half = self.services.system_log.message_at(r.half_offset)
        if half is None or half.uniq_key != HALF_KEY_PREFIX + r.transaction_id:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no half message of transaction {r.transaction_id!r} at offset {r.half_offset}",
            )
        assert half is not None
        topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
        await self._check(context, account, lambda a: require_topics(a, [topic], Perm.PUB))
        try:
            done = await self.services.transactions.end(r.transaction_id, r.half_offset, r.commit)
        except NotLeader as exc:
            forwarded: pb.EndTransactionResponse = await self._forward_to_leader(
                exc, context, "EndTransaction", request, account
            )
            return forwarded
        except UnknownTransaction as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except TransactionConflict as exc:
            await context.abort(grpc.StatusCode.ABORTED, str(exc))
        except (OutcomeUnknown, TimeoutError) as exc:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{exc}; retry: ending a transaction twice the same way changes nothing",
            )
        except (PutFailed, Overloaded) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        reply = pb.EndTransactionResponse(
            committed=done.outcome == "commit", duplicate=done.duplicate
        )
        if done.result is not None:
            reply.result.CopyFrom(result_pb(done.result))
        return reply

    async def TransactionChecks(
        self, request_iterator: AsyncIterator[pb.TransactionCheckAnswer], context: Context
    ) -> AsyncIterator[pb.TransactionCheck]:
        """A producer's stream: checks of its group's undecided halves go out while this
        node leads; each answer commits, rolls back, or (UNKNOWN) waits for the next."""
        account = await self._caller(context, "TransactionChecks")
        hello = await anext(aiter(request_iterator), None)
        if hello is None or not hello.producer_group:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "the stream's first message names the producer group",
            )
        assert hello is not None
        group = hello.producer_group
        transactions = self.services.transactions
        checks = self.services.checks.open(group)
        answering: set[asyncio.Task[None]] = set()
        # What this stream asked about: an answer may decide only those (any other
        # transaction is ended through EndTransaction, which checks the caller's rights).
        asked: set[tuple[str, int]] = set()

        async def answer(a: pb.TransactionCheckAnswer) -> None:
            if a.action == pb.TransactionCheckAnswer.UNKNOWN:
                return
            if (a.transaction_id, a.half_offset) not in asked:
                log.warning(
                    "check answer for %s ignored: this stream was not asked about it",
                    a.transaction_id,
                )
                return
            try:
                await transactions.end(
                    a.transaction_id,
                    a.half_offset,
                    a.action == pb.TransactionCheckAnswer.COMMIT,
                    by="check",
                )
            except (
                NotLeader,
                UnknownTransaction,
                TransactionConflict,
                OutcomeUnknown,
                PutFailed,
                Overloaded,
                TimeoutError,
            ) as exc:
                log.info("check answer for %s not applied: %s", a.transaction_id, exc)

        async def read_answers() -> None:
            async for a in request_iterator:
                task = asyncio.ensure_future(answer(a))
                answering.add(task)
                task.add_done_callback(answering.discard)

        reader = asyncio.ensure_future(read_answers())
        try:
            while not reader.done():
                getter = asyncio.ensure_future(checks.get())
                await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                check = getter.result()
                topic = check.message.properties.get(PROPERTY_REAL_TOPIC, "")
                if account is not None:
                    try:
                        require_topics(account, [topic], Perm.PUB)
                    except AuthError:
                        continue  # not this producer's to decide
                shown = _as_committed(check.message, topic)
                asked.add((check.transaction_id, check.half_offset))
                yield pb.TransactionCheck(
                    transaction_id=check.transaction_id,
                    half_offset=check.half_offset,
                    check_times=check.check_times,
                    message=stored_message_pb(shown, len(check.message.body)),
                )
        finally:
            self.services.checks.close(group, checks)
            reader.cancel()


def _as_committed(msg: StoredMessage, topic: str) -> StoredMessage:
    """A half message as its real topic will hold it (for a producer's check)."""
    props = {
        k: v
        for k, v in msg.properties.items()
        if k not in (PROPERTY_REAL_TOPIC, PROPERTY_PRODUCER_GROUP, "REAL_QID", "TRAN_MSG")
    }
    uniq = (msg.uniq_key or "").removeprefix(HALF_KEY_PREFIX)
    return dataclasses.replace(msg, topic=topic, properties={**props, "UNIQ_KEY": uniq})
