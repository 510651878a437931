"""End to end: Tansu -> probe -> events topic -> Spark job -> exporter /metrics.

The HW the test expects is the true one (records produced), which Tansu's ListOffsets does
not report for multi-record batches; the test checks that precondition, so a probe that took
its HW from ListOffsets would fail here instead of passing by luck."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kafka_monitor.local.broker import create_topics
from monitor.contract import Event, PartitionMetadata
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.sinks.exporter import Exporter
from streaming import job
from streaming.job import JobConfig, start, stop_query
from tests.conftest import unique, wait_for

pytestmark = pytest.mark.e2e


def scrape(port: int) -> dict[tuple, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def produce(bootstrap, topic, counts):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100})
    for part, n in counts.items():
        for i in range(n):
            p.produce(topic, value=b"order-%d" % i, partition=part)
    assert p.flush(10) == 0


@pytest.mark.slow  # ~95 s: the lag status needs several observations
def test_hw_lag_and_isr_reach_metrics(tansu, spark, tmp_path):
    orders, events, group, alerts = unique("orders"), unique("events"), unique("billing"), unique("alerts")
    create_topics(tansu.bootstrap, {orders: 2, events: 3, alerts: 1})
    produce(tansu.bootstrap, orders, {0: 37, 1: 12})
    c = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(orders, 0, 30), TopicPartition(orders, 1, 12)], asynchronous=False)
    _, listed = c.get_watermark_offsets(TopicPartition(orders, 0), timeout=10)
    c.close()
    assert listed != 37, "precondition: Tansu's ListOffsets must under-report, or a wrong HW could pass"

    # one malformed record in the events topic: quarantined and counted, never fatal
    bad = Producer({"bootstrap.servers": tansu.bootstrap})
    bad.produce(events, key=b"junk", value=b"{this is not json", partition=0)
    # well-formed JSON that breaks the contract's expectations (ISR not a subset of replicas):
    # the great-expectations gate quarantines it with the expectation as the reason
    ghost = Event.of(PartitionMetadata(topic="ghost", partition=0, leader=1, replicas=[1], isr=[1, 7],
                                       metadata_version=1), cluster="e2e", source="forger", seq=0,
                     observed_at=int(time.time() * 1000))
    bad.produce(events, key=ghost.key().encode(), value=ghost.to_json(), partition=1)
    bad.flush(10)

    stop = threading.Event()
    probe = Probe(ProbeConfig(bootstrap_servers=tansu.bootstrap, events_topic=events, interval_s=1,
                              offsets_via="fetch", topics_include=f"^{orders}$", groups_include=f"^{group}$",
                              cluster="e2e", source="probe-e2e"))
    probe_thread = threading.Thread(target=probe.run, args=(stop,), daemon=True)
    probe_thread.start()
    exporter = Exporter()
    port = exporter.serve(0)
    cfg = JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(tmp_path / "ckpt"), events_topic=events,
                    trigger_s=1, buckets=4, metrics_port=port, alerts_topic=alerts)
    q = start(spark, cfg, exporter, query_name=unique("e2e"))
    alerts_sink = job._QUERIES[str(q.id)][2].alerts
    try:
        P = lambda p: (("cluster", "e2e"), ("partition", str(p)), ("topic", orders))
        G = lambda p: (("cluster", "e2e"), ("group", group), ("partition", str(p)), ("topic", orders))
        expected = {
            ("kafka_monitor_partition_high_watermark", P(0)): 37,
            ("kafka_monitor_partition_high_watermark", P(1)): 12,
            ("kafka_monitor_group_partition_committed_offset", G(0)): 30,
            ("kafka_monitor_group_partition_lag", G(0)): 7,
            ("kafka_monitor_group_partition_lag", G(1)): 0,
            ("kafka_monitor_partition_in_sync_replicas", P(0)): 1,
            ("kafka_monitor_partition_replicas", P(0)): 1,
            ("kafka_monitor_events_quarantined_total", (("reason", "malformed_json"),)): 1,
            ("kafka_monitor_events_quarantined_total", (("reason", "isr_subset_of_replicas"),)): 1,
            ("kafka_monitor_job_up", ()): 1,
        }

        def matches(want):
            def check():
                assert q.exception() is None, q.exception()
                got = scrape(port)
                return got if all(got.get(k) == v for k, v in want.items()) else None
            return check

        got = wait_for(matches(expected), timeout=180, interval=1,
                       what=f"metrics {expected} (query status {q.status})")
        replication = {"IsrShrink", "UnderReplicated", "UnderMinIsr", "AtMinIsr", "OfflinePartition"}
        assert not any(k[0] == "kafka_monitor_alert_active" and dict(k[1])["alert"] in replication
                       for k in got)  # one node: replicas = ISR, nothing under-replicated
        assert not any(dict(k[1]).get("topic") == "ghost" for k in got)  # quarantined: never reached state

        # the group commits nothing more while 7 records wait on partition 0: after a few
        # observations its lag status is STALL (2) and ConsumerLagStatus is open for it
        stall = {("kafka_monitor_group_partition_lag_status", G(0)): 2,
                 ("kafka_monitor_group_partition_lag_status", G(1)): 0}
        got = wait_for(matches(stall), timeout=120, interval=1, what="lag status STALL on partition 0, OK on 1")
        assert any(k[0] == "kafka_monitor_alert_active" and dict(k[1]).get("alert") == "ConsumerLagStatus"
                   and dict(k[1]).get("partition") == "0" for k in got)
        assert got[("kafka_monitor_group_partition_lag_seconds", G(1))] == 0

        # live: more records and the HW and lag follow
        produce(tansu.bootstrap, orders, {0: 5})
        wait_for(matches({("kafka_monitor_partition_high_watermark", P(0)): 42,
                          ("kafka_monitor_group_partition_lag", G(0)): 12}),
                 timeout=120, interval=1, what="HW 42 and lag 12 after 5 more records")
    finally:
        stop.set()
        probe_thread.join(15)
        probe.close(flush_timeout=2)
        stop_query(q)
        exporter.shutdown()
    assert str(q.id) not in job._QUERIES
    assert alerts_sink is not None and alerts_sink._producer is None  # stop_query released its producer


def test_an_instrumented_consumers_view_reaches_metrics(tansu, spark, tmp_path):
    """An application's InstrumentedConsumer reports its partitions (client_fetch); the job
    serves them: position, committed offset, HW, lag and fetch state per group partition."""
    from tests.support.instrumented_app import COUNTS, Instrumented, consume_and_commit
    from tests.support.instrumented_app import produce as produce_known
    orders, events, group, alerts = unique("orders"), unique("events"), unique("app"), unique("alerts")
    create_topics(tansu.bootstrap, {orders: 2, events: 1, alerts: 1})
    produce_known(tansu.bootstrap, orders, COUNTS)
    run = consume_and_commit(Instrumented(events={"bootstrap.servers": tansu.bootstrap, "topic": events}),
                             tansu.bootstrap, orders, group)
    assert run.committed == COUNTS
    exporter = Exporter()
    port = exporter.serve(0)
    cfg = JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(tmp_path / "ckpt"), events_topic=events,
                    trigger_s=1, buckets=4, metrics_port=port, alerts_topic=alerts)
    q = start(spark, cfg, exporter, query_name=unique("e2e-fetch"))
    try:
        def served():
            m = scrape(port)
            got = {}
            for (name, labels), value in m.items():
                lab = dict(labels)
                if name.startswith("kafka_monitor_client_fetch_") and lab.get("group") == group:
                    got[(name, int(lab["partition"]), lab.get("state"))] = value
            return got
        expected = {}
        for p, n in COUNTS.items():
            expected.update({("kafka_monitor_client_fetch_position", p, None): n,
                             ("kafka_monitor_client_fetch_committed_offset", p, None): n,
                             ("kafka_monitor_client_fetch_high_watermark", p, None): n,
                             ("kafka_monitor_client_fetch_lag", p, None): 0,
                             ("kafka_monitor_client_fetch_state", p, "active"): 1})
        seen: list = [None]

        def matches():
            seen[0] = served()
            return seen[0] == expected
        try:
            wait_for(matches, timeout=120, interval=1, what="the consumer's client_fetch gauges on /metrics")
        except AssertionError:
            raise AssertionError(f"served {seen[0]}, expected {expected}") from None
    finally:
        stop_query(q)
        exporter.shutdown()


def test_an_instrumented_producers_writes_reach_metrics(tansu, spark, tmp_path):
    """An application's instrumented producer reports the partitions it writes to
    (client_produce); the job serves them: sent messages, nothing held or in flight.  The
    producer stays up while the job reads: Tansu's ListOffsets ends at the last record batch's
    first offset + 1, so the job reads a batch's last records once a later batch exists."""
    from confluent_kafka import Producer
    from monitor.instrument import instrument, instrumentation_of
    orders, events, alerts = unique("orders"), unique("events"), unique("alerts")
    create_topics(tansu.bootstrap, {orders: 2, events: 1, alerts: 1})
    conf = instrument({"bootstrap.servers": tansu.bootstrap, "statistics.interval.ms": 200, "acks": "all"},
                      events={"bootstrap.servers": tansu.bootstrap, "topic": events}, cluster="e2e",
                      source="producer-e2e")
    producer = Producer(conf)
    exporter = Exporter()
    port = exporter.serve(0)
    cfg = JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(tmp_path / "ckpt"), events_topic=events,
                    trigger_s=1, buckets=4, metrics_port=port, alerts_topic=alerts)
    q = start(spark, cfg, exporter, query_name=unique("e2e-produce"))
    try:
        for i in range(10):
            producer.produce(orders, value=b"%d" % i, partition=i % 2)
        assert producer.flush(10) == 0

        def served():
            got = {}
            for (name, labels), value in scrape(port).items():
                lab = dict(labels)
                if name.startswith("kafka_monitor_client_produce_") and lab.get("topic") == orders:
                    assert lab["source"] == "producer-e2e" and lab["cluster"] == "e2e" and lab["broker"]
                    got[(name, int(lab["partition"]))] = value
            return got
        expected = {}
        for p in (0, 1):
            expected.update({("kafka_monitor_client_produce_sent_messages_total", p): 5,
                             ("kafka_monitor_client_produce_in_flight_messages", p): 0,
                             ("kafka_monitor_client_produce_queued_messages", p): 0})
        seen: list = [None]

        def matches():
            producer.poll(0.2)  # its statistics keep coming
            seen[0] = served()
            return all(seen[0].get(k) == v for k, v in expected.items())
        try:
            wait_for(matches, timeout=120, interval=0.5, what="the producer's client_produce series on /metrics")
        except AssertionError:
            raise AssertionError(f"served {seen[0]}, expected {expected}") from None
    finally:
        stop_query(q)
        exporter.shutdown()
        producer.flush(10)
        instrumentation_of(conf).close(5)
