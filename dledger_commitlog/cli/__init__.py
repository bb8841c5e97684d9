"""The `dledger` command line (`cli.main`) and what it starts: clusters of local node
processes (`launcher`), their layout and config files.

gRPC's fork support is turned off for every process that runs this package (unless
the environment says otherwise), before anything imports grpc: these processes start
others with `subprocess` (nodes, Spark's JVM) while their gRPC channels are live, and
with fork support on, grpcio (1.81 and later, grpc/grpc#43055) restarts its poller in
the child between fork and exec, where the descriptors Popen closes make it crash: the
child dies before it runs (1 start in 12 measured here, e.g. "Java gateway process
exited before sending its port number"). Nothing here uses gRPC in a forked child.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
