"""Node configuration: a TOML file, command-line overrides on top, validated once.

The TOML layout (every key optional but `node_id`, `data_dir` and `peers`):

    node_id = 1
    cluster = "dledger"
    data_dir = "data/n1"
    flush_mode = "sync"            # or "async"
    [listen]
    client = "127.0.0.1:7001"      # defaults to this node's peer entry
    raft = "127.0.0.1:7101"
    metrics = "127.0.0.1:7201"     # empty string: no metrics endpoint
    console = "127.0.0.1:7480"     # the web console and JSON API (docs/console.md); empty: off
    [[peers]]
    id = 1
    raft = "127.0.0.1:7101"
    client = "127.0.0.1:7001"
    [[routes]]                     # optional: how this node reaches a node that may join
    id = 4                         # later (a proxy, NAT); never makes it a member
    raft = "127.0.0.1:7404"
    [raft]    tick_ms, election_ticks, heartbeat_ticks, preferred_leader, ...
    [store]   data_segment_bytes, index_segment_bytes, max_message_bytes, ...
    [retention] file_reserved_hours, delete_when_hour, force_clean_ratio, refuse_ratio
    [schedule]  delay_levels = "1s 5s 10s 30s 1m ... 2h", max_timer_delay_s
    [transaction] check_timeout_ms, check_interval_ms, max_checks
    [groups]  session_timeout_ms = 3000, heartbeat_interval_ms = 1000  # consumer groups
    [shards]                           # a shard is one Raft group (docs/scaling.md)
    count = 1                          # the cluster's data shards: 1..count (1: no shard 0)
    host = [1]                         # the shards this process hosts (0: metadata)
    [tls]     ca, cert, key            # PEM paths: TLS on both ports, mTLS between peers
    [security]
    peer_secret_file = "cluster.secret"  # peers prove membership with HMAC tokens
    acl_file = "acl.toml"                # clients sign calls (see acl.py)
    insecure = false                     # allow a non-loopback address without TLS + ACL

A peer given on the command line is `ID=RAFT_HOST:PORT/CLIENT_HOST:PORT`, a route
`ID=RAFT_HOST:PORT`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger_commitlog.common.protocol import MAX_MESSAGE_BYTES_LIMIT
from dledger_commitlog.common.routes import preferred_leader
from store.entry_format import FILLER_MIN, HEADER_SIZE, INDEX_UNIT_SIZE
from store.message import max_encoded_size
from store.retention_policy import RetentionPolicy

log = logging.getLogger(__name__)
# Settings read for one more release with a warning, then refused as unknown: what a
# setting that went away was (by NodeConfig-style name) and why it has no effect.
# Settings read under an old name for one more release, with a warning naming the new.
RENAMED: dict[str, str] = {"multiraft.groups": "shards.count", "multiraft.host": "shards.host"}
# NodeConfig fields under an old name (a cluster.json of a local cluster keeps them).
RENAMED_FIELDS: dict[str, str] = {"data_groups": "shard_count", "host_groups": "host_shards"}
RETIRED: dict[str, str] = {
    "client_transport": "the client port serves h2grpc, its one gRPC stack",
    "raft_transport": "the Raft port serves h2grpc, its one gRPC stack",
}

# Segments for throwaway local clusters (the demo, chaos runs). The defaults
# preallocate 1 GiB of log per node, which a laptop's disk or a test run that
# starts a dozen clusters should not pay. 8 MiB still holds the largest message
# the default store.max_message_bytes allows (see segment_bytes_for).
SMALL_SEGMENTS: dict[str, Any] = {"data_segment_bytes": 8 << 20, "index_segment_bytes": 32 * 65536}


class ConfigError(ValueError):
    """The configuration is unusable; the message says which setting and why."""


class ListenError(RuntimeError):
    """A node cannot listen on a configured address; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Peer:
    id: int
    raft: str
    client: str


