"""streaming.ingest.packing without Spark: each row's bucket is the one the job's Spark expression
gave it (so stored state keeps its bucket), and a bucket's packed rows unpack to the frames Spark
would have handed the state function, in order.  Against a live Spark: tests/integration/test_buckets.py."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from monitor.contract import Event, GroupOffsets, Heartbeat, PartitionOffsets
from streaming.ingest import packing, parsing
from streaming.ingest.schema import FLAT_COLUMNS
from streaming.job import ENTITY_OF_TYPE, bucket_keys

KEYS = bucket_keys(16)


def flat_rows(n: int, bad: int = 0) -> pa.Table:
    events = [Event.of(PartitionOffsets(topic=f"t{i % 7}", partition=i, high_watermark=i, via="fetch"),
                       cluster="c", source="p", seq=i, observed_at=1_000 + i).to_json().decode() for i in range(n)]
    events += [Event.of(GroupOffsets(group="g", topic="t0", partition=i, committed_offset=i, high_watermark=i),
                        cluster="c", source="p", seq=n + i, observed_at=1_000).to_json().decode() for i in range(3)]
    events += [Event.of(Heartbeat(interval_ms=1000, events_sent=1, events_dropped=0), cluster="c", source="p",
                        seq=n + 3, observed_at=1_000).to_json().decode()]
    events += ["{not json"] * bad
    return parsing.parse_values(pa.array(events, pa.string()), gate=False)


@pytest.mark.parametrize("value, spark", [  # what Spark 4.2's xxhash64() answered for these strings
    ("", -7444071767201028348), ("a", -8582455328737087284), ("partition|c/orders/0", 2155470332975643270),
    ("é日本", 3471320912796264393), ("group|k/g", 6248412749048522922), (None, 42)])
def test_the_hash_is_sparks_xxhash64(value, spark):
    assert packing.spark_xxhash64(value) == spark


def test_each_row_goes_to_the_bucket_the_spark_expression_gave_it():
    flat = flat_rows(200, bad=2)
    got = packing.bucket_of(flat, KEYS)
    keys = flat.column("bucket_key").to_pylist()
    refused = [r is not None for r in flat.column("reason").to_pylist()]
    # pmod(xxhash64(bucket_key), 16), then the bucket's key: one expression per row
    want = [-1 if bad else KEYS[packing.spark_xxhash64(k) % 16] for k, bad in zip(keys, refused)]
    assert got.tolist() == want and got.dtype == np.int32
    assert len(set(got[~np.array(refused)])) > 8  # 200 partitions spread over the buckets
    g = flat.column("type").to_pylist()
    assert len({b for b, t in zip(got, g) if t == "group_offsets"}) == 1  # a group's partitions: one bucket


def test_a_buckets_rows_unpack_to_the_frame_spark_would_make_in_order():
    flat = flat_rows(300, bad=2)
    batch = packing.pack(flat, KEYS, ENTITY_OF_TYPE)
    assert batch.schema.names == ["bucket", "events", "payload"]
    buckets = batch.column("bucket").to_pylist()
    assert len(buckets) == len(set(buckets)) and sum(batch.column("events").to_pylist()) == flat.num_rows
    expected = flat.append_column("bucket", pa.array(packing.bucket_of(flat, KEYS), pa.int32()))
    for b in buckets:
        one = batch.filter(pa.compute.equal(batch.column("bucket"), b)).to_pandas()
        (got,) = list(packing.unpack(iter([one])))
        # Spark converts a bucket's rows as one Arrow batch: a long column with no null there is int64
        want = expected.filter(pa.compute.equal(expected.column("bucket"), b)).to_pandas()
        assert list(got.columns) == [n for n, _ in FLAT_COLUMNS] + ["bucket"]
        pd.testing.assert_frame_equal(got, want)  # dtypes too: nullable longs as float64, arrays as numpy
    assert -1 in buckets  # the refused rows: the quarantine's


def test_only_the_rows_the_state_takes_are_packed():
    flat = flat_rows(20, bad=1)
    batch = packing.pack(flat, KEYS, {"heartbeat"})
    rows = pd.concat(list(packing.unpack(iter([batch.to_pandas()]))))
    assert sorted(set(rows["type"].dropna())) == ["heartbeat"] and rows["reason"].notna().sum() == 1


def test_a_large_bucket_is_split_and_keeps_its_order(monkeypatch):
    monkeypatch.setattr(packing, "PACK_ROWS", 4)
    flat = flat_rows(0)  # three partitions of one group and a heartbeat
    flat = pa.concat_tables([flat] * 5)
    batch = packing.pack(flat, KEYS, ENTITY_OF_TYPE)
    group = packing.bucket_of(flat, KEYS)[0]
    parts = batch.filter(pa.compute.equal(batch.column("bucket"), group)).to_pandas()
    assert parts["events"].tolist() == [4, 4, 4, 3]
    got = pd.concat(list(packing.unpack(iter([parts]))))
    assert got["seq"].tolist() == [0, 1, 2] * 5


def test_a_column_null_in_every_row_of_a_payload_stays_out_of_it_and_comes_back():
    flat = flat_rows(40)
    batch = packing.pack(flat, KEYS, ENTITY_OF_TYPE)
    group = int(packing.bucket_of(flat, KEYS)[-4])  # the bucket of the group's offsets (no metadata there)
    one = batch.filter(pa.compute.equal(batch.column("bucket"), group))
    (payload,) = one.column("payload").to_pylist()
    sent = pa.ipc.open_stream(payload).read_all()
    assert "committed_offset" in sent.column_names and "leader" not in sent.column_names
    assert all(c.null_count < len(c) for c in sent.columns)  # ~2/3 of a flat row's columns are its type's
    (got,) = list(packing.unpack(iter([one.to_pandas()])))
    assert list(got.columns) == [n for n, _ in FLAT_COLUMNS] + ["bucket"]
    assert got["leader"].isna().all() and got["leader"].dtype == np.float64  # as Spark hands a null long over
    assert got["replicas"].isna().all() and got["replicas"].dtype == object


def test_nothing_to_pack():
    batch = packing.pack(flat_rows(0).slice(0, 0), KEYS, ENTITY_OF_TYPE)
    assert batch.num_rows == 0 and list(packing.unpack(iter([batch.to_pandas()]))) == []


def test_the_jobs_mapinarrow_function_packs_what_it_parses():
    values = [json.dumps(Event.of(PartitionOffsets(topic="t", partition=i, high_watermark=i, via="fetch"),
                                  cluster="c", source="p", seq=i, observed_at=1_000 + i).to_dict()) for i in range(50)]
    batches = [pa.RecordBatch.from_arrays([pa.array(values[:25]), pa.array([1_000] * 25, pa.int64())], ["value", "timestamp"]),
               pa.RecordBatch.from_arrays([pa.array(values[25:]), pa.array([1_000] * 25, pa.int64())], ["value", "timestamp"])]
    out = list(parsing.pack_batches(iter(batches), parsing.LIMITS, KEYS, ENTITY_OF_TYPE))
    rows = pd.concat([f for b in out for f in packing.unpack(iter([b.to_pandas()]))])
    assert sorted(rows["partition"].astype(int)) == list(range(50)) and rows["reason"].isna().all()
