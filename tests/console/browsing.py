"""What the console's tests use besides their fixtures (tests/console/conftest.py): the
running cluster and console, logging in from a browser page, screenshots."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from playwright.sync_api import Page

from tickwheel.harness.console_process import ConsoleProcess
from tickwheel.harness.local_cluster import LocalCluster

CHROMIUM = Path("/usr/bin/chromium")
READER = {"reader": [{"actions": ["consume"], "topics": ["*"]}],
          "narrow": [{"actions": ["consume", "schedule"], "topics": ["console-narrow"]}]}
"""``reader`` may read every topic and change nothing; ``narrow`` may use one topic alone."""


@dataclass
class Running:
    cluster: LocalCluster
    console: ConsoleProcess

    def token(self, principal: str = "admin") -> str:
        return self.console.token_file(principal).read_text().strip()


def log_in(page: Page, running: Running, principal: str = "admin") -> None:
    page.goto(running.console.url + "login")
    page.fill("#token", running.token(principal))
    page.click("#login button[type=submit]")
    page.wait_for_url("**/cluster")


def screenshot(page: Page, name: str) -> None:
    """Save ``page`` as ``$TICKWHEEL_SCREENSHOTS/<name>.png`` when that folder is set."""
    folder = os.environ.get("TICKWHEEL_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)
