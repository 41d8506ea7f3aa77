"""What the chaos tests that start Spark share (importable: ``tests/chaos`` is on pytest's
path): a quick JVM, and a session of it started in the background."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tickwheel.audit import build_session

QUICK_JVM = ("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m "
             "-Xlog:disable -Xlog:all=warning:stderr")
"""Spark's JVMs here live seconds on tiny logs: the quick JIT tier alone halves their CPU.
With it the chaos audit (which runs the production audit too) filled the JVM's code cache,
and the JVM's warning about it went to stdout, before the audit's JSON (the commands now
point their JVM's stdout at stderr): a larger cache, and the JVM's own log on stderr."""


def spark_session(in_background: Callable[..., Any]) -> Iterator[SparkSession]:
    """A local session, its JVM started in the background (it counts no seconds), and so run
    there; stopped after. A module's ``spark`` fixture yields from it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(*QUICK_JVM)
        session = in_background(build_session, "local[2]")
    yield session
    session.stop()
