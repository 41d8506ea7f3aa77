"""The snapshot file pysyncobj renames into place and streams to followers: a manifest (file
lengths, never message bodies) and pysyncobj's member list, pickled, then a check and the state
format version; and, with ``fsync``, a received snapshot synced before it replaces the node's
own (`DurableSerializer`)."""

from __future__ import annotations

import io
import logging
import os
import pickle
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Final, cast

from pysyncobj.serializer import SERIALIZER_STATE, Serializer

from tickwheel.replication.raft.durability import SyncLedger, fsync_files, fsync_written
from tickwheel.replication.raft.link_protocol import safe_load
from tickwheel.replication.raft.port import Taking

log = logging.getLogger("tickwheel.replication")

SNAPSHOT_CLASSES = frozenset({("pysyncobj.node", "TCPNode")})
"""What a snapshot file names besides plain data: pysyncobj's member list."""


SNAPSHOT_FILE = "snapshot"
"""pysyncobj's full dump file, beside the journal in the Raft folder."""


class ReceivingSerializer(Serializer):
    """pysyncobj's snapshot handler, except for what it does with a snapshot received from
    the leader: staged, and put in place only if it is newer than what this node applied
    (``applied()``); and, once in place, it voids the snapshot this node took and has not
    yet cut its journal to.

    pysyncobj learns that its own snapshot is written at the next tick, and then cuts the
    journal up to that snapshot's index. A snapshot received in between has already replaced
    the journal with its own two entries, older ones: the cut emptied the journal, and the
    next look at the log's last index raised IndexError and killed the node (found by the
    chaos runner: a wiped follower took a snapshot just as its leader sent it one).

    pysyncobj installs whatever snapshot arrives: a leader whose idea of this follower's
    next entry lagged (a late answer, a refusal's reset) sent one older than what the
    follower had applied, and the follower went back to it, dropping from its journal
    entries it had acknowledged. Such a snapshot is refused (``event=snapshot_refused``)
    and `refused` says so, for `RaftNode` to tell the leader where this node's log ends.
    One that does not read is put in place: installing it stops the node, naming it.

    With ``whole``, a snapshot received whole (and newer) is offered to it first: True when
    it took the staged file (`tickwheel.replication.raft.catch_up`), which it puts in place
    later (`put_in_place`), once the files the snapshot names are fetched.

    With ``taking``, this node's own snapshots are taken by it over several ticks
    (`tickwheel.replication.taking`) rather than in the one pysyncobj asks in: pysyncobj
    asks whether one is under way at each tick (``checkSerializing``), and cuts its journal
    when told it succeeded, which `Taking.advance` says only once the snapshot is durable and
    in place. pysyncobj's own path wrote the file in that tick and renamed it into place. A
    snapshot received from the leader voids the one under way (`put_in_place`)."""

    sync = False
    """Whether a received snapshot reaches the disk before it replaces this node's own
    (`DurableSerializer`)."""

    def __init__(self, *args: Any, applied: Callable[[], int] = lambda: 0,
                 ledger: SyncLedger | None = None,
                 whole: Callable[[Path], bool] | None = None,
                 taking: Taking | None = None) -> None:
        super().__init__(*args)
        self._path = Path(self._Serializer__fileName)
        self._applied = applied
        self._ledger = ledger
        self._whole = whole
        self._taking = taking
        self._taking_index: int | None = None
        """The index of the snapshot `taking` is taking, while it is under way."""
        self._incoming: BinaryIO | None = None
        self.refused = False
        """The last snapshot received was refused (`RaftNode` reads and clears it)."""

    def serialize(self, data: tuple[Any, ...], index: int) -> None:
        """pysyncobj asks for a snapshot at entry ``index`` (``data``: its own part, after a
        None where its default serializer's state would be): begun by `taking`, if given."""
        if self._taking is None:
            super().serialize(data, index)
        elif self._taking_index is None:
            self._taking.begin(str(self._path), tuple(data[1:]))
            self._taking_index = index

    def checkSerializing(self) -> tuple[int, int | None]:
        """Where this node's snapshot is (pysyncobj asks at every tick): with `taking`, it is
        carried a step further, and is a success only once in place."""
        if self._taking is None:
            return cast(tuple[int, int | None], super().checkSerializing())
        index = self._taking_index
        if index is None:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        done = self._taking.advance()
        if done is None:
            return SERIALIZER_STATE.SERIALIZING, index
        self._taking_index = None
        return (SERIALIZER_STATE.SUCCESS if done else SERIALIZER_STATE.FAILED), index

    def setTransmissionData(self, data: tuple[bytes, bool, bool] | None) -> bool:
        """One chunk of a snapshot from the leader; True when it was the last one and the
        snapshot is in place, which voids this node's own snapshot still to be cut to."""
        return self._receive(data)

    def _receive(self, data: tuple[bytes, bool, bool] | None) -> bool:
        """Stage the chunk; True when it was the last one and the snapshot is in place (with
        ``sync``: fsynced, renamed, its folder fsynced)."""
        if data is None:
            return False
        chunk, first, last = data
        staged = self._path.with_name(self._path.name + ".1.tmp")
        try:
            if first:
                if self._incoming is not None:
                    self._incoming.close()
                self._incoming = open(staged, "wb")  # noqa: SIM115 (open across chunks)
            elif self._incoming is None:
                return False  # a transfer whose start this node did not see
            self._incoming.write(chunk)
            if not last:
                return False
            incoming, self._incoming = self._incoming, None
            with incoming:
                if self.sync:
                    fsync_written(incoming, self._ledger)
            if self._older(staged):
                staged.unlink()
                return False
            if self._whole is not None and self._whole(staged):
                return False
            self.put_in_place(staged)
        except OSError as error:  # as pysyncobj: the leader sends the snapshot again
            log.error("event=snapshot_receive_failed path=%s error=%r", staged, error)
            self._incoming = None
            return False
        return True

    def put_in_place(self, staged: Path) -> None:
        """Make the snapshot received (whole, staged) this node's snapshot file (with
        ``sync``: its folder fsynced), voiding this node's own that it has not yet cut its
        journal to (pysyncobj's ``checkSerializing`` then reports no snapshot under way)."""
        os.replace(staged, self._path)
        if self.sync:
            fsync_files([self._path.parent])
        self._Serializer__pid = 0
        if self._taking is not None and self._taking_index is not None:
            self._taking_index = None
            self._taking.void()

    def _older(self, staged: Path) -> bool:
        """Whether the staged snapshot ends at or before what this node applied (then it is
        refused, and said so)."""
        try:
            last_index = read_snapshot(str(staged))[1][0][1]
        except (SnapshotDamaged, IndexError, TypeError):
            return False  # installing it stops the node, naming the file
        applied = self._applied()
        self.refused = type(last_index) is int and last_index <= applied
        if self.refused:
            log.warning("event=snapshot_refused snapshot_index=%d last_applied=%d: the "
                        "leader sent a snapshot no newer than what this node applied; "
                        "installing it would drop entries this node holds", last_index, applied)
        return self.refused


