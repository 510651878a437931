"""The job's ``foreachBatch`` target: a micro-batch's state output to the exporter, the
quarantine directory, the alerts topic and the event archive."""

from __future__ import annotations

import time
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from monitor.gcpause import gc_paused
from streaming.sinks.alerts import AlertsTopicSink
from streaming.sinks.archive import ArchiveFiles
from streaming.sinks.catalogue import ROW_COLUMNS
from streaming.sinks.exporter import Exporter
from streaming.sinks.quarantine import QuarantineFiles
from streaming.state.rows import ARCHIVE_SCHEMA, TICKS_SCHEMA, unpack_archive, unpack_block


class ExporterSink:
    """foreachBatch target: applies the batch to the exporter, writes its quarantined events,
    publishes its alert transitions (exactly once, see streaming.sinks.alerts), then archives
    the events the state received (streaming.sinks.archive).  A replayed batch id is harmless
    to all four."""

    def __init__(self, exporter: Exporter, alerts: Optional[AlertsTopicSink] = None,
                 quarantine: Optional[QuarantineFiles] = None, archive: Optional[ArchiveFiles] = None):
        self.exporter = exporter
        self.alerts = alerts
        self.quarantine = quarantine
        self.archive = archive
        self._archive_removed_reported = 0  # of archive.removed
        self.on_batch: Optional[Any] = None  # called after each batch (the watchdog)
        self._removed_reported = 0  # of quarantine.removed
        self._report_quarantine()  # what a restarted job found (and what the bound removed at its start)

    def _report_quarantine(self) -> None:
        """kafka_monitor_quarantine_bytes (bytes kept now) and kafka_monitor_quarantine_files_removed_total
        (files the bound deleted since the last report)."""
        if self.quarantine is None:
            return
        self.exporter.set_quarantine(self.quarantine.bytes, self.quarantine.removed - self._removed_reported)
        self._removed_reported = self.quarantine.removed

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        with gc_paused():  # a batch's rows (up to ~10^5 dicts) against ~10^5-10^6 live series
            self._apply(df, batch_id)
        if self.on_batch is not None:
            self.on_batch()

    def _apply(self, df: DataFrame, batch_id: int) -> None:
        t0 = time.monotonic()
        # Arrow to the driver: ~10x cheaper per row than collect()'s Row objects
        rows = sink_rows(df.toArrow())
        # /metrics first: publishing waits out a fault of the alerts topic's brokers (up to
        # message.timeout.ms), and the batch's alerts should not wait with it.  A batch that
        # fails after this is replayed by a new process, whose exporter starts empty.
        n = self.exporter.apply([r for r in rows if r["kind"] not in NOT_EXPORTED],
                                batch_id=batch_id)
        bad = [r for r in rows if r["kind"] == "quarantine_event"]
        if bad and self.quarantine is not None:
            self.quarantine.write(batch_id, bad)
            self._report_quarantine()
        if self.alerts is not None:
            self.alerts.publish(batch_id, [r for r in rows if r["kind"] == "alert"])
        if self.archive is not None:
            # last: it adds nothing to the alerts' latency; it fails the batch if it cannot write
            done = self.archive.write(batch_id, _unpacked(rows, "archive_block", ARCHIVE_SCHEMA),
                                      _unpacked(rows, "archive_ticks", TICKS_SCHEMA))
            self.archive.maybe_expire()
            self.exporter.set_archive(done.rows, done.files, done.bytes, done.seconds,
                                      self.archive.removed - self._archive_removed_reported)
            self._archive_removed_reported = self.archive.removed
        self.exporter.batch_done(n, time.monotonic() - t0, time.time())


#: rows the exporter never sees: the quarantine's, and the archive's (the events and the timeouts'
#: moments a bucket received)
NOT_EXPORTED = ("quarantine_event", "archive_block", "archive_ticks")


def _unpacked(rows: list[dict], kind: str, schema: pa.Schema) -> pa.Table:
    blocks = [r["block"] for r in rows if r["kind"] == kind]
    return pa.concat_tables([unpack_archive(b) for b in blocks]) if blocks else schema.empty_table()


def _with_report(block: pa.Table, names: list) -> pa.Table:
    """A packed block's rows with the ``partition`` columns: a quiet partition has no ELR (report null)."""
    if "report" not in block.column_names:
        block = block.append_column("report", pa.nulls(block.num_rows, pa.string()))
    return block.select(names)


def sink_rows(t: pa.Table) -> list[dict]:
    """The state's output rows as dicts, grouped by kind (in their order within a kind), each
    with only the columns the sink reads of it: building a dict of all 28 columns per row cost
    ~0.4 s per 110k rows on the driver, between batches.  Partition upserts (one per partition
    whose offsets moved: ~100,000 a batch at 100,000 partitions) come as one
    ``partition_block`` row holding their columns as lists (``Exporter.apply`` reads them
    without a dict per row), before the other partition rows (removals; the state emits a
    bucket's removals after its upserts anyway, and across buckets the order only decides which
    new series a full series cap refuses in this batch).  Those upserts are the ``partition``
    rows' and those the state packed (``partition_block`` rows, ``rows.pack_block``)."""
    if t.num_rows == 0:
        return []
    kinds = t.column("kind")
    out: list[dict] = []
    names = list(ROW_COLUMNS["partition"])
    part = t.filter(pc.equal(kinds, "partition")).select(names)
    upsert = pc.equal(part.column("action"), "upsert")
    packed = t.filter(pc.equal(kinds, "partition_block")).column("block").to_pylist()
    upserts = pa.concat_tables([part.filter(upsert)] + [_with_report(unpack_block(b), names).cast(part.schema)
                                                        for b in packed])
    if upserts.num_rows:
        out.append({"kind": "partition_block", "action": "upsert", "rows": upserts.num_rows,
                    "columns": upserts.to_pydict()})
    for kind in pc.unique(kinds).to_pylist():
        if kind == "partition_block":
            continue
        if kind == "partition":
            sub = part.filter(pc.invert(upsert))
        else:
            sub = t.filter(pc.equal(kinds, kind)) if kind is not None else t.filter(pc.is_null(kinds))
            if kind in ROW_COLUMNS:
                sub = sub.select(list(ROW_COLUMNS[kind]))
        cols = sub.to_pydict()
        keys = list(cols)
        out += [dict(zip(keys, v)) for v in zip(*cols.values())]
    return out
