"""deploy/kubernetes/ without a Kubernetes cluster: rendered, validated, and run.

Rendering is `tests/kustomize.py` (the subset of kustomize the manifests use);
every object of the base and of each overlay is validated offline against the
Kubernetes API's JSON schemas (kubernetes-validate, strict: an unknown field
fails) of the oldest and the newest version docs/kubernetes.md supports. The
invariants a reviewer would check by eye are asserted on the rendered objects.

Then the StatefulSet's own container runs: `pods` plays the kubelet for pods
dledger-0..2 of each rendered layout (base, tls-acl, shards). It writes the
ConfigMap's keys and the Secrets (for tls-acl: a PKI, an ACL with one admin, its
credentials) into a directory per mount, starts the container's args (`dledger
serve --from-env ...`) with the container's environment (HOSTNAME set,
POD_NAMESPACE from the downward API), and two variables only a test gives: each pod
listens on its own loopback address (127.X.Y.N+1, the same ports in every pod, as
pods on a pod network) and DLEDGER_HOSTS_FILE maps each pod's stable DNS name to
that address, since this machine has no cluster DNS. Small log segments are passed
as `serve` options. The three form a cluster and serve a put and a get; pod
dledger-3 then joins by itself as a voter (of every shard with the shards overlay,
as the admin over TLS with tls-acl), and a pod whose volume is new under the id of
a voter is refused.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import re
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from dledger_commitlog.cli import commands, k8s_entry, probe
from dledger_commitlog.cli import main as cli
from dledger_commitlog.cli.certs import make_dev_pki
from dledger_commitlog.client import Client
from dledger_commitlog.common.routes import shard_ids
from dledger_commitlog.node.acl import Account, write_acl
from dledger_commitlog.node.config import ConfigError, NodeConfig
from tests.conftest import MAX_MESSAGE_BYTES, SMALL_SEGMENTS, wait_until
from tests.kustomize import KustomizeError, Obj, merge, render

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
LAYOUTS = ("base", "overlays/tls-acl", "overlays/shards")
VERSIONS = ("1.29.0", latest_version())  # docs/kubernetes.md: Kubernetes 1.29 or newer
NAMESPACE = "orders"
V = TypeVar("V")
SECRETS = {"dledger-cluster-secret": {"cluster.secret": "k8s-test-secret-0123456789abcdef"}}


def rendered(layout: str) -> list[Obj]:
    return render(KUBE / layout)


def the(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    (obj,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return obj


def container(objects: list[Obj]) -> Obj:
    (c,) = the(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert isinstance(c, dict)
    return c


# ---------------------------------------------------------------- the renderer


def test_the_renderer_merges_as_kubernetes_does() -> None:
    base = {
        "containers": [{"name": "a", "env": [{"name": "X", "value": "1"}], "args": ["x", "y"]}],
        "ports": [{"port": 1, "name": "p"}],
        "probe": {"grpc": {"port": 1}, "periodSeconds": 5},
    }
    patch = {
        "containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}], "args": ["z"]}],
        "ports": [{"port": 1, "name": "q"}, {"port": 2}],
        "probe": {"grpc": None, "exec": {"command": ["true"]}},
    }
    assert merge(base, patch) == {
        "containers": [
            {
                "name": "a",
                "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
                "args": ["z"],
            }
        ],
        "ports": [{"port": 1, "name": "q"}, {"port": 2}],
        "probe": {"periodSeconds": 5, "exec": {"command": ["true"]}},
    }


def test_the_renderer_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nimages:\n  - name: x\n")
    with pytest.raises(KustomizeError, match="outside the subset"):
        render(tmp_path)


# ---------------------------------------------------------------- the manifests


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_object_is_valid_against_the_kubernetes_schemas(layout: str) -> None:
    objects = rendered(layout)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ConfigMap", "PodDisruptionBudget", "Service", "Service", "StatefulSet"]
    for obj in objects:
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_validation_catches_a_wrong_field() -> None:
    sts = copy.deepcopy(the(rendered("base"), "StatefulSet"))
    sts["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grcp"] = {"port": 7001}
    with pytest.raises(kubernetes_validate.ValidationError, match="grcp"):
        kubernetes_validate.validate(sts, VERSIONS[0], strict=True)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_invariants(layout: str) -> None:
    objects = rendered(layout)
    sts = the(objects, "StatefulSet")
    spec, pod = sts["spec"], sts["spec"]["template"]
    labels = pod["metadata"]["labels"]
    c = container(objects)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # three pods, all at once, stable names through the headless Service
    headless = the(objects, "Service", spec["serviceName"])
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["DLEDGER_SERVICE"] == spec["serviceName"] and env["DLEDGER_MEMBERS"] == "3"
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    for svc in (headless, the(objects, "Service", "dledger")):
        assert svc["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports.keys()
    # a volume per pod, on the data directory
    (claim,) = spec["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == env["DLEDGER_DATA_DIR"] == "/data"
    # at most one pod away by eviction
    pdb = the(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # probes through grpc.health.v1 on the client port (where the node serves it)
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = c[name]
        if layout == "overlays/tls-acl":  # the kubelet's gRPC probe speaks no TLS
            assert "grpc" not in check
            module, address = check["exec"]["command"][2:4]
            assert module == "dledger_commitlog.cli.probe"
            assert address == f"127.0.0.1:{ports['client']}"
        else:
            assert check["grpc"]["port"] == ports["client"]
    # the preStop hook drains this pod's node: ordinal + 1
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"]
    assert command[2] == "exec dledger node drain --node $(( ${HOSTNAME##*-} + 1 ))"
    # Prometheus finds the metrics port
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    assert int(notes["prometheus.io/port"]) == ports["metrics"]
    # requests, and nobody is root
    assert {"cpu", "memory"} <= c["resources"]["requests"].keys()
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] >= 1000
    assert security["fsGroup"] == security["runAsGroup"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # the secrets are Secrets, mounted read-only
    for volume in pod["spec"]["volumes"]:
        if "secret" in volume:
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
            assert mount["readOnly"] is True
            assert volume["secret"]["secretName"] in (ROOT / "docs/kubernetes.md").read_text()


def test_the_image_runs_as_the_user_of_the_pods() -> None:
    text = (ROOT / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    security = the(rendered("base"), "StatefulSet")["spec"]["template"]["spec"]["securityContext"]
    assert (int(user[0]), int(user[1])) == (security["runAsUser"], security["runAsGroup"])
    assert "chown 10001:10001 /data" in text  # compose's named volumes take this owner


def pod_config(objects: list[Obj], ordinal: int, root: Path) -> NodeConfig:
    """The config pod `ordinal` of `objects` runs, through the entrypoint's own code."""
    argv, env = kubelet(objects, ordinal, root)
    args = cli.build_parser().parse_args(argv[3:])
    assert args.run is cli._serve and args.from_env
    return cli.serve_config(args, k8s_entry.pod_from_env(env).settings())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_pod_gets_a_valid_config(layout: str, tmp_path: Path) -> None:
    objects = rendered(layout)
    for ordinal in range(5):
        cfg = pod_config(objects, ordinal, tmp_path / str(ordinal))
        name = f"dledger-{ordinal}.dledger-headless.{NAMESPACE}.svc.cluster.local"
        assert cfg.node_id == ordinal + 1 and cfg.join == (ordinal >= 3)
        assert cfg.me.raft == f"{name}:7101" and cfg.me.client == f"{name}:7001"
        assert [p.id for p in cfg.peers] == [1, 2, 3] + ([ordinal + 1] if ordinal >= 3 else [])
        assert cfg.listen_client == "0.0.0.0:7001" and cfg.listen_metrics == "0.0.0.0:7201"
        assert cfg.peer_secret_file.endswith("cluster.secret")
        if layout == "overlays/tls-acl":
            assert not cfg.insecure and cfg.acl_file.endswith("acl.toml")
            assert cfg.tls_cert.endswith(f"/node-{ordinal + 1}.pem")
        else:
            assert cfg.insecure and not cfg.tls_cert and not cfg.acl_file
        assert cfg.shard_count == (3 if layout == "overlays/shards" else 1)


