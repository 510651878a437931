"""monitor.instrument against a real Tansu broker: the application cannot tell, the monitor can.

The same application logic runs twice, once on a plain ``Consumer`` and once on an
``InstrumentedConsumer``; everything the application observes (messages, its callbacks, its own
statistics, the commits it makes, the errors it gets) must be identical, and the instrumented run's
events topic must describe what happened.

Tansu holds JoinGroup for session.timeout.ms / 2, hence session.timeout.ms=2000 (each join costs
about a second) and heartbeat.interval.ms=500.  Tansu numbers generations from 0 (Kafka from 1)."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from kafka_monitor.local.broker import create_topics, free_port
from monitor.contract import Event
from monitor.instrument import instrument, instrumentation_of
from tests.conftest import unique, wait_for
from tests.support.instrumented_app import (COUNTS, GROUP_TIMEOUTS, Instrumented, consume_and_commit, names,
                                            produce)

pytestmark = pytest.mark.integration


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def read_events(bootstrap: str, topic: str) -> list[Event]:
    """Every event in the (single-partition) events topic, in order."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"), "enable.auto.commit": False,
                  "enable.partition.eof": True})
    out: list[Event] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(1)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    break
                raise KafkaException(m.error())
            out.append(Event.from_json(m.value()))
    finally:
        c.close()
    return out


def latest(events: list[Event], etype: str, **match: Any) -> Optional[Event]:
    hits = [e for e in events if e.type == etype and all(getattr(e.data, k) == v for k, v in match.items())]
    return max(hits, key=lambda e: e.seq) if hits else None


def cluster_id(bootstrap: str) -> str:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("cid")})
    try:
        return c.cluster_id(timeout=10)
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_the_app_sees_the_same_thing_and_the_monitor_sees_the_group(tansu):
    topic, events = unique("orders"), unique("events")
    create_topics(tansu.bootstrap, {topic: 2, events: 1})
    produce(tansu.bootstrap, topic, COUNTS)

    plain = consume_and_commit(Consumer, tansu.bootstrap, topic, unique("plain"))
    factory = Instrumented(events={"bootstrap.servers": tansu.bootstrap, "topic": events})
    group = unique("instr")
    instr = consume_and_commit(factory, tansu.bootstrap, topic, group)

    # the application cannot tell
    assert instr.seen_by_app() == plain.seen_by_app()
    assert plain.committed == COUNTS and plain.errors == []
    assert plain.callbacks == [("assign", [f"{topic}/0", f"{topic}/1"]), ("revoke", [f"{topic}/0", f"{topic}/1"])]
    assert len(plain.stats) > 0 and len(instr.stats) > 0
    assert all(s.startswith("{") for s in instr.stats)  # its own statistics, as strings
    (inst,) = [c.instrumentation for c in factory.made]
    assert inst.instrumentation_errors == 0 and inst.events_dropped == 0

    # the monitor can
    evs = read_events(tansu.bootstrap, events)
    assert sorted(e.seq for e in evs) == list(range(len(evs)))
    assert {e.cluster for e in evs} == {cluster_id(tansu.bootstrap)}  # learned from the consumer, not "unknown"
    for p, n in COUNTS.items():
        f = latest(evs, "client_fetch", group=group, topic=topic, partition=p)
        assert f is not None, f"no client_fetch for partition {p}"
        assert (f.data.committed, f.data.high_watermark, f.data.position, f.data.consumer_lag) == (n, n, n, 0)
        assert f.data.log_start_offset == 0 and f.data.fetch_state == "active" and f.data.leader is not None
    assert not [e for e in evs if e.type == "client_fetch" and e.data.partition < 0]

    phases = [e.data for e in sorted(evs, key=lambda e: e.seq) if e.type == "rebalance"]
    assert [r.phase for r in phases] == ["join_started", "assigned", "revoked"]
    joined, assigned, revoked = phases
    assert assigned.partitions == revoked.partitions == [f"{topic}/0", f"{topic}/1"]
    assert assigned.member_id == revoked.member_id == instr.member_ids[0] and assigned.member_id
    assert isinstance(assigned.generation, int) and assigned.generation >= 0  # Tansu starts at 0
    # from subscribe to assignment: Tansu alone holds JoinGroup for session.timeout.ms / 2
    assert 800 <= assigned.duration_ms < 30_000
    assert {r.group for r in phases} == {group}

    refreshes = [e.data for e in evs if e.type == "metadata_refresh"]
    assert refreshes and refreshes[0].reason == "bootstrap"
    assert [r.version for r in refreshes] == sorted({r.version for r in refreshes})  # strictly growing
    assert refreshes[0].brokers and refreshes[0].brokers[0].port == tansu.port


