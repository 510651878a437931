"""Detection quality, measured against the cluster's own record (DESIGN §7, issue 13).

A scenario suite on a real Apache Kafka cluster (``kafka_monitor.local.kafka_cluster``: KRaft,
a dedicated controller and 3 brokers on loopback), watched by the monitor as it ships: the probe
(``monitor.probe.Probe``, every ``--probe-interval`` s, otherwise its defaults) writes its
events to a separate Tansu broker (so no fault on the watched cluster hides the monitor's own
pipeline) or, with ``--layout own``, to the watched cluster itself (events and alerts topics RF 3,
min ISR 1, as the README tells a user to create them: every fault is also the monitor's), and
the job (``streaming.job.run`` in this process, local[2], trigger 5 s, otherwise
its defaults) serves ``/metrics`` and publishes to its alerts topic.  The bench polls
``/metrics`` every second (``kafka_monitor_alert_active`` series appearing and disappearing)
and reads the alerts topic at the end.

And the path to a person, as deployed (``bench/notify_stack.py``): a real Prometheus scrapes the
job's ``/metrics`` with the shipped ``deploy/prometheus/prometheus.yml``'s settings (its scrape
and evaluation intervals, its ``kafka-monitor`` scrape job) and evaluates the shipped rules
(``deploy/prometheus/rules/*.yml``, unmodified); it sends to a real Alertmanager running the
shipped ``deploy/alertmanager/alertmanager.yml`` (route tree, group_wait, group_interval,
repeat_interval, inhibit rules) with every receiver replaced by a webhook to a small HTTP server
in the bench, which records each notification (receive time, status, each alert's labels, status
and startsAt).  Both run on free loopback ports as child processes, stopped by PID at the end
or on failure; their configs are written to the run's temp dir and kept in the raw record.  So
besides the time from a condition's start to ``/metrics``, each alert type gets the time from the
condition's start to Alertmanager's first firing notification about it, how many of its
episodes notified, how many were shorter than the alert's notify hold (the job's
``[job.rules.notify]`` hold plus the rule's ``for:``: expected not to notify, not a miss), and
its false notifications.  Prometheus and Alertmanager are required: without the ``prometheus``
binary (Debian package prometheus) or ``prometheus-alertmanager``/``alertmanager`` (Debian
package prometheus-alertmanager) the bench stops at once, saying which is missing.

The probe runs as a child process (``bench/detection_probe.py``), as a deployment runs it:
librdkafka aborts or segfaults in coordinator-targeted admin requests when a broker stops
(issues #3663, #4605, #5040), which kills the probe; a supervisor starts it again after
``probe_restart_s`` and every exit is recorded.

Scenarios, each on its own topics and groups, repeated ``--repeats`` times; three lanes run side
by side within a repeat (the consumer-stopped scenario has to outlast the 10-minute
GroupEmptyWithLag rule; its topic and group are its own, so nothing is attributed to the wrong
scenario):

- replication lane, in sequence with a healthy gap between: a broker stopped (controlled
  shutdown) and returned; a follower paused (SIGSTOP, shorter than the session timeout: it holds
  the high watermark of the canary partitions it follows until the ISR shrinks by lag, then the
  ISR expands again); two brokers stopped (under min ISR on RF 3 / min ISR 2; an
  RF 1 and an RF 2 topic on those brokers go offline: all replicas lost); a preferred-leader
  election after those faults (leaders move back); partitions added to a topic; and a leader
  election on a topic whose replica order was changed at the start (PreferredLeaderImbalance
  for longer than its 5 minutes, then the election);
- consumer lane, once the broker faults are over (librdkafka can crash a consumer that leaves
  its group while the coordinator is away, #5347): a rebalance storm (a second member joins
  and leaves the group ``storm_cycles`` times), then a consumer slowed to a fifth of its
  producer's rate;
- stop lane: a consumer stopped (closed: the group is Empty) for ``stop_s`` seconds, then
  started again.

Healthy parts, all along: an idle topic (RF 3, written once at the start) with an idle, caught-up
consumer group; a steady topic with a consumer that keeps up (auto-commit every 5 s); and every
scenario's topics and groups outside their scenario.

Ground truth comes from the cluster, never from the monitor's events: partition conditions from
the controller's ``__cluster_metadata`` records (``KafkaCluster.dump_metadata_log``:
PartitionRecord / PartitionChangeRecord with their CreateTime), consumer conditions from admin
polls every 0.5 s (committed offsets, end offsets, the group's state) and from what the workload
itself did (``bench/detection_score.py`` has every definition).  The Prometheus-only baseline is
scored on the same ground truth in the same run: the cluster sampled every 30 s as
kafka_exporter exposes it, and the community rules as they ship with their ``for:``.

    python bench/detection_bench.py                 # the full run (~30 min on 2 cores)
    python bench/detection_bench.py --quick         # a smoke run (~9 min)
    python bench/detection_bench.py --layout own    # the monitor's topics on the watched cluster
    python bench/detection_bench.py --rescore /tmp/raw.json   # score a recorded run again

Prints a table (the notification columns beside the /metrics ones, and the Prometheus and
Alertmanager settings under it) and writes bench/results/detection.json (or
detection-quick.json), and the raw record (metadata records, polls, episodes, workload log, the
probe's events and stderr, the notifications and the alerting setup) to ``--raw-out``.
``--rescore`` of a record from before notifications were recorded scores as before, with empty
notification columns.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import detection_score as score  # noqa: E402  (bench/detection_score.py)
import notify_stack  # noqa: E402  (bench/notify_stack.py)
import report  # noqa: E402  (bench/report.py)

PREFIX = "db."
#: the probe's canary topic (one partition led by each broker: 0 by 1, 1 by 2, 2 by 3)
CANARY_TOPIC = PREFIX + "canary"
EVENTS_TOPIC = "kafka-monitor.events"
ALERTS_TOPIC = "kafka-monitor.alerts"
CLUSTER_LABEL = "bench"
log = logging.getLogger("detection_bench")


@dataclass
class Plan:
    repeats: int = 2
    probe_interval_s: float = 5.0
    trigger_s: float = 5.0
    warmup_s: float = 60.0
    join_s: float = 30.0          # a repeat's consumers join and catch up before its lanes start
    # replication lane
    le_reassign_at: float = 5.0
    le_hold_s: float = 330.0      # leader != preferred before the election (> 300 s: PreferredLeaderImbalance)
    broker_stop_at: float = 30.0
    broker_down_s: float = 45.0
    pause_s: float = 35.0         # > replica lag (20-30 s), < broker_session_timeout_ms: the follower leaves the ISR by lag, not fenced
    two_down_s: float = 45.0
    gap_s: float = 30.0
    # consumer lane (starts when the replication lane's broker faults are over: no consumer
    # closes while a coordinator may be away -- librdkafka #5347)
    storm_cycles: int = 4
    storm_member_s: float = 10.0
    storm_gap_s: float = 10.0
    slow_s: float = 240.0         # ConsumerLagHigh: > 10,000 behind (at ~125 s) held for 60 s
    slow_rate: float = 20.0       # records/s while slow (the producer writes 100/s)
    # stop lane
    stop_at: float = 15.0
    stop_s: float = 630.0         # > 600 s: GroupEmptyWithLag
    settle_s: float = 20.0
    tail_s: float = 60.0
    # a broker restarted within its session timeout after a controlled shutdown is told to shut
    # down again (Kafka 4.1: "fatal error while waiting for the controller to acknowledge that we
    # are caught up"): the downtimes above outlast it
    session_timeout_ms: int = 40_000
    replica_lag_time_max_ms: int = 20_000  # a paused follower holds the HW 20-30 s (Kafka's default: 30 s)
    probe_restart_s: float = 5.0  # a supervisor starts a probe that exited again after this long


def quick_plan() -> Plan:
    return Plan(repeats=1, warmup_s=30.0, join_s=20.0, le_hold_s=40.0, broker_stop_at=20.0, broker_down_s=45.0,
                two_down_s=45.0, gap_s=15.0, storm_cycles=3, storm_member_s=8.0, storm_gap_s=8.0,
                slow_s=100.0, stop_at=10.0, stop_s=130.0, settle_s=10.0, tail_s=30.0)


class Stopped(Exception):
    """The run is being stopped (Ctrl-C, SIGTERM, or a lane failed)."""


class NullLogger:
    def log(self, *a, **k):
        pass

    def __getattr__(self, name):
        return self.log


# ----------------------------------------------------------------------------------------------
# what the workload did, and when
# ----------------------------------------------------------------------------------------------

class Journal:
    def __init__(self):
        self._lock = threading.Lock()
        self.entries: list[dict] = []

    def add(self, event: str, **kw: Any) -> dict:
        e = {"t": time.time(), "event": event, **kw}
        with self._lock:
            self.entries.append(e)
        detail = " ".join(f"{k}={v}" for k, v in kw.items() if k not in ("partitions",))
        log.info("%s %s", event, detail)
        return e

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.entries)


# ----------------------------------------------------------------------------------------------
# workload: producers and consumers
# ----------------------------------------------------------------------------------------------

class Producers(threading.Thread):
    """One producer writing ``rate`` records/s to each registered topic (round robin over the
    given partitions), acks=1 so writes go on while a partition is under min ISR."""

    def __init__(self, bootstrap: str, stop: threading.Event):
        super().__init__(name="bench-producer", daemon=True)
        from confluent_kafka import Producer
        self._p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 20, "log_level": 0,
                            "logger": NullLogger()})
        self._halt = stop
        self._lock = threading.Lock()
        self.rates: dict[str, tuple[float, list[int]]] = {}
        self.sent = 0

    def set_rate(self, topic: str, rate: float, partitions: list[int]) -> None:
        with self._lock:
            if rate <= 0:
                self.rates.pop(topic, None)
            else:
                self.rates[topic] = (rate, list(partitions))

    def run(self) -> None:
        carry: dict[str, float] = {}
        n = 0
        while not self._halt.is_set():
            t0 = time.monotonic()
            with self._lock:
                rates = dict(self.rates)
            for topic, (rate, parts) in rates.items():
                carry[topic] = carry.get(topic, 0.0) + rate / 10.0
                k = int(carry[topic])
                carry[topic] -= k
                for _ in range(k):
                    try:
                        self._p.produce(topic, b'{"n":%d}' % n, partition=parts[n % len(parts)])
                        n += 1
                    except BufferError:
                        self._p.poll(0.05)
                    except Exception:  # noqa: BLE001  (a topic being created; try again next tick)
                        break
            self._p.poll(0)
            self.sent = n
            self._halt.wait(max(0.0, 0.1 - (time.monotonic() - t0)))
        self._p.flush(5)


class AppConsumer(threading.Thread):
    """An application consumer (librdkafka defaults: session 45 s, heartbeat 3 s, auto-commit
    every 5 s) in its own thread, controlled by ``mode``: ``run`` (as fast as it can), ``slow``
    (``slow_rate`` records/s), ``closed`` (the consumer is closed: it left its group), or
    ``exit``.  Every ``on_assign`` goes to the journal."""

    def __init__(self, bootstrap: str, group: str, topic: str, journal: Journal, name: str,
                 events: Optional[dict] = None, scenario: Optional[str] = None, repeat: Optional[int] = None):
        super().__init__(name=f"consumer-{name}", daemon=True)
        self.bootstrap, self.group, self.topic, self.journal, self.member = bootstrap, group, topic, journal, name
        self.events = events
        self.mode = "run"
        self.slow_rate = 20.0
        self.consumed = 0
        self.error: Optional[str] = None
        self.members: Optional[Callable[[], int]] = None  # how many members of the group are open
        self.scenario, self.repeat = scenario, repeat

    def set_mode(self, mode: str) -> None:
        self.mode = mode

    def _new(self):
        conf = {"bootstrap.servers": self.bootstrap, "group.id": self.group, "auto.offset.reset": "earliest",
                "client.id": self.member, "log_level": 0, "logger": NullLogger()}
        if self.events is not None:
            from monitor.instrument import InstrumentedConsumer
            c = InstrumentedConsumer(conf, events=self.events, cluster=CLUSTER_LABEL, source=f"app-{self.member}")
        else:
            from confluent_kafka import Consumer
            c = Consumer(conf)

        def on_assign(consumer, parts):
            self.journal.add("assign", group=self.group, member=self.member,
                             partitions=[f"{p.topic}/{p.partition}" for p in parts])

        c.subscribe([self.topic], on_assign=on_assign)
        return c

    def run(self) -> None:
        c = None
        try:
            while True:
                mode = self.mode
                if mode == "exit":
                    break
                if mode == "closed":
                    if c is not None:
                        c.close()
                        c = None
                        self.journal.add("member_left", group=self.group, member=self.member,
                                         last_member=bool(self.members is not None and self.members() == 0))
                    time.sleep(0.1)
                    continue
                if c is None:
                    c = self._new()
                    self.journal.add("member_joined", group=self.group, member=self.member)
                if mode == "slow":
                    t0 = time.monotonic()
                    m = c.poll(0.2)
                    if m is not None and not m.error():
                        self.consumed += 1
                        time.sleep(max(0.0, 1.0 / self.slow_rate - (time.monotonic() - t0)))
                else:
                    msgs = c.consume(num_messages=500, timeout=0.2)
                    self.consumed += sum(1 for m in msgs if not m.error())
        except Exception as e:  # noqa: BLE001
            self.error = repr(e)
            log.error("consumer %s failed: %s", self.member, traceback.format_exc())
        finally:
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass


# ----------------------------------------------------------------------------------------------
# observers: admin polls (ground truth for consumers) and /metrics polls (the monitor)
# ----------------------------------------------------------------------------------------------

class AdminPoller(threading.Thread):
    """Every ``interval`` s: each tracked group's committed offsets, the end offsets of its
    partitions, and the group's state; far more often than the probe.

    No coordinator-targeted admin request (ListConsumerGroupOffsets, DescribeConsumerGroups):
    librdkafka aborts or segfaults in those when a group's coordinator moves (issues #4605,
    #3663, #5040), which is what the scenarios do.  Committed offsets come from one
    non-joining consumer per group (``committed()``, the consumer's own OffsetFetch path), end
    offsets from ListOffsets to the leaders, states from ListGroups to every broker."""

    def __init__(self, bootstrap: str, stop: threading.Event, interval: float = 0.5):
        super().__init__(name="bench-admin-poller", daemon=True)
        from concurrent.futures import ThreadPoolExecutor
        from confluent_kafka.admin import AdminClient
        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000,
                                  "socket.connection.setup.timeout.ms": 3000, "log_level": 0, "logger": NullLogger()})
        self._halt = stop
        self.interval = interval
        self._lock = threading.Lock()
        self.groups: dict[str, list[tuple[str, int]]] = {}
        self._observers: dict[str, Any] = {}
        self._pool = ThreadPoolExecutor(6, thread_name_prefix="bench-committed")
        self.samples: list[dict] = []
        self.failures = 0
        self._refreshed = 0.0

    def track(self, group: str, topic: str, partitions: list[int]) -> None:
        with self._lock:
            self.groups[group] = [(topic, p) for p in partitions]

    def latest_lag(self, group: str) -> Optional[int]:
        with self._lock:
            for s in reversed(self.samples):
                offs = (s.get("committed") or {}).get(group)
                if offs is None:
                    continue
                ends = s.get("end") or {}
                if any(ends.get(tp) is None for tp in offs) or not offs:
                    continue
                return sum(max(0, ends[tp] - (c if c is not None else 0)) for tp, c in offs.items())
        return None

    def _observer(self, group: str):
        from confluent_kafka import Consumer
        c = self._observers.get(group)
        if c is None:
            c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group, "enable.auto.commit": False,
                          "socket.timeout.ms": 3000, "log_level": 0, "logger": NullLogger()})
            self._observers[group] = c
        return c

    def _committed(self, group: str, tps: list[tuple[str, int]]) -> Optional[dict]:
        from confluent_kafka import TopicPartition
        try:
            res = self._observer(group).committed([TopicPartition(t, p) for t, p in tps], timeout=3)
        except Exception:  # noqa: BLE001
            return None
        return {f"{tp.topic}/{tp.partition}": (tp.offset if tp.offset >= 0 else None) for tp in res
                if tp.error is None}

    def run(self) -> None:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec
        while not self._halt.is_set():
            t0 = time.time()
            with self._lock:
                groups = {g: list(tps) for g, tps in self.groups.items()}
            if not groups:
                self._halt.wait(self.interval)
                continue
            tps = sorted({tp for v in groups.values() for tp in v})
            sample: dict[str, Any] = {"committed": {}, "end": {}, "groups": {}}
            if t0 - self._refreshed > 2.0:
                # ListOffsets answers "No leaders found" for a partition whose leader broker
                # stopped until the admin client's metadata is refreshed, even after the leader
                # is back; a Metadata request refreshes it
                try:
                    self.admin.list_topics(timeout=3)
                except Exception:  # noqa: BLE001
                    pass
                self._refreshed = t0
            f_com = {g: self._pool.submit(self._committed, g, v) for g, v in groups.items()}
            try:
                f_end = self.admin.list_offsets({TopicPartition(t, p): OffsetSpec.latest() for t, p in tps},
                                                request_timeout=3)
                f_list = self.admin.list_consumer_groups(request_timeout=3)
            except Exception:  # noqa: BLE001
                self.failures += 1
                f_end, f_list = {}, None
            for tp, f in f_end.items():
                try:
                    off = f.result(timeout=4).offset
                    if off is not None and off >= 0:  # -1001 right after a leader stopped
                        sample["end"][f"{tp.topic}/{tp.partition}"] = off
                except Exception:  # noqa: BLE001
                    self._refreshed = 0.0
            try:
                listing = f_list.result(timeout=4) if f_list is not None else None
                states = {g.group_id: g.state for g in listing.valid} if listing is not None else {}
                for g in groups:
                    st = states.get(g)
                    sample["groups"][g] = (st.name.title().replace("_", "") if st is not None else "Absent", None) \
                        if listing is not None else None
            except Exception:  # noqa: BLE001
                pass
            for g, f in f_com.items():
                try:
                    sample["committed"][g] = f.result(timeout=5)
                except Exception:  # noqa: BLE001
                    sample["committed"][g] = None
            t1 = time.time()
            sample["t"] = (t0 + t1) / 2
            sample["took"] = t1 - t0
            with self._lock:
                self.samples.append(sample)
            self._halt.wait(max(0.0, self.interval - (time.time() - t0)))
        self._pool.shutdown(wait=False)
        for c in self._observers.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


class ProbeSupervisor(threading.Thread):
    """The probe in a child process (``bench/detection_probe.py``), started again
    ``restart_s`` after it exits, as systemd or Kubernetes would; every exit and restart goes
    to the journal with the tail of the probe's stderr.  Started from this thread, which lives as
    long as the run: the child's parent-death signal is tied to it."""

    def __init__(self, cfg: dict, journal: Journal, stop: threading.Event, log_path: pathlib.Path,
                 restart_s: float = 5.0):
        super().__init__(name="bench-probe-supervisor", daemon=True)
        self.cfg, self.journal, self._halt, self.log_path, self.restart_s = cfg, journal, stop, log_path, restart_s
        self.proc = None
        self.exits: list[dict] = []
        self.done = threading.Event()

    def run(self) -> None:
        import subprocess

        from kafka_monitor.local.broker import die_with_parent
        try:
            while not self._halt.is_set():
                with open(self.log_path, "ab") as err:
                    offset = err.tell()
                    self.proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "detection_probe.py"),
                                                  json.dumps(self.cfg)], stdin=subprocess.DEVNULL,
                                                 stdout=subprocess.DEVNULL, stderr=err, preexec_fn=die_with_parent)
                self.journal.add("probe_started", pid=self.proc.pid)
                while self.proc.poll() is None and not self._halt.is_set():
                    self._halt.wait(0.2)
                if self._halt.is_set():
                    break
                tail = ""
                try:
                    with open(self.log_path, "rb") as f:
                        f.seek(offset)
                        tail = f.read().decode(errors="replace")[-1500:]
                except OSError:
                    pass
                rc = self.proc.returncode
                e = self.journal.add("probe_exited", returncode=rc,
                                     signal=signal.Signals(-rc).name if rc is not None and rc < 0 else None,
                                     stderr_tail=tail.strip().splitlines()[-3:])
                self.exits.append(e)
                self._halt.wait(self.restart_s)
        finally:
            self.stop_child()
            self.done.set()

    def stop_child(self) -> None:
        from kafka_monitor.local.broker import stop_process
        if self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc, 15)


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class MetricsPoller(threading.Thread):
    """GET /metrics every second; a ``kafka_monitor_alert_active`` series present = the alert is
    open.  Records each series' episodes (first seen, first poll without it)."""

    def __init__(self, url: str, stop: threading.Event, interval: float = 1.0):
        super().__init__(name="bench-metrics-poller", daemon=True)
        self.url, self._halt, self.interval = url, stop, interval
        self.open: dict[tuple, dict] = {}
        self.episodes: list[dict] = []
        self.polls = 0
        self.failures = 0
        self.first_batch_at: Optional[float] = None
        self.partitions_seen_at: Optional[float] = None
        self.last_body = ""
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._halt.is_set():
            t0 = time.time()
            try:
                body = urllib.request.urlopen(self.url, timeout=3).read().decode()
            except Exception:  # noqa: BLE001
                self.failures += 1
                self._halt.wait(self.interval)
                continue
            t = time.time()
            self.polls += 1
            self.last_body = body
            seen: dict[tuple, str] = {}
            for line in body.splitlines():
                if line.startswith("kafka_monitor_alert_active{"):
                    labels = dict(_LABEL.findall(line[line.index("{"):line.rindex("}") + 1]))
                    sev = labels.pop("severity", "")
                    seen[tuple(sorted(labels.items()))] = sev
                elif self.first_batch_at is None and line.startswith("kafka_monitor_job_batches_total "):
                    if float(line.split()[1]) > 0:
                        self.first_batch_at = t
                elif self.partitions_seen_at is None and line.startswith("kafka_monitor_partition_in_sync_replicas{") \
                        and f'topic="{PREFIX}' in line:
                    self.partitions_seen_at = t
            with self._lock:
                for key, sev in seen.items():
                    ep = self.open.get(key)
                    if ep is None:
                        labels = dict(key)
                        self.open[key] = {"alert": labels.get("alert"), "labels": labels, "open": t, "close": None,
                                          "severities": [sev]}
                    elif ep["severities"][-1] != sev:
                        ep["severities"].append(sev)
                for key in [k for k in self.open if k not in seen]:
                    ep = self.open.pop(key)
                    ep["close"] = t
                    self.episodes.append(ep)
            self._halt.wait(max(0.0, self.interval - (time.time() - t0)))

    def all_episodes(self) -> list[dict]:
        with self._lock:
            return self.episodes + [dict(e) for e in self.open.values()]


