"""Generates the gRPC stubs from proto/ whenever the package is built (also for -e installs).

They are written to build/generated/tickwheel/v1 (not committed) and installed as `tickwheel.v1`.
Generation runs when setuptools loads this file, before it looks for that package folder.
"""

from pathlib import Path

from grpc_tools import protoc  # a build requirement (pyproject.toml)
from setuptools import setup

ROOT = Path(__file__).parent
PROTO_ROOT = ROOT / "proto"
GENERATED = ROOT / "build" / "generated"


def generate_stubs() -> None:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    (GENERATED / "tickwheel" / "v1").mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    status = protoc.main(["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}",
                          f"--python_out={GENERATED}", f"--grpc_python_out={GENERATED}",
                          f"--pyi_out={GENERATED}", *protos])
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}")
    (GENERATED / "tickwheel" / "v1" / "__init__.py").write_text(
        '"""gRPC stubs generated from proto/tickwheel/v1 at build time."""\n')


generate_stubs()
setup()
