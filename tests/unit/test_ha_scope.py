"""What a probe of an HA group watches (issue 49, first part): the shards it holds, decided again
when they move; the cluster-wide work with the cluster shard; the settings' checks."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from monitor.probe_config import ConfigError, ProbeConfig, ProbeScope
from monitor.shards import CLUSTER_SHARD, shard_of, shard_topic


class Held:
    """ShardMembership's two reads, over a set of shards the test moves."""

    def __init__(self, shards: int, held: set[int]):
        self.shards, self.held = shards, held

    def owned(self):
        return {s: 100 + s for s in self.held}

    def owns(self, name):
        return self.owned().get(shard_of(name, self.shards))


def test_a_probe_watches_the_topics_of_the_shards_it_holds_and_decides_again_when_they_move():
    names = [f"t{i}" for i in range(40)]
    held = Held(8, {1, 2})
    scope = ProbeScope(ProbeConfig(bootstrap_servers="x:1", ha_group="g", shards=8), held)
    assert {n for n in names if scope.watched(n)} == {n for n in names if shard_of(n, 8) in {1, 2}}
    assert not scope.cluster_wide()
    held.held = {CLUSTER_SHARD, 5}
    assert {n for n in names if scope.watched(n)} == {n for n in names if shard_of(n, 8) in {1, 2}}  # cached
    scope.ownership_changed()
    assert {n for n in names if scope.watched(n)} == {n for n in names if shard_of(n, 8) in {0, 5}}
    assert scope.cluster_wide() and scope.owns("t3") == (shard_of("t3", 8) in {0, 5})


def test_without_a_group_the_share_decides_as_before():
    assert ProbeScope(ProbeConfig(bootstrap_servers="x:1")).cluster_wide()
    assert ProbeScope(ProbeConfig(bootstrap_servers="x:1", share="1/3")).cluster_wide()
    assert not ProbeScope(ProbeConfig(bootstrap_servers="x:1", share="2/3")).cluster_wide()


@pytest.mark.parametrize("kw, message", [
    ({"ha_group": "a b"}, "probe.ha_group: letters, digits"),
    ({"ha_group": "g", "share": "1/2"}, "probe.ha_group: not with probe.share"),
    ({"ha_group": "g", "shards": 0}, "probe.shards: must be within 1..1024"),
    ({"ha_group": "g", "canary": True}, "probe.canary: not yet with probe.ha_group"),
])
def test_ha_settings_are_checked(kw, message):
    with pytest.raises(ConfigError, match=message):
        ProbeConfig(bootstrap_servers="x:1", **kw).validate()


def test_shards_are_stable_and_named():
    assert shard_of("orders", 64) == shard_of("orders", 64) and 0 <= shard_of("orders", 64) < 64
    assert shard_topic("prod") == "kafka-monitor.shards.prod"


def test_what_moved_away_is_forgotten_not_said_gone():
    """A shard that moves away takes its topics and group partitions out of the probe's gone
    tracking: no partition_gone or group_partition_gone from the old owner, then or later."""
    from monitor.gone import GONE_AFTER, GoneTracker

    held = Held(8, set(range(8)))
    sent = []
    gone = GoneTracker(lambda cls, rows, at: sent.extend(rows) or [], lambda: 0,
                       lambda n: held.owns(n) is not None, lambda cause: None)
    a = next(f"t{i}" for i in range(50) if shard_of(f"t{i}", 8) == 1)
    b = next(f"t{i}" for i in range(50) if shard_of(f"t{i}", 8) == 2)
    gone.topic_parts = {a: 2, b: 2}
    gone.note_offsets("g", {(a, 0): 5, (b, 0): 7}, [])
    held.held = set(range(8)) - {1}  # shard 1 moved away
    gone.forget_unowned()
    assert set(gone.topic_parts) == {b} and gone.gp_known["g"] == {(b, 0)}
    for _ in range(GONE_AFTER + 1):  # the group's answers now leave a out (it is not watched here)
        gone.note_offsets("g", {(b, 0): 7}, [])
    assert sent == []


