"""Packed rows: the parse task's checked rows for the state, one Arrow IPC stream per bucket.

The JVM does not look inside an event between the parse and the state function: it only
groups rows by bucket.  So the parse task computes each row's bucket itself (Spark's
``pmod(xxhash64(bucket_key), buckets)``, bit for bit: ``bucket_of``) and hands Spark one row per
bucket and chunk, ``(bucket, events, payload)``, the payload the bucket's rows in FLAT_COLUMNS
order as an Arrow IPC stream (without the columns null in all its rows: most are, a row
holds its own type's fields); the state function's input is unpacked back into the frames
Spark would have made (``unpack``).  The events then cross the JVM as a few large binary
values, not as 60-column rows converted to Spark's row format, shuffled, sorted and converted
back (measured: docs/state.md, "Where a batch's time goes, per event").
"""

from __future__ import annotations

from typing import Any, Collection, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

#: the quarantine's grouping key (refused rows, whatever their type)
QUARANTINE_BUCKET = -1
#: a payload holds at most this many rows (a bucket's rows of a chunk are split beyond it)
PACK_ROWS = 50_000
PACKED_DDL = "bucket int, events bigint, payload binary"
SPARK_HASH_SEED = 42


def spark_hash_int(v: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash()`` of an int column (Murmur3 x86 32-bit of the 4-byte value, seed 42): what
    its hash partitioning sends key ``v`` to shuffle partition ``pmod(hash, n)`` with."""
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = rotl((v & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h = (h ^ (h >> 16)) * 0x85EBCA6B & 0xFFFFFFFF
    h = (h ^ (h >> 13)) * 0xC2B2AE35 & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def bucket_keys(buckets: int) -> list[int]:
    """The grouping key of each bucket 0..buckets-1: for bucket b, the smallest integer whose
    Spark hash is b modulo ``buckets``.  For every shuffle-partition count n that divides
    ``buckets``, bucket b then lands in partition b mod n: each core gets the same number of
    buckets.  The bucket numbers themselves split 16 buckets 9:7 over 2 partitions (one core
    did 9/16 of the state work).  Depends on ``buckets`` only, so the keys stay the same
    across restarts whatever Spark's shuffle partitions."""
    first: dict[int, int] = {}  # bucket -> the smallest key found for it
    k = 0
    while len(first) < buckets:
        first.setdefault(spark_hash_int(k) % buckets, k)
        k += 1
    return [first[b] for b in range(buckets)]


def spark_xxhash64(value: Any) -> int:
    """Spark's ``xxhash64()`` of a string (XXH64 of its UTF-8 bytes, seed 42, as a signed long);
    of null: the seed."""
    if value is None:
        return SPARK_HASH_SEED
    h = xxhash.xxh64_intdigest(value.encode(), seed=SPARK_HASH_SEED)
    return h - (1 << 64) if h >= 1 << 63 else h


def bucket_of(flat: pa.Table, keys: list[int]) -> np.ndarray:
    """Each row's grouping key: ``keys[pmod(xxhash64(bucket_key), len(keys))]`` as the job's
    Spark expression had it (so stored state keeps its bucket across the change), or
    QUARANTINE_BUCKET for a refused row.  Each distinct bucket key is hashed once."""
    enc = pc.dictionary_encode(flat.column("bucket_key")).combine_chunks()
    hashed = np.array([spark_xxhash64(v) for v in enc.dictionary.to_pylist()] + [SPARK_HASH_SEED], np.int64)
    h = hashed[pc.fill_null(enc.indices, len(hashed) - 1).to_numpy(zero_copy_only=False)]  # null: the seed
    out = np.asarray(keys, np.int32)[np.mod(h, len(keys))]
    refused = pc.is_valid(flat.column("reason")).to_numpy(zero_copy_only=False)
    return np.where(refused, np.int32(QUARANTINE_BUCKET), out).astype(np.int32)


def pack(flat: pa.Table, keys: list[int], stateful: Collection[str]) -> pa.RecordBatch:
    """The rows the state takes (refused ones, and those of a ``stateful`` type) as one row per
    bucket (and per PACK_ROWS rows): ``PACKED_DDL``.  A bucket's rows keep their order."""
    keep = pc.or_(pc.is_valid(flat.column("reason")), pc.is_in(flat.column("type"), pa.array(list(stateful))))
    flat = flat.filter(pc.fill_null(keep, False))
    bucket = bucket_of(flat, keys)
    flat = flat.append_column("bucket", pa.array(bucket, pa.int32()))
    order = np.argsort(bucket, kind="stable")
    flat = flat.take(pa.array(order))
    sorted_b = bucket[order]
    cuts = np.flatnonzero(np.diff(sorted_b)) + 1
    out_b: list[int] = []
    out_n: list[int] = []
    out_p: list[bytes] = []
    full = {_FULL_SCHEMA: flat.schema.serialize().to_pybytes()}
    for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(sorted_b)]])):
        for at in range(int(lo), int(hi), PACK_ROWS):
            part = flat.slice(at, min(PACK_ROWS, int(hi) - at))
            # a column null in every row of the part is left out (most are: a row holds its own
            # type's fields); the full schema travels with it, and unpack puts them back
            part = part.select([i for i, c in enumerate(part.columns) if c.null_count < len(c)])
            part = part.replace_schema_metadata(full)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as w:
                w.write_table(part)
            out_b.append(int(sorted_b[lo]))
            out_n.append(part.num_rows)
            out_p.append(sink.getvalue().to_pybytes())
    return pa.RecordBatch.from_arrays([pa.array(out_b, pa.int32()), pa.array(out_n, pa.int64()),
                                       pa.array(out_p, pa.binary())], names=["bucket", "events", "payload"])


def unpack(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The state function's input frames of packed rows -> the frames of their events (FLAT_COLUMNS
    and ``bucket``), as Spark's Arrow -> pandas conversion makes them (nullable longs as float64,
    arrays as numpy arrays)."""
    for f in frames:
        for payload in f["payload"]:
            yield _whole(pa.ipc.open_stream(payload).read_all()).to_pandas()


#: the schema metadata key of a payload's full schema (``pack`` leaves out all-null columns)
_FULL_SCHEMA = b"kafka-monitor.full-schema"
_SCHEMAS: dict[bytes, pa.Schema] = {}  # serialized -> schema (the job has one or two)


def _whole(part: pa.Table) -> pa.Table:
    """A payload's table with the columns ``pack`` left out put back, all null, in order."""
    meta = part.schema.metadata or {}
    raw = meta.get(_FULL_SCHEMA)
    if raw is None:
        return part
    schema = _SCHEMAS.get(raw)
    if schema is None:
        schema = _SCHEMAS[raw] = pa.ipc.read_schema(pa.py_buffer(raw))
        if len(_SCHEMAS) > 16:
            _SCHEMAS.clear()
            _SCHEMAS[raw] = schema
    n = part.num_rows
    have = set(part.column_names)
    return pa.table([part.column(f.name) if f.name in have else pa.nulls(n, f.type) for f in schema],
                    schema=schema.remove_metadata())
