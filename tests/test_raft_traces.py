"""The data-driven Raft scenarios of tests/testdata/*.txt (format: tests/raft_trace.py).

Each file runs against fresh `RaftCore`s; the trace must equal the expected
output written in the file. `pytest tests/test_raft_traces.py --rewrite` (or
DLEDGER_REWRITE_TRACES=1) writes the traces into the files instead: review the
diff before committing it.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from tests.raft_trace import ScriptError, parse, render, run_script

TESTDATA = Path(__file__).parent / "testdata"
SCRIPTS = sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_trace(path: Path, request: pytest.FixtureRequest) -> None:
    text = path.read_text()
    cases = parse(text)
    outputs = run_script(cases)
    if request.config.getoption("--rewrite") or os.environ.get("DLEDGER_REWRITE_TRACES") == "1":
        path.write_text(render(cases, outputs))
        return
    for case, out in zip(cases, outputs, strict=True):
        if out != case.expected:
            diff = "\n".join(
                difflib.unified_diff(case.expected, out, "expected", "got", lineterm="")
            )
            pytest.fail(f"{path.name}:{case.line}: {case.command}\n{diff}", pytrace=False)
    assert render(cases, outputs) == text, f"{path.name}: not in canonical layout (--rewrite)"


def test_the_scenarios_are_there() -> None:
    names = {p.stem for p in SCRIPTS}
    assert names >= {
        "election",
        "election_prevote",
        "election_split_vote",
        "replication",
        "replication_conflict",
        "transfer_leadership",
        "transfer_lagging",
        "read_index",
        "membership_changes",
        "learners",
        "snapshot",
    }


def test_a_rewrite_restores_a_damaged_trace() -> None:
    text = (TESTDATA / "read_index.txt").read_text()
    damaged = text.replace('ReadState ctx="r1" index=1', 'ReadState ctx="r1" index=7')
    assert damaged != text
    cases = parse(damaged)
    assert render(cases, run_script(cases)) == text


@pytest.mark.parametrize(
    ("script", "complaint"),
    [
        ("add-nodes 3\n", "is not followed by"),
        ("add-nodes 3\n----\n\nfrobnicate 1\n----\n", "unknown command"),
        ("campaign 1\n----\n", "add-nodes first"),
        ("add-nodes 3\n----\n\ncampaign 4\n----\n", "is not a node id"),
        ("add-nodes 3 pre_votes=false\n----\n", "not a Config field"),
        ("add-nodes 3 election-ticks=ten\n----\n", "not a number"),
        ("add-nodes 3\n----\n\n# dangling\n", "precedes no command"),
        ("add-nodes 3\n----\n\nconf-change 1 demote 2\n----\n", "add-learner|promote"),
        ("add-nodes 3\n----\n\nstart-node 2\n----\n", "exists already"),
        ("add-nodes 3\n----\n\ncompact 1 5\n----\n", "not between the log start"),
    ],
)
def test_a_mistake_in_a_script_is_an_error_not_a_trace(script: str, complaint: str) -> None:
    with pytest.raises(ScriptError, match=complaint):
        run_script(parse(script))
