"""`build_session`: the settings its caller passes go over the audit's own defaults, so that
``audit_bench --conf spark.sql.shuffle.partitions=32`` is what the audit's session runs with
(the defaults were applied after them, and the bench measured 8 partitions whatever it was
told); and spark-submit's ``--conf`` goes over them too (a builder's setting overrides it)."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_spark_submits_conf_goes_over_the_defaults(in_background: Callable[..., Any]) -> None:
    """``--conf`` as spark-submit passes it (``PYSPARK_SUBMIT_ARGS``, which the Python driver
    hands to its JVM as spark-submit would), in a process of its own."""
    code = ("from tickwheel.audit import build_session; s = build_session('local[1]'); "
            "print(s.conf.get('spark.sql.shuffle.partitions')); s.stop()")
    env = {**os.environ, QUICK_JVM[0]: QUICK_JVM[1],
           "PYSPARK_SUBMIT_ARGS": "--conf spark.sql.shuffle.partitions=13 pyspark-shell"}
    run = in_background(subprocess.run, [sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2_000:]
    assert run.stdout.strip().splitlines()[-1] == "13"
