"""The rows the state function emits: one schema (``OUTPUT_COLUMNS``) for gauges, removals,
alert transitions, restated alerts, counts and quarantined events, built into a frame column by
column (``_frame``); the quiet partitions' gauges packed into one row per bucket
(``pack_block``); with the archive on, the rows a bucket received, packed likewise
(``pack_archive``).  How the sinks read them: streaming/sinks/batch.py.
"""

from __future__ import annotations

import json
import operator
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from streaming.ingest.schema import FLAT_COLUMNS
from streaming.rules import base as rules
from streaming.rules.dispatch import labels
from streaming.state.table import NULL


#: the rows the state function emits (one schema for gauges, removals, alerts and quarantine)
OUTPUT_COLUMNS: list[tuple[str, str]] = [
    ("kind", "string"),          # partition | partition_block | group_partition | group | client | source | topic | alert | quarantine | quarantine_event | dropped | archive_block | archive_ticks
    ("action", "string"),        # upsert | remove | open | resolve | count
    ("cluster", "string"),
    ("topic", "string"),
    ("partition", "long"),
    ("consumer_group", "string"),
    ("source", "string"),
    ("leader", "long"),
    ("replicas", "long"),
    ("isr", "long"),
    ("high_watermark", "long"),
    ("log_start_offset", "long"),
    ("last_stable_offset", "long"),
    ("committed_offset", "long"),
    ("lag", "long"),
    ("read_committed_lag", "long"),  # kind group_partition: lag to the last stable offset
    ("alert", "string"),
    ("alert_id", "string"),
    ("severity", "string"),
    ("evidence", "string"),
    ("at", "long"),
    ("count", "long"),
    ("interval_ms", "long"),
    ("lag_seconds", "double"),
    ("lag_status", "string"),
    ("group_state", "string"),
    ("members", "long"),
    ("last_ok_at", "long"),
    ("cycle_duration_ms", "long"),   # kind source: the last heartbeat's cycle, and how late it started
    ("observation_lag_ms", "long"),
    ("position", "long"),         # kind client_fetch: the consumer's position
    ("fetch_state", "string"),    # kind client_fetch: librdkafka's fetch state
    ("report", "string"),         # kinds canary, client_produce, quorum, log_dirs: the report as JSON (parsing.REPORT_FIELDS); partition: its ELR
    ("broker", "long"),           # kind broker, and the alerts on one: the broker id
    ("leader_partitions", "long"),     # kind broker: partitions it leads
    ("out_of_sync_replicas", "long"),  # kind broker: its replicas out of the ISR (replicas: all it holds)
    ("registered", "long"),       # kind broker: 1 while listed in the metadata, else 0
    ("block", "binary"),         # kind partition_block: the gauge rows of a bucket's quiet partitions, packed (see pack_block); archive_block: its received rows (pack_archive); archive_ticks: a timeout's moment (pack_ticks)
]
OUTPUT_SCHEMA = ", ".join(f"{n} {t}" for n, t in OUTPUT_COLUMNS)
_EMPTY_ROW = dict.fromkeys(n for n, _ in OUTPUT_COLUMNS)


def _row(**kw: Any) -> dict:
    """An output row: ``kw`` over all-None (a copy and an update: C speed, no per-name loop)."""
    r = _EMPTY_ROW.copy()
    r.update(kw)
    return r


