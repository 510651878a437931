"""The Python Kafka data source in a real Spark session against Tansu: exactly [start, end)
per micro-batch, the per-trigger cap, restart from the checkpoint, and a source runner slower to
start than Spark waits for."""

from __future__ import annotations

import logging
import sys

import pytest
from confluent_kafka import Producer

from kafka_monitor.local.broker import create_topics
from streaming import job
from streaming.read.source import FORMAT, KafkaEventSource
from streaming.sinks.exporter import Exporter
from tests.conftest import unique

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, part_counts: dict[int, int], start: dict[int, int]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "enable.idempotence": True})
    for part, n in part_counts.items():
        for i in range(n):
            p.produce(topic, key=b"k", value=b"%d:%d" % (part, start.get(part, 0) + i), partition=part)
    p.flush(10)
    # Tansu lists "latest" as the base offset of the last batch + 1; one single-record batch per
    # partition after the flush makes the listed end exact (test-only; Apache Kafka is right).
    for part in part_counts:
        p.produce(topic, key=b"k", value=b"%d:tail" % part, partition=part)
        p.flush(10)


def run_query(spark, bootstrap, topic, checkpoint, cap):
    seen = []

    def sink(df, batch_id):
        rows = df.select("partition", "offset", "value", "key", "topic").collect()
        seen.append((batch_id, [(r.partition, r.offset, r.value, r.key, r.topic) for r in rows]))

    spark.dataSource.register(KafkaEventSource)
    q = job.start_query(lambda: spark.readStream.format(FORMAT).option("subscribe", topic)
                        .option("kafka.bootstrap.servers", bootstrap).option("maxOffsetsPerTrigger", str(cap)).load()
                        .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                        .trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    return seen


def test_every_record_exactly_once_under_the_cap_and_across_a_restart(spark, tansu, tmp_path):
    topic = unique("src")
    create_topics(tansu.bootstrap, {topic: 2})
    produce(tansu.bootstrap, topic, {0: 120, 1: 40}, {})
    ckpt = str(tmp_path / "ckpt")

    first = run_query(spark, tansu.bootstrap, topic, ckpt, cap=50)
    rows = [r for _, b in first for r in b]
    assert all(len(b) <= 50 for _, b in first), [len(b) for _, b in first]
    assert len(first) >= 4  # 162 records under a cap of 50
    assert sorted((p, o) for p, o, *_ in rows) == [(0, o) for o in range(121)] + [(1, o) for o in range(41)]
    assert {(k, t) for *_, k, t in rows} == {("k", topic)}
    assert rows[0][2] in ("0:0", "1:0")

    produce(tansu.bootstrap, topic, {0: 30}, {0: 120})
    second = run_query(spark, tansu.bootstrap, topic, ckpt, cap=50)
    rows2 = [r for _, b in second for r in b]
    assert sorted((p, o) for p, o, *_ in rows2) == [(0, o) for o in range(121, 152)]
    assert min(b for b, _ in second) > max(b for b, _ in first)  # batch ids continue from the checkpoint


def test_a_source_runner_slower_than_spark_waits_for_is_started_again(spark, tansu, tmp_path, caplog):
    """Spark gives the source's Python runner 10 s to connect back (a constant, no setting); on
    a busy CI machine one took longer and the query failed before its first batch.  Here the
    first runner takes 12 s to start; the job's start() starts the query again."""
    events = unique("slow-runner")
    create_topics(tansu.bootstrap, {events: 1})
    slowed = tmp_path / "slowed"
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n"
                      'case "$*" in *python_streaming_source_runner*)\n'
                      f'  if [ ! -e "{slowed}" ]; then touch "{slowed}"; sleep 12; fi ;;\n'
                      "esac\n"
                      f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    exporter = Exporter()
    cfg = job.JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(tmp_path / "ckpt"), events_topic=events,
                        trigger_s=1, buckets=2, metrics_port=exporter.serve(0), alerts_topic="")
    sc = spark.sparkContext
    real = sc.pythonExec
    sc.pythonExec = str(python)  # what the source and the job's functions are registered with
    try:
        with caplog.at_level(logging.WARNING, logger="streaming.job"):
            q = job.start(spark, cfg, exporter, query_name=unique("slow-runner"))
    finally:
        sc.pythonExec = real
        spark.dataSource.register(KafkaEventSource)  # later queries' runners: the real interpreter
    try:
        assert slowed.exists()
        assert q.isActive and q.exception() is None, q.exception()
        assert q.status["message"] not in ("Initializing StreamExecution", "Initializing sources")
        warned = [r.getMessage() for r in caplog.records if "did not start" in r.getMessage()]
        # one warning, or two if the second runner too was slow (the first run on a fresh machine)
        assert warned and f"attempt 1 of {job.SOURCE_START_ATTEMPTS}" in warned[0] and "failed to connect back" in warned[0], warned
    finally:
        job.stop_query(q)
        exporter.shutdown()
