"""The quarantine directory: the events the quality gate refused, one JSON-lines file per
micro-batch, kept within a bound (``job.quarantine_max_mb``)."""

from __future__ import annotations

import json
import logging
import os
import re

log = logging.getLogger(__name__)


def write_quarantine(directory: str, batch_id: int, rows: list[dict]) -> str:
    """One JSON-lines file per batch (rewritten whole when a batch is replayed)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"batch-{batch_id:012d}.jsonl")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            # raw: the first characters of the value (none past the batch's sample budget)
            f.write(json.dumps({"batch_id": batch_id, "reason": r["alert"], "observed_at": r["at"],
                                "raw": r["evidence"], "raw_bytes": r.get("count")}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


#: a quarantine file's name (write_quarantine): batch-<batch id, at least 12 digits>.jsonl
QUARANTINE_FILE = re.compile(r"batch-(\d+)\.jsonl")


class QuarantineFiles:
    """The quarantine directory, bounded: ``write`` writes a batch's refused events
    (``write_quarantine``), then deletes the oldest files until the quarantine files total at
    most ``max_bytes``.  Never the newest: the file just written is kept even when it alone is
    larger than the bound (``bytes`` says so, and a warning).

    Oldest: written earliest.  The files already there (a restarted job's) are listed once, at
    construction, oldest by modification time (then batch id: a new checkpoint starts its batch
    ids again at 0), and the bound is applied to them at once; from then on a running total is
    kept, no listing per batch.  A replayed batch rewrites its file: its new size replaces its
    old in the total, and it becomes the newest.  Only ``batch-<id>.jsonl`` files are counted
    and deleted (and, at construction, the ``.tmp`` files of writes a crash cut short); anything
    else in the directory is left alone.  A file deleted by someone else leaves the total when
    the bound comes to it."""

    def __init__(self, directory: str, max_bytes: int):
        if not max_bytes > 0:
            raise ValueError(f"the quarantine's bound must be > 0 bytes, got {max_bytes}")
        self.directory = directory
        self.max_bytes = max_bytes
        #: batch id -> bytes of its file, oldest first (a dict keeps its insertion order)
        self._files: dict[int, int] = {}
        #: bytes of the quarantine files kept now
        self.bytes = 0
        #: files the bound deleted since construction (at construction included)
        self.removed = 0
        self._scan()
        self._enforce()

    def path(self, batch_id: int) -> str:
        return os.path.join(self.directory, f"batch-{batch_id:012d}.jsonl")

    @property
    def files(self) -> list[int]:
        """The batch ids whose files are kept, oldest first."""
        return list(self._files)

    def _scan(self) -> None:
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return  # created by the first write
        found = []
        for e in entries:
            m = QUARANTINE_FILE.fullmatch(e.name)
            try:
                if m and e.is_file():
                    st = e.stat()
                    found.append((st.st_mtime_ns, int(m.group(1)), st.st_size))
                elif e.name.endswith(".tmp") and QUARANTINE_FILE.fullmatch(e.name[:-4]) and e.is_file():
                    os.remove(e.path)  # a write cut short: its batch is replayed and written again
                    log.info("quarantine: removed %s, left by a write that did not complete", e.path)
            except FileNotFoundError:
                continue
        for _, batch_id, size in sorted(found):
            self._files[batch_id] = size
            self.bytes += size
        if found:
            log.info("quarantine: %d files of %d bytes in %s", len(found), self.bytes, self.directory)

    def write(self, batch_id: int, rows: list[dict]) -> str:
        """Write the batch's file (again, for a replayed batch), then keep to the bound; returns
        the file's path."""
        path = write_quarantine(self.directory, batch_id, rows)
        size = os.path.getsize(path)
        self.bytes += size - self._files.pop(batch_id, 0)
        self._files[batch_id] = size  # the newest
        self._enforce()
        return path

    def _enforce(self) -> int:
        """Delete the oldest files (never the newest) until the total is within the bound;
        returns how many were deleted (also added to ``removed``)."""
        if self.bytes <= self.max_bytes or not self._files:
            return 0
        newest = next(reversed(self._files))
        excess = self.bytes - self.max_bytes
        gone: list[int] = []
        removed = 0
        for batch_id, size in self._files.items():
            if excess <= 0 or batch_id == newest:
                break
            path = self.path(batch_id)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass  # deleted by someone else: not kept either way
            except OSError as e:
                log.warning("quarantine: cannot delete %s (to keep %s within %d bytes): %s",
                            path, self.directory, self.max_bytes, e)
                continue  # counted still; tried again at the next batch
            else:
                removed += 1
            gone.append(batch_id)
            excess -= size
        for batch_id in gone:
            self.bytes -= self._files.pop(batch_id)
        self.removed += removed
        if removed:
            log.debug("quarantine: deleted the %d oldest files of %s; %d bytes kept", removed, self.directory, self.bytes)
        if self.bytes > self.max_bytes and len(self._files) == 1:
            log.warning("quarantine: the file of batch %d alone is %d bytes, more than the bound (%d bytes, "
                        "job.quarantine_max_mb): kept, as the newest", newest, self.bytes, self.max_bytes)
        return removed
