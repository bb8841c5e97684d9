"""The web console's pages in a real Chromium, against a real three-node cluster.

One cluster, one `dledger console` process and one headless Chromium (Debian's
`chromium`, driven by Playwright with `executable_path`: nothing is downloaded)
serve the module. The page runs under its strict Content-Security-Policy with no
error (nor any failed request); the cluster page shows each shard's leader and, after
that leader is killed, the new one without a reload; a put shows in the topics
page's counts; a search by key finds a message whose body is HTML and shows it as
text (no element is injected); a search by id shows a JSON body pretty-printed and
in hex, with a link to its raw bytes. Each page's screenshot is written under the
test's tmp_path. The groups page shows a group's member, its queue and its lag
after a consumer ran, and a reset to earliest confirmed in its dialog moves the
committed offsets (a cancelled one moves nothing). On the cluster page a leadership
transfer confirmed in its dialog moves the leader, and the page shows the new one
without a reload (a cancelled one moves nothing); on a cluster with an ACL, a user
without the admin right who tries is refused, and the page says so (its own console
and cluster, started only for that test). (The page's headers and the
event stream over plain HTTP are tests of tests/test_http_api.py.)

Without chromium or Playwright the module skips with one line saying which is
missing (`make tools` installs chromium where it can).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger_commitlog.cli.launcher import LocalCluster
from dledger_commitlog.client import Client
from dledger_commitlog.node.acl import Account
from tests.conftest import SHARED_CONFIG, wait_until
from tests.console_helpers import (
    Http,
    committed,
    consume,
    nack_and_retry,
    running_console,
    with_accounts,
)

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium")
try:
    from playwright.sync_api import Browser, Page, sync_playwright

    PLAYWRIGHT = True
except ImportError:  # the dev extra not installed
    PLAYWRIGHT = False
LEADER_S = 30.0  # a new leader, seen by the page's next snapshot
APP_SECRET = "app-secret-of-at-least-16"  # a user without the admin right


def missing_browser() -> str | None:
    if not PLAYWRIGHT:
        return "browser tests skip: Playwright for Python is not installed (pip install playwright)"
    if CHROMIUM is None:
        return "browser tests skip: no chromium on PATH (apt-get install chromium; see make tools)"
    return None


if (MISSING := missing_browser()) is not None:
    pytest.skip(MISSING, allow_module_level=True)  # one line, and no cluster started


@pytest.fixture(scope="module")
def console(api: Http) -> Http:
    """The shared cluster's console (conftest's `api`), by the name these pages use."""
    return api


@pytest.fixture(scope="module")
def acl_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Http]:
    """A console of a cluster with an ACL, as its admin (`app` has no admin right)."""
    directory = tmp_path_factory.mktemp("pages-acl")
    with LocalCluster(directory, extra_config=SHARED_CONFIG, acl=True) as cluster:
        admin = with_accounts(cluster, Account("app", APP_SECRET))
        cluster.up()
        with running_console(cluster) as http:
            yield http.as_user(*admin)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM is not None
    with sync_playwright() as pw:
        launched = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser, console: Http) -> Iterator[Page]:
    """A fresh page; the test fails if the page logged an error (a CSP violation is one)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    opened.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    opened.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.ok is False else None)
    try:
        yield opened
    finally:
        context.close()
    assert not errors, errors


def root_of(console: Http) -> str:
    return console.base.removesuffix("/api/v1") + "/"


