"""An application consuming a known topic, run once on a plain ``Consumer`` and once on an
``InstrumentedConsumer`` (tests/integration/test_instrument_tansu.py, tests/e2e/test_pipeline.py):
the records it is given, what it observes in a run, and a factory of instrumented consumers.

Tansu holds JoinGroup for session.timeout.ms / 2, hence session.timeout.ms=2000 (each join costs
about a second) and heartbeat.interval.ms=500."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from confluent_kafka import Consumer, Producer, TopicPartition

from monitor.instrument import InstrumentedConsumer

COUNTS = {0: 7, 1: 4}  # records per partition in the application's topic
GROUP_TIMEOUTS = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500}


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """Known records: value b'p<partition>-<i>' in multi-record batches (linger)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for part, n in counts.items():
        for i in range(n):
            p.produce(topic, value=b"p%d-%d" % (part, i), partition=part)
    assert p.flush(10) == 0


@dataclass
class AppRun:
    """Everything the application observed in one run."""

    messages: list[tuple[int, int, bytes]] = field(default_factory=list)  # (partition, offset, value)
    callbacks: list[tuple[str, list[str]]] = field(default_factory=list)
    stats: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    committed: dict[int, int] = field(default_factory=dict)
    member_ids: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def seen_by_app(self) -> tuple:
        """What must be identical between a plain and an instrumented run (member ids differ)."""
        by_partition = {p: [(o, v) for q, o, v in self.messages if q == p] for p in sorted(COUNTS)}
        return by_partition, self.callbacks, self.errors, self.committed


def app_conf(bootstrap: str, group: str, run: AppRun, **extra: Any) -> dict[str, Any]:
    """The application's own config: its statistics (200 ms) and its own callbacks."""
    return {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "statistics.interval.ms": 200, "stats_cb": run.stats.append,
            **GROUP_TIMEOUTS, **extra}


def names(partitions: list[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in partitions)


def consume_and_commit(make: Callable[[dict], Consumer], bootstrap: str, topic: str, group: str) -> AppRun:
    """The application: consume every record, commit, wait for its own statistics to show two more
    intervals, read back its committed offsets, close (always)."""
    run = AppRun()
    expected = sum(COUNTS.values())
    started = time.monotonic()
    consumer = make(app_conf(bootstrap, group, run))
    try:
        def on_assign(c: Consumer, ps: list[TopicPartition]) -> None:
            run.callbacks.append(("assign", names(ps)))
            run.member_ids.append(c.memberid())

        consumer.subscribe([topic], on_assign=on_assign,
                           on_revoke=lambda c, ps: run.callbacks.append(("revoke", names(ps))))
        deadline = time.monotonic() + 60
        while len(run.messages) < expected and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is None:
                continue
            if m.error():
                run.errors.append(m.error().name())
                continue
            run.messages.append((m.partition(), m.offset(), m.value()))
        assert len(run.messages) == expected, f"consumed {len(run.messages)} of {expected}"
        consumer.commit(asynchronous=False)
        # a deadline of its own: the statistics after the commit carry its offsets (x19: the
        # consuming, slow on a loaded machine, had used the whole minute, and none came)
        seen, stats_deadline = len(run.stats), time.monotonic() + 30
        while len(run.stats) < seen + 2 and time.monotonic() < stats_deadline:
            consumer.poll(0.1)
        assert len(run.stats) >= seen + 2, "no statistics after the commit within 30 s"
        run.committed = {tp.partition: tp.offset for tp in consumer.committed(consumer.assignment(), timeout=10)}
    finally:
        consumer.close()
    run.elapsed_s = time.monotonic() - started
    return run


class Instrumented:
    """A consumer factory that remembers the consumers it made (to read their counters)."""

    def __init__(self, **kw: Any):
        self.kw = kw
        self.made: list[InstrumentedConsumer] = []

    def __call__(self, conf: dict) -> InstrumentedConsumer:
        c = InstrumentedConsumer(conf, **self.kw)
        self.made.append(c)
        return c
