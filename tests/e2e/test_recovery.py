"""Recovery: SIGKILL the job (driver, JVM and Python workers) in the middle of a stream and
start it again on the same checkpoint — no event is lost and no alert transition is published
twice, counted on the alerts topic.

The scenario is built so its transitions are known exactly: partitions whose ISR alternates
between all replicas and one replica short (replicas [1, 2, 3], leader 1 = preferred, no
min.insync.replicas, every partition observed every cycle), so each shrink opens IsrShrink and
UnderReplicated and each recovery resolves both — and nothing else fires."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer

from kafka_monitor.local.broker import create_topics, free_port
from monitor.contract import Event, PartitionMetadata
from tests.conftest import unique, wait_for
from tests.support.alerts_topic import kill_group, read_alerts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # over 20 s (docs/tests.md)

PARTITIONS = 40
CYCLES = 12  # full, short, full, short, ... -> 6 shrinks and 5 recoveries per partition (last is short)


def scenario(t0: int) -> list[Event]:
    evs = []
    seq = 0
    for c in range(CYCLES):
        for p in range(PARTITIONS):
            isr = [1, 2, 3] if c % 2 == 0 else [1, 3]
            evs.append(Event.of(PartitionMetadata(topic="orders", partition=p, leader=1, replicas=[1, 2, 3], isr=isr,
                                                  metadata_version=c + 1),
                                cluster="rec", source="probe-rec", seq=seq, observed_at=t0 + c * 1000))
            seq += 1
    return evs


def expected_transitions() -> int:
    shrinks = CYCLES // 2           # cycles 1, 3, ..., 11
    recoveries = (CYCLES - 1) // 2  # cycles 2, 4, ..., 10
    return PARTITIONS * 2 * (shrinks + recoveries)


def start_job(bootstrap, events, alerts, ckpt, log):
    return subprocess.Popen(
        [sys.executable, "-m", "kafka_monitor.cli", "job", "--bootstrap-servers", bootstrap, "--checkpoint", ckpt,
         "--events-topic", events, "--alerts-topic", alerts, "--trigger", "1", "--max-offsets-per-trigger", "60",
         "--buckets", "4", "--metrics-port", str(free_port())],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # its own group: JVM and workers with it


def test_sigkill_mid_stream_loses_nothing_and_publishes_nothing_twice(tansu, tmp_path):
    events, alerts = unique("events"), unique("alerts")
    create_topics(tansu.bootstrap, {events: 2, alerts: 2})
    p = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 20})
    for e in scenario(int(time.time() * 1000) - CYCLES * 1000):
        p.produce(events, key=e.key().encode(), value=e.to_json())
    p.flush(30)
    for part in range(2):  # Tansu: a single-record last batch makes ListOffsets "latest" exact
        p.produce(events, key=b"pad", value=b'{"schema": "kafka-monitor/v1", "type": "padding"}', partition=part)
        p.flush(10)
    expected = expected_transitions()
    ckpt = str(tmp_path / "ckpt")
    log = open(tmp_path / "job.log", "wb")
    job = start_job(tansu.bootstrap, events, alerts, ckpt, log)
    try:
        # let it publish part of the transitions (60 records per batch: many batches), then kill it
        wait_for(lambda: job.poll() is None and len(read_alerts(tansu.bootstrap, alerts)) >= expected // 4,
                 timeout=180, interval=1, what="the job to publish a quarter of the transitions")
        kill_group(job)
        before = len(read_alerts(tansu.bootstrap, alerts))
        assert before < expected, "the job finished before it was killed: the test proves nothing"

        log.write(b"\n===== started again =====\n")
        log.flush()
        job = start_job(tansu.bootstrap, events, alerts, ckpt, log)
        recs = wait_for(lambda: (lambda r: r if len(r) >= expected else None)(read_alerts(tansu.bootstrap, alerts)),
                        timeout=240, interval=2, what=f"{expected} transitions on the alerts topic")
        time.sleep(3)  # a duplicate published late would show now
        recs = read_alerts(tansu.bootstrap, alerts)
        # SIGTERM to the whole group, as systemd's default KillMode sends it: the JVM stops Spark
        # in its shutdown hook while the job stops; a clean exit all the same
        kill_group(job, signal.SIGTERM)
    finally:
        if job.poll() is None:
            kill_group(job, signal.SIGTERM)
        log.close()
    # (py4j may log its lost connection on the way out: its threads see the JVM go first)
    after = (tmp_path / "job.log").read_text(errors="replace").split("===== started again =====")[-1]
    assert job.returncode == 0 and "\nerror:" not in after, after[-3000:]
    keys = [(r["alert_id"], r["action"]) for r in recs]
    assert len(keys) == len(set(keys)), "an alert transition was published twice"
    assert len(recs) == expected
    assert {r["alert"] for r in recs} == {"IsrShrink", "UnderReplicated"}
    seqs = [r["sequence"] for r in recs]
    assert len(set(seqs)) == len(seqs)
    per_partition = {}
    for r in recs:
        per_partition.setdefault(r["labels"]["partition"], []).append(r["action"])
    assert len(per_partition) == PARTITIONS
    # the quarantine got the padding records (unknown type), counted and not fatal
    assert any(f.endswith(".jsonl") for f in os.listdir(os.path.join(ckpt, "quarantine")))
