"""Quotas per principal without processes: the access file's ``[principal.quota]`` (what it
accepts, what it refuses and how the refusal names the field), the token bucket on an
injected clock, and `Quotas`, which holds each principal to its own quotas alone. The same
rules on real nodes: test_quotas.py."""

from __future__ import annotations

import doctest
import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from tickwheel.common.errors import InvalidMessage, QuotaExceeded
from tickwheel.common.status_details import STATUS_DETAILS_KEY, RetryAdvice, quota_details
from tickwheel.node.security import quotas as quotas_module
from tickwheel.node.security.access import NO_QUOTA, Access, Principal, Quota
from tickwheel.node.security.dev_credentials import DevCredentials
from tickwheel.node.security.quotas import LOG_EVERY_MS, PENDING_READ_MS, Quotas, TokenBucket
from tickwheel.node.settings.config import NodeSettings

GRANTS = '''
[[principal.grant]]
actions = ["schedule", "cancel"]
topics = ["orders", "orders.*"]
'''


def access(quotas: dict[str, str]) -> Access:
    """An access file of the principals named, each granted ``orders`` and ``orders.*``, with
    the ``[principal.quota]`` lines given (none: no table)."""
    text = ""
    for name, lines in quotas.items():
        text += f'[[principal]]\nname = "{name}"\n{GRANTS}'
        if lines:
            text += f"[principal.quota]\n{lines}\n"
    return Access.parse(text)


class Clock:
    """Monotonic milliseconds, moved by the test."""

    def __init__(self) -> None:
        self.now_ms = 0

    def __call__(self) -> int:
        return self.now_ms


# -- the access file ----------------------------------------------------------------------------

def test_a_quota_table_is_read_field_by_field_and_its_absence_bounds_nothing() -> None:
    parsed = access({"orders": "schedule_msgs_per_s = 100\nschedule_burst_msgs = 400\n"
                               "schedule_bytes_per_s = 65536\nmax_pending_msgs = 1000\n"
                               "max_consumer_streams = 4", "billing": ""})
    orders, billing = parsed.by_name("orders"), parsed.by_name("billing")
    assert orders is not None and billing is not None
    assert orders.quota == Quota(schedule_msgs_per_s=100, schedule_burst_msgs=400,
                                 schedule_bytes_per_s=65536, max_pending_msgs=1000,
                                 max_consumer_streams=4)
    assert billing.quota is NO_QUOTA and not billing.quota.bounds()


@pytest.mark.parametrize(("lines", "named"), [
    ("schedule_msgs_per_s = 0", "principal 'orders' quota.schedule_msgs_per_s: Input should "
                                "be greater than 0"),
    ("max_pending_msgs = -5", "principal 'orders' quota.max_pending_msgs: Input should be "
                              "greater than 0"),
    ("schedule_bytes_per_s = 1.5", "principal 'orders' quota.schedule_bytes_per_s: Input "
                                   "should be a valid integer"),
    ('max_consumer_streams = "4"', "principal 'orders' quota.max_consumer_streams: Input "
                                   "should be a valid integer"),
    ("max_consumer_streams = true", "principal 'orders' quota.max_consumer_streams"),
    ("max_streams = 4", "principal 'orders' quota.max_streams: Extra inputs are not "
                        "permitted"),
    ("schedule_burst_msgs = 10", "schedule_burst_msgs is the burst of schedule_msgs_per_s, "
                                 "which is not set"),
])
def test_a_bad_quota_is_refused_naming_the_principal_and_the_field(lines: str,
                                                                   named: str) -> None:
    with pytest.raises(ValueError) as refused:
        access({"orders": lines})
    assert named in str(refused.value)


def test_a_node_refuses_to_start_with_a_bad_quota_naming_the_file_and_the_field(
        dev_security: DevCredentials, tmp_path: Path) -> None:
    bad = tmp_path / "access.toml"
    bad.write_text(dev_security.access_file.read_text()
                   + "\n[principal.quota]\nschedule_msgs_per_s = 0\n")
    with pytest.raises(ValidationError) as refused:
        NodeSettings(tls_cert_file=dev_security.cert_file, tls_key_file=dev_security.key_file,
                     tls_ca_file=dev_security.ca_file, access_file=bad)
    assert (f"access file {bad}: principal 'admin' quota.schedule_msgs_per_s: Input should be "
            "greater than 0") in str(refused.value)


# -- the token bucket ---------------------------------------------------------------------------

