"""`build_session`: the settings its caller passes go over the audit's own defaults, so that
``audit_bench --conf spark.sql.shuffle.partitions=32`` is what the audit's session runs with
(the defaults were applied after them, and the bench measured 8 partitions whatever it was
told)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sparktests import QUICK_JVM

from tickwheel.audit import build_session
from tickwheel.audit.command import SHUFFLE_PARTITIONS

pytestmark = pytest.mark.cluster  # a JVM


def test_the_callers_settings_go_over_the_defaults(in_background: Callable[..., Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(*QUICK_JVM)
    wanted = str(SHUFFLE_PARTITIONS * 4)
    session = in_background(build_session, "local[1]", "settings",
                            {"spark.sql.shuffle.partitions": wanted})
    try:
        assert session.conf.get("spark.sql.shuffle.partitions") == wanted
        assert session.conf.get("spark.ui.enabled") == "false"  # a default kept
    finally:
        session.stop()
