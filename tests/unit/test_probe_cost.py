"""What the probe does to stay cheap at 100,000 partitions, held to giving the same answers:
leader epochs taken from the ListOffsets answers (not the client's statistics), a cluster view
that takes over unchanged partitions from the previous one, and the heartbeat's cycle duration
and lag (with a warning when a cycle overruns the interval), and the observations' cadence."""

from __future__ import annotations

import logging

from types import SimpleNamespace

import pytest
from confluent_kafka.admin import BrokerMetadata, ClusterMetadata, PartitionMetadata, TopicMetadata

from monitor.cluster_view import ClusterView
from monitor.contract import Heartbeat
from monitor.emitter import EventEmitter
from monitor.metadata import MetadataCache
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from tests.support.capture import CapturingProducer
from tests.support.probe_fakes import FakeAdmin, FakeEmitter


def confluent_md(topics: dict[str, list[tuple[int, list[int], list[int]]]], brokers=(1, 2, 3)) -> ClusterMetadata:
    """confluent_kafka's own metadata classes, as list_topics() returns them."""
    md = ClusterMetadata()
    md.cluster_id = "c"
    for b in brokers:
        bm = BrokerMetadata()
        bm.id, bm.host, bm.port = b, f"b{b}", 9092
        md.brokers[b] = bm
    for name, parts in topics.items():
        tm = TopicMetadata()
        tm.topic = name
        for pid, (leader, replicas, isr) in enumerate(parts):
            pm = PartitionMetadata()
            pm.id, pm.leader, pm.replicas, pm.isrs = pid, leader, list(replicas), list(isr)
            tm.partitions[pid] = pm
        md.topics[name] = tm
    return md


def rebuilt(md: ClusterMetadata) -> SimpleNamespace:
    """The same metadata in other objects: from_confluent builds every partition anew (its path
    without the identity shortcut), which the shortcut's result must equal."""
    return SimpleNamespace(cluster_id=md.cluster_id, brokers=md.brokers, topics={
        n: SimpleNamespace(topic=n, error=t.error, partitions={
            i: SimpleNamespace(id=p.id, leader=p.leader, replicas=p.replicas, isrs=p.isrs, error=p.error)
            for i, p in t.partitions.items()}) for n, t in md.topics.items()})


def test_a_view_built_on_the_previous_one_is_equal_and_shares_what_did_not_change():
    before = {"a": [(1, [1, 2], [1, 2]), (2, [2, 3], [2, 3])], "b": [(3, [3, 1], [3, 1])]}
    after = {"a": [(1, [1, 2], [1, 2]), (2, [2, 3], [2])], "b": [(3, [3, 1], [3, 1])]}  # a/1 lost a replica
    epochs = {("a", 0): 4, ("a", 1): 2, ("b", 0): 9}
    v1 = ClusterView.from_confluent(confluent_md(before), leader_epochs=epochs,
                                    previous=ClusterView.from_confluent(confluent_md(before)))
    v2 = ClusterView.from_confluent(confluent_md(after), leader_epochs=epochs, previous=v1)
    assert v2 == ClusterView.from_confluent(rebuilt(confluent_md(after)), leader_epochs=epochs, previous=v1)
    assert v2.topics["a"].partitions[0] is v1.topics["a"].partitions[0]
    assert v2.topics["a"].partitions[1] is not v1.topics["a"].partitions[1]
    assert v2.topics["b"] is v1.topics["b"]
    # an epoch, a leader, a broker gone (offline replicas) or an error is a change too
    for md, kw in ((confluent_md(before), {"leader_epochs": {**epochs, ("b", 0): 10}}),
                   (confluent_md({**before, "b": [(1, [3, 1], [3, 1])]}), {"leader_epochs": epochs}),
                   (confluent_md(before, brokers=(1, 2)), {"leader_epochs": epochs})):
        v3 = ClusterView.from_confluent(md, previous=v1, **kw)
        assert v3 == ClusterView.from_confluent(rebuilt(md), previous=v1, **kw)
        assert v3.topics["b"] is not v1.topics["b"]
    errored = confluent_md(before)
    errored.topics["b"].partitions[0].error = "LEADER_NOT_AVAILABLE"
    assert ClusterView.from_confluent(errored, leader_epochs=epochs, previous=v1).topics["b"].partitions[0].error \
        == "LEADER_NOT_AVAILABLE"


