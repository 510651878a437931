"""Fencing an HA group's shards (issue 49): events a probe sends after its shard moved to a probe
with a newer epoch never reach state, and are counted on /metrics as dropped, reason fenced.  The
events are made by the probe's emitter with its shards set, parsed as the job parses them, folded
by the state function and applied to the exporter."""

from __future__ import annotations

import dataclasses

import pandas as pd

import pyarrow as pa

from monitor.contract import Event, PartitionMetadata
from monitor.emitter import EventEmitter
from monitor.shards import shard_of
from streaming.ingest import parsing
from streaming.rules.source import SourceRulesConfig
from streaming.state import function as st
from tests.support.state_fakes import EventsJob, RecordingProducer

SHARDS = 8
TOPIC = "orders"


def md_row(topic: str, isr: list[int]) -> tuple:
    md = PartitionMetadata(topic=topic, partition=0, leader=1, leader_epoch=1, replicas=[1, 2, 3], isr=isr,
                           offline_replicas=[], metadata_version=1)
    return tuple(getattr(md, f.name) for f in dataclasses.fields(md))


class HaProbe:
    """A probe's emitter holding some shards with their epochs."""

    def __init__(self, source: str, epochs: dict[int, int]):
        self.rec, self.epochs = RecordingProducer(), epochs
        self.em = EventEmitter({}, "events", cluster="k", source=source, producer=self.rec)
        self.em.set_shards(SHARDS, lambda: dict(self.epochs))

    def view(self, t: int, isr: list[int], topic: str = TOPIC) -> list[bytes]:
        self.rec.values = []
        self.em.emit_rows(PartitionMetadata, [md_row(topic, isr)], observed_at=t)
        return self.rec.values


class Job(EventsJob):
    def __init__(self, hold_ms: int = 600_000):
        super().__init__(st.StateConfig(run_id="r", source=SourceRulesConfig(fence_hold_ms=hold_ms)))

    def fenced(self) -> float:
        return self.exporter.registry.get_sample_value("kafka_monitor_events_dropped_total", {"reason": "fenced"}) or 0

    def isr(self) -> float:
        return self.exporter.registry.get_sample_value("kafka_monitor_partition_in_sync_replicas",
                                                        {"cluster": "k", "topic": TOPIC, "partition": "0"})


def opened(out: pd.DataFrame) -> set[str]:
    return set(out[(out.kind == "alert") & (out.action == "open")].alert)


def test_a_paused_owners_events_after_the_handover_are_fenced_and_counted():
    s = shard_of(TOPIC, SHARDS)
    old, new = HaProbe("probe-a", {s: 5}), HaProbe("probe-b", {s: 9})
    job = Job()
    ev = Event.from_json(old.view(1000, [1, 2, 3])[0])
    assert (ev.shard, ev.epoch) == (s, 5)
    job.batch(*old.view(1000, [1, 2, 3]))
    job.batch(*new.view(2000, [1, 2, 3]))       # the shard moved: a newer epoch
    out = job.batch(*old.view(3000, [1]))        # the old owner, back from a pause, sees a shrink
    assert job.fenced() == 1 and not opened(out) and job.isr() == 3
    out = job.batch(*new.view(4000, [1, 2]))     # the owner's own view goes through
    assert "IsrShrink" in opened(out) and job.isr() == 2 and job.fenced() == 1
    # in one batch: the older epoch is dropped whatever its place
    job.batch(*old.view(5000, [1]), *new.view(5000, [1, 2, 3]))
    assert job.fenced() == 2 and job.isr() == 3
    # fences are kept with the bucket's state (a new function instance: a restarted job)
    again = Job()
    again.state = job.state
    again.batch(*old.view(6000, [1]))
    assert again.fenced() == 1


def test_events_without_a_shard_and_other_shards_are_not_fenced():
    s = shard_of(TOPIC, SHARDS)
    other = next(f"t{i}" for i in range(100) if shard_of(f"t{i}", SHARDS) != s)
    job = Job()
    job.batch(*HaProbe("probe-b", {s: 9}).view(1000, [1, 2, 3]))
    plain = EventEmitter({}, "events", cluster="k", source="probe-x", producer=(rec := RecordingProducer()))
    plain.emit_rows(PartitionMetadata, [md_row(TOPIC, [1, 2])], observed_at=2000)
    assert b'"shard"' not in rec.values[0]
    job.batch(*rec.values, *HaProbe("probe-a", {shard_of(other, SHARDS): 1}).view(2000, [1, 2, 3], topic=other))
    assert job.fenced() == 0 and job.isr() == 2


def test_a_fence_lapses_when_its_epoch_has_sent_nothing_for_the_hold():
    """The shard topic made again: epochs start over.  Once the newest epoch has been silent for
    fence_hold_ms, the lower one is taken (the shard is not blind for good)."""
    s = shard_of(TOPIC, SHARDS)
    job = Job(hold_ms=60_000)
    job.batch(*HaProbe("probe-b", {s: 900}).view(1000, [1, 2, 3]))
    restarted = HaProbe("probe-b", {s: 0})
    job.batch(*restarted.view(30_000, [1, 2]))
    assert job.fenced() == 1 and job.isr() == 3
    job.batch(*restarted.view(62_000, [1, 2]))
    assert job.fenced() == 1 and job.isr() == 2


def test_an_event_with_a_shard_and_no_epoch_is_refused():
    good = HaProbe("p", {shard_of(TOPIC, SHARDS): 3}).view(1000, [1, 2, 3])[0]
    bad = good.replace(b',"epoch":3', b'')
    table = parsing.parse_values(pa.array([bad, good.replace(b'"epoch":3', b'"epoch":-1')], pa.binary()), gate=False)
    assert [r["reason"] for r in table.to_pylist()] == ["missing_envelope", "out_of_range"]
