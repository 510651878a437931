"""The job's Kafka source (its driver side, without Spark) when the broker its metadata client
talks to is paused, on the real cluster.

librdkafka sends a client's metadata request to the broker that client last used.  With that
broker paused (SIGSTOP: its connections stay up, nothing answers) every trigger's metadata timed
out, the source fell back to the leaders it last saw, and those were stale for the whole pause:
the partitions stayed unreadable until the broker came back (a batch of 73 s and a false
SourceSilent in a full run, tests/e2e/test_own_cluster.py).  Here the source bootstraps from the
victim alone and the victim leads every partition, so its client's connection to the victim is
the one it has (librdkafka picks among the brokers it is connected to: in one run of 8 here it
had another, and read on without sending a request again; without the change the test fails).
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from streaming.read.source import KafkaStreamReader, ReadAllAvailable
from tests.conftest import unique, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def test_the_source_reads_from_the_new_leaders_while_its_metadata_broker_is_paused(kafka_cluster):
    c = kafka_cluster
    victim = 1
    topic = unique("src.paused-md")
    c.create_topic(topic, replica_assignment=[[1, 2, 3], [1, 3, 2], [1, 2, 3]])
    def write(n: int, brokers: list[int]) -> None:
        # a new producer each time: one of its own would send its metadata requests to the paused
        # broker too (librdkafka's rule above), and wait there
        p = Producer({"bootstrap.servers": ",".join(f"127.0.0.1:{c._broker(b).port}" for b in brokers), "acks": "all"})
        for i in range(n):
            p.produce(topic, b"x", partition=i % 3)
        assert p.flush(60) == 0

    write(30, [1, 2, 3])
    reader = KafkaStreamReader({"subscribe": topic, "kafka.bootstrap.servers": f"127.0.0.1:{c._broker(victim).port}",
                                "offsetsTimeoutMs": "2000"})
    try:
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadAllAvailable())
        assert first["offsets"] == {"0": 10, "1": 10, "2": 10}
        c.pause_broker(victim)
        t0 = time.monotonic()
        try:
            def moved():
                try:
                    return all(leader != victim for leader, _, _ in c.partitions(topic).values())
                except Exception:  # noqa: BLE001 - the harness's own request may wait on the paused one
                    return False
            wait_for(moved, timeout=60, interval=0.5, what=f"the leaderships away from the paused broker {victim}")
            write(30, [2, 3])  # to the new leaders

            def read_on():
                end = reader.latestOffset(first, ReadAllAvailable())
                return end if end["offsets"] == {"0": 20, "1": 20, "2": 20} else None
            wait_for(read_on, timeout=30, interval=0.5,
                     what="every partition read from its new leader while the old one is paused")
            took = time.monotonic() - t0
            assert "unreadable" not in reader.reportLatestOffset()
        finally:
            c.resume_broker(victim)
            c.wait_ready(120, brokers=[victim])  # fenced while paused: registered again before the next test
    finally:
        reader.stop()
    print(f"\nread from the new leaders {took:.1f}s after broker {victim} was paused "
          f"({reader.metadata_retries} metadata request(s) sent again through a new client)")
