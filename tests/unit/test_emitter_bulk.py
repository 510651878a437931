"""EventEmitter.emit_rows: the bulk path writes, bytes for bytes, the records emit() writes; for the
types sent as contract v3 records (``ROWS_KEY_OF_TYPE``), records that stand for exactly those events."""

from __future__ import annotations

import dataclasses
import json
import re
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confluent_kafka import KafkaError

from monitor import contract as c
from monitor.emitter import EventEmitter, _encoder, _event_ids

_text = st.text(min_size=0, max_size=12)
_int = st.integers(min_value=-(2**40), max_value=2**62)


def _strategy(typ):
    inner, optional = c._unwrap_optional(typ)
    if dataclasses.is_dataclass(inner):
        s = st.builds(inner, **{f.name: _strategy(c.hints(inner)[f.name]) for f in dataclasses.fields(inner)})
    elif typing.get_origin(inner) is list:
        s = st.lists(_strategy(typing.get_args(inner)[0]), max_size=4)
    else:
        s = {int: _int, float: st.floats(allow_nan=True, allow_infinity=True), str: _text,
             bool: st.booleans()}[inner]
    return st.one_of(st.none(), s) if optional else s


class Recorder:
    """The slice of confluent_kafka.Producer that EventEmitter calls."""

    def __init__(self, fail_at=()):
        self.records, self.fail_at, self.calls = [], set(fail_at), 0

    def produce(self, topic, key=None, value=None, on_delivery=None):
        self.calls += 1
        if self.calls - 1 in self.fail_at:
            raise BufferError("queue full")
        self.records.append((topic, key, value))

    def poll(self, timeout=0):
        return 0

    def flush(self, timeout=0):
        return 0


def row(data) -> tuple:
    return tuple(getattr(data, f.name) for f in dataclasses.fields(data))


_batches = st.sampled_from(list(c.PAYLOADS)).flatmap(
    lambda t: st.tuples(st.just(t), st.lists(_strategy(c.PAYLOADS[t][0]), min_size=1, max_size=5),
                        _text, _text, st.integers(0, 2**45)))


def _same(payloads) -> list[str]:
    """Payloads as comparable text, in an order that does not depend on how they were sent."""
    return sorted(json.dumps(c._fields(p), sort_keys=True, default=str) for p in payloads)


@settings(max_examples=400, deadline=None)
@given(_batches)
def test_bulk_records_are_the_records_emit_makes(batch):
    etype, payloads, cluster, source, at = batch
    cls = c.PAYLOADS[etype][0]
    rec = Recorder()
    em = EventEmitter({}, "events", cluster=cluster or "k", source=source, producer=rec)
    em.emit(payloads[0], observed_at=at)  # seq 0 goes to emit(): the bulk call goes on from 1
    assert em.emit_rows(cls, [row(p) for p in payloads], observed_at=at) == []
    records = rec.records[1:]
    assert em._seq == 1 + len(records)
    evs = [c.Event.from_json(value) for _, _, value in records]
    assert sorted(e.seq for e in evs) == list(range(1, 1 + len(records)))
    if etype in c.ROWS_KEY_OF_TYPE:  # a record per key shared by two or more rows, the others as plain events
        group = c.ROWS_KEY_OF_TYPE[etype]
        keys = [tuple(getattr(p, f) for f in group) for p in payloads]
        assert len(records) == len(set(keys))
        assert _same([x.data for e in evs for x in e.expand()]) == _same(payloads)
    else:
        assert [json.dumps(c._fields(e.data), default=str) for e in evs] == [
            json.dumps(c._fields(p), default=str) for p in payloads]  # (NaN != NaN: compared as text)
    for (topic, key, value), ev in zip(records, evs):
        assert (topic, ev.cluster, ev.source, ev.observed_at) == ("events", cluster or "k", source, at)
        assert value == ev.to_json() and key == ev.key().encode()
        if ev.rows is None:
            expected = c.Event(type=etype, cluster=cluster or "k", source=source, seq=ev.seq, observed_at=at,
                               data=ev.data, event_id=ev.event_id)
            assert value == expected.to_json()


def test_a_topics_rows_go_in_one_record_and_count_as_events():
    rec = Recorder()
    em = EventEmitter({}, "events", cluster="k", source="p", producer=rec)
    rows = [("t", p, 10 + p, "list_offsets", 0, None, 5) for p in range(3)] + [("u", 0, 1, "fetch", None, None, None)]
    assert em.emit_rows(c.PartitionOffsets, rows, observed_at=1) == []
    (_, k1, single), (_, k3, three) = rec.records
    assert (k1, k3) == (b"k/u", b"k/t")  # a topic's key, one row or many
    ev = c.Event.from_json(three)
    assert ev.schema == c.SCHEMA_V3 and ev.rows == {"partition": [0, 1, 2], "high_watermark": [10, 11, 12]}
    assert [x.data.partition for x in ev.expand()] == [0, 1, 2] and c.Event.from_json(single).rows is None

    class Msg:
        def partition(self):
            return 0
    em._on_rows(None, Msg(), 3)
    assert em.sent == 3
    em._on_rows(KafkaError(KafkaError._MSG_TIMED_OUT), Msg(), 3)
    assert em.dropped == 3


