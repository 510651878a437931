"""Eligible leader replicas without a cluster: the probe's DescribeTopicPartitions answers
(monitor/elr.py, a fake admin behind its two calls) joined to its metadata view, the event and
its parsing, the partition rules and the exporter's gauges.  The real clusters (4.1 and 4.4 with
ELR, 3.9 without): tests/integration/test_elr.py."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace

import pyarrow as pa
from kafka import errors as kerr

from monitor.contract import Event, PartitionMetadata
from monitor.elr import ELR_FEATURE, ElrWatcher
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.ingest.parsing import parse_values
from streaming.rules import partition as rp
from streaming.rules.base import Alert
from streaming.sinks.batch import sink_rows
from streaming.sinks.exporter import Exporter
from streaming.state.rows import _frame, _row
from tests.conftest import wait_for
from tests.support.probe_fakes import FakeAdmin, FakeEmitter

NOW = 1_800_000_000_000


def part(i, leader=1, replicas=(1, 2, 3), isr=(1, 2, 3), elr=None, lk=None, offline=()):
    return {"error_code": 0, "partition_index": i, "leader_id": leader, "leader_epoch": 0, "replica_nodes": list(replicas),
            "isr_nodes": list(isr), "eligible_leader_replicas": elr, "last_known_elr": lk,
            "offline_replicas": list(offline)}


class DtpAdmin:
    """describe_features and describe_topic_partitions as kafka-python answers them; ``topics``:
    name -> partition dicts (``part``), answered ``page`` partitions at a time through the cursor."""

    def __init__(self, topics, level=1, errors=()):
        self.topics, self.level, self.errors = topics, level, list(errors)
        self.calls: list[tuple] = []

    def describe_features(self):
        if self.errors:
            raise self.errors.pop(0)
        # as kafka-python 3.0.12 answers (seen on 4.1.1; not the shape its docstring gives)
        out = {"metadata.version": {"supported": (7, 27), "finalized": (27, 27), "finalized_epoch": 17},
               ELR_FEATURE: {"supported": (0, 1)}}
        if self.level is not None:
            out[ELR_FEATURE].update(finalized=(self.level, self.level), finalized_epoch=17)
        return out

    def describe_topic_partitions(self, topics, response_partition_limit=2000, cursor=None):
        self.calls.append((tuple(topics), response_partition_limit, cursor))
        flat = [(t, p) for t in sorted(self.topics) if not topics or t in topics for p in self.topics[t]]
        start = 0 if cursor is None else next(i for i, (t, p) in enumerate(flat)
                                              if (t, p["partition_index"]) == (cursor["topic_name"], cursor["partition_index"]))
        chunk, rest = flat[start:start + response_partition_limit], flat[start + response_partition_limit:]
        out: dict[str, list] = {}
        for t, p in chunk:
            out.setdefault(t, []).append(p)
        nxt = {"topic_name": rest[0][0], "partition_index": rest[0][1]["partition_index"]} if rest else None
        return {"topics": [{"error_code": 0, "name": t, "topic_id": None, "is_internal": False, "partitions": ps,
                            "topic_authorized_operations": -2147483648} for t, ps in out.items()], "next_cursor": nxt}

    def close(self):
        pass


def watcher(admin, **kw):
    return ElrWatcher({}, interval_s=60, timeout_s=1, cluster_name="k", admin_factory=lambda: admin, **kw)


def test_a_sweep_pages_through_every_topic_and_keeps_only_partitions_not_in_sync():
    healthy = [part(i) for i in range(5)]
    admin = DtpAdmin({"a": healthy, "b": [part(0, isr=(1,), elr=[3, 2], lk=None), part(1)]})
    w = watcher(admin, page=2)
    w.sweep()
    assert w.available is True and len(admin.calls) == 4  # 7 partitions, 2 a request
    assert [c[0] for c in admin.calls] == [()] * 4 and admin.calls[1][2] == {"topic_name": "a", "partition_index": 2}
    assert w.elr_of("b", 0, 1, [1], [1, 2, 3]) == ((2, 3), ())  # sorted
    assert w.elr_of("a", 3, 1, [1, 2, 3], [1, 2, 3]) == ((), ())  # answered in sync: no ELR
    assert w.last_sweep is not None and w.last_sweep["requests"] == 4 and w.last_sweep["partitions_listed"] == 1


def test_an_answer_for_another_isr_or_leader_is_not_used_and_a_look_follows():
    admin = DtpAdmin({"b": [part(0, isr=(1, 2)), part(1)]})
    w = watcher(admin)
    w.sweep()
    assert w.elr_of("b", 0, 1, [1, 2], [1, 2, 3]) == ((), ())
    assert w.elr_of("b", 0, 1, [1], [1, 2, 3]) is None  # the metadata saw the ISR shrink further
    assert w.elr_of("b", 1, 1, [1], [1, 2, 3]) is None  # in sync when asked, short now
    assert w.elr_of("b", 0, -1, [1, 2], [1, 2, 3]) is None  # another leader
    admin.topics["b"] = [part(0, leader=-1, isr=(), elr=None, lk=[1]), part(1, isr=(1,), elr=[2, 3])]
    w.wake({"b"})
    assert w._asked == {"b"}
    w.look({"b"})
    assert admin.calls[-1][0] == ("b",)
    assert w.elr_of("b", 0, -1, [], [1, 2, 3]) == ((), (1,))
    assert w.elr_of("b", 1, 1, [1], [1, 2, 3]) == ((2, 3), ())


def test_where_the_feature_is_off_or_the_request_unsupported_it_is_said_once_and_nothing_is_known(caplog):
    caplog.set_level(logging.WARNING, "monitor.elr")
    admin = DtpAdmin({"b": [part(0, isr=(1,), elr=[2])]}, level=None)
    w = watcher(admin)
    for _ in range(3):
        w.sweep()
    assert w.available is False and admin.calls == []  # the feature is asked first; nothing more
    assert w.elr_of("b", 0, 1, [1], [1, 2, 3]) is None
    w.wake({"b"})
    assert w._asked == set()
    admin.level = 0  # finalized at level 0: off too
    w.sweep()
    admin.level = 1  # turned on (kafka-features upgrade): the next sweep sees it
    w.sweep()
    assert w.available is True and w.elr_of("b", 0, 1, [1], [1, 2, 3]) == ((2,), ())
    said = [r.message for r in caplog.records if "eligible leader replicas not available" in r.message]
    assert len(said) == 1 and "cluster k" in said[0], said
    old = DtpAdmin({}, errors=[kerr.UnsupportedVersionError("DescribeFeatures")])
    w2 = watcher(old)
    w2.sweep()
    assert w2.available is False and w2.said_off


def test_a_failed_sweep_keeps_the_last_answer_and_a_new_client_follows():
    admin = DtpAdmin({"b": [part(0, isr=(1,), elr=[2])]})
    made = []

    def factory():
        made.append(1)
        return admin
    w = ElrWatcher({}, interval_s=60, timeout_s=1, admin_factory=factory)
    w.sweep()
    admin.errors = [kerr.ClusterAuthorizationFailedError("no")]
    w.sweep()
    assert w.failures == 1 and w.available is True and w.elr_of("b", 0, 1, [1], [1, 2, 3]) == ((2,), ())
    w.sweep()
    assert len(made) == 2


def test_timeouts_keep_the_client_which_then_avoids_the_silent_broker_until_three_in_a_row():
    admin = DtpAdmin({"b": [part(0, isr=(1,), elr=[2])]})
    made = []
    w = ElrWatcher({}, interval_s=60, timeout_s=1, admin_factory=lambda: made.append(1) or admin)
    w.sweep()
    admin.errors = [kerr.KafkaTimeoutError("paused broker")]
    w.sweep()
    w.sweep()
    assert (w.failures, len(made), w.sweeps) == (1, 1, 2)  # the same client answered next
    admin.errors = [kerr.KafkaTimeoutError("1"), kerr.KafkaTimeoutError("2"), kerr.KafkaTimeoutError("3")]
    for _ in range(3):
        w.sweep()
    w.sweep()
    assert (w.failures, len(made)) == (4, 2)  # the third in a row: a new client


class ShortIsrAdmin(FakeAdmin):
    """One topic "t" of 3 partitions on replicas 1, 2, 3: partition 0 with ``isr0`` and ``leader0``."""

    def __init__(self):
        super().__init__(topics={"t": 3}, committed={}, hw={})
        self.isr0, self.leader0 = [1, 2, 3], 1

    def list_topics(self, topic=None, timeout=None):
        md = super().list_topics(topic, timeout)
        md.brokers = {i: SimpleNamespace(id=i, host=f"b{i}", port=9092) for i in (1, 2, 3)}
        for p in md.topics["t"].partitions.values():
            p.replicas, p.isrs = [1, 2, 3], [1, 2, 3]
        p0 = md.topics["t"].partitions[0]
        p0.isrs, p0.leader = list(self.isr0), self.leader0
        return md


def test_the_probe_sends_a_partitions_elr_with_the_isr_it_was_answered_for():
    admin, dtp = ShortIsrAdmin(), DtpAdmin({"t": [part(0), part(1), part(2)]})
    em = FakeEmitter()
    p = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1), emitter=em, admin=admin)
    assert p.elr is None  # with an injected admin: set here
    p.elr = watcher(dtp)
    p.elr.sweep()
    p.refresh_metadata()
    sent = {m.partition: m for m in em.of(PartitionMetadata)}
    assert [(m.eligible_leader_replicas, m.last_known_elr) for m in sent.values()] == [([], [])] * 3
    # broker 2 and 3 fall out while the ISR is below min.insync: the metadata sees it first
    admin.isr0 = [1]
    em.events.clear()
    p.metadata.request_update("unknown_leader")
    p.refresh_metadata()
    (m,) = [m for m in em.of(PartitionMetadata) if m.partition == 0]
    assert (m.partition, m.isr, m.eligible_leader_replicas) == (0, [1], None)  # not known for this ISR
    assert p.elr._asked == {"t"}
    dtp.topics["t"][0] = part(0, isr=(1,), elr=[2, 3])
    p.elr.look(p.elr._asked)
    em.events.clear()
    p.metadata.request_update("unknown_leader")
    p.refresh_metadata()
    (m,) = [m for m in em.of(PartitionMetadata) if m.partition == 0]  # a changed ELR is a changed view: sent
    assert (m.isr, m.eligible_leader_replicas, m.last_known_elr) == ([1], [2, 3], [])
    e = Event.of(m, cluster="k", source="p", seq=0, observed_at=NOW)
    assert e.schema == "kafka-monitor/v2" and Event.from_json(e.to_json()) == e


def test_a_replica_on_an_offline_log_dir_is_sent_offline_and_the_isr_shrink_says_why():
    """Broker 1 is live (in the metadata) but its replica sits on an offline log dir: only
    DescribeTopicPartitions says so (librdkafka drops the Metadata response's offline replicas)."""
    admin, dtp = ShortIsrAdmin(), DtpAdmin({"t": [part(0), part(1), part(2)]})
    em = FakeEmitter()
    p = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1), emitter=em, admin=admin)
    p.elr = watcher(dtp)
    p.elr.sweep()
    p.refresh_metadata()
    admin.isr0 = [2, 3]  # 1 leaves the ISR: first seen before any answer says why
    em.events.clear()
    p.metadata.request_update("unknown_leader")
    p.refresh_metadata()
    (first,) = [m for m in em.of(PartitionMetadata) if m.partition == 0]
    assert first.offline_replicas == []
    dtp.topics["t"][0] = part(0, leader=1, isr=(2, 3), elr=[], offline=[1])
    p.elr.look({"t"})
    assert p.elr.offline_of("t", 0, 1, [3, 2]) == (1,) and p.elr.offline_of("t", 0, 1, [3]) == ()
    em.events.clear()
    p.metadata.request_update("unknown_leader")
    p.refresh_metadata()
    (m,) = [m for m in em.of(PartitionMetadata) if m.partition == 0]  # the same ISR, now with a cause: sent
    assert (m.isr, m.offline_replicas) == ([2, 3], [1])
    s = rp.new_partition("k", "t", 0)
    rp._replication(s, {"replicas": [1, 2, 3], "isr": [1, 2, 3], "leader": 1}, NOW, "partition|k/t/0")
    row = rows_of(Event.of(m, cluster="k", source="p", seq=0, observed_at=NOW))[0]
    (shrink, under) = rp._replication(s, row, NOW + 1, "partition|k/t/0")
    assert shrink.alert is Alert.ISR_SHRINK and shrink.labels["broker"] == 1
    assert shrink.evidence["offline_replicas"] == [1] and shrink.evidence["cause"] == rp.OFFLINE_CAUSE
    assert under.evidence["offline_replicas"] == [1]
    # without offline replicas the evidence is as before
    s = rp.new_partition("k", "t", 0)
    rp._replication(s, {"replicas": [1, 2, 3], "isr": [1, 2, 3], "leader": 1}, NOW, "partition|k/t/0")
    (shrink, _) = rp._replication(s, {"replicas": [1, 2, 3], "isr": [2, 3], "leader": 1}, NOW + 1, "partition|k/t/0")
    assert "cause" not in shrink.evidence


