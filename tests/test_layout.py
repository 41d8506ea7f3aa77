"""The install maps folders into tickwheel.* and never shadows the packaging tool's `wheel`."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
CODE = ("common", "wheel", "replication", "node", "chaos", "client", "harness", "cli")


def _module(path: Path) -> str:
    parts = path.relative_to(PROJECT).with_suffix("").parts
    return ".".join(("tickwheel", *(parts[:-1] if parts[-1] == "__init__" else parts)))


MODULES = {_module(path): path for folder in CODE for path in (PROJECT / folder).rglob("*.py")}


def _imported(path: Path) -> list[str]:
    """The modules ``path`` imports, anywhere in it (a function, ``TYPE_CHECKING``): for
    ``from a import b``, ``a.b`` if that is one of ours, else ``a``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [full if (full := f"{node.module}.{alias.name}") in MODULES
                      else node.module for alias in node.names]
    return names


def _import_from_outside(module: str) -> subprocess.CompletedProcess[str]:
    """Import ``module`` in a fresh interpreter whose working directory is not the project,
    so only what is installed can be found."""
    code = (f"import importlib.util as u; s = u.find_spec({module!r}); "
            "print(s.origin if s else 'absent')")
    return subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True,
                          text=True, check=True)


@pytest.mark.cluster
def test_the_code_folders_are_importable_only_under_tickwheel() -> None:
    for name in ("common", "wheel", "node", "replication", "chaos", "harness", "cli"):
        origin = _import_from_outside(f"tickwheel.{name}").stdout.strip()
        assert Path(origin) == PROJECT / name / "__init__.py"


@pytest.mark.cluster
def test_no_top_level_module_shadows_a_folder_name() -> None:
    for name in ("node", "replication", "chaos", "harness", "cli"):
        assert _import_from_outside(name).stdout.strip() == "absent"
    origin = _import_from_outside("wheel").stdout.strip()
    assert origin == "absent" or not origin.startswith(str(PROJECT))


def test_only_the_raft_port_imports_pysyncobj() -> None:
    """pysyncobj is sealed behind ``tickwheel.replication.raft`` (issue 20): an upgrade or a
    replacement touches that package only."""
    offenders = []
    for folder in CODE:
        for path in (PROJECT / folder).rglob("*.py"):
            if (PROJECT / "replication" / "raft") not in path.parents:
                offenders += [f"{path.relative_to(PROJECT)}: {name}" for name in _imported(path)
                              if name.split(".")[0] == "pysyncobj"]
    assert offenders == []


@pytest.mark.parametrize(("package", "faces", "above"), [
    ("tickwheel.wheel", {"tickwheel.wheel", "tickwheel.wheel.faults"},
     ("node", "harness", "chaos", "cli", "client")),
    ("tickwheel.replication", {"tickwheel.replication", "tickwheel.replication.raft"},
     ("node", "harness", "chaos", "cli", "client")),
    ("tickwheel.node", {"tickwheel.node"}, ("harness", "chaos", "cli", "client")),
])
def test_the_layers_above_use_a_layers_face_only(package: str, faces: set[str],
                                                 above: tuple[str, ...]) -> None:
    """Above a layer, code imports its face (``tickwheel.wheel`` and, to damage files on
    purpose, ``tickwheel.wheel.faults``; ``tickwheel.replication`` and the Raft port's
    ``tickwheel.replication.raft``; ``tickwheel.node``), never a module inside (issue 20:
    `state.Rejected` and `dispatcher.Delivery` were imported from wherever they lived, and the
    harness reached into the node's CLI, disk watch and RocketMQ signing)."""
    offenders = []
    for folder in above:
        for path in (PROJECT / folder).rglob("*.py"):
            offenders += [f"{path.relative_to(PROJECT)}: {name}" for name in _imported(path)
                          if name.startswith(package) and name not in faces]
    assert offenders == []


def test_the_node_keeps_its_modules_in_rooms() -> None:
    """``node/`` holds at most 10 modules at its top level (issue 38: 36 lay side by side); the
    rest live in rooms by concern, each saying in its ``__init__`` what it holds (which room
    may import which is pyproject.toml's contract)."""
    node = PROJECT / "node"
    assert len(list(node.glob("*.py"))) <= 10
    rooms = [path.parent for path in node.glob("*/__init__.py")]
    assert rooms
    assert [room.name for room in rooms
            if not ast.get_docstring(ast.parse((room / "__init__.py").read_text()))] == []


def test_no_modules_import_each_other() -> None:
    """No circle of imports, not even one for type hints only (issue 20: the courier, the
    metrics and the journal imported one another): each module can be read, tested and
    moved with what it imports alone."""
    graph = {module: {name for name in _imported(path) if name in MODULES and name != module}
             for module, path in MODULES.items()}
    circles = []
    for start in graph:  # a depth-first walk from each module, back to it
        stack = [(start, [start])]
        seen = set()
        while stack:
            module, trail = stack.pop()
            for name in graph[module]:
                if name == start:
                    circles.append(" -> ".join([*trail, start]))
                elif name not in seen:
                    seen.add(name)
                    stack.append((name, [*trail, name]))
    assert circles == []


@pytest.mark.cluster
def test_the_node_face_loads_only_what_is_asked_for() -> None:
    """A benchmark's RocketMQ consumer runs the official client, whose protos clash with the
    node's copy in one process: taking the dev credentials from the node's face must not load
    the server (it did, once the face imported its names eagerly). Every name resolves."""
    code = ("import sys\nimport tickwheel.node as face\n"
            "from tickwheel.harness import local_cluster\n"
            "face.make_dev_credentials, face.rocketmq_secret_key\n"
            "print(sorted(m for m in ('tickwheel.node.api.server',"
            " 'tickwheel.rocketmq.v2.service_pb2') if m in sys.modules))\n"
            "print(all(getattr(face, name) is not None for name in face.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True"]
