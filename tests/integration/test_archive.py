"""The event archive through the real job (issue 34, part 1): events on a Tansu broker, the job in
the shared SparkSession with ``archive_dir`` set.  Every accepted event lands once in Parquet
partitioned by cluster and hour, read back equal to what was sent; the refused ones do not; and a
job stopped mid-stream, whose last batch is then run again (its commit removed, as a kill between
the sink and the commit leaves it), restarted on its checkpoint, leaves no duplicate and no gap."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_monitor.local.broker import create_topics
from monitor.contract import Event, PartitionOffsets
from streaming.job import JobConfig, start, stop_query
from streaming.sinks import archive as ar
from streaming.sinks.exporter import Exporter
from tests.conftest import unique, wait_for

pytestmark = pytest.mark.integration

HOUR = 3_600_000
PARTITIONS = 2  # of the events topic
CLUSTERS = ("k", "prod/eu")  # the second needs escaping in its path


def events(n: int, first_seq: int, base_ms: int) -> list[Event]:
    """``n`` partition_offsets events over both clusters and two hours of event time."""
    out = []
    for i in range(n):
        seq = first_seq + i
        cluster = CLUSTERS[seq % 2]
        at = base_ms - HOUR + seq * 7 if seq % 3 else base_ms + seq * 7  # the hour before, and this one
        out.append(Event.of(PartitionOffsets(topic="t", partition=seq % 50, high_watermark=1000 + seq, via="fetch",
                                             log_start_offset=0),
                            cluster=cluster, source="p", seq=seq, observed_at=at))
    return out


def produce(bootstrap: str, topic: str, evs: list[Event], junk: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for e in evs:
        p.produce(topic, key=e.key().encode(), value=e.to_json())
    for i in range(junk):  # refused by the gate: never archived
        p.produce(topic, key=b"junk", value=b"{not json " + str(i).encode())
    assert p.flush(30) == 0
    # Tansu lists "latest" as the base offset of the last record batch + 1: one single-record batch
    # per partition after the flush makes the listed end exact (refused too; Apache Kafka is right)
    for part in range(PARTITIONS):
        p.produce(topic, key=b"tail", value=b"{tail", partition=part)
        assert p.flush(30) == 0


def commits(ckpt: Path) -> list[int]:
    d = ckpt / "commits"
    return sorted(int(f) for f in os.listdir(d) if f.isdigit()) if d.is_dir() else []


def forget(log: Path, batch: int) -> None:
    """Remove a batch's entry of a checkpoint log (and its checksum)."""
    for f in (log / str(batch), log / f".{batch}.crc"):
        if f.exists():
            f.unlink()


def archived_ids(root: str) -> list[str]:
    try:
        return ar.read_archive(root).column("event_id").to_pylist()
    except (FileNotFoundError, OSError):  # nothing yet, or a file renamed under the listing
        return []


def test_events_land_once_partitioned_by_cluster_and_hour_across_a_restart(spark, tansu, tmp_path):
    topic, alerts = unique("arch-events"), unique("arch-alerts")
    create_topics(tansu.bootstrap, {topic: PARTITIONS, alerts: 1})
    ckpt, root = tmp_path / "ckpt", str(tmp_path / "archive")
    cfg = JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(ckpt), events_topic=topic,
                    alerts_topic=alerts, trigger_s=1, buckets=4, max_offsets_per_trigger=150,
                    max_clock_skew_s=0, archive_dir=root)
    base = (int(time.time() * 1000) // HOUR) * HOUR + 60_000  # this hour; the hour before also kept (168 h)
    first, second = events(900, 0, base), events(300, 900, base)
    produce(tansu.bootstrap, topic, first, junk=20)

    exporter = Exporter()
    q = start(spark, cfg, exporter, query_name=unique("arch-1"))
    try:  # stopped mid-stream: 922 records at 150 a batch
        wait_for(lambda: len(commits(ckpt)) >= 3, 180, what="three batches committed")
    finally:
        stop_query(q)
    done = commits(ckpt)
    seen = set(archived_ids(root))
    assert 0 < len(seen) < len(first), f"not mid-stream: {len(seen)} of {len(first)} archived"
    # run the last batch that archived rows again, as a kill between its sink and its commit leaves
    # it: its commit removed, and the batches planned after it (none with rows: a batch cut short by
    # the stop, or one Spark ran for the state's timeouts) forgotten
    last = max(ar.read_archive(root).column("batch_id").to_pylist())
    for b in sorted(int(f) for f in os.listdir(ckpt / "offsets") if f.isdigit()):
        if b > last:
            forget(ckpt / "offsets", b)
            forget(ckpt / "commits", b)
    names = [p.name for p in Path(root).rglob(f"batch-{last:012d}-*.parquet")]
    assert names, f"batch {last} wrote no file"
    forget(ckpt / "commits", last)
    print(f"\nfirst run: batches {done}, {len(seen)} events archived; batch {last} to be run again "
          f"({len(names)} files)")

    produce(tansu.bootstrap, topic, second)
    exporter2 = Exporter()
    q = start(spark, cfg, exporter2, query_name=unique("arch-2"))
    qid = str(q.id)
    try:
        expected = {e.event_id for e in first + second}
        wait_for(lambda: set(archived_ids(root)) >= expected, 240, what="every event archived")
    finally:
        stop_query(q)

    t = ar.read_archive(root)
    ids = t.column("event_id").to_pylist()
    dup = [i for i, n in Counter(ids).items() if n > 1]
    assert not dup, f"{len(dup)} events archived twice"
    assert set(ids) == expected  # none missing, no refused one
    assert last in commits(ckpt), "the batch run again did not commit"

    # read back equal to what was accepted
    sent = {e.event_id: e for e in first + second}
    for r in t.to_pylist():
        e = sent[r["event_id"]]
        assert (r["type"], r["cluster"], r["source"], r["seq"], r["observed_at"]) == \
            ("partition_offsets", e.cluster, "p", e.seq, e.observed_at)
        assert (r["topic"], r["partition"], r["high_watermark"], r["log_start_offset"]) == \
            ("t", e.data.partition, e.data.high_watermark, 0)
        assert r["entity"] == f"partition|{e.cluster}/t/{e.data.partition}"
        assert r["hour"] == ar.hour_label(e.observed_at // HOUR)
        assert r["batch_id"] >= 0

    dirs = sorted(str(p.relative_to(root)) for p in Path(root).glob("cluster=*/hour=*"))
    hours = [ar.hour_label(base // HOUR - 1), ar.hour_label(base // HOUR)]
    assert dirs == [f"cluster={c}/hour={h}" for c in ("k", "prod%2Feu") for h in hours], dirs
    assert not list(Path(root).rglob("*.tmp"))
    manifest = json.loads(next(Path(root, "_batches").glob("*.json")).read_text())
    assert manifest["query_id"] == qid

    files = exporter.registry.get_sample_value("kafka_monitor_archive_files_written_total") + \
        exporter2.registry.get_sample_value("kafka_monitor_archive_files_written_total")
    rows = exporter2.registry.get_sample_value("kafka_monitor_archive_rows_written_total")
    write_s = exporter2.registry.get_sample_value("kafka_monitor_archive_last_write_duration_seconds")
    print(f"archived {len(ids)} events in {len(list(Path(root).rglob('*.parquet')))} files ({files:.0f} written "
          f"in all, the batch run again included); second run wrote {rows:.0f} rows; last write {write_s:.3f} s")
