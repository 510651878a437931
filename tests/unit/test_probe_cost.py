"""What the probe does to stay cheap at 100,000 partitions, held to giving the same answers:
leader epochs read from one statistics document without parsing it, a cluster view that takes
over unchanged partitions from the previous one, and the heartbeat's cycle duration and lag
(with a warning when a cycle overruns the interval)."""

from __future__ import annotations

import json
import logging

import pytest
from confluent_kafka.admin import BrokerMetadata, ClusterMetadata, PartitionMetadata, TopicMetadata

from monitor.cluster_view import ClusterView
from monitor.contract import Heartbeat
from monitor.emitter import EventEmitter
from monitor.leader_epochs import _epochs_from_json, epochs_from_stats
from monitor.metadata import MetadataCache
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from tests.support.capture import CapturingProducer
from tests.support.probe_fakes import FakeAdmin, FakeEmitter


def librdkafka_partition(pid: int, leader: int, epoch: int) -> str:
    """A partition object as librdkafka 2.x writes it in its statistics (rd_kafka_stats_emit_toppar)."""
    return (f'"{pid}": {{ "partition":{pid}, "broker":{leader}, "leader":{leader}, "desired":false, '
            f'"unknown":false, "msgq_cnt":0, "msgq_bytes":0, "xmit_msgq_cnt":0, "xmit_msgq_bytes":0, '
            f'"fetchq_cnt":0, "fetchq_size":0, "fetch_state":"none", "query_offset":-1001, "next_offset":0, '
            f'"app_offset":-1001, "stored_offset":-1001, "stored_leader_epoch":-1, "commited_offset":-1001, '
            f'"committed_offset":-1001, "committed_leader_epoch":-1, "eof_offset":-1001, "lo_offset":-1001, '
            f'"hi_offset":-1001, "ls_offset":-1001, "consumer_lag":-1, "consumer_lag_stored":-1, '
            f'"leader_epoch":{epoch}, "txmsgs":0, "txbytes":0, "rxmsgs":0, "rxbytes":0, "msgs": 0, '
            f'"rx_ver_drops": 0, "msgs_inflight": 0, "next_ack_seq": 0, "next_err_seq": 0, "acked_msgid": 0}} ')


def librdkafka_stats(topics: dict[str, list[tuple[int, int]]], ts: int = 4342301928) -> str:
    """A statistics document in librdkafka's layout: topic -> [(leader, epoch) per partition]; each
    topic also has the unassigned partition -1."""
    body = []
    for name, parts in topics.items():
        ps = [librdkafka_partition(i, leader, epoch) for i, (leader, epoch) in enumerate(parts)]
        ps.append(librdkafka_partition(-1, -1, -1))
        body.append(f'"{name}": {{ "topic":"{name}", "age":1621, "metadata_age":1571, "batchsize": {{ "min":0, '
                    f'"max":0 }} , "batchcnt": {{ "min":0, "max":0 }} , "partitions":{{ {",".join(ps)}}} }} ')
    return (f'{{ "name": "rdkafka#producer-1", "client_id": "rdkafka", "type": "producer", "ts":{ts}, '
            f'"time":1795472538, "brokers":{{ "b:1/1": {{ "name":"b:1/1", "nodeid":1, "toppars":{{ }} }} }}, '
            f'"topics":{{ {",".join(body)}}} , "tx":5, "rx":5}}')


def test_epochs_from_one_statistics_document_without_parsing_it():
    raw = librdkafka_stats({"orders": [(1, 3), (2, 0), (3, -1)], "audit.log": [(2, 7)]})
    json.loads(raw)  # it is JSON
    expected = {("orders", 0): (1, 3), ("orders", 1): (2, 0), ("audit.log", 0): (2, 7)}  # no epoch: left out
    assert epochs_from_stats(raw) == _epochs_from_json(raw) == expected


@pytest.mark.parametrize("raw", [
    # another layout (spacing): parsed instead
    json.dumps({"ts": 1, "topics": {"t": {"topic": "t", "partitions": {"0": {"partition": 0, "leader": 2,
                                                                            "leader_epoch": 4}}}}}),
    # a partition without leader_epoch (an older librdkafka): parsed, left out
    librdkafka_stats({"t": [(1, 1)]}).replace('"leader_epoch":1, ', ""),
])
def test_statistics_in_another_layout_are_parsed(raw):
    assert epochs_from_stats(raw) == _epochs_from_json(raw)


