"""What a probe of an HA group watches (issue 49, first part): the shards it holds, decided again
when they move; the cluster-wide work with the cluster shard; the settings' checks."""

from __future__ import annotations

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
