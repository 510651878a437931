"""The probe against librdkafka's mock cluster (3 brokers, in this process): leader moves,
a broker going down, injected error responses.

What the mock does (tests/integration/test_mock_cluster.py pins it): set_leader bumps the
partition's leader epoch by one; a broker set down disappears from the broker list while the
partitions keep naming it (leader, replicas, ISR unchanged — the mock always reports
ISR = replicas); errors pushed for an API key answer that many requests with the error."""

from __future__ import annotations

import pytest

from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from tests.support.events import latest_of, read_events
from tests.support.mock_cluster import ApiKey, Err, MockCluster

pytestmark = pytest.mark.integration

EVENTS = "kafka-monitor.events"


@pytest.fixture
def mock():
    with MockCluster(brokers=3) as mc:
        mc.create_topic("orders", 3, 3)
        mc.create_topic(EVENTS, 1, 3)
        # the events topic must stay readable while a test takes broker 2 or 3 down
        mc.set_leader(EVENTS, 0, 1)
        yield mc


@pytest.fixture
def probe(mock):
    p = Probe(ProbeConfig(bootstrap_servers=mock.bootstrap, events_topic=EVENTS, interval_s=1, cluster="mock",
                          source="probe-mock", topics_include="^orders$", refresh_backoff_s=0,
                          request_timeout_s=5))
    try:
        yield p
    finally:
        p.close(flush_timeout=5)


def events(mock, probe):
    probe.emitter.flush(10)
    return read_events(mock.bootstrap, EVENTS)


def test_leader_move_shows_new_leader(mock, probe):
    probe.refresh_metadata()
    probe.observe()
    probe.refresh_metadata()
    before = latest_of(events(mock, probe), "partition_metadata", topic="orders", partition=0)
    # the mock answers ListOffsets without the leader's epoch (-1), where the probe reads them
    # (monitor/topology.py): epochs are tested on the real cluster (test_probe_kafka.py)
    assert before.data.leader_epoch is None
    new_leader = next(b for b in (1, 2, 3) if b != before.data.leader)
    mock.set_leader("orders", 0, new_leader)
    probe.refresh_metadata()
    after = latest_of(events(mock, probe), "partition_metadata", topic="orders", partition=0)
    assert after.data.leader == new_leader
    assert after.data.metadata_version == probe.metadata.version > before.data.metadata_version
    other = latest_of(events(mock, probe), "partition_metadata", topic="orders", partition=1)
    assert other.data.replicas and sorted(other.data.replicas) == [1, 2, 3]


def test_broker_down_shows_in_the_next_refresh(mock, probe):
    probe.refresh_metadata()
    first = latest_of(events(mock, probe), "metadata_refresh")
    # controller_id: none (a KRaft cluster names a random broker; see ClusterView.from_confluent)
    assert sorted(b.node_id for b in first.data.brokers) == [1, 2, 3] and first.data.controller_id is None
    mock.broker_down(2)
    try:
        # If the refresh happens to go to broker 2 it fails (transport error): Kafka's rule then
        # marks the metadata stale, and the next attempt — reason invalidated — asks another broker.
        for _ in range(5):
            if probe.refresh_metadata():
                break
        refreshes = sorted((e for e in events(mock, probe) if e.type == "metadata_refresh"), key=lambda e: e.seq)
        after = refreshes[refreshes.index(first) + 1:]
        down = after[-1]
        assert down.data.ok and sorted(b.node_id for b in down.data.brokers) == [1, 3]
        if len(after) > 1:
            assert not any(r.data.ok for r in after[:-1])
            assert (down.data.reason, down.data.cause) == ("invalidated", "disconnected")
    finally:
        mock.broker_up(2)
    probe.refresh_metadata()
    assert sorted(b.node_id for b in latest_of(events(mock, probe), "metadata_refresh").data.brokers) == [1, 2, 3]


@pytest.mark.parametrize("error, cause", [
    (Err.NOT_LEADER_OR_FOLLOWER, "error_response:NOT_LEADER_OR_FOLLOWER"),
    (Err.LEADER_NOT_AVAILABLE, "error_response:LEADER_NOT_AVAILABLE"),
])
def test_injected_error_response_drives_an_invalidated_refresh_with_that_cause(mock, probe, error, cause):
    probe.refresh_metadata()
    probe.observe()  # control: no error, no invalidation
    assert probe.metadata.next_reason()[0] == "periodic"
    # every ListOffsets request the next observation sends is answered with the error
    mock.push_request_errors(ApiKey.LIST_OFFSETS, [error] * 6)
    probe.observe()
    assert probe.metadata.next_reason() == ("invalidated", cause)
    assert probe.metadata.should_refresh()  # refresh_backoff_s=0: right away
    mock.clear_request_errors(ApiKey.LIST_OFFSETS)
    probe.refresh_metadata()
    r = latest_of(events(mock, probe), "metadata_refresh")
    assert (r.data.reason, r.data.cause, r.data.ok) == ("invalidated", cause, True)


