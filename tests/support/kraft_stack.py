"""The whole monitor on a KRaft cluster with three controllers, for the controller's and the
eligible leader replicas' faults (tests/e2e/test_kraft_faults.py, bench/kraft_bench.py).

    real cluster (3 controllers, 3 brokers): a topic with writes flowing and a consumer group
      committing, an ELR topic (replicas 1, 2, 3; min.insync.replicas 2)
      -> probe (every second, DescribeQuorum every second, ELR) -> events on a Tansu broker
      -> the Spark job (trigger 1 s) -> /metrics

The events and alerts live on a Tansu broker, so the watched cluster's faults are the only ones
the monitor sees.  ``Faults`` times each fault from its start to what ``/metrics`` shows.

``start_monitor`` (the events broker, the probe, the job and its exporter), ``Tail`` (the events
and alerts as they are written) and ``metric_samples`` are the parts the benches on the real
cluster share (bench/logdir_bench.py, bench/txn_bench.py)."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from kafka_monitor.local.broker import TansuBroker, create_topics
from kafka_monitor.local.kafka_cluster import KafkaCluster
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.job import JobConfig, start, stop_query
from streaming.sinks.exporter import Exporter
from tests.conftest import wait_for
from tests.support.real_cluster import MultiTopicWriter

CLUSTER = "kraft"
REP, ELR, GROUP = "kraft.rep", "kraft.elr", "kraft-app"
#: the alerts a controller's loss must not open: the partitions' and the groups'
PARTITION_AND_GROUP_ALERTS = ("IsrShrink", "UnderReplicated", "UnderMinIsr", "AtMinIsr", "OfflinePartition",
                              "PartitionNoEligibleLeader", "LeaderChanged", "HighWatermarkStalled",
                              "PartitionUnobserved", "ConsumerLagHigh", "ConsumerLagStatus", "RebalanceStorm",
                              "RebalanceStuck", "GroupEmptyWithLag")
_SAMPLE = re.compile(r"^(kafka_monitor_[a-z_]+)\{([^}]*)\} (\S+)$", re.M)


def metric_samples(url: str) -> list[tuple[str, dict, float]]:
    """The kafka_monitor_* samples ``url`` serves now, as (name, labels, value); [] when it does
    not answer."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return []
    return [(m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))), float(m.group(3)))
            for m in _SAMPLE.finditer(text)]


@dataclass
class Monitor:
    """What ``start_monitor`` started: the events broker and its topics, the probe on its thread,
    the job's query and its exporter's /metrics."""

    events_broker: TansuBroker
    events: str
    alerts: str
    probe: Probe
    probe_thread: threading.Thread
    query: Any
    url: str


def start_monitor(s: ExitStack, spark: Any, tmp: Any, cluster: KafkaCluster, probe_settings: dict,
                  rules: Optional[dict] = None, query_name: str = "monitor") -> Monitor:
    """A Tansu broker for the events and alerts, the probe of ``cluster`` (every second, the
    ``probe_settings`` ProbeConfig fields on top) and the Spark job (trigger 1 s, ``rules``:
    ``[job.rules]`` tables) with its exporter; each stopped by ``s``."""
    events_broker = TansuBroker().start()
    s.callback(events_broker.stop)
    events, alerts = "kafka-monitor.events", "kafka-monitor.alerts"
    create_topics(events_broker.bootstrap, {events: 3, alerts: 1})
    stop_probe = threading.Event()
    probe = Probe(ProbeConfig(**{
        "bootstrap_servers": cluster.bootstrap_servers, "events_kafka": {"bootstrap.servers": events_broker.bootstrap},
        "events_topic": events, "interval_s": 1, "request_timeout_s": 5, "refresh_backoff_s": 0.5,
        **probe_settings}))
    probe_thread = threading.Thread(target=probe.run, args=(stop_probe,), name=f"{query_name}-probe", daemon=True)
    probe_thread.start()

    def stop_the_probe() -> None:
        stop_probe.set()
        probe_thread.join(30)
        probe.close(flush_timeout=5)
    s.callback(stop_the_probe)
    exporter = Exporter()
    port = exporter.serve(0)
    s.callback(exporter.shutdown)
    cfg = JobConfig(bootstrap_servers=events_broker.bootstrap, checkpoint_dir=str(tmp / "ckpt"),
                    events_topic=events, alerts_topic=alerts, trigger_s=1, buckets=2, metrics_port=port,
                    **({"rules": rules} if rules else {}))
    query = start(spark, cfg, exporter, query_name=query_name)
    s.callback(stop_query, query)
    return Monitor(events_broker, events, alerts, probe, probe_thread, query, f"http://127.0.0.1:{port}/metrics")


