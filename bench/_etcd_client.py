"""The etcd side's load generator for bench/vs_etcd.py: runs in etcd3's own venv.

Not to be run by hand: bench/vs_etcd.py starts it with the python of a venv that
has `etcd3` (PyPI; protobuf 3, which the project's venv cannot have), imports
nothing of the project. It connects to one etcd member (`--endpoint HOST:PORT`,
the leader), puts once to warm the channel, prints `ready`, waits for `go` on
stdin, runs `--workload` for `--seconds` and prints one JSON line: the puts done,
the wall time, this process's CPU seconds over that window (all threads), and the
latency of every call (microseconds; a call of `txn100x4` is a transaction of 100
puts).

- seq: one thread, one `put` at a time;
- inflight32: 32 threads sharing one client, one `put` at a time each;
- txn100x4: 4 threads, each a `transaction` of 100 puts (distinct keys) at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

TXN_OPS = 100  # below etcd's default --max-txn-ops (128)


def run(threads: int, call: Callable[[int], None], per_call: int, seconds: float) -> dict[str, Any]:
    """`call(worker)` in a loop on `threads` threads for `seconds`; the figures."""
    lat: list[float] = []
    end = time.perf_counter() + seconds

    def worker(w: int) -> None:
        while time.perf_counter() < end:
            t = time.perf_counter()
            call(w)
            lat.append(time.perf_counter() - t)

    pool = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    cpu, started = time.process_time(), time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "puts": len(lat) * per_call,
        "wall_s": wall,
        "cpu_s": cpu,
        "lat_us": [round(x * 1e6) for x in lat],
    }


def main() -> None:
    import etcd3  # type: ignore[import-not-found]  # only in etcd3's venv

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoint", required=True, help="HOST:PORT of the member to talk to")
    ap.add_argument("--workload", choices=("seq", "inflight32", "txn100x4"), required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--body-bytes", type=int, default=1024)
    args = ap.parse_args()
    host, port = args.endpoint.rsplit(":", 1)
    client = etcd3.client(host=host, port=int(port))
    body = b"m" * args.body_bytes
    client.put("bench/warm", body)
    if args.workload == "txn100x4":
        ops = [
            [client.transactions.put(f"bench/txn/{w}/{j}", body) for j in range(TXN_OPS)]
            for w in range(4)
        ]

        def txn(w: int) -> None:
            if not client.transaction(compare=[], success=ops[w], failure=[])[0]:
                raise RuntimeError("an unconditional transaction failed")

        threads, call, per_call = 4, txn, TXN_OPS
    else:

        def put(w: int) -> None:
            client.put(f"bench/{w}", body)

        threads, call, per_call = (1 if args.workload == "seq" else 32), put, 1
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    print(json.dumps(run(threads, call, per_call, args.seconds)), flush=True)
    client.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main()
    else:  # as `make bench` runs every bench/*.py
        print("bench/_etcd_client.py: the etcd client of bench/vs_etcd.py, which runs it")
