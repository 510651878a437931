"""Several clusters, one job (issue 34): two real clusters, a probe on each, one events topic,
one Spark job, as the README's "Several clusters" deploys it.

    east: the run's cluster (a controller and 3 brokers; tests/support/kafka_cluster.py)
    west: second_kafka_cluster (one node, broker and controller)
    probe --cluster east --events-bootstrap-servers <west>   probe --cluster west
      -> one events topic (on west) -> one Spark job (trigger 1 s) -> /metrics, the alerts topic
      -> Prometheus scraping it with the shipped rules (`for:` 1 s, the job's notify holds 1 s)

Both clusters have a topic of the same name with the same partitions, and a consumer group of
the same name on it; both probes have the same source name (the default is per host).  In
order, on one running job: each cluster's partitions and group partitions are entities of
their own (/metrics, the state); the dashboards' cluster variable lists both and selects one;
the snapshot's --cluster keeps one; a broker of east stopped alerts in east only; west's probe
stopped is SourceSilent for west only; the alerts topic holds no transition of west's but
those of its silence.

Expected run time: about 3 minutes on 2 cores once the run's cluster and Spark session are up
(west starts in ~10 s, the job's first batches take ~30-60 s, the broker fault ~60 s, the silence
~30 s).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kafka_monitor import cli, snapshot
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.job import JobConfig, start, stop_query
from streaming.sinks.exporter import Exporter
from tests.conftest import unique, wait_for
from tests.e2e.test_churn import commit
from tests.e2e.test_real_cluster import SHORT_HOLDS, rules_with_short_for
from tests.support.alerts_topic import read_alerts
from tests.support.kafka_cluster import in_sync
from tests.support.prometheus import PrometheusServer, prometheus_binary

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

DASH_DIR = Path(__file__).resolve().parents[2] / "dashboards"
SOURCE = "probe-two"  # one source name for both probes, as two probes on one host have by default
#: records written before the probes start: the HW each cluster's partitions must show
WRITTEN = {"east": {0: 15, 1: 12}, "west": {0: 7, 1: 5}}


def samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    return [(s.labels, s.value) for fam in text_string_to_metric_families(body) for s in fam.samples
            if s.name == name]


def value(url: str, name: str, **labels: str):
    got = [v for lb, v in samples(url, name) if all(lb.get(k) == x for k, x in labels.items())]
    return got[0] if len(got) == 1 else None


def job_alerts(url: str) -> set[tuple[str, ...]]:
    """(alert, cluster, topic, partition, source, broker) of every open alert on /metrics."""
    return {(lb["alert"], lb["cluster"], lb["topic"], lb["partition"], lb["source"], lb["broker"])
            for lb, _ in samples(url, "kafka_monitor_alert_active")}


class ProbeThread:
    def __init__(self, cfg: ProbeConfig):
        self.probe, self._stop = Probe(cfg), threading.Event()
        self._t = threading.Thread(target=self.probe.run, args=(self._stop,), name=f"probe-{cfg.cluster}",
                                   daemon=True)
        self._t.start()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._t.join(30)
            self.probe.close(flush_timeout=5)


@pytest.fixture(scope="module")
def two(kafka_cluster, second_kafka_cluster, spark, tmp_path_factory):
    if prometheus_binary() is None:
        pytest.fail("'prometheus' is not on PATH: install the Debian package prometheus", pytrace=False)
    east, west = kafka_cluster, second_kafka_cluster
    tmp = tmp_path_factory.mktemp("two-clusters")
    prefix = unique("two.e2e")
    topic, group = f"{prefix}.orders", unique("two-app")
    # the same name, the same partitions, in both; east's partition 0 led by 1, 1 by 2
    east.create_topic(topic, replica_assignment=[[1, 2, 3], [2, 3, 1]], config={"min.insync.replicas": 2})
    west.create_topic(topic, partitions=2, rf=1)
    for name, c in (("east", east), ("west", west)):
        p = Producer({"bootstrap.servers": c.bootstrap_servers, "acks": "all"})
        for part, n in WRITTEN[name].items():
            for _ in range(n):
                p.produce(topic, b"x", partition=part)
        assert p.flush(30) == 0
        # caught up: a group partition each, and no lag alert to tell apart from the faults'
        commit(c.bootstrap_servers, group, [TopicPartition(topic, q, n) for q, n in WRITTEN[name].items()])
    events, alerts = unique("two-events"), unique("two-alerts")
    west.create_topic(events, partitions=3, rf=1)
    west.create_topic(alerts, partitions=1, rf=1)
    with ExitStack() as cleanup:
        def heal():
            for b in east.broker_ids if east.managed else ():
                if east._broker(b).paused:
                    east.resume_broker(b)
                if not east.is_running(b):
                    east.start_broker(b)
        cleanup.callback(heal)
        probes = {}
        for name, c in (("east", east), ("west", west)):
            probes[name] = ProbeThread(ProbeConfig(
                bootstrap_servers=c.bootstrap_servers, events_topic=events,
                events_kafka={"bootstrap.servers": west.bootstrap_servers}, interval_s=1, refresh_backoff_s=0.5,
                request_timeout_s=5, topics_include=f"^{re.escape(prefix)}\\.",
                groups_include=f"^{re.escape(group)}$", cluster=name, source=SOURCE))
            cleanup.callback(probes[name].stop)

        exporter = Exporter()
        port = exporter.serve(0)
        cleanup.callback(exporter.shutdown)
        # silence after 3 intervals and 10 s of grace: a stopped broker holds east's probe up to its
        # 5 s request timeout, which must not read as silence
        cfg = JobConfig(bootstrap_servers=west.bootstrap_servers, checkpoint_dir=str(tmp / "ckpt"), events_topic=events,
                        alerts_topic=alerts, trigger_s=1, buckets=4, metrics_port=port,
                        rules={**SHORT_HOLDS, "source": {"silent_factor": 3, "silence_grace_ms": 10_000}})
        query = start(spark, cfg, exporter, query_name=unique("two-clusters"))
        cleanup.callback(stop_query, query)

        rules_copy = tmp / "rules.short-for.yml"
        rules_copy.write_text(json.dumps(rules_with_short_for(), indent=2), encoding="utf-8")
        prom = PrometheusServer(json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_copy)],
            "scrape_configs": [{"job_name": "kafka-monitor", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }), tmp / "prometheus").start()
        cleanup.callback(prom.stop)
        url = f"http://127.0.0.1:{port}/metrics"

        def seen():
            assert query.exception() is None, query.exception()
            return all(value(url, "kafka_monitor_partition_high_watermark", cluster=n, topic=topic,
                             partition=str(q)) == hw for n, parts in WRITTEN.items() for q, hw in parts.items())
        wait_for(seen, timeout=180, interval=0.5, what="both clusters' partitions of the topic on /metrics")
        yield {"east": east, "west": west, "topic": topic, "group": group, "url": url, "query": query,
               "prom": prom, "probes": probes, "alerts": alerts}


def test_the_same_topic_and_group_in_two_clusters_are_entities_of_their_own(two):
    url, topic = two["url"], two["topic"]
    for name in WRITTEN:
        assert value(url, "kafka_monitor_topic_partitions", cluster=name, topic=topic) == 2
        assert value(url, "kafka_monitor_partition_replicas", cluster=name, topic=topic,
                     partition="0") == (3 if name == "east" else 1)
    def committed() -> bool:
        return all(value(url, "kafka_monitor_group_partition_committed_offset", cluster=n, group=two["group"],
                         topic=topic, partition=str(q)) == hw for n, ps in WRITTEN.items() for q, hw in ps.items())
    wait_for(committed, timeout=60, interval=0.5, what="both clusters' group partitions on /metrics")
    # in the state: 2 partitions and 2 group partitions per cluster, nothing else is watched
    assert value(url, "kafka_monitor_job_state_entities", kind="partition") == 4
    assert value(url, "kafka_monitor_job_state_entities", kind="group_partition") == 4
    # both probes, one source name: two sources, each with its heartbeats
    beats = {lb["cluster"] for lb, _ in samples(url, "kafka_monitor_source_last_heartbeat_timestamp_seconds")
             if lb["source"] == SOURCE}
    assert beats == {"east", "west"}
    opened = job_alerts(url)
    assert not [a for a in opened if a[2] == topic or a[1] == "west"], opened


def test_the_dashboards_cluster_variable_lists_both_and_selects_one(two):
    prom = two["prom"]
    wait_for(lambda: {"east", "west"} <= set(prom.label_values("cluster", match="kafka_monitor_partition_replicas")),
             timeout=60, interval=0.5, what="both clusters in Prometheus")
    values = {"$__rate_interval": "1m", "$cluster": "west", "$topic": ".*", "$group": ".*"}
    with_data, leaks = 0, []
    for path in sorted(DASH_DIR.glob("*.json")):
        d = json.loads(path.read_text(encoding="utf-8"))
        assert "cluster" in [v["name"] for v in d["templating"]["list"]], path.name
        for p in d["panels"]:
            for t in p["targets"]:
                expr = t["expr"]
                for var, v in values.items():
                    expr = expr.replace(var, v)
                result = prom.query(expr)
                with_data += any(r["metric"].get("cluster") == "west" for r in result)
                leaks += [f"{path.name} {p['title']!r}: {r['metric']}" for r in result
                          if r["metric"].get("cluster", "west") != "west"]
    assert not leaks, "series of another cluster with $cluster = west:\n" + "\n".join(leaks[:20])
    assert with_data >= 5, f"only {with_data} panel queries returned west's series"


def test_the_snapshots_cluster_filter_keeps_one_cluster(two, tmp_path, capsys):
    prom, topic = two["prom"], two["topic"]
    end = time.time()
    everything = snapshot.collect(snapshot.Prometheus(prom.url), end - 600, end, 15,
                                  {"cluster": [], "group": [], "topic": []})
    assert {r["cluster"] for r in everything.heartbeats.rows} == {"east", "west"}
    west = snapshot.collect(snapshot.Prometheus(prom.url), end - 600, end, 15,
                            {"cluster": ["west"], "group": [], "topic": []})
    assert [(r["cluster"], r["source"]) for r in west.heartbeats.rows] == [("west", SOURCE)]
    assert {r["cluster"] for r in west.lag_partitions.rows} == {"west"}
    assert {(r["topic"], r["partition"]) for r in west.lag_partitions.rows} == {(topic, "0"), (topic, "1")}
    assert west.partitions_total == 2
    assert not [r.labels for r in west.alert_timeline.rows if r.labels.get("cluster") not in ("west", "", None)]

    out = tmp_path / "west.html"
    code = cli.main(["snapshot", "--prometheus", prom.url, "--since", "10m", "--cluster", "west", "--out", str(out)])
    gist = capsys.readouterr().out
    assert code == 0, gist
    assert out.exists() and "cluster = west" in gist


def test_a_stopped_broker_of_east_alerts_in_east_only(two):
    east, url, topic, prom = two["east"], two["url"], two["topic"], two["prom"]

    def fault_alerts() -> set[tuple[str, str, str]]:
        """(alert, cluster, broker or partition) of BrokerDown and of the topic's UnderReplicated."""
        return {(a[0], a[1], a[5] if a[0] == "BrokerDown" else a[3]) for a in job_alerts(url)
                if a[0] == "BrokerDown" or (a[0] == "UnderReplicated" and a[2] == topic)}
    want = {("BrokerDown", "east", "2"), ("UnderReplicated", "east", "0"), ("UnderReplicated", "east", "1")}
    east.stop_broker(2)  # leads east's partition 1
    try:
        def east_down():
            assert two["query"].exception() is None, two["query"].exception()
            return want <= fault_alerts()
        wait_for(east_down, timeout=90, interval=0.5,
                 what=f"BrokerDown and UnderReplicated in east on /metrics (open: {sorted(job_alerts(url))})")
        wait_for(lambda: any(a["labels"].get("alertname") == "BrokerDown" and a["labels"].get("cluster") == "east"
                             and a["state"] == "firing" for a in prom.alerts()), timeout=30, interval=0.5,
                 what="BrokerDown firing for east in Prometheus")
        # west's partitions of the same name, and its broker 1, are untouched
        assert not [a for a in job_alerts(url) if a[1] == "west"]
        # (the monitor's own rules, KafkaMonitorProbeFallingBehind, may see a probe slowed by the load)
        assert not [a["labels"] for a in prom.alerts() if a["labels"].get("cluster") == "west"
                    and not a["labels"]["alertname"].startswith("KafkaMonitor")]
        assert value(url, "kafka_monitor_partition_in_sync_replicas", cluster="west", topic=topic, partition="1") == 1
        assert value(url, "kafka_monitor_partition_in_sync_replicas", cluster="east", topic=topic, partition="0") == 2
    finally:
        east.start_broker(2)
    wait_for(lambda: not fault_alerts(), timeout=120, interval=0.5,
             what=f"east's alerts resolved once broker 2 is back (open: {sorted(job_alerts(url))})")
    wait_for(lambda: in_sync(east, topic), timeout=60, interval=0.5, what=f"{topic} in sync on east")


