"""Fixtures of the console's tests: one 3-node cluster per test module, with an ``admin`` and
a read-only ``reader`` principal, whose nodes dead-letter a message at its first nack, and a
``tickwheel console`` process beside it (started as a
user starts it: `ConsoleProcess`); the browser (Debian's chromium, driven by Playwright).

Debian's chromium is installed by ``make chromium`` (which ``make test`` runs); nothing is
downloaded at run time: Playwright is pointed at `CHROMIUM`. Screenshots of the pages go to
``$TICKWHEEL_SCREENSHOTS`` when set (``make console-screenshots`` sets it to docs/console).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from browsing import CHROMIUM, READER, Running
from tickwheel.harness.console_process import ConsoleProcess
from tickwheel.harness.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with LocalCluster(tmp_path_factory.mktemp("console"), principals=READER,
                      extra_args=("--max-attempts", "1")) as cluster:  # a nack dead-letters
        cluster.leader(timeout_s=30)
        with ConsoleProcess(cluster) as console:
            yield Running(cluster, console)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run make chromium (make test runs it)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (no cookies) that trusts the console's certificate: it is
    signed by the cluster's development CA, which the browser does not know."""
    context = browser.new_context(ignore_https_errors=True, viewport={"width": 1280,
                                                                      "height": 800})
    context.set_default_timeout(10_000)
    opened = context.new_page()
    yield opened
    context.close()