def test_the_probe_reads_only_the_latest_statistics_document():
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", stats_interval_s=0.05),
                  emitter=FakeEmitter(), admin=FakeAdmin({}, {}, {}))
    probe._epochs.on_stats(librdkafka_stats({"t": [(1, 1)]}, ts=1_000_000))
    probe._epochs.on_stats(librdkafka_stats({"t": [(2, 5)]}, ts=2_000_000))
    assert probe._epochs.ts == 2.0 and probe._epochs.seen == {}  # kept, not read
    probe._epochs.read()
    assert probe._epochs.seen == {("t", 0): (2, 5)} and probe._epochs.raw is None


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


def test_a_view_built_on_the_previous_one_is_equal_and_shares_what_did_not_change():
    before = {"a": [(1, [1, 2], [1, 2]), (2, [2, 3], [2, 3])], "b": [(3, [3, 1], [3, 1])]}
    after = {"a": [(1, [1, 2], [1, 2]), (2, [2, 3], [2])], "b": [(3, [3, 1], [3, 1])]}  # a/1 lost a replica
    epochs = {("a", 0): 4, ("a", 1): 2, ("b", 0): 9}
    v1 = ClusterView.from_confluent(confluent_md(before), leader_epochs=epochs)
    v2 = ClusterView.from_confluent(confluent_md(after), leader_epochs=epochs, previous=v1)
    assert v2 == ClusterView.from_confluent(confluent_md(after), leader_epochs=epochs)
    assert v2.topics["a"].partitions[0] is v1.topics["a"].partitions[0]
    assert v2.topics["a"].partitions[1] is not v1.topics["a"].partitions[1]
    assert v2.topics["b"] is v1.topics["b"]
    # an epoch, a leader, a broker gone (offline replicas) or an error is a change too
    for md, kw in ((confluent_md(before), {"leader_epochs": {**epochs, ("b", 0): 10}}),
                   (confluent_md({**before, "b": [(1, [3, 1], [3, 1])]}), {"leader_epochs": epochs}),
                   (confluent_md(before, brokers=(1, 2)), {"leader_epochs": epochs})):
        v3 = ClusterView.from_confluent(md, previous=v1, **kw)
        assert v3 == ClusterView.from_confluent(md, **kw)
        assert v3.topics["b"] is not v1.topics["b"]
    errored = confluent_md(before)
    errored.topics["b"].partitions[0].error = "LEADER_NOT_AVAILABLE"
    assert ClusterView.from_confluent(errored, leader_epochs=epochs, previous=v1).topics["b"].partitions[0].error \
        == "LEADER_NOT_AVAILABLE"


def test_the_cache_sees_the_same_changes_with_shared_partitions():
    before = {"a": [(1, [1, 2], [1, 2]), (2, [2, 3], [2, 3])]}
    moved = {"a": [(1, [1, 2], [1, 2]), (3, [2, 3], [2, 3])]}
    cache = MetadataCache(clock=lambda: 1)
    cache.update(ClusterView.from_confluent(confluent_md(before), leader_epochs={("a", 1): 1}))
    change = cache.update(ClusterView.from_confluent(confluent_md(moved), leader_epochs={("a", 1): 2},
                                                     previous=cache.cluster))
    assert [(c.partition, c.old_leader, c.new_leader, c.old_epoch, c.new_epoch) for c in change.leader_changes] \
        == [(1, 2, 3, 1, 2)]
    leaderless = ClusterView.from_confluent(confluent_md({"a": [(-1, [1, 2], [])]}), previous=cache.cluster)
    assert leaderless.leaderless() == (("a", 0),)


def test_unchanged_partitions_are_not_sent_again_until_their_snapshot_is_due():
    now = [1_900_000_000.0]
    producer = CapturingProducer()
    em = EventEmitter({}, "events", cluster="c", source="p", producer=producer)
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", stats_interval_s=0.05, metadata_snapshot_s=60),
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
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1, stats_interval_s=0.05),
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
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=0.2, stats_interval_s=0.05,
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
    """A refresh that runs when an observation is due delays that observation (it waits up to a
    quarter of the interval for its leader epochs), not every later one: the observations keep
    their cadence.  CI saw a 1-s interval observed every ~1.5 s (tests/e2e/test_ha_group.py)."""
    import threading
    clock = [1000.0]
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1, stats_interval_s=0.05),
                  emitter=FakeEmitter(), admin=FakeAdmin({}, {}, {}))
    stop, seen = threading.Event(), []

    def refresh():
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
    # a refresh is due with each observation (metadata max age = the interval)
    probe._refresh_start_in = lambda: (probe._next_observation or 0) - clock[0]
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