class DurableSerializer(ReceivingSerializer):
    """`ReceivingSerializer`, and a snapshot received from the leader reaches the disk before
    it replaces this node's own. pysyncobj writes the chunks to a temporary file and renames
    it over the snapshot unsynced: a power cut right after left an empty file where a good
    snapshot had been, and the node refused to start (found by the chaos runner's power
    cut)."""

    sync = True


SNAPSHOT_CHECK: Final = struct.Struct("<4sHI")
"""What follows the pickle in a snapshot file: ``SNAPSHOT_CHECK_MAGIC``, the state format
version (`STATE_FORMAT_VERSION`) and the CRC32 of everything before the CRC. An unpickler
stops at the pickle's end, so builds that know no check read the file as before
(deploy/README.md, "Upgrading"); their snapshots have none, and are read unchecked, as
version 1."""
SNAPSHOT_CHECK_MAGIC: Final = b"TWCK"
STATE_FORMAT_VERSION: Final = 1
"""The layout of the snapshot's manifest and of the replicated state files it names that carry
no version of their own (dedupe buckets). The wheel's files carry theirs (`tickwheel.wheel.
format`). 1: the layout every build since issue 16 writes."""


class SnapshotDamaged(ValueError):
    """A snapshot file that fails its check, does not unpickle, is not a snapshot, or was
    written in a state format this build does not know."""


def write_snapshot(path: str, manifest: object, raft_tail: tuple[Any, ...], fsync: bool,
                   ledger: SyncLedger | None = None) -> None:
    """Write the snapshot file pysyncobj renames into place (and streams to followers): the
    pickle, then its check. With ``fsync``, it is on disk before pysyncobj renames it."""
    data = pickle.dumps((manifest, raft_tail), protocol=pickle.HIGHEST_PROTOCOL)
    with open(path, "wb") as file:
        file.write(data)
        file.write(_checked(data, STATE_FORMAT_VERSION))
        if fsync:
            fsync_written(file, ledger)


def read_snapshot(path: str) -> tuple[Any, tuple[Any, ...]]:
    """``(manifest, raft_tail)``: plain data and pysyncobj's member list; any other class
    named in the file is refused (the file comes from the leader). Raises `SnapshotDamaged`
    when the bytes fail their check (a flipped bit in a length would otherwise install wrong
    lengths) or do not make a snapshot."""
    with open(path, "rb") as file:
        data = file.read()
    stream = io.BytesIO(data)
    try:
        content = safe_load(stream, SNAPSHOT_CLASSES)
    except Exception as error:  # any unpickling failure: the bytes are not a snapshot
        raise SnapshotDamaged(f"{path} does not unpickle: {error!r}") from None
    end = stream.tell()
    trailer = data[end:]
    if trailer:
        if len(trailer) != SNAPSHOT_CHECK.size:
            raise SnapshotDamaged(f"{path} has {len(trailer)} bytes after its pickle, "
                                  f"expected a check of {SNAPSHOT_CHECK.size}")
        magic, version, _ = SNAPSHOT_CHECK.unpack(trailer)
        if magic != SNAPSHOT_CHECK_MAGIC or trailer != _checked(data[:end], version):
            raise SnapshotDamaged(f"{path} fails its check (CRC32 of its {end} bytes)")
        if version > STATE_FORMAT_VERSION:
            raise SnapshotDamaged(f"{path} was written by a newer release (state format "
                                  f"{version}; this one reads up to {STATE_FORMAT_VERSION}): "
                                  "downgrading across a format change is not supported")
    if not (isinstance(content, tuple) and len(content) == 2
            and isinstance(content[1], tuple)):
        raise SnapshotDamaged(f"{path} is not a snapshot: {type(content).__name__}")
    return content[0], content[1]


def _checked(data: bytes, version: int) -> bytes:
    """The check that follows ``data`` in a snapshot file of state format ``version``."""
    head = SNAPSHOT_CHECK.pack(SNAPSHOT_CHECK_MAGIC, version, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head, zlib.crc32(data)))
