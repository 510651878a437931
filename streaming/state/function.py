"""The ``applyInPandasWithState`` function: per bucket of entities, admit each observation once
and in order, fold the quiet partitions' rows in columns (``table``) and the others through the
rules, run the time-driven checks, store the bucket (a versioned format), emit the changed
gauges and the alert transitions.  Layout, restarts, timers and the stored format: docs/state.md.
"""

from __future__ import annotations

import json
import logging
import operator
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from monitor.contract import LIVENESS_TYPES
from streaming.rules import base as rules
from streaming.rules import group as rules_group
from streaming.rules import lag as rules_lag
from streaming.rules import partition as rules_partition
from streaming.rules import topic as rules_topic
from streaming.rules.dispatch import DUE, EVENTS, TEMPLATES, labels, new_entity
from streaming.gcpause import gc_paused
from streaming.state.table import NULL, PartitionTable
from streaming.state.table import decode as table_decode, encode as table_encode, from_lists as table_from_lists
from streaming.state.table import event_keys as table_event_keys, keyed_applied
from streaming.state.table import CODED as TABLE_CODED, PLAIN as TABLE_INTS
from streaming.state.table import compact as table_compact, cold_keys as table_cold_keys
from streaming.ingest.schema import FLAT_COLUMNS

log = logging.getLogger(__name__)

QUARANTINE_BUCKET = -1

#: the rows the state function emits (one schema for gauges, removals, alerts and quarantine)
OUTPUT_COLUMNS: list[tuple[str, str]] = [
    ("kind", "string"),          # partition | partition_block | group_partition | group | client | source | topic | alert | quarantine | quarantine_event | dropped
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
    ("report", "string"),         # kinds canary, client_produce: the report as JSON (parsing.REPORT_FIELDS)
    ("broker", "long"),           # kind broker, and the alerts on one: the broker id
    ("leader_partitions", "long"),     # kind broker: partitions it leads
    ("out_of_sync_replicas", "long"),  # kind broker: its replicas out of the ISR (replicas: all it holds)
    ("registered", "long"),       # kind broker: 1 while listed in the metadata, else 0
    ("block", "binary"),         # kind partition_block: the gauge rows of a bucket's quiet partitions, packed (see pack_block)
]
OUTPUT_SCHEMA = ", ".join(f"{n} {t}" for n, t in OUTPUT_COLUMNS)
STATE_SCHEMA = "entities binary"


@dataclass(frozen=True)
class StateConfig:
    entity_ttl_ms: int = 900_000
    #: how often a bucket without new events is woken to run the time-driven checks
    tick_ms: int = 30_000
    #: identifies this run of the job: an entity's gauges are sent to the exporter when they
    #: change, and once per run (a restarted job starts with an empty exporter)
    run_id: str = ""
    lag: rules_lag.LagConfig = field(default_factory=rules_lag.LagConfig)
    partition: rules_partition.PartitionRulesConfig = field(default_factory=rules_partition.PartitionRulesConfig)
    group: rules_group.GroupRulesConfig = field(default_factory=rules_group.GroupRulesConfig)


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


def _entity_row(s: dict, action: str = "upsert") -> dict:
    kind = s["kind"]
    if kind == "partition":
        return _row(kind=kind, action=action, cluster=s["cluster"], topic=s["topic"], partition=s["partition"],
                    leader=s["leader"], replicas=None if s["replicas"] is None else len(s["replicas"]),
                    isr=None if s["isr"] is None else len(s["isr"]), high_watermark=s["hw"],
                    log_start_offset=s["log_start"], last_stable_offset=s["lso"], at=s["last_seen"])
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
    return _row(kind=kind, action=action, cluster=s["cluster"], topic=s.get("topic"), at=s.get("last_seen"))


#: the string columns of the rows the state function receives: from Arrow they are str or
#: None, nothing to convert
_TEXT_COLUMNS = frozenset(n for n, t in FLAT_COLUMNS if t == "string")

#: event ids remembered per (entity, type, source) at its latest event time
DEDUP_IDS = 16
#: sources remembered per (entity, type): a probe's source is ``probe-<hostname>``, so every
#: restart of a probe pod adds one; past this many the one that reported longest ago is forgotten
MAX_SOURCES = 8


