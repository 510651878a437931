"""Raw events -> flat, checked rows, in one Python pass over Arrow (the job's ``mapInArrow``):
``pyarrow.json`` decoding into the contract's schema, the flat columns the state reads
(``FLAT_COLUMNS``), a ``reason`` for what decoding can see (``REASONS``), partition-count
changes as rows of their own, then the great-expectations gate (``streaming.ingest.quality``).
What a bad value becomes and what a record can make the job keep: docs/ingest.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyspark.sql.pandas.types import to_arrow_schema

from monitor.contract import EVENT_TYPES, MAX_ROWS_PER_RECORD, SCHEMA_V3, SUPPORTED_SCHEMAS
from monitor.gcpause import gc_paused
from streaming.ingest import packing, quality
from streaming.ingest.schema import EVENT_SCHEMA, FLAT_COLUMNS

#: a task's rows are decoded and validated together, up to this many at a time
MAX_ROWS_PER_CHUNK = 200_000
#: ... and up to this many bytes of values
MAX_BYTES_PER_CHUNK = 64 << 20
#: a refused row keeps at most this much of its text for the quarantine
RAW_SAMPLE_CHARS = 2048
#: at most this many refused rows of a chunk keep a sample (all are counted)
RAW_SAMPLES_PER_CHUNK = 2000
#: identifiers longer than this are refused (field_too_long); free text is cut to it
MAX_STRING_CHARS = 1024
#: envelope and payload fields that become state keys, metric labels or enum values
IDENTIFIER_FIELDS = ("event_id", "cluster", "source", "topic", "group", "state", "phase", "member_id", "reason",
                     "ha_group")
#: free-text payload fields, cut to MAX_STRING_CHARS
TEXT_FIELDS = ("cause", "error", "fetch_state", "held_by_transaction")
#: the reasons parse gives, in priority order (the first that applies wins); the gate's
#: rules (quality.RULES) come after them
REASONS = ("oversized", "malformed_json", "unknown_schema", "unknown_type", "missing_envelope", "missing_field",
           "out_of_range", "field_too_long", "event_time_ahead", "event_time_behind")


@dataclass(frozen=True)
class Limits:
    """The job settings parsing applies (``JobConfig.max_event_bytes``, ``max_clock_skew_s``)."""
    max_event_bytes: int = 65_536
    #: |observed_at - the record's timestamp| at most this (ms); 0: not checked
    max_clock_skew_ms: int = 300_000


LIMITS = Limits()
#: a failing block of at most this many values is decoded value by value (no more splitting)
_SPLIT_FLOOR = 32

_INT64 = (-(1 << 63), (1 << 63) - 1)
#: integers beyond this are out_of_range: the state function gets nullable longs as float64
#: (Spark's applyInPandasWithState), exact only up to 2**53
MAX_SAFE_INT = (1 << 53) - 1

#: payload fields each event type must carry (else ``missing_field``)
REQUIRED_BY_TYPE = {
    "partition_metadata": ("topic", "partition", "leader", "replicas", "isr"),
    "partition_offsets": ("topic", "partition", "high_watermark"),
    "group_offsets": ("group", "topic", "partition"),
    "client_fetch": ("group", "topic", "partition"),
    "canary": ("topic", "partition", "started_at"),
    "broker_state": ("node_id", "registered", "leader_partitions", "replica_partitions", "out_of_sync_replicas"),
    "client_produce": ("topic", "partition"),  # counters missing from a report: not served
    "group_state": ("group", "state"),
    "rebalance": ("group", "phase"),
    "metadata_refresh": ("version", "reason", "ok"),
    "heartbeat": ("interval_ms",),
    "partition_gone": ("topic", "partition"),
    "group_gone": ("group",),
    "group_partition_gone": ("group", "topic", "partition"),
    "quorum_state": ("ok", "interval_ms"),
    "log_dirs": ("broker", "interval_ms"),
    "transactions": ("ok", "interval_ms"),
    "ha_member": ("ha_group", "shards", "interval_ms", "held", "epochs"),
}
_ENVELOPE = ("event_id", "cluster", "source", "seq", "observed_at")


#: the event as Arrow decodes it
EVENT_ARROW = to_arrow_schema(EVENT_SCHEMA)
_DATA = EVENT_ARROW.field("data").type
_ROWS = EVENT_ARROW.field("rows").type
#: the events table ``_explode`` returns: a v3 record's rows spread into events
EVENTS_ARROW = pa.schema([f for f in EVENT_ARROW if f.name != "rows"])
_FLAT_TYPES = {"string": pa.string(), "bigint": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
               "array<bigint>": pa.list_(pa.int64())}
#: the rows this module returns (the Spark schema of ``job.parse``'s output)
FLAT_ARROW = pa.schema([(n, _FLAT_TYPES[t]) for n, t in FLAT_COLUMNS])
FLAT_DDL = ", ".join(f"`{n}` {t}" for n, t in FLAT_COLUMNS)

#: decoding options per schema: a record that cannot be v3 is decoded without ``rows`` (its 114
#: list fields would double pyarrow's time per record)
_PARSE_OPTIONS = {id(s): pj.ParseOptions(explicit_schema=s, unexpected_field_behavior="ignore")
                  for s in (EVENT_ARROW, EVENTS_ARROW)}
_READ_OPTIONS = pj.ReadOptions(use_threads=False, block_size=1 << 24)  # one thread: Spark runs a task per core


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


def _coerce(v: Any, t: pa.DataType) -> Any:
    """``v`` (from json.loads) as a value of Arrow type ``t``, or None when it has another type."""
    if v is None:
        return None
    if pa.types.is_int64(t):
        return v if type(v) is int and _INT64[0] <= v <= _INT64[1] else None
    if pa.types.is_string(t):
        return v if type(v) is str else None
    if pa.types.is_float64(t):
        return float(v) if type(v) in (int, float) else None
    if pa.types.is_boolean(t):
        return v if type(v) is bool else None
    if pa.types.is_list(t):
        if type(v) is not list:
            return None
        out = []
        for x in v:
            y = _coerce(x, t.value_type)
            if y is None and x is not None:
                return None  # one wrong-typed element: the whole array is null
            out.append(y)
        return out
    if pa.types.is_struct(t):
        if type(v) is not dict:
            return None
        return {f.name: _coerce(v.get(f.name), f.type) for f in t}
    raise TypeError(f"no coercion to {t}")


def decode_one(value: Optional[str], schema: pa.Schema = EVENT_ARROW) -> Optional[dict]:
    """One value -> the event as a dict of the schema's fields, or None if it is not a JSON object."""
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if type(obj) is not dict:
        return None
    return {f.name: _coerce(obj.get(f.name), f.type) for f in schema}


