"""The alert rules as Prometheus reads them: ``promtool check rules`` on the plain rules file
and on the PrometheusRule's rules, and ``promtool test rules`` on the unit tests beside them
(every alert fires when its case says and not otherwise; test_monitoring.py checks that every
alert has both cases). promtool comes from Debian's prometheus package (``make test``
installs it when missing).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .test_monitoring import MONITORING, RULES_FILE, RULES_TESTS

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(shutil.which("promtool") is None,
                                 reason="promtool is not on PATH (make test installs it)")]


def promtool(*args: str) -> str:
    run = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_promtool_checks_the_rules_file_and_the_prometheus_rules_rules(tmp_path: Path) -> None:
    assert "SUCCESS" in promtool("check", "rules", str(RULES_FILE))
    spec = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text())["spec"]
    extracted = tmp_path / "from-prometheus-rule.yaml"
    extracted.write_text(yaml.safe_dump(spec))
    assert "SUCCESS" in promtool("check", "rules", str(extracted))


def test_every_alert_fires_in_its_promtool_case_and_only_there() -> None:
    assert "SUCCESS" in promtool("test", "rules", str(RULES_TESTS))