@pytest.mark.slow  # ~20 s
def test_partition_metadata_is_sent_on_change_and_as_a_spread_snapshot(mock):
    """Unchanged partitions are not sent again until their snapshot is due; the first snapshots
    are spread over the period; offsets carry the time of the refresh that confirmed the view."""
    now = [1_900_000_000.0]
    p = Probe(ProbeConfig(bootstrap_servers=mock.bootstrap, events_topic=EVENTS, interval_s=1, cluster="mock",
                          source="probe-snap", topics_include="^orders$", refresh_backoff_s=0,
                          request_timeout_s=5, metadata_snapshot_s=60),
              clock=lambda: now[0])
    try:
        def sent_md(since_seq):
            return sorted(e.data.partition for e in events(mock, p)
                          if e.type == "partition_metadata" and e.source == "probe-snap" and e.seq > since_seq)

        def last_seq():
            return max(e.seq for e in events(mock, p) if e.source == "probe-snap")

        assert p.refresh_metadata()
        assert sent_md(-1) == [0, 1, 2]                  # the first refresh sends every partition
        due = {tp: at for tp, (_, at) in p._md_sent.items()}
        t0 = int(now[0] * 1000)
        assert all(t0 < at <= t0 + 60_000 for at in due.values()) and len(set(due.values())) == 3

        def due_by_now():
            return [tp[1] for tp, at in due.items() if at <= int(now[0] * 1000)]

        mark = last_seq()
        now[0] += 5
        assert p.refresh_metadata()
        assert sent_md(mark) == due_by_now()              # nothing changed: only snapshots that came due
        due = {tp: at for tp, (_, at) in p._md_sent.items()}

        before = latest_of(events(mock, p), "partition_metadata", topic="orders", partition=1)
        mock.set_leader("orders", 1, next(b for b in (1, 2, 3) if b != before.data.leader))
        mark = last_seq()
        now[0] += 5
        assert p.refresh_metadata()
        assert sent_md(mark) == sorted({1, *due_by_now()})  # the partition that changed (and due snapshots)

        p.observe()
        refreshed_at = p._watched_at
        offs = [e for e in events(mock, p) if e.type == "partition_offsets" and e.source == "probe-snap"]
        assert {e.data.partition for e in offs} == {0, 1, 2}
        assert {e.data.metadata_at for e in offs} == {refreshed_at}

        mark = last_seq()
        now[0] += 61                                      # past every snapshot's due time
        assert p.refresh_metadata()
        assert sent_md(mark) == [0, 1, 2]
    finally:
        p.close(flush_timeout=5)


def test_the_heartbeat_says_how_long_the_cycle_took(mock, probe):
    # Not whether it fit in the 1-s interval: on a loaded machine librdkafka's mock thread now
    # and then answers a request at its next 1-s poll (bench/README): CI saw a 1.6-s first cycle.
    probe.cycle()
    hb = latest_of(events(mock, probe), "heartbeat")
    assert probe.last_cycle_s is not None and hb.data.cycle_duration_ms == int(probe.last_cycle_s * 1000)
    assert 0 < hb.data.cycle_duration_ms < 30_000
    assert probe.overruns == (1 if probe.last_cycle_s > probe.cfg.interval_s else 0)


def test_log_starts_are_asked_every_log_start_interval_and_carried_in_between():
    """ListOffsets earliest (a third of the probe's ListOffsets) is asked every
    ``log_start_interval_s``; in between each partition_offsets carries the last answer, and a
    partition whose high watermark fell below it (its topic created again) has none until the
    log starts are asked again, at the next observation."""
    from confluent_kafka import Producer

    from tests.integration.test_source_offsets import delete_records, recreate_topic
    with MockCluster(brokers=1) as mc:
        mc.create_topic("orders", 2, 1)
        mc.create_topic(EVENTS, 1, 1)
        prod = Producer({"bootstrap.servers": mc.bootstrap})
        for _ in range(10):
            prod.produce("orders", b"x", partition=0)
        assert prod.flush(10) == 0
        p = Probe(ProbeConfig(bootstrap_servers=mc.bootstrap, events_topic=EVENTS, interval_s=1, cluster="mock",
                              source="probe-ls", topics_include="^orders$", refresh_backoff_s=0,
                              request_timeout_s=5, log_start_interval_s=3600))
        try:
            def offsets() -> tuple:
                p.observe()
                e = latest_of(events(mc, p), "partition_offsets", topic="orders", partition=0)
                return e.data.log_start_offset, e.data.high_watermark

            assert p.refresh_metadata()
            assert offsets() == (0, 10)
            delete_records(mc, "orders", 0, 4)
            assert offsets() == (0, 10)      # not asked again: the last answer
            p.cfg.log_start_interval_s = 0   # due at every observation
            assert offsets() == (4, 10)
            p.cfg.log_start_interval_s = 3600
            recreate_topic(mc, "orders", 2)  # empty: its HW (0) below the log start held (4)
            assert p.refresh_metadata()
            assert offsets() == (None, 0)
            assert offsets() == (0, 0)       # asked again at once
        finally:
            p.close(flush_timeout=5)