def test_a_record_is_split_while_too_long(monkeypatch):
    from monitor import emitter

    monkeypatch.setattr(emitter, "MAX_RECORD_BYTES", 600)
    rec = Recorder()
    em = EventEmitter({}, "events", cluster="k", source="p", producer=rec)
    rows = [("t", p, 10 ** 12 + p, "list_offsets", 0, None, 5) for p in range(100)]
    assert em.emit_rows(c.PartitionOffsets, rows, observed_at=1) == []
    assert len(rec.records) > 4 and all(len(v) <= 600 for _, _, v in rec.records)
    assert [x.data.partition for _, _, v in rec.records for x in c.Event.from_json(v).expand()] == list(range(100))


def test_the_high_volume_types_are_serialized_without_payload_objects():
    for cls in (c.PartitionOffsets, c.GroupOffsets, c.PartitionMetadata, c.Heartbeat):
        assert _encoder(cls) is not None
    assert _encoder(c.MetadataRefresh) is None  # nested payloads: one at a time, same bytes


def test_event_ids_are_unique_uuid4_hex():
    ids = _event_ids(10_000)
    assert len(set(ids)) == 10_000
    assert all(re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}", i) for i in ids)


def test_a_full_queue_drops_and_counts_rows_and_never_blocks():
    rec = Recorder(fail_at={1, 3})
    em = EventEmitter({}, "events", cluster="k", source="p", producer=rec)
    rows = [(f"g{p}", "t", 0, 5, 10) + (None,) * 7 for p in range(5)]  # five groups: an event each
    assert em.emit_rows(c.GroupOffsets, rows, observed_at=1) == [1, 3]
    assert em.dropped == 2
    assert [c.Event.from_json(v).data.group for _, _, v in rec.records] == ["g0", "g2", "g4"]
    assert [c.Event.from_json(v).seq for _, _, v in rec.records] == [0, 2, 4]  # a drop leaves a gap
    rec = Recorder(fail_at={1})
    em = EventEmitter({}, "events", cluster="k", source="p", producer=rec)
    rows = [(f"t{p // 3}", p % 3, 10, "fetch", None, None, None) for p in range(9)]  # three topics of three
    assert em.emit_rows(c.PartitionOffsets, rows, observed_at=1) == [3, 4, 5]  # the second record's rows
    assert em.dropped == 3


@pytest.mark.parametrize("cls", [c.MetadataRefresh, c.GroupState])
def test_nested_payloads_go_one_at_a_time_with_the_same_bytes(cls):
    data = cls(**{f.name: v for f, v in zip(dataclasses.fields(cls), {
        c.MetadataRefresh: (3, "periodic", True, 1.5),
        c.GroupState: ("g", "Stable")}[cls])})
    rec = Recorder()
    em = EventEmitter({}, "events", cluster="k", source="p", producer=rec)
    assert em.emit_rows(cls, [row(data)], observed_at=7) == []
    (_, key, value), = rec.records
    ev = c.Event.from_json(value)
    assert value == c.Event(type=ev.type, cluster="k", source="p", seq=0, observed_at=7, data=data,
                            event_id=ev.event_id).to_json()


@settings(max_examples=300, deadline=None)
@given(_batches, st.sets(st.integers(0, 3)))
def test_an_ha_probes_records_carry_their_shard_and_epoch_and_unheld_shards_are_not_sent(batch, held):
    """With shards (an HA group's probe), each record of a sharded type carries the shard of its topic
    or group (0 for the cluster-wide types) and the epoch held on it, bytes for bytes as emit() makes
    them; a row whose shard is not held is returned unsent and counted apart from the drops."""
    from monitor.shards import CLUSTER_SHARD, shard_of

    etype, payloads, cluster, source, at = batch
    cls = c.PAYLOADS[etype][0]
    epochs = {s: 100 + s for s in held}
    rec, one = Recorder(), Recorder()
    em = EventEmitter({}, "events", cluster=cluster or "k", source=source, producer=rec)
    em.set_shards(4, lambda: dict(epochs))
    single = EventEmitter({}, "events", cluster=cluster or "k", source=source, producer=one)
    single.set_shards(4, lambda: dict(epochs))
    field = c.SHARD_OF_TYPE.get(etype)

    def shard(p):
        return None if field is None else CLUSTER_SHARD if not field else shard_of(str(getattr(p, field)), 4)
    unsent = em.emit_rows(cls, [row(p) for p in payloads], observed_at=at)
    expect_unsent = [i for i, p in enumerate(payloads) if shard(p) is not None and shard(p) not in held]
    assert unsent == expect_unsent and em.unheld == len(expect_unsent) and em.dropped == 0
    assert [single.emit(p, observed_at=at) is None for p in payloads] == [i in expect_unsent for i in range(len(payloads))]
    sent = [p for i, p in enumerate(payloads) if i not in expect_unsent]
    evs = [c.Event.from_json(v) for _, _, v in rec.records]
    alone = [c.Event.from_json(v) for _, _, v in one.records]
    assert len(alone) == len(sent) and _same([e.data for e in alone]) == _same(sent)
    assert _same([x.data for e in evs for x in e.expand()]) == _same(sent)
    for (_, key, value), ev in zip(rec.records, evs):  # every record: its shard, and as emit() would make it
        s = shard(ev.data)
        assert (ev.shard, ev.epoch) == ((None, None) if s is None else (s, 100 + s))
        assert {shard(x.data) for x in ev.expand()} == {s}
        assert value == ev.to_json() and key == ev.key().encode()
        if ev.rows is None:
            same = c.Event(type=etype, cluster=cluster or "k", source=source, seq=ev.seq, observed_at=at, data=ev.data,
                           event_id=ev.event_id, shard=ev.shard, epoch=ev.epoch)
            assert value == same.to_json()