def shot(page: Page, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0


def shard_one(console: Http) -> dict[str, Any]:
    """Shard 1 of `GET /cluster`, once it has a leader."""
    shard: dict[str, Any] = wait_until(
        lambda: console.get("/cluster").json["shards"][-1], 10, "a leader", lambda s: s["leader"]
    )
    return shard


def wait_text(page: Page, selector: str, pattern: str, timeout_s: float = 15.0) -> str:
    """The text of `selector` once it matches `pattern` (a regular expression)."""
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        found = page.locator(selector)
        if found.count() > 0:
            seen = found.first.text_content() or ""
            if re.search(pattern, seen):
                return seen
        page.wait_for_timeout(200)
    raise AssertionError(f"{selector}: {seen!r} never matched {pattern!r}")


def test_a_put_shows_in_the_topics_page(page: Page, console: Http, tmp_path: Path) -> None:
    page.goto(root_of(console) + "#topics")
    wait_text(page, "#live", "UTC")  # the first snapshot: the puts below are a rate
    for i in range(3):
        assert console.put("pages-topics", f"m{i}".encode()).status == 200
    card = '[data-topic="pages-topics"]'
    wait_text(page, f"{card} .messages", r"^3 messages$")
    assert page.locator(f"{card} tbody tr").count() >= 1
    chart = page.locator(f"{card} canvas.chart")
    wait_text(page, f"{card} .rate", r"peak [1-9]")
    assert float(chart.get_attribute("data-peak") or 0) > 0
    wait_text(page, "#backlog-body", r"delay|No delayed message waiting")
    shot(page, tmp_path, "topics")


HOSTILE = '<script>window.pwned = 1</script><img src="x" onerror="window.pwned = 2">'


def test_a_search_by_key_shows_a_hostile_body_as_text(
    page: Page, console: Http, tmp_path: Path
) -> None:
    assert console.put("pages-search", HOSTILE.encode(), "?key=hostile-1&tag=t1").status == 200
    page.goto(root_of(console) + "#search")
    form = page.locator("#by-key")
    form.locator('input[name="topic"]').fill("pages-search")
    form.locator('input[name="key"]').fill("hostile-1")
    form.locator('button[type="submit"]').click()
    wait_text(page, "#search-status", r"^1 message found")
    body = page.locator("#search-results pre.body")
    assert body.text_content() == HOSTILE
    assert page.locator("#search-results script, #search-results img").count() == 0
    assert page.evaluate("window.pwned") is None
    fields = page.locator("#search-results dl.fields").text_content() or ""
    assert "hostile-1" in fields and "t1" in fields and "UTC" in fields
    shot(page, tmp_path, "search-by-key")


def test_a_search_by_id_shows_json_pretty_and_hex(
    page: Page, console: Http, tmp_path: Path
) -> None:
    put = console.put("pages-json", b'{"order":42,"items":["a"]}', "?property=region%3Deu").json
    page.goto(root_of(console) + "#search")
    page.locator('#by-id input[name="msg_id"]').fill(put["msg_id"])
    page.locator('#by-id button[type="submit"]').click()
    wait_text(page, "#search-status", r"^1 message found")
    body = page.locator("#search-results pre.body")
    assert body.get_attribute("data-view") == "json"
    assert body.text_content() == json.dumps({"order": 42, "items": ["a"]}, indent=2)
    page.locator('#search-results button[data-view="hex"]').click()
    assert (body.text_content() or "").startswith("00000000  7b 22 6f 72")
    link = page.locator("#search-results a[download]")
    assert link.get_attribute("href") == f"/api/v1/messages/{put['msg_id']}/raw"
    assert "region" in (page.locator("#search-results dl.fields").text_content() or "")
    shot(page, tmp_path, "search-by-id")


def test_the_groups_page_shows_members_and_lag_and_resets_to_earliest(
    page: Page, console: Http, tmp_path: Path
) -> None:
    group, topic, card = "pages-g", "pages-groups", '[data-group="pages-g"]'
    for i in range(4):
        assert console.put(topic, f"g{i}".encode(), "?queue=0").status == 200
    member = consume(console, group, topic, 4, leave=False)
    page.goto(root_of(console) + "#groups")
    wait_text(page, f'{card} tr[data-member="{member}"]', topic + "/0")
    wait_text(page, f"{card} .lag", r"^lag 0 messages$")
    assert console.request("DELETE", f"/groups/{group}/members/{member}").status == 200
    for i in range(2):
        assert console.put(topic, f"late{i}".encode(), "?queue=0").status == 200
    wait_text(page, f"{card} .lag", r"^lag 2 messages$")
    wait_text(page, f"{card} .age", r"^oldest unconsumed [0-9.]+ (ms|s) ago$")
    chart = page.locator(f"{card} canvas.chart")
    wait_until(
        lambda: int(chart.get_attribute("data-samples") or 0), 10.0, "2 samples", lambda n: n >= 2
    )
    assert float(chart.get_attribute("data-last") or 0) == 2  # the lag, sampled
    wait_text(page, f"{card} .members", r"^0 member")
    assert page.locator(f'{card} tr[data-topic="{topic}"] td').nth(3).text_content() == "4"
    shot(page, tmp_path, "groups")
    actions = page.locator(f"{card} .group-actions")
    actions.locator('select[name="topic"]').select_option(topic)
    actions.locator('select[name="to"]').select_option("earliest")
    actions.locator("button.reset").click()
    assert "to the earliest offsets" in (page.locator("#confirm-text").text_content() or "")
    page.locator("#confirm-cancel").click()  # cancelled: nothing moves
    assert set(committed(console, group, topic).values()) == {4}
    actions.locator("button.reset").click()
    shot(page, tmp_path, "groups-confirm")
    page.locator("#confirm-ok").click()
    wait_text(page, "#groups-status", "reset to earliest")
    assert set(committed(console, group, topic).values()) == {0}
    wait_text(page, f"{card} .lag", r"^lag 6 messages$")
    actions.locator("button.resend").click()
    page.locator("#confirm-ok").click()
    wait_text(page, "#groups-status", "0 dead letter")


def test_a_message_trace_shows_its_delivery_a_nack_its_retry_and_its_ack(
    page: Page, console: Http, client: Client, tmp_path: Path
) -> None:
    put = console.put("pages-trace", b"traced", "?queue=0").json
    member = nack_and_retry(client, "pages-trace-g", "pages-trace", then_ack=True)
    page.goto(root_of(console) + "#search")
    page.locator('#by-id input[name="msg_id"]').fill(put["msg_id"])
    page.locator('#by-id button[type="submit"]').click()
    wait_text(page, "#search-status", r"^1 message found")
    rows = "#search-results .trace tbody tr"
    wait_text(page, f'{rows}[data-kind="acked"]', member)
    kinds = [r.get_attribute("data-kind") for r in page.locator(rows).all()]
    assert kinds == [
        "stored",
        "delivered",
        "nacked",
        "retry",
        "retry_stored",
        "delivered",
        "acked",
    ]
    texts = [r.text_content() or "" for r in page.locator(rows).all()]
    assert member in texts[1] and "delivery 1 of pages-trace queue 0" in texts[1]
    assert "retry, delay level 1" in texts[2] and "delay level 1, retry 1" in texts[3]
    assert "%RETRY%pages-trace-g" in texts[5] and all(" UTC" in t for t in texts)
    notes = page.locator("#search-results .trace-groups").text_content() or ""
    assert "group pages-trace-g: consumed" in notes and "not known" not in notes
    shot(page, tmp_path, "trace")


def test_a_confirmed_transfer_moves_the_leader_and_a_cancelled_one_nothing(
    page: Page, console: Http, tmp_path: Path
) -> None:
    page.goto(root_of(console) + "#cluster")
    page.evaluate("window.sameDocument = true")
    leader_of = '[data-shard="1"] .leader'
    old = int(wait_text(page, leader_of, r"^leader: node \d+$").rsplit(" ", 1)[1])
    to = next(int(n["node_id"]) for n in shard_one(console)["nodes"] if n["node_id"] != old)
    button = page.locator(f'[data-shard="1"] tr[data-node="{to}"] button.transfer')
    button.click()
    assert f"from node {old} to node {to}" in (page.locator("#confirm-text").text_content() or "")
    page.locator("#confirm-cancel").click()  # cancelled: the leader stays
    assert shard_one(console)["leader"] == old
    assert page.locator("#cluster-status").text_content() == ""
    button.click()
    shot(page, tmp_path, "cluster-transfer-confirm")
    page.locator("#confirm-ok").click()
    wait_text(page, "#cluster-status", rf"^shard 1: node {to} leads$")
    wait_text(page, leader_of, rf"^leader: node {to}$")
    assert shard_one(console)["leader"] == to
    assert page.evaluate("window.sameDocument") is True  # not reloaded


def test_a_user_without_the_admin_right_is_refused_a_transfer(
    browser: Browser, acl_console: Http, tmp_path: Path
) -> None:
    context = browser.new_context(http_credentials={"username": "app", "password": APP_SECRET})
    page = context.new_page()
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if not r.ok else None)
    try:
        page.goto(root_of(acl_console) + "#cluster")
        leader_of = '[data-shard="1"] .leader'
        old = int(wait_text(page, leader_of, r"^leader: node \d+$").rsplit(" ", 1)[1])
        page.locator('[data-shard="1"] button.transfer').first.click()
        page.locator("#confirm-ok").click()
        refused = wait_text(page, "#cluster-status", "transfer to node .* failed: .*admin")
        assert shard_one(acl_console)["leader"] == old, refused
        shot(page, tmp_path, "cluster-transfer-refused")
    finally:
        context.close()
    # the refusal, and no other failed request than the sign-in's challenge
    assert any(f.startswith("403 ") and "transfer-leader" in f for f in failed), failed
    assert all(f.split()[0] in ("401", "403") for f in failed), failed


