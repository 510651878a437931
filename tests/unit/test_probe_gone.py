"""The probe says when a watched entity is gone (``partition_gone``, ``group_gone``,
``group_partition_gone``), so that the job drops it at once instead of after its TTL: seen before,
then left out of ``GONE_AFTER`` (2) successive complete answers; a failed or partial answer counts
neither way.  Driven through a fake admin client whose answers the test changes between cycles,
and the real emitter over a capturing producer (every event is parsed back by the contract)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, Optional

import pytest
from confluent_kafka import KafkaError, KafkaException

from monitor.contract import Event, PartitionGone
from monitor.emitter import EventEmitter
from monitor.gone import GONE_AFTER
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig, share_of
from tests.support.capture import CapturingProducer
from tests.support.probe_fakes import FakeAdmin, FakeEmitter, described, done, tp


class GoneAdmin(FakeAdmin):
    """A FakeAdmin whose metadata can fail, come without brokers or name a topic with an error,
    whose group listing can be replaced, and whose coordinators can leave groups unanswered."""

    def __init__(self, topics: dict[str, int], committed: dict[str, list], hw: Optional[dict] = None):
        super().__init__(topics, committed, hw or {})
        self.metadata_error: Optional[int] = None     # list_topics() raises this
        self.no_brokers = False                       # an empty response (a failed update)
        self.topic_errors: dict[str, int] = {}        # topic -> error it is listed with, no partitions
        self.listing: Optional[Future] = None         # handed out instead of the complete listing
        self.silent: set[str] = set()                 # groups whose coordinator does not answer

    def list_topics(self, topic=None, timeout=None):
        if topic is None and self.metadata_error is not None:
            raise KafkaException(KafkaError(self.metadata_error))
        md = super().list_topics(topic, timeout)
        if self.no_brokers:
            md.brokers = {}
        for t, code in self.topic_errors.items():
            md.topics[t] = SimpleNamespace(topic=t, partitions={}, error=KafkaError(code))
        return md

    def list_consumer_groups(self, request_timeout=None):
        return self.listing if self.listing is not None else super().list_consumer_groups(request_timeout)

    def list_consumer_group_offsets(self, reqs, request_timeout=None):
        g = reqs[0].group_id
        if g in self.silent:
            return {g: done(exc=KafkaException(KafkaError(KafkaError._TIMED_OUT)))}
        return super().list_consumer_group_offsets(reqs, request_timeout)


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(admin: Any, **kw: Any) -> tuple[Probe, CapturingProducer]:
    clock = kw.pop("clock", None) or Clock()
    cfg = ProbeConfig(bootstrap_servers="fake:9092", cluster="c", source="p", interval_s=kw.pop("interval_s", 4.0),
                      refresh_backoff_s=kw.pop("refresh_backoff_s", 0), **kw)
    producer = CapturingProducer()
    emitter = EventEmitter({}, cfg.events_topic, cluster="c", source="p", producer=producer, clock=clock)
    return Probe(cfg, emitter=emitter, admin=admin, clock=clock), producer


def gone(producer: CapturingProducer, etype: str) -> list[tuple]:
    """The gone events of one type sent so far, as (entity fields..., reason)."""
    fields = {"partition_gone": ("topic", "partition"), "group_gone": ("group",),
              "group_partition_gone": ("group", "topic", "partition")}[etype]
    return [tuple(getattr(e.data, f) for f in fields) + (e.data.reason,) for e in producer.events if e.type == etype]


def parts(topic: str, n: int) -> list[tuple]:
    return [(topic, p, "topic deleted") for p in range(n)]


# -- topics --------------------------------------------------------------------------------------


def test_a_deleted_topic_is_gone_after_exactly_two_complete_metadata_responses():
    admin = GoneAdmin({"orders": 3, "audit": 1}, {})
    probe, cap = make(admin)
    assert probe.refresh_metadata()
    del admin.topics["orders"]
    assert probe.refresh_metadata()
    assert gone(cap, "partition_gone") == []  # one miss: not yet
    # the first miss asks for metadata again, with its own cause
    assert probe.metadata.next_reason() == ("invalidated", "topic_missing")
    assert probe.refresh_metadata()
    last = [e.data for e in cap.events if e.type == "metadata_refresh"][-1]
    assert (last.reason, last.cause, last.ok) == ("invalidated", "topic_missing", True)
    assert gone(cap, "partition_gone") == parts("orders", 3)  # one per partition it had
    # forgotten: nothing sent again, nothing kept
    for _ in range(3):
        probe.refresh_metadata()
    assert gone(cap, "partition_gone") == parts("orders", 3)
    assert "orders" not in probe._gone.topic_parts and probe._gone.topic_misses == {}
    assert probe.metadata.next_reason() == ("periodic", None)
    # re-created, it is a new topic: seen again, gone again
    admin.topics["orders"] = 2
    probe.refresh_metadata()
    del admin.topics["orders"]
    for _ in range(GONE_AFTER):
        probe.refresh_metadata()
    assert gone(cap, "partition_gone") == parts("orders", 3) + parts("orders", 2)


def test_the_first_miss_asks_for_metadata_after_one_backoff_not_a_refresh_interval():
    clock = Clock()
    admin = GoneAdmin({"orders": 1, "audit": 1}, {})
    probe, _ = make(admin, clock=clock, interval_s=30.0, refresh_backoff_s=1.0)
    probe.refresh_metadata()
    clock.t += 30
    probe.refresh_metadata()  # periodic, nothing missing
    assert probe.metadata.time_to_next_update() == 30_000
    del admin.topics["orders"]
    clock.t += 30
    probe.refresh_metadata()
    assert probe.metadata.time_to_next_update() == 1_000  # the backoff
    assert probe.metadata.next_reason() == ("invalidated", "topic_missing")


@pytest.mark.parametrize("failure", ["request fails", "no brokers", "topic errored"])
def test_a_failed_or_partial_metadata_answer_counts_neither_way(failure):
    admin = GoneAdmin({"orders": 2, "audit": 1}, {})
    probe, cap = make(admin)
    probe.refresh_metadata()

    def broken_refresh():
        if failure == "request fails":
            admin.metadata_error = KafkaError._TRANSPORT
        elif failure == "no brokers":
            admin.no_brokers = True
        else:
            admin.topic_errors["orders"] = KafkaError.UNKNOWN_TOPIC_OR_PART
        ok = probe.refresh_metadata()
        admin.metadata_error, admin.no_brokers, admin.topic_errors = None, False, {}
        return ok

    # before any miss: does not count as one
    for _ in range(3):
        broken_refresh()
    del admin.topics["orders"]
    probe.refresh_metadata()  # miss 1
    assert gone(cap, "partition_gone") == []
    # between two misses: neither a miss nor a sign of life
    for _ in range(3):
        broken_refresh()
    assert gone(cap, "partition_gone") == []
    assert probe._gone.topic_misses == {"orders": 1}
    probe.refresh_metadata()  # miss 2
    assert gone(cap, "partition_gone") == parts("orders", 2)


def test_a_topic_back_after_one_miss_is_not_gone():
    admin = GoneAdmin({"orders": 2, "audit": 1}, {})
    probe, cap = make(admin)
    probe.refresh_metadata()
    admin.topics.pop("orders")
    probe.refresh_metadata()       # miss 1
    admin.topics["orders"] = 2     # a lagging broker, or back
    probe.refresh_metadata()       # seen again: the count starts over
    admin.topics.pop("orders")
    probe.refresh_metadata()       # miss 1 again
    assert gone(cap, "partition_gone") == [] and probe._gone.topic_misses == {"orders": 1}
    probe.refresh_metadata()       # miss 2
    assert gone(cap, "partition_gone") == parts("orders", 2)


def test_a_topic_not_sent_is_sent_at_the_next_complete_miss():
    admin = GoneAdmin({"orders": 2}, {})
    em = FakeEmitter()
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=4, refresh_backoff_s=0), emitter=em, admin=admin)
    refused: list[int] = []

    def emit_rows(cls, rows, observed_at):
        if cls is PartitionGone and not refused:  # the queue is full, once
            refused.append(len(rows))
            return list(range(len(rows)))
        em.events.extend(cls(*r) for r in rows)
        return []

    em.emit_rows = emit_rows  # type: ignore[attr-defined]
    probe.refresh_metadata()
    admin.topics.pop("orders")
    probe.refresh_metadata()
    probe.refresh_metadata()
    assert refused == [2] and em.of(PartitionGone) == []
    probe.refresh_metadata()
    assert [(e.topic, e.partition) for e in em.of(PartitionGone)] == [("orders", 0), ("orders", 1)]
    assert probe._gone.topic_parts == {} and probe._gone.topic_misses == {}


# -- groups --------------------------------------------------------------------------------------


def test_a_deleted_group_is_gone_after_two_complete_listings():
    admin = GoneAdmin({"orders": 1}, {"a": [tp("orders", 0, 1)], "b": [tp("orders", 0, 2)]})
    probe, cap = make(admin)
    probe.cycle()
    del admin.committed["b"]  # no longer listed
    probe.observe()
    assert gone(cap, "group_gone") == []
    probe.observe()
    assert gone(cap, "group_gone") == [("b", "group deleted")]
    for _ in range(2):
        probe.observe()
    assert gone(cap, "group_gone") == [("b", "group deleted")]  # once
    assert "b" not in probe._gone.group_misses and "b" not in probe._gone.gp_known
    assert gone(cap, "group_partition_gone") == []  # group_gone covers its partitions


def test_a_failed_or_partial_group_listing_counts_neither_way():
    admin = GoneAdmin({"orders": 1}, {"a": [tp("orders", 0, 1)], "b": [tp("orders", 0, 2)]})
    probe, cap = make(admin)
    probe.cycle()
    del admin.committed["b"]
    probe.observe()  # miss 1
    partial = SimpleNamespace(valid=[SimpleNamespace(group_id="a")], errors=[KafkaError(KafkaError._TIMED_OUT)])
    admin.listing = done(partial)
    probe.observe()
    admin.listing = done(exc=KafkaException(KafkaError(KafkaError._TRANSPORT)))
    probe.observe()
    assert gone(cap, "group_gone") == [] and probe._gone.group_misses["b"] == 1
    admin.listing = None
    probe.observe()  # miss 2
    assert gone(cap, "group_gone") == [("b", "group deleted")]


def test_a_group_listed_again_after_one_miss_is_not_gone():
    admin = GoneAdmin({"orders": 1}, {"a": [tp("orders", 0, 1)], "b": [tp("orders", 0, 2)]})
    probe, cap = make(admin)
    probe.cycle()
    b = admin.committed.pop("b")
    probe.observe()
    admin.committed["b"] = b
    probe.observe()
    admin.committed.pop("b")
    probe.observe()
    assert gone(cap, "group_gone") == []
    probe.observe()
    assert gone(cap, "group_gone") == [("b", "group deleted")]


def test_a_group_only_a_partial_listing_named_is_seen_once_its_state_is_sent():
    admin = GoneAdmin({"orders": 1}, {"a": []})  # commits nothing: seen through its state only
    admin.describe_consumer_groups = lambda groups, request_timeout=None: {g: done(described(g, 1)) for g in groups}
    admin.listing = done(SimpleNamespace(valid=[SimpleNamespace(group_id="a")], errors=[KafkaError(KafkaError._TRANSPORT)]))
    probe, cap = make(admin)
    probe.cycle()
    assert [e.data.group for e in cap.events if e.type == "group_state"] == ["a"]
    admin.listing = None
    del admin.committed["a"]
    for _ in range(GONE_AFTER):
        probe.observe()
    assert gone(cap, "group_gone") == [("a", "group deleted")]


# -- committed offsets -----------------------------------------------------------------------------


def test_a_committed_offset_left_out_of_two_answers_is_gone():
    admin = GoneAdmin({"orders": 3}, {"g": [tp("orders", 0, 1), tp("orders", 1, 2), tp("orders", 2, 3)]})
    probe, cap = make(admin)
    probe.cycle()
    assert {(e.data.topic, e.data.partition) for e in cap.events if e.type == "group_offsets"} == \
        {("orders", 0), ("orders", 1), ("orders", 2)}
    admin.committed["g"] = [tp("orders", 0, 1), tp("orders", 2, 3)]  # offsets of partition 1 deleted
    probe.observe()
    assert gone(cap, "group_partition_gone") == []
    probe.observe()
    assert gone(cap, "group_partition_gone") == [("g", "orders", 1, "committed offset deleted")]
    for _ in range(2):
        probe.observe()
    assert len(gone(cap, "group_partition_gone")) == 1
    assert probe._gone.gp_known["g"] == {("orders", 0), ("orders", 2)} and probe._gone.gp_misses == {}
    assert gone(cap, "group_gone") == []  # the group is still there


def test_a_partition_the_group_commits_on_later_is_tracked_too():
    admin = GoneAdmin({"orders": 2}, {"g": [tp("orders", 0, 1)]})
    probe, cap = make(admin)
    probe.cycle()
    admin.committed["g"] = [tp("orders", 0, 1), tp("orders", 1, 4)]  # a new commit
    probe.observe()
    assert probe._gone.gp_known["g"] == {("orders", 0), ("orders", 1)}
    admin.committed["g"] = [tp("orders", 0, 1)]
    for _ in range(GONE_AFTER):
        probe.observe()
    assert gone(cap, "group_partition_gone") == [("g", "orders", 1, "committed offset deleted")]


def test_an_errored_partition_is_not_missing():
    admin = GoneAdmin({"orders": 2}, {"g": [tp("orders", 0, 1), tp("orders", 1, 2)]})
    probe, cap = make(admin)
    probe.cycle()
    errored = [tp("orders", 0, 1), tp("orders", 1, -1, error=KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT))]
    admin.committed["g"] = errored
    for _ in range(3):
        probe.observe()
    assert gone(cap, "group_partition_gone") == []  # an error is no answer for it
    admin.committed["g"] = [tp("orders", 0, 1)]
    probe.observe()  # miss 1
    admin.committed["g"] = errored
    probe.observe()  # neither
    assert gone(cap, "group_partition_gone") == [] and probe._gone.gp_misses == {"g": {("orders", 1): 1}}
    admin.committed["g"] = [tp("orders", 0, 1)]
    probe.observe()  # miss 2
    assert gone(cap, "group_partition_gone") == [("g", "orders", 1, "committed offset deleted")]


def test_an_unanswered_coordinator_counts_nothing():
    admin = GoneAdmin({"orders": 2}, {"g": [tp("orders", 0, 1), tp("orders", 1, 2)]})
    probe, cap = make(admin)
    probe.cycle()
    admin.committed["g"] = [tp("orders", 0, 1)]
    probe.observe()  # miss 1
    admin.silent = {"g"}
    for _ in range(3):
        probe.observe()
    assert gone(cap, "group_partition_gone") == []
    assert probe._gone.gp_misses == {"g": {("orders", 1): 1}}
    admin.silent = set()
    probe.observe()  # miss 2
    assert gone(cap, "group_partition_gone") == [("g", "orders", 1, "committed offset deleted")]


def test_a_committed_offset_back_after_one_miss_is_not_gone():
    admin = GoneAdmin({"orders": 2}, {"g": [tp("orders", 0, 1), tp("orders", 1, 2)]})
    probe, cap = make(admin)
    probe.cycle()
    full = admin.committed["g"]
    admin.committed["g"] = [tp("orders", 0, 1)]
    probe.observe()
    admin.committed["g"] = full
    probe.observe()
    admin.committed["g"] = [tp("orders", 0, 1)]
    probe.observe()
    assert gone(cap, "group_partition_gone") == []


def test_no_group_partition_gone_for_a_deleted_group():
    admin = GoneAdmin({"orders": 2}, {"g": [tp("orders", 0, 1), tp("orders", 1, 2)], "h": [tp("orders", 0, 5)]})
    probe, cap = make(admin)
    probe.cycle()
    del admin.committed["g"]  # the group and its offsets
    for _ in range(4):
        probe.observe()
    assert gone(cap, "group_gone") == [("g", "group deleted")]
    assert gone(cap, "group_partition_gone") == []
    assert "g" not in probe._gone.gp_known and "g" not in probe._gone.gp_misses
    # re-created: a new group, its partitions reported and tracked again
    admin.committed["g"] = [tp("orders", 1, 3)]
    probe.observe()
    assert probe._gone.gp_known["g"] == {("orders", 1)}


# -- sharing -------------------------------------------------------------------------------------


def _names(prefix: str, share: int, of: int, n: int = 2) -> list[str]:
    return [name for name in (f"{prefix}{i}" for i in range(100)) if share_of(name, of) == share][:n]


def test_a_probe_says_gone_only_for_what_its_share_reports():
    mine_t, theirs_t = _names("topic-", 1, 2, 1)[0], _names("topic-", 2, 2, 1)[0]
    mine_g, theirs_g = _names("group-", 1, 2, 1)[0], _names("group-", 2, 2, 1)[0]
    committed = {mine_g: [tp(mine_t, 0, 1), tp(theirs_t, 0, 1)], theirs_g: [tp(mine_t, 0, 1), tp(theirs_t, 0, 1)]}
    admin = GoneAdmin({mine_t: 1, theirs_t: 1}, committed)
    probe, cap = make(admin, share="1/2")
    probe.cycle()
    assert set(probe._gone.topic_parts) == {mine_t}
    # only this share's topics in the offsets' bookkeeping, of every group
    assert probe._gone.gp_known == {mine_g: {(mine_t, 0)}, theirs_g: {(mine_t, 0)}}
    del admin.topics[mine_t], admin.topics[theirs_t]
    del admin.committed[mine_g], admin.committed[theirs_g]
    for _ in range(GONE_AFTER):
        probe.refresh_metadata()
        probe.observe()
    assert gone(cap, "partition_gone") == [(mine_t, 0, "topic deleted")]
    assert gone(cap, "group_gone") == [(mine_g, "group deleted")]  # the other's probe says its group is gone
    assert gone(cap, "group_partition_gone") == []
    # every group's bookkeeping went with it, reported or not
    assert probe._gone.gp_known == {} and probe._gone.gp_misses == {} and probe._gone.group_misses == {}
    assert probe._gone.topic_parts == {} and probe._gone.topic_misses == {}


def test_a_committed_offset_on_another_share_s_topic_is_never_gone_here():
    mine_t, theirs_t = _names("topic-", 1, 2, 1)[0], _names("topic-", 2, 2, 1)[0]
    admin = GoneAdmin({mine_t: 1, theirs_t: 1}, {"g": [tp(mine_t, 0, 1), tp(theirs_t, 0, 1)]})
    probe, cap = make(admin, share="1/2")
    probe.cycle()
    admin.committed["g"] = [tp(mine_t, 0, 1)]
    for _ in range(3):
        probe.observe()
    assert gone(cap, "group_partition_gone") == []


# -- the contract ----------------------------------------------------------------------------------


def test_gone_events_follow_the_contract():
    admin = GoneAdmin({"orders": 2, "audit": 1}, {"g": [tp("orders", 0, 1), tp("audit", 0, 1)], "h": [tp("audit", 0, 2)]})
    probe, cap = make(admin)
    probe.cycle()
    del admin.topics["orders"]
    admin.committed["g"] = [tp("orders", 0, 1)]  # audit/0's offset deleted (orders/0's is kept by the broker)
    del admin.committed["h"]
    for _ in range(GONE_AFTER):
        probe.cycle()
    events = [e for e in cap.events if e.type in ("partition_gone", "group_gone", "group_partition_gone")]
    # keyed like their partitions' offsets: the topic's (the group's and topic's) key
    assert sorted(e.key() for e in events) == ["c/g/audit", "c/h", "c/orders", "c/orders"]
    seqs = [e.seq for e in cap.events]
    # the probe's one sequence, a number per record (a v3 record's events share theirs)
    assert seqs == sorted(seqs) and len(set(seqs)) == len({e.event_id for e in cap.events})
    for e in events:
        assert (e.cluster, e.source, e.schema) == ("c", "p", "kafka-monitor/v1") and e.observed_at > 0
        back = Event.from_json(e.to_json())
        assert back == e and back.key() == e.key()
    # a group_offsets before its group_partition_gone, in event order
    order = [(e.type, e.key()) for e in cap.events]
    assert order.index(("group_offsets", "c/g/audit")) < order.index(("group_partition_gone", "c/g/audit"))