def admit(s: dict, etype: str, source: Optional[str], t: int, event_id: Optional[int]) -> Optional[str]:
    """Whether an observation may be applied to entity state ``s``: None, or why it is dropped.
    ``event_id``: the event id's key (``table.event_keys``), or None.

    ``duplicate``: an event with this ``event_id`` was already applied (a producer retry, a
    replayed probe).  ``out_of_order``: older than the last observation of the same type from
    the same source already applied — applying it would move the entity back in time.  Both are
    decided per entity, type and source with O(1) memory: the latest event time and the ids
    seen at exactly that time, so a replay of an older event counts as ``out_of_order``.  This
    is stricter than a watermark: the entity's own latest observation is the watermark.
    (Different sources are independent: their clocks may differ.)  At most ``MAX_SOURCES``
    sources are remembered per type; a forgotten one (the one whose last event is the oldest,
    in practice a probe replaced long ago) is a new source again if it ever reports."""
    applied = s.setdefault("applied", {})
    k = (etype, source)
    last = applied.get(k)
    if last is None and len(applied) >= MAX_SOURCES:
        same = [x for x in applied if x[0] == etype]
        if len(same) >= MAX_SOURCES:
            del applied[min(same, key=lambda x: (applied[x][0], str(x[1])))]
    if last is not None:
        lt, ids = last
        seen = event_id is not None and event_id in ids
        if t < lt:
            return "duplicate" if seen else "out_of_order"
        if t == lt:
            if seen:
                return "duplicate"
            if len(ids) < DEDUP_IDS:
                ids.append(event_id)
            return None
    applied[k] = (t, [event_id])
    return None


#: columns of the input the rules never read (the quarantine path reads raw and reason)
_NOT_READ = frozenset({"raw", "raw_bytes", "reason", "bucket_key", "bucket"})


def _all_null(col: pd.Series) -> bool:
    """``col.isna().all()`` on its numpy values (a Series' isna costs ~20 us a call, ~70 calls
    a bucket)."""
    a = col.to_numpy()
    if a.dtype.kind == "f":
        return bool(np.isnan(a).all())
    if a.dtype.kind in "iub":
        return len(a) == 0
    return bool(pd.isna(a).all())


def _columns(frames: list[pd.DataFrame], names: list[str]) -> dict[str, list]:
    """Each column of the frames with a value in some row as one list of Python values; the
    columns left out are all null (most are: a row holds its own type's fields).  No
    ``pd.concat``: with columns that are all null in some frames it checks them value by
    value, ~0.4 s per bucket."""
    out: dict[str, list] = {}
    for c in names:
        series = [f[c] for f in frames]
        nulls = [_all_null(s) for s in series]
        if all(nulls):
            continue
        values: list = []
        for s, null in zip(series, nulls):
            values += [None] * len(s) if null else _column(s, text=c in _TEXT_COLUMNS)
        out[c] = values
    return out


def _ints(col: pd.Series) -> np.ndarray:
    """An integer column as int64 with ``NULL`` for missing values (Spark hands nullable longs
    over as float64 with NaN; hand-made frames may hold objects)."""
    kind = col.dtype.kind
    if kind in "iu":
        return col.to_numpy(np.int64)
    missing = col.isna().to_numpy()
    if kind == "f":
        out = np.where(missing, 0, col.to_numpy()).astype(np.int64)
    else:
        out = np.zeros(len(col), np.int64)
        out[~missing] = [int(v) for v in col.to_numpy(dtype=object)[~missing]]
    out[missing] = NULL
    return out


_QUIET_OBJECTS = ("entity", "type", "source", "replicas", "isr")
_QUIET_INTS = ("observed_at", "seq", "high_watermark", "log_start_offset", "last_stable_offset", "metadata_at",
               "leader", "leader_epoch", "min_insync_replicas")


def fold_quiet(table: PartitionTable, frames: list[pd.DataFrame]) -> tuple[list[pd.DataFrame], np.ndarray]:
    """Apply the quiet partitions' rows to ``table`` (``PartitionTable.fold_quiet``);
    return (the frames without them, for ``fold``; the table positions whose gauges changed)."""
    if not len(table) or not frames:
        return frames, np.empty(0, np.int64)
    cols = {c: np.concatenate([f[c].to_numpy(dtype=object) for f in frames]) for c in _QUIET_OBJECTS}
    cols.update({c: np.concatenate([_ints(f[c]) for f in frames]) for c in _QUIET_INTS})
    cols["event_key"] = table_event_keys(np.concatenate([f["event_id"].to_numpy(dtype=object) for f in frames]))
    done, gauges = table.fold_quiet(cols)
    if not done.any():
        return frames, gauges
    rest, at = [], 0
    for f in frames:
        keep = ~done[at:at + len(f)]
        at += len(f)
        if keep.any():
            rest.append(f[keep])
    return rest, gauges


_MD, _OFF = "partition_metadata", "partition_offsets"
#: the columns ``fold_new`` reads: ints, and objects
_NEW_INTS = ("observed_at", "seq", "leader", "min_insync_replicas", "high_watermark", "log_start_offset",
             "last_stable_offset", "metadata_at")
_NEW_OBJECTS = ("entity", "type", "source", "cluster", "topic", "replicas", "isr")
#: the cold part of a partition ``fold_new`` makes, field by field: a slot of the partition's
#: values (its metadata row's, and its two empty dicts, ``open`` and ``applied``, the latter
#: being what ``compact`` leaves of it), a field the rules copy from one, or a constant
_NEW_SLOTS = ("cluster", "topic", "partition", "leader", "leader_epoch", "replicas", "isr", "min_isr", "epoch_seen",
              "open", "applied")
