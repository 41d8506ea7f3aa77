"""Hypothesis profiles: ``ci`` (default) keeps ``make test`` short; ``deep`` searches longer.

Select with ``HYPOTHESIS_PROFILE=deep``. Every failure prints its seed and steps, so it replays.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=150, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=3_000, stateful_step_count=80, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