class AskedAdmin:
    """A FakeAdmin that counts its group listings and records which groups' offsets are asked."""

    def __init__(self, topics, committed):
        from tests.support.probe_fakes import FakeAdmin

        self.fake = FakeAdmin(topics, committed, {})
        self.listings, self.asked, self.named = 0, [], {}

    def __getattr__(self, name):
        return getattr(self.fake, name)

    def list_consumer_groups(self, request_timeout=None):
        self.listings += 1
        return self.fake.list_consumer_groups(request_timeout)

    def list_consumer_group_offsets(self, reqs, request_timeout=None):
        """As a coordinator answers: the partitions named (-1 where none is committed), or all."""
        from tests.support.probe_fakes import done, tp

        g, named = reqs[0].group_id, reqs[0].topic_partitions
        self.asked.append(g)
        self.named[g] = None if named is None else sorted((x.topic, x.partition) for x in named)
        have = {(x.topic, x.partition): x for x in self.fake.committed[g]}
        answer = list(have.values()) if named is None else [have.get((x.topic, x.partition), tp(x.topic, x.partition, -1))
                                                            for x in named]
        return {g: done(SimpleNamespace(group_id=g, topic_partitions=answer))}


def test_between_discoveries_a_probe_asks_only_the_groups_that_commit_on_its_topics():
    """Issue 49: with an HA group, a probe that does not hold the cluster shard lists the groups
    and asks every group's committed offsets once per HA_DISCOVERY_S; in between it asks only
    the groups whose last answer named a topic it watches (and groups never asked). The holder of
    the cluster shard lists the groups at every observation. The group_offsets sent are the same."""
    from monitor.emitter import EventEmitter
    from monitor.probe import Probe
    from tests.support.capture import CapturingProducer
    from tests.support.probe_fakes import tp

    n = 8
    names = [f"t{i}" for i in range(60)]
    mine = next(t for t in names if shard_of(t, n) not in (CLUSTER_SHARD,))
    other = next(t for t in names if shard_of(t, n) not in (CLUSTER_SHARD, shard_of(mine, n)))
    committed = {"g-mine": [tp(mine, 0, 5)], "g-other": [tp(other, 0, 6)], "g-both": [tp(mine, 0, 7), tp(other, 0, 8)]}
    admin = AskedAdmin({mine: 2, other: 1}, committed)
    cfg = ProbeConfig(bootstrap_servers="fake:9092", cluster="c", source="p", interval_s=4, refresh_backoff_s=0,
                      ha_group="g", shards=n)
    producer = CapturingProducer()
    probe = Probe(cfg, emitter=EventEmitter({}, cfg.events_topic, cluster="c", source="p", producer=producer),
                  admin=admin)
    held = Held(n, {shard_of(mine, n)})
    held.changes = 0
    probe.membership = probe._scope.membership = held  # the group's answers, without a group
    cycle = probe.cycle

    def one_round():  # as run() does: the round's events carry the epochs held at its start
        probe._round_epochs = held.owned()
        cycle()
    probe.cycle = one_round

    def offsets_sent():
        rows = {(e.data.group, e.data.topic, e.data.committed_offset) for e in producer.events
                if e.type == "group_offsets"}
        producer.events.clear()
        return rows

    probe.cycle()  # the first observation discovers: the listing, every group asked
    assert admin.listings == 1 and sorted(admin.asked) == ["g-both", "g-mine", "g-other"]
    assert offsets_sent() == {("g-mine", mine, 5), ("g-both", mine, 7)}
    admin.asked.clear()
    admin.named.clear()
    committed["g-mine"].append(tp(mine, 1, 3))  # a partition it commits on since: at the next discovery
    probe.cycle()
    assert admin.listings == 1 and sorted(admin.asked) == ["g-both", "g-mine"]
    assert admin.named == {"g-mine": [(mine, 0)], "g-both": [(mine, 0)]}  # its partitions here
    assert offsets_sent() == {("g-mine", mine, 5), ("g-both", mine, 7)}
    assert probe._watched_partitions == [(mine, 0), (mine, 1)]

    admin.asked.clear()
    admin.named.clear()
    held.held = {shard_of(mine, n), shard_of(other, n)}  # the other topic's shard moves here
    probe._scope.ownership_changed()
    probe.cycle()
    assert admin.listings == 1 and sorted(admin.asked) == ["g-both", "g-mine", "g-other"]
    assert admin.named == {"g-mine": [(mine, 0)], "g-both": [(mine, 0), (other, 0)], "g-other": [(other, 0)]}
    assert offsets_sent() == {("g-mine", mine, 5), ("g-both", mine, 7), ("g-other", other, 6), ("g-both", other, 8)}

    admin.asked.clear()
    admin.named.clear()
    probe._discovered_at -= 61  # HA_DISCOVERY_S later
    committed["g-new"] = [tp(other, 0, 9)]
    probe.cycle()
    assert admin.listings == 2 and sorted(admin.asked) == ["g-both", "g-mine", "g-new", "g-other"]
    assert set(admin.named.values()) == {None}
    assert ("g-mine", mine, 3) in offsets_sent()

    del committed["g-both"][1]  # its offset on the other topic deleted: gone, as from whole answers
    for _ in range(3):
        probe.cycle()
    assert admin.named["g-both"] == [(mine, 0), (other, 0)]
    assert [(e.data.group, e.data.topic) for e in producer.events if e.type == "group_partition_gone"] == \
        [("g-both", other)]
    assert not [e for e in producer.events if e.type == "group_offsets" and e.data.committed_offset is None]

    held.held = {CLUSTER_SHARD, shard_of(mine, n)}  # the cluster shard's holder lists every time
    probe._scope.ownership_changed()
    admin.asked.clear()
    admin.named.clear()
    probe.cycle()
    probe.cycle()
    assert admin.listings == 4 and sorted(admin.asked) == ["g-both", "g-both", "g-mine", "g-mine"]



