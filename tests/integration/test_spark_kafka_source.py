"""job.source = "spark-kafka" in a real Spark session: without the kafka jars the job refuses to
start with a message that says what to do; Spark's kafka records become our source's columns and
parse() gives the same rows from them; and, where the jars are on the classpath, both sources
read the same records end to end against Tansu."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest
from pyspark.sql import Row
from pyspark.sql.types import (BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from kafka_monitor.local.broker import create_topics
from monitor.contract import Event, Heartbeat, PartitionOffsets
from streaming.read import spark_kafka
from streaming.job import JobConfig, parse, read_events
from streaming.sinks.progress import report_progress
from streaming.read.source import SCHEMA
from tests.conftest import unique

pytestmark = pytest.mark.integration

#: what Spark's kafka source gives (includeHeaders = false)
SPARK_KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()), StructField("value", BinaryType()), StructField("topic", StringType()),
    StructField("partition", IntegerType()), StructField("offset", LongType()),
    StructField("timestamp", TimestampType()), StructField("timestampType", IntegerType()),
])


_NO_JARS = """
import json, sys
from streaming.job import JobConfig, JobConfigError, read_events, spark_session, start, stop_spark
from streaming.sinks.exporter import Exporter
tmp = sys.argv[1]
cfg = JobConfig(bootstrap_servers="127.0.0.1:9", checkpoint_dir=tmp + "/a", alerts_topic="", source="spark-kafka",
                master="local[1]")
spark = spark_session(cfg)
out = {"version": spark.version}
try:
    read_events(spark, cfg)
except JobConfigError as e:
    out.update(msg=str(e), cause=e.__cause__ is None and e.__suppress_context__)
before = len(spark.streams.active)
try:
    start(spark, cfg, Exporter())
except JobConfigError as e:
    out["start"] = str(e)
out["queries"] = len(spark.streams.active) - before
ok = JobConfig(bootstrap_servers="127.0.0.1:9", checkpoint_dir=tmp + "/b", alerts_topic="")
out["python_source"] = read_events(spark, ok).isStreaming
stop_spark(spark)
print("RESULT " + json.dumps(out))
"""


def test_missing_kafka_jars_fail_at_start_with_what_to_do(tmp_path):
    """In a session without the connector's jars (a process of its own: the tests' shared session
    has them, tests/conftest.py)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT")}
    proc = subprocess.run([sys.executable, "-c", _NO_JARS, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=180)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    msg = out["msg"]
    assert msg.startswith('job.source = "spark-kafka": Spark\'s kafka source is not on the classpath '
                          "([KAFKA_DATA_SOURCE_NOT_ENABLED]"), msg
    assert f"--packages org.apache.spark:spark-sql-kafka-0-10_2.13:{out['version']}" in msg
    assert "spark.jars.packages" in msg and 'job.source = "python"' in msg and "kafka-monitor spark-jars" in msg
    assert out["cause"]  # no Java stack trace chained
    # start() fails the same way, before the query (or the alerts producer) exists
    assert out["start"].startswith('job.source = "spark-kafka"') and out["queries"] == 0
    assert out["python_source"]  # the python source still loads in the same session


def test_spark_kafka_records_become_our_columns_and_parse_the_same(spark):
    events = [Event.of(PartitionOffsets(topic="t", partition=1, high_watermark=42, via="fetch"),
                       cluster="c", source="p", seq=0, observed_at=1_700_000_000_000),
              Event.of(Heartbeat(interval_ms=1000, events_sent=3, events_dropped=0),
                       cluster="c", source="p", seq=1, observed_at=1_700_000_000_500)]
    values = [e.to_json() for e in events] + [b"not json", "caf\u00e9 \u2603".encode()]
    # the records' timestamp near the events' observed_at: parse checks one against the other
    ts = dt.datetime.fromtimestamp(1_700_000_000.123)
    theirs = spark.createDataFrame(
        [Row(key=b"k%d" % i if i else None, value=v, topic="ev", partition=i % 2, offset=10 + i, timestamp=ts,
             timestampType=0) for i, v in enumerate(values)], SPARK_KAFKA_SCHEMA)
    ms = round(ts.timestamp() * 1000)  # a naive datetime is local time, to Python and to Spark
    ours = spark.createDataFrame(
        [("k%d" % i if i else None, v.decode(), "ev", i % 2, 10 + i, ms) for i, v in enumerate(values)], SCHEMA)

    got = spark_kafka.records(theirs)
    assert got.schema == ours.schema  # same names, types and order as our source
    rows = got.collect()
    assert [r.value for r in rows] == [v.decode() for v in values]
    assert rows[0].key is None and rows[1].key == "k1"
    assert {r.timestamp for r in rows} == {ms}
    assert [tuple(r) for r in rows] == [tuple(r) for r in ours.collect()]
    assert parse(got).schema == parse(ours).schema
    assert sorted(map(str, parse(got).collect())) == sorted(map(str, parse(ours).collect()))
    reasons = {r.type: r.reason for r in parse(got).collect()}
    assert reasons["partition_offsets"] is None and reasons["heartbeat"] is None


def produce(bootstrap: str, topic: str, part_counts: dict[int, int]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "enable.idempotence": True})
    for part, n in part_counts.items():
        for i in range(n):
            e = Event.of(Heartbeat(interval_ms=1000, events_sent=i, events_dropped=0),
                         cluster="c", source=f"p{part}", seq=i, observed_at=1_700_000_000_000 + i)
            p.produce(topic, key=e.key().encode(), value=e.to_json(), partition=part)
    p.flush(10)
    # Tansu lists "latest" as the base offset of the last batch + 1: one single-record batch per
    # partition after the flush makes the listed end exact (test-only; Apache Kafka is right).
    for part in part_counts:
        p.produce(topic, key=b"tail", value=b"tail", partition=part)
        p.flush(10)