class Tail(threading.Thread):
    """Every record written to the events topic and to ``others`` (on ``bootstrap``), from the
    beginning: the events of ``types`` decoded into ``events`` (Event objects), the others' records
    as JSON into ``records``."""

    def __init__(self, bootstrap: str, events_topic: str, types: Iterable[str], others: Iterable[str] = (),
                 name: str = "tail"):
        super().__init__(name=name, daemon=True)
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": name, "enable.auto.commit": False,
                            "log_level": 0})
        parts = []
        for topic in (events_topic, *others):
            meta = self._c.list_topics(topic, timeout=30).topics[topic]
            parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        self._c.assign(parts)
        self.events_topic, self.types = events_topic, frozenset(types)
        self.events: list[Any] = []
        self.records: list[dict] = []
        self._halt = threading.Event()

    def run(self) -> None:
        from monitor.contract import Event

        while not self._halt.is_set():
            m = self._c.poll(0.2)
            if m is None or m.error():
                continue
            try:
                if m.topic() == self.events_topic:
                    self.events += [e for e in Event.from_json(m.value()).expand() if e.type in self.types]
                else:
                    self.records.append(json.loads(m.value()))
            except Exception:  # noqa: BLE001 - not ours to judge here
                continue
        self._c.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class Committer(threading.Thread):
    """A consumer of ``topic`` (``REP``) in group ``group`` (``GROUP``) that keeps up and commits
    every second."""

    def __init__(self, bootstrap: str, topic: str = REP, group: str = GROUP):
        super().__init__(name="kraft-app", daemon=True)
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.commit.interval.ms": 1000,
                            "auto.offset.reset": "earliest", "log_level": 0})
        self._topic = topic
        self._halt = threading.Event()

    def run(self) -> None:
        self._c.subscribe([self._topic])
        while not self._halt.is_set():
            self._c.poll(0.5)
        self._c.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class KraftStack:
    """Start with ``with KraftStack(spark, tmp) as s:``; everything stops by PID at the end."""

    def __init__(self, spark: Any, tmp: Any, version: Optional[str] = None, cluster: Optional[KafkaCluster] = None,
                 probe_settings: Optional[dict] = None):
        """``cluster``: an unstarted cluster to use instead of the default one (three controllers;
        the stack starts and stops it, e.g. bench/logdir_bench.py's, with a log dir on a tmpfs);
        ``probe_settings``: ProbeConfig fields the stack does not set (``log_dirs_interval_s``)."""
        self.spark, self.tmp, self.version = spark, tmp, version
        self._cluster, self._probe_settings = cluster, dict(probe_settings or {})
        self._stack = ExitStack()

    def __enter__(self) -> "KraftStack":
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def _start(self) -> None:
        s = self._stack
        self.cluster = c = self._cluster or KafkaCluster(version=self.version, controllers=3)
        c.start()
        s.callback(c.stop)
        s.callback(self._heal)
        c.create_topic(REP, partitions=3, config={"min.insync.replicas": 2})
        c.create_topic(ELR, config={"min.insync.replicas": 2}, replica_assignment=[[1, 2, 3]])
        writer = MultiTopicWriter(c.bootstrap_servers, [REP, ELR]).start()
        s.callback(writer.stop)
        app = Committer(c.bootstrap_servers)
        app.start()
        s.callback(app.stop)
        m = start_monitor(s, self.spark, self.tmp, c, {
            "quorum_interval_s": 1, "elr_interval_s": 5, "topics_include": r"^kraft\.", "groups_include": "^kraft-",
            "cluster": CLUSTER, "source": "probe-kraft", **self._probe_settings}, query_name="kraft-faults")
        self.events_broker, self.events, self.alerts, self.probe = m.events_broker, m.events, m.alerts, m.probe
        self.probe_thread, self.query, self.url = m.probe_thread, m.query, m.url
        try:
            wait_for(lambda: self.quorum_leader() is not None and self.value("kafka_monitor_group_partition_lag",
                                                                           group=GROUP) is not None,
                     timeout=240, what="the quorum's leader and the group's lag on /metrics")
        except AssertionError as e:  # which of them, and how far the job got
            p = self.query.lastProgress or {}
            raise AssertionError(f"{e}: leader {self.quorum_leader()}, lag "
                                 f"{self.value('kafka_monitor_group_partition_lag', group=GROUP)}, query active "
                                 f"{self.query.isActive} ({self.query.exception()}), last batch {p.get('batchId')} "
                                 f"of {p.get('numInputRows')} rows, probe alive {self.probe_thread.is_alive()}") from None

    def _heal(self) -> None:
        c = self.cluster
        for b in c.broker_ids:
            if c._broker(b).paused:
                c.resume_broker(b)
        for cid, n in c.controllers.items():
            if n.paused:
                c.resume_controller(cid)
            elif not n.running():
                c.start_controller(cid)

    # -- /metrics -------------------------------------------------------------------------------

    def samples(self) -> list[tuple[str, dict, float]]:
        return metric_samples(self.url)

    def value(self, name: str, **labels: Any) -> Optional[float]:
        for n, lab, v in self.samples():
            if n == name and all(lab.get(k) == str(x) for k, x in labels.items()):
                return v
        return None

    def quorum_leader(self) -> Optional[int]:
        v = self.value("kafka_monitor_quorum_leader", cluster=CLUSTER)
        return None if v is None else int(v)

    def active(self, alert: str) -> bool:
        return any(n == "kafka_monitor_alert_active" and lab.get("alert") == alert and lab.get("cluster") == CLUSTER
                   for n, lab, _ in self.samples())

    def opened(self) -> dict[str, float]:
        """kafka_monitor_alert_transitions_total{action="open"} by alert."""
        return {lab["alert"]: v for n, lab, v in self.samples()
                if n == "kafka_monitor_alert_transitions_total" and lab.get("action") == "open"}

    def alive(self) -> bool:
        return self.query.isActive and self.probe_thread.is_alive()