class NamedFake:
    """NamedMetadata's narrow interface over a FakeAdmin's topics: kafka-python's own
    MetadataResponse, encoded and decoded as on the wire, naming the asked topics (an unknown one
    answered UNKNOWN_TOPIC_OR_PARTITION, as a broker does); ``leaders`` moves a partition's leader."""

    def __init__(self, admin):
        self.admin, self.asked, self.fail, self.leaders = admin, [], None, {}

    def available(self):
        return True

    def fetch(self, topics, timeout_s):
        from kafka.protocol.metadata import MetadataResponse as R

        from monitor.named_metadata import NamedMetadataError

        if self.fail:
            raise NamedMetadataError(self.fail)
        self.asked.append(list(topics))
        part = R.MetadataResponseTopic.MetadataResponsePartition

        def leader(t, p):
            return self.leaders.get((t, p), 1)
        answer = R(throttle_time_ms=0, cluster_id="fake", controller_id=1,
                   brokers=[R.MetadataResponseBroker(node_id=i, host=f"b{i}", port=9092, rack=None) for i in (1, 2)],
                   topics=[R.MetadataResponseTopic(
                       error_code=0 if t in self.admin.topics else 3, name=t, is_internal=False,
                       partitions=[part(error_code=0, partition_index=p, leader_id=leader(t, p), leader_epoch=7,
                                        replica_nodes=[1], isr_nodes=[1], offline_replicas=[])
                                   for p in range(self.admin.topics.get(t, 0))]) for t in topics])
        return R.decode(answer.encode(version=12), version=12), 2

    def close(self):
        pass