def run(spark, cfg):
    seen = []

    def sink(df, batch_id):
        seen.append((batch_id, [tuple(r) for r in df.select("partition", "offset", "key", "value", "topic").collect()]))

    q = (read_events(spark, cfg).writeStream.foreachBatch(sink)
         .option("checkpointLocation", cfg.checkpoint_dir).trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        progress = q.recentProgress
    finally:
        q.stop()
    assert q.exception() is None
    return seen, progress


def test_both_sources_read_the_same_records(spark, request, tmp_path):
    tansu = request.getfixturevalue("tansu")  # only once the test can run
    topic = unique("spark-kafka")
    create_topics(tansu.bootstrap, {topic: 2})
    produce(tansu.bootstrap, topic, {0: 120, 1: 40})
    common = dict(bootstrap_servers=tansu.bootstrap, events_topic=topic, max_offsets_per_trigger=50,
                  starting_offsets="earliest", alerts_topic="")
    theirs, progress = run(spark, JobConfig(checkpoint_dir=str(tmp_path / "a"), source="spark-kafka", **common))
    ours, _ = run(spark, JobConfig(checkpoint_dir=str(tmp_path / "b"), source="python", **common))

    rows = sorted(r for _, b in theirs for r in b)
    assert rows == sorted(r for _, b in ours for r in b)
    assert [(p, o) for p, o, *_ in rows] == [(0, o) for o in range(121)] + [(1, o) for o in range(41)]
    assert all(len(b) <= 50 for _, b in theirs)
    # the progress Spark's kafka source reports ({"<topic>": {"0": n}}) gives events behind
    behind = []

    class Rec:
        def progress(self, **kw):
            behind.append(kw["events_behind"])

    for p in progress:
        assert json.loads(p["sources"][0]["endOffset"]).keys() == {topic}
        report_progress(p, Rec())
    assert max(behind) > 0 and behind[-1] == 0

    # parse() takes Spark's source as it takes ours
    parsed = parse(read_events(spark, JobConfig(checkpoint_dir=str(tmp_path / "c"), source="spark-kafka", **common)))
    assert parsed.isStreaming and [f.name for f in parsed.schema.fields][:3] == ["reason", "raw", "entity"]