def test_the_first_view_of_a_shrunk_isr_waits_for_the_look_and_carries_the_cause():
    """A refresh that shows an ISR the ELR answer has not seen wakes a look and waits for it (at
    most _elr_wait_s, once per such ISR): the shrink's first view already names the offline replica
    and its ELR, so IsrShrink's evidence has the cause."""
    admin, dtp = ShortIsrAdmin(), DtpAdmin({"t": [part(0), part(1), part(2)]})
    em = FakeEmitter()
    p = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1), emitter=em, admin=admin)
    p.elr = watcher(dtp, min_gap_s=0.05).start()
    try:
        wait_for(lambda: p.elr.sweeps >= 1, timeout=10, what="the first sweep")
        p.refresh_metadata()
        admin.isr0 = [2, 3]
        dtp.topics["t"][0] = part(0, leader=1, isr=(2, 3), elr=[], offline=[1])
        em.events.clear()
        p.metadata.request_update("unknown_leader")
        t0 = time.monotonic()
        p.refresh_metadata()
        waited = time.monotonic() - t0
        (first,) = [m for m in em.of(PartitionMetadata) if m.partition == 0]
        assert (first.isr, first.offline_replicas, first.eligible_leader_replicas) == ([2, 3], [1], []), first
        assert waited < 1.0 and p.elr.looks == 1, (waited, p.elr.looks)
        # the same unknown ISR again (the look failed to see it): the next refresh does not wait again
        dtp.topics["t"][0] = part(0)  # the answer now disagrees with the metadata
        admin.isr0 = [3]
        p.metadata.request_update("unknown_leader")
        p.refresh_metadata()  # waits once for this ISR: the look sees another
        t0 = time.monotonic()
        p.metadata.request_update("unknown_leader")
        p.refresh_metadata()
        assert time.monotonic() - t0 < 0.5
    finally:
        p.elr.stop()