def test_an_exception_in_the_apps_assign_callback_propagates_as_without_instrumentation(tansu):
    topic, events = unique("orders"), unique("events")
    create_topics(tansu.bootstrap, {topic: 2, events: 1})

    def run(make: Callable[[dict], Consumer], group: str) -> tuple[str, list[str]]:
        conf = {"bootstrap.servers": tansu.bootstrap, "group.id": group, **GROUP_TIMEOUTS}
        consumer = make(conf)
        try:
            def on_assign(c: Consumer, ps: list[TopicPartition]) -> None:
                raise ValueError("the app refuses " + ",".join(names(ps)).replace(topic, "T"))

            consumer.subscribe([topic], on_assign=on_assign)
            with pytest.raises(ValueError) as info:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    consumer.poll(0.2)
            return str(info.value), names(consumer.assignment())
        finally:
            consumer.close()

    plain = run(Consumer, unique("plain"))
    factory = Instrumented(events={"bootstrap.servers": tansu.bootstrap, "topic": events})
    instr = run(factory, unique("instr"))
    assert instr[0] == plain[0] == "the app refuses T/0,T/1"
    assert instr[1] == plain[1] == [f"{topic}/0", f"{topic}/1"]  # the binding still assigned
    assert factory.made[0].instrumentation_errors == 0
    assigned = latest(read_events(tansu.bootstrap, events), "rebalance", phase="assigned")
    assert assigned is not None and assigned.data.partitions == [f"{topic}/0", f"{topic}/1"]


def test_a_lost_assignment_reaches_the_app_as_before_and_the_monitor_sees_failed_and_lost(tansu):
    """max.poll.interval.ms exceeded: librdkafka leaves the group; the next poll returns the error
    and the partitions are revoked as lost (to on_revoke, the app has no on_lost)."""
    topic, events = unique("orders"), unique("events")
    create_topics(tansu.bootstrap, {topic: 1, events: 1})

    def run(make: Callable[[dict], Consumer], group: str) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        # librdkafka checks the poll interval once a second, so the pause is 2 s past it. The session
        # (at most the poll interval) is 4 s so that a late heartbeat on a loaded machine cannot end
        # the membership first, as it once did in CI with 2 s.
        conf = {"bootstrap.servers": tansu.bootstrap, "group.id": group, "max.poll.interval.ms": 4000,
                **GROUP_TIMEOUTS, "session.timeout.ms": 4000, "heartbeat.interval.ms": 1000}
        consumer = make(conf)
        try:
            consumer.subscribe([topic], on_assign=lambda c, ps: seen.append(("assign", names(ps))),
                                on_revoke=lambda c, ps: seen.append(("revoke", names(ps))))
            wait_for(lambda: consumer.poll(0.1) is None and seen, timeout=30, what="the assignment")
            time.sleep(6.0)  # the scenario itself: the application stops polling past max.poll.interval.ms
            deadline = time.monotonic() + 15
            while len(seen) < 3 and time.monotonic() < deadline:
                m = consumer.poll(0.1)
                if m is not None and m.error():
                    seen.append(("error", m.error().name()))
        finally:
            consumer.close()
        return seen

    plain = run(Consumer, unique("plain"))
    factory = Instrumented(events={"bootstrap.servers": tansu.bootstrap, "topic": events})
    instr = run(factory, unique("instr"))
    assert instr == plain == [("assign", [f"{topic}/0"]), ("error", "_MAX_POLL_EXCEEDED"), ("revoke", [f"{topic}/0"])]
    evs = sorted(read_events(tansu.bootstrap, events), key=lambda e: e.seq)
    phases = [(e.data.phase, e.data.partitions) for e in evs if e.type == "rebalance"]
    assert phases[:4] == [("join_started", []), ("assigned", [f"{topic}/0"]), ("failed", []),
                          ("lost", [f"{topic}/0"])]
    failed, lost = [e.data for e in evs if e.type == "rebalance" and e.data.phase in ("failed", "lost")][:2]
    assert failed.reason.startswith("_MAX_POLL_EXCEEDED") and lost.reason == "_MAX_POLL_EXCEEDED"
    assert factory.made[0].instrumentation_errors == 0


