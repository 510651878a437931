"""The event archive (``job.archive_dir``): every event the state function received, as parsed,
in Parquet files partitioned by cluster and hour of event time, one file per partition per
micro-batch, written by the driver in the job's ``foreachBatch`` and kept for
``job.archive_retention_h`` hours.  Design, layout and guarantees: docs/archive.md.

    <archive_dir>/cluster=<cluster, %-escaped>/hour=<YYYY-MM-DDTHH, UTC>/batch-<id, 12 digits>-<query id>.parquet
    <archive_dir>/_ticks/hour=<YYYY-MM-DDTHH, UTC>/batch-<id, 12 digits>-<query id>.parquet
                                                the buckets the batch woke by their timeout, and when
    <archive_dir>/_batches/<query id>.json      the last batch's files, written before them

Exactly once with the checkpoint: a batch's files have names of its own (batch id and query id,
which a restart from the checkpoint keeps), so a batch Spark runs again after a crash rewrites
its files rather than adding to them; and the files the earlier attempt may have written that the
new one does not (its rows need not fall into the same partitions: a record deleted by
retention, a gate that changed) are deleted, from the list written before them.
"""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
#: the value of a partition column that is null, as Hive and Spark write it
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: Parquet files as written: zstd (its rows repeat labels; ~4x smaller than snappy's lz4-like
#: blocks on these rows)
COMPRESSION = "zstd"
#: a path with one of these schemes is an object store: a file appears whole when written, and a
#: rename is a copy, so files are written in place; elsewhere through a temporary name and a rename
OBJECT_STORES = ("s3", "gcs")
#: the timeouts' moments (``rows.TICKS_SCHEMA`` and ``batch_id``), by hour of the moment: a leading
#: ``_`` keeps dataset readers from taking them for events
TICKS_DIR = "_ticks"
_FILE = re.compile(r"^batch-(\d{12})-(.+)\.parquet$")


def _temporary(path: str) -> str:
    """Where ``path`` is written before its rename: a hidden name (``.`` first), which pyarrow's
    and Spark's dataset readers skip."""
    head, _, name = path.rpartition("/")
    return f"{head}/.{name}.tmp"


def _write_parquet(rows: pa.Table, out: Any) -> None:
    pq.write_table(rows, out, compression=COMPRESSION)


def hour_label(hour: int) -> str:
    """Hours since the epoch -> ``YYYY-MM-DDTHH`` (UTC): the ``hour=`` partition's value,
    which sorts as it reads."""
    return time.strftime("%Y-%m-%dT%H", time.gmtime(hour * 3600))


def parse_hour(label: str) -> Optional[int]:
    """``YYYY-MM-DDTHH`` -> hours since the epoch; None when it is not one."""
    try:
        t = time.strptime(label, "%Y-%m-%dT%H")
    except ValueError:
        return None
    return calendar.timegm(t) // 3600


def partition_dir(cluster: Optional[str], hour: int) -> str:
    """The partition of a cluster's hour, relative to the archive's root: Hive-style, the
    cluster %-escaped (pyarrow's and Spark's readers unescape it) so that any name is one path
    segment."""
    c = NULL_PARTITION if cluster is None else quote(cluster, safe="")
    return f"cluster={c}/hour={hour_label(hour)}"


def file_name(batch_id: int, query_id: str) -> str:
    """A batch's file in a partition: the batch id and the query id (Spark keeps it in the
    checkpoint: a restarted job writes the same names; a new checkpoint, whose batch ids start
    at 0 again, other ones)."""
    return f"batch-{batch_id:012d}-{query_id}.parquet"


def parse_file_name(name: str) -> Optional[tuple[int, str]]:
    """``file_name``'s (batch id, query id), or None for a name that is not a batch's file."""
    m = _FILE.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def split_ticks(ticks: pa.Table) -> list[tuple[str, pa.Table]]:
    """A batch's timeout moments (``TICKS_SCHEMA`` and ``batch_id``) split by hour of the moment,
    as (``_ticks/hour=...``, its rows), in hour order."""
    if ticks.num_rows == 0:
        return []
    hours = np.floor_divide(pc.fill_null(ticks.column("at"), 0).to_numpy(), HOUR_MS)
    return [(f"{TICKS_DIR}/hour={hour_label(int(h))}", ticks.filter(pa.array(hours == h)))
            for h in np.unique(hours).tolist()]


def split_partitions(t: pa.Table) -> list[tuple[str, pa.Table]]:
    """``t`` (archived rows) split by cluster and hour of ``observed_at``, as (partition dir,
    its rows in their order), in partition order."""
    if t.num_rows == 0:
        return []
    at = pc.fill_null(t.column("observed_at"), 0).to_numpy()
    hours = np.floor_divide(at, HOUR_MS)
    keyed = pa.table({"cluster": t.column("cluster"), "hour": pa.array(hours, pa.int64()),
                      "i": pa.array(np.arange(t.num_rows, dtype=np.int64))})
    out = []
    groups = keyed.group_by(["cluster", "hour"], use_threads=False).aggregate([("i", "list")])
    for cluster, hour, idx in zip(groups.column("cluster").to_pylist(), groups.column("hour").to_pylist(),
                                  groups.column("i_list").to_pylist()):
        out.append((partition_dir(cluster, hour), t.take(pa.array(sorted(idx), pa.int64()))))
    return sorted(out, key=lambda p: p[0])


def expired(hour_dirs: list[tuple[str, str]], now_s: float, retention_h: int) -> list[str]:
    """Of ``(path, hour label)``, the paths of the hours that ended ``retention_h`` hours or more
    before ``now_s``, oldest first; none when ``retention_h`` is 0 (kept for ever).  A label
    that is not an hour is not ours: kept."""
    if retention_h <= 0:
        return []
    old = [(h, p) for p, label in hour_dirs
           if (h := parse_hour(label)) is not None and (h + 1 + retention_h) * 3600 <= now_s]
    return [p for _, p in sorted(old)]


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem of ``uri`` and the root path in it: a local path, ``file://``,
    ``hdfs://`` (libhdfs: Hadoop's own client), ``s3://`` (``s3a://`` taken as ``s3://``),
    ``gs://``, ``abfs://``."""
    if uri.startswith(("s3a://", "s3n://")):
        uri = "s3://" + uri.split("://", 1)[1]
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


@dataclass
class BatchWritten:
    """What ``ArchiveFiles.write`` did for a batch."""
    rows: int = 0
    files: int = 0
    bytes: int = 0
    #: files of an earlier attempt at the batch that this one did not rewrite, deleted
    stale_removed: int = 0
    seconds: float = 0.0


class ArchiveFiles:
    """The archive directory: ``write`` writes a batch's rows, one Parquet file per cluster and
    hour; ``expire`` deletes the hours past the retention, and ``maybe_expire`` does it in a
    thread of its own at most every ``expire_every_s`` (from the sink, after a batch).

    ``query_id``: the streaming query's id, part of every file's name; until it is set (the job
    sets it once ``start`` returns the query) ``write`` waits for it."""

    def __init__(self, uri: str, retention_h: int = 168, query_id: Optional[str] = None,
                 expire_every_s: float = 600.0, clock: Callable[[], float] = time.time):
        if retention_h < 0:
            raise ValueError(f"the archive's retention must be >= 0 hours (0: kept for ever), got {retention_h}")
        self.uri = uri
        self.fs, self.root = filesystem(uri)
        self.retention_h = retention_h
        self.expire_every_s = expire_every_s
        self.clock = clock
        self._object_store = self.fs.type_name in OBJECT_STORES
        self._query_id = query_id
        self._ready = threading.Event()
        if query_id:
            self._ready.set()
        #: the first batch this process writes may be one an earlier process wrote (and did not
        #: commit): its list of files is read then, and only then
        self._first = True
        #: one writer or one deletion at a time (an hour past the retention can still get a late row)
        self._lock = threading.Lock()
        self._expiring: Optional[threading.Thread] = None
        self._last_expire = float("-inf")
        #: hour directories the retention deleted since construction
        self.removed = 0
        #: totals since construction
        self.rows = self.files = self.bytes = 0
        self.fs.create_dir(self.root, recursive=True)

    @property
    def query_id(self) -> Optional[str]:
        return self._query_id

    @query_id.setter
    def query_id(self, value: str) -> None:
        self._query_id = value
        self._ready.set()

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def _manifest(self, query_id: str) -> str:
        return self._path(f"_batches/{query_id}.json")

    def _read_manifest(self, query_id: str) -> Optional[dict]:
        try:
            with self.fs.open_input_stream(self._manifest(query_id)) as f:
                return dict(json.loads(f.read().decode("utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:  # pyarrow raises OSError for a missing object on some stores
            if self.fs.get_file_info(self._manifest(query_id)).type == pafs.FileType.NotFound:
                return None
            raise RuntimeError(f"archive: cannot read {self._manifest(query_id)}: {e}") from e

    def _put(self, path: str, write: Callable[[Any], None]) -> int:
        """Write ``path`` whole (through a temporary name and a rename, except on an object
        store); returns its size."""
        target = path if self._object_store else _temporary(path)
        with self.fs.open_output_stream(target) as out:
            write(out)
        if target != path:
            self.fs.move(target, path)
        return int(self.fs.get_file_info(path).size or 0)

    def write(self, batch_id: int, t: pa.Table, ticks: Optional[pa.Table] = None,
              timeout_s: float = 300.0) -> BatchWritten:
        """Write batch ``batch_id``'s rows (``t``, ``ARCHIVE_SCHEMA``) and the moments its buckets
        were woken by their timeout (``ticks``, ``TICKS_SCHEMA``; a ``batch_id`` column is added to
        both), replacing what an earlier attempt at the batch wrote.  Raises when a file cannot
        be written: the batch fails, and is run again from the checkpoint."""
        t0 = time.monotonic()
        if not self._ready.wait(timeout_s):
            raise RuntimeError("archive: the streaming query's id never came (ArchiveFiles.query_id)")
        qid = self._query_id
        assert qid
        done = BatchWritten(rows=t.num_rows)
        parts = split_partitions(t.append_column("batch_id", pa.array(np.full(t.num_rows, batch_id, np.int64))))
        if ticks is not None and ticks.num_rows:
            ids = pa.array(np.full(ticks.num_rows, batch_id, np.int64))
            parts += split_ticks(ticks.append_column("batch_id", ids))
        name = file_name(batch_id, qid)
        rels = [f"{d}/{name}" for d, _ in parts]
        with self._lock:
            earlier = None
            if self._first:
                m = self._read_manifest(qid)
                if m is not None and m.get("batch_id") == batch_id:
                    earlier = m
            self._first = False
            stale = sorted(set(earlier.get("files") or []) - set(rels)) if earlier is not None else []
            if parts or earlier is not None:
                # every file of the batch there may be: this attempt's, and the earlier one's until
                # they are deleted (a crash before that leaves them listed for the next attempt)
                body = json.dumps({"batch_id": batch_id, "query_id": qid, "rows": t.num_rows,
                                   "files": sorted(rels + stale)}).encode()
                self.fs.create_dir(self._path("_batches"), recursive=True)
                self._put(self._manifest(qid), lambda out: out.write(body))
            if earlier is not None:
                for rel in stale:
                    for p in (self._path(rel), _temporary(self._path(rel))):
                        try:
                            self.fs.delete_file(p)
                            done.stale_removed += p == self._path(rel)
                        except FileNotFoundError:
                            pass
                log.info("archive: batch %d written again (a restart); %d files of its earlier attempt not "
                         "rewritten, deleted", batch_id, done.stale_removed)
            for (d, rows), rel in zip(parts, rels):
                self.fs.create_dir(self._path(d), recursive=True)
                done.bytes += self._put(self._path(rel), partial(_write_parquet, rows))
                done.files += 1
        done.seconds = time.monotonic() - t0
        self.rows += done.rows
        self.files += done.files
        self.bytes += done.bytes
        return done

    def hour_dirs(self) -> list[tuple[str, str]]:
        """Every ``cluster=*/hour=*`` and ``_ticks/hour=*`` directory: (its path, its hour label)."""
        out = []
        try:
            clusters = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except FileNotFoundError:
            return []
        for c in clusters:
            if c.type != pafs.FileType.Directory or not (c.base_name.startswith("cluster=")
                                                         or c.base_name == TICKS_DIR):
                continue
            for h in self.fs.get_file_info(pafs.FileSelector(c.path, allow_not_found=True)):
                if h.type == pafs.FileType.Directory and h.base_name.startswith("hour="):
                    out.append((h.path, h.base_name[len("hour="):]))
        return out

    def expire(self) -> int:
        """Delete the hour directories past the retention; returns how many (also added to
        ``removed``).  A directory that cannot be deleted is logged and tried again next time."""
        gone = 0
        for path in expired(self.hour_dirs(), self.clock(), self.retention_h):
            with self._lock:
                try:
                    self.fs.delete_dir(path)
                    gone += 1
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log.warning("archive: cannot delete %s (past job.archive_retention_h = %d): %s",
                                path, self.retention_h, e)
        self.removed += gone
        if gone:
            log.info("archive: deleted %d hour directories older than %d hours", gone, self.retention_h)
        return gone

    def maybe_expire(self) -> bool:
        """Start ``expire`` in a thread of its own if it is due and none runs; True when started."""
        now = time.monotonic()
        if self.retention_h <= 0 or now - self._last_expire < self.expire_every_s:
            return False
        if self._expiring is not None and self._expiring.is_alive():
            return False
        self._last_expire = now
        self._expiring = threading.Thread(target=self._expire_logged, name="archive-retention", daemon=True)
        self._expiring.start()
        return True

    def _expire_logged(self) -> None:
        try:
            self.expire()
        except Exception:  # a listing that failed: tried again at the next pass
            log.exception("archive: the retention pass failed")

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait for a running retention pass (tests; a stopping job)."""
        t = self._expiring
        if t is not None:
            t.join(timeout_s)


def unquote_cluster(segment: str) -> Optional[str]:
    """``cluster=<value>`` -> the cluster (None for the null partition)."""
    v = segment.split("=", 1)[1]
    return None if v == NULL_PARTITION else unquote(v)


def read_archive(uri: str) -> pa.Table:
    """Every archived row under ``uri`` (tests, and a first look; ``hour`` comes back as a
    string column)."""
    import pyarrow.dataset as ds

    fs, root = filesystem(uri)
    part = ds.partitioning(pa.schema([("cluster", pa.string()), ("hour", pa.string())]), flavor="hive")
    return ds.dataset(root, filesystem=fs, format="parquet", partitioning=part).to_table()

