"""The hourly audit (deploy/k8s/audit-cronjob.yaml), checked offline: valid against the
Kubernetes schemas (strict), run hourly and never twice at once, never retried, its two
commands parsed by the real parsers of ``tickwheel ledger fetch`` and ``tickwheel audit``
(the folder fetched is the folder audited, the same two hours, the report on the claim), and
the audit's exit code the Job's."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tickwheel.audit import add_arguments
from tickwheel.node.cli import ledger as cli_ledger
from tickwheel.node.cli.commands import duration_ms

from . import kustomize_lite

CRONJOB = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "audit-cronjob.yaml"


@pytest.fixture(scope="module")
def documents() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in kustomize_lite.load_documents(CRONJOB)}


def script_lines(documents: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The container's shell script, a command per line (continuations joined)."""
    [container] = pod(documents)["containers"]
    assert container["command"][:2] == ["sh", "-ec"]
    script = container["command"][2].replace("\\\n", " ")
    return [shlex.split(line) for line in script.splitlines() if line.strip()]


def pod(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = documents["CronJob"]["spec"]["jobTemplate"]["spec"]["template"][
        "spec"]
    return spec


def test_every_object_is_valid(documents: dict[str, dict[str, Any]]) -> None:
    assert set(documents) == {"CronJob", "PersistentVolumeClaim"}
    for obj in documents.values():
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_it_runs_hourly_once_at_a_time_and_is_not_retried(
        documents: dict[str, dict[str, Any]]) -> None:
    spec = documents["CronJob"]["spec"]
    minute, *rest = spec["schedule"].split()
    assert minute.isdigit() and rest == ["*", "*", "*", "*"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["jobTemplate"]["spec"]["backoffLimit"] == 0
    assert spec["jobTemplate"]["spec"]["activeDeadlineSeconds"] < 3600
    security = pod(documents)["securityContext"]
    assert security["runAsNonRoot"] is True
    [container] = pod(documents)["containers"]
    assert container["image"].startswith("tickwheel-audit:")


def test_it_fetches_two_hours_then_audits_them_and_exits_with_the_audit(
        documents: dict[str, dict[str, Any]]) -> None:
    lines = script_lines(documents)
    fetch = next(line for line in lines if line[:3] == ["tickwheel", "ledger", "fetch"])
    audit = lines[-1]
    assert audit[:3] == ["exec", "tickwheel", "audit"], "the audit's exit code is the Job's"
    assert lines.index(fetch) < len(lines) - 1
    commands = argparse.ArgumentParser().add_subparsers()
    cli_ledger.add_parsers(commands, argparse.ArgumentParser(add_help=False), duration_ms,
                           lambda args: None)  # type: ignore[arg-type,return-value]
    fetched = commands.choices["ledger"].parse_args(fetch[2:])
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    redirect = audit.index(">")
    audited = parser.parse_args(audit[3:redirect])
    assert fetched.out == audited.folder
    assert abs(fetched.since - audited.since) < 60_000
    mounts = {mount["mountPath"]: mount["name"]
              for mount in pod(documents)["containers"][0]["volumeMounts"]}
    claims = {volume["name"] for volume in pod(documents)["volumes"]
              if "persistentVolumeClaim" in volume}
    assert str(audited.report).startswith("$run/")
    assert mounts["/audit"] in claims and str(audited.folder).startswith("/audit/")
    claim = documents["PersistentVolumeClaim"]["metadata"]["name"]
    assert {volume["persistentVolumeClaim"]["claimName"] for volume in pod(documents)["volumes"]
            if "persistentVolumeClaim" in volume} == {claim}