def rows_of(*events):
    vals = [e.to_json().decode() if isinstance(e, Event) else json.dumps(e) for e in events]
    return parse_values(pa.array(vals), timestamps=pa.array([NOW] * len(vals), pa.int64())).to_pylist()


def pm(leader, isr, elr=None, lk=None, replicas=(1, 2, 3), min_isr=2):
    return Event.of(PartitionMetadata(topic="t", partition=0, leader=leader, replicas=list(replicas), isr=list(isr),
                                      metadata_version=1, min_insync_replicas=min_isr,
                                      eligible_leader_replicas=elr, last_known_elr=lk),
                    cluster="k", source="p", seq=0, observed_at=NOW)


def test_the_parser_keeps_an_elr_only_where_it_can_matter_and_v1_still_reads():
    short, healthy, unknown = rows_of(pm(1, [1], [3, 2]), pm(1, [1, 2, 3], [], []), pm(-1, []))
    assert all(r["reason"] is None for r in (short, healthy, unknown))
    assert json.loads(short["report"]) == {"eligible_leader_replicas": [2, 3], "last_known_elr": []}
    assert healthy["report"] is None and unknown["report"] is None
    v1 = pm(1, [1]).to_dict()
    v1["schema"] = "kafka-monitor/v1"
    del v1["data"]["eligible_leader_replicas"], v1["data"]["last_known_elr"]
    (row,) = rows_of(v1)
    assert row["reason"] is None and row["report"] is None and row["isr"] == [1]