@dataclass(frozen=True, slots=True)
class Route:
    """The Raft address this node dials for node `id` whenever `id` is a member,
    instead of the address its configuration entry names (a proxy, NAT). For the
    nodes it names, `peers` is the route already."""

    id: int
    raft: str


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: int
    data_dir: str
    peers: tuple[Peer, ...]
    cluster: str = "dledger"
    routes: tuple[Route, ...] = ()
    flush_mode: str = "sync"
    listen_client: str = ""
    listen_raft: str = ""
    listen_metrics: str = ""
    listen_console: str = ""  # the node's own console (docs/console.md); "": none
    # raft
    tick_ms: int = 50
    election_ticks: int = 10
    heartbeat_ticks: int = 2
    preferred_leader: int | None = None
    # Joining a running cluster (docs/operations.md): `peers` are its members and this
    # node, which learns its membership from the leader's log once it is added.
    join: bool = False
    # Start drained (docs/upgrades.md): follow and vote, campaign for nothing, until
    # `dledger node undrain` (a rolling restart starts a node so, until it caught up).
    drained: bool = False
    # Catch-up throttle per follower (a new node, a wiped one): MB/s of committed entries
    # sent to a follower far behind; 0: as fast as it goes. DLedger's peerPushQuota is 20.
    catch_up_mb_s: float = 20.0
    max_append_entries: int = 1024
    max_append_bytes: int = 4 << 20
    max_inflight_msgs: int = 64
    # store
    data_segment_bytes: int = 1 << 30
    index_segment_bytes: int = 32 << 20
    max_message_bytes: int = 4 << 20
    flush_interval_ms: int = 200
    queues_per_topic: int = 4
    cq_units_per_file: int = 300_000
    index_slots: int = 5_000_000
    index_entries: int = 20_000_000
    max_pending_puts: int = 20_000
    idempotency_window: int = 100_000
    # retention
    file_reserved_hours: float = 72.0
    delete_when_hour: int = 4
    force_clean_ratio: float = 0.85
    refuse_ratio: float = 0.95
    # delayed and transactional messages (schedule.py, transactions.py)
    delay_levels: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    max_timer_delay_s: int = 3 * 24 * 3600  # RocketMQ 5's timerMaxDelaySec
    check_timeout_ms: int = 6_000
    check_interval_ms: int = 60_000
    max_checks: int = 15
    # consumer groups (messaging/groups.py): a member silent this long is gone, and its
    # queues move (the rebalance bound is about session + heartbeat interval)
    group_session_timeout_ms: int = 3_000
    group_heartbeat_interval_ms: int = 1_000
    # shards, each one Raft group (docs/scaling.md): the cluster's data shards are
    # 1..shard_count, plus the metadata shard 0 (topic routes) when there are several;
    # this process hosts `host_shards`, each with its own data directory (`shard_dir`).
    # `shard` is the one shard a per-shard config (`shard_config`) describes.
    shard_count: int = 1
    host_shards: tuple[int, ...] = (1,)
    shard: int = 1
    # security (docs/security.md)
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    peer_secret_file: str = ""
    acl_file: str = ""
    insecure: bool = False

    def __post_init__(self) -> None:
        self._check_types()
        self._check_numbers()
        ids = [p.id for p in self.peers]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"peers: duplicate node ids {ids}")
        if self.node_id not in ids:
            raise ConfigError(f"node_id {self.node_id} is not among the peers {ids}")
        if self.join and len(ids) < 2:
            raise ConfigError("raft.join: peers must name the cluster's members besides this node")
        if len(ids) not in (1, 3, 5) and not self.join:
            raise ConfigError(
                f"peers: a cluster of 1, 3 or 5 voters, not {len(ids)} (grow a "
                "running cluster with `dledger member add`)"
            )
        if self.flush_mode not in ("sync", "async"):
            raise ConfigError(f"flush_mode must be 'sync' or 'async', not {self.flush_mode!r}")
        if (
            self.tick_ms <= 0
            or self.heartbeat_ticks < 1
            or self.election_ticks <= self.heartbeat_ticks
        ):
            raise ConfigError("raft: need tick_ms > 0 and 1 <= heartbeat_ticks < election_ticks")
        if self.preferred_leader is not None and self.preferred_leader not in ids:
            raise ConfigError(f"raft.preferred_leader {self.preferred_leader} is not a peer")
        if not 0 < self.force_clean_ratio <= self.refuse_ratio <= 1:
            raise ConfigError("retention: need 0 < force_clean_ratio <= refuse_ratio <= 1")
        for p in self.peers:
            for what in (p.raft, p.client):
                parse_address(what)
        console = self.listen_console
        if console:
            try:
                parse_address(console if isinstance(console, str) else "")
            except ConfigError:
                raise ConfigError(f"listen.console {console!r} is not HOST:PORT") from None
        self._check_routes(ids)
        self._check_shards()
        self._check_security()
        try:
            levels = parse_levels(self.delay_levels)
        except ValueError as exc:
            raise ConfigError(f"schedule.delay_levels: {exc}") from None
        if len(levels) > MAX_DELAY_LEVELS:
            raise ConfigError(f"schedule.delay_levels: at most {MAX_DELAY_LEVELS} levels")

    def _check_routes(self, peer_ids: list[int]) -> None:
        routed = [r.id for r in self.routes]
        if len(set(routed)) != len(routed):
            raise ConfigError(f"routes: duplicate node ids {routed}")
        for r in self.routes:
            if isinstance(r.id, bool) or not isinstance(r.id, int) or r.id < 1:
                raise ConfigError(f"routes: a node id is an integer >= 1, not {r.id!r}")
            if r.id in peer_ids:
                raise ConfigError(f"routes: node {r.id} is a peer (its peer entry is its route)")
            parse_address(r.raft)

    def _check_shards(self) -> None:
        hosted = self.host_shards
        if (
            not isinstance(hosted, tuple)
            or not hosted
            or any(isinstance(g, bool) or not isinstance(g, int) for g in hosted)
        ):
            raise ConfigError(f"shards.host must be a non-empty list of shard ids, not {hosted!r}")
        top = self.shard_count
        if len(set(hosted)) != len(hosted) or not all(0 <= g <= top for g in hosted):
            raise ConfigError(
                f"shards.host {list(hosted)}: distinct shards in 0..{top} (shards.count is {top})"
            )
        if top == 1 and 0 in hosted:
            raise ConfigError(
                "shards.host: shard 0 (topic routes) exists only with shards.count > 1"
            )
        # `shard` names the shard of a per-shard config (`shard_config`); a process's
        # config keeps the default 1, which it need not host (one process per shard).
        if self.shard != 1 and self.shard not in hosted:
            raise ConfigError(f"shard {self.shard} is not among shards.host {list(hosted)}")

    def retention_policy(self) -> RetentionPolicy:
        """The commit log's retention rules (the [retention] settings)."""
        return RetentionPolicy(
            self.file_reserved_hours,
            self.delete_when_hour,
            self.force_clean_ratio,
            self.refuse_ratio,
        )

    def _check_types(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            want = _NUMBER_TYPES.get(str(f.type))
            if want is None or (value is None and str(f.type).endswith("| None")):
                continue
            if isinstance(value, bool) or not isinstance(value, want):
                kind = "an integer" if want is int else "a number"
                raise ConfigError(f"{_setting(f.name)} must be {kind}, not {value!r}")

    def _check_security(self) -> None:
        for name in ("tls_ca", "tls_cert", "tls_key", "peer_secret_file", "acl_file"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{_setting(name)} must be a path (a string)")
        if not isinstance(self.insecure, bool):
            raise ConfigError("security.insecure must be true or false")
        tls = (self.tls_ca, self.tls_cert, self.tls_key)
        if any(tls) and not all(tls):
            raise ConfigError("tls: give ca, cert and key together (or none of them)")
        if self.acl_file and not self.peer_secret_file:
            raise ConfigError(
                "security.acl_file needs security.peer_secret_file: a node forwarding a "
                "client's put to the leader vouches for the client with the cluster secret"
            )

    def _check_numbers(self) -> None:
        for name, (low, high) in _BOUNDS.items():
            value = getattr(self, name)
            if not low <= value or (high is not None and not value <= high):  # NaN: refused
                want = f"at least {low}" if high is None else f"in {low}..{high}"
                raise ConfigError(f"{_setting(name)} must be {want}, not {value}")
        need = segment_bytes_for(self.max_message_bytes)
        if self.data_segment_bytes < need:
            fits = self.data_segment_bytes - (need - self.max_message_bytes)
            instead = f", or store.max_message_bytes of at most {fits}" if fits >= 1024 else ""
            raise ConfigError(
                f"store.data_segment_bytes {self.data_segment_bytes} cannot hold the largest "
                f"message: store.max_message_bytes {self.max_message_bytes} needs at least "
                f"{need}{instead}"
            )
        if self.index_segment_bytes % INDEX_UNIT_SIZE:
            raise ConfigError(
                f"store.index_segment_bytes {self.index_segment_bytes} must be a multiple of "
                f"{INDEX_UNIT_SIZE}"
            )

    @property
    def me(self) -> Peer:
        return next(p for p in self.peers if p.id == self.node_id)

    @property
    def client_address(self) -> str:
        return self.listen_client or self.me.client

    @property
    def raft_address(self) -> str:
        return self.listen_raft or self.me.raft


def shard_dir(data_dir: str, shard: int) -> str:
    """Shard `shard`'s data directory under a node's `data_dir`: shard 1 is the
    directory itself (a single-shard node's directory opens as shard 1 as it is),
    any other shard `data_dir/groups/<shard>` (the directories keep their name)."""
    return data_dir if shard == 1 else str(Path(data_dir) / "groups" / str(shard))


def preferred_leader_of(cfg: NodeConfig, shard: int) -> int | None:
    """Shard `shard`'s preferred leader: the configured one for a single-shard cluster,
    else the bootstrap peers taken in turn (`common.routes.preferred_leader`), so that
    the leaders of a cluster's shards spread evenly over its nodes (docs/scaling.md)."""
    if cfg.shard_count == 1 or cfg.join:
        return cfg.preferred_leader
    return preferred_leader(shard, [p.id for p in cfg.peers])


def shard_config(cfg: NodeConfig, shard: int) -> NodeConfig:
    """The config of hosted shard `shard`: its own data directory and preferred leader,
    the process's ports and settings otherwise."""
    return dataclasses.replace(
        cfg,
        shard=shard,
        data_dir=shard_dir(cfg.data_dir, shard),
        preferred_leader=preferred_leader_of(cfg, shard),
    )


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {text!r} is not HOST:PORT")
    return host, int(port)


def parse_peer(text: str) -> Peer:
    """`ID=RAFT_HOST:PORT/CLIENT_HOST:PORT`."""
    ident, sep, rest = text.partition("=")
    raft, sep2, client = rest.partition("/")
    if not sep or not sep2 or not ident.strip().isdigit():
        raise ConfigError(f"peer {text!r} is not ID=RAFT_HOST:PORT/CLIENT_HOST:PORT")
    return Peer(int(ident), raft.strip(), client.strip())


def parse_route(text: str) -> Route:
    """`ID=RAFT_HOST:PORT`."""
    ident, sep, raft = text.partition("=")
    if not sep or not ident.strip().isdigit():
        raise ConfigError(f"route {text!r} is not ID=RAFT_HOST:PORT")
    return Route(int(ident), raft.strip())


_SECTIONS = {
    "listen": {
        "client": "listen_client",
        "raft": "listen_raft",
        "metrics": "listen_metrics",
        "console": "listen_console",
        "client_transport": "client_transport",
    },
    "raft": {
        "tick_ms": "tick_ms",
        "election_ticks": "election_ticks",
        "heartbeat_ticks": "heartbeat_ticks",
        "preferred_leader": "preferred_leader",
        "join": "join",
        "drained": "drained",
        "catch_up_mb_s": "catch_up_mb_s",
        "max_append_entries": "max_append_entries",
        "max_append_bytes": "max_append_bytes",
        "max_inflight_msgs": "max_inflight_msgs",
        "transport": "raft_transport",
    },
    "store": {
        name: name
        for name in (
            "data_segment_bytes",
            "index_segment_bytes",
            "max_message_bytes",
            "flush_interval_ms",
            "queues_per_topic",
            "cq_units_per_file",
            "index_slots",
            "index_entries",
            "max_pending_puts",
            "idempotency_window",
        )
    },
    "tls": {"ca": "tls_ca", "cert": "tls_cert", "key": "tls_key"},
    "schedule": {name: name for name in ("delay_levels", "max_timer_delay_s")},
    "transaction": {name: name for name in ("check_timeout_ms", "check_interval_ms", "max_checks")},
    "security": {name: name for name in ("peer_secret_file", "acl_file", "insecure")},
    "groups": {
        "session_timeout_ms": "group_session_timeout_ms",
        "heartbeat_interval_ms": "group_heartbeat_interval_ms",
    },
    "shards": {"count": "shard_count", "host": "host_shards"},
    "retention": {
        name: name
        for name in (
            "file_reserved_hours",
            "delete_when_hour",
            "force_clean_ratio",
            "refuse_ratio",
        )
    },
}
_TOP = ("node_id", "cluster", "data_dir", "flush_mode")
_NUMBER_TYPES: dict[str, type | tuple[type, ...]] = {
    "int": int,
    "int | None": int,
    "float": (int, float),
}
_AT_LEAST_ONE = (
    "max_append_entries",
    "max_inflight_msgs",
    "flush_interval_ms",
    "index_segment_bytes",
    "queues_per_topic",
    "cq_units_per_file",
    "index_slots",
    "index_entries",
    "max_pending_puts",
    "max_timer_delay_s",
    "check_timeout_ms",
    "check_interval_ms",
    "max_checks",
    "group_session_timeout_ms",
    "group_heartbeat_interval_ms",
)
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+)(ms|s|m|h|d)$")
MAX_DELAY_LEVELS = 64  # queues of the schedule topic (one more for deliver-at times)
_BOUNDS: dict[str, tuple[float, float | None]] = {
    **{name: (1, None) for name in _AT_LEAST_ONE},
    # A consumer-group offset commit is a message of a few hundred bytes.
    "max_message_bytes": (1024, MAX_MESSAGE_BYTES_LIMIT),
    # One AppendEntries carries this much (or one entry), within a 16 MiB RaftBatch.
    "max_append_bytes": (1, 16 << 20),
    "idempotency_window": (0, None),
    "catch_up_mb_s": (0, None),
    "file_reserved_hours": (0, None),
    "delete_when_hour": (0, 23),
    "shard_count": (1, 1000),  # message ids carry the shard in 15 bits (message_layout)
}


def segment_bytes_for(max_message_bytes: int) -> int:
    """The smallest data segment that holds an entry carrying the largest message."""
    return HEADER_SIZE + max_encoded_size(max_message_bytes) + FILLER_MIN


def _setting(name: str) -> str:
    """`name` as the TOML file spells it: section.key (or the top-level key)."""
    for section, keys in _SECTIONS.items():
        for key, field_name in keys.items():
            if field_name == name:
                return f"{section}.{key}"
    return name


def renamed_fields(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (NodeConfig settings) with fields of an old name under the new one, each
    with a warning."""
    out = dict(values)
    for old, new in RENAMED_FIELDS.items():
        if old in out:
            log.warning(
                "setting %s is now %s (the old name is read for one more release)", old, new
            )
            out[new] = out.pop(old)
    return out


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> NodeConfig:
    """Read `path` (may be None), apply `overrides` (NodeConfig field names), validate."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            doc = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        values = _flatten(doc, str(path))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    for required in ("node_id", "data_dir", "peers"):
        if required not in values:
            raise ConfigError(f"missing setting {required!r} (config file or command line)")
    for key in sorted(RETIRED.keys() & values.keys()):
        log.warning("%s is no longer read (%s): remove it", _setting(key), RETIRED[key])
        del values[key]
    known = {f.name for f in dataclasses.fields(NodeConfig)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
    try:
        return NodeConfig(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


def _renamed_section(section: str) -> bool:
    return any(old.startswith(section + ".") for old in RENAMED)


def _flatten(doc: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _TOP:
            out[key] = value
        elif key == "peers":
            if not isinstance(value, list):
                raise ConfigError(f"{where}: peers must be an array of tables")
            try:
                out["peers"] = tuple(
                    Peer(int(p["id"]), str(p["raft"]), str(p["client"])) for p in value
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{where}: each peer needs id, raft and client ({exc})") from exc
        elif key == "routes":
            if not isinstance(value, list):
                raise ConfigError(f"{where}: routes must be an array of tables")
            try:
                out["routes"] = tuple(Route(int(r["id"]), str(r["raft"])) for r in value)
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{where}: each route needs id and raft ({exc})") from exc
        elif (key in _SECTIONS or _renamed_section(key)) and isinstance(value, dict):
            for sub, v in value.items():
                section, name = key, sub
                new = RENAMED.get(f"{key}.{sub}")
                if new is not None:
                    log.warning(
                        "%s: %s.%s is now %s (the old name is read for one more release)",
                        where,
                        key,
                        sub,
                        new,
                    )
                    section, name = new.split(".")
                names = _SECTIONS.get(section, {})
                if name not in names:
                    raise ConfigError(f"{where}: unknown setting {key}.{sub}")
                out[names[name]] = (
                    tuple(v) if names[name] == "host_shards" and isinstance(v, list) else v
                )
        else:
            raise ConfigError(f"{where}: unknown setting {key!r}")
    return out


def parse_levels(text: str) -> tuple[int, ...]:
    """ "1s 5s 1m ..." -> delays in ms; ValueError naming the bad part."""
    levels: list[int] = []
    for part in text.split():
        m = _LEVEL.match(part)
        if m is None or int(m.group(1)) <= 0:
            raise ValueError(f"delay level {part!r} is not a positive duration like 5s, 2m or 1h")
        levels.append(int(m.group(1)) * _UNITS_MS[m.group(2)])
    if not levels:
        raise ValueError("no delay levels given")
    return tuple(levels)


def describe_level(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"