_NEW_COPIES = {"leader_seen": "leader"}
_NEW_CONSTANTS: dict[str, Any] = {"kind": "partition", "interval_ms": None, "epoch_regressions": 0,
                                  "leader_episode": None, "imbalanced_since": None, "pending_writes_at": None,
                                  "pending_since": None}
_new_warned = False


def _healthy(leader: int, replicas: Any, isr: Any, min_isr: int) -> Optional[tuple[list[int], list[int]]]:
    """(replicas, isr) as int lists when a first partition_metadata with these values opens
    nothing and starts no timer (a leader, the preferred one; every replica in the ISR, none
    twice; min.insync.replicas neither above nor at the ISR), else None."""
    if leader == NULL or leader < 0 or replicas is None or isr is None or len(replicas) == 0:
        return None
    try:
        rep, inr = [int(x) for x in replicas], [int(x) for x in isr]
    except (TypeError, ValueError):
        return None
    if rep[0] != leader or sorted(rep) != sorted(inr) or len(set(rep)) != len(rep):
        return None
    if min_isr != NULL and rules_partition.min_isr_status(len(inr), len(rep), min_isr) is not None:
        return None
    return rep, inr


def fold_new(table: PartitionTable, entities: dict[str, Any], frames: list[pd.DataFrame],
             cfg: StateConfig) -> tuple[list[pd.DataFrame], np.ndarray]:
    """Put straight into ``table`` the partitions this bucket sees for the first time whose
    batch rows are their metadata then their offsets, from one source, and leave them healthy
    (``_healthy``), in columns: what the dict rules and ``compact`` would make of them, without
    a dict each (at 300,000 partitions the first batches cost ~5x a batch on held state).  The
    first of them goes through the dict rules and must come out as stamped, else none is put
    in (logged once).  Returns (the frames without their rows, their table positions: their
    gauges are sent)."""
    global _new_warned
    none = np.empty(0, np.int64)
    if not frames:
        return frames, none
    obj = {c: np.concatenate([f[c].to_numpy(dtype=object) for f in frames]) for c in _NEW_OBJECTS}
    typ = obj["type"]
    cand = np.flatnonzero((typ == _MD) | (typ == _OFF))
    if not len(cand):
        return frames, none
    ent = obj["entity"][cand]
    cand = cand[table.positions(ent) < 0]
    if entities and len(cand):
        cand = cand[np.fromiter((e not in entities for e in obj["entity"][cand]), bool, len(cand))]
    if len(cand) < 2:
        return frames, none
    ints = {c: np.concatenate([_ints(f[c]) for f in frames]) for c in _NEW_INTS}
    t, seq = ints["observed_at"], ints["seq"]
    # exactly two rows per partition: its metadata, then its offsets (event order), one source
    order = cand[np.lexsort((seq[cand], t[cand], obj["entity"][cand]))]
    ent = obj["entity"][order]
    starts = np.flatnonzero(np.r_[True, ent[1:] != ent[:-1]])
    sizes = np.diff(np.r_[starts, len(order)])
    two = starts[sizes == 2]
    im, io = order[two], order[two + 1]
    ok = (typ[im] == _MD) & (typ[io] == _OFF) & (obj["source"][im] == obj["source"][io])
    ok &= (t[im] != NULL) & (t[io] != NULL) & (seq[im] != NULL) & (seq[io] != NULL)
    ok &= (t[im] < t[io]) | ((t[im] == t[io]) & (seq[im] < seq[io]))
    ok &= ints["high_watermark"][io] != NULL
    keys = table_event_keys(np.concatenate([f["event_id"].to_numpy(dtype=object) for f in frames]))
    ok &= (keys[im] != NULL) & (keys[io] != NULL)
    writes = (typ == "canary") | (typ == "client_produce")
    if writes.any():  # their pending writes go to the partition: the dict rules' business
        w = np.flatnonzero(writes)
        part = np.concatenate([_ints(f["partition"]) for f in frames])[w]
        named = {f"partition|{c}/{tp}/{p}" for c, tp, p in zip(obj["cluster"][w], obj["topic"][w], part.tolist())}
        ok &= np.fromiter((e not in named for e in obj["entity"][im]), bool, len(im))
    im, io = im[ok], io[ok]
    lists = [_healthy(ld, r, i, mi) for ld, r, i, mi in zip(
        ints["leader"][im].tolist(), obj["replicas"][im], obj["isr"][im], ints["min_insync_replicas"][im].tolist())]
    ok = np.fromiter((x is not None for x in lists), bool, len(im))
    im, io = im[ok], io[ok]
    lists = [x for x in lists if x is not None]
    if not len(im):
        return frames, none
    raw = {c: np.concatenate([np.array(_column(f[c]), dtype=object) for f in frames])[im]
           for c in ("partition", "leader_epoch")}
    # the first one through the dict rules: its layout, and the check
    at = np.cumsum([0] + [len(f) for f in frames])
    sub = []
    for k, f in enumerate(frames):
        mine = [int(x) - at[k] for x in (im[0], io[0]) if at[k] <= x < at[k + 1]]
        if mine:
            sub.append(f.iloc[mine])
    ref: dict[str, Any] = {}
    got, touched = fold(ref, sub, cfg)
    changed_entity_rows(ref, touched, cfg.run_id)
    key0 = obj["entity"][im[0]]
    layouts = {k: i for i, k in enumerate(table.layouts)}
    want = None if got or list(ref) != [key0] else table_compact(ref[key0], cfg.run_id, cfg.partition, layouts)
    cold_keys = table_cold_keys(ref[key0])[0] if key0 in ref else ()
    if want is None or any(k not in _NEW_SLOTS and k not in _NEW_COPIES and k not in _NEW_CONSTANTS
                           for k in cold_keys):
        stamped = None
    else:
        stamped = _stamp(table, cfg, obj, ints, raw, keys, im, io, lists, cold_keys)
    if want is None or stamped is None or not _same(stamped, want):
        if not _new_warned:
            _new_warned = True
            log.warning("new partitions: the column path does not match the rules for %s; they go through "
                        "the rules (slower, correct)", key0)
        return frames, none
    cols, coded, cold = stamped
    born = table.add(obj["entity"][im].tolist(), cols, coded, cold)
    done = np.zeros(at[-1], bool)
    done[im] = done[io] = True
    rest = []
    for k, f in enumerate(frames):
        keep = ~done[at[k]:at[k + 1]]
        if keep.all():
            rest.append(f)
        elif keep.any():
            rest.append(f[keep])
    return rest, born