def heartbeat_delay_quantiles(body: str) -> dict:
    """p50/p95 of kafka_monitor_source_heartbeat_delay_seconds from its buckets (linear within
    a bucket, as histogram_quantile does)."""
    buckets = []
    for m in re.finditer(r'^kafka_monitor_source_heartbeat_delay_seconds_bucket\{le="([^"]+)"\} (\S+)$', body, re.M):
        buckets.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return {}
    total = buckets[-1][1]
    out = {"count": total}
    for q in (0.5, 0.95):
        rank = q * total
        prev_le, prev_c = 0.0, 0.0
        for le, c in buckets:
            if c >= rank:
                if le == float("inf"):
                    out[f"p{int(q * 100)}_s"] = prev_le
                else:
                    out[f"p{int(q * 100)}_s"] = prev_le + (le - prev_le) * ((rank - prev_c) / max(1e-9, c - prev_c))
                break
            prev_le, prev_c = le, c
    return out


def events_summary(bootstrap: str, topic: str, t0: float, timeout: float = 120.0) -> dict:
    """What the probe actually sent: per event type, counts per 10-s bucket (from ``t0``);
    every heartbeat's observed_at, seq, started_at, source and its record's timestamp with the
    timestamp's type (1 create time, 2 log append time); every metadata refresh's observed_at, ok, duration_ms, reason
    and source (what MetadataStale measures)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-events-{os.getpid()}",
                  "enable.partition.eof": True, "enable.auto.commit": False, "log_level": 0, "logger": NullLogger()})
    buckets: dict[str, dict[int, int]] = {}
    heartbeats, refreshes = [], []
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        eof: set = set()
        deadline = time.monotonic() + timeout
        while len(eof) < len(parts) and time.monotonic() < deadline:
            for m in c.consume(5000, timeout=1):
                if m.error():
                    eof.add(m.partition())
                    continue
                try:
                    e = json.loads(m.value())
                except ValueError:
                    continue
                typ, at = e.get("type"), (e.get("observed_at") or 0) / 1000.0
                b = buckets.setdefault(typ, {})
                k = int((at - t0) // 10)
                b[k] = b.get(k, 0) + 1
                d = e.get("data") or e.get("payload") or e
                if typ == "heartbeat":
                    ts_type, ts = m.timestamp()  # 1: the producer's create time, 2: log append time
                    heartbeats.append([round(at - t0, 3), e.get("seq"), d.get("started_at"), e.get("source"),
                                       round(ts / 1000.0 - t0, 3) if ts_type in (1, 2) else None, ts_type])
                elif typ == "metadata_refresh":
                    refreshes.append([round(at - t0, 3), d.get("ok"), d.get("duration_ms"), d.get("reason"),
                                      e.get("source")])
    finally:
        c.close()
    heartbeats.sort(key=lambda h: h[0])
    refreshes.sort(key=lambda r: r[0])
    return {"t0": t0, "bucket_s": 10, "counts": {t: {str(k): v for k, v in sorted(b.items())} for t, b in buckets.items()},
            "heartbeats": heartbeats, "metadata_refreshes": refreshes}


def read_alerts(bootstrap: str, topic: str, timeout: float = 60.0) -> list[dict]:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-read-{os.getpid()}", "enable.partition.eof": True,
                  "enable.auto.commit": False, "log_level": 0, "logger": NullLogger()})
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out, eof = [], set()
        deadline = time.monotonic() + timeout
        while len(eof) < len(parts) and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=1):
                if m.error():
                    eof.add(m.partition())
                else:
                    try:
                        out.append(json.loads(m.value()))
                    except ValueError:
                        pass
        return out
    finally:
        c.close()


# ----------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------

class Bench:
    def __init__(self, plan: Plan, args: argparse.Namespace):
        self.plan, self.args = plan, args
        self.stop = threading.Event()       # stops everything
        self.journal = Journal()
        self.cluster = None
        self.tansu = None
        self.producers: Optional[Producers] = None
        self.poller: Optional[AdminPoller] = None
        self.metrics: Optional[MetricsPoller] = None
        self.notify: Optional[notify_stack.NotifyStack] = None
        self.consumers: list[AppConsumer] = []
        self.members_open: dict[str, set] = {}
        self.lane_errors: list[str] = []
        self.facts: dict[str, Any] = {}
        self.healthy: list[str] = []
        self.job_error: list[BaseException] = []
        self.topics: dict[str, dict] = {}
        self.faults_done: dict[int, threading.Event] = {}
        from concurrent.futures import ThreadPoolExecutor
        # broker processes are started (and signalled) from this one long-lived thread: the
        # cluster ties a broker's parent-death signal to the thread that started it
        self._ops = ThreadPoolExecutor(1, thread_name_prefix="cluster-ops")

    def op(self, fn: Callable, *a: Any) -> Any:
        return self._ops.submit(fn, *a).result()

    # -- helpers

    def sleep(self, s: float) -> None:
        if self.stop.wait(max(0.0, s)):
            raise Stopped()

    def at(self, t0: float, rel: float) -> None:
        self.sleep(t0 + rel - time.time())

    def topic(self, name: str, assignment: list[list[int]], min_isr: Optional[int] = None, rate: float = 0.0,
              healthy: bool = False) -> str:
        full = PREFIX + name
        cfg = {"min.insync.replicas": min_isr} if min_isr else None
        self.cluster.create_topic(full, replica_assignment=assignment, config=cfg)
        self.topics[full] = {"assignment": assignment, "min_isr": min_isr, "rate": rate}
        if rate:
            self.producers.set_rate(full, rate, list(range(len(assignment))))
        if healthy:
            self.healthy.append(full)
        return full

    def consumer(self, group: str, topic: str, member: str, healthy: bool = False) -> AppConsumer:
        g = PREFIX + group
        c = AppConsumer(self.cluster.bootstrap_servers, g, topic, self.journal, member, events=self.app_events)
        c.members = lambda g=g: len(self.members_open.get(g, set()))
        self.members_open.setdefault(g, set()).add(member)
        c.start()
        self.consumers.append(c)
        self.poller.track(g, topic, list(range(len(self.topics[topic]["assignment"]))))
        if healthy and g not in self.healthy:
            self.healthy.append(g)
        return c

    def close_consumer(self, c: AppConsumer) -> None:
        self.members_open.get(c.group, set()).discard(c.member)
        c.set_mode("closed")

    def open_consumer(self, c: AppConsumer) -> None:
        self.members_open.setdefault(c.group, set()).add(c.member)
        c.set_mode("run")

    def wait_caught_up(self, group: str, timeout: float = 90.0, within: int = 1000) -> bool:
        """Until the group's lag is at most ``within`` (auto-commit every 5 s behind a producer
        that keeps writing: the committed lag is rarely 0)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            lag = self.poller.latest_lag(group)
            if lag is not None and lag <= within:
                return True
            self.sleep(0.5)
        log.warning("group %s not caught up after %.0fs", group, timeout)
        return False

    def wait_isr_full(self, timeout: float = 120.0) -> float:
        t0 = time.time()
        while time.time() - t0 < timeout:
            ok = True
            try:
                md = self.cluster.metadata(timeout=3)
                for name, t in md.topics.items():
                    if not name.startswith(PREFIX):
                        continue
                    for p in t.partitions.values():
                        if p.leader < 0 or set(p.isrs) != set(p.replicas):
                            ok = False
            except Exception:  # noqa: BLE001
                ok = False
            if ok:
                return time.time() - t0
            self.sleep(0.5)
        log.warning("ISR not whole after %.0fs", timeout)
        return time.time() - t0

    def scenario(self, name: str, repeat: int, phase: str, **kw) -> None:
        self.journal.add(f"scenario_{phase}", scenario=name, repeat=repeat, **kw)

    # -- lanes of one repeat

    def lane_replication(self, r: int, t0: float, T: dict) -> None:
        p, c = self.plan, self.cluster
        self.at(t0, p.le_reassign_at)
        self.scenario("leader_election", r, "start")
        self.journal.add("reassign", topic=T["le"], partition=0, replicas=[2, 1, 3], scenario="leader_election", repeat=r)
        c.reassign(T["le"], 0, [2, 1, 3])
        self.journal.add("reassigned", topic=T["le"], partition=0)

        self.at(t0, p.broker_stop_at)
        self.scenario("broker_stopped", r, "start")
        self.journal.add("stop_broker", broker=2)
        self.op(c.stop_broker, 2)
        self.journal.add("broker_stopped", broker=2)
        self.sleep(p.broker_down_s)
        self.journal.add("start_broker", broker=2)
        self.op(c.start_broker, 2)
        self.journal.add("broker_started", broker=2)
        self.wait_isr_full()
        self.scenario("broker_stopped", r, "end")
        self.sleep(p.gap_s)

        self.scenario("follower_paused", r, "start")
        self.journal.add("pause_broker", broker=3)
        self.op(c.pause_broker, 3)
        try:
            self.sleep(p.pause_s)
        finally:
            self.op(c.resume_broker, 3)
            self.journal.add("resume_broker", broker=3)
        self.wait_isr_full()
        self.scenario("follower_paused", r, "end")
        self.sleep(p.gap_s)

        self.scenario("two_replicas_lost", r, "start")
        for b in (2, 3):
            self.journal.add("stop_broker", broker=b)
            self.op(c.stop_broker, b)
            self.journal.add("broker_stopped", broker=b)
        self.sleep(p.two_down_s)
        for b in (2, 3):
            self.journal.add("start_broker", broker=b)
            self.op(c.start_broker, b)
            self.journal.add("broker_started", broker=b)
        self.wait_isr_full()
        self.scenario("two_replicas_lost", r, "end")
        self.faults_done[r].set()
        self.sleep(p.gap_s)

        # the leaders the faults moved go back: a preferred election on everything but the
        # leader-election topic (which is mid-scenario)
        self.scenario("preferred_election", r, "start")
        tps = [(t, part) for t in self.topics if t != T["le"] for part in range(self._partitions(t))]
        self.journal.add("elect_preferred", partitions=len(tps))
        res = c.elect_leaders("preferred", tps)
        bad = {f"{k[0]}/{k[1]}": str(v) for k, v in res.items() if v is not None}
        if bad:
            self.journal.add("elect_preferred_errors", errors=bad)
        self.sleep(5)
        self.scenario("preferred_election", r, "end")
        self.sleep(p.gap_s)

        self.scenario("partitions_added", r, "start")
        self.journal.add("add_partitions", topic=T["pa"], total=3)
        c.add_partitions(T["pa"], 3)
        self.topics[T["pa"]]["assignment"] = self.topics[T["pa"]]["assignment"] + [[1, 2, 3], [1, 2, 3]]
        self.scenario("partitions_added", r, "end")

        self.at(t0, p.le_reassign_at + p.le_hold_s)
        self.journal.add("elect_preferred", topic=T["le"], partition=0)
        res = c.elect_leaders("preferred", [(T["le"], 0)])
        self.journal.add("elected", result={f"{k[0]}/{k[1]}": str(v) for k, v in res.items()})
        self.sleep(5)
        self.scenario("leader_election", r, "end")

    def lane_consumers(self, r: int, t0: float, T: dict, C: dict) -> None:
        p = self.plan
        while not self.faults_done[r].wait(0.5):
            if self.stop.is_set():
                raise Stopped()
        self.sleep(p.gap_s)
        self.scenario("rebalance_storm", r, "start")
        flapper = C["storm_flapper"]
        for _i in range(p.storm_cycles):
            self.open_consumer(flapper)
            if not flapper.is_alive():
                flapper.start()
            self.sleep(p.storm_member_s)
            self.close_consumer(flapper)
            self.sleep(p.storm_gap_s)
        self.scenario("rebalance_storm", r, "end")
        self.sleep(p.gap_s)

        self.scenario("consumer_slow", r, "start")
        slow = C["slow"]
        slow.slow_rate = p.slow_rate
        self.journal.add("slow_start", group=slow.group, scenario="consumer_slow", repeat=r)
        slow.set_mode("slow")
        self.sleep(p.slow_s)
        slow.set_mode("run")
        self.journal.add("slow_end", group=slow.group, scenario="consumer_slow", repeat=r)
        self.wait_caught_up(slow.group)
        self.scenario("consumer_slow", r, "end")

    def lane_stop(self, r: int, t0: float, T: dict, C: dict) -> None:
        p = self.plan
        self.at(t0, p.stop_at)
        self.scenario("consumer_stopped", r, "start")
        c = C["stop"]
        self.journal.add("consumer_stop", group=c.group, scenario="consumer_stopped", repeat=r)
        self.close_consumer(c)
        self.sleep(p.stop_s)
        self.open_consumer(c)
        self.journal.add("consumer_start", group=c.group, scenario="consumer_stopped", repeat=r)
        self.wait_caught_up(c.group, timeout=180)
        self.scenario("consumer_stopped", r, "end")

    def _partitions(self, topic: str) -> int:
        return len(self.topics[topic]["assignment"])

    def run_lanes(self, lanes: list[tuple[str, Callable[[], None]]]) -> None:
        threads = []
        for name, fn in lanes:
            def wrap(fn=fn, name=name):
                try:
                    fn()
                except Stopped:
                    pass
                except BaseException:  # noqa: BLE001
                    self.lane_errors.append(f"{name}: {traceback.format_exc()}")
                    log.error("lane %s failed:\n%s", name, traceback.format_exc())
                    self.stop.set()
            t = threading.Thread(target=wrap, name=f"lane-{name}", daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            while t.is_alive():
                t.join(1.0)
        if self.stop.is_set():
            raise Stopped()

    def repeat(self, r: int) -> None:
        p = self.plan
        self.journal.add("repeat_setup", repeat=r)
        self.faults_done[r] = threading.Event()
        T = {
            "rep": self.topic(f"rep-r{r}", [[1, 2, 3], [2, 3, 1], [3, 1, 2]], min_isr=2, rate=90),
            "solo": self.topic(f"solo-r{r}", [[3]], rate=10),
            "duo": self.topic(f"duo-r{r}", [[2, 3]], rate=10),
            "le": self.topic(f"le-r{r}", [[1, 2, 3]], rate=10),
            "pa": self.topic(f"pa-r{r}", [[1, 2, 3]], rate=10),
            "stop": self.topic(f"stop-r{r}", [[1, 2, 3]], rate=100),
            "slow": self.topic(f"slow-r{r}", [[1, 2, 3]], rate=100),
            "storm": self.topic(f"storm-r{r}", [[1, 2, 3]], rate=10),
        }
        C = {
            "stop": self.consumer(f"stop-r{r}", T["stop"], f"stop-r{r}-a"),
            "slow": self.consumer(f"slow-r{r}", T["slow"], f"slow-r{r}-a"),
            "storm": self.consumer(f"storm-r{r}", T["storm"], f"storm-r{r}-stable"),
        }
        flapper = AppConsumer(self.cluster.bootstrap_servers, PREFIX + f"storm-r{r}", T["storm"], self.journal,
                              f"storm-r{r}-flapper", events=self.app_events)
        flapper.members = lambda g=flapper.group: len(self.members_open.get(g, set()))
        flapper.mode = "closed"
        self.consumers.append(flapper)
        C["storm_flapper"] = flapper
        self.sleep(p.join_s)
        t0 = time.time()
        self.journal.add("repeat_start", repeat=r)
        self.run_lanes([("replication", lambda: self.lane_replication(r, t0, T)),
                        ("consumers", lambda: self.lane_consumers(r, t0, T, C)),
                        ("stop", lambda: self.lane_stop(r, t0, T, C))])
        self.sleep(p.settle_s)
        # retire the repeat: writes stop, its consumers catch up and leave
        for t in T.values():
            self.producers.set_rate(t, 0, [])
        for c in (C["stop"], C["slow"], C["storm"]):
            self.wait_caught_up(c.group, timeout=60)
        for c in (C["stop"], C["slow"], C["storm"]):
            self.close_consumer(c)
        self.journal.add("repeat_end", repeat=r)

    # -- set-up and tear-down

    def main(self) -> dict:
        from kafka_monitor.local.broker import TansuBroker, create_topics, free_port
        from kafka_monitor.local.kafka_cluster import KafkaCluster
        from monitor.probe_config import ProbeConfig
        from streaming.sinks.exporter import Exporter
        from streaming.job import JobConfig, run, spark_session, stop_spark

        p, args = self.plan, self.args
        self.facts["load_average_start"] = os.getloadavg()
        self.facts["code"] = code_state()
        t_run = time.time()
        with ExitStack() as stack:
            stack.callback(self.stop.set)
            if args.layout == "tansu":
                t = time.time()
                self.tansu = TansuBroker().start()
                stack.callback(self.tansu.stop)
                create_topics(self.tansu.bootstrap, {EVENTS_TOPIC: 3, ALERTS_TOPIC: 1})
                self.facts["tansu_start_s"] = time.time() - t

            self.cluster = KafkaCluster(broker_session_timeout_ms=p.session_timeout_ms,
                                        replica_lag_time_max_ms=p.replica_lag_time_max_ms)
            t = time.time()
            self.cluster.start()
            stack.callback(self._stop_cluster)
            self.facts["cluster_start_s"] = self.cluster.start_seconds
            self.facts["cluster_started_at"] = t
            self.facts["cluster"] = {"controller": self.cluster.controller_id, "brokers": self.cluster.broker_ids,
                                     "replica_lag_time_max_ms": p.replica_lag_time_max_ms,
                                     "broker_session_timeout_ms": p.session_timeout_ms,
                                     "broker_heartbeat_interval_ms": 1000, "auto_leader_rebalance": False}
            if args.layout == "own":  # the user's layout: the monitor's topics on the watched cluster
                conf = {"min.insync.replicas": args.own_min_isr}
                self.cluster.create_topic(EVENTS_TOPIC, partitions=3, config=conf)
                self.cluster.create_topic(ALERTS_TOPIC, partitions=1, config=conf)
            monitor_bootstrap = self.tansu.bootstrap if self.tansu else self.cluster.bootstrap_servers
            self.facts["layout"] = args.layout
            self.app_events = ({"bootstrap.servers": monitor_bootstrap, "topic": EVENTS_TOPIC}
                               if args.instrument else None)

            t = time.time()
            work = pathlib.Path(tempfile.mkdtemp(prefix="km-detect-"))
            stack.callback(shutil.rmtree, work, True)
            job_cfg = JobConfig(bootstrap_servers=monitor_bootstrap, checkpoint_dir=str(work / "ckpt"),
                                events_topic=EVENTS_TOPIC, alerts_topic=ALERTS_TOPIC, trigger_s=p.trigger_s,
                                master="local[2]", metrics_port=free_port())
            handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
            spark = spark_session(job_cfg, app_name="kafka-monitor-detection-bench")
            for s, h in handlers.items():  # SparkContext replaced SIGINT
                signal.signal(s, h)
            stack.callback(stop_spark, spark)
            self.facts["spark_start_s"] = time.time() - t

            self.producers = Producers(self.cluster.bootstrap_servers, self.stop)
            self.producers.start()
            self.poller = AdminPoller(self.cluster.bootstrap_servers, self.stop, interval=args.poll_interval)
            self.poller.start()

            # healthy parts, all along
            idle = self.topic("idle", [[1, 2, 3], [2, 3, 1], [3, 1, 2]], min_isr=2, healthy=True)
            steady = self.topic("steady", [[1, 2, 3], [2, 3, 1], [3, 1, 2]], min_isr=2, rate=100, healthy=True)
            self.producers.set_rate(idle, 100, [0, 1, 2])
            self.sleep(1.5)
            self.producers.set_rate(idle, 0, [])  # written once, idle from now on
            self.consumer("idle", idle, "idle-a", healthy=True)
            self.consumer("steady", steady, "steady-a", healthy=True)

            probe_cfg = dict(bootstrap_servers=self.cluster.bootstrap_servers, events_topic=EVENTS_TOPIC,
                             interval_s=p.probe_interval_s, events_kafka={"bootstrap.servers": monitor_bootstrap},
                             topics_include=f"^{re.escape(PREFIX)}", groups_include=f"^{re.escape(PREFIX)}",
                             cluster=CLUSTER_LABEL, source="probe-bench", canary=True, canary_topic=CANARY_TOPIC)
            ProbeConfig(**probe_cfg).validate()
            self.probe = ProbeSupervisor(probe_cfg, self.journal, threading.Event(), work / "probe.stderr.log",
                                         restart_s=p.probe_restart_s)
            self.probe.start()

            def stop_probe():
                self.probe._halt.set()
                self.probe.done.wait(30)
            stack.callback(stop_probe)

            job_stop = threading.Event()

            def run_job():
                try:
                    run(job_cfg, stop_event=job_stop, exporter=Exporter(max_series=job_cfg.max_series))
                except BaseException as e:  # noqa: BLE001
                    self.job_error.append(e)
                    log.error("the job failed: %r", e)
            job_thread = threading.Thread(target=run_job, name="bench-job", daemon=True)
            t_job = time.time()
            job_thread.start()

            def stop_job():
                job_stop.set()
                job_thread.join(120)
            stack.callback(stop_job)
            stack.callback(self.stop.set)  # first on the way out: lanes, workload and pollers stop

            url = f"http://127.0.0.1:{job_cfg.metrics_port}/metrics"
            self.metrics = MetricsPoller(url, self.stop)
            self.metrics.start()
            deadline = time.time() + 300
            while self.metrics.partitions_seen_at is None:
                if self.job_error or time.time() > deadline:
                    raise RuntimeError(f"the job never served partitions on /metrics: {self.job_error}")
                self.sleep(0.5)
            self.facts["job_first_batch_s"] = (self.metrics.first_batch_at or time.time()) - t_job
            self.facts["job_partitions_on_metrics_s"] = self.metrics.partitions_seen_at - t_job
            # the alerting path, as deployed: Prometheus (shipped rules) -> Alertmanager (shipped
            # routes) -> a webhook in this process; stopped by PID on the way out, failure included
            self.notify = notify_stack.NotifyStack(work / "alerting", job_cfg.metrics_port, log)
            self.notify.start(stack)
            self.facts["alerting_start_s"] = self.notify.setup.get("ready_s")
            notify_cfg = job_cfg.rule_configs().get("notify")  # the holds the job serves
            notify_holds = notify_cfg.holds_s() if notify_cfg is not None else score.NOTIFY_HOLDS_DEFAULT
            scope_start = time.time()
            self.journal.add("scope_start")
            self.sleep(p.warmup_s)

            for r in range(p.repeats):
                self.repeat(r)
                if self.job_error:
                    raise RuntimeError(f"the job failed: {self.job_error}")
                if self.notify.check():
                    raise RuntimeError(f"the alerting path failed: {self.notify.check()}")
            self.sleep(p.tail_s)
            scope_end = time.time()
            self.journal.add("scope_end")
            self.facts["heartbeat_delay"] = heartbeat_delay_quantiles(self.metrics.last_body)
            self.facts["probe_exits"] = [{k: e[k] for k in ("t", "returncode", "signal", "stderr_tail")}
                                         for e in self.probe.exits]
            self.facts["admin_polls"] = len(self.poller.samples)
            self.facts["admin_poll_failures"] = self.poller.failures
            took = [s["took"] for s in self.poller.samples]
            self.facts["admin_poll_took_p50_p95_s"] = [score.pct(took, 0.5), score.pct(took, 0.95)]
            self.facts["metrics_polls"] = self.metrics.polls
            self.facts["metrics_poll_failures"] = self.metrics.failures
            self.facts["consumer_errors"] = {c.member: c.error for c in self.consumers if c.error}
            self.facts["load_average_end"] = os.getloadavg()
            # the record, before anything stops
            t = time.time()
            records = self.cluster.dump_metadata_log()
            self.facts["metadata_dump_s"] = time.time() - t
            self.facts["metadata_records"] = len(records)
            # notifications up to here (the job still serving): then Prometheus and Alertmanager stop
            prom_log, am_log = self.notify.prom.log_tail(), self.notify.am.log_tail()
            notifications, alerting = self.notify.finish()
            alerting.update(holds_s=notify_holds, cluster=CLUSTER_LABEL, prometheus_log_tail=prom_log,
                            alertmanager_log_tail=am_log)
            self.facts["notifications"] = len(notifications)
            self.stop.set()  # pollers, producers
            for c in self.consumers:
                c.set_mode("exit")
            stop_probe()
            stop_job()
            alerts = read_alerts(monitor_bootstrap, ALERTS_TOPIC)
            try:
                probe_events = events_summary(monitor_bootstrap, EVENTS_TOPIC, scope_start)
            except Exception as e:  # noqa: BLE001
                probe_events = {"error": repr(e)}
            probe_log = (work / "probe.stderr.log").read_text(errors="replace").splitlines() \
                if (work / "probe.stderr.log").exists() else []
            if args.raw_out:
                shutil.copy(work / "probe.stderr.log", args.raw_out + ".probe-stderr.log")
            raw = {
                "params": {**vars(p), "layout": args.layout, "own_min_isr": args.own_min_isr, "prefix": PREFIX, "canary_topic": CANARY_TOPIC, "poll_interval_s": args.poll_interval,
                           "instrumented_consumers": bool(args.instrument), "mode": "quick" if args.quick else "full"},
                "facts": self.facts,
                "scope": {"start": scope_start, "end": scope_end},
                "healthy_entities": self.healthy,
                "log": self.journal.snapshot(),
                "polls": self.poller.samples,
                "metrics_episodes": self.metrics.all_episodes(),
                "alerts_topic": alerts,
                "notifications": notifications,
                "alerting": alerting,
                "metadata_records": [r for r in records if r.get("type") != "NO_OP_RECORD"],
                "probe_events": probe_events,
                "probe_stderr": {"lines": len(probe_log),
                                 "cycle_failures": sum(1 for x in probe_log if "probe cycle failed" in x),
                                 "tail": probe_log[-300:]},
                "lane_errors": self.lane_errors,
                "job_error": [repr(e) for e in self.job_error],
                "run_s": time.time() - t_run,
            }
        return raw

    def _stop_cluster(self) -> None:
        self.stop.set()
        for c in self.consumers:
            c.set_mode("exit")
        for c in self.consumers:
            if c.is_alive():
                c.join(10)
        if self.cluster is not None:
            self.cluster.stop()
        self._ops.shutdown(wait=False)


# ----------------------------------------------------------------------------------------------
# output
# ----------------------------------------------------------------------------------------------

def scenario_timings(raw: dict, scored: dict) -> list[dict]:
    """Per scenario and repeat: its window and, per alert type, the matched conditions' raw
    timings (GT start/end, monitor open/close on /metrics, latencies)."""
    out: dict[tuple, dict] = {}
    for ev in raw["log"]:
        if ev["event"] in ("scenario_start", "scenario_end"):
            d = out.setdefault((ev["scenario"], ev["repeat"]), {"scenario": ev["scenario"], "repeat": ev["repeat"],
                                                               "conditions": {}})
            d[ev["event"].split("_")[1]] = ev["t"]
    for kind, s in scored["per_alert"].items():
        for row in s.get("rows", []):
            key = (row["scenario"], row["repeat"])
            if key not in out:
                continue
            out[key]["conditions"].setdefault(kind, []).append(
                {**{k: row.get(k) for k in ("entity", "start", "end", "duration_s", "eligible", "detected", "open_at",
                                            "close_at", "open_latency_s", "resolve_latency_s", "episodes")},
                 # Alertmanager's notification (a record with notifications only)
                 **{k: row[k] for k in ("notify", "notify_hold_s", "notified_at", "notify_latency_s",
                                        "notify_after_metrics_s", "notify_labels") if k in row}})
    return sorted(out.values(), key=lambda d: d.get("start", 0))


def probe_health(raw: dict) -> dict:
    """The probe's exits (with the scenario running at the time) and the gaps between its
    heartbeats longer than 1.5 intervals (from the events it actually sent)."""
    windows = score.scenario_windows(raw["log"], after_s=0.0)
    t0 = raw["scope"]["start"]

    def during(t: float) -> list[str]:
        return sorted({f"{w[2]}#{w[3]}" for w in windows if w[0] <= t <= w[1]})

    exits = [{"t_s": round(e["t"] - t0, 1), "signal": e.get("signal"), "returncode": e.get("returncode"),
              "during": during(e["t"]), "stderr_tail": e.get("stderr_tail")}
             for e in raw["log"] if e["event"] == "probe_exited"]
    hb = [h[0] for h in (raw.get("probe_events") or {}).get("heartbeats", [])]
    interval = float(raw["params"]["probe_interval_s"])
    gaps = [{"after_s": round(a, 1), "gap_s": round(b - a, 1), "during": during(t0 + a)}
            for a, b in zip(hb, hb[1:]) if b - a > 1.5 * interval]
    return {"exits": exits, "heartbeat_gaps": gaps, "heartbeats": len(hb),
            "stderr_lines": (raw.get("probe_stderr") or {}).get("lines"),
            "cycle_failures": (raw.get("probe_stderr") or {}).get("cycle_failures")}


def write_results(raw: dict, scored: dict, out: str) -> None:
    facts = dict(raw["facts"])
    machine = {"platform": platform.platform(), "java": _java_version(), "kafka": "4.1.1",
               "load_average_start": facts.pop("load_average_start", None),
               "load_average_end": facts.pop("load_average_end", None)}
    try:
        import confluent_kafka
        import pyspark
        machine["confluent_kafka"] = confluent_kafka.version()[0]
        machine["librdkafka"] = confluent_kafka.libversion()[0]
        machine["pyspark"] = pyspark.__version__
    except Exception:  # noqa: BLE001
        pass
    per_alert = {k: {kk: vv for kk, vv in v.items() if kk != "rows"} for k, v in scored["per_alert"].items()}
    report.write(out, "detection", machine=machine, params=raw["params"], facts=facts,
                 run_s=raw.get("run_s"), scope=scored["scope"], healthy_entities=raw["healthy_entities"],
                 baseline_rules=score.BASELINE_RULES,
                 baseline_model={"scrape_s": score.SCRAPE_S, "eval_delay_s": score.EVAL_DELAY_S,
                                 "phases_s": score.PHASES_S, "sampled": "ground truth state at each scrape"},
                 matching={"before_s": score.MATCH_BEFORE_S, "after_s": score.MATCH_AFTER_S,
                           "stuck_gt_min_s": score.STUCK_GT_MIN_S},
                 rule_settings=score.RULES,
                 table=score.table(scored), per_alert=per_alert,
                 per_alert_notify=scored.get("per_alert_notify") or None, alerting=scored.get("notify"),
                 per_alert_alerts_topic={k: {kk: vv for kk, vv in v.items() if kk not in ("rows", "false_list")}
                                         for k, v in scored["per_alert_alerts_topic"].items()},
                 incidents=scored["incidents"], baseline=scored["baseline"], other_alerts=scored["other_alerts"],
                 condition_counts=scored["conditions"]["counts"],
                 rebalances=scored["conditions"]["rebalances"],
                 scenarios=scenario_timings(raw, scored), probe_health=probe_health(raw),
                 lane_errors=raw.get("lane_errors"), job_error=raw.get("job_error"))


def code_state() -> dict:
    """The commit and the uncommitted changes of the code under test (monitor/, streaming/):
    other engineers edit it while benchmarks run."""
    import hashlib
    import subprocess
    out: dict[str, Any] = {}
    try:
        out["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                       timeout=10).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--", "monitor", "streaming", "kafka_monitor"], cwd=ROOT,
                              capture_output=True, text=True, timeout=30).stdout
        out["uncommitted_diff_sha1"] = hashlib.sha1(diff.encode()).hexdigest() if diff else None
        out["uncommitted_files"] = subprocess.run(
            ["git", "status", "--porcelain", "--", "monitor", "streaming", "kafka_monitor"], cwd=ROOT,
            capture_output=True, text=True, timeout=10).stdout.split("\n")[:40]
    except Exception as e:  # noqa: BLE001
        out["error"] = repr(e)
    return out