def _object_shaped(v: Optional[str]) -> bool:
    if not v or "\n" in v or "\r" in v:
        return False
    s = v.strip()
    return s[:1] == "{" and s[-1:] == "}"


def _bulk(lines: list[str], schema: pa.Schema) -> Optional[pa.Table]:
    try:
        t = pj.read_json(pa.BufferReader("\n".join(lines).encode()), read_options=_READ_OPTIONS,
                         parse_options=_PARSE_OPTIONS[id(schema)])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    # a line holding two objects decodes as two rows: the block is then split like a bad one
    return t if t.num_rows == len(lines) else None


def _decode_run(lines: list[str], pieces: list, schema: pa.Schema) -> None:
    """Decode object-shaped values, splitting a failing block until its bad values are alone.
    A run is tried whole first, however short: a decode with the events' schema costs ~2 ms
    before its first byte, so 20 values one by one cost ~35 ms, together ~2 ms."""
    t = _bulk(lines, schema) if len(lines) > 1 else None
    if t is not None:
        pieces.append(t)
    elif len(lines) > _SPLIT_FLOOR:
        mid = len(lines) // 2
        _decode_run(lines[:mid], pieces, schema)
        _decode_run(lines[mid:], pieces, schema)
    else:
        for line in lines:
            one = _bulk([line], schema)
            pieces.append(one if one is not None else [decode_one(line, schema)])


def decode(values: list[Optional[str]], schema: pa.Schema = EVENT_ARROW) -> tuple[pa.Table, np.ndarray]:
    """Values -> (events table of ``schema`` (EVENT_ARROW or EVENTS_ARROW), one row per value;
    mask of values that were a JSON object).  A value that was not has all-null fields in its row."""
    pieces: list = []  # tables, and lists of per-value dicts (None: not an object)
    run: list[str] = []
    for v in values:
        if v is not None and _object_shaped(v):
            run.append(v)
            continue
        if run:
            _decode_run(run, pieces, schema)
            run = []
        pieces.append([decode_one(v, schema)])
    if run:
        _decode_run(run, pieces, schema)
    tables, valid = [], []
    pending: list = []

    def flush() -> None:
        if pending:
            tables.append(pa.Table.from_pylist([d or {} for d in pending], schema=schema))
            valid.append(np.array([d is not None for d in pending], dtype=bool))
            pending.clear()

    for p in pieces:
        if isinstance(p, list):
            pending.extend(p)
        else:
            flush()
            tables.append(p)
            valid.append(np.ones(p.num_rows, dtype=bool))
    flush()
    if not tables:
        return schema.empty_table(), np.zeros(0, dtype=bool)
    return pa.concat_tables(tables).combine_chunks(), np.concatenate(valid)


def decode_records(texts: list[Optional[str]], text: pa.Array) -> tuple[pa.Table, np.ndarray]:
    """``decode`` into EVENT_ARROW, the values that cannot be v3 without ``rows`` (faster): a v3
    value holds the text ``kafka-monitor/v3`` unless it escapes a character (a backslash)."""
    n = len(texts)
    maybe = pc.fill_null(pc.or_(pc.match_substring(text, SCHEMA_V3), pc.match_substring(text, "\\")),
                         False).to_numpy(zero_copy_only=False)
    if maybe.all():
        return decode(texts, EVENT_ARROW)
    if not maybe.any():
        events, valid = decode(texts, EVENTS_ARROW)
        return events.append_column(EVENT_ARROW.field("rows"), pa.nulls(n, _ROWS)), valid
    v3, plain = np.flatnonzero(maybe), np.flatnonzero(~maybe)
    e3, ok3 = decode([texts[i] for i in v3], EVENT_ARROW)
    e1, ok1 = decode([texts[i] for i in plain], EVENTS_ARROW)
    e1 = e1.append_column(EVENT_ARROW.field("rows"), pa.nulls(len(plain), _ROWS))
    order = np.empty(n, np.int64)
    order[plain] = np.arange(len(plain))
    order[v3] = len(plain) + np.arange(len(v3))
    return pa.concat_tables([e1, e3]).take(pa.array(order)).combine_chunks(), np.concatenate([ok1, ok3])[order]


# ---------------------------------------------------------------------------------------------
# Flattening
# ---------------------------------------------------------------------------------------------


def _join(*parts: Any) -> pa.Array:
    """String concatenation of columns and literals; null if any part is null (Spark's
    ``concat``).  Every part of a good row's key is present (the required-field checks above),
    so a null key only occurs on a refused row, which is not keyed.  (``null_handling="skip"``,
    Spark's ``concat_ws``, is not used: in pyarrow 26.0.1 it returns an array shorter than its
    inputs when they hold nulls.)"""
    return pc.binary_join_element_wise(*parts, "", null_handling="emit_null")