def _frame(*parts: Any) -> pd.DataFrame:
    """Output rows as a frame built column by column, from ``parts`` in order: lists of row
    dicts, or dicts of output columns (numpy arrays or lists, ints ``NULL`` for missing; a column that
    is absent is all null), as ``PartitionTable.gauge_columns`` makes them.  The string columns
    then share one object block: PySpark's output path ``pd.concat``s the frame, and pandas
    checks an object block that is all null element by element in Python (a column per block,
    as ``df[c] = df[c].astype(object)`` leaves them, cost ~0.2 s per 7k-row bucket)."""
    sizes = [len(p) if isinstance(p, list) else len(p["kind"]) for p in parts]
    n = sum(sizes)
    cols: dict[str, Any] = {}
    for name, t in OUTPUT_COLUMNS:
        if t == "long":
            values = np.empty(n, np.int64)
            missing = np.ones(n, bool)
        elif t == "double":
            values = np.full(n, np.nan)
        else:
            values = np.full(n, None, dtype=object)
        at = 0
        for p, size in zip(parts, sizes):
            if isinstance(p, list):
                got = list(map(operator.itemgetter(name), p))
                if t == "long":
                    objs = np.array(got, dtype=object)
                    mask = objs == None  # noqa: E711  (elementwise, in C)
                    if mask.any():
                        objs[mask] = 0
                        missing[at:at + size] = mask
                    else:
                        missing[at:at + size] = False
                    values[at:at + size] = objs
                elif t == "double":
                    values[at:at + size] = np.array(got, dtype=np.float64)  # None -> NaN
                else:
                    values[at:at + size] = got
            elif name in p:
                if t == "long":
                    values[at:at + size] = p[name]
                    missing[at:at + size] = p[name] == NULL
                else:
                    values[at:at + size] = p[name]
            at += size
        if t == "long":
            values[missing] = 0
            cols[name] = pd.arrays.IntegerArray(values, missing)
        else:
            cols[name] = values
    return pd.DataFrame(cols)


#: the columns of a packed block: a ``partition`` upsert row's (``PartitionTable.gauge_columns``)
BLOCK_COLUMNS = ("kind", "action", "cluster", "topic", "partition", "leader", "replicas", "isr", "high_watermark",
                 "log_start_offset", "last_stable_offset", "at")
_TYPES = dict(OUTPUT_COLUMNS)
BLOCK_SCHEMA = pa.schema([(n, pa.int64() if _TYPES[n] == "long" else pa.string()) for n in BLOCK_COLUMNS])

#: a block's buffers compressed on their way through the JVM to the driver: its labels and most
#: of its numbers repeat (at 300,000 partitions a batch's blocks: 15 MB plain, 3.4 MB in lz4)
_BLOCK_IPC = pa.ipc.IpcWriteOptions(compression="lz4")


def pack_block(gauges: dict[str, Any]) -> dict:
    """The ``partition`` upsert rows of a bucket's quiet partitions (``gauge_columns``: up to
    ~7,000 a bucket, one per partition whose offsets moved) as one ``partition_block`` output
    row, its columns in an Arrow IPC stream.  Each output row costs its 28 columns' conversion
    from pandas to Arrow in the worker, then Spark's own rows and the driver's collect: as rows
    these were ~1 s of a 216k-event batch at 100,000 partitions."""
    arrays = [pa.array(gauges[n], pa.int64(), mask=gauges[n] == NULL) if t == pa.int64() else pa.array(gauges[n], t)
              for n, t in zip(BLOCK_COLUMNS, BLOCK_SCHEMA.types)]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, BLOCK_SCHEMA, options=_BLOCK_IPC) as w:
        w.write_table(pa.Table.from_arrays(arrays, schema=BLOCK_SCHEMA))
    n = len(gauges["kind"])
    return _row(kind="partition_block", action="upsert", count=n, block=sink.getvalue().to_pybytes())


#: the columns of an archived row (``pack_archive``): what the state function receives of an
#: accepted event, FLAT_COLUMNS without those only a refused row has (its reason, its raw sample
#: and size: null here), then the bucket it went to (the grouping key) and its place among the rows
#: that bucket received in the batch (``bucket_row``): a replay hands each bucket its rows of a
#: batch back as the job's state function got them (docs/replay.md)
ARCHIVE_DROPPED = ("reason", "raw", "raw_bytes")
_ARROW_OF = {"string": pa.string(), "bigint": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
             "array<bigint>": pa.list_(pa.int64())}
_RECEIVED_FIELDS = [(n, _ARROW_OF[t]) for n, t in FLAT_COLUMNS if n not in ARCHIVE_DROPPED]
ARCHIVE_SCHEMA = pa.schema(_RECEIVED_FIELDS + [("bucket", pa.int64()), ("bucket_row", pa.int64())])

