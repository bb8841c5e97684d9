"""`dledger serve --from-env`: a node of a Kubernetes StatefulSet, configured from its pod.

A StatefulSet names its pods `NAME-0`, `NAME-1`, ... and gives each a stable DNS
name through its headless Service: `NAME-N.SERVICE.NAMESPACE.svc.DOMAIN`. This
module turns that into a node's settings (deploy/kubernetes/, docs/kubernetes.md):

- pod `NAME-N` (its HOSTNAME) is node `N + 1` (node ids start at 1; the
  certificate of node N + 1 is `node-{N+1}.pem`, CN `dledger-node-{N+1}`);
- pods `NAME-0` .. `NAME-{M-1}` are the bootstrap voters (`DLEDGER_MEMBERS`, M):
  their peers are each other, each reached at its stable name;
- a pod beyond them joins the running cluster (`raft.join`) when `DLEDGER_JOIN` is
  `voter` or `learner` (`off`, the default, refuses it in one line): its peers are
  the bootstrap members and itself, and once its own port answers, a thread of this
  process asks the cluster to add it as a learner of every shard and, for `voter`,
  to promote it once caught up (`member add` / `member promote`, asked again while
  the leader refuses as things stand), so that `kubectl scale` grows the cluster
  with nobody at the keyboard. The data directory then records that it joined
  (`JOINED_FILE`): a pod that finds itself no longer a member after that was removed
  by an operator and never adds itself again. A joining pod whose volume is new
  (no `raft.state`) while the cluster still lists it as a voter is refused: a voter
  that forgot its votes must be removed first (`dledger member remove N`).

The environment (every name but HOSTNAME and POD_NAMESPACE has a default):

    HOSTNAME               NAME-N: the pod's name, which Kubernetes sets
    POD_NAMESPACE          the namespace (the downward API's metadata.namespace)
    DLEDGER_SERVICE        the headless Service (default NAME-headless)
    DLEDGER_CLUSTER_DOMAIN the cluster's DNS domain (default cluster.local)
    DLEDGER_MEMBERS        bootstrap voters: 1, 3 or 5 (default 3)
    DLEDGER_JOIN           off | learner | voter: what a pod beyond them does
    DLEDGER_DATA_DIR       the data directory, on the pod's volume (default /data)
    DLEDGER_LISTEN_HOST    the address the ports bind (default 0.0.0.0)
    DLEDGER_CLIENT_PORT, DLEDGER_RAFT_PORT, DLEDGER_METRICS_PORT   7001, 7101, 7201
    DLEDGER_TLS_DIR        a directory with ca.pem, node-ID.pem, node-ID.key: TLS on
    DLEDGER_TLS_CA, DLEDGER_CREDENTIALS   what the join thread's client uses (as the CLI)
    DLEDGER_HOSTS_FILE     hosts-format lines `ADDRESS NAME...`: a stable name listed
                           there is replaced by its address in the settings. For a
                           test on one machine without cluster DNS (tests/
                           test_kubernetes.py); a cluster leaves it unset, and the
                           names go into the settings and are resolved at each dial.

Everything else comes from `--config` (a ConfigMap's node.toml) and `serve`'s
options, which win over the environment. A setting that cannot be is a ConfigError
(one line, exit 2); a joining pod that cannot join is a ClusterError (exit 1).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger_commitlog.cli.launcher import ClusterError
from dledger_commitlog.client import Access, ChangeRefused, Client, ClientError, MemberInfo
from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.node.config import ConfigError, NodeConfig, Peer

log = logging.getLogger(__name__)

JOIN_MODES = ("off", "learner", "voter")
JOINED_FILE = "k8s-joined"  # in the data directory: this pod was added to the cluster once
RAFT_STATE_FILE = "raft.state"  # a data directory that holds it has voted and appended
_POD_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)-(0|[1-9][0-9]*)$")
_PROBE_S = 60.0  # how long a joining pod waits for the cluster to answer before giving up
_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Pod:
    """One pod of the StatefulSet, as its environment describes it."""

    set_name: str
    ordinal: int
    namespace: str
    service: str
    domain: str = "cluster.local"
    members: int = 3
    join: str = "off"
    data_dir: str = "/data"
    listen_host: str = "0.0.0.0"
    client_port: int = 7001
    raft_port: int = 7101
    metrics_port: int = 7201
    tls_dir: str = ""
    hosts: Mapping[str, str] = field(default_factory=dict)

    @property
    def node_id(self) -> int:
        return self.ordinal + 1

    @property
    def joining(self) -> bool:
        return self.ordinal >= self.members

    def stable_name(self, ordinal: int) -> str:
        """Pod `ordinal`'s DNS name through the headless Service."""
        return f"{self.set_name}-{ordinal}.{self.service}.{self.namespace}.svc.{self.domain}"

    def host(self, ordinal: int) -> str:
        name = self.stable_name(ordinal)
        return self.hosts.get(name, name)

    def peer(self, ordinal: int) -> Peer:
        host = self.host(ordinal)
        return Peer(ordinal + 1, f"{host}:{self.raft_port}", f"{host}:{self.client_port}")

    def bootstrap(self) -> list[Peer]:
        return [self.peer(i) for i in range(self.members)]

    def settings(self) -> dict[str, Any]:
        """The NodeConfig settings this pod's environment fixes."""
        peers = self.bootstrap() + ([self.peer(self.ordinal)] if self.joining else [])
        at = self.listen_host
        values: dict[str, Any] = {
            "node_id": self.node_id,
            "data_dir": self.data_dir,
            "peers": tuple(peers),
            "join": self.joining,
            "listen_client": f"{at}:{self.client_port}",
            "listen_raft": f"{at}:{self.raft_port}",
            "listen_metrics": f"{at}:{self.metrics_port}" if self.metrics_port else "",
        }
        if self.tls_dir:
            tls = Path(self.tls_dir)
            values |= {
                "tls_ca": str(tls / "ca.pem"),
                "tls_cert": str(tls / f"node-{self.node_id}.pem"),
                "tls_key": str(tls / f"node-{self.node_id}.key"),
            }
        return values


