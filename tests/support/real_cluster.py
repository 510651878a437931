"""Helpers of the tests on a real Apache Kafka cluster (tests/support/kafka_cluster.py): writes
kept flowing while brokers are paused or stopped, a probe on the cluster whose events are kept
in memory, and the broker alerts a job serves on /metrics.

Two writers, both acks=1 with 100-byte records: ``MultiTopicWriter`` (the e2e tests) writes to
every partition of several topics between ``start()`` and ``stop()``; ``TopicWriter`` (the
integration tests) writes to one topic while its ``with`` block runs."""

from __future__ import annotations

import re
import threading
import urllib.request

from confluent_kafka import Producer

from monitor.probe_config import ProbeConfig
from tests.conftest import unique
from tests.support.capture import capturing_probe


class MultiTopicWriter:
    """Writes flow (acks=1) to every partition: a stalled follower leaves the ISR only while the
    leader's log end moves past it."""

    def __init__(self, bootstrap: str, topics: list[str]):
        self._p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 10, "log_level": 0})
        self.topics, self._stop = topics, threading.Event()
        self._t = threading.Thread(target=self._run, name="real-writer", daemon=True)

    def start(self) -> "MultiTopicWriter":
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for t in list(self.topics):
                try:
                    self._p.produce(t, b"x" * 100)
                except BufferError:
                    pass
            self._p.poll(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)
        self._p.flush(5)


def broker_alerts(url: str) -> set[tuple[str, str]]:
    """(alert, broker) of every kafka_monitor_alert_active series with a broker."""
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    out = set()
    for line in body.splitlines():
        m = re.search(r'broker="([^"]+)"', line) if line.startswith("kafka_monitor_alert_active{") else None
        if m:
            out.add((re.search(r'alert="([^"]*)"', line).group(1), m.group(1)))
    return out


def probe_for(cluster, topic_regex: str, groups: str = "^$", **kw):
    opts = dict(bootstrap_servers=cluster.bootstrap_servers, cluster="real", source=unique("probe-real"),
                topics_include=topic_regex, groups_include=groups, interval_s=1, refresh_backoff_s=0.2,
                request_timeout_s=5)
    return capturing_probe(ProbeConfig(**{**opts, **kw}))


class TopicWriter:
    """Keeps writes flowing (acks=1): a lagging follower leaves the ISR only while the leader's
    log end moves past it (an idle partition keeps a stalled follower in sync)."""

    def __init__(self, bootstrap: str, topic: str):
        self._p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "log_level": 0})
        self._topic, self._stop = topic, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            try:
                self._p.produce(self._topic, b"x" * 100)
            except BufferError:
                pass
            self._p.poll(0.01)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(10)
        self._p.flush(5)