def test_the_cluster_page_follows_a_leader_kill_without_a_reload(
    page: Page, console: Http, shared_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Last of the module: it kills a node (and starts it again)."""
    page.goto(root_of(console) + "#cluster")
    leader_of = '[data-shard="1"] .leader'
    shown = wait_text(page, leader_of, r"^leader: node \d+$")
    old = int(shown.rsplit(" ", 1)[1])
    assert "TLS off" in (page.locator("#cluster-summary").text_content() or "")
    for node in shared_cluster.specs:  # each node's disk use, from its metrics port
        wait_text(page, f'.nodes tr[data-node="{node}"] td:nth-child(4)', r"^\d+\.\d %$")
    shot(page, tmp_path, "cluster")
    page.evaluate("window.sameDocument = true")
    shared_cluster.kill(old)
    try:
        shown = wait_text(page, leader_of, rf"^leader: node (?!{old}$)\d+$", LEADER_S)
        assert page.evaluate("window.sameDocument") is True  # not reloaded
        down = f'[data-shard="1"] tr[data-node="{old}"]'
        wait_text(page, down, "down")
        # it lacks the new leader's entries: behind by seconds (9th column, lag (s))
        wait_text(page, f"{down} td:nth-child(9)", r"^[1-9]\d*\.\d$")
        shot(page, tmp_path, "cluster-after-kill")
    finally:
        shared_cluster.start(old)
    assert int(shown.rsplit(" ", 1)[1]) != old
