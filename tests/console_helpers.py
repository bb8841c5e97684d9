"""A `dledger console` process of a test, and HTTP calls to it over loopback.

`with_accounts` gives a cluster with an ACL accounts beside its admin one.
`running_console` starts the console as the CLI does (`dledger console --cluster
FILE --port 0`), reads the URL it announces, and stops it (SIGTERM, then SIGKILL)
when the block ends, pass or fail. `Http` makes real HTTP/1.1 requests with
http.client (TLS with the cluster's CA where the console serves HTTPS) and gives
back the status, the headers and the body, parsed when it is JSON.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client, load_credentials
from dledger_commitlog.client.groups import Delivery, Subscription
from dledger_commitlog.node.acl import Account, write_acl

ROOT = Path(__file__).resolve().parent.parent
START_S = 20.0


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]  # names lower-case
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> Mapping[str, Any]:
        doc: Mapping[str, Any] = self.json["error"]
        return doc


def with_accounts(cluster: LocalCluster, *accounts: Account) -> tuple[str, str]:
    """Write the layout of `cluster` (made with `acl=True`, not started) with an ACL of
    its admin account and `accounts`; the admin's (access key, secret key)."""
    cluster._write_layout()  # the admin account, then ours beside it
    admin = load_credentials(cluster.directory / "admin.credentials")
    write_acl(cluster.directory / "acl.toml", [Account(*admin, admin=True), *accounts])
    return admin


def console_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@contextmanager
def running_console(cluster: LocalCluster, *extra: str) -> Iterator[Http]:
    """A console of `cluster` on a free loopback port, stopped when the block ends."""
    argv = [sys.executable, "-m", "dledger_commitlog", "console"]
    argv += ["--cluster", str(cluster.cluster_file), "--port", "0", *extra]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=console_env(),
        cwd=ROOT,
    )
    try:
        url = _announced(proc)
        yield Http(url, cluster.tls_ca)
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


def _announced(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + START_S
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("console: serving "):
            return line.split()[-1]
        assert time.monotonic() < deadline, f"the console did not start: {''.join(seen)}"
    raise AssertionError(f"the console exited ({proc.wait()}): {''.join(seen)}")


class Http:
    """Requests to the console at `base` (its `/api/v1` URL)."""

    def __init__(self, base: str, tls_ca: Path | None = None) -> None:
        self.base = base
        parts = urlsplit(base)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path
        self.https = parts.scheme == "https"
        self.tls_ca = tls_ca
        self.auth: tuple[str, str] | None = None

    def as_user(self, access_key: str, secret_key: str) -> Http:
        other = Http(self.base, self.tls_ca)
        other.auth = (access_key, secret_key)
        return other

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        timeout_s: float = 30.0,
    ) -> Reply:
        conn: http.client.HTTPConnection
        if self.https:
            context = ssl.create_default_context(cafile=str(self.tls_ca))
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout_s, context=context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        if self.auth is not None:
            token = base64.b64encode(":".join(self.auth).encode()).decode()
            pairs.append(("Authorization", f"Basic {token}"))
        try:
            conn.putrequest(method, self.prefix + path, skip_accept_encoding=True)
            for name, value in pairs:
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def put(self, topic: str, body: bytes, query: str = "", **headers: str) -> Reply:
        sent = {"Content-Type": "application/octet-stream", **headers}
        return self.request("POST", f"/topics/{topic}/messages{query}", body, sent)

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def post_json(self, path: str, doc: Any) -> Reply:
        body = json.dumps(doc).encode()
        return self.request("POST", path, body, {"Content-Type": "application/json"})


def consume(http: Http, group: str, topic: str, count: int, *, leave: bool = True) -> str:
    """Join `group` over HTTP, fetch and ack `count` messages of `topic`, then leave
    (unless not `leave`); the member's id. Fails if they do not come within 30 s."""
    member = str(http.post_json(f"/groups/{group}/members", {"topic": topic}).json["member_id"])
    base = f"/groups/{group}/members/{member}"
    got, deadline = 0, time.monotonic() + 30.0
    while got < count:
        assert time.monotonic() < deadline, f"{group} got {got} of {count} messages"
        batch = http.get(f"{base}/messages?max=64&wait_ms=1000").json["messages"]
        if batch:
            handles = [m["handle"] for m in batch]
            assert http.post_json(f"{base}/ack", {"handles": handles}).status == 200
            got += len(batch)
    if leave:
        assert http.request("DELETE", base).status == 200
    return member


def committed(http: Http, group: str, topic: str) -> dict[tuple[int, int], int]:
    """The group's committed offset of each (shard, queue id) of `topic`, as GET
    /groups/{group} shows them."""
    doc = http.get(f"/groups/{group}").json
    return {
        (s["shard"], q["queue_id"]): q["committed"]
        for s in doc["shards"]
        for q in s["queues"]
        if q["topic"] == topic
    }


def fetch_one(client: Client, group: str, member: str, topic: str) -> Delivery:
    """The next delivery to `member` (heartbeating as it waits); fails after 20 s."""
    deadline = time.monotonic() + 20.0
    while True:
        assert time.monotonic() < deadline, f"{member} got nothing of {group}"
        client.group_heartbeat(group, member, [Subscription(topic)], max_reconsume=1)
        got = client.group_fetch(group, member, 1, wait_ms=500).deliveries
        if got:
            return got[0]


def nack_and_retry(client: Client, group: str, topic: str, *, then_ack: bool) -> str:
    """A member of `group` (max_reconsume 1) takes the one message of `topic`, nacks it
    on delay level 1 (1 s), takes its retry and acks it, or nacks it too (the retries
    are spent: a dead letter); then leaves. The member's id."""
    member = f"{group}-member"
    first = fetch_one(client, group, member, topic)
    assert first.message.topic == topic
    assert client.group_nack(group, member, first.handle, delay_level=1)[0] == "retry"
    retry = fetch_one(client, group, member, topic)
    assert retry.message.topic == "%RETRY%" + group and retry.reconsume_times == 1
    if then_ack:
        assert client.group_ack(group, member, [retry.handle]) == 1
    else:
        assert client.group_nack(group, member, retry.handle)[0] == "dead-letter"
    client.group_leave(group, member)
    return member
