"""Reading the alerts topic back (every transition the job published), used by many e2e and
integration tests, and stopping a job started in its own process group (its JVM and Python
workers with it)."""

from __future__ import annotations

import json
import os
import signal
import time

from confluent_kafka import Consumer, TopicPartition

from tests.conftest import unique


def read_alerts(bootstrap: str, topic: str) -> list[dict]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("r"), "enable.partition.eof": True})
    parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out, eof = [], set()
    deadline = time.monotonic() + 60
    try:
        while len(eof) < len(parts):
            assert time.monotonic() < deadline, f"reading {topic}: no end of partition within 60s"
            for m in c.consume(1000, timeout=2):
                if m.error():
                    eof.add(m.partition())
                else:
                    out.append(json.loads(m.value()))
    finally:
        c.close()
    return out


def kill_group(proc, sig=signal.SIGKILL):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(60)