class Faults:
    """The faults and their timings, from each fault's start (monotonic seconds)."""

    def __init__(self, stack: KraftStack):
        self.s = stack

    def controller(self, how: str, timeout: float = 120.0) -> dict:
        """SIGKILL (``kill``) or SIGSTOP past the election timeout (``pause``) the active
        controller; the new leader and QuorumVoterLagging on /metrics; then the controller back,
        and QuorumVoterLagging resolved.  Times in seconds from the fault."""
        s, c = self.s, self.s.cluster
        before = s.opened()
        lost = c.active_controller()
        assert s.quorum_leader() == lost, (s.quorum_leader(), lost)
        t0 = time.monotonic()
        (c.kill_controller if how == "kill" else c.pause_controller)(lost)
        try:
            new = wait_for(lambda: (lambda v: v if v not in (None, -1, lost) else None)(s.quorum_leader()), timeout,
                       interval=0.25, what=f"a new quorum leader on /metrics after the {how}")
            t_leader = time.monotonic() - t0
            wait_for(lambda: s.active("QuorumVoterLagging"), timeout, interval=0.25, what=f"QuorumVoterLagging on /metrics after the {how}")
            t_alert = time.monotonic() - t0
        finally:
            (c.start_controller if how == "kill" else c.resume_controller)(lost)
        t1 = time.monotonic()
        wait_for(lambda: not s.active("QuorumVoterLagging"), timeout + 60, interval=0.25, what="QuorumVoterLagging resolved on /metrics")
        t_resolved = time.monotonic() - t1
        after = s.opened()
        false = {a: after.get(a, 0) - before.get(a, 0) for a in PARTITION_AND_GROUP_ALERTS
                 if after.get(a, 0) != before.get(a, 0)}
        return {"fault": how, "lost": lost, "new_leader": new, "leader_on_metrics_s": round(t_leader, 1),
                "alert_on_metrics_s": round(t_alert, 1), "resolved_after_return_s": round(t_resolved, 1),
                "quorum_unavailable": after.get("QuorumUnavailable", 0) - before.get("QuorumUnavailable", 0),
                "partition_or_group_alerts": false, "alive": s.alive()}

    def elr(self, timeout: float = 120.0) -> dict:
        """Broker 2 paused (the ELR topic's ISR at min), then broker 3 (below: 3 is an eligible
        leader replica): the ELR on /metrics, from the moment the cluster's metadata shows the ISR
        below min; then both resumed, the gauge gone."""
        s, c = self.s, self.s.cluster
        lab = {"cluster": CLUSTER, "topic": ELR, "partition": 0}

        def isr() -> Optional[list]:
            try:
                return c.partitions(ELR)[0][2]
            except Exception:  # noqa: BLE001 - a paused broker can hold the request
                return None
        paused = []
        try:
            c.pause_broker(2)
            paused.append(2)
            wait_for(lambda: isr() == [1, 3], timeout, interval=0.25, what="the ELR topic's ISR at min.insync.replicas ([1, 3])")
            t0 = time.monotonic()
            c.pause_broker(3)
            paused.append(3)
            wait_for(lambda: isr() == [1], timeout, interval=0.25, what="the ELR topic's ISR below min.insync.replicas ([1])")
            t_isr = time.monotonic() - t0
            wait_for(lambda: s.value("kafka_monitor_partition_eligible_leader_replicas", **lab) == 1.0, timeout,
                 interval=0.25, what="the ELR (broker 3) on /metrics")
            t_metrics = time.monotonic() - t0
        finally:
            for b in paused:
                c.resume_broker(b)
        t1 = time.monotonic()
        wait_for(lambda: s.value("kafka_monitor_partition_eligible_leader_replicas", **lab) is None, timeout + 60,
             interval=0.25, what="the ELR gauge gone once the ISR is full")
        return {"fault": "elr", "isr_below_min_s": round(t_isr, 1), "elr_on_metrics_s": round(t_metrics, 1),
                "elr_on_metrics_after_isr_s": round(t_metrics - t_isr, 1),
                "gone_after_resume_s": round(time.monotonic() - t1, 1), "alive": s.alive()}
