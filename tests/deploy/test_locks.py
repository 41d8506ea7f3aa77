"""The lock files the image installs from, and the Dockerfile steps that install them, offline.

``make lock`` writes the files (uv, from pyproject.toml); these tests check that they still say
what pyproject.toml asks for, that every pin carries its hashes, and that every ``pip install``
of the Dockerfile takes exactly a lock file (``--require-hashes --no-deps``) or the project's
own wheel (``--no-deps``), so that pip never chooses a version or a file by itself.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .test_manifests import DEPLOY, PROJECT, Stage, dockerfile_stages

PYPROJECT = tomllib.loads((PROJECT / "pyproject.toml").read_text())
NODE_LOCK, AUDIT_LOCK, BUILD_LOCK = (
    "requirements.lock", "requirements-audit.lock", "requirements-build.lock")
LOCKED: dict[str, list[str]] = {
    NODE_LOCK: PYPROJECT["project"]["dependencies"],
    AUDIT_LOCK: [*PYPROJECT["project"]["dependencies"],
                 *PYPROJECT["project"]["optional-dependencies"]["audit"]],
    BUILD_LOCK: PYPROJECT["build-system"]["requires"],
}
"""Each lock file and the requirements (from pyproject.toml) it must satisfy."""
STAGE_LOCKS = {"builder": BUILD_LOCK, "runtime": NODE_LOCK, "audit": AUDIT_LOCK}
"""The lock file each stage of the Dockerfile installs from."""
IMAGE_ENVIRONMENT = {**default_environment(), "python_version": "3.11",
                     "python_full_version": "3.11.0", "sys_platform": "linux",
                     "platform_system": "Linux", "os_name": "posix",
                     "implementation_name": "cpython", "platform_python_implementation": "CPython"}
"""The markers of the image's interpreter (CPython 3.11 on Linux), for either machine."""
PIN = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Pin:
    version: str
    hashes: frozenset[str]


