"""Eligible leader replicas on real clusters (issue 47): on the suite's Kafka 4.1.1 (ELR on by
default for a new cluster) a follower paused below min.insync.replicas is in the partition's ELR,
as the probe reports it and as the job's parser and partition rules take it (UnderMinIsr says the
partition is recoverable without data loss; nothing says it has no eligible leader).  The same on
4.4.0, and "not available" on 3.9.2 (no such feature), run from tests/integration/test_quorum.py
on the clusters it starts for those versions (``elr_below_min_isr``)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from kafka_monitor.local.kafka_cluster import KafkaCluster
from monitor.probe_config import ProbeConfig
from streaming.ingest.parsing import parse_values
from streaming.rules import partition as rp
from tests.conftest import unique, wait_for
from tests.support.capture import capturing_probe, of_type

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def isr_of(cluster: KafkaCluster, topic: str):
    """Partition 0's ISR, or None while no broker answers the metadata request in time (one paused)."""
    try:
        return cluster.partitions(topic)[0][2]
    except Exception:  # noqa: BLE001 - asked again
        return None


def elr_below_min_isr(cluster: KafkaCluster, expect_elr: bool) -> dict:
    """A topic on replicas 1, 2, 3 with min.insync.replicas 2, watched by a probe: with
    ``expect_elr`` broker 2 is paused (ISR at min), then broker 3 (ISR below min: 3 becomes an
    eligible leader replica), both resumed; else the probe must say the ELR is not available.
    Returns figures for the caller's report."""
    topic = unique("elr")
    cluster.create_topic(topic, config={"min.insync.replicas": 2}, replica_assignment=[[1, 2, 3]])
    cfg = ProbeConfig(bootstrap_servers=cluster.bootstrap_servers, interval_s=1, elr_interval_s=5, quorum_interval_s=0,
                      topics_include=f"^{topic}$", groups_include="^$", cluster=unique("elr"), source="probe-elr")
    probe, cap = capturing_probe(cfg)
    stop = threading.Event()
    t = threading.Thread(target=probe.run, args=(stop,), daemon=True)
    t.start()
    paused: list[int] = []
    try:
        assert probe.elr is not None
        wait_for(lambda: probe.elr.available is not None, timeout=60, what="the ELR watcher's first sweep")
        md = lambda: of_type(cap.events, "partition_metadata", topic=topic)  # noqa: E731
        wait_for(md, timeout=30, what=f"a partition_metadata of {topic}")
        if not expect_elr:
            assert probe.elr.available is False and probe.elr.said_off
            assert all(e.data.eligible_leader_replicas is None for e in md())
            return {"available": False}
        assert probe.elr.available is True, "a 4.1+ cluster formatted with ELR on"
        wait_for(lambda: md()[-1].data.eligible_leader_replicas == [], timeout=30, what="an empty ELR, ISR full")
        cluster.pause_broker(2)
        paused.append(2)
        wait_for(lambda: isr_of(cluster, topic) == [1, 3], timeout=60, interval=0.5,
                 what="ISR [1, 3] (at min.insync.replicas)")
        t0 = time.monotonic()
        cluster.pause_broker(3)
        paused.append(3)
        got = wait_for(lambda: next((e for e in reversed(md()) if e.data.eligible_leader_replicas), None),
                       timeout=90, interval=0.5, what="an ELR in the probe's partition_metadata")
        seen_s = time.monotonic() - t0
        assert got.schema == "kafka-monitor/v2"
        assert (got.data.leader, got.data.isr, got.data.eligible_leader_replicas) == (1, [1], [3]), got.data
        for b in paused:
            cluster.resume_broker(b)
        paused.clear()
        wait_for(lambda: sorted(md()[-1].data.isr) == [1, 2, 3] and md()[-1].data.eligible_leader_replicas == [],
                 timeout=120, interval=0.5, what="the ISR full again and the ELR empty")
        # the events through the job's parser and partition rules
        events = md()
        values = [e.to_json().decode() for e in events]
        rows = parse_values(pa.array(values), timestamps=pa.array([e.observed_at for e in events], pa.int64())).to_pylist()
        assert all(r["reason"] is None for r in rows), [r["reason"] for r in rows]
        s, out, kept = rp.new_partition(cfg.cluster, topic, 0), [], []
        for r in rows:
            out += rp.on_partition_metadata(s, r, r["observed_at"], f"partition|{cfg.cluster}/{topic}/0")
            kept.append((s.get("elr") or {}).get("eligible_leader_replicas"))
        assert [3] in kept, kept  # what the exporter serves as partition_eligible_leader_replicas
        under = [x for x in out if x.alert.value == "UnderMinIsr" and x.action == "open"]
        assert len(under) == 1, out
        # opened with the first view below min.insync.replicas; its ELR may come a refresh later
        assert under[0].evidence.get("eligible_leader_replicas", [3]) == [3], under[0].evidence
        assert "PartitionNoEligibleLeader" not in {x.alert.value for x in out}
        assert ("UnderMinIsr", "resolve") in {(x.alert.value, x.action) for x in out}
        assert "elr" not in s
        return {"available": True, "elr_seen_s": round(seen_s, 1), "sweeps": probe.elr.sweeps, "looks": probe.elr.looks,
                "sweep": probe.elr.last_sweep}
    finally:
        for b in paused:
            cluster.resume_broker(b)
        stop.set()
        t.join(20)
        probe.close(0)


def test_a_follower_paused_below_min_isr_is_an_eligible_leader_on_the_suites_cluster(kafka_cluster):
    if not kafka_cluster.managed:
        pytest.skip("pauses brokers: needs the suite's own cluster")
    figures = elr_below_min_isr(kafka_cluster, expect_elr=True)
    print(f"\n{kafka_cluster.version}: {figures}")