def _same(stamped: tuple[dict, dict, list], want: tuple) -> bool:
    """Whether the first of ``_stamp``'s rows is ``compact``'s (ints, sent_ok, objects)."""
    cols, coded, cold = stamped
    ints, sent_ok, objects = want
    return (bool(sent_ok) and [int(cols[name][0]) for name in TABLE_INTS] == list(ints)
            and (*(coded[name][0] for name in TABLE_CODED), cold[0]) == tuple(objects))


def _stamp(table: PartitionTable, cfg: StateConfig, obj: dict, ints: dict, raw: dict, keys: np.ndarray,
           im: np.ndarray, io: np.ndarray, lists: list, cold_keys: tuple) -> tuple[dict, dict, list]:
    """``fold_new``'s partitions as table columns: (``_PLAIN`` ints, ``_CODED`` values, cold parts)."""
    to, tm = ints["observed_at"][io], ints["observed_at"][im]
    hw, ls, lso = ints["high_watermark"][io], ints["log_start_offset"][io], ints["last_stable_offset"][io]
    mdat = ints["metadata_at"][io]
    leader, min_isr = ints["leader"][im], ints["min_insync_replicas"][im]
    n = len(im)
    cols = {"hw": hw, "log_start": ls, "lso": lso, "last_seen": to, "observed_at": to, "hw_seen": hw,
            "hw_changed_at": to, "hw_observed_at": to,
            "md_confirmed_at": np.where(mdat == NULL, NULL, np.minimum(mdat, to)), "md_at": tm,
            "off_t": to, "md_t": tm, "partition": _ints(pd.Series(raw["partition"], dtype=object)),
            "leader": leader, "n_replicas": np.fromiter((len(x[0]) for x in lists), np.int64, n),
            "n_isr": np.fromiter((len(x[1]) for x in lists), np.int64, n), "min_isr": min_isr,
            "window": np.full(n, rules_partition.unobserved_window_ms({"interval_ms": None}, cfg.partition)),
            "layout": np.full(n, table.layout(cold_keys)), "sent_hw": hw, "sent_ls": ls, "sent_lso": lso,
            "off_id": keys[io], "md_id": keys[im]}
    consts = list(_NEW_CONSTANTS.values())
    slot = {k: i for i, k in enumerate(_NEW_SLOTS)}
    slot.update({k: slot[v] for k, v in _NEW_COPIES.items()})
    slot.update({k: len(_NEW_SLOTS) + i for i, k in enumerate(_NEW_CONSTANTS)})
    pick = operator.itemgetter(*(slot[k] for k in cold_keys))
    cold, sigs = [], []
    for c, tp, p, ld, ep, (rep, isr), mi in zip(obj["cluster"][im], obj["topic"][im], raw["partition"], leader.tolist(),
                                                  raw["leader_epoch"], lists, min_isr.tolist()):
        es = None if ep is None else int(ep)
        cold.append(pickle.dumps(pick((c, tp, p, ld, ep, rep, isr, None if mi == NULL else mi, es, {}, {}, *consts)),
                                 protocol=pickle.HIGHEST_PROTOCOL))
        sigs.append(repr(rules_partition.signature(ld, es, rep, isr)))
    src = obj["source"][im].tolist()
    coded = {"off_src": src, "md_src": src, "sig": sigs, "cluster": obj["cluster"][im].tolist(),
             "topic": obj["topic"][im].tolist()}
    return cols, coded, cold