def logical_lines(path: Path) -> list[str]:
    """The requirement lines of a pip requirements file: continuations joined, comments and
    blank lines dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [line.split(" #")[0].strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def pins(name: str) -> dict[str, Pin]:
    """The pins of the lock file ``name``, by canonical project name."""
    found: dict[str, Pin] = {}
    for line in logical_lines(PROJECT / name):
        requirement, *options = line.split()
        match = PIN.fullmatch(requirement)
        assert match, f"{name}: not a pin: {line[:80]}"
        key = canonicalize_name(match["name"])
        assert key not in found, f"{name}: {key} pinned twice"
        found[key] = Pin(match["version"], frozenset(options))
    return found


def test_every_requirement_of_every_lock_is_pinned_with_its_hashes() -> None:
    for name in LOCKED:
        lines = logical_lines(PROJECT / name)
        assert lines, f"{name} pins nothing"
        for line in lines:
            requirement, *options = line.split()
            assert PIN.fullmatch(requirement), f"{name}: not name==version: {line[:80]}"
            hashes = [option for option in options if option.startswith("--hash=")]
            assert hashes, f"{name}: {requirement} has no --hash=sha256:"
            bad = [option for option in options if not HASH.fullmatch(option)]
            assert not bad, f"{name}: {requirement}: {bad[0][:80]} is not a sha256 hash"


def test_each_lock_gives_what_pyproject_asks_at_a_version_it_allows() -> None:
    for name, requirements in LOCKED.items():
        locked = pins(name)
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate(IMAGE_ENVIRONMENT):
                continue
            pin = locked.get(canonicalize_name(requirement.name))
            assert pin, f"{name}: {requirement.name} (pyproject.toml) is not locked"
            exact = [spec.version for spec in requirement.specifier if spec.operator == "=="]
            if exact:
                assert pin.version == exact[0], (
                    f"{name}: {requirement.name}=={pin.version}, pyproject.toml pins {exact[0]}")
            assert requirement.specifier.contains(pin.version, prereleases=True), (
                f"{name}: {requirement.name}=={pin.version} is outside {requirement.specifier}")


def test_the_audit_lock_holds_the_node_lock_unchanged() -> None:
    # The audit stage installs over the runtime's venv: a package at another version there
    # would replace the one the node runs with.
    node, audit = pins(NODE_LOCK), pins(AUDIT_LOCK)
    for name, pin in node.items():
        assert audit.get(name) == pin, f"{name}: {pin.version} in {NODE_LOCK}, " + (
            f"{audit[name].version} in {AUDIT_LOCK}" if name in audit else f"not in {AUDIT_LOCK}")


def test_each_lock_holds_the_dependencies_of_what_it_pins() -> None:
    """Transitively complete, as far as the project's venv can tell: each pinned project
    installed here at its locked version has its requirements (for the image's interpreter)
    pinned too. ``pip check`` in the Dockerfile checks the same at build time."""
    for name in (NODE_LOCK, AUDIT_LOCK):
        locked = pins(name)
        checked = 0
        for project, pin in locked.items():
            try:
                installed = importlib.metadata.distribution(project)
            except importlib.metadata.PackageNotFoundError:
                continue
            if installed.version != pin.version:
                continue
            checked += 1
            for text in installed.requires or []:
                requirement = Requirement(text)
                if requirement.marker and not requirement.marker.evaluate(
                        {**IMAGE_ENVIRONMENT, "extra": ""}):
                    continue
                assert canonicalize_name(requirement.name) in locked, (
                    f"{name}: {project} needs {requirement.name}, which is not locked "
                    "(make lock)")
        assert checked >= len(LOCKED[name]), f"{name}: only {checked} pins could be checked"


# -- the Dockerfile ---------------------------------------------------------------------------

def commands(stage: Stage) -> list[list[str]]:
    """The shell commands of a stage's RUN instructions (split at &&), as argument lists;
    a RUN's ``--mount`` options lead its first command."""
    return [shlex.split(command) for run in stage.all("RUN") for command in run.split("&&")]


def pip_command(argv: list[str], verb: str) -> list[str] | None:
    """The arguments after ``verb`` if ``argv`` runs pip's ``verb``, else None."""
    runs_pip = any(word == "pip" or word.endswith("/pip") for word in argv)
    if not runs_pip or verb not in argv:
        return None
    return argv[argv.index(verb) + 1:]


def mounts(stage: Stage) -> dict[str, dict[str, str]]:
    """Every bind mount of the stage's RUNs, by target."""
    found = {}
    for run in stage.all("RUN"):
        for option in re.findall(r"--mount=(\S+)", run):
            fields = dict(field.split("=", 1) for field in option.split(","))
            found[fields["target"]] = fields
    return found


def lock_in_context(stage: Stage, path: str) -> str | None:
    """The file of the build context that ``path`` names in the stage: a bind mount of it from
    the context, or (relative) a copy of the whole context in the working directory."""
    mount = mounts(stage).get(path)
    if mount is not None:
        return None if "from" in mount else mount["source"]
    copies_context = ". ." in stage.all("COPY")
    return path if copies_context and not path.startswith("/") else None


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    _, found = dockerfile_stages(DEPLOY / "Dockerfile")
    return {stage.name: stage for stage in found}


def test_each_stage_installs_its_lock_file_with_hashes_and_nothing_else_unpinned(
        stages: dict[str, Stage]) -> None:
    for name, lock in STAGE_LOCKS.items():
        installs = [args for argv in commands(stages[name])
                    if (args := pip_command(argv, "install")) is not None]
        from_locks = [args for args in installs if "-r" in args]
        assert len(from_locks) == 1, f"{name}: {len(from_locks)} installs from a lock file"
        [args] = from_locks
        assert lock_in_context(stages[name], args[args.index("-r") + 1]) == lock, (
            f"{name} must install from {lock}")
        assert "--require-hashes" in args and "--no-deps" in args, name
        for other in installs:
            # Besides the lock file, only the project's own wheel, and it alone (--no-deps).
            if other is not args:
                assert "--no-deps" in other, f"{name}: pip may resolve {other}"
                assert all(word.startswith("-") or word.startswith("/dist/")
                           for word in other), f"{name}: installs {other}"


def test_the_runtime_installs_the_locked_dependencies_then_the_wheel_alone_then_checks(
        stages: dict[str, Stage]) -> None:
    steps = [(verb, args) for argv in commands(stages["runtime"]) for verb in ("install", "check")
             if (args := pip_command(argv, verb)) is not None]
    assert [verb for verb, _ in steps] == ["install", "install", "check"], steps
    (_, locked), (_, wheel), _ = steps
    assert "-r" in locked and "--require-hashes" in locked
    assert "--no-deps" in wheel and [word for word in wheel if not word.startswith("-")] == [
        "/dist/*.whl"]


def test_the_wheel_is_built_with_the_locked_build_tools_only(stages: dict[str, Stage]) -> None:
    wheels = [args for argv in commands(stages["builder"])
              if (args := pip_command(argv, "wheel")) is not None]
    assert len(wheels) == 1
    # Build isolation would install setuptools and grpcio-tools again, unpinned.
    assert "--no-build-isolation" in wheels[0] and "--no-deps" in wheels[0]


def test_the_lock_files_are_in_the_build_context() -> None:
    patterns = [line.strip() for line in (PROJECT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"
    for lock in LOCKED:
        assert f"!{lock}" in patterns, f"{lock} is not in the build context (.dockerignore)"
