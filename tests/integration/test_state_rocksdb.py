"""A RocksDB checkpoint whose state an older release wrote, read by today's job (issue 30.3).

The fixtures of tests/fixtures/state/ are one bucket's stored value as each format's release
wrote it; tests/unit/test_state_format.py migrates them in memory.  Here they go through the
store itself: a first query (on the RocksDB provider) stores the fixture bytes as its bucket's
state, verbatim; the query stops; today's job starts on that checkpoint, reads the state back
from RocksDB's files, migrates it, and resolves the episodes the old release had opened, under
the ids it gave them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_monitor.local.broker import create_topics
from monitor.contract import Event, PartitionMetadata
from streaming.job import STATE_STORES, JobConfig, start, stop_query
from streaming.sinks.exporter import Exporter
from streaming.state import function as st
from streaming.state import codec
from tests.conftest import unique, wait_for
from tests.support.alerts_topic import read_alerts

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "state"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"


def send(bootstrap: str, topic: str, seq: int, isr: list[int], at: int) -> None:
    e = Event.of(PartitionMetadata(topic="t", partition=0, leader=1, replicas=[1, 2, 3], isr=isr, metadata_version=seq),
                 cluster="k", source="p", seq=seq, observed_at=at)
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, key=e.key().encode(), value=e.to_json())
    assert p.flush(10) == 0


def committed(ckpt: Path) -> int:
    d = ckpt / "commits"
    return len([f for f in os.listdir(d) if f.isdigit()]) if d.is_dir() else 0


def planting(old: bytes):
    """A state function that stores ``old`` as its bucket's state and outputs nothing: the
    older release's write, through the store under test."""
    def plant(key, pdfs, state):
        for _ in pdfs:
            pass
        if int(key[0]) != st.QUARANTINE_BUCKET and not state.exists:
            state.update((old,))
        return iter(())
    return lambda cfg, **kw: plant


@pytest.mark.parametrize("fmt", [2, 5])
def test_a_rocksdb_state_in_an_older_format_is_read_and_migrated_by_todays_job(fmt, spark, tansu, tmp_path, monkeypatch):
    old = (FIXTURES / f"format{fmt}-bucket.pickle").read_bytes()
    assert codec.decode_state(old)["format"] == fmt < codec._FORMAT
    opened = codec.stored_entities(old)["partition|k/t/0"]["open"]
    ids = {name: a["id"] for name, a in opened.items()}
    assert sorted(ids) == ["IsrShrink", "UnderReplicated"]

    events, alerts = unique("rdb-events"), unique("rdb-alerts")
    create_topics(tansu.bootstrap, {events: 1, alerts: 1})
    ckpt = tmp_path / "ckpt"
    cfg = JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(ckpt), events_topic=events,
                    alerts_topic=alerts, trigger_s=1, buckets=1, state_store="rocksdb")
    before = spark.conf.get(PROVIDER)
    spark.conf.set(PROVIDER, STATE_STORES["rocksdb"])  # the shared session's store is HDFS
    try:
        now = int(time.time() * 1000)
        # the older release: its state for partition k/t/0 (ISR [1, 3], two episodes open)
        send(tansu.bootstrap, events, 1, [1, 3], now)
        with monkeypatch.context() as m:
            m.setattr(st, "make_state_function", planting(old))
            q = start(spark, cfg, Exporter(), query_name=unique("rdb-old"))
        try:
            wait_for(lambda: committed(ckpt) >= 1, 120, what="the older release's batch committed")
        finally:
            stop_query(q)
        offsets = (ckpt / "offsets" / "0").read_text()
        assert STATE_STORES["rocksdb"] in offsets, "the checkpoint must be RocksDB's"
        stored = list((ckpt / "state").rglob("*"))
        assert any(p.suffix in (".zip", ".changelog") for p in stored), sorted(map(str, stored))

        # today's job on the same checkpoint: the ISR comes back, so the episodes resolve
        send(tansu.bootstrap, events, 2, [1, 3], now + 10_000)
        q = start(spark, cfg, Exporter(), query_name=unique("rdb-new"))
        try:
            wait_for(lambda: committed(ckpt) >= 2, 120, what="today's first batch")
            send(tansu.bootstrap, events, 3, [1, 2, 3], now + 20_000)
            resolved = lambda: [r for r in read_alerts(tansu.bootstrap, alerts)  # noqa: E731
                                if r["action"] == "resolve" and r["alert"] in ids]
            wait_for(lambda: len(resolved()) == 2, 120, what="IsrShrink and UnderReplicated resolved")
        finally:
            stop_query(q)
    finally:
        spark.conf.set(PROVIDER, before)
    got = read_alerts(tansu.bootstrap, alerts)
    print(f"\nformat {fmt} via RocksDB: {json.dumps([(r['alert'], r['action']) for r in got])}")
    assert {r["alert"]: r["alert_id"] for r in resolved()} == ids  # the old release's episodes
    assert not [r for r in got if r["alert"] in ids and r["action"] != "resolve"], "re-opened, not continued"
