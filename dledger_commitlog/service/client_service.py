"""The gRPC client service: every client RPC, one part per concern.

`ClientService` joins the parts (`writes`, `transactions`, `message_reads`,
`offsets` (over `groups`), `log_reads`, `admin`, `members`, `routes`), each a
`base.ServiceBase` over the
node's facade (`node.RaftNode`) and its leader-side services (`messaging.services`);
`server.serve` builds it. See `base` for what every RPC shares: authentication,
forwarding to the leader, and how failures map to gRPC status codes.
"""

from __future__ import annotations

from dledger_commitlog.service.admin import AdminRpcs
from dledger_commitlog.service.log_reads import LogReadRpcs
from dledger_commitlog.service.members import MemberRpcs
from dledger_commitlog.service.message_reads import ReadRpcs
from dledger_commitlog.service.offsets import OffsetRpcs
from dledger_commitlog.service.routes import RouteRpcs
from dledger_commitlog.service.transactions import TransactionRpcs


class ClientService(
    TransactionRpcs, ReadRpcs, OffsetRpcs, LogReadRpcs, AdminRpcs, MemberRpcs, RouteRpcs
):
    """The client RPCs (proto/dledger.proto, service DLedgerClient)."""
