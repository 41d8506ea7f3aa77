"""The ledger: every node's record of the committed lifecycle of messages and of its own
sends, as rotated, compressed, sequence-numbered Parquet segments in ``DATA/ledger/``.

The replica tells it what each command it applies changed (`tickwheel.replication.ledger`),
the courier what it sends and when it starts dispatching; a bounded buffer and a thread of
its own write them (`writer`), in the format `schema` declares; `retention` keeps it within
its age, its bytes and the node's disk reserve; `metrics` counts what it wrote, dropped and
deleted. `read` reads segments back with pyarrow. docs/node.md, "The ledger", is the user's
page. The room sits below ``delivery`` (the courier adds to it) and above ``ops`` (the disk
reserve, the metrics registry). Its face holds the format and the reading; the writer, which
needs the replication layer's rows, is imported from `writer` by `tickwheel.node.serve` alone
(so the node's face stays light).
"""

from tickwheel.node.ledger.read import LEDGER_FOLDER, read_rows, read_table
from tickwheel.node.ledger.schema import Manifest, read_manifest, segments

__all__ = ["LEDGER_FOLDER", "Manifest", "read_manifest", "read_rows", "read_table", "segments"]
