"""What the chaos tests that start Spark share (importable: ``tests/chaos`` is on pytest's
path): a quick JVM, and a session of it started in the background."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tickwheel.audit import build_session

QUICK_JVM = ("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")
"""Spark's JVMs here live seconds on tiny logs: the quick JIT tier alone halves their CPU."""


def spark_session(in_background: Callable[..., Any]) -> Iterator[SparkSession]:
    """A local session, its JVM started in the background (it counts no seconds), and so run
    there; stopped after. A module's ``spark`` fixture yields from it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(*QUICK_JVM)
        session = in_background(build_session, "local[2]")
    yield session
    session.stop()
