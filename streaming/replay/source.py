"""What a replay reads of the event archive (docs/archive.md): which hours each cluster has,
what of a range they cover, and the range's micro-batches in the order the job ran them, each
with its rows per bucket and the buckets its timeouts woke.

Order: a query's batches by id.  A new checkpoint is a new query whose ids start at 0 again,
so queries are taken in the order of their first batch's earliest event (or timeout moment).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import numpy as np

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from streaming.sinks.archive import (HOUR_MS, TICKS_DIR, filesystem, hour_label, parse_file_name, parse_hour,
                                     unquote_cluster)
from streaming.state.rows import ARCHIVE_SCHEMA, TICKS_SCHEMA


class ArchiveReadError(RuntimeError):
    """The archive cannot be replayed (the message says why)."""


@dataclass(frozen=True)
class ArchivedFile:
    path: str
    query_id: str
    batch_id: int
    hour: int                 # hours since the epoch
    cluster: Optional[str]    # None for a file of timeouts' moments
    ticks: bool = False


@dataclass
class Batch:
    """One micro-batch of one query: its files (events and timeouts' moments, every hour)."""
    query_id: str
    batch_id: int
    files: list[ArchivedFile] = field(default_factory=list)


@dataclass(frozen=True)
class Span:
    """A stretch of a range no archived event covers, for one cluster."""
    cluster: str
    start_ms: int
    end_ms: int
    why: str


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def hour_span(start_ms: int, end_ms: int) -> range:
    """The hours (since the epoch) that [start_ms, end_ms] touches."""
    return range(start_ms // HOUR_MS, end_ms // HOUR_MS + 1)


class ArchiveReader:
    """The archive at ``uri`` (a path or a URI pyarrow knows), read-only."""

    def __init__(self, uri: str):
        self.uri = uri
        self.fs, self.root = filesystem(uri)
        info = self.fs.get_file_info(self.root)
        if info.type != pafs.FileType.Directory:
            raise ArchiveReadError(f"--archive: {uri} is not a directory" if info.type != pafs.FileType.NotFound
                                   else f"--archive: {uri} does not exist")

    def _dirs(self, path: str) -> list[pafs.FileInfo]:
        return [i for i in self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
                if i.type == pafs.FileType.Directory]

    def hours(self) -> dict[str, list[int]]:
        """Every cluster's archived hours, sorted (hour directories holding at least one file name;
        a cluster's name unescaped)."""
        out: dict[str, list[int]] = {}
        for c in self._dirs(self.root):
            if not c.base_name.startswith("cluster="):
                continue
            name = unquote_cluster(c.base_name)
            hs = sorted(h for d in self._dirs(c.path) if d.base_name.startswith("hour=")
                        and (h := parse_hour(d.base_name[5:])) is not None and self._files(d.path))
            if hs:
                out["" if name is None else name] = hs
        return out

    def _files(self, path: str) -> list[pafs.FileInfo]:
        return [i for i in self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
                if i.type == pafs.FileType.File and parse_file_name(i.base_name) is not None]

    def files(self, hours: Optional[range] = None) -> list[ArchivedFile]:
        """The batch files (events of every cluster, and timeouts' moments) in ``hours`` (default:
        every hour the archive has)."""
        out = []
        parents: list[tuple[str, Optional[str], bool]] = [
            (c.path, unquote_cluster(c.base_name) or "", False) for c in self._dirs(self.root)
            if c.base_name.startswith("cluster=")]
        parents.append((f"{self.root}/{TICKS_DIR}", None, True))
        for path, cluster, ticks in parents:
            if hours is None:
                found = [(h, d.path) for d in self._dirs(path)
                         if d.base_name.startswith("hour=") and (h := parse_hour(d.base_name[5:])) is not None]
            else:
                found = [(h, f"{path}/hour={hour_label(h)}") for h in hours]
            for h, where in found:
                for f in self._files(where):
                    parsed = parse_file_name(f.base_name)
                    assert parsed is not None
                    out.append(ArchivedFile(f.path, parsed[1], parsed[0], h, cluster, ticks))
        return out

    def first_moment(self, f: ArchivedFile) -> Optional[int]:
        """The earliest event time (or timeout moment) of a file, from its Parquet statistics."""
        meta = pq.ParquetFile(f.path, filesystem=self.fs).metadata
        col = "at" if f.ticks else "observed_at"
        idx = meta.schema.to_arrow_schema().get_field_index(col)
        lows = [meta.row_group(i).column(idx).statistics for i in range(meta.num_row_groups)]
        vals = [s.min for s in lows if s is not None and s.has_min_max]
        return min(vals) if vals else None

    def read_events(self, files: list[ArchivedFile]) -> pa.Table:
        """The rows of a batch's event files (``ARCHIVE_SCHEMA``), in no particular order."""
        tables = []
        for f in files:
            t = pq.read_table(f.path, filesystem=self.fs, partitioning=None)
            missing = [n for n in ("bucket", "bucket_row") if n not in t.column_names]
            if missing:
                raise ArchiveReadError(f"{f.path}: no {' or '.join(missing)} column: written by a kafka-monitor "
                                       f"before the archive recorded what a replay needs (docs/archive.md)")
            tables.append(t.select(ARCHIVE_SCHEMA.names).cast(ARCHIVE_SCHEMA))
        return pa.concat_tables(tables) if tables else ARCHIVE_SCHEMA.empty_table()

    def read_ticks(self, files: list[ArchivedFile]) -> pa.Table:
        tables = [pq.read_table(f.path, filesystem=self.fs, partitioning=None).select(TICKS_SCHEMA.names)
                  .cast(TICKS_SCHEMA) for f in files]
        return pa.concat_tables(tables) if tables else TICKS_SCHEMA.empty_table()

    def batches(self, start_ms: int, end_ms: int) -> list[Batch]:
        """The batches that ran over [start_ms, end_ms], in the order the job ran them, each with
        all its files: per query, every batch from the first to the last with events or timeouts in
        the range's hours (one between them may hold only late events of an earlier hour), and
        each batch's files wherever their hours are.  Lists every file name of the archive once
        (at the default trigger ~720 a cluster and hour)."""
        inner = hour_span(start_ms, end_ms)
        everything = self.files()
        ids: dict[str, list[int]] = {}
        for f in everything:
            if f.hour in inner:
                ids.setdefault(f.query_id, []).append(f.batch_id)
        bounds = {q: (min(v), max(v)) for q, v in ids.items()}
        by: dict[tuple[str, int], Batch] = {}
        for f in everything:
            lo_hi = bounds.get(f.query_id)
            if lo_hi is not None and lo_hi[0] <= f.batch_id <= lo_hi[1]:
                by.setdefault((f.query_id, f.batch_id), Batch(f.query_id, f.batch_id)).files.append(f)
        return order_batches(list(by.values()), self.first_moment)


def order_batches(batches: list[Batch], first_moment: Callable[[ArchivedFile], Optional[int]]) -> list[Batch]:
    """Batches in the order the job ran them: by query (its first batch's earliest moment), then
    batch id.  ``first_moment(file)``: a file's earliest event time or timeout moment."""
    firsts: dict[str, Batch] = {}
    for b in batches:
        if b.query_id not in firsts or b.batch_id < firsts[b.query_id].batch_id:
            firsts[b.query_id] = b
    starts = {}
    for qid, b in firsts.items():
        moments = [m for f in b.files if (m := first_moment(f)) is not None]
        starts[qid] = min(moments) if moments else 0
    return sorted(batches, key=lambda b: (starts[b.query_id], b.query_id, b.batch_id))


def coverage(hours: dict[str, list[int]], start_ms: int, end_ms: int,
             clusters: Optional[list[str]] = None, first_ms: Optional[dict[str, int]] = None) -> list[Span]:
    """The stretches of [start_ms, end_ms] that no archived hour covers, per cluster (``clusters``,
    default every archived one): before the cluster's first archived event (``first_ms``, else
    its first hour's start), hours missing in between, after its last archived hour."""
    out = []
    for c in clusters if clusters is not None else sorted(hours):
        hs = hours.get(c, [])
        if not hs:
            out.append(Span(c, start_ms, end_ms, "nothing archived for this cluster"))
            continue
        first = (first_ms or {}).get(c, hs[0] * HOUR_MS)
        if start_ms < first:
            out.append(Span(c, start_ms, min(first, end_ms), f"before the cluster's first archived event, at "
                                                               f"{_utc(first)} (the retention deleted what was "
                                                               f"before, or the archive started then)"))
        have = set(hs)
        gap: Optional[int] = None
        for h in hour_span(max(start_ms, first), end_ms):
            if h > hs[-1]:
                break
            if h not in have and gap is None:
                gap = h
            elif h in have and gap is not None:
                out.append(Span(c, max(gap * HOUR_MS, start_ms), h * HOUR_MS, "hours missing from the archive"))
                gap = None
        last_end = (hs[-1] + 1) * HOUR_MS
        if end_ms > last_end:
            out.append(Span(c, max(last_end, start_ms), end_ms, "after the cluster's last archived hour"))
    return out


def first_event_ms(reader: ArchiveReader, hours: dict[str, list[int]]) -> dict[str, int]:
    """Each cluster's earliest archived event time (its first hour's files' statistics)."""
    out = {}
    for c, hs in hours.items():
        files = [f for f in reader.files(range(hs[0], hs[0] + 1)) if f.cluster == c and not f.ticks]
        moments = [m for f in files if (m := reader.first_moment(f)) is not None]
        if moments:
            out[c] = min(moments)
    return out


def bucket_frames(t: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """A batch's rows per bucket, each in the order the bucket received them."""
    if t.num_rows == 0:
        return
    t = t.sort_by([("bucket", "ascending"), ("bucket_row", "ascending")])
    keys = pc.fill_null(t.column("bucket"), 0).to_numpy()
    cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    for lo, hi in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(keys)]]).tolist()):
        yield int(keys[lo]), t.slice(lo, hi - lo)