def _is(col: pa.Array, values: Any) -> np.ndarray:
    """Membership as a numpy bool mask (null -> False)."""
    return pc.fill_null(pc.is_in(col, value_set=pa.array(list(values), type=col.type)), False).to_numpy(
        zero_copy_only=False)


def _null(col: pa.Array) -> np.ndarray:
    return pc.is_null(col).to_numpy(zero_copy_only=False)


def _negative(col: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.less(col, 0), False).to_numpy(zero_copy_only=False)


def _beyond(col: pa.Array) -> np.ndarray:
    """Integers (or lists of them) outside +-MAX_SAFE_INT, per row."""
    if pa.types.is_list(col.type):
        elems = pc.list_flatten(col)
        bad = _beyond(elems)
        out = np.zeros(len(col), bool)
        if bad.any():
            out[np.unique(pc.list_parent_indices(col).to_numpy(zero_copy_only=False)[bad])] = True
        return out
    lo_hi = pc.min_max(col).as_py()  # one call for the common case: nothing out of range
    if lo_hi["min"] is None or (lo_hi["min"] >= -MAX_SAFE_INT and lo_hi["max"] <= MAX_SAFE_INT):
        return np.zeros(len(col), bool)
    far = pc.or_(pc.greater(col, MAX_SAFE_INT), pc.less(col, -MAX_SAFE_INT))
    return pc.fill_null(far, False).to_numpy(zero_copy_only=False)


def _int_fields(t: pa.DataType) -> bool:
    return pa.types.is_int64(t) or (pa.types.is_list(t) and pa.types.is_int64(t.value_type))


def _too_long(col: pa.Array) -> np.ndarray:
    if col.null_count == len(col) or pc.max(pc.binary_length(col)).as_py() <= MAX_STRING_CHARS:
        return np.zeros(len(col), bool)  # no longer in bytes, so none in characters
    return pc.fill_null(pc.greater(pc.utf8_length(col), MAX_STRING_CHARS), False).to_numpy(zero_copy_only=False)


def _cut(col: pa.Array) -> pa.Array:
    """Free text cut to MAX_STRING_CHARS (a copy only when something is longer)."""
    if not _too_long(col).any():
        return col
    return pc.utf8_slice_codeunits(col, 0, MAX_STRING_CHARS)