def fold(steps):
    s, out = rp.new_partition("k", "t", 0), []
    for t, ev in steps:
        (row,) = rows_of(ev)
        for tr in rp.on_partition_metadata(s, row, t, "partition|k/t/0"):
            out.append((t, tr.alert.value, tr.action, tr))
    return s, out


def test_no_leader_no_isr_and_no_eligible_leader_is_critical_until_one_returns():
    s, out = fold([(0, pm(1, [1, 2, 3], [], [])), (1000, pm(1, [1], [2, 3], [])),
                   (2000, pm(-1, [], [2, 3], [1])),  # offline, but two replicas may still lead: recoverable
                   (3000, pm(-1, [], [], [1, 2, 3])),  # nothing eligible: the dangerous case
                   (4000, pm(-1, [])),  # not known for this view: nothing changes
                   (5000, pm(2, [2], [], []))])  # the last-known leader came back
    got = [(t, a, act) for t, a, act, _ in out if a in ("PartitionNoEligibleLeader", "OfflinePartition", "UnderMinIsr")]
    assert got == [(1000, "UnderMinIsr", "open"), (2000, "OfflinePartition", "open"),
                   (3000, "PartitionNoEligibleLeader", "open"),
                   (5000, "OfflinePartition", "resolve"), (5000, "PartitionNoEligibleLeader", "resolve")], got
    opened = next(tr for t, a, act, tr in out if a == "PartitionNoEligibleLeader" and act == "open")
    assert opened.severity.name == "CRITICAL"
    assert opened.evidence["last_known_elr"] == [1, 2, 3] and opened.evidence["isr"] == []
    under = next(tr for t, a, act, tr in out if a == "UnderMinIsr")
    assert under.evidence["eligible_leader_replicas"] == [2, 3] and under.evidence["recoverable_without_data_loss"]
    offline = next(tr for t, a, act, tr in out if a == "OfflinePartition")
    assert offline.evidence["eligible_leader_replicas"] == [2, 3]
    assert s["elr"] == {"eligible_leader_replicas": [], "last_known_elr": []}
    _, out2 = fold([(0, pm(1, [1, 2, 3])), (1000, pm(-1, [], [2], [])), (2000, pm(-1, [], [], [1])),
                    (3000, pm(-1, [], [3], []))])  # an ELR member again: recoverable, resolved
    assert [(t, a, act) for t, a, act, _ in out2 if a == "PartitionNoEligibleLeader"] == [
        (2000, "PartitionNoEligibleLeader", "open"), (3000, "PartitionNoEligibleLeader", "resolve")]


