"""Unit tests of the service's pieces: wire conversion, config, ids, raft state file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger_commitlog.log.entry_store import EntryStore
from dledger_commitlog.log.message_layout import make_msg_id, offset_of_msg_id
from dledger_commitlog.node.config import (
    SMALL_SEGMENTS,
    ConfigError,
    load_config,
    parse_peer,
    segment_bytes_for,
    shard_config,
)
from proto import dledger_pb2 as pb
from raft.messages import (
    AppendEntries,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    RequestVote,
    TimeoutNow,
    VoteResponse,
)
from raft.types import Entry, EntryKind, HardState
from raftio.hard_state import RaftStateFile
from raftio.link import PeerLink
from raftio.wire import (
    MAX_BATCH_BYTES,
    decode_entries,
    encode_entries,
    from_proto,
    to_proto,
    to_wire,
)
from store.errors import CorruptEntry, InvalidMessage
from store.message import max_encoded_size

ENTRIES = (Entry(7, 2, b"alpha"), Entry(8, 3, b"", EntryKind.NOOP), Entry(9, 3, bytes(300)))
MESSAGES: list[Message] = [
    AppendEntries(1, 2, 3, 6, 2, ENTRIES, 5),
    AppendEntries(1, 3, 3, 6, 2, (), 5),
    AppendResponse(2, 1, 3, 9),
    AppendResponse(2, 1, 3, 6, True, 4, 2),
    Heartbeat(1, 2, 3, 5, b"ctx"),
    HeartbeatResponse(2, 1, 3, b"ctx"),
    RequestVote(2, 1, 4, 9, 3, pre_vote=True),
    RequestVote(2, 1, 4, 9, 3, transfer=True),
    VoteResponse(1, 2, 4, True, pre_vote=True),
    TimeoutNow(1, 2, 3),
    ReadIndexRequest(2, 1, 3, b"r1"),
    ReadIndexResponse(1, 2, 3, b"r1", 9),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_raft_message_survives_the_wire(msg: Message) -> None:
    wire = to_proto(msg).SerializeToString()
    from proto import dledger_pb2 as pb

    assert from_proto(pb.RaftMessage.FromString(wire)) == msg


def test_entry_blobs_round_trip_and_reject_truncation() -> None:
    blob = encode_entries(ENTRIES)
    assert decode_entries(blob) == ENTRIES
    with pytest.raises(ValueError, match="truncated"):
        decode_entries(blob[:-1])
    # index 10, term 3, kind 7 (no EntryKind), 1 byte of data: refused whole
    unknown = blob + (10).to_bytes(8) + (3).to_bytes(8) + (7).to_bytes(4) + (1).to_bytes(4) + b"x"
    with pytest.raises(ValueError, match="unknown entry kind 7"):
        decode_entries(unknown)


def test_message_ids_encode_the_offset() -> None:
    msg_id = make_msg_id(("10.1.2.3", 9876), 123456789)
    assert msg_id == "0A0102030000269400000000075BCD15"
    assert offset_of_msg_id(msg_id) == 123456789
    with pytest.raises(InvalidMessage, match="hex"):
        offset_of_msg_id("zz")
    with pytest.raises(InvalidMessage, match="32 hex digits"):
        offset_of_msg_id("00")


def test_raft_state_survives_reopen_and_detects_corruption(tmp_path: Path) -> None:
    f = RaftStateFile(tmp_path / "raft.state")
    assert f.saved == HardState()
    f.save(HardState(5, 2, 10))
    assert not f.needs_sync(HardState(5, 2, 11))
    assert f.needs_sync(HardState(6, None, 11))
    f.save_commit(12)
    assert RaftStateFile(tmp_path / "raft.state").saved == HardState(5, 2, 12)
    raw = bytearray((tmp_path / "raft.state").read_bytes())
    raw[5] ^= 1
    (tmp_path / "raft.state").write_bytes(bytes(raw))
    with pytest.raises(CorruptEntry, match="CRC"):
        RaftStateFile(tmp_path / "raft.state")


def test_config_from_toml_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "n1.toml"
    path.write_text(
        'node_id = 1\ndata_dir = "d"\nflush_mode = "async"\n'
        "[raft]\nelection_ticks = 20\n"
        '[[peers]]\nid = 1\nraft = "127.0.0.1:1"\nclient = "127.0.0.1:2"\n'
        '[[peers]]\nid = 2\nraft = "127.0.0.1:3"\nclient = "127.0.0.1:4"\n'
        '[[peers]]\nid = 3\nraft = "127.0.0.1:5"\nclient = "127.0.0.1:6"\n'
    )
    cfg = load_config(path, {"data_dir": "other", "tick_ms": None})
    assert (cfg.node_id, cfg.data_dir, cfg.flush_mode, cfg.election_ticks) == (
        1,
        "other",
        "async",
        20,
    )
    assert cfg.client_address == "127.0.0.1:2"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("node_id = 1\n", "missing setting 'data_dir'"),
        ('node_id = 1\ndata_dir = "d"\nbogus = 1\npeers = []', "unknown setting 'bogus'"),
        ('node_id = 1\ndata_dir = "d"\n[raft]\nnope = 1\n', "unknown setting raft.nope"),
        ("node_id = ", "n1.toml"),
    ],
)
def test_config_errors_say_what_is_wrong(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "n1.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load_config(path)


@pytest.mark.parametrize(
    ("toml", "error"),
    [
        # A data segment must hold the largest message the node accepts.
        (
            "[store]\ndata_segment_bytes = 4194304",
            "store.data_segment_bytes 4194304 cannot hold the largest message: "
            "store.max_message_bytes 4194304 needs at least 4227345",
        ),
        (
            "[store]\nmax_message_bytes = 1024\ndata_segment_bytes = 34064",
            "store.data_segment_bytes 34064 cannot hold .* needs at least 34065",
        ),
        ("[store]\nindex_segment_bytes = 33", "index_segment_bytes 33 must be a multiple of 32"),
        ("[store]\nmax_message_bytes = 67108864", r"max_message_bytes must be in 1024\.\.33554432"),
        ("[store]\nmax_message_bytes = 100", r"max_message_bytes must be in 1024\.\.33554432"),
        ("[raft]\nmax_append_bytes = 33554432", r"raft.max_append_bytes must be in 1\.\.16777216"),
        ("[retention]\nfile_reserved_hours = nan", "file_reserved_hours must be at least 0"),
        ("[store]\ncq_units_per_file = 0", "store.cq_units_per_file must be at least 1, not 0"),
        ("[store]\nidempotency_window = -1", "store.idempotency_window must be at least 0"),
        ("[raft]\nmax_inflight_msgs = 0", "raft.max_inflight_msgs must be at least 1"),
        ("[retention]\ndelete_when_hour = 24", r"delete_when_hour must be in 0\.\.23, not 24"),
        ('[raft]\ntick_ms = "50"', "raft.tick_ms must be an integer, not '50'"),
        ("[store]\nqueues_per_topic = true", "queues_per_topic must be an integer, not True"),
        ('[retention]\nrefuse_ratio = "high"', "retention.refuse_ratio must be a number"),
    ],
)
def test_unusable_settings_are_refused_naming_the_setting(
    tmp_path: Path, toml: str, error: str
) -> None:
    path = tmp_path / "n1.toml"
    head = 'node_id = 1\ndata_dir = "d"\npeers = [{id = 1, raft = "h:1", client = "h:2"}]\n'
    path.write_text(f"{head}{toml}\n")
    with pytest.raises(ConfigError, match=error):
        load_config(path)
    section = toml.split("\n", maxsplit=1)[0]
    path.write_text(f"{head}{section}\n")  # the section alone: the defaults are usable
    assert load_config(path).node_id == 1


def test_a_process_may_host_only_a_shard_other_than_1(tmp_path: Path) -> None:
    """One process per shard (bench/scaleout.py, docs/scaling.md): a node hosting
    shard 2 alone is a valid config, its shard's data under data_dir/groups/2."""
    path = tmp_path / "n1.toml"
    head = 'node_id = 1\ndata_dir = "d"\npeers = [{id = 1, raft = "h:1", client = "h:2"}]\n'
    path.write_text(f"{head}[shards]\ncount = 3\nhost = [2]\n")
    cfg = load_config(path)
    assert cfg.host_shards == (2,)
    assert shard_config(cfg, 2).data_dir == str(Path("d") / "groups" / "2")
    path.write_text(f"{head}[shards]\ncount = 3\nhost = [2, 4]\n")
    with pytest.raises(ConfigError, match=r"shards.host \[2, 4\]: distinct shards in 0..3"):
        load_config(path)


