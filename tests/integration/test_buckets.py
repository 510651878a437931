"""Bucket keys against a real Spark session: our copy of Spark's int hash is Spark's, so the keys
streaming.job.bucket_keys picks spread the buckets evenly over the shuffle partitions."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from streaming.job import bucket_keys, spark_hash_int

pytestmark = pytest.mark.integration


def test_spark_hash_int_is_sparks_hash(spark):
    values = [-2**31, -12345, -1, 0, 1, 2, 15, 16, 49, 1021, 33377, 2**31 - 1]
    got = spark.createDataFrame([(v,) for v in values], "v int").select("v", F.hash("v").alias("h")).collect()
    assert {r.v: r.h for r in got} == {v: spark_hash_int(v) for v in values}


@pytest.mark.parametrize("buckets, partitions", [(16, 2), (16, 4), (16, 8), (64, 2)])
def test_bucket_keys_fill_every_shuffle_partition_equally(spark, buckets, partitions):
    keys = bucket_keys(buckets)
    rows = (spark.createDataFrame([(b, k) for b, k in enumerate(keys)], "b int, key int")
            .repartition(partitions, "key")  # the hash partitioning groupBy(key) uses
            .select("b", F.spark_partition_id().alias("p")).collect())
    assert {r.b: r.p for r in rows} == {b: b % partitions for b in range(buckets)}


def test_the_parse_tasks_bucket_is_the_spark_expressions(spark):
    """The parse task buckets rows in Python (streaming.ingest.packing); before, the job's Spark
    plan did: pmod(xxhash64(bucket_key), buckets) into bucket_keys.  A stored bucket's entities
    must stay in it across the change, so both agree on every key, whatever its characters."""
    import random

    import pyarrow as pa

    from streaming.ingest.packing import bucket_of

    rnd = random.Random(7)
    alphabet = "abcXYZ09._-/|é日本\u0000 "
    values = [None, ""] + ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 40))) for _ in range(2000)]
    for buckets in (16, 7, 64):
        keys = bucket_keys(buckets)
        arr = F.array(*[F.lit(k) for k in keys])
        got = (spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i int, bucket_key string")
               .select("i", F.element_at(arr, (F.pmod(F.xxhash64("bucket_key"), F.lit(buckets)) + 1).cast("int"))
                       .alias("b")).collect())
        spark_says = [b for _, b in sorted((r.i, r.b) for r in got)]
        flat = pa.table({"bucket_key": pa.array(values, pa.string()), "reason": pa.nulls(len(values), pa.string())})
        assert bucket_of(flat, keys).tolist() == spark_says
