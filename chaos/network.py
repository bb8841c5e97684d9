"""Network faults between Raft nodes: one link per ordered pair of nodes.

A `Network` knows the nodes' Raft addresses and can cut, restore, slow down and
heal the link from node `src` to node `dst` (what `src` sends to `dst`: its Raft
stream to `dst`; `dst`'s own messages to `src` travel on the other link, so one
direction can fail alone). Scenarios use only this interface.

`ToxiproxyNetwork` puts a Toxiproxy proxy on every ordered pair and drives it
with the `toxiproxy-python` client: node i dials proxy `n{i}_to_n{j}`, which
forwards to node j's Raft port. With `TOXIPROXY_URL` set it uses that Toxiproxy
2.x server; otherwise it starts our fault proxy (`chaos.proxy`) in a thread.
Nodes a run adds later (membership scenarios) are `spares`: their proxies, to and
from every other node, exist from the start (so every node's config can name its
link to them: node configs are written once), forwarding to an address nobody
listens on until `join(node, raft)` points them at the node's Raft port.
Invariants: `links()` is fixed at construction (the cluster's configs name those
addresses); `heal()` leaves every link enabled and free of toxics; `close()`
removes every proxy it created and stops the server it started.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from chaos.proxy.serve import FaultProxyThread, start_in_thread

Link = tuple[int, int]
NOWHERE = "127.0.0.1:1"  # a spare's upstream until it joins: connections are refused


class Network(Protocol):
    """The faults a scenario can inject between nodes (see the module doc)."""

    name: str

    def links(self) -> dict[Link, str]:
        """The address node i dials for node j, per (i, j); empty if nodes dial directly."""
        ...

    def cut(self, src: int, dst: int) -> None: ...

    def restore(self, src: int, dst: int) -> None: ...

    def slow(self, src: int, dst: int, latency_ms: int, jitter_ms: int = 0) -> None: ...

    def heal(self) -> None: ...

    def close(self) -> None: ...


def cut_between(net: Network, side: Iterable[int], others: Iterable[int]) -> None:
    """Cut every link, both directions, between the nodes in `side` and those in `others`."""
    others = list(others)
    for a in side:
        for b in others:
            net.cut(a, b)
            net.cut(b, a)


def partition(net: Network, nodes: Iterable[int], *groups: Iterable[int]) -> None:
    """Split `nodes` into `groups` (the rest form one more group) that cannot talk."""
    sets = [set(g) for g in groups]
    rest = set(nodes) - set().union(*sets)
    if rest:
        sets.append(rest)
    for k, group in enumerate(sets):
        for other in sets[k + 1 :]:
            cut_between(net, group, other)


def isolate(net: Network, node: int, nodes: Iterable[int]) -> None:
    partition(net, nodes, [node])


class ToxiproxyNetwork:
    """A Toxiproxy proxy per ordered pair of nodes (see the module doc)."""

    name = "toxiproxy"

    def __init__(
        self,
        raft_addresses: Mapping[int, str],
        url: str | None = None,
        prefix: str = "dledger",
        spares: Iterable[int] = (),
    ) -> None:
        from toxiproxy import Toxiproxy  # imported here: only chaos runs need it

        url = url if url is not None else os.environ.get("TOXIPROXY_URL") or None
        self._server: FaultProxyThread | None = None
        if url is None:
            self._server = start_in_thread()
            url = self._server.url
        parsed = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
        self.url = f"http://{parsed.hostname}:{parsed.port or 8474}"
        self._lock = threading.Lock()
        self._api = Toxiproxy()
        # toxiproxy-python keeps the server address in class attributes: one server per process.
        self._api.update_api_consumer(parsed.hostname, parsed.port or 8474)
        self._proxies: dict[Link, Any] = {}
        self._cut: set[Link] = set()
        self._slow: set[Link] = set()
        upstreams = {**{i: NOWHERE for i in spares}, **raft_addresses}
        try:
            for src in upstreams:
                for dst, upstream in upstreams.items():
                    if src != dst:
                        name = f"{prefix}_n{src}_to_n{dst}"
                        existing = self._api.get_proxy(name)
                        if existing is not None:  # left over by a run that died
                            existing.destroy()
                        self._proxies[(src, dst)] = self._api.create(
                            upstream=upstream, name=name, listen="127.0.0.1:0", enabled=True
                        )
        except BaseException:
            self.close()
            raise
        self._links = {link: p.listen for link, p in self._proxies.items()}

    def links(self) -> dict[Link, str]:
        return dict(self._links)

    def join(self, node: int, raft: str) -> None:
        """Spare `node` runs at `raft`: the links to it forward there from now on."""
        from toxiproxy.api import APIConsumer

        with self._lock:
            for (_, dst), proxy in sorted(self._proxies.items()):
                if dst == node and proxy.upstream != raft:
                    APIConsumer.post(f"/proxies/{proxy.name}", json={"upstream": raft})
                    proxy.upstream = raft

    def cut(self, src: int, dst: int) -> None:
        with self._lock:
            if (src, dst) not in self._cut:
                self._proxies[(src, dst)].disable()
                self._cut.add((src, dst))

    def restore(self, src: int, dst: int) -> None:
        with self._lock:
            if (src, dst) in self._cut:
                self._proxies[(src, dst)].enable()
                self._cut.discard((src, dst))

    def slow(self, src: int, dst: int, latency_ms: int, jitter_ms: int = 0) -> None:
        """Delay what `src` sends to `dst` (and the replies on that connection)."""
        with self._lock:
            proxy = self._proxies[(src, dst)]
            if (src, dst) in self._slow:
                proxy.destroy_toxic("chaos_latency")
            proxy.add_toxic(
                name="chaos_latency",
                type="latency",
                stream="upstream",
                attributes={"latency": latency_ms, "jitter": jitter_ms},
            )
            self._slow.add((src, dst))

    def heal(self) -> None:
        with self._lock:
            for link in sorted(self._slow):
                self._proxies[link].destroy_toxic("chaos_latency")
            for link in sorted(self._cut):
                self._proxies[link].enable()
            self._slow.clear()
            self._cut.clear()

    @property
    def faulty(self) -> set[Link]:
        """The links cut or slowed right now."""
        with self._lock:
            return self._cut | self._slow

    def close(self) -> None:
        try:
            for proxy in self._proxies.values():
                proxy.destroy()
        except Exception:  # the server may already be gone; stop ours anyway
            if self._server is None:
                raise
        finally:
            self._proxies.clear()
            if self._server is not None:
                self._server.stop()
                self._server = None

    def __enter__(self) -> ToxiproxyNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