# ---------------------------------------------------------------- the entrypoint's refusals


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"HOSTNAME": "dledger"}, "HOSTNAME 'dledger' has no pod ordinal"),
        ({"HOSTNAME": "dledger-x"}, "has no pod ordinal"),
        ({"HOSTNAME": "dledger-0"}, "POD_NAMESPACE is not set"),
        (
            {"HOSTNAME": "dledger-3", "POD_NAMESPACE": "o"},
            "pod dledger-3 (node 4) is beyond the 3 bootstrap members (DLEDGER_MEMBERS) "
            "and DLEDGER_JOIN is off",
        ),
        ({"HOSTNAME": "dledger-0", "POD_NAMESPACE": "o", "DLEDGER_MEMBERS": "4"}, "1, 3 or 5"),
        ({"HOSTNAME": "dledger-0", "POD_NAMESPACE": "o", "DLEDGER_JOIN": "yes"}, "DLEDGER_JOIN"),
        ({"HOSTNAME": "dledger-0", "POD_NAMESPACE": "o", "DLEDGER_RAFT_PORT": "-1"}, "RAFT_PORT"),
    ],
)
def test_bad_pod_environments_are_one_line_and_exit_2(
    env: dict[str, str],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in [n for n in os.environ if n.startswith("DLEDGER_") or n == "POD_NAMESPACE"]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DLEDGER_DATA_DIR", str(tmp_path / "data"))
    assert cli.main(["serve", "--from-env"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "data").exists()  # refused before anything was made
    with pytest.raises(ConfigError):
        k8s_entry.pod_from_env(env)


# ---------------------------------------------------------------- pods that run


def kubelet(
    objects: list[Obj],
    ordinal: int,
    root: Path,
    extra_env: dict[str, str] | None = None,
    secrets: dict[str, dict[str, str]] = SECRETS,
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of pod `ordinal`'s container, its volumes written
    under `root` (ConfigMap keys and Secrets as files; claims and emptyDirs empty)."""
    sts = the(objects, "StatefulSet")
    c = container(objects)
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    local: dict[str, Path] = {}
    for mount in c["volumeMounts"]:
        where = root / mount["mountPath"].strip("/").replace("/", "_")
        where.mkdir(parents=True, exist_ok=True)
        volume = volumes.get(mount["name"], {})
        files: dict[str, str] = {}
        if "configMap" in volume:
            files = the(objects, "ConfigMap", volume["configMap"]["name"])["data"]
        elif "secret" in volume:
            files = secrets.get(volume["secret"]["secretName"], {})
        local[mount["mountPath"]] = where
        for name, text in files.items():
            (where / name).write_text(text)
    # A path in a ConfigMap's file names a mount too: all replaced in one pass, so a
    # replaced path is never replaced again (a mount at /tmp, a test's root under /tmp).
    mounted = re.compile('"(' + "|".join(re.escape(p) for p in sorted(local, key=len)[::-1]) + ")/")
    for where in local.values():
        for file in where.iterdir():
            text = mounted.sub(lambda m: f'"{local[m.group(1)]}/', file.read_text())
            file.write_text(text)

    def on_this_machine(text: str) -> str:
        for path, where in local.items():
            if text == path or text.startswith(path + "/"):
                return str(where) + text[len(path) :]
        return text

    env = {"HOSTNAME": f"{sts['metadata']['name']}-{ordinal}"}
    for e in c["env"]:
        if "valueFrom" in e:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
            env[e["name"]] = NAMESPACE
        else:
            env[e["name"]] = on_this_machine(e["value"])
    argv = [sys.executable, "-m", "dledger_commitlog", *map(on_this_machine, c["args"])]
    return argv, env | (extra_env or {})


class Pods:
    """Pods of a rendered layout started as processes (see the module doc)."""

    def __init__(self, root: Path, layout: str) -> None:
        self.root = root
        self.objects = rendered(layout)
        node_toml = the(self.objects, "ConfigMap")["data"]["node.toml"]
        self.shards = shard_ids(tomllib.loads(node_toml).get("shards", {}).get("count", 1))
        self.net = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
        self.hosts = root / "hosts"
        self.hosts.write_text(
            "".join(
                f"{self.ip(i)} dledger-{i}.dledger-headless.{NAMESPACE}.svc.cluster.local\n"
                for i in range(5)
            )
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.secrets = dict(SECRETS)
        self.tls_ca = ""
        self.credentials: tuple[str, str] | None = None
        if layout == "overlays/tls-acl":
            self._tls_and_acl()

    def _tls_and_acl(self) -> None:
        """The Secrets docs/kubernetes.md makes: node certificates naming the pods'
        addresses, an ACL with one admin, the admin's credentials."""
        pki = make_dev_pki(self.root / "pki", range(1, 6), [self.ip(i) for i in range(5)])
        tls = {"ca.pem": pki.ca.read_text()}
        for i in range(1, 6):
            tls |= {f"node-{i}.pem": pki.node_cert(i).read_text()}
            tls |= {f"node-{i}.key": pki.node_key(i).read_text()}
        secret_key = "k8s-test-admin-secret-key"
        write_acl(self.root / "acl.toml", [Account("admin", secret_key, admin=True)])
        self.secrets |= {
            "dledger-tls": tls,
            "dledger-acl": {"acl.toml": (self.root / "acl.toml").read_text()},
            "dledger-admin": {
                "admin.credentials": f'access_key = "admin"\nsecret_key = "{secret_key}"\n'
            },
        }
        self.tls_ca, self.credentials = str(pki.ca), ("admin", secret_key)

    def client(self, servers: list[str], timeout_s: float, shard: int = 1) -> Client:
        return Client(
            servers,
            timeout_s=timeout_s,
            shard=shard,
            tls_ca=self.tls_ca or None,
            credentials=self.credentials,
        )

    def probe(self, address: str, *more: str) -> int:
        return probe.main([address, *more, *(["--tls-ca", self.tls_ca] if self.tls_ca else [])])

    def ip(self, ordinal: int) -> str:
        return f"{self.net}.{ordinal + 1}"

    def client_address(self, ordinal: int) -> str:
        return f"{self.ip(ordinal)}:7001"

    def start(self, ordinal: int, name: str = "") -> subprocess.Popen[bytes]:
        name = name or f"dledger-{ordinal}"
        home = self.root / name
        test_only = {"DLEDGER_LISTEN_HOST": self.ip(ordinal), "DLEDGER_HOSTS_FILE": str(self.hosts)}
        argv, env = kubelet(self.objects, ordinal, home, test_only, self.secrets)
        small = ["--max-message-bytes", str(MAX_MESSAGE_BYTES)]
        for setting, value in SMALL_SEGMENTS.items():
            small += ["--" + setting.replace("_", "-"), str(value)]
        with (home / "log").open("wb") as log:
            proc = subprocess.Popen(
                [*argv, *small],
                env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def wait(
        self,
        observe: Callable[[], V],
        timeout_s: float,
        what: str,
        ok: Callable[[V], object] = bool,
    ) -> V:
        """`wait_until`, with the pods' logs in the failure."""
        try:
            return wait_until(observe, timeout_s, what, ok)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def log(self, name: str) -> str:
        return (self.root / name / "log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"-- {n}:\n{self.log(n)[-3000:]}" for n in self.procs)

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module", params=LAYOUTS)
def pods(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pods]:
    running = Pods(tmp_path_factory.mktemp("pods"), request.param)
    try:
        for ordinal in range(3):
            running.start(ordinal)
        yield running
    finally:
        running.stop()


def members(client: Client) -> dict[int, str]:
    return {m.id: m.role for m in client.member_list()}


def test_three_pods_form_a_cluster_and_serve(pods: Pods) -> None:
    servers = [pods.client_address(i) for i in range(3)]
    with pods.client(servers, timeout_s=20) as client:
        put = pods.wait(lambda: client.put("orders", b"hello from a pod"), 20, "a put")
        assert members(client) == {1: "voter", 2: "voter", 3: "voter"}
    for i in range(3):  # every replica serves it (once it has applied it)
        with pods.client([pods.client_address(i)], timeout_s=5) as one:
            got = pods.wait(partial(one.get, put.msg_id), 10, f"the get on pod {i}")
            assert got.body == b"hello from a pod"
    assert pods.probe(pods.client_address(0)) == 0
    assert pods.probe(f"{pods.ip(4)}:7001", "--timeout", "0.5") == 1  # nobody there


def test_a_fourth_pod_joins_as_a_voter(pods: Pods) -> None:
    servers = [pods.client_address(i) for i in range(3)]
    with pods.client(servers, timeout_s=10) as client:
        put = client.put("orders", b"before the fourth")
        pods.start(3)
    for shard in pods.shards:  # a voter of every shard
        with pods.client(servers, timeout_s=10, shard=shard) as client:
            pods.wait(
                partial(members, client),
                20,
                f"node 4 a voter of shard {shard}",
                lambda m: m.get(4) == "voter",
            )
    assert (pods.root / "dledger-3" / "data" / k8s_entry.JOINED_FILE).read_text() == "4\n"
    with pods.client([pods.client_address(3)], timeout_s=5) as four:
        got = pods.wait(partial(four.get, put.msg_id), 10, "the get on node 4")
        assert got.body == b"before the fourth"


def test_a_new_volume_under_a_voters_id_is_refused(pods: Pods) -> None:
    with pods.client([pods.client_address(0)], timeout_s=10) as client:
        if members(client).get(4) != "voter":
            pytest.skip("needs node 4 a voter (test_a_fourth_pod_joins_as_a_voter)")
    proc = pods.start(3, name="dledger-3-new-volume")
    assert proc.wait(timeout=20) == 1
    err = pods.log("dledger-3-new-volume").strip().splitlines()
    assert len(err) == 1, err
    assert "node 4 is a voter of the cluster" in err[0]
    assert "dledger member remove 4" in err[0]


def test_the_env_contract_of_the_manifest() -> None:
    """Every variable the StatefulSet sets is one the entrypoint reads, or the CLI's
    commands run in the pod (`commands.make_client`: DLEDGER_SERVERS)."""
    doc = k8s_entry.__doc__ or ""
    cli_reads = Path(commands.__file__).read_text()
    for e in container(rendered("overlays/tls-acl"))["env"]:
        assert e["name"] in doc or f'"{e["name"]}"' in cli_reads, e["name"]
    values: dict[str, Any] = tomllib.loads(the(rendered("base"), "ConfigMap")["data"]["node.toml"])
    assert values["security"]["insecure"] is True
