"""The install maps folders into tickwheel.* and never shadows the packaging tool's `wheel`."""

import ast
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def _import_from_outside(module: str) -> subprocess.CompletedProcess[str]:
    """Import ``module`` in a fresh interpreter whose working directory is not the project,
    so only what is installed can be found."""
    code = (f"import importlib.util as u; s = u.find_spec({module!r}); "
            "print(s.origin if s else 'absent')")
    return subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True,
                          text=True, check=True)


def test_the_code_folders_are_importable_only_under_tickwheel() -> None:
    for name in ("common", "wheel", "node", "replication", "chaos", "harness"):
        origin = _import_from_outside(f"tickwheel.{name}").stdout.strip()
        assert Path(origin) == PROJECT / name / "__init__.py"


def test_no_top_level_module_shadows_a_folder_name() -> None:
    for name in ("node", "replication", "chaos", "harness"):
        assert _import_from_outside(name).stdout.strip() == "absent"
    origin = _import_from_outside("wheel").stdout.strip()
    assert origin == "absent" or not origin.startswith(str(PROJECT))


def test_only_the_raft_port_imports_pysyncobj() -> None:
    """pysyncobj is sealed behind ``tickwheel.replication.raft`` (issue 20): an upgrade or a
    replacement touches that package only."""
    offenders = []
    for folder in ("common", "wheel", "replication", "node", "chaos", "client", "harness"):
        for path in (PROJECT / folder).rglob("*.py"):
            if (PROJECT / "replication" / "raft") in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                offenders += [f"{path.relative_to(PROJECT)}: {name}" for name in names
                              if name.split(".")[0] == "pysyncobj"]
    assert offenders == []


def test_the_layers_above_use_the_replication_layers_face_only() -> None:
    """Above it, code imports ``tickwheel.replication`` and the Raft port's face
    ``tickwheel.replication.raft``, never a module inside (issue 20: `state.Rejected` and
    `dispatcher.Delivery` were imported from wherever they lived)."""
    faces = {"tickwheel.replication", "tickwheel.replication.raft"}
    offenders = []
    for folder in ("node", "harness", "chaos", "client"):
        for path in (PROJECT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                offenders += [f"{path.relative_to(PROJECT)}: {name}" for name in names
                              if name.startswith("tickwheel.replication") and name not in faces]
    assert offenders == []