def _skewed(observed_at: pa.Array, record_ts: Optional[pa.Array], skew_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """(observed_at more than ``skew_ms`` after the record's timestamp, more than that before it);
    False where either is unknown (a timestamp <= 0 is Kafka's "none")."""
    n = len(observed_at)
    if record_ts is None or skew_ms <= 0:
        return np.zeros(n, bool), np.zeros(n, bool)
    ts = pc.cast(record_ts, pa.float64(), safe=False).to_numpy(zero_copy_only=False)  # null -> NaN
    obs = pc.cast(observed_at, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    known = ~np.isnan(ts) & (ts > 0) & ~np.isnan(obs)
    diff = np.where(known, obs - np.where(known, ts, 0), 0.0)  # float: no int64 overflow
    return known & (diff > skew_ms), known & (diff < -skew_ms)


def flatten(events: pa.Table, valid: np.ndarray, raw: pa.Array, size: Optional[pa.Array] = None,
            oversized: Optional[np.ndarray] = None, record_ts: Optional[pa.Array] = None,
            limits: Limits = LIMITS, uneven: Optional[np.ndarray] = None,
            too_many: Optional[np.ndarray] = None) -> tuple[pa.Table, np.ndarray]:
    """The decoded events -> FLAT_ARROW rows: one per event, then one per partition-count
    change of each good metadata refresh; ``reason`` as decoding sees it; ``raw`` (a sample)
    and ``raw_bytes`` (``size``, the value's length) kept on all.  ``oversized``: the values
    that were not decoded for their size; ``record_ts``: the records' Kafka timestamps (ms);
    ``uneven`` / ``too_many``: v3 records whose rows were not spread (``_row_counts``).  With the
    rows, for each derived row the position of the event it came from."""
    n = events.num_rows
    no = np.zeros(n, bool)
    uneven = no if uneven is None else uneven
    too_many = no if too_many is None else too_many
    env = {name: events.column(name).combine_chunks() for name in events.column_names}
    data = env["data"]
    d = {f.name: pc.struct_field(data, f.name) for f in _DATA}
    for f in TEXT_FIELDS:
        d[f] = _cut(d[f])
    etype, schema = env["type"], env["schema"]
    size = pa.nulls(n, pa.int64()) if size is None else size

    missing_payload = np.zeros(n, dtype=bool)
    is_type = {t: _is(etype, [t]) for t in REQUIRED_BY_TYPE}
    for t, fields in REQUIRED_BY_TYPE.items():
        if is_type[t].any():
            gap = np.zeros(n, dtype=bool)
            for f in fields:
                gap |= _null(d[f])
            missing_payload |= is_type[t] & gap
    reasons = np.full(n, None, dtype=object)
    ahead, behind = _skewed(env["observed_at"], record_ts, limits.max_clock_skew_ms)
    too_long = np.logical_or.reduce([_too_long(env[c] if c in env else d[c]) for c in IDENTIFIER_FIELDS])
    huge = np.logical_or.reduce([_beyond(env["seq"]), _beyond(env["observed_at"]), _beyond(env["epoch"]),
                                 _beyond(env["shard"]), _negative(env["shard"]), _negative(env["epoch"])]
                                + [_beyond(d[f.name]) for f in _DATA if _int_fields(f.type)])
    # the first matching condition wins: assign in reverse priority order
    conds = [
        ("event_time_behind", behind),
        ("event_time_ahead", ahead),
        ("field_too_long", too_long),
        ("out_of_range", huge | _negative(d["partition"]) | _negative(d["high_watermark"])
         | _negative(d["committed_offset"]) | too_many),
        ("missing_field", _null(data) | missing_payload | uneven),
        ("missing_envelope", np.logical_or.reduce([_null(env[c]) for c in _ENVELOPE])
         | (_null(env["shard"]) != _null(env["epoch"]))),  # shard and epoch come together
        ("unknown_type", ~_is(etype, EVENT_TYPES)),
        ("unknown_schema", ~_is(schema, SUPPORTED_SCHEMAS)),
        ("malformed_json", ~valid | (_null(schema) & _null(etype))),
        ("oversized", np.zeros(n, bool) if oversized is None else oversized),
    ]
    assert tuple(c[0] for c in reversed(conds)) == REASONS
    for name, cond in conds:
        reasons[cond] = name

    cl, src_name = env["cluster"], env["source"]
    tp = _join(cl, "/", d["topic"], "/", pc.cast(d["partition"], pa.string()))
    grp = _join(cl, "/", d["group"])
    src = _join(cl, "/", src_name)
    part_types = _is(etype, ("partition_metadata", "partition_offsets", "partition_gone"))
    canary_type = is_type["canary"]
    produce_type = is_type["client_produce"]
    broker_type = is_type["broker_state"]
    brk = _join(cl, "/broker/", pc.cast(d["node_id"], pa.string()))
    gp_type = _is(etype, ("group_offsets", "group_partition_gone"))
    group_types = _is(etype, ("group_state", "rebalance", "group_gone"))
    client_type = is_type["metadata_refresh"]
    quorum_type = is_type["quorum_state"]
    dirs_type = is_type["log_dirs"]
    dirs_brk = _join(cl, "/broker/", pc.cast(d["broker"], pa.string()))
    txn_type = is_type["transactions"]
    ha_type = is_type["ha_member"]
    ha = _join(cl, "/ha:", d["ha_group"])
    fetch_type = is_type["client_fetch"]
    gtp = _join(grp, "/", d["topic"], "/", pc.cast(d["partition"], pa.string()))
    entity = pc.if_else(part_types, _join("partition|", tp),
              pc.if_else(canary_type, _join("canary|", tp),
              pc.if_else(produce_type, _join("client_produce|", cl, "/", src_name, "/", d["topic"], "/",
                                             pc.cast(d["partition"], pa.string())),
              pc.if_else(broker_type, _join("broker|", brk),
              pc.if_else(gp_type, _join("group_partition|", gtp),
              pc.if_else(fetch_type, _join("client_fetch|", gtp),
              pc.if_else(group_types, _join("group|", grp),
              pc.if_else(client_type, _join("client|", src),
              pc.if_else(quorum_type, _join("quorum|", cl),
              pc.if_else(dirs_type, _join("log_dirs|", dirs_brk),
              pc.if_else(txn_type, _join("transactions|", cl),
              pc.if_else(ha_type, _join("ha|", ha), _join("source|", src)))))))))))))
    bucket_key = pc.if_else(part_types | canary_type | produce_type, tp, pc.if_else(broker_type, brk, pc.if_else(
        gp_type | group_types | fetch_type, grp, pc.if_else(quorum_type | txn_type, cl,
                                                            pc.if_else(dirs_type, dirs_brk,
                                                                       pc.if_else(ha_type, ha, src))))))

    cols: dict[str, Any] = {
        "reason": pa.array(reasons, type=pa.string()), "raw": raw, "raw_bytes": size, "entity": entity,
        "bucket_key": bucket_key,
        "type": etype, "event_id": env["event_id"], "cluster": cl, "source": src_name, "seq": env["seq"],
        "shard": env["shard"], "epoch": env["epoch"],
        "observed_at": env["observed_at"], "group_state": d["state"],
        "members": pc.cast(pc.list_value_length(d["members"]), pa.int64()), "refresh_reason": d["reason"],
        "members_sig": _members_sig(d["members"], is_type["group_state"]),
        "report": _report(data, canary_type, produce_type, broker_type, quorum_type,
                          _elr_rows(d, is_type["partition_metadata"]), dirs_type, txn_type, ha_type),
        "node_id": pc.if_else(dirs_type, d["broker"], d["node_id"]),
    }
    out = pa.table({name: cols[name] if name in cols else (d[name] if name in d else pa.nulls(n, typ))
                    for name, typ in zip(FLAT_ARROW.names, FLAT_ARROW.types)}, schema=FLAT_ARROW)
    derived, sources = _count_changes(env, d, client_type & pd.isna(reasons), raw, size)
    return (pa.concat_tables([out, derived]) if derived.num_rows else out), sources


#: the report fields the job keeps of a canary (streaming/rules/canary.py) and a client_produce
#: (streaming/rules/produce.py) event, as one JSON text
REPORT_FIELDS = {
    "canary": ("started_at", "leader", "sent", "acked", "received", "lost", "duplicated", "out_of_order",
               "pending", "oldest_pending_ms", "produce_latency_counts", "produce_latency_sum_ms",
               "e2e_latency_counts", "e2e_latency_sum_ms", "lost_after_ms"),
    "client_produce": ("leader", "queued_messages", "in_flight_messages", "sent_messages", "sent_bytes",
                       "leader_rtt_avg_ms", "leader_rtt_p99_ms", "leader_queue_latency_p99_ms",
                       "leader_request_errors", "leader_request_retries", "leader_request_timeouts",
                       "delivered_messages", "delivery_latency_counts", "delivery_latency_sum_ms"),
    "broker_state": ("writes_waiting_since", "writes_waiting_partitions"),
    "quorum_state": ("ok", "interval_ms", "leader_id", "leader_epoch", "high_watermark", "voters", "observers",
                     "error", "error_kind"),
    # only for a partition without a leader or a full ISR whose ELR the probe knew (_elr_rows)
    "partition_metadata": ("eligible_leader_replicas", "last_known_elr"),
    "log_dirs": ("interval_ms", "dirs"),
    "transactions": ("ok", "interval_ms", "transactions", "transactions_count", "held_partitions",
                     "held_partitions_count", "unasked_partitions", "unlisted_brokers", "error", "error_kind"),
    "ha_member": ("shards", "held", "epochs", "watched", "handovers"),
}
#: shards kept per ha_member report (a probe's group has at most 1024)
HA_MAX_SHARDS = 1024
#: transactions and held partitions kept per transactions report (the probe sends at most 1000 of
#: each, within 60,000 bytes), partition names per transaction (it sends at most 100)
TXN_MAX, TXN_MAX_HELD, TXN_MAX_NAMED = 1000, 1000, 100
#: dirs kept per log_dirs report, partition names per dir (the probe sends at most 64 and 20)
LOG_DIRS_MAX, LOG_DIR_MAX_NAMED = 64, 20
#: voters and observers kept per quorum report (a quorum has 3 or 5 voters; observers are the brokers)
QUORUM_MAX_REPLICAS = 1000
#: error codes kept per canary report (librdkafka's names are short; the rest is cut)
CANARY_MAX_CODES, CANARY_CODE_CHARS = 16, 64


def _elr_rows(d: dict, rows: np.ndarray) -> np.ndarray:
    """The ``partition_metadata`` rows with an ELR (the probe knew it) and no leader or a short ISR:
    the only ones where it can matter (a full ISR leaves no replica to be eligible)."""
    if not rows.any():
        return rows
    known = ~_null(d["eligible_leader_replicas"])
    short = pc.fill_null(pc.less(pc.list_value_length(d["isr"]), pc.list_value_length(d["replicas"])), False)
    return rows & known & (_negative(d["leader"]) | short.to_numpy(zero_copy_only=False))


#: replica ids kept per ELR list (a partition has a handful of replicas)
ELR_MAX_REPLICAS = 64


def _report(data: pa.Array, canary: np.ndarray, produce: np.ndarray, broker: np.ndarray,
            quorum: np.ndarray, elr: Optional[np.ndarray] = None, dirs: Optional[np.ndarray] = None,
            txns: Optional[np.ndarray] = None, ha: Optional[np.ndarray] = None) -> pa.Array:
    """For each ``canary``, ``client_produce`` and ``broker_state`` row, its report as JSON (``REPORT_FIELDS``; a
    canary's ``errors`` and a producer's ``delivery_errors`` as {code: count}: at most CANARY_MAX_CODES codes of at most
    CANARY_CODE_CHARS characters, as they become label values).  Few rows (one per canary or
    produced-to partition per report): a Python loop."""
    out: list[Optional[str]] = [None] * len(data)
    for rows, fields in ((canary, REPORT_FIELDS["canary"]), (produce, REPORT_FIELDS["client_produce"]),
                         (broker, REPORT_FIELDS["broker_state"]), (quorum, REPORT_FIELDS["quorum_state"]),
                         (elr if elr is not None else np.zeros(len(data), bool), REPORT_FIELDS["partition_metadata"]),
                         (dirs if dirs is not None else np.zeros(len(data), bool), REPORT_FIELDS["log_dirs"]),
                         (txns if txns is not None else np.zeros(len(data), bool), REPORT_FIELDS["transactions"]),
                         (ha if ha is not None else np.zeros(len(data), bool), REPORT_FIELDS["ha_member"])):
        for i in np.flatnonzero(rows):
            d = data[int(i)].as_py() or {}
            rep = {f: d.get(f) for f in fields}
            if rows is canary or rows is produce:
                name = "errors" if rows is canary else "delivery_errors"
                errors: dict[str, int] = {}
                for e in (d.get(name) or [])[:CANARY_MAX_CODES]:
                    code, n = (e or {}).get("code"), (e or {}).get("count")
                    if isinstance(code, str) and isinstance(n, int):
                        errors[code[:CANARY_CODE_CHARS]] = n
                rep[name] = errors
            if rows is quorum:
                rep["error"] = (rep["error"] or "")[:MAX_STRING_CHARS] or None
                for role in ("voters", "observers"):
                    rep[role] = [r for r in (rep[role] or [])[:QUORUM_MAX_REPLICAS]
                                 if isinstance(r, dict) and isinstance(r.get("replica_id"), int)]
            if rows is dirs:
                rep["dirs"] = [_log_dir(x) for x in (rep["dirs"] or [])[:LOG_DIRS_MAX] if isinstance(x, dict)
                               and isinstance(x.get("log_dir"), str)]
            if rows is txns:
                rep["error"] = (rep["error"] or "")[:MAX_STRING_CHARS] or None
                rep["transactions"] = [_transaction(x) for x in (rep["transactions"] or [])[:TXN_MAX]
                                       if isinstance(x, dict) and isinstance(x.get("transactional_id"), str)
                                       and isinstance(x.get("producer_id"), int)]
                rep["held_partitions"] = [
                    {k: x.get(k) for k in _HELD_FIELDS} | {"topic": x["topic"][:MAX_STRING_CHARS]}
                    for x in (rep["held_partitions"] or [])[:TXN_MAX_HELD] if isinstance(x, dict)
                    and isinstance(x.get("topic"), str) and isinstance(x.get("partition"), int)
                    and isinstance(x.get("producer_id"), int) and isinstance(x.get("first_offset"), int)]
                rep["unlisted_brokers"] = [b for b in (rep["unlisted_brokers"] or [])[:TXN_MAX] if isinstance(b, int)]
            if rows is ha:  # held, epochs and watched: parallel lists of ints
                for f in ("held", "epochs", "watched"):
                    rep[f] = [x if isinstance(x, int) else None for x in (rep[f] or [])[:HA_MAX_SHARDS]]
            if rows is elr:
                rep = {f: sorted({r for r in (rep[f] or [])[:ELR_MAX_REPLICAS] if isinstance(r, int)}) for f in fields}
            out[i] = json.dumps(rep, separators=(",", ":"))
    return pa.array(out, type=pa.string())


_HELD_FIELDS = ("partition", "producer_id", "producer_epoch", "first_offset", "last_stable_offset", "high_watermark")


def _transaction(x: dict) -> dict:
    """One transaction of a transactions report, bounded: its id cut to MAX_STRING_CHARS, at most
    TXN_MAX_NAMED partition names."""
    out = {k: x.get(k) for k in ("producer_id", "state", "coordinator", "described", "producer_epoch",
                                 "started_ms_ago", "timeout_ms", "partitions_count")}
    out["transactional_id"] = x["transactional_id"][:MAX_STRING_CHARS]
    out["state"] = out["state"][:64] if isinstance(out["state"], str) else None
    out["partitions"] = [p[:MAX_STRING_CHARS] for p in (x.get("partitions") or [])[:TXN_MAX_NAMED]
                         if isinstance(p, str)]
    return out


def _log_dir(x: dict) -> dict:
    """One dir of a log_dirs report, bounded: its path and error cut to MAX_STRING_CHARS, at most
    LOG_DIR_MAX_NAMED partition names."""
    out = {k: x.get(k) for k in ("online", "total_bytes", "usable_bytes", "held_replicas", "held_bytes",
                                 "moving_replicas")}
    out["log_dir"] = x["log_dir"][:MAX_STRING_CHARS]
    out["error"] = (x.get("error") or "")[:MAX_STRING_CHARS] or None
    out["held_partitions"] = [p[:MAX_STRING_CHARS] for p in (x.get("held_partitions") or [])[:LOG_DIR_MAX_NAMED]
                              if isinstance(p, str)]
    return out


def _members_sig(members: pa.Array, rows: np.ndarray) -> pa.Array:
    """For each ``group_state`` row, a fingerprint of its members and their assignments (member
    ids and partitions, sorted): two settled observations with different fingerprints mean the
    group went through a rebalance between them (membership only changes through one).  Few
    rows (one per group per probe cycle): a Python loop."""
    out: list[Optional[str]] = [None] * len(members)
    for i in np.flatnonzero(rows):
        ms = members[int(i)].as_py()
        if ms is None:
            continue
        key = sorted(((m or {}).get("member_id") or "", sorted(str(a) for a in (m or {}).get("assignment") or [])) for m in ms)
        out[i] = hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()
    return pa.array(out, type=pa.string())


def _count_changes(env: dict, d: dict, refreshes: np.ndarray, raw: pa.Array,
                   size: pa.Array) -> tuple[pa.Table, np.ndarray]:
    """One row per entry of a good metadata refresh's ``partition_count_changes`` (keyed by
    topic): the event's envelope and the change; an entry without a topic or counts is
    ``missing_field``, one whose topic is too long ``field_too_long``.  With each row, the
    position of its refresh."""
    nothing = (FLAT_ARROW.empty_table(), np.zeros(0, np.int64))
    idx = np.flatnonzero(refreshes)
    if idx.size == 0:
        return nothing
    lists = d["partition_count_changes"].take(pa.array(idx))
    parents = pc.list_parent_indices(lists)
    if len(parents) == 0:
        return nothing
    rows = pa.array(idx).take(parents)
    ch = pc.list_flatten(lists)
    m = len(ch)
    topic = pc.struct_field(ch, "topic")
    cl = env["cluster"].take(rows)
    missing = _null(ch) | _null(topic) | _null(pc.struct_field(ch, "old_count")) | _null(pc.struct_field(ch, "new_count"))
    huge = np.logical_or.reduce([_beyond(pc.struct_field(ch, f))
                                 for f in ("old_count", "new_count", "unseen_for_at_most_ms")])
    bad = missing | huge | _too_long(topic)
    none = np.full(len(bad), None, dtype=object)
    why = np.where(missing, "missing_field", np.where(huge, "out_of_range", np.where(bad, "field_too_long", none)))
    reason = pa.array(why, type=pa.string())
    cols = {
        "reason": reason, "raw": pc.if_else(pa.array(bad), raw.take(rows), pa.nulls(m, pa.string())),
        "raw_bytes": pc.if_else(pa.array(bad), size.take(rows), pa.nulls(m, pa.int64())),
        "entity": _join("topic|", cl, "/", topic), "bucket_key": _join(cl, "/", topic),
        "type": pa.array(["partition_count_change"] * m, type=pa.string()), "topic": topic,
        "old_count": pc.struct_field(ch, "old_count"), "new_count": pc.struct_field(ch, "new_count"),
        "unseen_for_at_most_ms": pc.struct_field(ch, "unseen_for_at_most_ms"),
    }
    for name in ("event_id", "cluster", "source", "seq", "observed_at"):
        cols[name] = env[name].take(rows)
    return pa.table({name: cols[name] if name in cols else pa.nulls(m, typ)
                     for name, typ in zip(FLAT_ARROW.names, FLAT_ARROW.types)},
                    schema=FLAT_ARROW), rows.to_numpy(zero_copy_only=False).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# The task function
# ---------------------------------------------------------------------------------------------


def _texts(values: pa.Array) -> tuple[list[Optional[str]], pa.Array]:
    """Values (string or binary) as Python strings and as an Arrow string array.  Bytes that are
    not UTF-8 become U+FFFD, as our source decodes them; Spark's ``cast(value as string)`` (the
    ``spark-kafka`` source) passes them through unchecked, and converting them would raise."""
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        try:
            return values.to_pylist(), values.cast(pa.string())
        except UnicodeDecodeError:
            values = values.cast(pa.binary())  # a view of the same bytes: no check
    texts = [None if b is None else b.decode("utf-8", "replace") for b in values.to_pylist()]
    return texts, pa.array(texts, pa.string())


def _samples(text: pa.Array, values: pa.Array, size: np.ndarray, oversized: np.ndarray) -> pa.Array:
    """Each value's first RAW_SAMPLE_CHARS characters, as text: from the decoded text, or for a
    value that was not decoded (oversized) from its first bytes, bad UTF-8 replaced."""
    if (size > RAW_SAMPLE_CHARS).any():  # a character is at least one byte
        text = pc.utf8_slice_codeunits(text, 0, RAW_SAMPLE_CHARS)
    idx = np.flatnonzero(oversized)
    if idx.size:
        head = pc.binary_slice(values.cast(pa.binary()), 0, RAW_SAMPLE_CHARS).take(pa.array(idx)).to_pylist()
        text = pc.replace_with_mask(text, pa.array(oversized),
                                    pa.array([b.decode("utf-8", "replace") for b in head], pa.string()))
    return text


def _row_counts(events: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per record: the events it stands for (a v3 record with good ``rows``: their length, else
    1), and masks of the v3 records spread, those whose rows are uneven (lists of different
    lengths, or empty: ``missing_field``) and those with more than MAX_ROWS_PER_RECORD
    (``out_of_range``)."""
    n = events.num_rows
    counts, no = np.ones(n, np.int64), np.zeros(n, bool)
    rows = events.column("rows").combine_chunks()
    v3 = _is(events.column("schema").combine_chunks(), [SCHEMA_V3]) & ~_null(rows)
    if not v3.any():
        return counts, no, no, no
    listed = [c for c in (pc.struct_field(rows, f.name) for f in _ROWS) if c.null_count < len(c)]
    if not listed:
        return counts, no, v3, no  # rows without a list: uneven
    lens = np.stack([pc.fill_null(pc.list_value_length(c), -1).to_numpy(zero_copy_only=False) for c in listed])
    longest = lens.max(axis=0)
    uneven = v3 & (((lens >= 0) & (lens != longest)).any(axis=0) | (longest <= 0))
    too_many = v3 & ~uneven & (longest > MAX_ROWS_PER_RECORD)
    spread = v3 & ~uneven & ~too_many
    counts[spread] = longest[spread]
    return counts, spread, uneven, too_many


def _explode(events: pa.Table, counts: np.ndarray, spread: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """Records -> events (EVENTS_ARROW): a spread v3 record becomes ``counts`` events, each its
    ``data`` with the fields of ``rows`` set to that event's values, under the record's envelope;
    any other record stays one event.  With each event, the position of its record."""
    n = events.num_rows
    if not spread.any():
        return events.drop_columns(["rows"]), np.arange(n, dtype=np.int64)
    parent = np.repeat(np.arange(n, dtype=np.int64), counts)
    within = np.arange(len(parent), dtype=np.int64) - (np.cumsum(counts) - counts)[parent]
    take = pa.array(parent)
    cols = {name: events.column(name).combine_chunks().take(take)
            for name in EVENTS_ARROW.names if name != "data"}
    data = events.column("data").combine_chunks()
    rows = events.column("rows").combine_chunks()
    children = []
    for f in _DATA:
        base = pc.struct_field(data, f.name).take(take)
        listed = pc.struct_field(rows, f.name)
        sel = (spread & ~_null(listed))[parent] if listed.null_count < len(listed) else None
        if sel is not None and sel.any():
            # a list's k-th value: .values[offsets[record] + k] (offsets index .values, slicing included)
            offsets = listed.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
            pick = np.where(sel, len(base) + offsets[parent] + within, np.arange(len(parent)))
            base = pa.concat_arrays([base, listed.values]).take(pa.array(pick))
        children.append(base)
    cols["data"] = pa.StructArray.from_arrays(children, fields=list(_DATA), mask=pc.is_null(data).take(take))
    return pa.table([cols[name] for name in EVENTS_ARROW.names], schema=EVENTS_ARROW), parent


def _spans(counts: np.ndarray, most: int) -> Iterator[tuple[int, int]]:
    """Runs of records [lo, hi) standing for at most ``most`` events each (or one record)."""
    ends = np.cumsum(counts)
    if not len(ends) or ends[-1] <= most:
        yield 0, len(counts)
        return
    lo = 0
    while lo < len(counts):
        before = ends[lo - 1] if lo else 0
        hi = max(int(np.searchsorted(ends, before + most, side="right")), lo + 1)
        yield lo, hi
        lo = hi


def parse_values(values: pa.Array, gate: bool = True, timestamps: Optional[pa.Array] = None,
                 limits: Limits = LIMITS) -> pa.Table:
    """Raw values (string or binary) -> checked FLAT_ARROW rows (``parse_pieces``, in one table).
    ``gate``: run the great-expectations suite too (rows it fails get its rule as their reason).
    ``timestamps``: the records' Kafka timestamps (epoch ms), for the event-time checks;
    ``limits``: the job's size and clock-skew settings."""
    pieces = [t for t, _ in parse_pieces(values, gate, timestamps, limits)]
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)


def parse_pieces(values: pa.Array, gate: bool = True, timestamps: Optional[pa.Array] = None,
                 limits: Limits = LIMITS) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """``parse_values`` a piece at a time: the records are decoded together, then their events
    are flattened and gated at most MAX_ROWS_PER_CHUNK at a time (v3 records spread into many).
    Each piece: the checked rows (its records' events in record order, then the rows derived
    from them) and, per row, the position of its record among ``values``."""
    n = len(values)
    size = pc.cast(pc.binary_length(values), pa.int64())
    size_np = pc.fill_null(size, 0).to_numpy(zero_copy_only=False)
    oversized = size_np > limits.max_event_bytes
    decodable = pc.if_else(pa.array(oversized), pa.nulls(n, values.type), values) if oversized.any() else values
    texts, text = _texts(decodable)
    events, valid = decode_records(texts, text)
    del texts
    raw = _samples(text, values, size_np, oversized)
    ts = None if timestamps is None else pc.cast(timestamps, pa.int64())
    counts, spread, uneven, too_many = _row_counts(events)
    for lo, hi in _spans(counts, MAX_ROWS_PER_CHUNK):
        got, parent = _explode(events.slice(lo, hi - lo), counts[lo:hi], spread[lo:hi])
        take = pa.array(parent)
        # raw samples are taken for the refused rows only (_checked): a v3 record's events share one
        flat, derived = flatten(got, valid[lo:hi][parent], pa.nulls(len(parent), pa.string()),
                                 size.slice(lo, hi - lo).take(take), oversized[lo:hi][parent],
                                 None if ts is None else ts.slice(lo, hi - lo).take(take), limits,
                                 uneven[lo:hi][parent], too_many[lo:hi][parent])
        record = np.concatenate([parent, parent[derived]])
        yield _checked(flat, gate, raw.slice(lo, hi - lo), record), lo + record


def _checked(flat: pa.Table, gate: bool, raw: pa.Array, record: np.ndarray) -> pa.Table:
    """The gate's reasons added to ``flat``'s; the refused rows' size and (the first
    RAW_SAMPLES_PER_CHUNK) their record's text sample from ``raw`` (``record``: each row's)."""
    reason = flat.column("reason").combine_chunks()
    if gate and flat.num_rows:
        pdf = flat.select(list(quality.INPUT_COLUMNS)).to_pandas(split_blocks=True)
        checked = quality.validate_frame(pdf).to_numpy()
        upstream = reason.to_numpy(zero_copy_only=False)
        reason = pa.array(np.where(pd.isna(upstream), checked, upstream), type=pa.string())
    refused = pc.is_valid(reason)
    sampled = refused.to_numpy(zero_copy_only=False).copy()
    sampled[np.flatnonzero(sampled)[RAW_SAMPLES_PER_CHUNK:]] = False  # the rest are counted, not shown
    flat = flat.set_column(0, "reason", reason)
    if sampled.any():
        flat = flat.set_column(1, "raw", pc.replace_with_mask(
            pa.nulls(flat.num_rows, pa.string()), pa.array(sampled), raw.take(pa.array(record[sampled]))))
    at = flat.schema.get_field_index("raw_bytes")
    return flat.set_column(at, "raw_bytes", pc.if_else(refused, flat.column("raw_bytes"),
                                                        pa.nulls(flat.num_rows, pa.int64())))


def parse_batches(batches: Iterator[pa.RecordBatch], limits: Limits = LIMITS) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function over records with a ``value`` column (and, when present, a
    ``timestamp`` one: the record's Kafka timestamp in ms) -> FLAT_ARROW rows (``parsed_tables``).
    Bind ``limits`` with ``functools.partial``."""
    for flat in parsed_tables(batches, limits):
        yield from flat.to_batches()


def pack_batches(batches: Iterator[pa.RecordBatch], limits: Limits, keys: list[int],
                 stateful: Collection[str]) -> Iterator[pa.RecordBatch]:
    """``parse_batches``, the rows the state takes packed per bucket (``packing.pack``: the
    job's ``mapInArrow`` before the state)."""
    for flat in parsed_tables(batches, limits):
        yield packing.pack(flat, keys, stateful)


def parsed_tables(batches: Iterator[pa.RecordBatch], limits: Limits = LIMITS) -> Iterator[pa.Table]:
    """A task's batches decoded and validated together (GX's cost is mostly per validation), up
    to ``MAX_ROWS_PER_CHUNK`` rows and ``MAX_BYTES_PER_CHUNK`` bytes of values at a time."""
    with gc_paused():
        buf: list[tuple[pa.Array, Optional[pa.Array]]] = []
        rows = nbytes = 0
        for b in batches:
            value = b.column("value")
            ts = b.column("timestamp") if "timestamp" in b.schema.names else None
            buf.append((value, ts))
            rows += b.num_rows
            nbytes += pc.sum(pc.binary_length(value)).as_py() or 0
            if rows >= MAX_ROWS_PER_CHUNK or nbytes >= MAX_BYTES_PER_CHUNK:
                yield from _out(buf, limits)
                buf, rows, nbytes = [], 0, 0
        if buf:
            yield from _out(buf, limits)


def _out(buf: list[tuple[pa.Array, Optional[pa.Array]]], limits: Limits) -> Iterator[pa.Table]:
    values = pa.concat_arrays([v for v, _ in buf]) if len(buf) > 1 else buf[0][0]
    ts = None
    if all(t is not None for _, t in buf):
        ts = pa.concat_arrays([t for _, t in buf]) if len(buf) > 1 else buf[0][1]
    buf.clear()
    for flat, _ in parse_pieces(values, timestamps=ts, limits=limits):
        yield flat
