"""What a probe of an HA group watches (issue 49, first part): the shards it holds, decided again
when they move; the cluster-wide work with the cluster shard; the settings' checks."""

from __future__ import annotations

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
                      stats_interval_s=0.05, ha_group="g", shards=n)
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