def _java_version() -> Optional[str]:
    import subprocess
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20).stderr
        return out.splitlines()[0] if out else None
    except Exception:  # noqa: BLE001
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: one short repeat (~7 min)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats of the scenario suite (default 2; --quick 1)")
    ap.add_argument("--probe-interval", type=float, default=5.0, help="the probe's interval_s (default 5)")
    ap.add_argument("--poll-interval", type=float, default=0.5, help="admin polls for the ground truth (default 0.5 s)")
    ap.add_argument("--instrument", action="store_true",
                    help="wrap the bench's consumers with monitor.instrument (rebalance events from the members)")
    ap.add_argument("--layout", choices=("tansu", "own"), default="tansu",
                    help="where the monitor's events and alerts topics live: tansu (a broker of their own, no "
                         "fault reaches them; default) or own (on the watched cluster, RF 3, min ISR "
                         "--own-min-isr: the "
                         "user's layout, where every fault is also the monitor's)")
    ap.add_argument("--own-min-isr", type=int, default=1,
                    help="min.insync.replicas of the monitor's topics with --layout own (default 1, as the README "
                         "says; 2 shows what a cluster default of 2 costs)")
    ap.add_argument("--tail", type=float, default=None,
                    help="seconds after the last repeat before the run ends (default 60; --quick 30): a longer "
                         "tail gives the last episodes' notifications time to arrive (group_wait, group_interval)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/detection[-own][-quick].json)")
    ap.add_argument("--raw-out", default=None, help="the raw record of the run (default: a file in the temp dir)")
    ap.add_argument("--rescore", default=None, help="score a raw record again instead of running")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.verbose:
        log.setLevel(logging.INFO)
    else:
        log.setLevel(logging.INFO)
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(h)
        log.propagate = False
    if args.out is None:
        args.out = str(ROOT / "bench" / "results" / ("detection" + ("-own" if args.layout == "own" else "")
                                                      + ("-quick" if args.quick else "") + ".json"))

    if args.rescore:
        raw = json.loads(pathlib.Path(args.rescore).read_text())
    else:
        plan = quick_plan() if args.quick else Plan()
        if args.repeats is not None:
            plan.repeats = args.repeats
        if args.tail is not None:
            plan.tail_s = args.tail
        plan.probe_interval_s = args.probe_interval
        try:
            notify_stack.check_prerequisites()
        except notify_stack.PrerequisiteError as e:
            print(f"[bench] {e}", file=sys.stderr)
            return 2

        def on_term(signum, frame):
            raise KeyboardInterrupt()
        signal.signal(signal.SIGTERM, on_term)
        bench = Bench(plan, args)
        try:
            raw = bench.main()
        except (KeyboardInterrupt, Stopped):
            print("[bench] stopped; everything it started was stopped", file=sys.stderr)
            if bench.lane_errors:
                print("\n".join(bench.lane_errors), file=sys.stderr)
            return 130
        raw_out = args.raw_out or os.path.join(tempfile.gettempdir(), f"detection-raw-{int(time.time())}.json")
        pathlib.Path(raw_out).write_text(json.dumps(raw))
        print(f"[bench] raw record: {raw_out}", file=sys.stderr)
        if raw.get("lane_errors"):
            print("[bench] lane errors:\n" + "\n".join(raw["lane_errors"]), file=sys.stderr)
    scored = score.score_run(raw)
    print(score.table(scored))
    write_results(raw, scored, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