def test_without_elr_an_offline_partition_is_only_offline():
    _, out = fold([(0, pm(1, [1, 2, 3])), (1000, pm(-1, []))])
    assert {a for _, a, _, _ in out} >= {"OfflinePartition"} and "PartitionNoEligibleLeader" not in {a for _, a, _, _ in out}
    s, _ = fold([(0, pm(1, [1], [2], [])), (1000, pm(1, [1, 2, 3], [], []))])
    assert "elr" not in s  # a full ISR: nothing to serve


def test_the_exporter_serves_the_elr_while_known_and_removes_it_after():
    ex = Exporter()
    row = {"kind": "partition", "action": "upsert", "cluster": "k", "topic": "t", "partition": 0, "leader": 1,
           "replicas": 3, "isr": 1, "high_watermark": 5, "log_start_offset": 0, "last_stable_offset": None,
           "report": json.dumps({"eligible_leader_replicas": [2, 3], "last_known_elr": []})}
    # as the sink hands them over: partition upserts as one block's columns (sink_rows)
    ex.apply(sink_rows(pa.Table.from_pandas(_frame([_row(**row)]), preserve_index=False)))
    text = ex.render().decode()
    assert 'kafka_monitor_partition_eligible_leader_replicas{cluster="k",partition="0",topic="t"} 2.0' in text
    assert 'kafka_monitor_partition_last_known_elr{cluster="k",partition="0",topic="t"} 0.0' in text
    ex.apply(sink_rows(pa.Table.from_pandas(_frame([_row(**{**row, "isr": 3, "report": None})]), preserve_index=False)))
    assert "kafka_monitor_partition_eligible_leader_replicas{" not in ex.render().decode()
    assert Alert.PARTITION_NO_ELIGIBLE_LEADER.value == "PartitionNoEligibleLeader"
