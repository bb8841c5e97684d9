"""What both ports share: the client port (`dledger_commitlog.service`) and the Raft
port (`raftio`) import it, and it imports nothing of ours.

- `peer_auth`: who a node is (its certificate's name, the cluster-secret token it
  presents) and the TLS identity it loads once at start;
- `channel`: the message limit of either port and a grpc.aio channel to a node
  (the client port forwards a call to the leader through one);
- `tasks`: asyncio task helpers.
"""