def pod_from_env(env: Mapping[str, str]) -> Pod:
    """The pod `env` describes (ConfigError naming the variable that is wrong)."""
    hostname = env.get("HOSTNAME", "")
    m = _POD_NAME.match(hostname)
    if m is None:
        raise ConfigError(
            f"HOSTNAME {hostname!r} has no pod ordinal: serve --from-env runs in a "
            "StatefulSet's pod, named NAME-N"
        )
    namespace = env.get("POD_NAMESPACE", "")
    if not namespace:
        raise ConfigError("POD_NAMESPACE is not set (the downward API's metadata.namespace)")
    set_name, ordinal = m.group(1), int(m.group(3))
    join = env.get("DLEDGER_JOIN", "off")
    if join not in JOIN_MODES:
        raise ConfigError(f"DLEDGER_JOIN must be one of {', '.join(JOIN_MODES)}, not {join!r}")
    pod = Pod(
        set_name=set_name,
        ordinal=ordinal,
        namespace=namespace,
        service=env.get("DLEDGER_SERVICE") or f"{set_name}-headless",
        domain=env.get("DLEDGER_CLUSTER_DOMAIN") or "cluster.local",
        members=_number(env, "DLEDGER_MEMBERS", 3),
        join=join,
        data_dir=env.get("DLEDGER_DATA_DIR") or "/data",
        listen_host=env.get("DLEDGER_LISTEN_HOST") or "0.0.0.0",
        client_port=_number(env, "DLEDGER_CLIENT_PORT", 7001),
        raft_port=_number(env, "DLEDGER_RAFT_PORT", 7101),
        metrics_port=_number(env, "DLEDGER_METRICS_PORT", 7201, low=0),
        tls_dir=env.get("DLEDGER_TLS_DIR", ""),
        hosts=_hosts(env.get("DLEDGER_HOSTS_FILE", "")),
    )
    if pod.members not in (1, 3, 5):
        raise ConfigError(f"DLEDGER_MEMBERS must be 1, 3 or 5 (voters), not {pod.members}")
    if pod.joining and join == "off":
        raise ConfigError(
            f"pod {hostname} (node {pod.node_id}) is beyond the {pod.members} bootstrap "
            "members (DLEDGER_MEMBERS) and DLEDGER_JOIN is off: set DLEDGER_JOIN=voter "
            "(or learner) to let it join, or scale the StatefulSet back"
        )
    return pod


def _number(env: Mapping[str, str], name: str, default: int, low: int = 1) -> int:
    text = env.get(name, "")
    if not text:
        return default
    if not text.isdigit() or int(text) < low:
        raise ConfigError(f"{name} must be an integer >= {low}, not {text!r}")
    return int(text)


def _hosts(path: str) -> dict[str, str]:
    """NAME -> ADDRESS from a hosts-format file (empty path: none)."""
    if not path:
        return {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"DLEDGER_HOSTS_FILE {path}: {exc.strerror}") from None
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = line.partition("#")[0].split()
        for name in words[1:]:
            out[name] = words[0]
    return out


