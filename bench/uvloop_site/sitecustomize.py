"""Benchmarks only: a node process started with this directory on its PYTHONPATH runs
its asyncio loop on uvloop (bench/client_port.py). The node itself does not choose."""

import uvloop

uvloop.install()