#: a bucket woken by its timeout, with no rows, at the processing time ``at`` (``pack_ticks``):
#: the archive keeps these moments beside the events (``_ticks/``), for a replay
TICKS_SCHEMA = pa.schema([("bucket", pa.int64()), ("at", pa.int64())])


def _ipc(schema: pa.Schema, tables: list[pa.Table]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_BLOCK_IPC) as w:
        for t in tables:
            w.write_table(t)
    return sink.getvalue().to_pybytes()


def pack_archive(frames: list[pd.DataFrame], bucket: int) -> Optional[dict]:
    """The rows bucket ``bucket`` received in a micro-batch, in the order the state function got
    them, as one ``archive_block`` output row (an Arrow IPC stream, lz4, ``ARCHIVE_SCHEMA``) for
    the archive (streaming.sinks.archive); None when there are none.  The job sets it on with
    ``job.archive_dir``; docs/archive.md."""
    # column by column: from_pandas over a frame of the columns costs ~1.6x (its copy, its checks)
    tables, at = [], 0
    for f in frames:
        n = len(f)
        if not n:
            continue
        cols = [pa.array(f[c], t, from_pandas=True) for c, t in _RECEIVED_FIELDS]
        cols += [pa.array(np.full(n, bucket, np.int64)), pa.array(np.arange(at, at + n, dtype=np.int64))]
        tables.append(pa.Table.from_arrays(cols, schema=ARCHIVE_SCHEMA))
        at += n
    if not tables:
        return None
    return _row(kind="archive_block", count=at, block=_ipc(ARCHIVE_SCHEMA, tables))


def pack_ticks(bucket: int, at: int) -> dict:
    """A bucket woken by its timeout at ``at`` (the processing time it was evaluated at), as one
    ``archive_ticks`` output row (``TICKS_SCHEMA``): the archive writes it with the batch's
    events, so a replay can evaluate the bucket at the same moment (docs/replay.md)."""
    t = pa.table({"bucket": pa.array([bucket], pa.int64()), "at": pa.array([at], pa.int64())}, schema=TICKS_SCHEMA)
    return _row(kind="archive_ticks", count=1, at=at, block=_ipc(TICKS_SCHEMA, [t]))


def unpack_archive(block: bytes) -> pa.Table:
    """An ``archive_block`` row's rows (``ARCHIVE_SCHEMA``), or an ``archive_ticks`` row's
    (``TICKS_SCHEMA``)."""
    return pa.ipc.open_stream(block).read_all()


def unpack_block(block: bytes) -> pa.Table:
    """A ``partition_block`` row's rows (``BLOCK_COLUMNS``)."""
    return pa.ipc.open_stream(block).read_all()


def expand_blocks(out: pd.DataFrame) -> pd.DataFrame:
    """The output with each ``partition_block`` row replaced, where it stands, by the
    ``partition`` rows it packs, as the function emitted them before it packed them (tests and
    debugging)."""
    packed = np.flatnonzero((out["kind"] == "partition_block").to_numpy())
    if not len(packed):
        return out
    parts, at = [], 0
    for i in packed.tolist():
        if i > at:
            parts.append(out.iloc[at:i])
        t = unpack_block(out["block"].iloc[i])
        parts.append(_frame({n: (pc.fill_null(t.column(n), NULL).to_numpy() if BLOCK_SCHEMA.field(n).type == pa.int64()
                                 else t.column(n).to_numpy(zero_copy_only=False)) for n in BLOCK_COLUMNS}))
        at = i + 1
    if at < len(out):
        parts.append(out.iloc[at:])
    return pd.concat(parts, ignore_index=True)


#: the string columns of the rows the state function receives: from Arrow they are str or
#: None, nothing to convert
_TEXT_COLUMNS = frozenset(n for n, t in FLAT_COLUMNS if t == "string")


