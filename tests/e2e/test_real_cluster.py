"""End to end on a real Apache Kafka cluster, as an SRE would meet its faults:

    real cluster (KRaft, 3 brokers; tests/support/kafka_cluster.py) with writes flowing
      -> probe (every second) -> events topic on Tansu (the monitor's own cluster, so no fault
         here takes the monitor's pipeline down with it)
      -> Spark job (trigger 1 s) -> /metrics and the alerts topic
      -> Prometheus loading the shipped rules, `for:` and `keep_firing_for:` shortened to 1s, and
         the job's notify holds ([job.rules.notify]) set to 1 s (the expressions are the
         shipped ones, comparing each alert's age with the hold the exporter serves; waiting out
         1-5 minutes per alert is what the promtool tests cover)

In order, on one running job: a healthy start that raises nothing; a paused follower (ISR
shrink, under-replicated, at min ISR; all resolved when it resumes); the leader of a
partition stopped, then a second broker (leader change, under min ISR; resolved when both
return); every replica of a partition gone (offline; resolved when its broker returns).
Each is seen on /metrics (the job's kafka_monitor_alert_active), as a Prometheus alert firing,
and on the alerts topic, and each resolves after recovery.
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
from ruamel.yaml import YAML

from kafka_monitor.local.broker import create_topics
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.rules.notify import FIELDS as NOTIFY_FIELDS
from streaming.sinks.exporter import Exporter
from streaming.job import JobConfig, start, stop_query
from tests.conftest import unique, wait_for
from tests.integration.test_dashboards import alertmanager  # noqa: F401 - fixture
from tests.support.alerts_topic import read_alerts
from tests.support.prometheus import PrometheusServer, prometheus_binary
from tests.support.real_cluster import MultiTopicWriter, broker_alerts

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "kafka-monitor.rules.yml"


def rules_with_short_for() -> dict:
    spec = YAML(typ="safe", pure=True).load(RULES.read_text(encoding="utf-8"))
    for group in spec["groups"]:
        for rule in group["rules"]:
            for key in ("for", "keep_firing_for"):
                if rule.get(key) not in (None, "0s"):
                    rule[key] = "1s"
    return spec


#: the job's notify holds, 1 s each: the shipped rules fire on them
SHORT_HOLDS = {"notify": {f: 1000 for f in NOTIFY_FIELDS}}


def job_alerts(url: str, topic: str) -> set[tuple[str, str]]:
    """(alert, partition) of every kafka_monitor_alert_active series on ``topic``."""
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    out = set()
    for line in body.splitlines():
        if line.startswith("kafka_monitor_alert_active{") and f'topic="{topic}"' in line:
            alert = re.search(r'alert="([^"]*)"', line).group(1)
            out.add((alert, re.search(r'partition="([^"]*)"', line).group(1)))
    return out


@pytest.fixture(scope="module")
def real(kafka_cluster, tansu, spark, tmp_path_factory, alertmanager):  # noqa: F811
    if prometheus_binary() is None:
        pytest.fail("'prometheus' is not on PATH: install the Debian package prometheus", pytrace=False)
    c = kafka_cluster
    tmp = tmp_path_factory.mktemp("real-cluster")
    prefix = unique("real.e2e")
    rep = f"{prefix}.rep"
    # partition 0: leader 1, partition 1: leader 2; broker 3 follows both
    c.create_topic(rep, replica_assignment=[[1, 2, 3], [2, 3, 1]], config={"min.insync.replicas": 2})
    events, alerts = unique("real-events"), unique("real-alerts")
    create_topics(tansu.bootstrap, {events: 3, alerts: 1})
    with ExitStack() as cleanup:
        writer = MultiTopicWriter(c.bootstrap_servers, [rep]).start()
        cleanup.callback(writer.stop)
        stop_probe = threading.Event()
        probe = Probe(ProbeConfig(bootstrap_servers=c.bootstrap_servers, events_topic=events,
                                  events_kafka={"bootstrap.servers": tansu.bootstrap}, interval_s=1,
                                  refresh_backoff_s=0.5, request_timeout_s=5,
                                  topics_include=f"^{re.escape(prefix)}\\.", groups_include="^$",
                                  cluster="real-e2e", source=unique("probe-real-e2e")))
        probe_thread = threading.Thread(target=probe.run, args=(stop_probe,), name="real-probe", daemon=True)
        probe_thread.start()

        def stop_the_probe():
            stop_probe.set()
            probe_thread.join(20)
            probe.close(flush_timeout=2)
        cleanup.callback(stop_the_probe)

        exporter = Exporter()
        port = exporter.serve(0)
        cleanup.callback(exporter.shutdown)
        cfg = JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(tmp / "ckpt"), events_topic=events,
                        alerts_topic=alerts, trigger_s=1, buckets=4, metrics_port=port, rules=SHORT_HOLDS)
        query = start(spark, cfg, exporter, query_name=unique("real-e2e"))

        def stop_the_query():
            writer.stop()
            stop_the_probe()
            stop_query(query)
        cleanup.callback(stop_the_query)

        rules_copy = tmp / "rules.short-for.yml"
        rules_copy.write_text(json.dumps(rules_with_short_for(), indent=2), encoding="utf-8")
        prom_cfg = json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_copy)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.split("//", 1)[1]]}]}]},
            "scrape_configs": [{"job_name": "kafka-monitor", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]})
        prom = PrometheusServer(prom_cfg, tmp / "prometheus").start()
        cleanup.callback(prom.stop)
        url = f"http://127.0.0.1:{port}/metrics"
        yield {"cluster": c, "rep": rep, "prefix": prefix, "url": url, "prom": prom, "query": query,
               "tansu": tansu, "alerts_topic": alerts, "writer": writer, "alertmanager": alertmanager}


def firing(real, alertname: str, topic: str) -> set[str]:
    """Partitions of ``topic`` for which Prometheus has ``alertname`` firing."""
    return {a["labels"].get("partition", "") for a in real["prom"].alerts()
            if a["labels"].get("alertname") == alertname and a["labels"].get("topic") == topic
            and a["state"] == "firing"}


def wait_job(real, topic: str, want: set[tuple[str, str]], timeout: float = 90, gone: bool = False):
    """Until every (alert, partition) in ``want`` is open on /metrics (or, with ``gone``, none is)."""
    def ok():
        assert real["query"].exception() is None, real["query"].exception()
        now = job_alerts(real["url"], topic)
        return (not (want & now)) if gone else want <= now
    wait_for(ok, timeout=timeout, interval=0.5,
             what=f"{'no ' if gone else ''}{sorted(want)} on /metrics for {topic} "
                  f"(open now: {sorted(job_alerts(real['url'], topic))})")


def notifications(real, broker: str) -> None:
    """With the shipped Alertmanager configuration, once BrokerDown for ``broker`` and the
    partition alerts of the same failure reached it: how many notifications they make (groups
    with an alert not inhibited), against the configuration before broker correlation (one per
    alert name and cluster, nothing inhibited) and against one per alert."""
    url = real["alertmanager"] + "/api/v2/alerts/groups?filter=cluster%3D%22real-e2e%22"

    def settled():
        groups = [g for g in json.load(urllib.request.urlopen(url, timeout=5)) if g["alerts"]]
        alerts = [a for g in groups for a in g["alerts"]]
        names = {a["labels"]["alertname"] for a in alerts}
        ok = {"BrokerDown", "UnderReplicated", "AtMinIsr", "IsrShrink"} <= names and all(
            a["status"]["state"] != "unprocessed" for a in alerts)
        return (groups, alerts) if ok else None
    groups, alerts = wait_for(settled, timeout=60, interval=1, what="BrokerDown and its partition alerts in Alertmanager")
    with_correlation = sum(1 for g in groups if any(a["status"]["state"] == "active" for a in g["alerts"]))
    before = len({a["labels"]["alertname"] for a in alerts})  # group_by [alertname, cluster], no broker rules
    print(f"\n[notifications] broker {broker} stopped: {len(alerts)} alerts in Alertmanager "
          f"({sorted(':'.join((a['labels']['alertname'], a['labels'].get('partition', ''), a['labels'].get('broker', ''), a['status']['state'])) for a in alerts)}); "
          f"notifications: {with_correlation} with broker correlation, {before} grouped by alert name only, "
          f"{len(alerts)} one per alert")
    assert with_correlation < before
    broker_groups = [g for g in groups if g["labels"].get("broker") == broker]
    assert broker_groups and any(a["labels"]["alertname"] == "BrokerDown" for g in broker_groups for a in g["alerts"])


def test_a_healthy_start_raises_nothing(real):
    rep = real["rep"]
    wait_for(lambda: f'kafka_monitor_partition_in_sync_replicas{{cluster="real-e2e",partition="1",topic="{rep}"}} 3.0'
             in urllib.request.urlopen(real["url"], timeout=5).read().decode(), timeout=120, interval=0.5,
             what="the ISR of both partitions on /metrics")
    time.sleep(5)  # a few batches and rule evaluations of a healthy cluster
    assert job_alerts(real["url"], rep) == set()
    active = [a["labels"] for a in real["prom"].alerts() if a["labels"].get("topic") == rep]
    assert active == [], active


def test_a_paused_follower_shrinks_the_isr_and_resuming_it_resolves(real):
    c, rep = real["cluster"], real["rep"]
    t0 = time.monotonic()
    c.pause_broker(3)
    try:
        want = {("IsrShrink", "0"), ("IsrShrink", "1"), ("UnderReplicated", "0"), ("UnderReplicated", "1"),
                ("AtMinIsr", "0"), ("AtMinIsr", "1")}
        wait_job(real, rep, want)
        opened = time.monotonic() - t0
        wait_for(lambda: firing(real, "IsrShrink", rep) == {"0", "1"}
                 and firing(real, "UnderReplicated", rep) == {"0", "1"}
                 and firing(real, "AtMinIsr", rep) == {"0", "1"}, timeout=30, interval=0.5,
                 what="IsrShrink, UnderReplicated, AtMinIsr firing for both partitions")
    finally:
        c.resume_broker(3)
    t1 = time.monotonic()
    wait_job(real, rep, {("IsrShrink", "0"), ("IsrShrink", "1"), ("UnderReplicated", "0"), ("UnderReplicated", "1"),
                         ("AtMinIsr", "0"), ("AtMinIsr", "1")}, gone=True)
    print(f"\npaused follower: job alerts open {opened:.1f}s after SIGSTOP, resolved {time.monotonic() - t1:.1f}s "
          f"after SIGCONT")
    wait_for(lambda: not firing(real, "IsrShrink", rep) and not firing(real, "AtMinIsr", rep),
             timeout=30, interval=0.5, what="the Prometheus alerts resolved")


def test_a_stopped_leader_then_a_second_broker_under_min_isr(real):
    c, rep = real["cluster"], real["rep"]
    c.stop_broker(2)  # leads partition 1
    try:
        wait_job(real, rep, {("LeaderChanged", "1"), ("UnderReplicated", "0"), ("UnderReplicated", "1"),
                             ("AtMinIsr", "0"), ("AtMinIsr", "1")})
        # one alert names the broker, beside the partition alerts it explains
        wait_for(lambda: ("BrokerDown", "2") in broker_alerts(real["url"]), timeout=60, interval=0.5,
                 what="BrokerDown for broker 2 on /metrics")
        wait_for(lambda: any(a["labels"].get("alertname") == "BrokerDown" and a["labels"].get("broker") == "2"
                             and a["state"] == "firing" for a in real["prom"].alerts()), timeout=30, interval=0.5,
                 what="BrokerDown firing for broker 2")
        notifications(real, broker="2")
        c.stop_broker(3)
        try:
            wait_job(real, rep, {("UnderMinIsr", "0"), ("UnderMinIsr", "1")})
            wait_for(lambda: {("BrokerDown", "2"), ("BrokerDown", "3")} <= broker_alerts(real["url"]), timeout=60,
                     interval=0.5, what="BrokerDown for brokers 2 and 3 on /metrics")
            wait_for(lambda: firing(real, "UnderMinIsr", rep) == {"0", "1"}, timeout=30, interval=0.5,
                     what="UnderMinIsr firing for both partitions")
        finally:
            c.start_broker(3)
    finally:
        c.start_broker(2)
    wait_job(real, rep, {("UnderMinIsr", "0"), ("UnderMinIsr", "1"), ("UnderReplicated", "0"),
                         ("UnderReplicated", "1"), ("AtMinIsr", "0"), ("AtMinIsr", "1")}, gone=True, timeout=120)
    wait_for(lambda: not firing(real, "UnderMinIsr", rep) and not firing(real, "UnderReplicated", rep),
             timeout=30, interval=0.5, what="the Prometheus alerts resolved")
    wait_for(lambda: not {a for a, _ in broker_alerts(real["url"])} & {"BrokerDown"}, timeout=60, interval=0.5,
             what="BrokerDown resolved for both brokers")
    c.elect_leaders("preferred", [(rep, 0), (rep, 1)])


def test_every_replica_gone_is_an_offline_partition_until_its_broker_returns(real):
    c, prefix = real["cluster"], real["prefix"]
    solo = f"{prefix}.solo"
    c.create_topic(solo, replica_assignment=[[3]])
    real["writer"].topics.append(solo)
    wait_for(lambda: f'kafka_monitor_partition_leader{{cluster="real-e2e",partition="0",topic="{solo}"}} 3.0'
             in urllib.request.urlopen(real["url"], timeout=5).read().decode(), timeout=60, interval=0.5,
             what="the new topic on /metrics")
    c.stop_broker(3)
    try:
        wait_job(real, solo, {("OfflinePartition", "0")})
        wait_for(lambda: firing(real, "OfflinePartition", solo) == {"0"}, timeout=30, interval=0.5,
                 what="OfflinePartition firing")
    finally:
        c.start_broker(3)
    wait_job(real, solo, {("OfflinePartition", "0")}, gone=True, timeout=120)
    real["writer"].topics.remove(solo)


def test_the_alerts_topic_has_every_transition_once_and_each_opened_alert_resolved(real):
    prefix = real["prefix"]

    def transitions():
        return [a for a in read_alerts(real["tansu"].bootstrap, real["alerts_topic"])
                if a["labels"].get("topic", "").startswith(prefix)]

    def settled():  # the last test's broker 3 also held the replicated topic's: its ISR regrows after
        out = transitions()
        done = {a["alert_id"] for a in out if a["action"] == "resolve"}
        return out if all(a["alert_id"] in done or a["alert"] == "LeaderChanged"
                          for a in out if a["action"] == "open") else None
    try:
        records = wait_for(settled, timeout=120, interval=2, what="every opened alert resolved on the alerts topic")
    except AssertionError:
        records = transitions()  # the assertion below names what stayed open
    keys = [(a["alert_id"], a["action"], a["at"]) for a in records]
    assert len(keys) == len(set(keys)), "a transition appears twice"
    opened = {a["alert_id"]: a for a in records if a["action"] == "open"}
    resolved = {a["alert_id"] for a in records if a["action"] == "resolve"}
    kinds = sorted({a["alert"] for a in opened.values()})
    print(f"\n{len(records)} transitions on the alerts topic: {kinds}")
    assert {"IsrShrink", "UnderReplicated", "AtMinIsr", "UnderMinIsr", "LeaderChanged", "OfflinePartition"} <= set(kinds)
    # LeaderChanged stays open until the leader has been quiet for leader_quiet_ms (5 min)
    unresolved = [a["alert"] for i, a in opened.items() if i not in resolved and a["alert"] != "LeaderChanged"]
    assert not unresolved, unresolved