#: the contract's types that say an entity is gone -> the reason its alerts resolve with
GONE = {"partition_gone": "topic deleted", "group_gone": "group deleted",
        "group_partition_gone": "committed offset deleted"}
#: why an entity left the state -> the ``reason`` label of kafka_monitor_entities_removed_total
REMOVED_REASONS = {"topic deleted": "topic_deleted", "group deleted": "group_deleted",
                   "committed offset deleted": "offset_deleted", "not observed": "not_observed"}


def _gone_with(entities: dict[str, Any], key: str, etype: str, r: dict) -> list[str]:
    """The keys a gone event takes away with its entity (in this bucket, which holds them): a
    deleted partition's producer entities; a deleted group's partitions and consumers."""
    cl = r["cluster"]
    if etype == "partition_gone":
        topic, part = r["topic"], r["partition"]
        return [k for k, v in entities.items() if k != key and v["kind"] == "client_produce"
                and v["cluster"] == cl and v["topic"] == topic and v["partition"] == part]
    if etype == "group_gone":
        group = r["group"]
        return [k for k, v in entities.items() if v["kind"] in ("group_partition", "client_fetch")
                and v["cluster"] == cl and v["group"] == group]
    return []


def forget(entities: dict[str, Any], key: str, etype: str, r: dict,
           t: int) -> tuple[list[rules.Transition], list[tuple[str, dict]], set[str]]:
    """A gone event (``GONE``) at ``t``: the entity ``key`` and what goes with it (``_gone_with``)
    resolve their open alerts with the reason, and leave ``entities``.  One observed after ``t``
    (the topic or group re-created since) stays.  Returns (transitions, their remove rows,
    the keys dropped)."""
    reason = GONE[etype]
    out: list[rules.Transition] = []
    rows: list[tuple[str, dict]] = []
    keys: set[str] = set()
    for k in [key] + _gone_with(entities, key, etype, r):
        v = entities.get(k)
        if v is None or (v.get("last_seen") is not None and v["last_seen"] > t):
            continue
        out += rules.gone(v, t, k, labels(v), reason)
        rows.append((k, _entity_row(v, action="remove") | {"evidence": REMOVED_REASONS[reason]}))
        del entities[k]
        keys.add(k)
    return out, rows, keys


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


def fold(entities: dict[str, Any], rows: Any, cfg: StateConfig,
         dropped: Optional[dict[str, int]] = None,
         take: Optional[Callable[[str], Any]] = None,
         removed: Optional[list[tuple[str, dict]]] = None) -> tuple[list[rules.Transition], set[str]]:
    """Apply the batch's rows (a frame, or a list of frames; in event order) to the entities;
    return (transitions, touched keys).  Rows ``admit`` refuses are counted in ``dropped`` by
    reason.  ``take(key)``: an entity kept outside ``entities`` (``PartitionTable.take``), or
    None.  A gone event's entities (``forget``) leave ``entities``; their remove rows go to
    ``removed`` with their keys."""
    out: list[rules.Transition] = []
    touched: set[str] = set()

    def find(k: str) -> Any:
        """The entity ``k``, taken into ``entities`` from the table if it is there; or None."""
        got = entities.get(k)
        if got is None and take is not None and (got := take(k)) is not None:
            entities[k] = got
        return got

    frames = [rows] if isinstance(rows, pd.DataFrame) else [f for f in rows if len(f)]
    if not frames:
        return out, touched
    names = [c for c in frames[0].columns if c not in _NOT_READ]
    cols = _columns(frames, names)
    for c in ("observed_at", "seq"):
        cols.setdefault(c, [None] * sum(len(f) for f in frames))
    if "event_id" in cols:  # admit remembers an event id by its key (table.event_keys)
        cols["event_id"] = [None if k == NULL else k for k in table_event_keys(cols["event_id"]).tolist()]
    obs, seq = cols["observed_at"], cols["seq"]
    try:
        order = sorted(range(len(obs)), key=lambda i: (obs[i], seq[i]))
    except TypeError:  # a null (only hand-made rows have one: the gate refuses them): nulls last
        order = sorted(range(len(obs)), key=lambda i: (obs[i] is None, obs[i] or 0, seq[i] is None, seq[i] or 0))
    if order != list(range(len(order))):
        pick = operator.itemgetter(*order)
        cols = {c: list(pick(v)) if len(order) > 1 else v for c, v in cols.items()}
    used = [c for c in names if c in cols]
    blank: dict[str, Any] = dict.fromkeys(names)  # each row: every column, None where it is null
    for values in zip(*(cols[c] for c in used)):
        r = blank.copy()
        r.update(zip(used, values))
        key, etype, t = r["entity"], r["type"], r["observed_at"]
        kind = key.split("|", 1)[0]
        s: Any = find(key)
        if etype in GONE:  # not admitted: a repeat finds nothing left to forget
            if t is not None:
                gone, rows, keys = forget(entities, key, etype, r, int(t))
                out += gone
                touched -= keys
                if removed is not None:
                    removed += rows
            continue
        if s is None:
            s = new_entity(kind, r)
        why = admit(s, etype, r["source"], t, r.get("event_id"))
        if why is not None:
            # a liveness event comes twice by design (monitor/emitter.py): its copy is no loss
            if dropped is not None and not (why == "duplicate" and etype in LIVENESS_TYPES):
                dropped[why] = dropped.get(why, 0) + 1
            continue
        if kind in DUE and t is not None:
            out += catch_up(s, key, int(t) - 1, cfg)  # what expired before this event
        on = EVENTS.get(etype)
        if on is None:
            continue
        out += on.rule(s, r, t, key) if on.family is None else on.rule(s, r, t, key, getattr(cfg, on.family))
        if on.writes is not None:
            out += on.writes(r, t, find, cfg.partition)
        if s.get("last_seen") is None or (t is not None and t > s["last_seen"]):
            s["last_seen"] = t
        entities[key] = s
        touched.add(key)
    return out, touched