def test_the_smallest_segment_the_config_allows_holds_the_largest_message(
    tmp_path: Path,
) -> None:
    """segment_bytes_for is exact: the store takes an entry with the largest encoded
    message into such a segment (after another segment, so a filler comes first)
    and refuses one byte more."""
    peers = (parse_peer("1=h:1/h:2"),)
    need = segment_bytes_for(1024)
    cfg = load_config(
        None,
        {
            "node_id": 1,
            "data_dir": "d",
            "peers": peers,
            "max_message_bytes": 1024,
            "data_segment_bytes": need,
        },
    )
    with pytest.raises(ConfigError, match=f"needs at least {need}$"):  # 1023 bytes: below 1024
        load_config(
            None,
            {
                "node_id": 1,
                "data_dir": "d",
                "peers": peers,
                "max_message_bytes": 1024,
                "data_segment_bytes": need - 1,
            },
        )
    largest = bytes(max_encoded_size(cfg.max_message_bytes))
    store = EntryStore(tmp_path / "log", data_segment_bytes=need, index_segment_bytes=32 * 64)
    try:
        store.append_entries([Entry(1, 1, b"small"), Entry(2, 1, largest)])
        assert store.locate(2)[0] == need, "the largest entry fills the next segment exactly"
        with pytest.raises(ValueError, match="exceeds the segment size"):
            store.append_entries([Entry(3, 1, largest + b"!")])
    finally:
        store.close()
    for config in (SMALL_SEGMENTS, {}):  # the demo's and chaos runs' settings; the defaults
        load_config(None, {"node_id": 1, "data_dir": "d", "peers": peers, **config})