@pytest.mark.parametrize("shortcut", [True, False])
def test_a_leader_epoch_is_the_one_its_leader_answered(shortcut):
    """The epochs are what the previous view's leaders answered to ListOffsets LATEST: a partition
    whose leader is unchanged takes its answer (or keeps its epoch without one); a new leader, or
    a new partition, has none until a refresh after it answered."""
    build = (lambda md, **kw: ClusterView.from_confluent(md, **kw)) if shortcut else \
        (lambda md, **kw: ClusterView.from_confluent(rebuilt(md), **kw))

    def epochs_of(view):
        return {(p.topic, p.partition): p.leader_epoch for p in view.partitions()}
    first = build(confluent_md({"a": [(1, [1, 2], [1, 2]), (2, [2, 1], [2, 1])]}), leader_epochs={("a", 0): 3})
    assert epochs_of(first) == {("a", 0): None, ("a", 1): None}  # no previous view: nobody answered yet
    answered = build(confluent_md({"a": [(1, [1, 2], [1, 2]), (2, [2, 1], [2, 1])]}),
                     leader_epochs={("a", 0): 3, ("a", 1): 7}, previous=first)
    assert epochs_of(answered) == {("a", 0): 3, ("a", 1): 7}
    # a/0 unanswered this time: keeps 3; a/1's leader moved to 1: its answer (from 2) does not count;
    # a/2 is new
    moved = build(confluent_md({"a": [(1, [1, 2], [1, 2]), (1, [2, 1], [1]), (2, [2, 1], [2, 1])]}),
                  leader_epochs={("a", 1): 7, ("a", 2): 1}, previous=answered)
    assert epochs_of(moved) == {("a", 0): 3, ("a", 1): None, ("a", 2): None}
    again = build(confluent_md({"a": [(1, [1, 2], [1, 2]), (1, [2, 1], [1]), (2, [2, 1], [2, 1])]}),
                  leader_epochs={("a", 0): 3, ("a", 1): 8, ("a", 2): 1}, previous=moved)
    assert epochs_of(again) == {("a", 0): 3, ("a", 1): 8, ("a", 2): 1}
    bumped = build(confluent_md({"a": [(1, [1, 2], [1, 2]), (1, [2, 1], [1]), (2, [2, 1], [2, 1])]}),
                   leader_epochs={("a", 0): 4}, previous=again)  # re-elected on the same broker
    assert epochs_of(bumped) == {("a", 0): 4, ("a", 1): 8, ("a", 2): 1}


def test_the_cache_sees_the_same_changes_with_shared_partitions():
    before = {"a": [(1, [1, 2], [1, 2]), (2, [2, 3], [2, 3])]}
    moved = {"a": [(1, [1, 2], [1, 2]), (3, [2, 3], [2, 3])]}
    cache = MetadataCache(clock=lambda: 1)
    cache.update(ClusterView.from_confluent(confluent_md(before)))
    cache.update(ClusterView.from_confluent(confluent_md(before), leader_epochs={("a", 1): 1}, previous=cache.cluster))
    change = cache.update(ClusterView.from_confluent(confluent_md(moved), leader_epochs={("a", 1): 1},
                                                     previous=cache.cluster))
    assert [(c.partition, c.old_leader, c.new_leader, c.old_epoch, c.new_epoch) for c in change.leader_changes] \
        == [(1, 2, 3, 1, None)]
    leaderless = ClusterView.from_confluent(confluent_md({"a": [(-1, [1, 2], [])]}), previous=cache.cluster)
    assert leaderless.leaderless() == (("a", 0),)


