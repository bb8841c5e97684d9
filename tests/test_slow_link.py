"""A client whose first connection to a node takes longer than a tenth of a second:
a TLS handshake across a WAN, or a node whose loop is busy when the client connects.

gRPC gives one connection attempt no longer than `grpc.min_reconnect_backoff_ms`
(netkit/reconnect.py); at the 100 ms our channels once set for a quick reconnect,
such a call failed at once with "connection attempt timed out before receiving
SETTINGS frame" (a test's raw stub met it against a node catching up under load).
"""

from __future__ import annotations

from typing import Any

import grpc

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client
from proto import dledger_pb2 as pb
from proto import dledger_pb2_grpc as pb_grpc
from tests.conftest import CHANNEL_OPTIONS
from tests.fault_proxy_helpers import create

# The fixtures these tests take (pytest finds them by their names).
from tests.fault_proxy_helpers import fixture_api as fixture_api
from tests.fault_proxy_helpers import fixture_tp as fixture_tp

LINK_DELAY_MS = 400  # each way: the node's SETTINGS frame arrives 0.4 s after connecting


def slow_link(tp: Any, cluster: LocalCluster, tag: str) -> tuple[int, str]:
    """A proxy in front of the leader's client port delaying what the node sends."""
    leader = cluster.wait_for_leader(timeout_s=10.0)
    proxy = create(tp, tag, cluster.specs[leader].client)
    proxy.add_toxic(type="latency", stream="downstream", attributes={"latency": LINK_DELAY_MS})
    return leader, proxy.listen


def test_a_client_puts_and_gets_over_a_slow_link(tp: Any, shared_cluster: LocalCluster) -> None:
    _leader, address = slow_link(tp, shared_cluster, "slow_client")
    with Client([address], timeout_s=10.0, max_retries=0) as client:
        put = client.put("slow-link", b"across a slow link")
        assert client.get(offset=put.commitlog_offset).body == b"across a slow link"


def test_a_raw_stub_with_the_suites_options_connects_over_a_slow_link(
    tp: Any, shared_cluster: LocalCluster
) -> None:
    leader, address = slow_link(tp, shared_cluster, "slow_stub")
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        status = pb_grpc.DLedgerClientStub(channel).Status(pb.StatusRequest(), timeout=10.0)
    assert status.node_id == leader
