"""A healthy system pages nobody: the demo's workload, a freshly started job and a real
Prometheus loading every shipped rule file, as a new user runs them.

    the demo's producer and consumer group (kafka_monitor.local.workload) -> Tansu
      -> probe (the demo's interval, fetch offsets) -> events topic (on Tansu)
    the same workload on the real 3-broker cluster
      -> a second probe (ListOffsets) -> the same events topic
      -> streaming.job.run (the demo's trigger; a fresh checkpoint) -> /metrics, alerts topic
      -> Prometheus (deploy/prometheus/rules/*.yml as shipped; scrape and evaluation every 2 s)

One job watches both clusters at once (each its own cluster label), as the README runs several.
Prometheus starts as soon as the fresh job serves /metrics, so the job's start-up is
evaluated too (counters created at 0, no batch yet).  The test then runs for QUIET_S seconds
of steady state and reads Prometheus's own ALERTS series over the whole run: an alert that
was ever pending is one whose expression was true on a healthy system, so nothing may be
pending, let alone firing, except what the demo causes on purpose
(kafka_monitor.demo.ON_PURPOSE), and that only for the demo's consumer group of that cluster.  Pending is
the test rather than firing so that `for:` periods of 5-15 minutes need not be waited out.
The job's own transitions (the alerts topic, complete where Prometheus samples) must be
those on-purpose ones too: that is where an alert the job opens at once shows first, as its
rule neither pends nor fires before the job's notify hold ([job.rules.notify]) has passed.

It also measures the pipeline's delay (a heartbeat's event time -> served by the exporter)
from kafka_monitor_source_heartbeat_delay_seconds and prints p50/p95.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest

from kafka_monitor.demo import ON_PURPOSE, PROBE_INTERVAL_S, TRIGGER_S
from kafka_monitor.local import workload
from kafka_monitor.local.broker import create_topics, free_port
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.job import JobConfig, run
from tests.conftest import unique, wait_for
from tests.support.alerts_topic import read_alerts
from tests.support.prometheus import PrometheusServer, prometheus_binary

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.slow]  # over 20 s (docs/tests.md)

BROKERS = ("tansu", "kafka")

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules"
#: seconds of steady state after the job's first batch (4 of the consumer's pause cycles);
#: KAFKA_MONITOR_QUIET_S runs it longer
QUIET_S = float(os.environ.get("KAFKA_MONITOR_QUIET_S", "120"))


def metric_value(url: str, name: str) -> float | None:
    try:
        body = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def healthy_run(tansu, spark, kafka_cluster, tmp_path_factory):
    """One healthy run watching two clusters side by side: the workload on Tansu (as the demo
    runs) and on the real cluster (3 brokers, replication factor 3, min.insync.replicas 2;
    offsets from ListOffsets, as a real deployment reads them), a probe on each into one events
    topic on Tansu, one job, one Prometheus.  (Two runs of this one after the other took twice
    the time for the same proof; one job watching two clusters is also how the README runs them.)"""
    if prometheus_binary() is None:
        pytest.fail("'prometheus' is not on PATH: install the Debian package prometheus", pytrace=False)
    tmp = tmp_path_factory.mktemp("quiet")
    events, alerts = unique("quiet-events"), unique("quiet-alerts")
    create_topics(tansu.bootstrap, {events: 3, alerts: 1})
    runs = {}
    for broker in BROKERS:
        topic, group = unique(f"quiet.{broker}.orders"), unique(f"quiet-{broker}-app")
        if broker == "kafka":
            watched, offsets_via = kafka_cluster.bootstrap_servers, "list_offsets"
            kafka_cluster.create_topic(topic, partitions=3, rf=3, config={"min.insync.replicas": 2})
        else:
            watched, offsets_via = tansu.bootstrap, "fetch"
            create_topics(tansu.bootstrap, {topic: 3})
        runs[broker] = {"watched": watched, "offsets_via": offsets_via, "topic": topic, "group": group,
                        "cluster": unique(f"quiet-{broker}"), "source": unique(f"quiet-{broker}-probe")}
    stop = threading.Event()
    with ExitStack() as cleanup:
        cleanup.callback(stop.set)
        threads, probes = [], []
        for broker, r in runs.items():
            for target, kw in ((workload.produce_loop, {"topic": r["topic"]}),
                               (workload.consume_loop, {"topic": r["topic"], "group": r["group"]})):
                t = threading.Thread(target=target, args=(r["watched"], stop), kwargs=kw, daemon=True)
                t.start()
                threads.append(t)
            probe = Probe(ProbeConfig(bootstrap_servers=r["watched"], events_topic=events, interval_s=PROBE_INTERVAL_S,
                                      events_kafka={"bootstrap.servers": tansu.bootstrap}, offsets_via=r["offsets_via"],
                                      topics_include=f"^{re.escape(r['topic'])}$",
                                      groups_include=f"^{re.escape(r['group'])}$", cluster=r["cluster"],
                                      source=r["source"]))
            t = threading.Thread(target=probe.run, args=(stop,), name=f"quiet-probe-{broker}", daemon=True)
            t.start()
            threads.append(t)
            probes.append(probe)

        port = free_port()
        cfg = JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(tmp / "ckpt"), events_topic=events,
                        alerts_topic=alerts, trigger_s=TRIGGER_S, buckets=4, metrics_port=port)
        job_error: list[BaseException] = []

        def run_job():
            try:
                run(cfg, stop_event=stop)
            except BaseException as e:  # reported by the test
                job_error.append(e)

        job = threading.Thread(target=run_job, name="quiet-job", daemon=True)
        job.start()

        def stop_all():
            stop.set()
            job.join(90)
            for th in threads:
                th.join(15)
            for probe in probes:
                probe.close(flush_timeout=2)
        cleanup.callback(stop_all)

        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: metric_value(url, "kafka_monitor_job_up") is not None or job_error, timeout=60,
                 what="the job's /metrics")
        prom_cfg = json.dumps({
            "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
            "rule_files": [str(RULES / "*.yml")],
            "scrape_configs": [{"job_name": "kafka-monitor", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        })
        prom = PrometheusServer(prom_cfg, tmp / "prometheus").start()
        cleanup.callback(prom.stop)
        # Before its first scrape Prometheus has no series at all, and its first evaluation
        # may come first (KafkaMonitorJobDown no_series, pending once): that is Prometheus
        # starting, not the job.  The window counts from the first scrape.
        wait_for(lambda: any(s["value"][1] == "1" for s in prom.query('up{job="kafka-monitor"}')), timeout=30,
                 what="Prometheus's first scrape of the job")
        t0 = time.time()
        wait_for(lambda: (metric_value(url, "kafka_monitor_job_last_batch_timestamp_seconds") or 0) > 0 or job_error,
                 timeout=180, what="the job's first micro-batch")
        first_batch_s = time.time() - t0
        deadline = time.monotonic() + QUIET_S
        while time.monotonic() < deadline and not job_error:
            time.sleep(1)
        assert not job_error, f"the job failed: {job_error[0]!r}"
        window = f"{int(time.time() - t0)}s"
        yield {"runs": runs, "prom": prom, "window": window, "first_batch_s": first_batch_s, "url": url,
               "alerts": read_alerts(tansu.bootstrap, alerts)}


def on_purpose(run, labels: dict) -> bool:
    """An alert the demo's workload causes on purpose: its name, and the group of that cluster."""
    return labels.get("alertname", labels.get("alert")) in ON_PURPOSE and any(
        labels.get("cluster") == r["cluster"] and labels.get("group") == r["group"] for r in run["runs"].values())