def test_the_worked_example_of_the_bucket_holds() -> None:
    assert doctest.testmod(quotas_module).failed == 0


def test_a_bucket_refills_at_its_rate_up_to_its_burst_and_says_how_long_to_wait() -> None:
    bucket = TokenBucket(rate_per_s=100, burst=100, now_ms=0)
    assert bucket.take(100, now_ms=0) == 0
    assert bucket.take(1, now_ms=0) == 10  # 1 token at 100 a second
    assert bucket.take(50, now_ms=0) == 500
    assert bucket.take(50, now_ms=499) == 1  # 49.9 tokens: not yet
    assert bucket.take(50, now_ms=500) == 0
    assert bucket.take(100, now_ms=60_000) == 0  # a minute idle refills the burst, no more
    assert bucket.take(1, now_ms=60_000) == 10


def test_a_request_above_the_burst_passes_a_full_bucket_and_its_debt_is_paid_first() -> None:
    bucket = TokenBucket(rate_per_s=10, burst=20, now_ms=0)
    assert bucket.take(5, now_ms=0) == 0
    assert bucket.take(50, now_ms=0) == 500  # not full: waits for the 20 of a full bucket
    assert bucket.take(50, now_ms=500) == 0  # full: 50 taken, 30 owed
    assert bucket.wait_ms(1, now_ms=500) == 3_100  # 30 owed and 1 more, at 10 a second
    assert bucket.take(1, now_ms=3_599) == 1
    assert bucket.take(1, now_ms=3_600) == 0


# -- Quotas ---------------------------------------------------------------------------------

def test_a_principal_over_its_rate_is_refused_with_a_retry_that_passes_and_others_go_on(
        ) -> None:
    clock = Clock()
    refused: list[QuotaExceeded] = []
    quotas = Quotas(clock, dict, refused.append)
    parsed = access({"orders": "schedule_msgs_per_s = 10", "billing": ""})
    orders, billing = parsed.by_name("orders"), parsed.by_name("billing")
    assert orders is not None and billing is not None

    def schedule(principal: Principal, msgs: int) -> None:
        quotas.admit_schedule(principal, msgs, lambda: 0).release()
    schedule(orders, 10)
    with pytest.raises(QuotaExceeded) as over:
        schedule(orders, 5)
    assert (over.value.principal, over.value.quota, over.value.quota_value) == (
        "orders", "schedule_msgs_per_s", 10)
    assert over.value.retry_after_ms == 500
    assert "principal 'orders' is over its schedule_msgs_per_s of 10" in str(over.value)
    for _ in range(100):
        schedule(billing, 1_000)  # no quota: never counted
    clock.now_ms = over.value.retry_after_ms
    schedule(orders, 5)
    assert refused == [over.value]


def test_both_rates_must_pass_and_a_refusal_takes_from_neither_bucket() -> None:
    clock = Clock()
    quotas = Quotas(clock, dict)
    orders = access({"orders": "schedule_msgs_per_s = 100\nschedule_bytes_per_s = 1000"}
                    ).by_name("orders")
    assert orders is not None
    quotas.admit_schedule(orders, 10, lambda: 900)
    with pytest.raises(QuotaExceeded) as over:
        quotas.admit_schedule(orders, 10, lambda: 400)
    assert over.value.quota == "schedule_bytes_per_s"
    assert over.value.retry_after_ms == 300  # 300 bytes missing at 1,000 a second
    clock.now_ms = 300
    quotas.admit_schedule(orders, 90, lambda: 400)  # the 10 refused were not taken
    with pytest.raises(QuotaExceeded) as both:
        quotas.admit_schedule(orders, 50, lambda: 500)
    assert both.value.quota == "schedule_msgs_per_s"  # the first refusing, the longer wait
    assert both.value.retry_after_ms == 500


