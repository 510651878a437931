"""The Spark schema of an event, derived from the contract's payload classes (one source of
truth).  ``data`` is the union of every payload's fields, all nullable; a field whose name is
shared by several payloads must have one type everywhere (checked here at import)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from pyspark.sql import types as T

from monitor import contract as c


def _spark_type(typ: Any) -> T.DataType:
    inner, _ = c._unwrap_optional(typ)
    if c.is_dataclass_type(inner):
        return T.StructType([T.StructField(f.name, _spark_type(c.hints(inner)[f.name]), True)
                             for f in dataclasses.fields(inner)])
    if typing.get_origin(inner) is list:
        return T.ArrayType(_spark_type(typing.get_args(inner)[0]), True)
    return {int: T.LongType(), float: T.DoubleType(), str: T.StringType(), bool: T.BooleanType()}[inner]


def data_struct() -> T.StructType:
    fields: dict[str, T.DataType] = {}
    for _etype, (cls, _) in c.PAYLOADS.items():
        for f in dataclasses.fields(cls):
            st = _spark_type(c.hints(cls)[f.name])
            if f.name in fields and fields[f.name] != st:
                raise TypeError(f"contract field {f.name!r} has two types: {fields[f.name]} and {st}")
            fields[f.name] = st
    return T.StructType([T.StructField(n, t, True) for n, t in fields.items()])


EVENT_SCHEMA = T.StructType([
    T.StructField("schema", T.StringType(), True),
    T.StructField("type", T.StringType(), True),
    T.StructField("event_id", T.StringType(), True),
    T.StructField("cluster", T.StringType(), True),
    T.StructField("source", T.StringType(), True),
    T.StructField("seq", T.LongType(), True),
    T.StructField("shard", T.LongType(), True),
    T.StructField("epoch", T.LongType(), True),
    T.StructField("observed_at", T.LongType(), True),
    T.StructField("data", data_struct(), True),
    # v3: the payload fields that differ between the events a record stands for, a list each
    T.StructField("rows", T.StructType([T.StructField(f.name, T.ArrayType(f.dataType, True), True)
                                        for f in data_struct().fields]), True),
])

#: the columns the state function receives: one flat row per observation, as
#: streaming.job.parse makes them
FLAT_COLUMNS: list[tuple[str, str]] = [
    ("reason", "string"), ("raw", "string"), ("entity", "string"), ("bucket_key", "string"), ("type", "string"),
    ("event_id", "string"), ("cluster", "string"), ("source", "string"), ("seq", "bigint"), ("observed_at", "bigint"),
    ("topic", "string"), ("partition", "bigint"), ("group", "string"),
    ("leader", "bigint"), ("leader_epoch", "bigint"), ("replicas", "array<bigint>"), ("isr", "array<bigint>"),
    ("offline_replicas", "array<bigint>"), ("min_insync_replicas", "bigint"),
    ("high_watermark", "bigint"), ("log_start_offset", "bigint"), ("last_stable_offset", "bigint"), ("metadata_at", "bigint"),
    ("committed_offset", "bigint"), ("held_by_transaction", "string"), ("held_by_producer", "bigint"),
    ("fetch_state", "string"), ("position", "bigint"), ("committed", "bigint"), ("consumer_lag", "bigint"),
    ("report", "string"),  # a canary or client_produce report's fields as JSON (parsing.REPORT_FIELDS)
    ("node_id", "bigint"), ("registered", "boolean"), ("leader_partitions", "bigint"),
    ("replica_partitions", "bigint"), ("out_of_sync_replicas", "bigint"),
    ("interval_ms", "bigint"), ("events_sent", "bigint"), ("events_dropped", "bigint"), ("started_at", "bigint"),
    ("group_state", "string"), ("generation", "bigint"), ("members", "bigint"), ("members_sig", "string"),
    ("cycle_duration_ms", "bigint"), ("observation_lag_ms", "bigint"),
    ("phase", "string"), ("member_id", "string"), ("duration_ms", "double"),
    ("refresh_reason", "string"), ("cause", "string"), ("ok", "boolean"), ("error", "string"),
    ("version", "bigint"), ("metadata_max_age_ms", "bigint"),
    ("old_count", "bigint"), ("new_count", "bigint"), ("unseen_for_at_most_ms", "bigint"),
    ("raw_bytes", "bigint"),  # a refused row: the size of its whole value (raw is a sample)
    ("shard", "bigint"), ("epoch", "bigint"), ("ha_group", "string"),  # an HA group's probe: the event's shard and its epoch (fencing)
]
