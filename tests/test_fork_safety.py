"""Processes of the `dledger` command line start others while gRPC is live, safely.

grpcio 1.81+ with its fork support on restarts its poller in a child between fork and
exec, where the descriptors `subprocess.Popen` closes make it crash (grpc/grpc#43055):
`make run` once failed so, its Spark JVM never started. Importing `dledger_commitlog.cli`
imports grpc with that support off (unless the environment says otherwise) and takes the
setting out of the environment again. Here a fresh interpreter,
its environment without the setting, imports the package, keeps a channel busy, and
starts 150 children with a `preexec_fn` (as pyspark starts its JVM): every one must run.
Without the package's setting about one start in twelve failed on this machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTS = 150

CHILD = f"""
import os, subprocess, threading
import dledger_commitlog.cli  # before grpc, as every entry point imports it
import grpc
from concurrent import futures

server = grpc.server(futures.ThreadPoolExecutor(2))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{{port}}")
busy = threading.Event()

def traffic():
    while not busy.is_set():
        try:
            channel.unary_unary("/none/Call")(b"", timeout=0.05)
        except grpc.RpcError:
            pass

threading.Thread(target=traffic, daemon=True).start()
failed = 0
for _ in range({STARTS}):
    child = subprocess.Popen(["/bin/true"], preexec_fn=lambda: None, stderr=subprocess.PIPE)
    _, err = child.communicate()
    failed += child.returncode != 0 or bool(err)
busy.set()
inherited = subprocess.run(
    ["/bin/sh", "-c", "echo ${{GRPC_ENABLE_FORK_SUPPORT:-unset}}"], capture_output=True, text=True
).stdout.strip()
print(inherited, failed)
"""


def test_children_started_while_grpc_is_busy_all_run() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-c", CHILD]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # every child ran; and none inherits the setting (Spark's workers, forked from their
    # daemon, use gRPC after the fork: they keep its fork support)
    assert done.stdout.split() == ["unset", "0"], (done.stdout, done.stderr[-2000:])