def catch_up(s: dict, key: str, until: int, cfg: StateConfig) -> list[rules.Transition]:
    """The time-driven checks of a client or source entity at each moment one falls due, up to
    ``until``: a timer that expired opens its alert stamped with when it expired, whatever the
    micro-batch boundaries (before a new event of the entity at t, ``until`` is t - 1; at a
    batch's end, the batch's time).  A job that read the same events in other batches, after a
    restart or a replay, raises the same transitions."""
    timers = DUE[s["kind"]]
    settings = getattr(cfg, timers.family)
    out: list[rules.Transition] = []
    for _ in range(8):  # each tick settles what fell due; a few suffice (bounded all the same)
        due = timers.due_at(s, settings)
        if due is None or due > until:
            break
        got = timers.tick(s, due, key, settings)
        out += got
        if not got:
            break
    return out


def tick(entities: dict[str, Any], now: int, cfg: StateConfig) -> list[rules.Transition]:
    """The time-driven checks of every entity in the bucket (cheap when nothing is due)."""
    out: list[rules.Transition] = []
    lags: dict[tuple[str, str], list[Optional[int]]] = {}
    for s in entities.values():
        if s["kind"] == "group_partition":
            lags.setdefault((s["cluster"], s["group"]), []).append(s.get("lag"))
    for key, s in entities.items():
        kind = s["kind"]
        if kind == "partition":
            out += rules_partition.tick_partition(s, now, key, cfg.partition)
        elif kind == "topic":
            out += rules_topic.tick_topic(s, now, key, cfg.partition)
        elif kind == "group":
            due = rules_group.group_due_at(s, cfg.group)  # None: no timer runs, tick_group would do nothing
            if due is not None and due <= now:
                out += rules_group.tick_group(s, now, key, cfg.group, lags.get((s["cluster"], s["group"]), []))
        elif kind in DUE:
            out += catch_up(s, key, now, cfg)
    return out


def _exported(s: dict) -> Optional[tuple]:
    """What the exporter shows of a partition or a group partition (everything in its row but
    ``at``), cheap to compare; None for the other kinds (few entities: always sent)."""
    kind = s["kind"]
    if kind == "partition":
        return (s["leader"], None if s["replicas"] is None else len(s["replicas"]),
                None if s["isr"] is None else len(s["isr"]), s["hw"], s["log_start"], s["lso"])
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


def dropped_rows(dropped: dict[str, int], at: Optional[int]) -> list[dict]:
    return [_row(kind="dropped", action="count", alert=why, count=n, at=at) for why, n in sorted(dropped.items()) if n]


def evict_stale(entities: dict[str, Any], now: int, ttl_ms: int) -> tuple[list[rules.Transition], list[dict]]:
    """Drop the entities not seen for ``ttl_ms``: (their alerts' resolves, their remove rows)."""
    resolved: list[rules.Transition] = []
    out = []
    for key in list(entities):
        s = entities[key]
        gone = rules.evict(s, now, ttl_ms, key, labels(s))
        if gone is not None:
            resolved += gone
            out.append(_entity_row(s, action="remove") | {"evidence": REMOVED_REASONS["not observed"]})
            del entities[key]
    return resolved, out


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