def _opt(v: Any) -> Any:
    """pandas/numpy missing values -> None, numpy scalars -> Python scalars, arrays -> lists."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float) and v != v:
        return None
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def _column(col: pd.Series, text: bool = False) -> list:
    """A column as Python values with None for missing ones (column-wise: much cheaper than
    converting row by row).  ``text``: a string column from Arrow (str or None already)."""
    if col.dtype == object:
        values = col.tolist()
        # strings (and None) pass as they are; only arrays and NaN/NA need converting
        if text or all(v is None or type(v) is str for v in values):
            return values
        return [_opt(v) for v in values]
    missing = col.isna().to_numpy()
    if not missing.any():
        return col.tolist()
    values = col.to_numpy(dtype=object)  # the values tolist() gives, as objects
    values[missing] = None
    return values.tolist()


#: an alert's evidence as text (keys sorted, what JSON cannot hold as its str); one encoder for
#: all (``json.dumps`` with options makes one per call)
_EVIDENCE = json.JSONEncoder(sort_keys=True, default=str)
_SEVERITY_TEXT = {s: s.name.lower() for s in rules.Severity}


def _transition_columns(ts: list[rules.Transition]) -> dict[str, Any]:
    """The ``alert`` rows of ``ts`` as output columns (``_frame``'s dict part): only the columns an
    alert fills, not a dict of every output column per transition (~13,000 a batch at 300,000
    partitions in the job benchmark)."""
    labs = [t.labels for t in ts]

    def text(name: str) -> list:
        return [lab.get(name) for lab in labs]

    def ints(values: Any) -> np.ndarray:
        return np.array([NULL if v is None else v for v in values], np.int64)

    return {"kind": ["alert"] * len(ts), "action": [t.action for t in ts], "cluster": text("cluster"),
            "topic": text("topic"), "partition": ints(text("partition")), "consumer_group": text("group"),
            "source": text("source"), "broker": ints(text("broker")), "alert": [t.alert.value for t in ts],
            "alert_id": [t.alert_id for t in ts], "severity": [_SEVERITY_TEXT[t.severity] for t in ts],
            "evidence": [_EVIDENCE.encode(t.evidence) for t in ts], "at": ints(t.at for t in ts)}


def _entity_row(s: dict, action: str = "upsert") -> dict:
    kind = s["kind"]
    if kind == "partition":
        return _row(kind=kind, action=action, cluster=s["cluster"], topic=s["topic"], partition=s["partition"],
                    leader=s["leader"], replicas=None if s["replicas"] is None else len(s["replicas"]),
                    isr=None if s["isr"] is None else len(s["isr"]), high_watermark=s["hw"],
                    log_start_offset=s["log_start"], last_stable_offset=s["lso"], at=s["last_seen"],
                    report=_elr_report(s))
    if kind == "group_partition":
        return _row(kind=kind, action=action, cluster=s["cluster"], topic=s["topic"], partition=s["partition"],
                    consumer_group=s["group"], committed_offset=s["committed"], high_watermark=s["hw"],
                    lag=s["lag"], lag_seconds=s.get("lag_seconds"), lag_status=s.get("status"),
                    read_committed_lag=s.get("rc_lag"), at=s["last_seen"])
    if kind == "client_fetch":
        return _row(kind=kind, action=action, cluster=s["cluster"], topic=s["topic"], partition=s["partition"],
                    consumer_group=s["group"], source=s["source"], fetch_state=s["fetch_state"],
                    position=s["position"], committed_offset=s["committed"], high_watermark=s["hw"],
                    last_stable_offset=s["lso"], log_start_offset=s["log_start"], lag=s["lag"], leader=s["leader"],
                    at=s["last_seen"])
    if kind == "broker":
        return _row(kind=kind, action=action, cluster=s["cluster"], broker=s["broker"], source=s["source"],
                    registered=None if s["registered"] is None else int(bool(s["registered"])), leader_partitions=s["leader_partitions"],
                    replicas=s["replica_partitions"], out_of_sync_replicas=s["out_of_sync_replicas"],
                    at=s["last_seen"])
    if kind == "client_produce":
        return _row(kind=kind, action=action, cluster=s["cluster"], source=s["source"], topic=s["topic"],
                    partition=s["partition"], leader=s["leader"], report=s["report"], at=s["last_seen"])
    if kind == "canary":
        return _row(kind=kind, action=action, cluster=s["cluster"], topic=s["topic"], partition=s["partition"],
                    source=s["source"], leader=s["leader"], report=s["report"], at=s["last_seen"])
    if kind == "group":
        return _row(kind=kind, action=action, cluster=s["cluster"], consumer_group=s["group"],
                    group_state=s.get("state"), members=s.get("members"), at=s.get("last_seen"))
    if kind == "client":
        return _row(kind=kind, action=action, cluster=s["cluster"], source=s["source"],
                    last_ok_at=s.get("last_success_at"), at=s.get("last_seen"))
    if kind == "source":
        return _row(kind=kind, action=action, cluster=s["cluster"], source=s["source"], at=s.get("last_seen"),
                    count=s.get("events_dropped"), interval_ms=s.get("interval_ms"),
                    cycle_duration_ms=s.get("cycle_duration_ms"), observation_lag_ms=s.get("observation_lag_ms"))
    if kind == "ha":  # an HA group's coverage (rules.ha)
        return _row(kind=kind, action=action, cluster=s["cluster"], source=s["source"], at=s.get("last_seen"),
                    report=s.get("report"))
    if kind == "transactions":  # its last answer's counts (rules.transactions)
        return _row(kind=kind, action=action, cluster=s["cluster"], at=s.get("last_seen"), report=s.get("report"))
    if kind == "log_dirs":  # its last answer, each dir with its use and time to full
        return _row(kind=kind, action=action, cluster=s["cluster"], broker=s["broker"], at=s.get("last_seen"),
                    report=s.get("report"))
    if kind == "quorum":  # its last answer with a leader, and whether the last one answered at all
        rep = json.loads(s.get("report") or "{}")
        return _row(kind=kind, action=action, cluster=s["cluster"], at=s.get("last_seen"),
                    report=json.dumps({**rep, "up": bool(s.get("up"))}, separators=(",", ":")))
    return _row(kind=kind, action=action, cluster=s["cluster"], topic=s.get("topic"), at=s.get("last_seen"))


def _elr_report(s: dict) -> Optional[str]:
    """A partition's eligible leader replicas as its row's report, while known and its ISR short."""
    elr = s.get("elr")
    return None if elr is None else json.dumps(elr, separators=(",", ":"))


def _exported(s: dict) -> Optional[tuple]:
    """What the exporter shows of a partition or a group partition (everything in its row but
    ``at``), cheap to compare; None for the other kinds (few entities: always sent)."""
    kind = s["kind"]
    if kind == "partition":
        shown = (s["leader"], None if s["replicas"] is None else len(s["replicas"]),
                 None if s["isr"] is None else len(s["isr"]), s["hw"], s["log_start"], s["lso"])
        # the ELR only while there is one: a quiet partition's (the table's, six values) never has
        return shown if s.get("elr") is None else shown + (_elr_report(s),)
    if kind == "group_partition":
        return (s["committed"], s["hw"], s["lag"], s.get("lag_seconds"), s.get("status"), s.get("rc_lag"))
    return None


def changed_entity_rows(entities: dict[str, Any], keys: Any, run_id: str) -> list[dict]:
    """Upsert rows for the touched entities whose exported values changed since they were last
    sent in this run.  Sending only changes keeps the sink's work (collect to the driver, the
    exporter) following change, not the number of partitions."""
    out = []
    for k in sorted(keys):
        s = entities[k]
        shown = _exported(s)
        if shown is not None:
            sig = (run_id, shown)
            if s.get("sent") == sig:
                continue
            s["sent"] = sig
        out.append(_entity_row(s))
    return out


#: why an entity left the state -> the ``reason`` label of kafka_monitor_entities_removed_total
REMOVED_REASONS = {"topic deleted": "topic_deleted", "group deleted": "group_deleted",
                   "committed offset deleted": "offset_deleted", "not observed": "not_observed"}


def removed_rows(rows: list[dict], at: Optional[int]) -> list[dict]:
    """The count rows of a bucket's remove rows, by entity kind and reason (their ``evidence``,
    a ``REMOVED_REASONS`` value)."""
    n: dict[tuple[str, str], int] = {}
    for r in rows:
        if r["action"] == "remove":
            k = (r["kind"], r["evidence"] or "not_observed")
            n[k] = n.get(k, 0) + 1
    return [_row(kind="removed", action="count", alert=kind, evidence=why, count=c, at=at)
            for (kind, why), c in sorted(n.items())]


def dropped_rows(dropped: dict[str, int], at: Optional[int]) -> list[dict]:
    return [_row(kind="dropped", action="count", alert=why, count=n, at=at) for why, n in sorted(dropped.items()) if n]


def remember_shown(entities: dict[str, Any], transitions: list[rules.Transition]) -> None:
    """Keep, with each alert opened, the labels and severity it was shown with: a new run of the
    job restates it from them (``active_rows``)."""
    for t in transitions:
        if t.action == "open":
            o = entities.get(t.entity, {}).get("open", {}).get(t.alert.value)
            if o is not None and o["id"] == t.alert_id:
                o["shown"] = (t.severity.name.lower(), t.labels)


def active_rows(entities: dict[str, Any]) -> list[dict]:
    """An ``open_alert`` row per open alert of the bucket: what the alerts topic said was opened
    and not yet resolved, for a new run's exporter (which starts empty).  Not a transition:
    never published, never counted."""
    out = []
    for s in entities.values():
        for name, o in (s.get("open") or {}).items():
            severity, lab = o.get("shown") or (rules.SEVERITY[rules.Alert(name)].name.lower(), labels(s))
            out.append(_row(kind="open_alert", action="restate", cluster=lab.get("cluster"), topic=lab.get("topic"),
                            partition=lab.get("partition"), consumer_group=lab.get("group"),
                            source=lab.get("source"), broker=lab.get("broker"), alert=name, alert_id=o["id"],
                            severity=severity, at=o["since"]))
    return out


#: the quarantine_event rows of one batch carry samples of at most this many characters in all
#: (each is at most parsing.RAW_SAMPLE_CHARS); past it, events are listed and counted without one
QUARANTINE_SAMPLE_BUDGET = 4 << 20


def _event_time(v: Any) -> Optional[int]:
    """A refused row's ``observed_at`` as an int, or None when it is no usable time (a refused
    row may hold anything: 2**63 - 1 arrives as the float 2**63 and overflowed the output)."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return None
    return int(v) if abs(v) <= (1 << 53) else None