def test_between_discoveries_a_probe_names_its_shards_topics_in_its_metadata_requests():
    """Issue 49: an HA probe that does not hold the cluster shard lists the whole metadata at its
    first refresh, every HA_DISCOVERY_S, after its shards move and after a named request failed;
    in between it names its shards' watched topics.  The other topics stay as last listed (never
    said gone); a named topic that is gone is gone; partition_metadata follows the named answers
    (leader, epoch); the cluster shard's holder always lists the whole metadata."""
    from monitor.emitter import EventEmitter
    from monitor.probe import Probe
    from monitor.shards import HA_DISCOVERY_S
    from tests.support.capture import CapturingProducer
    from tests.support.probe_fakes import FakeAdmin

    n = 8
    names = [f"t{i}" for i in range(60)]
    mine = [t for t in names if shard_of(t, n) == 3][:2]
    others = [t for t in names if shard_of(t, n) not in (3, CLUSTER_SHARD)][:3]
    admin = FakeAdmin({**{t: 2 for t in mine}, **{t: 1 for t in others}}, {}, {})
    one_topic = admin.list_topics

    def list_topics(topic=None, timeout=None):  # metadata_calls: the whole listings only
        admin.metadata_calls -= topic is not None
        return one_topic(topic, timeout)
    admin.list_topics = list_topics
    broker_reads = []  # refreshes that asked the brokers' min.insync.replicas default

    def describe_configs(resources, request_timeout=None, broker=None):
        broker_reads.extend(r.name for r in resources if r.restype_int == 4)  # BROKER
        return FakeAdmin.describe_configs(admin, resources, request_timeout)
    admin.describe_configs = describe_configs
    cfg = ProbeConfig(bootstrap_servers="fake:9092", cluster="c", source="p", interval_s=4, refresh_backoff_s=0,
                      ha_group="g", shards=n, topics_include="^t")
    producer = CapturingProducer()
    probe = Probe(cfg, emitter=EventEmitter({}, cfg.events_topic, cluster="c", source="p", producer=producer),
                  admin=admin)
    held = Held(n, {3})
    probe.membership = probe._scope.membership = held
    probe._named = named = NamedFake(admin)

    def refresh():
        producer.events.clear()
        probe._round_epochs = held.owned()  # as run() does: the events carry the epochs held
        assert probe.refresh_metadata()
        return (next(e.data for e in producer.events if e.type == "metadata_refresh"),
                {(e.data.topic, e.data.partition): e.data for e in producer.events if e.type == "partition_metadata"})

    r, pm = refresh()  # bootstrap: the whole listing
    assert admin.metadata_calls == 1 and named.asked == [] and r.topic_count == 5 and len(broker_reads) == 1
    assert set(pm) == {(t, p) for t in mine for p in (0, 1)}
    r, pm = refresh()
    assert admin.metadata_calls == 1 and named.asked == [sorted(mine)]
    assert r.topic_count == 5 and r.node_id == 2 and set(probe.metadata.cluster.topics) == set(admin.topics)
    # the leader epoch comes with the named answer (from the listing's statistics: none here)
    assert {e.leader_epoch for e in pm.values()} == {7} and len(pm) == 4
    named.leaders[(mine[0], 1)] = 2
    r, pm = refresh()
    assert list(pm) == [(mine[0], 1)] and pm[(mine[0], 1)].leader == 2
    assert len(broker_reads) == 1  # the brokers' default: read with the whole listings only

    del admin.topics[mine[1]], admin.topics[others[0]]  # both deleted: only the named one is seen
    r, pm = refresh()
    assert admin.metadata_calls == 1 and set(probe.metadata.cluster.topics) == {mine[0], *others}
    refresh()  # GONE_AFTER answers in a row without it: its partitions are gone
    gone = {(e.data.topic, e.data.partition) for e in producer.events if e.type == "partition_gone"}
    assert admin.metadata_calls == 1 and gone == {(mine[1], 0), (mine[1], 1)}

    probe._listed_whole_at -= HA_DISCOVERY_S  # a minute on: the whole listing finds what changed
    admin.topics["t-new"] = 1
    refresh()
    assert admin.metadata_calls == 2 and set(probe.metadata.cluster.topics) == {mine[0], *others[1:], "t-new"}
    assert len(broker_reads) == 2
    refresh()
    assert admin.metadata_calls == 2 and named.asked[-1] == [mine[0]] + (["t-new"] if shard_of("t-new", n) == 3 else [])

    held.held = {3, shard_of(others[1], n)}  # a shard comes: its topics are listed at once
    probe._shards_moved(held.owned())
    refresh()
    assert admin.metadata_calls == 3
    refresh()
    assert admin.metadata_calls == 3 and others[1] in named.asked[-1]

    named.fail = "KafkaTimeoutError: Timed out after 2000 ms"  # the whole listing stands in, for a minute
    refresh()
    assert admin.metadata_calls == 4 and probe.named_failures == 1
    named.fail = None
    refresh()
    assert admin.metadata_calls == 5 and probe.named_failures == 1
    probe._named_off_until = probe._listed_whole_at = time.monotonic()  # the minute is over
    refresh()
    assert admin.metadata_calls == 5

    held.held = {3, CLUSTER_SHARD}  # the cluster shard's holder: the whole listing, every time
    probe._shards_moved(held.owned())
    for _ in range(2):
        refresh()
    assert admin.metadata_calls == 7
    probe.membership = None  # no group to leave
    probe.close(0)


def test_no_topic_warning_means_the_patterns_match_nothing_not_an_empty_share(caplog):
    """A probe of an HA group that holds no shard yet (it just joined) watches nothing: that is not
    'no topic matching'; patterns that match no topic of the cluster still are."""
    from monitor.emitter import EventEmitter
    from monitor.probe import Probe
    from tests.support.capture import CapturingProducer
    from tests.support.probe_fakes import FakeAdmin

    def warned(include: str, held: set[int]) -> bool:
        cfg = ProbeConfig(bootstrap_servers="fake:9092", cluster="c", source="p", interval_s=4,
                          ha_group="g", shards=8, topics_include=include)
        probe = Probe(cfg, emitter=EventEmitter({}, cfg.events_topic, cluster="c", source="p",
                                                producer=CapturingProducer()), admin=FakeAdmin({"t1": 1, "t2": 1}, {}, {}))
        probe.membership = probe._scope.membership = Held(8, held)
        caplog.clear()
        assert probe.refresh_metadata()
        probe.membership = None
        probe.close(0)
        return "no topic matching" in caplog.text

    assert not warned("^t", set())
    assert warned("^x", set(range(8)))
