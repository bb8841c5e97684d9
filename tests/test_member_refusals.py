"""Membership changes a real group refuses: each a clear error, and nothing changed.

Against real node processes (`LocalCluster`), through the client and the `dledger`
command line: adding an id that exists, promoting an unknown node or a voter,
removing an unknown node, removing the last voter, and malformed requests. After
each refusal the members are what they were and puts still commit. (A second
change while one is pending is refused by the Raft core, tests/test_raft_membership.py;
its mapping to FAILED_PRECONDITION is tests/test_members_unit.py's.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.cli.main import main
from dledger_commitlog.client import ChangeRefused, Client, ClientError, InvalidArgument
from tests.conftest import SHARED_CONFIG

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("three"), extra_config=SHARED_CONFIG) as cluster:
        cluster.up(timeout_s=60.0)
        yield cluster


def _roles(client: Client) -> dict[int, str]:
    return {m.id: m.role for m in client.member_list()}


@pytest.mark.parametrize(
    ("change", "error", "says"),
    [
        (lambda c: c.member_add(2, "127.0.0.1:1", "127.0.0.1:2"), ChangeRefused, "node 2 is"),
        (lambda c: c.member_promote(9), ChangeRefused, "node 9 is not a member"),
        (lambda c: c.member_promote(1), ChangeRefused, "node 1 is a voter"),
        (lambda c: c.member_remove(9), ChangeRefused, "node 9 is not a member"),
        (lambda c: c.member_add(0, "127.0.0.1:1", "127.0.0.1:2"), InvalidArgument, "node id 0"),
        (lambda c: c.member_add(4, "nohost", "127.0.0.1:2"), InvalidArgument, "HOST:PORT"),
    ],
    ids=["add-existing", "promote-unknown", "promote-voter", "remove-unknown", "id-0", "address"],
)
def test_a_refused_change_changes_nothing(
    three: LocalCluster,
    change: Callable[[Client], object],
    error: type[ClientError],
    says: str,
) -> None:
    with three.client(timeout_s=10.0) as client:
        before = _roles(client)
        with pytest.raises(error, match=says) as refused:
            change(client)
        assert refused.value.message, "a clear reason"
        assert _roles(client) == before == {1: "voter", 2: "voter", 3: "voter"}
        assert client.put("refusals", b"still committing").commitlog_offset >= 0


def test_the_command_line_says_why_and_exits_1(
    three: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster_file = str(three.cluster_file)
    assert main(["member", "promote", "7", "--cluster", cluster_file]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dledger: FAILED_PRECONDITION") and "node 7 is not a member" in err


def test_the_last_voter_stays(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=1) as cluster:
        cluster.up(timeout_s=60.0)
        with cluster.client(timeout_s=10.0) as client:
            client.put("refusals", b"an entry of the leader's term: changes may start")
            with pytest.raises(ChangeRefused, match="node 1 is the last voter"):
                client.member_remove(1)
            assert _roles(client) == {1: "voter"}
            assert client.put("refusals", b"still committing").commitlog_offset >= 0
