"""An HA group's coverage in the job (issue 49, streaming/rules/ha.py): the probes' ha_member and
heartbeat events, made by the emitter, parsed as the job parses them, folded by the state function
(batches, and timeouts for the time-driven checks) and applied to the exporter."""

from __future__ import annotations

import json


from monitor.contract import HaMember, Heartbeat, MetadataRefresh
from monitor.emitter import EventEmitter
from streaming.rules.source import SourceRulesConfig
from streaming.state import function as st
from tests.support.state_fakes import EventsJob, RecordingProducer

SHARDS, GROUP, INTERVAL = 8, "prod", 1000
HA = {"cluster": "k", "source": f"ha:{GROUP}"}
CFG = SourceRulesConfig(shard_unobserved_after_ms=5000, silence_grace_ms=2000)


class Member:
    def __init__(self, name: str):
        self.name, self.rec = name, RecordingProducer()
        self.em = EventEmitter({}, "events", cluster="k", source=name, producer=self.rec)
        self.handovers = 0

    def cycle(self, t: int, held: dict[int, int]) -> list[bytes]:
        """What the probe sends after a cycle: its heartbeat, its metadata refresh, its holdings."""
        self.rec.values = []
        self.em.emit(Heartbeat(interval_ms=INTERVAL, events_sent=0, events_dropped=0, ha_group=GROUP), observed_at=t)
        self.em.emit(MetadataRefresh(version=1, reason="periodic", ok=True, duration_ms=1.0, metadata_max_age_ms=INTERVAL,
                                     ha_group=GROUP), observed_at=t)
        s = sorted(held)
        self.em.emit(HaMember(ha_group=GROUP, shards=SHARDS, interval_ms=INTERVAL, held=s, epochs=[held[x] for x in s],
                              watched=[3] * len(s), handovers=self.handovers), observed_at=t)
        return [v for v in self.rec.values]


def Job() -> EventsJob:
    return EventsJob(st.StateConfig(run_id="r", source=CFG, tick_ms=1000))


def split(members: list[str], epoch: int) -> dict[str, dict[int, int]]:
    return {m: {s: epoch + s for s in range(SHARDS) if s % len(members) == i} for i, m in enumerate(members)}


def test_a_dead_members_shards_taken_in_time_open_nothing_and_show_as_a_handover():
    a, b, c = Member("a"), Member("b"), Member("c")
    job = Job()
    held = split(["a", "b", "c"], 10)
    for t in range(1000, 6000, 1000):
        job.batch(*a.cycle(t, held["a"]), *b.cycle(t, held["b"]), *c.cycle(t, held["c"]))
    assert job.value("ha_probes", **HA) == 3 and job.value("ha_shards", **HA) == SHARDS
    assert job.value("ha_shards_unobserved", **HA) == 0
    assert [job.value("ha_probe_shards", **HA, probe=m) for m in "abc"] == [3, 3, 2]
    # c is killed at 5000; 3 s later its shards are held by a and b with newer epochs
    for t in range(6000, 9000, 1000):
        job.batch(*a.cycle(t, held["a"]), *b.cycle(t, held["b"]))
        job.timeout(t + 500)
    gone = held["c"]
    after = split(["a", "b"], 100)
    for t in range(9000, 45_000, 1000):  # past c's MetadataStale limit too (2 max ages + 30 s)
        job.batch(*a.cycle(t, after["a"]), *b.cycle(t, after["b"]))
        job.timeout(t + 500)
    assert not job.opened, job.opened  # no ShardUnobserved, no SourceSilent, no MetadataStale for c
    assert job.value("ha_probes", **HA) == 2 and job.value("ha_probe_shards", **HA, probe="c") is None
    assert job.value("ha_last_handover_timestamp_seconds", **HA) == 9.0
    assert sorted(gone) and job.value("ha_shards_unobserved", **HA) == 0


def test_a_shard_nobody_takes_opens_shard_unobserved_naming_it_and_resolves_when_observed():
    a, b = Member("a"), Member("b")
    job = Job()
    held = split(["a", "b"], 10)
    job.batch(*a.cycle(1000, held["a"]), *b.cycle(1000, held["b"]))
    lost = {s: e for s, e in held["b"].items() if s == 1}
    kept = {s: e for s, e in held["b"].items() if s != 1}
    for t in range(2000, 12_000, 1000):  # b stops observing shard 1 (it holds the rest)
        job.batch(*a.cycle(t, held["a"]), *b.cycle(t, kept))
        job.timeout(t + 500)
    (alert, source, evidence), = job.opened
    assert (alert, source) == ("ShardUnobserved", "ha:prod")
    ev = json.loads(evidence)
    assert ev["count"] == 1 and ev["shards"] == [{"shard": 1, "owner": "b", "epoch": 11, "last_observed_at": 1000,
                                                  "held": 3}]
    assert job.value("ha_shards_unobserved", **HA) == 1
    job.batch(*a.cycle(12_000, {**held["a"], **{1: lost[1] + 50}}), *b.cycle(12_000, kept))
    assert [r[0] for r in job.resolved] == ["ShardUnobserved"] and job.value("ha_shards_unobserved", **HA) == 0


def test_the_group_is_silent_only_when_no_member_reports():
    a, b = Member("a"), Member("b")
    job = Job()
    held = split(["a", "b"], 10)
    job.batch(*a.cycle(1000, held["a"]), *b.cycle(1000, held["b"]))
    for t in range(2000, 8000, 1000):  # a alone: the group is alive (a's shards move to it later)
        job.batch(*a.cycle(t, held["a"]))
        job.timeout(t + 500)
    assert "SourceSilent" not in [o[0] for o in job.opened]
    job.timeout(20_000)  # nobody since 7000: 3 intervals + 2 s grace passed
    assert ("SourceSilent", "ha:prod") in [o[:2] for o in job.opened]
    assert not [o for o in job.opened if o[0] == "SourceSilent" and o[1] != "ha:prod"]  # not per member
    assert not [o for o in job.opened if o[0] == "MetadataStale"]
    job.batch(*a.cycle(21_000, {**held["a"], **held["b"]}))
    assert ("SourceSilent", "ha:prod") in [r[:2] for r in job.resolved]


def test_a_report_with_an_older_epoch_does_not_take_a_shard_back():
    a, b = Member("a"), Member("b")
    job = Job()
    job.batch(*a.cycle(1000, {s: 5 for s in range(SHARDS)}))
    job.batch(*b.cycle(2000, {s: 9 for s in range(SHARDS)}))   # every shard moved to b
    job.batch(*a.cycle(3000, {s: 5 for s in range(SHARDS)}))   # a, back from a pause, still says it holds them
    assert job.value("ha_probe_shards", **HA, probe="b") == SHARDS
    assert job.value("ha_probe_shards", **HA, probe="a") == 0
