"""docs/shards.md's growth by hand, run as its shell block is written (its ports moved to a
free range): two shards of three `tickwheel serve` processes, grown to four with the flags the
page lists for new nodes and ``tickwheel grow-shards``. A flag the page left out (the TLS
files, the access file, the Raft secret, the peer addresses) fails it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numbered_ports
import pytest

pytestmark = pytest.mark.cluster

SHARDS_DOC = Path(__file__).resolve().parents[2] / "docs" / "shards.md"
RUN = """
set -e
trap 'kill $(jobs -p) 2> /dev/null; wait' EXIT
source recipe.sh
for shard in 0 1 2 3; do   # a member of each shard answers with the grown map
  tickwheel status --target 127.0.0.1:$((GRPC + shard * 3)) |
    grep -o "shard $shard of 4 (map version 2)"
done
"""


def _recipe(base_port: int) -> str:
    """The block, with gRPC on ``base_port + j`` and the other ports as far above it."""
    text = SHARDS_DOC.read_text()
    block = re.search(r"^By hand on one machine.*?```sh\n(.*?)```", text, re.S | re.M)
    assert block is not None
    moved = {"7400": base_port, "7500": base_port + 100, "7600": base_port + 200,
             "9400": base_port + 2000}
    return re.sub(r"\b(7400|7500|7600|9400)\b", lambda m: str(moved[m.group(1)]),
                  block.group(1))


def test_the_documented_growth_by_hand_grows_two_shards_to_four(tmp_path: Path) -> None:
    base_port = numbered_ports.base_port("growth_by_hand")
    (tmp_path / "recipe.sh").write_text(_recipe(base_port))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    run = subprocess.run(["bash", "-c", RUN], cwd=tmp_path, capture_output=True, text=True,
                         timeout=240, check=False,
                         env={**os.environ, "PATH": path, "GRPC": str(base_port),
                              "COLUMNS": "200"})
    logs = "".join(f"\n--- {log.name}\n{log.read_text()[-1500:]}"
                   for log in sorted((tmp_path / "data").glob("node*.log")))
    assert run.returncode == 0, run.stdout + run.stderr + logs
    assert "shard map version 2: 4 shards" in run.stdout
    assert [f"shard {k} of 4 (map version 2)" in run.stdout for k in range(4)] == [True] * 4
