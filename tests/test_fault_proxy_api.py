"""The fault proxy's HTTP API (chaos/proxy/), driven through the toxiproxy-python client.

Proxies and toxics created, listed, updated and removed, the errors as Toxiproxy
gives them, `/populate`, and the partitions the API makes: a disabled proxy, a new
upstream, a reset. Runs against a real Toxiproxy with TOXIPROXY_URL set
(tests/fault_proxy_helpers.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from tests.fault_proxy_helpers import (
    Api,
    PairServer,
    connect,
    create,
    http,
    name,
    read_until_closed,
    recv_exactly,
    refused,
    roundtrip,
)

# The fixtures these tests take (pytest finds them by their names).
from tests.fault_proxy_helpers import fixture_api as fixture_api
from tests.fault_proxy_helpers import fixture_echo as fixture_echo
from tests.fault_proxy_helpers import fixture_pair as fixture_pair
from tests.fault_proxy_helpers import fixture_tp as fixture_tp


def test_version_and_running(tp: Any) -> None:
    assert tp.running()
    version: bytes = tp.version()
    assert b"2." in version


def test_create_list_get_destroy(tp: Any, echo: str) -> None:
    proxy = create(tp, "crud", echo)
    assert proxy.enabled is True and proxy.upstream == echo
    host, _, port = proxy.listen.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0  # the bound address, not ":0"

    listed = tp.proxies()
    assert listed[name("crud")].listen == proxy.listen
    shown = tp.get_proxy(name("crud"))
    assert shown is not None and shown.upstream == echo and shown.enabled is True
    with connect(proxy.listen) as sock:
        roundtrip(sock)

    assert proxy.destroy()
    assert tp.get_proxy(name("crud")) is None
    assert refused(proxy.listen)


def test_errors_are_toxiproxys(tp: Any, api: Api, echo: str) -> None:
    proxy = create(tp, "errors", echo)
    spec = {"name": name("errors"), "listen": "127.0.0.1:0", "upstream": echo}
    with pytest.raises(ProxyExists):  # the client checks first...
        tp.create(**spec)
    with pytest.raises(ProxyExists):  # ...and so does the server
        APIConsumer.post("/proxies", json=spec)
    assert http(api, "POST", "/proxies", spec) == (
        409,
        {"error": "proxy already exists", "status": 409},
    )

    missing = f"/proxies/{name('missing')}"
    assert http(api, "GET", missing) == (404, {"error": "proxy not found", "status": 404})
    with pytest.raises(NotFound):
        APIConsumer.get(missing)
    status, body = http(api, "POST", "/proxies", {"name": name("x")})
    assert status == 400 and body["error"].startswith("missing required field")
    status, body = http(api, "POST", "/proxies", raw=b"{not json")
    assert status == 400 and body["error"].startswith("bad request body")

    toxics = f"/proxies/{proxy.name}/toxics"
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="no_such_toxic")
    status, body = http(api, "POST", toxics, {"type": "latency", "stream": "sideways"})
    assert status == 400 and body["error"].startswith("stream was invalid")
    proxy.add_toxic(type="latency", attributes={"latency": 1})
    assert http(api, "POST", toxics, {"type": "latency"}) == (
        409,
        {"error": "toxic already exists", "status": 409},
    )
    for method in ("GET", "DELETE"):
        assert http(api, method, f"{toxics}/nope") == (
            404,
            {"error": "toxic not found", "status": 404},
        )


def test_toxic_crud(tp: Any, api: Api, echo: str) -> None:
    proxy = create(tp, "toxics", echo)
    proxy.add_toxic(type="latency", attributes={"latency": 100, "jitter": 10})
    proxy.add_toxic(
        type="timeout", stream="upstream", name="cut", toxicity=0.5, attributes={"timeout": 0}
    )
    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "cut"}  # default name: <type>_<stream>
    latency = toxics["latency_downstream"]
    assert (latency.type, latency.stream, latency.toxicity) == ("latency", "downstream", 1.0)
    assert latency.attributes == {"latency": 100, "jitter": 10}
    assert (toxics["cut"].stream, toxics["cut"].toxicity) == ("upstream", 0.5)

    # Updating (no client call for it) merges the given attributes into the toxic's.
    path = f"/proxies/{proxy.name}/toxics/latency_downstream"
    status, body = http(api, "POST", path, {"attributes": {"latency": 50}})
    assert status == 200 and body["attributes"] == {"latency": 50, "jitter": 10}
    assert http(api, "GET", path)[1]["attributes"] == {"latency": 50, "jitter": 10}
    status, shown = http(api, "GET", f"/proxies/{proxy.name}")
    assert {t["name"] for t in shown["toxics"]} == {"latency_downstream", "cut"}

    assert proxy.destroy_toxic("cut")
    assert proxy.get_toxic("cut") is None
    assert set(proxy.toxics()) == {"latency_downstream"}


def test_populate(tp: Any, api: Api, echo: str) -> None:
    status, body = http(
        api,
        "POST",
        "/populate",
        [
            {"name": name("pop1"), "listen": "127.0.0.1:0", "upstream": echo},
            {"name": name("pop2"), "listen": "127.0.0.1:0", "upstream": echo, "enabled": False},
        ],
    )
    assert status == 201
    made = {p["name"]: p for p in body["proxies"]}
    assert made[name("pop1")]["enabled"] is True and made[name("pop2")]["enabled"] is False
    listen = made[name("pop1")]["listen"]
    with connect(listen) as live:
        roundtrip(live)
        # The same name, listen and upstream again: left untouched (the connection lives).
        again = [{"name": name("pop1"), "listen": listen, "upstream": echo}]
        status, body = http(api, "POST", "/populate", again)
        assert status == 201 and body["proxies"][0]["listen"] == listen
        roundtrip(live)
    assert set(tp.proxies()) >= {name("pop1"), name("pop2")}


# --------------------------------------------------------------------------- partitions


def test_disable_cuts_live_connections_and_enable_restores(tp: Any, echo: str) -> None:
    proxy = create(tp, "partition", echo)
    with connect(proxy.listen) as live:
        roundtrip(live)
        proxy.disable()
        assert tp.get_proxy(proxy.name).enabled is False
        read_until_closed(live)  # the live connection is cut...
    assert refused(proxy.listen)  # ...and nothing listens
    proxy.enable()  # on the same address again
    with connect(proxy.listen) as sock:
        roundtrip(sock)
    with proxy.down():
        assert refused(proxy.listen)
    with connect(proxy.listen) as sock:
        roundtrip(sock)


def test_update_upstream_restarts_the_proxy(tp: Any, api: Api, echo: str, pair: PairServer) -> None:
    proxy = create(tp, "retarget", echo)
    with connect(proxy.listen) as old:
        roundtrip(old)
        status, body = http(api, "POST", f"/proxies/{proxy.name}", {"upstream": pair.address})
        assert status == 200 and body["upstream"] == pair.address
        assert body["listen"] == proxy.listen and body["enabled"] is True
        read_until_closed(old)  # changing upstream drops the connections
    with connect(proxy.listen) as client, pair.accept() as server:
        client.sendall(b"hello")
        assert recv_exactly(server, 5) == b"hello"


def test_reset_enables_all_and_removes_toxics(tp: Any, echo: str) -> None:
    proxy = create(tp, "reset", echo)
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 2000})
    proxy.disable()
    assert tp.reset()
    shown = tp.get_proxy(proxy.name)
    assert shown.enabled is True and shown.toxics() == {}
    with connect(proxy.listen) as sock:
        assert roundtrip(sock) < 1.5  # neither the timeout nor the 2 s latency is left