def test_no_shipped_rule_is_pending_or_firing_except_on_purpose(healthy_run):
    prom = healthy_run["prom"]
    seen = prom.query(f"count_over_time(ALERTS[{healthy_run['window']}])")
    assert prom.query('up{job="kafka-monitor"}'), "Prometheus scraped nothing"
    unexpected, purposeful = [], []
    for s in seen:
        labels = s["metric"]
        name, state = labels["alertname"], labels["alertstate"]
        line = f"{name} {state} for {s['value'][1]} evaluations {json.dumps(labels, sort_keys=True)}"
        if on_purpose(healthy_run, labels) and state == "pending":
            purposeful.append(line)
        else:
            unexpected.append(line)
    print(f"\nfirst batch {healthy_run['first_batch_s']:.1f}s after Prometheus started; "
          f"{len(purposeful)} on-purpose pending alert series; {len(unexpected)} unexpected")
    for line in purposeful:
        print("  on purpose:", line)
    assert not unexpected, "alerts pending or firing on a healthy system:\n" + "\n".join(unexpected)


def test_the_job_raises_only_the_demos_on_purpose_alerts(healthy_run):
    unexpected = [a for a in healthy_run["alerts"] if not on_purpose(healthy_run, a["labels"] | {"alert": a["alert"]})]
    kinds = sorted({a["alert"] for a in healthy_run["alerts"]})
    print(f"\njob transitions: {len(healthy_run['alerts'])} ({', '.join(kinds) or 'none'})")
    assert not unexpected, "the job raised alerts on healthy entities:\n" + "\n".join(
        json.dumps({k: a[k] for k in ("alert", "action", "labels", "evidence")}) for a in unexpected[:20])
    active = healthy_run["prom"].query(f"count_over_time(kafka_monitor_alert_active[{healthy_run['window']}])")
    assert all(on_purpose(healthy_run, s["metric"]) for s in active), active


def test_the_pipeline_delay_is_measured(healthy_run):
    prom, w = healthy_run["prom"], healthy_run["window"]
    q = {p: prom.query(f"histogram_quantile({p}, sum by (le) (increase(kafka_monitor_source_heartbeat_delay_seconds_bucket[{w}])))")
         for p in (0.5, 0.95)}
    count = prom.query(f"sum(increase(kafka_monitor_source_heartbeat_delay_seconds_count[{w}]))")
    p50, p95 = (float(q[p][0]["value"][1]) for p in (0.5, 0.95))
    print(f"\nheartbeat delay (event time -> served on /metrics), both probes: p50 {p50:.1f}s, p95 {p95:.1f}s "
          f"over {float(count[0]['value'][1]):.0f} heartbeats")
    assert float(count[0]["value"][1]) > 0
    # each probe's heartbeats reached the job all along: its last one is recent
    beats = {s["metric"]["source"]: float(s["value"][1]) for s in prom.query(
        "time() - kafka_monitor_source_last_heartbeat_timestamp_seconds")}
    for broker, r in healthy_run["runs"].items():
        assert beats.get(r["source"], float("inf")) < 30, f"no recent heartbeat of the {broker} probe: {beats}"
    # what the old rule paged on: the delay alone was more than 3 x the probe's interval
    assert 0 < p50 < 60