#: The stored layout of a bucket, by format (docs/state.md "Stored format"):
#:   1  {entity key: entity dict} (before the partition table)
#:   2  {"format": 2, "entities": {key: dict}, "partitions": table state, "run": the job run
#:      that last restated the bucket's open alerts}
#:   3  format 2 plus "fields": the entity field signature (``FIELDS``) it was written with
#:   4  format 3 compressed (``_ENVELOPE``), the table's columns encoded (``table.encode``), its
#:      metadata signatures as their ``repr``
#:   5  format 4, the table's keys and cold parts in Arrow arrays, its sources, signatures and
#:      labels as codes into per-table lists, event ids (``admit``'s, everywhere) as their
#:      64-bit keys (``table.from_lists``, ``table.event_keys``)
#:   6  format 5, its table's int columns each in the narrowest type that holds them, its cold
#:      parts without the partition's cluster, topic and number (columns already), dictionary-encoded
#: A state is read through ``_MIGRATIONS`` up to ``_FORMAT``; a newer one is refused.
_FORMAT = 6

#: a format 4+ bucket: this prefix, the pickle's length (8 bytes, little endian), the pickle
#: compressed with zstd (at 300,000 partitions a bucket's pickle is ~2 MB, ~0.6 MB compressed:
#: Spark's state store moves and writes every bucket each batch)
_ENVELOPE = b"KMZ\x04"
_CODEC = pa.Codec("zstd")


def encode_state(v: dict) -> bytes:
    """A bucket's value (today's format) as it is stored."""
    v = {**v, "partitions": table_encode(v["partitions"])}
    raw = pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
    return _ENVELOPE + len(raw).to_bytes(8, "little") + _CODEC.compress(raw, asbytes=True)


def decode_state(value: bytes) -> dict:
    """A stored bucket's value in the format it was written in (1: a dict of entities)."""
    if value[:len(_ENVELOPE)] == _ENVELOPE:
        at = len(_ENVELOPE)
        size = int.from_bytes(value[at:at + 8], "little")
        v = pickle.loads(_CODEC.decompress(value[at + 8:], decompressed_size=size, asbytes=True))
        return {**v, "partitions": table_decode(v["partitions"])}
    return pickle.loads(value)


class StateFormatError(RuntimeError):
    """A stored bucket this version cannot read (written by a newer kafka-monitor)."""


def _from_1(v: dict) -> dict:
    return {"format": 2, "entities": v, "partitions": None, "run": None}


def _from_2(v: dict) -> dict:
    return {**v, "format": 3, "fields": None}  # fields unknown: completed on load


def _from_3(v: dict) -> dict:
    t = v["partitions"]  # the table's signatures are their repr from format 4 on
    if t:
        t = {**t, "objs": {**t["objs"], "sig": [None if x is None else repr(x) for x in t["objs"]["sig"]]}}
    return {**v, "format": 4, "partitions": t}


def _from_4(v: dict) -> dict:
    for e in v["entities"].values():  # admit remembers event ids by their key from format 5 on
        if e.get("applied"):
            e["applied"] = keyed_applied(e["applied"])
    return {**v, "format": 5, "partitions": table_from_lists(v["partitions"])}


def _from_5(v: dict) -> dict:
    return {**v, "format": 6}  # decode widens the columns; a cold part's names are overwritten by the columns'


#: format N -> the function that turns it into format N + 1
_MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _from_1, 2: _from_2, 3: _from_3, 4: _from_4, 5: _from_5}

_SAMPLE = {"cluster": "", "topic": "", "partition": 0, "group": "", "source": ""}
#: the fields every new entity starts with, per kind: a stored bucket whose signature differs
#: has its entities completed (a field added since keeps its new entity's default)
FIELDS: tuple = tuple(sorted((kind, tuple(sorted(make(_SAMPLE)))) for kind, make in TEMPLATES.items()))


def _complete(entities: dict[str, Any], table: PartitionTable) -> None:
    """Give every entity the fields a new one of its kind has (defaults for those it lacks);
    the table's partitions become dicts for it (the next store compacts them again)."""
    for k in table.live_keys():
        got = table.take(k)
        if got is not None:
            entities[k] = got
    for e in entities.values():
        make = TEMPLATES.get(e.get("kind", ""))
        if make is None:
            continue
        for name, default in make(e).items():
            e.setdefault(name, default)
        e.setdefault("open", {})
        e.setdefault("last_seen", None)


def _unpack(value: bytes, run_id: str) -> tuple[dict[str, Any], PartitionTable, Optional[str]]:
    v = decode_state(value)
    fmt: int = v["format"] if isinstance(v.get("format"), int) else 1
    if fmt > _FORMAT:
        raise StateFormatError(
            f"a bucket's state has format {fmt}, written by a newer kafka-monitor; this one reads formats "
            f"1..{_FORMAT}: run the newer version, or start from a new checkpoint directory (alerts open "
            f"in the old one are then raised again)")
    while fmt < _FORMAT:
        v = _MIGRATIONS[fmt](v)
        fmt = v["format"]
    entities = v["entities"]
    table = PartitionTable(v["partitions"], run_id=run_id)
    if v.get("fields") != FIELDS:
        _complete(entities, table)
    return entities, table, v.get("run")