def test_unchanged_partitions_are_not_sent_again_until_their_snapshot_is_due():
    now = [1_900_000_000.0]
    producer = CapturingProducer()
    em = EventEmitter({}, "events", cluster="c", source="p", producer=producer)
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", metadata_snapshot_s=60),
                  emitter=em, admin=FakeAdmin({"orders": 3}, {}, {}), clock=lambda: now[0])

    def sent():
        out = sorted(e.data.partition for e in producer.events if e.type == "partition_metadata")
        producer.events.clear()
        return out
    assert probe.refresh_metadata()
    assert sent() == [0, 1, 2]
    now[0] += 1
    assert probe.refresh_metadata()
    assert sent() == []
    now[0] += 61
    assert probe.refresh_metadata()
    assert sent() == [0, 1, 2]


def test_the_heartbeat_carries_the_cycle_and_its_lag_and_an_overrun_is_logged(caplog, monkeypatch):
    em = FakeEmitter()
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1),
                  emitter=em, admin=FakeAdmin({"orders": 1}, {}, {("orders", 0): 5}))
    probe.cycle()
    hb = em.of(Heartbeat)[-1]
    assert hb.cycle_duration_ms is not None and hb.cycle_duration_ms >= 0
    assert hb.observation_lag_ms is None  # cycle() keeps no schedule
    clock = [1000.0]
    monkeypatch.setattr("monitor.probe.time.monotonic", lambda: clock[0])
    real = probe._observe

    def slow():
        clock[0] += 2.5  # a cycle of 2.5 s with an interval of 1 s
        real()
    probe._observe = slow
    probe._scheduled_at = 999.0  # due 1 s ago
    with caplog.at_level(logging.WARNING, logger="monitor.probe"):
        probe.observe()
    hb = em.of(Heartbeat)[-1]
    assert (hb.cycle_duration_ms, hb.observation_lag_ms) == (2500, 1000)
    assert probe.overruns == 1 and "longer than the interval" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="monitor.probe"):
        probe.observe()  # still overrunning: counted, not logged again (at most every 5 minutes)
    assert probe.overruns == 2 and "longer than the interval" not in caplog.text
    probe._observe = real
    with caplog.at_level(logging.INFO, logger="monitor.probe"):
        probe.observe()
    assert "fit in the interval again" in caplog.text


def test_run_reports_the_observation_lag_behind_its_schedule(monkeypatch):
    import threading
    em = FakeEmitter()
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=0.2,
                              refresh_backoff_s=0),
                  emitter=em, admin=FakeAdmin({"orders": 1}, {}, {("orders", 0): 5}))
    stop = threading.Event()
    real = probe._observe

    def observe_then_stop():
        real()
        if len(em.of(Heartbeat)) >= 2:
            stop.set()
    probe._observe = observe_then_stop
    probe.run(stop)
    beats = em.of(Heartbeat)
    assert all(b.observation_lag_ms is not None and b.observation_lag_ms >= 0 for b in beats)
    assert all(b.cycle_duration_ms is not None for b in beats)


def test_a_refresh_before_each_observation_does_not_stretch_the_interval():
    """A refresh that runs when an observation is due delays that observation, not every later
    one: the observations keep their cadence.  A full run saw a 1-s interval observed every
    ~1.5 s (tests/e2e/test_ha_group.py), while a refresh waited up to a quarter of the interval
    for the leader epochs in the client's statistics."""
    import threading
    clock = [1000.0]
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1),
                  emitter=FakeEmitter(), admin=FakeAdmin({}, {}, {}))
    stop, seen = threading.Event(), []

    refresh_due = [0.0]

    def refresh():
        refresh_due[0] = clock[0] + 1.0  # metadata max age = the interval
        clock[0] += 0.5
        return True

    def observe():
        seen.append((clock[0], probe._scheduled_at))
        probe._scheduled_at = None
        clock[0] += 0.1
        if len(seen) == 10:
            stop.set()

    def wait(seconds, _stop):
        clock[0] += seconds
    probe.refresh_metadata, probe.observe, probe._wait = refresh, observe, wait
    probe._refresh_start_in = lambda: refresh_due[0] - clock[0]
    import monitor.probe as probe_module
    real_monotonic = probe_module.time.monotonic
    probe_module.time.monotonic = lambda: clock[0]
    try:
        probe.run(stop)
    finally:
        probe_module.time.monotonic = real_monotonic
    starts = [t for t, _ in seen]
    assert starts[-1] - starts[0] == pytest.approx(9.0, abs=0.01)  # not 9 * 1.5
    assert [round(t - due, 6) for t, due in seen[1:]] == [0.5] * 9  # each 0.5 s late, not later


