"""The detection benchmark's ground truth for the broker and write-path alerts
(bench/detection_score.py), from hand-made ``__cluster_metadata`` records and a workload log."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import detection_score as ds  # noqa: E402

_offset = iter(range(10**6))


def rec(t: float, typ: str, **data) -> dict:
    return {"offset": next(_offset), "create_time": int(t * 1000), "type": typ, "data": data}


def cluster_records() -> list[dict]:
    """Brokers 1-3 up at t=0; canary topic c (p0 led by 1, p1 by 2, p2 by 3), RF 3."""
    out = [rec(0, "REGISTER_BROKER_RECORD", brokerId=b, fenced=True) for b in (1, 2, 3)]
    out += [rec(0.5, "BROKER_REGISTRATION_CHANGE_RECORD", brokerId=b, fenced=-1) for b in (1, 2, 3)]
    out.append(rec(1, "TOPIC_RECORD", name="c", topicId="T"))
    for p, reps in enumerate(([1, 2, 3], [2, 3, 1], [3, 1, 2])):
        out.append(rec(1, "PARTITION_RECORD", topicId="T", partitionId=p, leader=reps[0], replicas=reps, isr=reps))
    return out


def kinds(conds, kind):
    return sorted((c.entity, c.start, c.end) for c in conds if c.kind == kind)


def test_a_stopped_broker_is_down_until_unfenced_then_under_replicating_until_back_in_every_isr():
    records = cluster_records() + [
        rec(100, "BROKER_REGISTRATION_CHANGE_RECORD", brokerId=2, fenced=1),
        rec(100, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=0, isr=[1, 3]),
        rec(100, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=1, leader=3, isr=[3, 1]),
        rec(100, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=2, isr=[3, 1]),
        rec(150, "REGISTER_BROKER_RECORD", brokerId=2, fenced=True),
        rec(151, "BROKER_REGISTRATION_CHANGE_RECORD", brokerId=2, fenced=-1),
        rec(155, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=0, isr=[1, 3, 2]),
        rec(157, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=1, isr=[3, 1, 2]),
        rec(158, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=2, isr=[3, 1, 2]),
    ]
    lines = ds.partition_timelines(records, "")[0]
    conds = ds.broker_conditions(lines, ds.broker_timelines(records), [], "c", (10, 300))
    assert kinds(conds, "BrokerDown") == [(("b", 2), 100, 151)]
    assert kinds(conds, "BrokerUnderReplicating") == [(("b", 2), 151, 158)]
    assert not kinds(conds, "HighWatermarkStalled") and not kinds(conds, "BrokerStallingWrites")


def test_a_paused_follower_stalls_the_partitions_it_follows_until_each_leader_drops_it():
    records = cluster_records() + [
        rec(125, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=0, isr=[1, 2]),
        rec(131, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=1, isr=[2, 1]),
        rec(140, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=0, isr=[1, 2, 3]),
        rec(141, "PARTITION_CHANGE_RECORD", topicId="T", partitionId=1, isr=[2, 1, 3]),
    ]
    log = [{"t": 100.0, "event": "pause_broker", "broker": 3}, {"t": 135.0, "event": "resume_broker", "broker": 3}]
    lines = ds.partition_timelines(records, "")[0]
    conds = ds.broker_conditions(lines, ds.broker_timelines(records), log, "c", (10, 300))
    # 0 and 1 until their leaders drop it; 2, which it leads, until it resumes
    assert kinds(conds, "HighWatermarkStalled") == [(("p", "c", 0), 100, 125), (("p", "c", 1), 100, 131),
                                                    (("p", "c", 2), 100, 135)]
    assert kinds(conds, "BrokerStallingWrites") == [(("b", 3), 100, 131)]
    assert kinds(conds, "BrokerUnderReplicating") == [(("b", 3), 125, 141)]
    assert not kinds(conds, "BrokerDown")
    assert {c.rule_min_s for c in conds if c.kind in ("HighWatermarkStalled", "BrokerStallingWrites")} == {10.0}


def test_broker_alerts_are_scored_on_a_broker_entity():
    assert ds.entity_of("BrokerDown", {"cluster": "k", "broker": "3"}) == ("b", 3)
    assert ds.entity_of("IsrShrink", {"cluster": "k", "topic": "t", "partition": "0", "broker": "3"}) == ("p", "t", 0)
