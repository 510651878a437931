"""The alerts topic sink against Tansu: a replayed batch publishes nothing twice."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_monitor.local.broker import create_topics
from streaming.sinks.alerts import AlertsTopicSink
from tests.conftest import unique

pytestmark = pytest.mark.integration


def transition(i, action="open"):
    return {"kind": "alert", "action": action, "alert": "IsrShrink", "alert_id": f"a{i:03d}", "severity": "warning",
            "at": 1000 + i, "cluster": "k", "topic": "t", "partition": i, "consumer_group": None, "source": None,
            "evidence": json.dumps({"removed": [2]})}


def read_all(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("r"), "enable.partition.eof": True})
    md = c.list_topics(topic, timeout=10)
    parts = list(md.topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out, eof = [], set()
    deadline = time.monotonic() + 60
    while len(eof) < len(parts):
        assert time.monotonic() < deadline, f"reading {topic}: no end of partition within 60s"
        for m in c.consume(500, timeout=2):
            if m.error():
                eof.add(m.partition())
            else:
                out.append((m.key().decode(), json.loads(m.value())))
    c.close()
    return out


def test_replays_after_a_restart_publish_each_transition_once(tansu):
    topic = unique("alerts")
    create_topics(tansu.bootstrap, {topic: 2})
    kafka = {"bootstrap.servers": tansu.bootstrap}
    s1 = AlertsTopicSink(kafka, topic)
    assert s1.publish(0, [transition(i) for i in range(3)]) == 3
    assert s1.publish(1, [transition(i) for i in range(3, 7)]) == 4
    s1.close()

    # the job crashed after batch 1's records were written but before Spark committed batch 1:
    # a new sink (new process) sees batch 1 again, in another row order, then batch 2
    s2 = AlertsTopicSink(kafka, topic)
    assert s2.publish(1, [transition(i) for i in reversed(range(3, 7))]) == 0
    assert s2.publish(0, [transition(0)]) == 0  # older than what is there: nothing
    assert s2.publish(2, [transition(7, "resolve")]) == 1
    s2.close()

    recs = read_all(tansu.bootstrap, topic)
    assert sorted(r["alert_id"] for _, r in recs) == [f"a{i:03d}" for i in range(8)]
    assert all(k == r["alert_id"] for k, r in recs)
    seqs = sorted(r["sequence"] for _, r in recs)
    assert len(set(seqs)) == len(seqs)
    last = next(r for _, r in recs if r["alert_id"] == "a007")
    assert (last["action"], last["batch_id"], last["labels"]["topic"], last["evidence"]) == ("resolve", 2, "t", {"removed": [2]})


def test_a_partly_published_batch_is_completed_not_duplicated(tansu):
    topic = unique("alerts")
    create_topics(tansu.bootstrap, {topic: 1})
    kafka = {"bootstrap.servers": tansu.bootstrap}
    rows = [transition(i) for i in range(5)]
    s1 = AlertsTopicSink(kafka, topic)
    s1.publish(4, rows[:2])  # as if the process died after producing 2 of the 5 (sorted) records
    s1.close()
    s2 = AlertsTopicSink(kafka, topic)
    assert s2.publish(4, rows) == 3
    s2.close()
    recs = read_all(tansu.bootstrap, topic)
    assert sorted(r["alert_id"] for _, r in recs) == [f"a{i:03d}" for i in range(5)]


def test_a_new_checkpoint_publishes_from_its_batch_0_and_a_restart_still_dedups(tansu):
    """Batch ids start again at 0 on a new checkpoint (a new query id): what an earlier query
    published holds nothing of it back, while a restart of either query still publishes each of
    its transitions once.  Records written before they carried a query id count as the query's."""
    topic = unique("alerts")
    create_topics(tansu.bootstrap, {topic: 2})
    kafka = {"bootstrap.servers": tansu.bootstrap}
    legacy = AlertsTopicSink(kafka, topic)  # no query id: as written before records carried one
    assert legacy.publish(4, [transition(i) for i in range(2)]) == 2
    legacy.close()
    old = AlertsTopicSink(kafka, topic, query_id="q-old")
    assert old.publish(4, [transition(i) for i in range(2)]) == 0  # the legacy records are its own
    assert old.publish(5, [transition(i) for i in range(2, 5)]) == 3
    old.close()

    new = AlertsTopicSink(kafka, topic, wait_query_id=True)
    new.query_id = "q-new"  # the job sets it once the query has started
    assert new.publish(0, [transition(i) for i in range(5, 7)]) == 2  # not held back by q-old's batch 5
    new.close()
    again = AlertsTopicSink(kafka, topic, query_id="q-new")  # q-new restarted, its batch 0 run again
    assert again.publish(0, [transition(i) for i in range(5, 7)]) == 0
    assert again.publish(1, [transition(7)]) == 1
    again.close()
    old_again = AlertsTopicSink(kafka, topic, query_id="q-old")  # and q-old's checkpoint once more
    assert old_again.publish(5, [transition(i) for i in range(2, 5)]) == 0
    old_again.close()

    recs = read_all(tansu.bootstrap, topic)
    assert sorted(r["alert_id"] for _, r in recs) == [f"a{i:03d}" for i in range(8)]
    assert {r["alert_id"]: r.get("query_id") for _, r in recs} == {
        **{f"a{i:03d}": None for i in range(2)}, **{f"a{i:03d}": "q-old" for i in range(2, 5)},
        **{f"a{i:03d}": "q-new" for i in range(5, 8)}}


def test_labels_carry_the_names_metrics_and_rules_use(tansu):
    """A group alert's group is ``group`` on the alerts topic, as on /metrics and in the
    Prometheus rules (the state's rows call it ``consumer_group``); absent labels are left out."""
    topic = unique("alerts")
    create_topics(tansu.bootstrap, {topic: 1})
    s = AlertsTopicSink({"bootstrap.servers": tansu.bootstrap}, topic)
    lag = {**transition(0), "alert": "ConsumerLagHigh", "alert_id": "g000", "topic": "orders", "partition": 3,
           "consumer_group": "billing"}
    assert s.publish(0, [lag]) == 1
    s.close()
    [(_, rec)] = read_all(tansu.bootstrap, topic)
    assert rec["labels"] == {"cluster": "k", "topic": "orders", "partition": 3, "group": "billing"}