def test_pending_counts_the_topics_its_schedule_grants_match_and_what_is_on_its_way() -> None:
    clock = Clock()
    pending = {"orders": 50, "orders.eu": 30, "billing": 1_000_000}
    reads: list[int] = []

    def read() -> dict[str, int]:
        reads.append(clock.now_ms)
        return dict(pending)
    quotas = Quotas(clock, read)
    orders = access({"orders": "max_pending_msgs = 100"}).by_name("orders")
    assert orders is not None
    first = quotas.admit_schedule(orders, 15, lambda: 0)
    with pytest.raises(QuotaExceeded) as over:  # 80 pending and 15 on their way
        quotas.admit_schedule(orders, 10, lambda: 0)
    assert over.value.quota == "max_pending_msgs" and over.value.quota_value == 100
    assert "(95 pending in its topics, 10 more asked)" in str(over.value)
    first.release()
    first.release()  # once only
    with pytest.raises(QuotaExceeded):  # answered, and not in the counts last read: counted
        quotas.admit_schedule(orders, 10, lambda: 0)
    pending["orders"] += 15  # applied before it was answered
    clock.now_ms = PENDING_READ_MS  # read again: in the counts now, counted once
    quotas.admit_schedule(orders, 5, lambda: 0).release()
    assert reads == [0, PENDING_READ_MS]
    pending["orders"] = 0  # delivered or cancelled
    clock.now_ms = 2 * PENDING_READ_MS
    quotas.admit_schedule(orders, 65, lambda: 0).release()
    with pytest.raises(InvalidMessage, match=r"messages: has 101 messages, above "
                       r"max_pending_msgs \(100\) of principal 'orders': split the batch"):
        quotas.admit_schedule(orders, 101, lambda: 0)


def test_consumer_streams_are_counted_per_principal_and_a_stream_closed_frees_its_place(
        ) -> None:
    quotas = Quotas(Clock(), dict)
    parsed = access({"orders": "max_consumer_streams = 2", "billing": ""})
    orders, billing = parsed.by_name("orders"), parsed.by_name("billing")
    assert orders is not None and billing is not None
    streams = [quotas.open_stream(orders), quotas.open_stream(orders)]
    with pytest.raises(QuotaExceeded, match=r"max_consumer_streams of 2 \(2 open on this node\)"):
        quotas.open_stream(orders)
    others = [quotas.open_stream(billing) for _ in range(50)]
    streams.pop().release()
    streams.append(quotas.open_stream(orders))
    for stream in streams + others:
        stream.release()


def test_a_quota_changed_in_the_file_takes_effect_at_the_next_call() -> None:
    clock = Clock()
    quotas = Quotas(clock, dict)
    slow = access({"orders": "schedule_msgs_per_s = 1"}).by_name("orders")
    assert slow is not None
    quotas.admit_schedule(slow, 1, lambda: 0)
    with pytest.raises(QuotaExceeded):
        quotas.admit_schedule(slow, 1, lambda: 0)
    reread = access({"orders": "schedule_msgs_per_s = 1"}).by_name("orders")
    assert reread is not None
    with pytest.raises(QuotaExceeded):  # the same quota reread: the same bucket, still empty
        quotas.admit_schedule(reread, 1, lambda: 0)
    raised = access({"orders": "schedule_msgs_per_s = 1000"}).by_name("orders")
    assert raised is not None
    quotas.admit_schedule(raised, 1_000, lambda: 0)  # a new bucket, full
    unbounded = access({"orders": ""}).by_name("orders")
    assert unbounded is not None
    for _ in range(10):
        quotas.admit_schedule(unbounded, 10_000, lambda: 0)


def test_refusals_are_logged_once_a_while_per_principal_and_quota(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    quotas = Quotas(clock, dict)
    orders = access({"orders": "max_consumer_streams = 1"}).by_name("orders")
    assert orders is not None
    quotas.open_stream(orders)
    with caplog.at_level(logging.WARNING, "tickwheel.node.quotas"):
        for _ in range(5):
            with pytest.raises(QuotaExceeded):
                quotas.open_stream(orders)
        clock.now_ms = LOG_EVERY_MS
        with pytest.raises(QuotaExceeded):
            quotas.open_stream(orders)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("event=quota_exceeded principal=orders quota="
                               "max_consumer_streams limit=1 retry_after_ms=1000")
    assert lines[1].endswith("not_logged_since_last=4")


# -- the status details -------------------------------------------------------------------------

def test_the_status_details_carry_the_retry_and_the_quota_and_read_back() -> None:
    data = quota_details("over", "orders", "schedule_msgs_per_s", 10, 1_250)
    assert RetryAdvice.of([("tickwheel-leader", "x"), (STATUS_DETAILS_KEY, data)]) == (
        RetryAdvice(1_250, "schedule_msgs_per_s", 10))
    assert RetryAdvice.of([("tickwheel-leader", "x")]) is None
    assert RetryAdvice.of([(STATUS_DETAILS_KEY, b"\xff not a status")]) is None
    assert RetryAdvice.of(None) is None
