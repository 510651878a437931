"""Reading the events topic back in tests."""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from monitor.contract import Event
from tests.conftest import unique


def read_events(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Event]:
    """Every event in ``topic`` (all partitions, from the start to the current end); fails
    after ``timeout_s`` rather than waiting for a partition that never reaches its end."""
    import time
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"), "enable.auto.commit": False,
                  "enable.partition.eof": True})
    md = c.list_topics(topic, timeout=10)
    parts = list(md.topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out, eof = [], set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(eof) < len(parts):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic}: partitions {sorted(set(parts) - eof)} did not reach "
                                     f"their end within {timeout_s:.0f}s")
            for m in c.consume(500, timeout=2):
                if m.error():
                    eof.add(m.partition())
                else:
                    out += Event.from_json(m.value()).expand()  # a v3 record: its events
    finally:
        c.close()
    return out


def latest_of(events, etype, **match):
    """The latest (highest seq) event of ``etype`` whose payload matches ``match``."""
    hits = [e for e in events if e.type == etype and all(getattr(e.data, k) == v for k, v in match.items())]
    return max(hits, key=lambda e: e.seq) if hits else None
