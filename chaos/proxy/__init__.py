"""The fault proxy: a TCP proxy per link whose faults are driven over Toxiproxy's HTTP API.

No Toxiproxy server or Docker engine is available everywhere the tests run, so this
package stands in for one: it serves the part of the Toxiproxy 2.x HTTP API that the
`toxiproxy-python` client uses, and forwards TCP connections through named proxies
whose "toxics" delay, throttle, blackhole, cut or reset the traffic. It is asyncio and
standard library only. Its modules, each importing only those above it in this list:

* `datapath`: one proxied connection's bytes, and what each toxic does to them;
* `proxies`: proxies and toxics as resources: fields, checks, errors, listeners;
* `api`: `FaultProxyServer`, the HTTP/JSON surface over the proxies;
* `serve`: `start_in_thread` / `FaultProxyThread`, and `main` for ``python -m chaos.proxy``.

Use it in-process from synchronous code (``handle = serve.start_in_thread()``, then
``handle.url`` and ``handle.stop()``), from asyncio code (``async with
api.FaultProxyServer(port=0) as server: ...``), or standalone
(``python -m chaos.proxy --listen 127.0.0.1:8474 [--config proxies.json]``).
"""