def _load(state: Any, run_id: str) -> tuple[dict[str, Any], PartitionTable, Optional[str]]:
    return _unpack(state.get[0], run_id) if state.exists else ({}, PartitionTable(run_id=run_id), run_id)


def _store(state: Any, entities: dict, table: PartitionTable, cfg: StateConfig, compact: bool = True,
           bucket: int = 0) -> dict:
    """Write the bucket back; ``compact``: quiet dict partitions go into the table.  Returns the
    bucket's ``state`` row: its entities by kind (``report``, JSON) and stored bytes (``count``)."""
    partitions = table.state(entities if compact else {}, cfg.partition)
    kinds: dict[str, int] = {}
    for v in entities.values():
        kinds[v["kind"]] = kinds.get(v["kind"], 0) + 1
    size = 0
    if entities or len(partitions["keys"]):
        value = encode_state({"format": _FORMAT, "entities": entities, "partitions": partitions, "run": cfg.run_id,
                              "fields": FIELDS})
        size = len(value)
        state.update((value,))
        state.setTimeoutDuration(cfg.tick_ms)
        if len(partitions["keys"]):
            kinds["partition"] = kinds.get("partition", 0) + len(partitions["keys"])
    else:
        state.remove()
    return _row(kind="state", action="count", count=size,
                report=json.dumps({"bucket": bucket, "entities": kinds}, sort_keys=True))


def stored_entities(value: bytes, run_id: str = "") -> dict[str, Any]:
    """Every entity of a stored bucket state as a dict, the table's partitions included (for
    tests and debugging)."""
    entities, table, _ = _unpack(value, run_id)
    return {**entities, **{k: table.peek(k) for k in table.live_keys()}}


def make_state_function(cfg: StateConfig, compact_partitions: bool = True) -> Callable[..., Iterator[pd.DataFrame]]:
    """The function handed to ``applyInPandasWithState`` (a closure over its settings).
    ``compact_partitions=False`` keeps every partition a dict and folds every row through the
    dict rules: the reference ``tests/unit/test_partition_table.py`` checks the partition
    table against."""

    def update_bucket(key: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        with gc_paused():
            yield from _update_bucket(key, pdfs, state)

    def _update_bucket(key: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        bucket = int(key[0])
        if state.hasTimedOut:
            entities, table, run = _load(state, cfg.run_id)
            now = int(state.getCurrentProcessingTimeMs())
            entities.update(table.take_due(now, cfg.entity_ttl_ms))
            transitions = tick(entities, now, cfg)
            remember_shown(entities, transitions)
            gone, out = evict_stale(entities, now, cfg.entity_ttl_ms)
            transitions += gone
            out += removed_rows(out, now)
            if run != cfg.run_id:  # a new run: its exporter has not seen the alerts still open
                out += active_rows(entities)
            out.append(_store(state, entities, table, cfg, compact_partitions, bucket))
            yield _frame(_transition_columns(transitions), out)
            return
        if bucket == QUARANTINE_BUCKET:
            yield _frame(quarantine_rows(pdfs))
            return
        frames = [f for f in pdfs if len(f)]
        entities, table, run = _load(state, cfg.run_id)
        now = int(max(f["observed_at"].max() for f in frames))
        dropped: dict[str, int] = {}
        # quiet rows first (the table is empty unless compact_partitions): fold_new then looks at
        # the few rows left, not at every row of the bucket; it takes no row fold_quiet would
        frames, quiet = fold_quiet(table, frames)
        born = np.empty(0, np.int64)
        if compact_partitions:
            frames, born = fold_new(table, entities, frames, cfg)
        quiet = np.concatenate([born, quiet])
        forgotten: list[tuple[str, dict]] = []
        transitions, touched = fold(entities, frames, cfg, dropped, take=table.take, removed=forgotten)
        entities.update(table.take_due(now, cfg.entity_ttl_ms))
        transitions += tick(entities, now, cfg)
        remember_shown(entities, transitions)
        out = changed_entity_rows(entities, touched, cfg.run_id)
        if len(quiet):
            out.append(pack_block(table.gauge_columns(quiet)))
        gone, evicted = evict_stale(entities, now, cfg.entity_ttl_ms)
        transitions += gone
        # an entity forgotten and then seen again in this batch (re-created) keeps its series
        removed = [r for k, r in forgotten if k not in entities and k not in table] + evicted
        after = dropped_rows(dropped, now) + removed + removed_rows([r for _, r in forgotten] + evicted, now)
        if run != cfg.run_id:  # a new run: its exporter has not seen the alerts still open
            after += active_rows(entities)
        after.append(_store(state, entities, table, cfg, compact_partitions, bucket))
        yield _frame(_transition_columns(transitions), out, after)

    return update_bucket
