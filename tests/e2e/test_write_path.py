"""The write path end to end on a real Apache Kafka cluster: the probe's canary writes with
acks=all, a follower is paused, and the job sees HighWatermarkStalled and BrokerStallingWrites
(naming the paused broker), then IsrShrink.

This cluster of its own has Kafka's default replica.lag.time.max.ms (30 s: a stopped follower
is dropped from the ISR 30 to 45 s after it stops) and is fenced only after 120 s, so the job's
default stall window (hw_stall_ms, 10 s) falls inside the time it holds the high watermark, even
with the probe blind for ~11 s after the pause (its requests wait for the paused broker).  (The session cluster drops followers after 3 s, faster than the probe even sees a
paused broker: it goes blind to the cluster for ~11 s, see docs/canary.md.)

    cluster (3 brokers) <- probe + canary (1 s interval; the canary writes every 0.2 s)
      -> events topic on Tansu -> Spark job (trigger 1 s, default rules) -> /metrics, alerts topic
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from contextlib import ExitStack

import pytest

from kafka_monitor.local.broker import create_topics
from kafka_monitor.local.kafka_cluster import KafkaCluster
from monitor.instrument import InstrumentedProducer
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.job import JobConfig, start, stop_query
from streaming.sinks.exporter import Exporter
from tests.conftest import unique, wait_for
from tests.support.alerts_topic import read_alerts
from tests.support.real_cluster import broker_alerts

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


@pytest.fixture(scope="module")
def write_path(tansu, spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("write-path")
    cluster = KafkaCluster(replica_lag_time_max_ms=30_000, broker_session_timeout_ms=120_000)
    with ExitStack() as cleanup:
        cleanup.callback(cluster.stop)
        cluster.start()
        prefix = unique("wp")
        canary = f"{prefix}.canary"
        events, alerts = unique("wp-events"), unique("wp-alerts")
        create_topics(tansu.bootstrap, {events: 3, alerts: 1})
        probe = Probe(ProbeConfig(bootstrap_servers=cluster.bootstrap_servers, events_topic=events,
                                  events_kafka={"bootstrap.servers": tansu.bootstrap}, interval_s=1,
                                  refresh_backoff_s=0.5, request_timeout_s=5,
                                  topics_include=f"^{re.escape(prefix)}\\.", groups_include="^$",
                                  cluster="wp", source=unique("probe-wp"),
                                  canary=True, canary_topic=canary, canary_interval_s=0.2))
        stop_probe = threading.Event()
        thread = threading.Thread(target=probe.run, args=(stop_probe,), name="wp-probe", daemon=True)
        thread.start()

        def stop_the_probe():
            stop_probe.set()
            thread.join(20)
            probe.close(flush_timeout=2)
        cleanup.callback(stop_the_probe)
        # an application's producer (acks=all) on a topic whose partition broker 3 follows
        app_topic = f"{prefix}.app"
        cluster.create_topic(app_topic, replica_assignment=[[1, 2, 3]])
        producer = InstrumentedProducer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                                         "statistics.interval.ms": 500, "linger.ms": 0},
                                        events={"bootstrap.servers": tansu.bootstrap, "topic": events},
                                        cluster="wp", source=unique("app-wp"))
        stop_app = threading.Event()

        def write() -> None:
            while not stop_app.is_set():  # 10 writes/s
                producer.produce(app_topic, b"x", partition=0)
                producer.poll(0)
                stop_app.wait(0.1)
            producer.flush(10)
        app = threading.Thread(target=write, name="wp-app", daemon=True)
        app.start()

        def stop_the_app():
            stop_app.set()
            app.join(20)
            producer.close_instrumentation(2)
        cleanup.callback(stop_the_app)
        exporter = Exporter()
        port = exporter.serve(0)
        cleanup.callback(exporter.shutdown)
        cfg = JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(tmp / "ckpt"), events_topic=events,
                        alerts_topic=alerts, trigger_s=1, buckets=4, metrics_port=port)
        query = start(spark, cfg, exporter, query_name=unique("wp"))
        cleanup.callback(stop_query, query)
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: f'kafka_monitor_canary_messages_acked_total{{broker="3",cluster="wp",partition="2",topic="{canary}"}}'
                 in urllib.request.urlopen(url, timeout=5).read().decode(), 120, interval=0.5,
                 what="the canary's partition led by broker 3 on /metrics")
        yield {"cluster": cluster, "canary": canary, "url": url, "tansu": tansu, "alerts": alerts, "probe": probe,
               "query": query, "app_topic": app_topic}


def canary_alerts(wp) -> list[dict]:
    return [a for a in read_alerts(wp["tansu"].bootstrap, wp["alerts"]) if a["labels"].get("topic") == wp["canary"]]


def test_a_paused_follower_stalls_the_high_watermark_then_leaves_the_isr(write_path):
    wp = write_path
    c, canary = wp["cluster"], wp["canary"]
    followed = {"0", "1"}  # partition 0: replicas [1, 2, 3], 1: [2, 3, 1]; 2 is led by broker 3
    t0 = time.time() * 1000
    c.pause_broker(3)
    try:
        def shrunk() -> bool:
            assert wp["query"].exception() is None, wp["query"].exception()
            opened = {str(a["labels"]["partition"]) for a in canary_alerts(wp)
                      if a["alert"] == "IsrShrink" and a["action"] == "open" and a["at"] > t0}
            return followed <= opened
        wait_for(shrunk, 90, interval=2, what="IsrShrink on the canary partitions broker 3 follows")
        # the broker view names it: registered (paused, not fenced: the session lasts 120 s), behind
        wait_for(lambda: ("BrokerUnderReplicating", "3") in broker_alerts(wp["url"]), 60, interval=0.5,
                 what="BrokerUnderReplicating for broker 3 on /metrics")
        assert ("BrokerDown", "3") not in broker_alerts(wp["url"])
    finally:
        c.resume_broker(3)

    def stalls_resolved() -> bool:  # polled: a resolve can reach the alerts topic after the shrink's wait ended
        done = {str(a["labels"]["partition"]) for a in canary_alerts(wp)
                if a["alert"] == "HighWatermarkStalled" and a["action"] == "resolve" and a["at"] > t0}
        return followed <= done
    wait_for(stalls_resolved, 60, interval=1, what="HighWatermarkStalled resolved on the partitions broker 3 follows")
    records = [a for a in canary_alerts(wp) if a["at"] > t0]
    # one broker named for the whole stall: the one the writes waited for, before it left the ISR
    stalling = [a for a in read_alerts(wp["tansu"].bootstrap, wp["alerts"])
                if a["alert"] == "BrokerStallingWrites" and a["at"] > t0]
    assert [(a["action"], str(a["labels"]["broker"])) for a in stalling][:1] == [("open", "3")], stalling
    first_shrink = min(a["at"] for a in records if a["alert"] == "IsrShrink" and a["action"] == "open")
    print(f"\n[write path] BrokerStallingWrites broker 3: {(stalling[0]['at'] - t0) / 1000:.1f}s after SIGSTOP "
          f"(writes waiting since {(stalling[0]['evidence']['writes_waiting_since'] - t0) / 1000:.1f}s, "
          f"{stalling[0]['evidence']['waiting_partitions']} partitions); first IsrShrink {(first_shrink - t0) / 1000:.1f}s")
    assert stalling[0]["at"] <= first_shrink

    def at(alert: str, action: str, part: str):
        return min((a["at"] for a in records if a["alert"] == alert and a["action"] == action
                    and str(a["labels"]["partition"]) == part), default=None)
    for part in sorted(followed):
        stalled, shrink = at("HighWatermarkStalled", "open", part), at("IsrShrink", "open", part)
        resolved = at("HighWatermarkStalled", "resolve", part)
        assert stalled is not None, (part, sorted((a["at"] - t0, a["alert"], a["action"]) for a in records))
        assert stalled < shrink and resolved is not None and resolved >= stalled, (part, stalled, shrink, resolved)
        evidence = next(a["evidence"] for a in records if a["alert"] == "HighWatermarkStalled" and a["action"] == "open"
                        and str(a["labels"]["partition"]) == part)
        # opened on a write the canary waited 10 s for, or on two HW observations 10 s apart
        since = evidence.get("oldest_unacknowledged_write_sent_at") or evidence["pending_writes_since"]
        print(f"\n[write path] partition {part}: HighWatermarkStalled {(stalled - t0) / 1000:.1f}s after SIGSTOP "
              f"(writes waiting since {(since - t0) / 1000:.1f}s), IsrShrink "
              f"{(shrink - t0) / 1000:.1f}s, stall resolved {(resolved - t0) / 1000:.1f}s")
    # the canary's acks=all writes waited for the follower: acknowledged after more than 10 s
    body = urllib.request.urlopen(wp["url"], timeout=5).read().decode()

    def sample(name: str, part: str, le: str = "") -> float:
        for line in body.splitlines():
            if line.startswith(f"kafka_monitor_canary_{name}{{") and f'partition="{part}"' in line \
                    and f'topic="{canary}"' in line and (not le or f'le="{le}"' in line):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no {name} for partition {part} on /metrics")
    for part in sorted(followed):
        slow = sample("produce_latency_seconds_count", part) - sample("produce_latency_seconds_bucket", part, "10.0")
        assert slow > 0, part
        assert sample("messages_lost_total", part) == 0
    # the application's producer saw the same: HighWatermarkStalled on its partition from its own
    # in-flight writes (no canary there), and deliveries that waited more than 10 s
    app = [a for a in read_alerts(wp["tansu"].bootstrap, wp["alerts"])
           if a["labels"].get("topic") == wp["app_topic"] and a["at"] > t0]
    app_stall = min((a["at"] for a in app if a["alert"] == "HighWatermarkStalled" and a["action"] == "open"), default=None)
    assert app_stall is not None, sorted((a["at"] - t0, a["alert"], a["action"]) for a in app)

    def deliveries() -> tuple[float, float]:
        """(deliveries, of which slower than 10 s) of the application's producer on /metrics."""
        text = urllib.request.urlopen(wp["url"], timeout=5).read().decode()
        lines = [x for x in text.splitlines() if x.startswith("kafka_monitor_client_produce_delivery_latency_seconds_")
                 and f'topic="{wp["app_topic"]}"' in x]
        count = sum(float(x.rsplit(" ", 1)[1]) for x in lines if "_count{" in x)
        within = sum(float(x.rsplit(" ", 1)[1]) for x in lines if 'le="10.0"' in x)
        return count, count - within
    count, slower = wait_for(lambda: (d := deliveries())[1] > 0 and d, 60, interval=1,
                             what="application deliveries slower than 10 s on /metrics")
    print(f"\n[write path] application producer: HighWatermarkStalled {(app_stall - t0) / 1000:.1f}s after SIGSTOP; "
          f"{slower:.0f} of {count:.0f} deliveries took more than 10 s")
    # after the resume: broker 3 back in every ISR, its alert resolved
    wait_for(lambda: all(3 in isr for _, _, isr in c.partitions(canary).values()), 90, interval=1,
             what="broker 3 back in the canary partitions' ISR")
    wait_for(lambda: not broker_alerts(wp["url"]), 60, interval=0.5, what="no broker alert left")
    assert [a["action"] for a in read_alerts(wp["tansu"].bootstrap, wp["alerts"])
            if a["alert"] == "BrokerStallingWrites" and a["at"] > t0] == ["open", "resolve"]