def test_an_unreachable_events_cluster_neither_slows_nor_breaks_the_app(tansu):
    topic = unique("orders")
    create_topics(tansu.bootstrap, {topic: 2})
    produce(tansu.bootstrap, topic, COUNTS)
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there

    plain = consume_and_commit(Consumer, tansu.bootstrap, topic, unique("plain"))
    factory = Instrumented(events={"bootstrap.servers": dead, "topic": "kafka-monitor.events"})
    instr = consume_and_commit(factory, tansu.bootstrap, topic, unique("instr"))

    assert instr.seen_by_app() == plain.seen_by_app()
    # close() waits for the events at most close_flush_timeout (1 s); nothing else may cost time
    assert instr.elapsed_s < plain.elapsed_s + 3.0, (instr.elapsed_s, plain.elapsed_s)
    inst = factory.made[0].instrumentation
    assert inst.instrumentation_errors == 0 and inst.events_sent == 0 and inst.events_emitted > 0


def test_an_instrumented_producer_reports_metadata_refreshes_its_writes_and_no_fetches(tansu):
    """A producer's first refreshes go through the bootstrap broker, which librdkafka then drops from
    statistics (its Metadata counter with it): the bootstrap refresh is recognised from the topic's
    metadata_age; the periodic one (the app's own 1 s refresh interval) from both signals."""
    topic, events = unique("out"), unique("events")
    create_topics(tansu.bootstrap, {topic: 1, events: 1})
    stats: list[str] = []
    delivered: list[int] = []
    conf = instrument({"bootstrap.servers": tansu.bootstrap, "statistics.interval.ms": 200, "stats_cb": stats.append,
                       "topic.metadata.refresh.interval.ms": 1000},
                      events={"bootstrap.servers": tansu.bootstrap, "topic": events}, cluster="it", source="producer-it")
    inst = instrumentation_of(conf)
    producer = Producer(conf)
    try:
        for i in range(3):
            producer.produce(topic, value=b"%d" % i, on_delivery=lambda err, m: delivered.append(m.offset()))
        assert producer.flush(10) == 0
        wait_for(lambda: producer.poll(0.1) >= 0 and len(stats) >= 12, timeout=30, what="the app's statistics")
    finally:
        producer.flush(10)
        undelivered = inst.close(5)
    assert undelivered == 0 and sorted(delivered) == [0, 1, 2]
    evs = sorted(read_events(tansu.bootstrap, events), key=lambda e: e.seq)
    assert {e.type for e in evs} == {"metadata_refresh", "client_produce"}  # no fetches
    assert {(e.cluster, e.source) for e in evs} == {("it", "producer-it")}
    # what its writes saw: the last report says all 3 sent, none held or in flight
    produced = [e.data for e in evs if e.type == "client_produce"]
    assert {(p.topic, p.partition) for p in produced} == {(topic, 0)}
    last = produced[-1]
    assert (last.sent_messages, last.queued_messages, last.in_flight_messages) == (3, 0, 0)
    assert last.leader is not None and last.leader_request_errors == 0
    refreshes = [e.data for e in evs if e.type == "metadata_refresh"]
    assert refreshes[0].reason == "bootstrap" and topic in refreshes[0].cause
    assert {r.reason for r in refreshes[1:]} == {"periodic"} and len(refreshes) >= 2
    assert [r.version for r in refreshes] == sorted({r.version for r in refreshes})
    assert inst.instrumentation_errors == 0
