"""Generates the gRPC stubs from proto/ whenever the package is built (also for -e installs).

They are written to build/generated (not committed) and installed as `tickwheel.v1` (our API)
and `tickwheel.rocketmq.v2` (RocketMQ 5's `apache.rocketmq.v2`, vendored verbatim under
proto/apache). Generation runs when setuptools loads this file, before it looks for those
package folders.
"""

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc  # a build requirement (pyproject.toml)
from setuptools import setup

ROOT = Path(__file__).parent
PROTO_ROOT = ROOT / "proto"
GENERATED = ROOT / "build" / "generated"
ROCKETMQ = GENERATED / "tickwheel" / "rocketmq" / "v2"
"""Where the RocketMQ stubs are installed from: protoc writes them to apache/rocketmq/v2 (the
protos' own path) and they move here, their imports of each other renamed to match, so the
installed package claims no top-level ``apache``."""


def typed_grpc_plugin() -> str:
    """mypy-protobuf's protoc plugin (a build requirement), which writes the ``*_pb2_grpc.pyi``
    that type the stubs and servicers (protoc's own ``--pyi_out`` types the messages alone).
    On PATH in pip's isolated build environment; beside the interpreter in a plain venv built
    with --no-build-isolation (deploy/Dockerfile)."""
    name = "protoc-gen-mypy_grpc"
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError(f"{name} not found: install mypy-protobuf (pyproject.toml)")
    return found


def generate_stubs() -> None:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    (GENERATED / "tickwheel" / "v1").mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    status = protoc.main(["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}",
                          f"--python_out={GENERATED}", f"--grpc_python_out={GENERATED}",
                          f"--pyi_out={GENERATED}",
                          f"--plugin=protoc-gen-mypy_grpc={typed_grpc_plugin()}",
                          f"--mypy_grpc_out={GENERATED}", *protos])
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}")
    (GENERATED / "tickwheel" / "v1" / "__init__.py").write_text(
        '"""gRPC stubs generated from proto/tickwheel/v1 at build time."""\n')
    ROCKETMQ.mkdir(parents=True, exist_ok=True)
    for made in sorted((GENERATED / "apache" / "rocketmq" / "v2").iterdir()):
        text = made.read_text().replace("from apache.rocketmq.v2 import",
                                        "from tickwheel.rocketmq.v2 import")
        (ROCKETMQ / made.name).write_text(text)
        made.unlink()
    (ROCKETMQ.parent / "__init__.py").write_text(
        '"""RocketMQ 5\'s client protocol (Apache-2.0), generated at build time."""\n')
    (ROCKETMQ / "__init__.py").write_text(
        '"""gRPC stubs generated from proto/apache/rocketmq/v2 at build time."""\n')


generate_stubs()
setup()
