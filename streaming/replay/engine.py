"""The replay: the job's state function (``streaming.state.function.make_state_function``, built
from a job config by ``streaming.job.state_config``) run again over archived batches, in the
order the job ran them, each bucket evaluated at the moments the job evaluated it:

- with its rows of a batch (in the order it received them: its ``now`` is their latest event
  time, as in the job);
- woken by its timeout, at the processing time the archive recorded (``_ticks/``), if the
  replay's state still has the bucket with a timeout set (as Spark would; ``ticks_skipped``
  counts the others); or, for batches without recorded moments (the events topic's,
  ``streaming.replay.topic``), where Spark would fire the timeout.

A new query (a new checkpoint) starts with empty state, as the job did.  What it emits is
collected as the alerts topic's records (``streaming.sinks.alerts.record_value``, the batch's
transitions in the sink's order), so they compare one to one with what the job published.

Memory: one batch's rows at a time, and every bucket's stored state (what the job's state
store holds).  Sequential, in this process: a replay costs about the state function's CPU
time of the job over the same events.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

import pandas as pd
import pyarrow as pa

from streaming.ingest.schema import FLAT_COLUMNS
from streaming.replay.group_state import ReplayGroupState
from streaming.replay.source import ArchiveReader, Batch, bucket_frames
from streaming.sinks.alerts import record_value, transition_sort_key
from streaming.sinks.batch import sink_rows
from streaming.state.config import StateConfig
from streaming.state.function import make_state_function
from streaming.state.rows import ARCHIVE_DROPPED

#: the frame the job's state function gets: the parsed row's columns, then the grouping key
FRAME_COLUMNS = [n for n, _ in FLAT_COLUMNS] + ["bucket"]
_DROPPED_TYPES = {n: t for n, t in FLAT_COLUMNS if n in ARCHIVE_DROPPED}
_ARROW = {"string": pa.string(), "bigint": pa.int64()}


@dataclass
class Progress:
    batches_done: int
    batches_total: int
    rows: int
    elapsed_s: float


@dataclass
class ReplayResult:
    #: the alerts topic's records the replay would have published (each with its ``query_id``)
    transitions: list[dict] = field(default_factory=list)
    batches: int = 0
    rows: int = 0
    ticks: int = 0
    #: recorded timeouts of buckets that the replay's state did not hold (Spark would not have called)
    ticks_skipped: int = 0
    #: per query, in replay order: its id, first and last batch id, batches
    queries: list[dict] = field(default_factory=list)
    #: (query id, batch id, bucket) whose rows are not all there (a gap in ``bucket_row``: a file
    #: of the batch deleted, by the retention or by hand), the first few; ``incomplete`` counts all
    incomplete_examples: list[tuple[str, int, int]] = field(default_factory=list)
    incomplete: int = 0
    seconds: float = 0.0


def state_frame(rows: pa.Table) -> pd.DataFrame:
    """A bucket's archived rows as the frame Spark hands the state function (Arrow to pandas:
    nullable longs as float64 with NaN, arrays as numpy arrays), with the columns the archive
    leaves out (a refused row's) null."""
    n = rows.num_rows
    cols = {}
    for name in FRAME_COLUMNS:
        if name in _DROPPED_TYPES:
            cols[name] = pa.nulls(n, _ARROW.get(_DROPPED_TYPES[name], pa.string()))
        else:
            cols[name] = rows.column(name)
    return pa.table(cols).to_pandas()


def complete(rows: pa.Table) -> bool:
    """Whether a bucket's rows of a batch are all there: their ``bucket_row`` is 0..n-1 (sorted).
    A missing file shows as a gap, unless it held only the last rows the bucket received."""
    got = rows.column("bucket_row").to_numpy(zero_copy_only=False)
    return bool(len(got) == 0 or (got[0] == 0 and got[-1] == len(got) - 1))


def _alert_rows(frames: Iterable[pd.DataFrame]) -> list[dict]:
    """The ``alert`` rows of the function's output as the job's sink reads them (to Arrow, then
    ``sink_rows``)."""
    out: list[dict] = []
    for f in frames:
        a = f[f["kind"] == "alert"]
        if len(a):
            out += sink_rows(pa.Table.from_pandas(a, preserve_index=False))
    return out


@dataclass
class ReplayBatch:
    """One micro-batch to replay: its rows (``ARCHIVE_SCHEMA``: with ``bucket`` and
    ``bucket_row``) and the buckets its timeouts woke (``TICKS_SCHEMA``), or None when the engine
    is to wake them itself, as Spark would at ``processing_time_ms`` (a replay from the events
    topic: no recorded moments)."""
    query_id: str
    batch_id: int
    events: pa.Table
    ticks: Optional[pa.Table]
    processing_time_ms: Optional[int] = None


def archived(reader: ArchiveReader, batches: list[Batch]) -> Iterator[ReplayBatch]:
    """The archive's batches, read one at a time."""
    for b in batches:
        yield ReplayBatch(b.query_id, b.batch_id, reader.read_events([f for f in b.files if not f.ticks]),
                          reader.read_ticks([f for f in b.files if f.ticks]))


def replay(reader: ArchiveReader, batches: list[Batch], cfg: StateConfig,
           progress: Optional[Callable[[Progress], None]] = None) -> ReplayResult:
    """Run ``cfg``'s state function over ``batches`` (``ArchiveReader.batches``: in the job's
    order); ``progress`` is called after each batch."""
    return run(archived(reader, batches), len(batches), cfg, progress)


def run(batches: Iterable[ReplayBatch], total: int, cfg: StateConfig,
        progress: Optional[Callable[[Progress], None]] = None) -> ReplayResult:
    """Run ``cfg``'s state function over ``batches`` in their order (``total`` of them, for the
    progress)."""
    fn = make_state_function(cfg)
    res = ReplayResult()
    t0 = time.monotonic()
    states: dict[int, ReplayGroupState] = {}
    query: Optional[dict] = None

    def call(bucket: int, frames: list[pd.DataFrame], gs: ReplayGroupState) -> list[dict]:
        out = list(fn((bucket,), iter(frames), gs))
        gs.end()
        return _alert_rows(out)

    for n, b in enumerate(batches):
        if query is None or b.query_id != query["query_id"]:
            states = {}  # a new checkpoint: the job started from empty state
            query = {"query_id": b.query_id, "first_batch": b.batch_id, "last_batch": b.batch_id, "batches": 0}
            res.queries.append(query)
        query["last_batch"], query["batches"] = b.batch_id, query["batches"] + 1
        alerts: list[dict] = []
        called = set()
        for bucket, rows in bucket_frames(b.events):
            if not complete(rows):
                res.incomplete += 1
                if len(res.incomplete_examples) < 10:
                    res.incomplete_examples.append((b.query_id, b.batch_id, bucket))
            gs = states.setdefault(bucket, ReplayGroupState())
            gs.begin(processing_time_ms=b.processing_time_ms)
            alerts += call(bucket, [state_frame(rows)], gs)
            res.rows += rows.num_rows
            called.add(bucket)
        if b.ticks is not None:
            woken = list(zip(b.ticks.sort_by("bucket").column("bucket").to_pylist(),
                             b.ticks.sort_by("bucket").column("at").to_pylist()))
        else:
            assert b.processing_time_ms is not None
            woken = [(k, b.processing_time_ms) for k in sorted(states)
                     if k not in called and states[k].due(b.processing_time_ms)]
        for bucket, at in woken:
            res.ticks += 1
            got = states.get(bucket)
            if got is None or not got.armed:
                res.ticks_skipped += 1
                continue
            got.begin(timed_out=True, processing_time_ms=at)
            alerts += call(bucket, [], got)
        states = {k: v for k, v in states.items() if v.value is not None}
        for i, r in enumerate(sorted(alerts, key=transition_sort_key)):
            rec: dict[str, Any] = json.loads(record_value(r, b.batch_id, i, b.query_id))
            res.transitions.append(rec)
        res.batches += 1
        if progress is not None:
            progress(Progress(n + 1, total, res.rows, time.monotonic() - t0))
    res.seconds = time.monotonic() - t0
    return res