def quarantine_rows(frames: Any) -> list[dict]:
    """One ``quarantine_event`` row per refused event (its reason, a sample of its raw text in
    ``evidence`` while the batch's ``QUARANTINE_SAMPLE_BUDGET`` lasts, the size of the whole
    value in ``count``; for the quarantine sink) and one ``quarantine`` count per reason (for
    the metric).  ``frames``: a frame or an iterable of frames, read one at a time (the
    quarantine bucket gets every refused row of a batch)."""
    budget = QUARANTINE_SAMPLE_BUDGET
    out: list[dict] = []
    counts: dict[str, int] = {}
    samples: dict[str, str] = {}
    latest: dict[str, Optional[int]] = {}
    for f in [frames] if isinstance(frames, pd.DataFrame) else frames:
        n = len(f)
        if not n:
            continue
        none = [None] * n
        cols = [_column(f[c], text=c in _TEXT_COLUMNS) if c in f.columns else none
                for c in ("reason", "raw", "raw_bytes", "observed_at")]
        for reason, raw, size, at in zip(*cols):
            reason = str(reason)
            at = _event_time(at)
            if raw is not None:
                if len(raw) <= budget:
                    budget -= len(raw)
                else:
                    raw = None
            if reason not in counts:
                counts[reason], samples[reason], latest[reason] = 0, "" if raw is None else raw[:300], at
            counts[reason] += 1
            prev = latest[reason]
            if at is not None and (prev is None or at > prev):
                latest[reason] = at
            out.append(_row(kind="quarantine_event", action="count", alert=reason, evidence=raw, count=size, at=at))
    for reason, n in counts.items():
        out.append(_row(kind="quarantine", action="count", alert=reason, count=n, at=latest[reason],
                        evidence=json.dumps({"reason": reason, "sample": samples[reason]})))
    return out
