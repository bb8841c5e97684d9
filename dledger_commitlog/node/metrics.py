"""Prometheus metrics of one node, on its own registry (several nodes may share a process).

Put count and latency, proposal batch sizes, commit index, replication lag per
follower, fsync latency, role and term, disk usage against the ratio where writes
are refused, the node certificate's expiry, consumer groups, whether the node is
drained, and `dledger_build_info{version, wire}` (always 1: the labels are the
point, `versions`). Served over HTTP by
`serve_metrics`; the alert rules and the dashboard built on them ship in deploy/.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from dledger_commitlog.node.versions import WIRE_VERSIONS, software_version
from raft import RaftCore, Role

_ROLES = {Role.FOLLOWER: 0, Role.PRE_CANDIDATE: 1, Role.CANDIDATE: 2, Role.LEADER: 3}
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class NodeMetrics:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.registry = r = CollectorRegistry()
        self.puts = Counter("dledger_puts", "Puts by outcome", ["outcome"], registry=r)
        self.put_latency = Histogram(
            "dledger_put_latency_seconds",
            "Put latency until commit",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "dledger_proposal_batch_messages",
            "Messages per proposal",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=r,
        )
        self.fsync_latency = Histogram(
            "dledger_fsync_seconds", "fsync latency", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.commit_index = Gauge("dledger_commit_index", "Raft commit index", registry=r)
        self.last_index = Gauge("dledger_last_index", "Last log index", registry=r)
        self.term = Gauge("dledger_term", "Raft term", registry=r)
        self.role = Gauge(
            "dledger_role", "0 follower, 1 pre-candidate, 2 candidate, 3 leader", registry=r
        )
        self.leader = Gauge("dledger_leader_id", "Known leader (0: none)", registry=r)
        self.drained = Gauge(
            "dledger_drained", "1: campaigns for nothing (drained, or a damaged log)", registry=r
        )
        build = Gauge(
            "dledger_build_info",
            "The node's software version and the Raft wire versions it speaks",
            ["version", "wire"],
            registry=r,
        )
        build.labels(software_version(), ",".join(map(str, WIRE_VERSIONS))).set(1)
        self.replication_lag = Gauge(
            "dledger_replication_lag_entries",
            "Leader's last index minus the follower's match index",
            ["follower"],
            registry=r,
        )
        self.peer_rejects = Counter(
            "dledger_peer_rejected",
            "Raft streams or messages refused (membership, token, certificate, invalid, malformed)",
            ["reason"],
            registry=r,
        )
        self.auth_failures = Counter(
            "dledger_client_auth_failures", "Client calls refused", ["status"], registry=r
        )
        self.scheduled_backlog = Gauge(
            "dledger_scheduled_backlog_messages",
            "Delayed messages stored and not yet delivered",
            registry=r,
        )
        self.scheduled_delivered = Counter(
            "dledger_scheduled_delivered",
            "Delayed messages delivered by this node as leader",
            registry=r,
        )
        self.pending_halves = Gauge(
            "dledger_transaction_pending_halves",
            "Half messages not yet committed or rolled back (leader)",
            registry=r,
        )

        self.disk_usage = Gauge(
            "dledger_disk_usage_ratio",
            "Used share of the data directory's filesystem (checked every retention pass)",
            registry=r,
        )
        self.disk_refuse_ratio = Gauge(
            "dledger_disk_refuse_ratio",
            "Disk usage at which this node refuses writes (retention.refuse_ratio)",
            registry=r,
        )
        self.cert_expiry = Gauge(
            "dledger_tls_certificate_expiry_timestamp_seconds",
            "When this node's TLS certificate expires (Unix time; absent without TLS)",
            registry=r,
        )

        self.group_lag = Gauge(
            "dledger_group_lag_messages",
            "Messages past a consumer group's acked offsets (leader)",
            ["group"],
            registry=r,
        )
        self.group_members = Gauge(
            "dledger_group_members",
            "Live members of a consumer group (leader)",
            ["group"],
            registry=r,
        )
        self.group_retries = Gauge(
            "dledger_group_retries_messages",
            "Messages a consumer group sent to its retry topic",
            ["group"],
            registry=r,
        )
        self.group_dead_letters = Gauge(
            "dledger_group_dead_letters_messages",
            "Messages in a consumer group's dead-letter topic",
            ["group"],
            registry=r,
        )

    def update_disk(self, usage_ratio: float, refuse_ratio: float) -> None:
        self.disk_usage.set(usage_ratio)
        self.disk_refuse_ratio.set(refuse_ratio)

    def set_groups(self, summaries: Mapping[str, Mapping[str, object]]) -> None:
        """The consumer groups' gauges from `GroupService.summaries`."""
        for group, s in summaries.items():
            self.group_lag.labels(group).set(float(s["lag"]))  # type: ignore[arg-type]
            self.group_members.labels(group).set(float(s["members"]))  # type: ignore[arg-type]
            self.group_retries.labels(group).set(float(s["retries"]))  # type: ignore[arg-type]
            self.group_dead_letters.labels(group).set(
                float(s["dead_letters"])  # type: ignore[arg-type]
            )

    def observe_fsync(self, _flushed: int, seconds: float) -> None:
        self.fsync_latency.observe(seconds)

    def update_role(self, core: RaftCore) -> None:
        self.term.set(core.term)
        self.role.set(_ROLES[core.role])
        self.leader.set(core.leader_id or 0)
        self.drained.set(int(not core.may_campaign))
        self.commit_index.set(core.commit_index)
        self.last_index.set(core.last_index)

    def update_replication(self, core: RaftCore) -> None:
        """Each follower's lag as the leader sees it; none on any other node (a leader
        that stepped down stops reporting its last figures)."""
        if core.role is not Role.LEADER:
            self.replication_lag.clear()
            return
        for peer, pr in core.progress.items():
            if peer != core.id:
                self.replication_lag.labels(str(peer)).set(max(0, core.last_index - pr.match))


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not news


def serve_metrics(metrics: NodeMetrics | CollectorRegistry, address: str) -> Callable[[], None]:
    """Start the HTTP endpoint (a daemon thread) at HOST:PORT; return what stops it.
    As prometheus_client's `start_http_server`, but its loop looks for a stop every
    50 ms instead of every 500 (a node's shutdown waits for it)."""
    host, _, port = address.rpartition(":")
    registry = metrics.registry if isinstance(metrics, NodeMetrics) else metrics
    family, *_ = socket.getaddrinfo(
        host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(host.strip("[]"), int(port), make_wsgi_app(registry), Server, _Quiet)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()
        thread.join()

    return stop
