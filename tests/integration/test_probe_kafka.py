"""The probe against a real Apache Kafka cluster (tests/support/kafka_cluster.py: 3 brokers and
a controller, KRaft, replication tuned to react in seconds), with real faults: a paused
follower, stopped brokers, every replica of a partition gone, partitions added, consumer
groups of both protocols.  Only a real cluster shrinks an ISR; Tansu and librdkafka's mock
never do.

The probe's events are kept in memory (tests/support/capture.py) so that no events topic goes
down with the brokers; everything the probe reads comes from the cluster.

What the cluster showed that the mock and Tansu hid is written next to each test."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tests.conftest import unique, wait_for
from tests.support.capture import latest, of_type
from tests.support.real_cluster import TopicWriter, probe_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def refresh_until(probe, cap, cond: Callable[[], object], what: str, timeout: float = 60.0, observe: bool = False):
    """Refresh the probe's metadata until ``cond()`` holds (polled, not slept).  ``observe``: an
    observation after each refresh (the leader epochs come from its ListOffsets answers)."""
    deadline = time.monotonic() + timeout
    while True:
        probe.refresh_metadata()
        if observe:
            probe.observe()
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pm = of_type(cap.events, "partition_metadata")[-3:]
            raise AssertionError(f"{what}: not seen within {timeout:.0f}s; last partition_metadata: "
                                 f"{[(e.data.topic, e.data.partition, e.data.leader, e.data.isr) for e in pm]}")
        time.sleep(0.3)


def part(cap, topic: str, partition: int = 0):
    return latest(cap.events, "partition_metadata", topic=topic, partition=partition)


def test_a_paused_follower_leaves_the_isr_and_returns_after_resume(kafka_cluster):
    """SIGSTOP on a follower: it stops fetching, so with writes flowing the leader drops it from
    the ISR after replica.lag.time.max.ms (or the controller fences it after the broker session
    timeout, whichever comes first); replicas stay the same.  SIGCONT: it catches up and the
    ISR grows back.  (The mock cluster always reports ISR = replicas.)"""
    c = kafka_cluster
    topic = unique("real.pause")
    c.create_topic(topic, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": 1})
    probe, cap = probe_for(c, f"^{topic}$")
    try:
        with TopicWriter(c.bootstrap_servers, topic):
            before = refresh_until(probe, cap, lambda: (p := part(cap, topic)) and len(p.data.isr) == 3 and p,
                                   "the full ISR")
            t0 = time.monotonic()
            c.pause_broker(3)
            try:
                shrunk = refresh_until(probe, cap, lambda: (p := part(cap, topic)) and 3 not in p.data.isr and p,
                                       "broker 3 out of the ISR")
                shrink_s = time.monotonic() - t0
            finally:
                c.resume_broker(3)
            assert shrunk.data.replicas == before.data.replicas == [1, 2, 3]
            assert shrunk.data.leader == 1 and sorted(shrunk.data.isr) == [1, 2]
            t1 = time.monotonic()
            back = refresh_until(probe, cap, lambda: (p := part(cap, topic)) and 3 in p.data.isr and p,
                                 "broker 3 back in the ISR")
            print(f"\nISR shrink seen after {shrink_s:.1f}s, expand {time.monotonic() - t1:.1f}s after resume")
        assert sorted(back.data.isr) == [1, 2, 3] and back.data.offline_replicas == []
    finally:
        probe.close(flush_timeout=1)


def test_brokers_stopped_one_then_two_and_returned(kafka_cluster):
    """One broker stopped (controlled shutdown): the partitions it led move, with the leader
    epoch bumped, its replicas are offline and out of the ISR (under-replicated); at
    min.insync.replicas = 2 the ISR is at the minimum.  A second broker stopped: under the
    minimum.  Both back: the ISR is whole again, the leaders stay where they moved (preferred-
    leader imbalance, auto rebalance is off) until a preferred election puts them back."""
    c = kafka_cluster
    topic = unique("real.stop")
    c.create_topic(topic, replica_assignment=[[2, 3, 1]], config={"min.insync.replicas": 2})
    probe, cap = probe_for(c, f"^{topic}$")
    try:
        # a leader's epoch comes from its answer to an observation: known at the refresh after it
        first = refresh_until(probe, cap, lambda: (p := part(cap, topic)) and len(p.data.isr) == 3
                              and p.data.leader_epoch is not None and p, "the full ISR, with its epoch", observe=True)
        assert first.data.leader == 2 and first.data.min_insync_replicas == 2
        c.stop_broker(2)
        try:
            moved = refresh_until(probe, cap, lambda: (p := part(cap, topic)) and p.data.leader not in (2, -1) and
                                  2 not in p.data.isr and p.data.leader_epoch is not None and p,
                                  "leadership away from broker 2, with its epoch", observe=True)
            assert moved.data.leader_epoch > first.data.leader_epoch
            assert moved.data.offline_replicas == [2] and sorted(moved.data.isr) == [1, 3]
            refresh = latest(cap.events, "metadata_refresh", ok=True)
            assert 2 not in {b.node_id for b in refresh.data.brokers}
            assert refresh.data.controller_id is None  # KRaft names a random broker: none reported

            c.stop_broker(3)
            try:
                under = refresh_until(probe, cap, lambda: (p := part(cap, topic)) and p.data.isr == [1] and p,
                                      "ISR down to broker 1")
                assert under.data.leader == 1 and sorted(under.data.offline_replicas) == [2, 3]
                assert under.data.min_insync_replicas == 2
            finally:
                c.start_broker(3)
        finally:
            c.start_broker(2)
        whole = refresh_until(probe, cap, lambda: (p := part(cap, topic)) and len(p.data.isr) == 3
                              and p.data.leader_epoch is not None and p, "the full ISR after both returned",
                              observe=True)
        assert whole.data.offline_replicas == [] and whole.data.leader != 2  # not its preferred leader yet
        c.elect_leaders("preferred", [(topic, 0)])
        back = refresh_until(probe, cap, lambda: (p := part(cap, topic)) and p.data.leader == 2
                             and p.data.leader_epoch is not None and p,
                             "broker 2 leading again after the preferred election, with its epoch", observe=True)
        assert back.data.leader_epoch > whole.data.leader_epoch
    finally:
        probe.close(flush_timeout=1)


def test_every_replica_lost_makes_the_partition_offline_without_a_refresh_storm(kafka_cluster):
    """A one-replica partition whose broker stops has no leader (-1) and names the replica
    offline.  The probe keeps refreshing on its schedule: the unknown leader asks for early
    refreshes with a backoff that doubles until the periodic refresh takes over, not one refresh
    per backoff for as long as it lasts (which was a MetadataRefreshStorm of the probe's own)."""
    c = kafka_cluster
    topic = unique("real.offline")
    c.create_topic(topic, replica_assignment=[[3]])
    probe, cap = probe_for(c, f"^{topic}$", metadata_max_age_s=5, refresh_backoff_s=0.5)
    try:
        refresh_until(probe, cap, lambda: (p := part(cap, topic)) and p.data.leader == 3, "leader 3")
        c.stop_broker(3)
        try:
            stop = threading.Event()
            runner = threading.Thread(target=probe.run, args=(stop,), daemon=True)
            t0 = time.time()
            runner.start()
            deadline = time.monotonic() + 60
            while not ((p := part(cap, topic)) and p.data.leader == -1) and time.monotonic() < deadline:
                time.sleep(0.2)
            offline = part(cap, topic)
            assert offline.data.leader == -1 and offline.data.offline_replicas == [3] and offline.data.isr in ([], [3])
            since = offline.observed_at
            time.sleep(20)  # the probe runs on its own clock meanwhile: this is the window measured
            stop.set()
            runner.join(15)
            refreshes = [e for e in of_type(cap.events, "metadata_refresh") if e.observed_at >= since]
            invalidated = [e for e in refreshes if e.data.reason == "invalidated"]
            print(f"\n{len(refreshes)} refreshes in the 20 s after the partition went offline, "
                  f"{len(invalidated)} invalidated ({[e.data.cause for e in invalidated]})")
            # early refreshes after 0.5, 1, 2 and 4 s, then the periodic one every 5 s: a handful of
            # invalidated refreshes per episode, below MetadataRefreshStorm's 10 a minute (one per
            # 0.5 s backoff before: ~40 in these 20 s)
            assert len(invalidated) <= 6, [(e.data.reason, e.data.cause) for e in refreshes]
            assert len(refreshes) <= 12, [e.data.reason for e in refreshes]
            assert time.time() - t0 >= 20
        finally:
            c.start_broker(3)
        refresh_until(probe, cap, lambda: (p := part(cap, topic)) and p.data.leader == 3, "leader 3 back")
    finally:
        probe.close(flush_timeout=1)


def test_min_insync_replicas_comes_from_the_topic_or_the_broker_default(kafka_cluster):
    c = kafka_cluster
    plain, strict = unique("real.minisr"), unique("real.minisr3")
    c.create_topic(plain, partitions=1, rf=3)
    c.create_topic(strict, partitions=1, rf=3, config={"min.insync.replicas": 3})
    probe, cap = probe_for(c, f"^({plain}|{strict})$")
    try:
        probe.refresh_metadata()
        assert part(cap, plain).data.min_insync_replicas == 1     # the broker default
        assert part(cap, strict).data.min_insync_replicas == 3
    finally:
        probe.close(flush_timeout=1)


def _alter_min_isr(c, topic: Optional[str], value: Optional[int]) -> None:
    """Set (or with None delete) min.insync.replicas on ``topic``, or with topic None as the
    brokers' cluster-wide default (librdkafka cannot name that resource: Kafka's ConfigCommand)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    if topic is None:
        change = ["--delete-config", "min.insync.replicas"] if value is None else \
            ["--add-config", f"min.insync.replicas={value}"]
        c.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", c.bootstrap_servers, "--entity-type",
                   "brokers", "--entity-default", "--alter", *change)
        return
    op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
    r = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("min.insync.replicas", None if value is None else str(value), incremental_operation=op)])
    for fut in c.admin().incremental_alter_configs([r], request_timeout=30).values():
        fut.result(30)


def test_a_runtime_min_insync_replicas_change_is_seen_within_two_refreshes(kafka_cluster):
    """Issue 33: min.insync.replicas raised at runtime (on the topic, and as the brokers'
    default, which a topic without its own value reports) changes what acks=all writes
    survive.  The probe re-reads every topic's value at every refresh and uses the answer at
    the next one: a change made between two refreshes shows at the second after it at the
    latest (a re-read already in flight when it was made answers the old value)."""
    c = kafka_cluster
    own, plain = unique("real.minisr-own"), unique("real.minisr-default")
    c.create_topic(own, partitions=1, rf=3)
    c.create_topic(plain, partitions=1, rf=3)
    probe, cap = probe_for(c, f"^({own}|{plain})$", config_refresh_s=0)  # at every refresh (10 s by default)
    try:
        probe.refresh_metadata()
        probe.refresh_metadata()
        assert (part(cap, own).data.min_insync_replicas, part(cap, plain).data.min_insync_replicas) == (1, 1)
        _alter_min_isr(c, own, 3)
        _alter_min_isr(c, None, 2)  # the brokers' cluster-wide default
        try:
            refreshes = 0

            def seen():
                nonlocal refreshes
                refreshes += 1
                return part(cap, own).data.min_insync_replicas == 3 and part(cap, plain).data.min_insync_replicas == 2
            # each refresh_until round refreshes, then looks; the answers come within ms on loopback
            refresh_until(probe, cap, lambda: time.sleep(0.3) or seen(), "the new min.insync.replicas", timeout=30)
            assert refreshes <= 3, refreshes
            assert probe.topic_configs.min_isr_changes >= 2
        finally:
            # set back, not deleted: Kafka 4.1 refuses "Cluster-level min.insync.replicas cannot
            # be removed while ELR is enabled"
            _alter_min_isr(c, None, 1)
    finally:
        probe.close(flush_timeout=1)


def test_partitions_added_are_seen_with_how_long_the_probe_took(kafka_cluster):
    c = kafka_cluster
    topic = unique("real.grow")
    c.create_topic(topic, partitions=2, rf=3)
    probe, cap = probe_for(c, f"^{topic}$")
    try:
        probe.refresh_metadata()
        c.add_partitions(topic, 4)
        change = refresh_until(probe, cap, lambda: next(
            (ch for e in of_type(cap.events, "metadata_refresh", ok=True)
             for ch in e.data.partition_count_changes if ch.topic == topic), None), "the partition count change")
        assert (change.old_count, change.new_count) == (2, 4)
        assert change.unseen_for_at_most_ms is not None and change.unseen_for_at_most_ms >= 0
        assert {e.data.partition for e in of_type(cap.events, "partition_metadata", topic=topic)} == {0, 1, 2, 3}
    finally:
        probe.close(flush_timeout=1)


class Member:
    def __init__(self, bootstrap: str, topic: str, group: str, protocol: str):
        conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
                "auto.offset.reset": "earliest", "log_level": 0}
        if protocol == "classic":
            conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        self.c = Consumer(conf)
        self.c.subscribe([topic])
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        try:
            while not self._stop.is_set():
                self.c.poll(0.2)
        finally:
            self.c.close()

    def stop(self):
        self._stop.set()
        self._t.join(20)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consumer_groups_of_both_protocols_with_members_and_assignments(kafka_cluster, protocol):
    """Kafka 4 runs both group protocols.  librdkafka names the consumer protocol's
    Assigning/Reconciling states UNKNOWN and discards generations and group epochs; the probe
    maps the states (monitor.coordinator.describe_group_state) and reports no generation."""
    c = kafka_cluster
    topic, group = unique("real.grp"), unique(f"real-{protocol}")
    c.create_topic(topic, partitions=2, rf=3)
    Producer({"bootstrap.servers": c.bootstrap_servers, "log_level": 0}).produce(topic, b"x")
    member = Member(c.bootstrap_servers, topic, group, protocol)
    probe, cap = probe_for(c, f"^{topic}$", groups=f"^{group}$")
    try:
        deadline = time.monotonic() + 60
        while True:
            probe.refresh_metadata()
            probe.observe()
            gs = latest(cap.events, "group_state", group=group)
            if gs is not None and gs.data.state == "Stable" and gs.data.members and gs.data.members[0].assignment:
                break
            assert time.monotonic() < deadline, f"group {group} not Stable with an assigned member: {gs}"
            time.sleep(0.5)
        seen = {e.data.state for e in of_type(cap.events, "group_state", group=group)}
        assert "Unknown" not in seen, seen
        assert gs.data.protocol == protocol
        assert sorted(gs.data.members[0].assignment) == [f"{topic}/0", f"{topic}/1"]
        assert gs.data.coordinator in (1, 2, 3)
        assert gs.data.generation is None  # not exposed by librdkafka (see the module doc)
    finally:
        member.stop()
        probe.close(flush_timeout=1)


def test_rebalances_between_two_polls_are_counted_from_the_members(kafka_cluster):
    """Members join and leave between two of the probe's polls, so it never sees the group
    rebalancing (and librdkafka gives it no generation): the members and assignments it reports
    differ, and the job counts a rebalance each time -- through its own parser and rules, on the
    events the probe emitted -- until RebalanceStorm opens."""
    import pyarrow as pa
    from confluent_kafka.admin import AdminClient

    from streaming.ingest import parsing
    from streaming.rules import group as rg

    c = kafka_cluster
    topic, group = unique("real.storm"), unique("real-storm")
    c.create_topic(topic, partitions=4, rf=3)
    admin = AdminClient({"bootstrap.servers": c.bootstrap_servers, "log_level": 0})
    probe, cap = probe_for(c, f"^{topic}$", groups=f"^{group}$")

    def settled(n: int) -> bool:
        try:
            d = admin.describe_consumer_groups([group])[group].result(10)
        except KafkaException:  # the group not there yet, its coordinator not loaded yet
            return False
        return d.state.name == "STABLE" and len(d.members) == n and all(m.assignment.topic_partitions
                                                                        for m in d.members)

    def observe_when(n: int) -> None:
        deadline = time.monotonic() + 60
        while not settled(n):
            assert time.monotonic() < deadline, f"group {group} not Stable with {n} members"
            time.sleep(0.3)
        probe.refresh_metadata()
        probe.observe()

    first = Member(c.bootstrap_servers, topic, group, "classic")
    try:
        observe_when(1)
        for _ in range(3):  # 6 rebalances: a member joins, then leaves
            second = Member(c.bootstrap_servers, topic, group, "classic")
            observe_when(2)
            second.stop()
            observe_when(1)
    finally:
        first.stop()
        probe.close(flush_timeout=1)
    polls = of_type(cap.events, "group_state", group=group)
    assert [len(e.data.members) for e in polls] == [1, 2, 1, 2, 1, 2, 1]
    assert {e.data.state for e in polls} == {"Stable"}  # the polls never saw a rebalance under way
    rows = parsing.parse_values(pa.array([e.to_json() for e in polls], pa.binary()), gate=True).to_pylist()
    assert all(r["reason"] is None for r in rows)
    state, opened = rg.new_group("real", group), []
    for r in rows:
        opened += rg.on_group_state(state, {**r, "state": r["group_state"]}, r["observed_at"], f"real/{group}")
    assert state["rebalances_total"] == 6
    assert [(t.alert.value, t.action) for t in opened] == [("RebalanceStorm", "open")]


def test_an_open_transaction_holds_the_last_stable_offset_and_the_read_committed_lag(kafka_cluster):
    """A transactional producer commits 5 records, then leaves a transaction of 7 open: the HW
    counts them, the last stable offset stops before them (read_committed consumers cannot read
    them yet).  The probe reads both (ListOffsets latest, at both isolation levels), for the
    partition and next to a group's committed offset; the commit makes them equal again."""
    c = kafka_cluster
    topic, group = unique("real.txn"), unique("real-txn-app")
    c.create_topic(topic, partitions=1, rf=3)
    p = Producer({"bootstrap.servers": c.bootstrap_servers, "transactional.id": unique("txn"), "log_level": 0})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, b"c%d" % i, partition=0)
    p.commit_transaction(30)  # offsets 0-4 and the commit marker 5: LSO = HW = 6
    committer = Consumer({"bootstrap.servers": c.bootstrap_servers, "group.id": group, "log_level": 0})
    committer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    committer.close()
    p.begin_transaction()
    for i in range(7):
        p.produce(topic, b"o%d" % i, partition=0)
    p.flush(30)  # written, not committed: HW 13, LSO stays 6
    probe, cap = probe_for(c, f"^{topic}$", groups=f"^{group}$")
    try:
        def seen(open_txn: bool):
            probe.refresh_metadata()
            probe.observe()
            po = latest(cap.events, "partition_offsets", topic=topic, partition=0)
            go = latest(cap.events, "group_offsets", group=group, topic=topic, partition=0)
            if po is None or go is None:
                return None
            want = (13, 6) if open_txn else (14, 14)
            got = (po.data.high_watermark, po.data.last_stable_offset)
            return (po, go) if got == want and (go.data.high_watermark, go.data.last_stable_offset) == want else None
        po, go = wait_for(lambda: seen(True), timeout=60, interval=0.3, what="HW 13 and LSO 6 with the txn open")
        assert go.data.committed_offset == 2
        p.commit_transaction(30)  # the marker: HW = LSO = 14
        wait_for(lambda: seen(False), timeout=60, interval=0.3, what="HW = LSO = 14 after the commit")
    finally:
        probe.close(flush_timeout=1)
