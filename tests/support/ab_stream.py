"""The comparison of jobs disturbed (killed, moved to a cluster) with an uninterrupted one on
the same input (tests/e2e/test_job_disturbed.py): the stream on
the real cluster both read, a job process on its checkpoint, the events topic's end offsets and
the series of /metrics the two must agree on."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_monitor.local.broker import free_port
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.sinks.progress import source_offsets
from tests.conftest import unique, watermarks
from tests.support.alerts_topic import kill_group
from tests.support.jvm import submit_args
from tests.support.real_cluster import MultiTopicWriter

EVENT_PARTITIONS = 3


class Committer:
    """A consumer group that commits half of the high watermark every 2 s: lag that grows, and
    moves, so the lag windows have something to hold."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int):
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0,
                            "enable.auto.commit": False})
        self.topic, self.partitions, self._stop = topic, partitions, threading.Event()
        self._t = threading.Thread(target=self._run, name="kill-committer", daemon=True)

    def start(self) -> "Committer":
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(2):
            try:
                offsets = []
                for p in range(self.partitions):
                    _, hw = self._c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=3)
                    offsets.append(TopicPartition(self.topic, p, hw // 2))
                self._c.commit(offsets=offsets, asynchronous=False)
            except Exception:  # the coordinator may be the broker that is down: next round
                pass

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._t.join(10)
            self._c.close()


class Job:
    """One job process on its checkpoint (restartable), with its /metrics port."""

    def __init__(self, name: str, bootstrap: str, events: str, alerts: str, tmp: Path):
        self.name, self.bootstrap, self.events, self.alerts = name, bootstrap, events, alerts
        self.ckpt = tmp / f"ckpt-{name}"
        self.log = open(tmp / f"job-{name}.log", "ab")
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0

    def start(self) -> None:
        self.port = free_port()
        self.starts += 1
        self.log.write(f"\n===== start {self.starts} =====\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kafka_monitor.cli", "job", "--bootstrap-servers", self.bootstrap,
             "--checkpoint", str(self.ckpt), "--events-topic", self.events, "--alerts-topic", self.alerts,
             "--trigger", "1", "--max-offsets-per-trigger", "300", "--buckets", "4",
             "--metrics-port", str(self.port)], env={**os.environ, "PYSPARK_SUBMIT_ARGS": submit_args()},
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)  # its group: JVM, workers

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc, sig)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The end of the job's log (every start's), for a failure's message."""
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])

    def committed_batches(self) -> int:
        d = self.ckpt / "commits"
        return len([f for f in os.listdir(d) if f.isdigit()]) if d.is_dir() else 0

    def committed_offsets(self) -> dict:
        """The source offsets of the last committed batch (Spark's offsets log: its last line)."""
        d = self.ckpt / "commits"
        ids = sorted(int(f) for f in os.listdir(d) if f.isdigit()) if d.is_dir() else []
        if not ids:
            return {}
        line = (self.ckpt / "offsets" / str(ids[-1])).read_text().strip().splitlines()[-1]
        return source_offsets(json.loads(line))

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()

    def close(self) -> None:
        self.kill(signal.SIGTERM)
        self.log.close()


def end_offsets(bootstrap: str, topic: str) -> dict:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("kill-end"), "log_level": 0})
    try:
        return {(topic, str(p)): watermarks(c, TopicPartition(topic, p))[1]
                for p in range(EVENT_PARTITIONS)}
    finally:
        c.close()


_SERIES = re.compile(r"^(kafka_monitor_(?:alert_active|partition_\w+|group_partition_\w+))\{([^}]*)\} (\S+)$")


def outcome(text: str, cluster: str) -> dict:
    """The series of one cluster that state decides: open alerts, partition and lag gauges."""
    out = {}
    for line in text.splitlines():
        m = _SERIES.match(line)
        if m and f'cluster="{cluster}"' in m.group(2):
            out[(m.group(1), m.group(2))] = m.group(3)
    return out


class Stream:
    """The scenario of the comparisons (tests/e2e/test_job_disturbed.py): the whole
    cluster; a watched topic whose partitions broker 3 follows and leads none (stopping it shrinks
    both ISRs only); writes, a group committing half of the HW, the probe every second into an
    events topic; an alerts topic per job (``alerts[name]``).  ``stop()`` ends the probe, the
    writes and the commits; everything stops, and broker 3 is started again, with ``cleanup``."""

    def __init__(self, c, cleanup: ExitStack, name: str, jobs: tuple[str, ...] = ("a", "b")):
        if not c.managed:
            pytest.skip("stopping a broker needs the cluster the tests start (KAFKA_MONITOR_TEST_KAFKA is set)")
        c.restore(timeout=120)  # whole, whatever an earlier test left (brokers die with their thread)
        prefix = unique(name)
        watched, group, self.cluster = f"{prefix}.w", f"{prefix}-app", unique(f"{name}-cluster")
        c.create_topic(watched, replica_assignment=[[1, 3, 2], [2, 3, 1]], config={"min.insync.replicas": 2})
        self.events = f"{prefix}.events"
        self.alerts = {j: f"{prefix}.alerts-{j}" for j in jobs}  # one per job, on brokers 1 and 2 in turn
        c.create_topic(self.events, replica_assignment=[[1], [2], [1]])
        for i, topic in enumerate(self.alerts.values()):
            c.create_topic(topic, replica_assignment=[[1 + i % 2]])
        self.boot = boot = c.bootstrap_servers
        self._writer = MultiTopicWriter(boot, [watched]).start()
        cleanup.callback(self._writer.stop)
        self._committer = Committer(boot, group, watched, 2).start()
        cleanup.callback(self._committer.stop)
        self._stop_probe = threading.Event()
        self.source = unique(f"probe-{name}")
        self._probe = Probe(ProbeConfig(bootstrap_servers=boot, events_topic=self.events, interval_s=1,
                                        refresh_backoff_s=0.5, request_timeout_s=5,
                                        topics_include=f"^{re.escape(watched)}$",
                                        groups_include=f"^{re.escape(group)}$",
                                        cluster=self.cluster, source=self.source))
        self._probe_thread = threading.Thread(target=self._probe.run, args=(self._stop_probe,),
                                              name=f"{name}-probe", daemon=True)
        self._probe_thread.start()
        cleanup.callback(self._stop_the_probe)
        cleanup.callback(lambda: c.brokers[3].running() or c.start_broker(3))

    def _stop_the_probe(self) -> None:  # once: closing its clients twice would crash the process
        if not self._stop_probe.is_set():
            self._stop_probe.set()
            self._probe_thread.join(20)
            self._probe.close(flush_timeout=10)

    def stop(self) -> None:
        self._stop_the_probe()
        self._writer.stop()
        self._committer.stop()