def test_a_stopped_probe_is_silent_in_its_cluster_only(two):
    url, prom = two["url"], two["prom"]
    east_beat = value(url, "kafka_monitor_source_last_heartbeat_timestamp_seconds", cluster="east", source=SOURCE)
    two["probes"]["west"].stop()
    # 13 s of silence, then the next batch of its bucket: at once when east's events share the
    # bucket, else at the bucket's timeout (the state's tick, 30 s)
    wait_for(lambda: ("SourceSilent", "west", "", "", SOURCE, "") in job_alerts(url), timeout=90, interval=0.5,
             what=f"SourceSilent for west on /metrics (open: {sorted(job_alerts(url))})")
    wait_for(lambda: any(a["labels"].get("alertname") == "SourceSilent" and a["labels"].get("cluster") == "west"
                         and a["state"] == "firing" for a in prom.alerts()), timeout=30, interval=0.5,
             what="SourceSilent firing for west in Prometheus")
    # east's probe goes on: its heartbeats move, and it is neither silent nor stale
    beat = value(url, "kafka_monitor_source_last_heartbeat_timestamp_seconds", cluster="east", source=SOURCE)
    assert beat > east_beat, (beat, east_beat)
    assert not [a for a in job_alerts(url) if a[1] == "east" and a[0] in ("SourceSilent", "MetadataStale")]
    assert not [a["labels"] for a in prom.alerts() if a["labels"].get("cluster") == "east"
                and a["labels"].get("alertname") in ("SourceSilent", "MetadataStale")]


def test_the_alerts_topic_keeps_the_clusters_apart(two):
    records = read_alerts(two["west"].bootstrap_servers, two["alerts"])
    keys = [(a["alert_id"], a["action"], a["at"]) for a in records]
    assert len(keys) == len(set(keys)), "a transition appears twice"
    by_cluster: dict[str, set[str]] = {}
    for a in records:
        by_cluster.setdefault(a["labels"]["cluster"], set()).add(a["alert"])
    shown = json.dumps({k: sorted(v) for k, v in by_cluster.items()})
    print(f"\nalerts topic: {len(records)} transitions; by cluster {shown}")
    assert set(by_cluster) <= {"east", "west"}
    if two["east"].managed:  # an external east (KAFKA_MONITOR_TEST_KAFKA) skipped the broker fault
        assert {"BrokerDown", "UnderReplicated"} <= by_cluster.get("east", set())
    # west only went silent: its probe's own alerts, nothing about its brokers or partitions
    assert "SourceSilent" in by_cluster.get("west", set())
    assert by_cluster["west"] <= {"SourceSilent", "MetadataStale", "PartitionUnobserved"}, by_cluster["west"]
