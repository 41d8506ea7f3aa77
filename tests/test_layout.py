"""The install maps folders into tickwheel.* and never shadows the packaging tool's `wheel`."""

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
    for name in ("wheel", "node", "replication", "chaos"):
        origin = _import_from_outside(f"tickwheel.{name}").stdout.strip()
        assert Path(origin) == PROJECT / name / "__init__.py"


def test_no_top_level_module_shadows_a_folder_name() -> None:
    for name in ("node", "replication", "chaos"):
        assert _import_from_outside(name).stdout.strip() == "absent"
    origin = _import_from_outside("wheel").stdout.strip()
    assert origin == "absent" or not origin.startswith(str(PROJECT))
