"""Deleted topics, groups and committed offsets leave the job's state at once (issue 31): the
probe's gone events, parsed and keyed like their entities, resolve the alerts with a reason,
send remove rows, and are counted; each bucket reports what it holds."""

from __future__ import annotations

import json

import pyarrow as pa

from monitor.contract import Event, GroupGone, GroupPartitionGone, PartitionGone
from streaming.ingest import parsing
from streaming.state import function as st
from streaming.state import codec

from tests.support.state_fakes import FakeState, call, goff, pmd, poff, rows


def pgone(seq, t, part=0, topic="t"):
    return {"type": "partition_gone", "entity": f"partition|k/{topic}/{part}", "cluster": "k", "source": "p",
            "seq": seq, "observed_at": t, "topic": topic, "partition": part, "refresh_reason": "topic deleted"}


def ggone(seq, t, group="g"):
    return {"type": "group_gone", "entity": f"group|k/{group}", "cluster": "k", "source": "p", "seq": seq,
            "observed_at": t, "group": group, "refresh_reason": "group deleted"}


def gpgone(seq, t, part=0, group="g"):
    return {"type": "group_partition_gone", "entity": f"group_partition|k/{group}/t/{part}", "cluster": "k",
            "source": "p", "seq": seq, "observed_at": t, "group": group, "topic": "t", "partition": part,
            "refresh_reason": "committed offset deleted"}


def gstate(seq, t, group="g", state="Empty"):
    return {"type": "group_state", "entity": f"group|k/{group}", "cluster": "k", "source": "p", "seq": seq,
            "observed_at": t, "group": group, "group_state": state, "members": 0}


def cfetch(seq, t, group="g", part=0):
    return {"type": "client_fetch", "entity": f"client_fetch|k/{group}/t/{part}", "cluster": "k", "source": "app",
            "seq": seq, "observed_at": t, "group": group, "topic": "t", "partition": part, "position": 5,
            "committed_offset": 5, "high_watermark": 9, "fetch_state": "active"}


def state_row(out) -> tuple[dict, int]:
    (r,) = out[out.kind == "state"].to_dict("records")
    return json.loads(r["report"])["entities"], int(r["count"])


def removed(out) -> dict:
    c = out[out.kind == "removed"]
    return {(k, why): int(n) for k, why, n in zip(c.alert, c.evidence, c["count"])}


def test_a_deleted_topics_partition_resolves_its_alerts_with_the_reason_and_leaves():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=900_000))
    s = FakeState()
    out = call(fn, 0, rows(pmd(1, 1000, [1, 2, 3]), pmd(2, 2000, [1]), poff(3, 2000, 50)), s)
    assert set(out[(out.kind == "alert") & (out.action == "open")].alert) >= {"UnderReplicated"}
    assert state_row(out)[0] == {"partition": 1}
    out = call(fn, 0, rows(pgone(4, 5000)), s)
    resolved = out[(out.kind == "alert") & (out.action == "resolve")]
    assert set(resolved.alert) >= {"UnderReplicated"}
    assert {json.loads(e)["reason"] for e in resolved.evidence} == {"topic deleted"}
    assert set(resolved["at"]) == {5000}
    assert list(out[(out.kind == "partition") & (out.action == "remove")].partition) == [0]
    assert removed(out) == {("partition", "topic_deleted"): 1}
    assert state_row(out) == ({}, 0)
    assert s.value is None  # nothing left: the bucket's state is removed


def test_a_quiet_partition_kept_in_the_table_is_forgotten_too():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=900_000))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 1000, [1, 2, 3], part=0), poff(2, 1000, 5, part=0),
                     pmd(3, 1000, [1, 2, 3], part=1), poff(4, 1000, 5, part=1)), s)
    call(fn, 0, rows(pmd(5, 2000, [1, 2, 3], part=0), poff(6, 2000, 6, part=0),
                     pmd(7, 2000, [1, 2, 3], part=1), poff(8, 2000, 6, part=1)), s)
    assert set(codec.stored_entities(s.value[0])) == {"partition|k/t/0", "partition|k/t/1"}
    out = call(fn, 0, rows(pgone(9, 3000, part=0), pmd(10, 3000, [1, 2, 3], part=1), poff(11, 3000, 7, part=1)), s)
    assert set(codec.stored_entities(s.value[0])) == {"partition|k/t/1"}
    assert list(out[(out.kind == "partition") & (out.action == "remove")].partition) == [0]
    ents, size = state_row(out)
    assert ents == {"partition": 1} and size == len(s.value[0])


