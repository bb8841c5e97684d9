"""Raft's I/O beside the consensus library (`raft`): the network between nodes and
the node's own Raft file, as etcd keeps its transport and WAL outside its raft.

- `transport`: the peer link's surface (`open_link`, `open_peer_server`), on
  h2grpc (`h2`); `link`: what a link is apart from its stack (the bounded queue,
  batches, reconnecting, the gate that checks who a stream comes from);
  `wire`: Raft messages to and from protobuf; `multiplex`: several shards'
  messages on one stream per peer process;
- `hard_state`: the term, vote, commit and configuration, fsynced.

Imports `raft` (messages, types), `netkit`, `store` (file helpers), `proto` and
`h2grpc`; nothing of the server above it.
"""
