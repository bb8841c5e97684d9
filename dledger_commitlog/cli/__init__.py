"""The `dledger` command line (`cli.main`) and what it starts: clusters of local node
processes (`launcher`), their layout and config files.

gRPC is imported here first, with its fork support off, for every process that runs
this package (unless the environment already says): these processes start others with
`subprocess` (nodes, Spark's JVM) while their gRPC channels are live, and with fork
support on, grpcio (1.81 and later, grpc/grpc#43055) restarts its poller in the child
between fork and exec, where the descriptors Popen closes make it crash: the child dies
before it runs (16 starts in 200 measured here; `make run` once lost its Spark JVM so).
grpcio reads the setting once, at import: it is taken out of the environment again, so
the processes started keep gRPC's default (Spark's Python workers are forked from a
daemon and use gRPC after the fork: they need it).
"""

import os

_FORK_SUPPORT = "GRPC_ENABLE_FORK_SUPPORT"

if _FORK_SUPPORT not in os.environ:
    os.environ[_FORK_SUPPORT] = "false"
    try:
        import grpc  # noqa: F401  (reads the setting now, once)
    finally:
        del os.environ[_FORK_SUPPORT]