def test_a_gone_event_for_what_was_seen_after_it_or_never_seen_changes_nothing():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=900_000))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 5000, [1, 2, 3]), poff(2, 5000, 5)), s)
    out = call(fn, 0, rows(pgone(3, 4000), pgone(4, 6000, part=7)), s)  # re-created since; never seen
    assert out[out.action == "remove"].empty and removed(out) == {}
    assert set(codec.stored_entities(s.value[0])) == {"partition|k/t/0"}


def test_a_topic_deleted_and_recreated_in_one_batch_keeps_its_series_and_counts_the_removal():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=900_000))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 1000, [1, 2, 3]), pmd(2, 2000, [1])), s)
    out = call(fn, 0, rows(pgone(3, 3000), pmd(4, 4000, [1, 2, 3]), poff(5, 4000, 0)), s)
    assert out[(out.kind == "partition") & (out.action == "remove")].empty
    assert list(out[(out.kind == "partition") & (out.action == "upsert")].partition) == [0]
    assert removed(out) == {("partition", "topic_deleted"): 1}
    (p,) = codec.stored_entities(s.value[0]).values()
    assert p["open"] == {} and p["last_seen"] == 4000


def test_a_deleted_group_takes_its_partitions_and_consumers_along_and_spares_other_groups():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=900_000))
    s = FakeState()
    call(fn, 5, rows(gstate(1, 1000), goff(2, 1000, 10, 500), goff(3, 1000, 10, 500, part=1), cfetch(4, 1000),
                     gstate(5, 1000, group="h"), {**goff(6, 1000, 10, 20), "group": "h",
                                                  "entity": "group_partition|k/h/t/0"}), s)
    out = call(fn, 5, rows(ggone(7, 9000)), s)
    assert removed(out) == {("group", "group_deleted"): 1, ("group_partition", "group_deleted"): 2,
                            ("client_fetch", "group_deleted"): 1}
    assert set(codec.stored_entities(s.value[0])) == {"group|k/h", "group_partition|k/h/t/0"}
    assert state_row(out)[0] == {"group": 1, "group_partition": 1}
    assert set(out[out.action == "remove"].consumer_group) == {"g"}


def test_a_deleted_committed_offset_leaves_alone():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=900_000))
    s = FakeState()
    call(fn, 5, rows(gstate(1, 1000), goff(2, 1000, 10, 500), goff(3, 1000, 10, 500, part=1)), s)
    out = call(fn, 5, rows(gpgone(4, 9000, part=1)), s)
    assert removed(out) == {("group_partition", "offset_deleted"): 1}
    assert set(codec.stored_entities(s.value[0])) == {"group|k/g", "group_partition|k/g/t/0"}


def test_the_ttls_evictions_are_counted_as_not_observed():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=10_000))
    s = FakeState()
    call(fn, 0, rows(poff(1, 1000, 5)), s)
    s.hasTimedOut, s.processing_time_ms = True, 100_000
    (df,) = list(fn((0,), iter([]), s))
    assert removed(df) == {("partition", "not_observed"): 1}
    assert state_row(df) == ({}, 0)


def test_gone_events_are_keyed_and_bucketed_like_their_entities():
    def parse(data):
        e = Event.of(data, cluster="c1", source="p1", seq=1, observed_at=1_000).to_dict()
        (r,) = parsing.parse_values(pa.array([json.dumps(e)]), gate=True).to_pylist()
        return r

    p = parse(PartitionGone(topic="t", partition=2))
    assert (p["reason"], p["type"], p["entity"], p["bucket_key"], p["refresh_reason"]) == (
        None, "partition_gone", "partition|c1/t/2", "c1/t/2", "topic deleted")
    g = parse(GroupGone(group="g"))
    assert (g["reason"], g["entity"], g["bucket_key"]) == (None, "group|c1/g", "c1/g")
    gp = parse(GroupPartitionGone(group="g", topic="t", partition=2))
    assert (gp["reason"], gp["entity"], gp["bucket_key"]) == (None, "group_partition|c1/g/t/2", "c1/g")
