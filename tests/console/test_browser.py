"""The console in a real browser (Debian's chromium through Playwright) on a real 3-node
cluster: log in, see the members (their clocks and disks) and the leader, see a failover
without reloading, watch the due-time histogram follow a message scheduled and cancelled from
the admin page, see deliveries counted, look a message up, resend a dead letter, and a wrong
token and a read-only principal refused."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from browsing import Running, log_in, screenshot
from tickwheel.client import Message

pytestmark = pytest.mark.cluster

HOUR_MS = 3_600_000


def test_an_operator_logs_in_and_sees_three_members_and_the_leader(
        page: Page, running: Running) -> None:
    log_in(page, running)
    members = page.locator("#members tr.member")
    expect(members).to_have_count(3)
    leader = running.cluster.leader(timeout_s=15).grpc_address
    expect(page.locator("#leader")).to_have_text(leader)
    expect(page.locator('#members tr[data-role="leader"]')).to_have_count(1)
    expect(page.locator('#members tr[data-role="leader"] .clock')).to_have_text("+0 ms (± 0 ms)")
    for row in members.all():  # the leader's estimates and the disk reports come in live
        expect(row.locator(".clock")).to_contain_text(" ms (± ")
        expect(row.locator(".disk")).to_contain_text(" free, reserve ")
    screenshot(page, "cluster")


def test_a_wrong_token_is_refused(page: Page, running: Running) -> None:
    page.goto(running.console.url + "login")
    page.fill("#token", "not-a-token-of-this-cluster")
    page.click("#login button[type=submit]")
    expect(page.locator("#login-error")).to_have_text("The cluster refused this token.")
    assert not [c for c in page.context.cookies() if "session" in c["name"]]
    page.goto(running.console.url + "cluster")
    expect(page).to_have_url(re.compile(r"/login$"))


_READ_BUCKETS = """() => {
    const table = document.querySelector("#buckets");
    if (!table) return null;
    const counts = {};
    for (const row of table.querySelectorAll("tr[data-bucket]"))
        counts[row.dataset.bucket] = Number(row.querySelector(".count").textContent);
    return {start: Number(table.dataset.startMs), each: Number(table.dataset.bucketMs), counts};
}"""
"""The live histogram as the page shows it at one instant (the page replaces it as updates
come, so it is read in one go)."""


def _bucket_count(page: Page, due_ms: int) -> int:
    """What the live histogram shows for the bucket of ``due_ms`` (0 when it has no row)."""
    shown = page.evaluate(_READ_BUCKETS)
    assert shown is not None, "no histogram on the page"
    return int(shown["counts"].get(str((due_ms - shown["start"]) // shown["each"]), 0))


def _wait_for_count(page: Page, due_ms: int, wanted: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (seen := _bucket_count(page, due_ms)) != wanted:
        assert time.monotonic() < deadline, f"the bucket shows {seen}, not {wanted}"
        page.wait_for_timeout(100)  # the page updates itself; this only paces the reads


def test_the_histogram_follows_a_message_scheduled_and_cancelled(
        page: Page, running: Running) -> None:
    log_in(page, running)
    histogram = page.context.new_page()
    histogram.goto(running.console.url + "histogram?span=day")
    due_ms = (time.time_ns() // 1_000_000) + 2 * HOUR_MS
    before = _bucket_count(histogram, due_ms)
    page.goto(running.console.url + "admin")
    page.fill("#s-topic", "console-orders")
    page.fill("#s-body", "close order 7")
    page.fill("#s-delay", str(2 * HOUR_MS // 1_000))
    page.click("#schedule button")
    done = page.locator("#done")
    expect(done).to_contain_text("Scheduled")
    handle = re.search(r"handle (\d+)", done.inner_text())
    assert handle is not None
    _wait_for_count(histogram, due_ms, before + 1)  # live: the histogram page is not reloaded
    screenshot(histogram, "histogram")
    page.fill("#c-handle", handle.group(1))
    page.click("#cancel button")
    expect(page.locator("#done")).to_have_text("Cancel: CANCELLED.")
    _wait_for_count(histogram, due_ms, before)
    screenshot(page, "admin")


def test_the_histogram_of_one_topic_grows_and_shrinks(page: Page, running: Running) -> None:
    due_ms = (time.time_ns() // 1_000_000) + 2 * HOUR_MS
    with running.cluster.client() as admin:
        admin.schedule("console-one", "later", delay_ms=5 * HOUR_MS)  # listed with a pending
        admin.schedule("console-another", "not counted", deliver_at_ms=due_ms)
    log_in(page, running)
    page.goto(running.console.url + "histogram?span=day")
    page.select_option("#h-topic", "console-one")
    page.click("#h-show")
    expect(page.locator("#of-topic")).to_have_text("console-one")
    assert _bucket_count(page, due_ms) == 0  # the other topic's message is not counted
    with running.cluster.client() as admin:
        handle = admin.schedule("console-one", "now counted", deliver_at_ms=due_ms).handle
        _wait_for_count(page, due_ms, 1)  # live, without a reload
        admin.cancel_outcomes([handle])
        _wait_for_count(page, due_ms, 0)


def test_a_read_only_principal_changes_nothing(page: Page, running: Running) -> None:
    log_in(page, running, "reader")
    page.goto(running.console.url + "admin")
    page.fill("#s-topic", "console-readonly")
    page.fill("#s-delay", "600")
    page.click("#schedule button")
    expect(page.locator("#refused")).to_contain_text("PERMISSION_DENIED")
    with running.cluster.client() as admin:
        assert "console-readonly" not in {p.topic for p in admin.cluster_info().pending}
        handle = admin.schedule("console-readonly", "b", delay_ms=600_000).handle
    page.fill("#c-handle", str(handle))
    page.click("#cancel button")
    expect(page.locator("#refused")).to_contain_text("PERMISSION_DENIED")
    with running.cluster.client() as admin:
        assert admin.cancel_outcomes([handle])[0].name == "CANCELLED"  # it was still pending


def test_topics_show_what_is_pending(page: Page, running: Running) -> None:
    with running.cluster.client() as admin:
        admin.schedule_many([Message("console-topics", "body", delay_ms=600_000)
                             for _ in range(3)])
    log_in(page, running)
    page.goto(running.console.url + "topics")
    expect(page.locator('#pending tr[data-topic="console-topics"] td.n')).to_have_text("3")
    with running.cluster.client() as admin:  # the page is live: deliveries show as they go
        admin.schedule_many([Message("console-rate", "b", delay_ms=0) for _ in range(5)])
        got: list[str] = []
        deadline = time.monotonic() + 20
        while len(got) < 5:
            assert time.monotonic() < deadline, f"{len(got)} of 5 delivered"
            for received in admin.receive("console-rate", consumer="rate", wait_ms=5_000):
                received.ack()
                got.append(received.id)
    rate = page.locator('#due tr[data-topic="console-rate"]')
    expect(rate.locator(".delivered")).to_have_text("5")
    expect(rate.locator(".rate")).to_have_text(re.compile(r"^\d+\.\d$"))
    screenshot(page, "topics")


def test_a_message_is_looked_up_by_id_and_by_handle(page: Page, running: Running) -> None:
    with running.cluster.client() as admin:
        handle = admin.schedule("console-lookup", "b", delay_ms=600_000, id="lookup-7").handle
        admin.cancel_outcomes([handle])
    log_in(page, running)
    page.goto(running.console.url + "message")
    page.fill("#m-id", "lookup-7")
    page.click("#lookup button")
    expect(page.locator("#state")).to_have_text("cancelled")
    expect(page.locator('#events tr[data-event="scheduled"]')).to_have_count(1)
    expect(page.locator('#events tr[data-event="cancelled"] td.by')).to_have_text("admin")
    screenshot(page, "message")
    page.goto(running.console.url + "message")
    page.fill("#m-handle", str(handle))
    page.click("#lookup button")
    expect(page.locator("#found-id")).to_have_text("lookup-7")
    expect(page.locator("#state")).to_have_text("cancelled")
    page.goto(running.console.url + "message?handle=12ab")
    expect(page.locator("#refused")).to_contain_text("handle: '12ab' is not a handle")
    log_in(page, running, "reader")
    page.goto(running.console.url + "message?id=lookup-7")
    expect(page.locator("#refused")).to_contain_text("PERMISSION_DENIED")
    page.goto(running.console.url + f"message?handle={handle}")
    expect(page.locator("#refused")).to_contain_text("PERMISSION_DENIED")


def test_a_dead_letter_is_resent_to_its_topic(page: Page, running: Running) -> None:
    with running.cluster.client() as admin:
        admin.schedule("console-dlq", "refund 12", delay_ms=0, id="dead-12")
        [letter] = admin.receive("console-dlq", consumer="worker", max_messages=1,
                                 wait_ms=10_000)
        letter.nack()  # the nodes' last attempt is the first: to %DLQ%console-dlq
    log_in(page, running)
    page.goto(running.console.url + "dead-letters")
    row = page.locator('#letters tr[data-id="dead-12"]')
    deadline = time.monotonic() + 10
    while not row.count():  # the copy to the dead-letter topic commits a moment after
        assert time.monotonic() < deadline, "the dead letter never showed"
        page.fill("#d-topic", "%DLQ%console-dlq")
        page.click("#browse button")
    expect(row).to_contain_text("refund 12")
    screenshot(page, "dead-letters")
    row.locator("button").click()
    expect(page.locator("#done")).to_have_text("Resent 1 to console-dlq.")
    with running.cluster.client() as admin:
        [again] = admin.receive("console-dlq", consumer="worker", max_messages=1,
                                wait_ms=10_000)
        assert (again.id.startswith("dead-12.resent-"), again.body) == (True, b"refund 12")
        assert again.properties["tickwheel-resent-from"] == "%DLQ%console-dlq"
        again.ack()


def test_no_dead_letter_of_a_topic_the_principal_may_not_read(page: Page,
                                                                running: Running) -> None:
    with running.cluster.client() as admin:
        admin.schedule("console-secret", "the secret", delay_ms=0, id="secret-1")
        [letter] = admin.receive("console-secret", consumer="worker", max_messages=1,
                                 wait_ms=10_000)
        letter.nack()
    log_in(page, running, "narrow")
    page.goto(running.console.url + "dead-letters")
    page.fill("#d-topic", "%DLQ%console-secret")
    page.click("#browse button")
    expect(page.locator("#refused")).to_contain_text("PERMISSION_DENIED")
    assert page.locator("#letters").count() == 0
    assert "the secret" not in page.content()
    page.goto(running.console.url + "topics")
    expect(page.locator("#pending")).to_be_visible()
    assert "console-secret" not in page.locator("#topics").inner_text()


def test_a_failover_shows_without_a_reload(page: Page, running: Running) -> None:
    log_in(page, running)
    old = running.cluster.leader(timeout_s=15)
    expect(page.locator("#leader")).to_have_text(old.grpc_address)
    live = page.locator("#cluster")
    updates_before = int(live.get_attribute("data-updates") or 0)
    killed_at = time.monotonic()
    running.cluster.signal(old, 9)
    new_leader = page.locator("#leader")
    expect(new_leader).not_to_have_text(old.grpc_address, timeout=5_000)
    expect(new_leader).not_to_have_text("none", timeout=5_000 - int(
        (time.monotonic() - killed_at) * 1_000))
    assert int(live.get_attribute("data-updates") or 0) > updates_before  # no reload: updated
    expect(page.locator(f'#members tr[data-address="{old.grpc_address}"]')).to_have_attribute(
        "data-role", "unreachable")
    assert page.locator("#timeline tr").count() >= 3  # header, the old leader, the new one
    screenshot(page, "failover")