# ---------------------------------------------------------------- joining


def before_serving(pod: Pod, cfg: NodeConfig, env: Mapping[str, str]) -> None:
    """For a joining pod: check that it may join, then start the thread that asks the
    cluster to add it (a bootstrap pod: nothing to do)."""
    if not pod.joining:
        return
    joiner = Joiner(pod, cfg, _access(pod, env))
    joiner.check()
    joiner.start()


def _access(pod: Pod, env: Mapping[str, str]) -> Access:
    ca = env.get("DLEDGER_TLS_CA") or (str(Path(pod.tls_dir) / "ca.pem") if pod.tls_dir else None)
    try:
        return Access.load(ca, env.get("DLEDGER_CREDENTIALS") or None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the join's client: {exc}") from None


class Joiner(threading.Thread):
    """Adds this pod's node to every shard, then (for `voter`) promotes it: each step
    asked again, after a pause, while the cluster refuses it or does not answer."""

    def __init__(self, pod: Pod, cfg: NodeConfig, access: Access) -> None:
        super().__init__(name="k8s-join", daemon=True)
        self._pod = pod
        self._cfg = cfg
        self._access = access
        self._servers = [p.client for p in pod.bootstrap()]
        self._data = Path(cfg.data_dir)
        self._last_said = ""

    def _client(self, shard: int) -> Client:
        return Client(
            self._servers,
            shard=shard,
            timeout_s=10.0,
            tls_ca=self._access.tls_ca,
            credentials=self._access.credentials,
        )

    def _me(self, client: Client) -> MemberInfo | None:
        return next((m for m in client.member_list() if m.id == self._cfg.node_id), None)

    def check(self) -> None:
        """Refuse (ClusterError) a new volume under the id of a voter, and a cluster that
        does not answer within _PROBE_S."""
        if (self._data / RAFT_STATE_FILE).exists():
            return
        deadline = time.monotonic() + _PROBE_S
        with self._client(1) as client:
            while True:
                try:
                    me = self._me(client)
                    break
                except ClientError as exc:
                    if time.monotonic() >= deadline:
                        raise ClusterError(
                            f"node {self._cfg.node_id} cannot join: no member of the cluster "
                            f"answered ({', '.join(self._servers)}): {exc.message}"
                        ) from None
                time.sleep(_RETRY_S)
        if me is not None and me.role == "voter":
            raise ClusterError(
                f"node {self._cfg.node_id} is a voter of the cluster, but {self._data} holds "
                "no Raft state (a new volume?): a voter that forgot its votes must not "
                f"come back; run `dledger member remove {self._cfg.node_id}` first"
            )

    def run(self) -> None:
        node, cfg = self._cfg.node_id, self._cfg
        if (self._data / JOINED_FILE).exists() and not self._member_of_shard_1():
            log.warning(
                "node %d was removed from the cluster after it joined: it does not add itself "
                "again (scale the StatefulSet down, or delete its volume to join anew)",
                node,
            )
            return
        for shard in shard_ids(cfg.shard_count):
            with self._client(shard) as client:
                self._until_done(client, shard)
        log.info("node %d: a %s of every shard", node, self._pod.join)

    def _member_of_shard_1(self) -> bool:
        with self._client(1) as client:
            while True:
                try:
                    return self._me(client) is not None
                except ClientError as exc:
                    self._say(f"cannot read the members yet: {exc.message}")
                time.sleep(_RETRY_S)

    def _until_done(self, client: Client, shard: int) -> None:
        """One step after the other (the leader waits for a learner to catch up before
        it promotes it, within the call's time), a pause only after a refusal."""
        node, cfg = self._cfg.node_id, self._cfg
        while True:
            try:
                me = self._me(client)
                if me is None:
                    client.member_add(node, cfg.me.raft, cfg.me.client, learner=True)
                    self._say(f"added to shard {shard} as a learner")
                    continue
                if shard == 1 and not (self._data / JOINED_FILE).exists():
                    (self._data / JOINED_FILE).write_text(f"{node}\n")
                if me.role == "voter" or self._pod.join == "learner":
                    return
                client.member_promote(node)
                self._say(f"a voter of shard {shard}")
                continue
            except ChangeRefused as exc:
                self._say(f"shard {shard} refuses for now: {exc.message}")
            except ClientError as exc:
                self._say(f"shard {shard} did not answer: {exc.message}")
            time.sleep(_RETRY_S)

    def _say(self, what: str) -> None:
        """Log `what` once, not at every retry."""
        if what != self._last_said:
            self._last_said = what
            log.info("node %d joining: %s", self._cfg.node_id, what)
