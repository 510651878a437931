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
    if dataclasses.is_dataclass(inner):
        return T.StructType([T.StructField(f.name, _spark_type(c.hints(inner)[f.name]), True)
                             for f in dataclasses.fields(inner)])
    if typing.get_origin(inner) is list:
        return T.ArrayType(_spark_type(typing.get_args(inner)[0]), True)
    return {int: T.LongType(), float: T.DoubleType(), str: T.StringType(), bool: T.BooleanType()}[inner]


def data_struct() -> T.StructType:
    fields: dict[str, T.DataType] = {}
    for etype, (cls, _) in c.PAYLOADS.items():
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
    T.StructField("observed_at", T.LongType(), True),
    T.StructField("data", data_struct(), True),
])
