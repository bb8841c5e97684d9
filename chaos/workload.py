"""The chaos workload: client threads that put unique messages and read them back.

Each client thread owns a `Client` of the whole cluster for its puts (it fails
over like any user's client) and one single-node client per replica for reads,
so reads hit followers and leaders alike. Every put carries a UNIQ_KEY derived
from (seed, client, sequence) and a body naming that key; every read fetches by
offset a message some client saw acknowledged. Everything is recorded in the
`History`: ok with the offset, fail (definitely not stored: the client's
`Unavailable`, `InvalidArgument`, ...) or unknown (`OutcomeUnknown`).
The servers may change during a run (membership scenarios): `add_server` and
`remove_server` take effect at each thread's next operation; writers know the
current members, readers every node that ever joined (a removed node must refuse).
Invariant: a put's UNIQ_KEY is chosen before its first attempt and reused by
the client's retries, so an unknown put lands at most once.
"""

from __future__ import annotations

import random
import threading
import zlib
from collections.abc import Sequence

from chaos.history import FAIL, OK, UNKNOWN, History
from dledger_commitlog.client import Client, ClientError, OutcomeUnknown

TOPIC = "chaos"


def body_for(key: str, size: int) -> bytes:
    return f"{key}|".encode().ljust(size, b".")


class Workload:
    """`clients` threads of puts (and `read_ratio` reads) until `stop()`."""

    def __init__(
        self,
        servers: Sequence[str],
        history: History,
        seed: int,
        clients: int = 4,
        body_bytes: int = 128,
        read_ratio: float = 0.2,
        timeout_s: float = 3.0,
        cluster: str = "dledger",
    ) -> None:
        self.servers = list(servers)  # the writers' (the current members)
        self.read_servers = list(servers)  # the readers' (every node that ever joined)
        self._version = 0  # of the two lists
        self.history = history
        self.seed = seed
        self.clients = clients
        self.body_bytes = body_bytes
        self.read_ratio = read_ratio
        self.timeout_s = timeout_s
        self.cluster = cluster
        self.errors: list[BaseException] = []  # anything but a ClientError: a harness bug
        self._acked: list[tuple[int, str]] = []  # (offset, key) any client saw acknowledged
        self.last_acked_start = -1.0  # history time: when the latest-invoked acked put began
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._guarded, args=(p,), name=f"chaos-client-{p}", daemon=True)
            for p in range(clients)
        ]

    def start(self) -> Workload:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop invoking; wait for the operations in flight (each ends within the timeout)."""
        self._stop.set()
        for t in self._threads:
            if t.ident is not None:  # started (a run that failed early never started them)
                t.join(timeout_s)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"chaos clients still running after {timeout_s:g}s: {alive}")

    def add_server(self, address: str) -> None:
        with self._lock:
            self.servers = [*self.servers, address]  # new lists: threads hold the old ones
            self.read_servers = [*self.read_servers, address]
            self._version += 1

    def remove_server(self, address: str) -> None:
        with self._lock:
            self.servers = [s for s in self.servers if s != address]
            self._version += 1

    def acked_count(self) -> int:
        with self._lock:
            return len(self._acked)

    def _guarded(self, process: int) -> None:
        try:
            self._run(process)
        except BaseException as exc:  # surfaced by the runner as a harness failure
            self.errors.append(exc)

    def _run(self, process: int) -> None:
        rng = random.Random(self.seed * 1_000_003 + process)
        opts = {"cluster": self.cluster, "timeout_s": self.timeout_s}
        version = -1
        writer: Client | None = None
        readers: dict[str, Client] = {}
        try:
            seq = 0
            while not self._stop.is_set():
                with self._lock:
                    target = rng.choice(self._acked) if self._acked else None
                    changed = version != self._version
                    version, servers, read_servers = self._version, self.servers, self.read_servers
                if changed or writer is None:  # between two puts: a put's retries keep one
                    if writer is not None:
                        writer.close()
                    writer = Client(servers, attempt_timeout_s=1.0, **opts)
                    for s in read_servers:
                        if s not in readers:
                            readers[s] = Client([s], max_retries=0, **opts)
                if target is not None and rng.random() < self.read_ratio:
                    self._read(process, readers[rng.choice(read_servers)], *target)
                else:
                    self._put(
                        process, writer, f"{self.seed & 0xFFFFFFFF:08X}{process:04X}{seq:08X}"
                    )
                    seq += 1
        finally:
            if writer is not None:
                writer.close()
            for r in readers.values():
                r.close()

    def _put(self, process: int, client: Client, key: str) -> None:
        body = body_for(key, self.body_bytes)
        crc = zlib.crc32(body)
        op = self.history.invoke(process, "put", key, crc=crc)
        invoked = self.history.now()
        try:
            result = client.put(TOPIC, body, uniq_key=key)
        except OutcomeUnknown as exc:
            self.history.complete(op, UNKNOWN, detail=str(exc)[:200])
        except ClientError as exc:
            self.history.complete(op, FAIL, detail=f"{type(exc).__name__}: {exc}"[:200])
        else:
            self.history.complete(op, OK, offset=result.commitlog_offset)
            with self._lock:
                self._acked.append((result.commitlog_offset, key))
                self.last_acked_start = max(self.last_acked_start, invoked)

    def _read(self, process: int, client: Client, offset: int, key: str) -> None:
        op = self.history.invoke(process, "read", key, offset=offset)
        try:
            m = client.get(offset=offset)
        except ClientError as exc:  # a lagging or unreachable replica: no promise broken
            self.history.complete(op, FAIL, detail=f"{type(exc).__name__}: {exc}"[:200])
        else:
            self.history.complete(op, OK, key=m.uniq_key, crc=zlib.crc32(m.body))