def test_an_observation_a_whole_interval_late_restarts_the_cadence():
    from monitor.probe import next_due
    assert next_due(10.0, 10.5, 1.0) == 11.0
    assert next_due(10.0, 11.0, 1.0) == 12.0  # a whole interval behind: one interval from now
    assert next_due(10.0, 13.7, 1.0) == 14.7  # no burst of observations to catch up


def test_the_probe_reports_the_epochs_its_leaders_answered():
    """Through the probe's cycle (a refresh, then an observation): the first view has no epochs
    (nothing answered yet), the next has each leader's; a moved leader's epoch is unknown for one
    refresh; an epoch bumped on the same leader shows at the refresh after the observation that
    saw it.  Each change is one partition_metadata, nothing else is sent again."""
    producer = CapturingProducer()
    em = EventEmitter({}, "events", cluster="c", source="p", producer=producer)
    admin = FakeAdmin({"t": 2}, {}, {("t", 0): 5, ("t", 1): 5})
    admin.epochs = {("t", 0): 3, ("t", 1): 5}
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", metadata_snapshot_s=3600), emitter=em, admin=admin)

    def sent(step):
        step()
        out = {(e.data.partition, e.data.leader, e.data.leader_epoch) for e in producer.events
               if e.type == "partition_metadata"}
        producer.events.clear()
        return out

    def cycle():
        return sent(probe.cycle)
    assert cycle() == {(0, 1, None), (1, 1, None)}
    assert cycle() == {(0, 1, 3), (1, 1, 5)}
    assert cycle() == set()
    admin.leaders[("t", 1)], admin.epochs[("t", 1)] = 2, 6
    assert sent(probe.refresh_metadata) == {(1, 2, None)}
    # a second refresh before any observation: leader 1's answer (5) is not taken for leader 2
    assert sent(probe.refresh_metadata) == set()
    assert cycle() == set()
    assert cycle() == {(1, 2, 6)}
    admin.epochs[("t", 0)] = 4
    assert cycle() == set()  # the refresh ran before the observation that saw it
    assert cycle() == {(0, 1, 4)}


def test_a_change_of_every_partition_keeps_their_snapshots_spread():
    """The second refresh sends every partition again (its leader epoch is known from then on);
    their next snapshots stay where the first send spread them, not all one period after it."""
    now = [1_900_000_000.0]
    producer = CapturingProducer()
    em = EventEmitter({}, "events", cluster="c", source="p", producer=producer)
    admin = FakeAdmin({"t": 50}, {}, {})
    admin.epochs = {("t", p): 1 for p in range(50)}
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", metadata_snapshot_s=60), emitter=em, admin=admin,
                  clock=lambda: now[0])
    probe.cycle()
    spread = {tp: due for tp, (_, due) in probe._md_sent.items()}
    assert len(set(spread.values())) > 40
    producer.events.clear()
    now[0] += 10
    probe.cycle()
    assert sum(e.type == "partition_metadata" for e in producer.events) == 50  # each with its epoch now
    kept = {tp: due for tp, (_, due) in probe._md_sent.items()}
    t = int(now[0] * 1000)
    # the same phase: a due time passed since moves on by whole periods
    assert kept == {tp: due if due > t else due + 60_000 for tp, due in spread.items()}
