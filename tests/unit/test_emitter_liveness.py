"""EventEmitter: a heartbeat whose partition's leader does not answer also goes to a partition
that does, so the job does not read a paused broker as the monitor's own silence."""

from __future__ import annotations

import types

import pytest

from monitor.contract import Event, Heartbeat, MetadataRefresh, PartitionOffsets
from monitor.emitter import EventEmitter


class _Msg:
    def __init__(self, partition: int):
        self._p = partition

    def partition(self) -> int:
        return self._p


class Partitions:
    """A producer over 3 partitions; keyed records go to ``hash(key) % 3`` (fixed here: the
    heartbeat's key to 0); the partitions in ``stuck`` deliver nothing until released."""

    def __init__(self):
        self.stuck: set[int] = set()
        self.records: list[tuple[int, Event]] = []
        self._pending: list[tuple[int, object]] = []

    def produce(self, topic, key=None, value=None, on_delivery=None, partition=-1):
        ev = Event.from_json(value)
        p = partition if partition >= 0 else (0 if ev.type in ("heartbeat", "metadata_refresh")
                                               else int(ev.data.partition) % 3)
        self.records.append((p, ev))
        self._pending.append((p, on_delivery))

    def poll(self, timeout=0):
        keep, ready = [], []
        for p, cb in self._pending:
            (keep if p in self.stuck else ready).append((p, cb))
        self._pending = keep
        for p, cb in ready:
            cb(None, _Msg(p))
        return len(ready)

    def flush(self, timeout=0):
        return self.poll()


@pytest.fixture
def clock(monkeypatch):
    t = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr("monitor.emitter.time", types.SimpleNamespace(monotonic=lambda: t.now, time=lambda: t.now))
    return t


def cycle(em: EventEmitter, clock, n: int = 3) -> None:
    """One probe cycle: offsets of ``n`` partitions, a refresh, a heartbeat, 5 s apart."""
    for i in range(n):
        em.emit(PartitionOffsets(topic="t", partition=i, high_watermark=10, via="list_offsets"))
    em.emit(MetadataRefresh(version=1, reason="periodic", ok=True, duration_ms=1.0))
    em.emit(Heartbeat(interval_ms=5000, events_sent=em.sent, events_dropped=em.dropped))
    em.poll(0)
    clock.now += 5


def heartbeats(prod: Partitions) -> list[tuple[int, str]]:
    return [(p, e.event_id) for p, e in prod.records if e.type == "heartbeat"]


def test_each_liveness_event_also_goes_to_another_partition(clock):
    prod = Partitions()
    em = EventEmitter({}, "events", cluster="c", source="s", producer=prod)
    for _ in range(4):
        cycle(em, clock)
    hb = heartbeats(prod)
    assert len(hb) == 8 and em.copies == 8  # 4 heartbeats and 4 refreshes, each twice
    for (p1, id1), (p2, id2) in zip(hb[::2], hb[1::2]):
        assert p1 == 0 and p2 in (1, 2) and id1 == id2
    assert {p for p, _ in hb[1::2]} == {1, 2}  # they take turns
    # a copy's delivery is not counted: each event counts once, on its own partition
    assert em.sent == len(prod.records) - em.copies
    assert not any(e.type == "partition_offsets" and p != e.data.partition % 3 for p, e in prod.records)


def test_a_paused_leader_leaves_the_copies_on_the_partitions_that_deliver(clock):
    prod = Partitions()
    em = EventEmitter({}, "events", cluster="c", source="s", producer=prod)
    cycle(em, clock)
    cycle(em, clock)
    prod.stuck.add(1)   # the heartbeat's own partition (0) delivers; 1 does not
    cycle(em, clock)
    before = len(prod.records)
    for _ in range(3):
        cycle(em, clock)
    copies = [p for p, e in prod.records[before:] if e.type == "heartbeat" and p != 0]
    assert copies == [2, 2, 2]


def test_with_its_own_partition_stuck_every_heartbeat_is_delivered_once(clock):
    prod = Partitions()
    em = EventEmitter({}, "events", cluster="c", source="s", producer=prod)
    cycle(em, clock)
    prod.stuck.add(0)
    delivered = []
    for _ in range(4):
        before = len(prod.records)
        cycle(em, clock)
        delivered += [e.event_id for p, e in prod.records[before:] if e.type == "heartbeat" and p != 0]
    assert len(delivered) == len(set(delivered)) == 4


def test_nothing_answering_means_no_copy(clock):
    prod = Partitions()
    em = EventEmitter({}, "events", cluster="c", source="s", producer=prod)
    prod.stuck.update({0, 1, 2})
    cycle(em, clock)
    cycle(em, clock)
    assert em.copies == 0