def test_a_segment_too_small_names_the_message_size_it_could_hold() -> None:
    peers = (parse_peer("1=h:1/h:2"),)
    old_demo = {"data_segment_bytes": 4 << 20}  # what make run used before
    with pytest.raises(ConfigError, match=r"or store.max_message_bytes of at most 4161263$"):
        load_config(None, {"node_id": 1, "data_dir": "d", "peers": peers, **old_demo})
    fits = load_config(
        None,
        {"node_id": 1, "data_dir": "d", "peers": peers, **old_demo, "max_message_bytes": 4161263},
    )
    assert segment_bytes_for(fits.max_message_bytes) == 4 << 20


def test_peer_specs() -> None:
    assert parse_peer("2=h:1/h:2").client == "h:2"
    with pytest.raises(ConfigError):
        parse_peer("2=h:1")
    with pytest.raises(ConfigError, match="not among the peers"):
        load_config(None, {"node_id": 4, "data_dir": "d", "peers": (parse_peer("1=h:1/h:2"),)})
    with pytest.raises(ConfigError, match="HOST:PORT"):
        load_config(None, {"node_id": 1, "data_dir": "d", "peers": (parse_peer("1=h/h:2"),)})


def test_a_stream_batch_stays_below_the_grpc_message_limit() -> None:
    """Appends of large entries queued behind a slow stream go in several RaftBatches
    (16 MiB at most each, one message at least), never one past gRPC's 64 MiB."""
    link = PeerLink("c", 2, "127.0.0.1:1")  # never started: only its queue is used
    big = [
        to_wire(AppendEntries(1, 2, 3, i, 3, (Entry(i + 1, 3, bytes(7 << 20)),), 0))
        for i in range(5)
    ]
    assert all(size >= 7 << 20 for _, size in big)
    huge = to_wire(AppendEntries(1, 2, 3, 5, 3, (Entry(6, 3, bytes(20 << 20)),), 0))
    tiny = [to_wire(Heartbeat(src=1, dst=2, term=3, commit=0)) for _ in range(300)]
    link.send([*big, huge, *tiny])
    sizes = []
    while link._queue:
        batch = pb.RaftBatch(cluster="c", messages=link._take_batch())
        sizes.append((len(batch.messages), batch.ByteSize()))
    assert [n for n, _ in sizes] == [2, 2, 1, 1, 256, 44]
    assert all(b <= MAX_BATCH_BYTES for n, b in sizes if n > 1)
    assert max(b for _, b in sizes) < 21 << 20  # the 20 MiB entry goes alone


def test_a_forward_to_a_node_no_longer_leading_is_a_retry_not_a_wrong_cluster() -> None:
    import grpc
    from grpc.aio import AioRpcError, Metadata

    from dledger_commitlog.service.base import forward_failure

    moved = AioRpcError(
        grpc.StatusCode.FAILED_PRECONDITION,
        Metadata(),
        Metadata(),
        details="not the leader; the leader is at 127.0.0.1:7002",
    )
    code, why = forward_failure(moved, "127.0.0.1:7001")
    assert code is grpc.StatusCode.UNAVAILABLE and why.startswith("(forwarded to 127.0.0.1:7001)")
    wrong = AioRpcError(
        grpc.StatusCode.FAILED_PRECONDITION,
        Metadata(),
        Metadata(),
        details="wrong cluster: this node serves 'a', not 'b'",
    )
    assert forward_failure(wrong, "x")[0] is grpc.StatusCode.FAILED_PRECONDITION
