"""The probe's handling of Kafka's sentinels and races, driven through a fake admin client (the
narrow slice of confluent_kafka.admin.AdminClient the probe calls) and a fake emitter.

Cases real brokers here cannot produce on demand: a committed offset of -1 / -1001, a group
with no commits, a topic deleted while a group still holds commits on it (Apache Kafka keeps
them until offsets.retention.minutes; Tansu drops the group with the topic), per-partition
errors that invalidate metadata."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from monitor.contract import GroupOffsets, MetadataRefresh, PartitionOffsets
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from tests.support.probe_fakes import FakeAdmin, FakeEmitter, tp


def make(admin: FakeAdmin):
    em = FakeEmitter()
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1, refresh_backoff_s=0), emitter=em,
                  admin=admin)
    return probe, em


def test_sentinels_and_a_topic_deleted_under_a_group():
    admin = FakeAdmin(
        topics={"orders": 2},
        committed={
            "billing": [tp("orders", 0, 40), tp("orders", 1, -1001), tp("gone", 0, 7)],  # gone: deleted topic
            "idle": [],                                                                # commits nothing
            "minus-one": [tp("orders", 0, -1)],
        },
        hw={("orders", 0): 100, ("orders", 1): 5})
    probe, em = make(admin)
    probe.cycle()
    g = {(e.group, e.topic, e.partition): e for e in em.of(GroupOffsets)}
    assert (g["billing", "orders", 0].committed_offset, g["billing", "orders", 0].high_watermark) == (40, 100)
    assert g["billing", "orders", 1].committed_offset is None          # -1001: no commit, never a number
    assert g["minus-one", "orders", 0].committed_offset is None        # -1 likewise
    gone = g["billing", "gone", 0]
    assert (gone.committed_offset, gone.high_watermark, gone.hw_observed_at) == (7, None, None)
    assert not any(k[0] == "idle" for k in g)                          # a group with no commits: no rows
    # the unknown topic forces a metadata refresh (Kafka's add(topic)), reason new_topic
    assert probe.metadata.next_reason() == ("new_topic", None)
    probe.refresh_metadata()
    last = em.of(MetadataRefresh)[-1]
    assert (last.reason, last.ok) == ("new_topic", True)


@pytest.mark.parametrize("code, cause", [
    (KafkaError.NOT_LEADER_FOR_PARTITION, "error_response:NOT_LEADER_OR_FOLLOWER"),
    (KafkaError.LEADER_NOT_AVAILABLE, "error_response:LEADER_NOT_AVAILABLE"),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, "error_response:UNKNOWN_TOPIC_OR_PARTITION"),
    (KafkaError.FENCED_LEADER_EPOCH, "error_response:FENCED_LEADER_EPOCH"),
])
def test_an_error_in_an_offsets_response_invalidates_metadata(code, cause):
    admin = FakeAdmin(topics={"orders": 2}, committed={}, hw={("orders", 0): 10},
                      errors={("orders", 1): KafkaError(code)})
    probe, em = make(admin)
    probe.cycle()
    assert [e.partition for e in em.of(PartitionOffsets)] == [0]   # no made-up HW for the failed one
    assert probe.metadata.next_reason() == ("invalidated", cause)
    probe.refresh_metadata()
    last = em.of(MetadataRefresh)[-1]
    assert (last.reason, last.cause) == ("invalidated", cause)


def test_a_transport_failure_is_a_failed_refresh_and_is_retried_after_the_backoff():
    admin = FakeAdmin(topics={"orders": 1}, committed={}, hw={})

    def down(topic=None, timeout=None):
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers down"))

    admin.list_topics = down
    probe, em = make(admin)
    probe.cycle()
    r = em.of(MetadataRefresh)
    assert len(r) == 1 and not r[0].ok and r[0].reason == "bootstrap"
    assert probe.metadata.should_refresh() and probe.metadata.version == 0
    assert not em.of(PartitionOffsets)  # no metadata yet: nothing observed, nothing invented
