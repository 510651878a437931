"""Shards held through a consumer group on the shared real cluster (issue 49, first part): three
members split the shard topic's partitions between them, each shard held by exactly one member with
a claim epoch; a member that leaves has its shards moved to the others with larger epochs; a fourth
that joins takes some; the one left alone holds everything."""

from __future__ import annotations

import pytest

from monitor.shards import ShardMembership, ensure_shard_topic, shard_of
from tests.conftest import unique, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

SHARDS = 12


def covered(members: list[ShardMembership]) -> dict[int, tuple[str, int]]:
    """shard -> (holder, epoch) when every shard is held by exactly one member; else {}."""
    out: dict[int, tuple[str, int]] = {}
    for m in members:
        for s, epoch in m.owned().items():
            if s in out:
                return {}
            out[s] = (m.source, epoch)
    return out if len(out) == SHARDS else {}


def test_members_split_the_shards_and_a_leaving_members_shards_move_with_larger_epochs(kafka_cluster):
    conf = {"bootstrap.servers": kafka_cluster.bootstrap_servers}
    group = unique("ha")
    ensure_shard_topic(conf, group, SHARDS)
    ensure_shard_topic(conf, group, SHARDS)  # a second probe finds it made
    with pytest.raises(ValueError, match="has 12 partitions, the setting says 8"):
        ensure_shard_topic(conf, group, 8)
    members = [ShardMembership(conf, group, SHARDS, f"p{i}", session_timeout_ms=6000).start() for i in range(3)]
    try:
        # the first to join may hold everything until the others' joins rebalance the group
        first = wait_for(lambda: sorted(len(m.owned()) for m in members) == [4, 4, 4] and covered(members),
                         timeout=60, what="every shard held once, claimed, 4 each")
        # a name's shard is held by one member, with its epoch
        s = shard_of("orders", SHARDS)
        assert [m.owns("orders") for m in members].count(None) == 2

        gone = members.pop(0)
        moved = set(gone.owned())
        gone.stop()
        after = wait_for(lambda: covered(members), timeout=30, what="the leaver's shards held by the others")
        for shard in moved:
            assert after[shard][0] != "p0" and after[shard][1] > first[shard][1], (shard, first[shard], after[shard])
        for shard in set(range(SHARDS)) - moved:  # cooperative-sticky: the others' shards stayed put
            assert after[shard] == first[shard], (shard, first[shard], after[shard])

        members.append(ShardMembership(conf, group, SHARDS, "p3", session_timeout_ms=6000).start())
        joined = wait_for(lambda: (c := covered(members)) and len(members[-1].owned()) >= 3 and c,
                          timeout=60, what="the newcomer holding a share")
        taken = {shard for shard, (who, _) in joined.items() if who == "p3"}
        assert all(joined[shard][1] > after[shard][1] for shard in taken)

        for m in members[:-1]:
            m.stop()
        last = members[-1]
        wait_for(lambda: len(last.owned()) == SHARDS, timeout=30, what="the last member holding every shard")
        assert last.owns("orders") is not None and s in last.owned()
    finally:
        for m in members:
            m.stop()


def test_two_probes_of_one_ha_group_watch_each_topic_once_and_one_left_watches_all(kafka_cluster):
    """Two probes with the same --ha-group on the shared cluster: each sends the offsets of the
    topics in its shards only, together every topic once; when one closes (it leaves the group), the
    other holds every shard and sends them all within a few intervals, and no topic is said gone."""
    import threading

    from monitor.probe_config import ProbeConfig
    from tests.support.capture import capturing_probe, of_type

    kc = kafka_cluster
    prefix = unique("hat")
    topics = [f"{prefix}.{i}" for i in range(8)]
    for t in topics:
        kc.create_topic(t, partitions=1)
    group = unique("ha")
    probes, caps, stops, threads = [], [], [], []
    for i in range(2):
        cfg = ProbeConfig(bootstrap_servers=kc.bootstrap_servers, interval_s=1, topics_include=f"^{prefix}\\.",
                          groups_include="^$", quorum_interval_s=0, elr_interval_s=0, log_dirs_interval_s=0,
                          transactions_interval_s=0, cluster=group, source=f"probe-{i}", ha_group=group, shards=8)
        p, cap = capturing_probe(cfg)
        stop = threading.Event()
        t = threading.Thread(target=p.run, args=(stop,), daemon=True)
        probes.append(p), caps.append(cap), stops.append(stop), threads.append(t)
    try:
        for t in threads:
            t.start()
        wait_for(lambda: sorted(len(p.membership.owned()) for p in probes) == [4, 4], timeout=60,
                 what="the two probes holding 4 shards each")

        def sent_since(cap, since_seq):
            return {e.data.topic for e in of_type(cap.events, "partition_offsets") if e.seq > since_seq}
        marks = [max((e.seq for e in cap.events), default=-1) for cap in caps]

        def split():
            a, b = (sent_since(c, m) for c, m in zip(caps, marks))
            return a | b == set(topics) and (a, b)
        a, b = wait_for(split, timeout=30, what="every topic's offsets sent by one of the two")
        beats = [len(of_type(c.events, "heartbeat")) for c in caps]  # two more observations of each: still
        named_before = [p.named_refreshes for p in probes]
        wait_for(lambda: all(len(of_type(c.events, "heartbeat")) >= n + 2 for c, n in zip(caps, beats)),  # one each
                 timeout=15, what="two more observations of each probe")
        a, b = (sent_since(c, m) for c, m in zip(caps, marks))
        assert not a & b and a | b == set(topics), (a, b)
        for p, mine in zip(probes, (a, b)):
            owned = p.membership.owned()
            assert {t for t in topics if shard_of(t, 8) in owned} == mine
        # the probe without shard 0 names its topics in its Metadata requests (kafka-python), between
        # whole listings a minute apart: its views carry the leader epochs of the named answers
        other = next(i for i, p in enumerate(probes) if not p._scope.cluster_wide())
        named = [p.named_refreshes - n for p, n in zip(probes, named_before)]
        assert named[other] >= 1 and probes[other].named_failures == 0, (named, probes[other].named_failures)
        assert named[1 - other] == 0, named  # the holder of shard 0: the whole listing (it may have named before)
        view = probes[other].metadata.cluster
        assert set(topics) <= set(view.topics)  # the others' topics as last listed
        seen = [pv for t in (b if other else a) for pv in view.topics[t].partitions]
        assert seen and all(pv.leader_epoch is not None and pv.leader >= 0 for pv in seen), seen

        stops[0].set()
        threads[0].join(20)
        probes[0].close(0)
        wait_for(lambda: len(probes[1].membership.owned()) == 8, timeout=30, what="the other probe holding all")
        mark = max(e.seq for e in caps[1].events)
        wait_for(lambda: sent_since(caps[1], mark) == set(topics), timeout=15, what="every topic from the one left")
        assert not [e for cap in caps for e in of_type(cap.events, "partition_gone")]
    finally:
        for s in stops:
            s.set()
        for t in threads:
            t.join(20)
        for p in probes[1:]:
            p.close(0)
