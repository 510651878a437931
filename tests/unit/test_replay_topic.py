"""kafka-monitor replay --source events-topic: the approximate replay from the events topic
(``streaming/replay/topic.py``).  Its batches are cut by the records' timestamps and its buckets
woken by timeouts the engine fires itself, as Spark would."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pytest

from kafka_monitor import cli
from kafka_monitor.replay import command
from monitor.contract import Event, GroupOffsets, Heartbeat, PartitionOffsets
from streaming.job import ENTITY_OF_TYPE, JobConfig, state_config
from streaming.replay import topic as tp
from streaming.replay.engine import ReplayBatch, run
from streaming.sinks.archive import ArchiveFiles
from streaming.state import function as st
from streaming.state import rows as st_rows
from tests.support.archive_job import MIN, T0, Job, cut, scenario, spark_frame

END = T0 + 41 * MIN


def test_the_engine_fires_timeouts_where_spark_does(tmp_path):
    """Given the job's own batches and buckets but no recorded moments, the engine wakes each
    bucket by its timeout at the first batch whose processing time passes it, as Spark does: the
    job's records come out, batch for batch (cluster j's source is woken while j is silent)."""
    batches = cut(scenario(), T0, END, trigger_ms=30_000)
    job = Job(st.StateConfig(run_id="job", archive=True), ArchiveFiles(str(tmp_path), query_id="q", retention_h=0))
    for now, by in batches:
        job.batch(now, by)
    assert job.ticks > 0

    def replayed():
        for i, (now, by) in enumerate(batches):
            parts = [st_rows.unpack_archive(st_rows.pack_archive([spark_frame(rows, b)], b)["block"])
                     for b, rows in sorted(by.items()) if rows]
            yield ReplayBatch("q", i, pa.concat_tables(parts) if parts else st_rows.ARCHIVE_SCHEMA.empty_table(),
                              None, now)

    res = run(replayed(), len(batches), state_config(JobConfig("-", "-"), run_id="replay"))
    assert [{k: v for k, v in r.items() if k != "query_id"} for r in res.transitions] == job.alerts.records()
    assert res.ticks == job.ticks and res.ticks_skipped == 0


def ev(data, seq: int, t: int, cluster: str = "k") -> bytes:
    return Event.of(data, cluster=cluster, source="p", seq=seq, observed_at=t).to_json()


def lag_records(minutes: int = 30, lagging: tuple = (10, 16)) -> list[tuple[int, bytes]]:
    """A probe's records every 10 s (published 1 s after observing): a partition's offsets, a
    group's committed offset on it (20,000 behind between ``lagging`` minutes), a heartbeat."""
    out = []
    for i in range(minutes * 6):
        t = T0 + i * 10_000
        hw = 1_000_000 + 500 * i
        lag = 20_000 if lagging[0] * MIN <= i * 10_000 < lagging[1] * MIN else 10
        out += [(t + 1000, ev(PartitionOffsets(topic="t", partition=0, high_watermark=hw, log_start_offset=0,
                                               via="list_offsets", metadata_at=t), 3 * i, t)),
                (t + 1000, ev(GroupOffsets(group="g", topic="t", partition=0, committed_offset=hw - lag,
                                           high_watermark=hw, hw_observed_at=t), 3 * i + 1, t)),
                (t + 1000, ev(Heartbeat(interval_ms=10_000, events_sent=i, events_dropped=0), 3 * i + 2, t))]
    return out


def test_records_are_cut_into_the_batches_a_job_would_have_run():
    c = lag_records(1)[:12]  # cycles at 1 s, 11 s, 21 s and 31 s, 3 records each
    recs = c[:9] + [(T0 + 25_000, b"not an event")] + c[9:] + [(T0 + 4_000, c[0][1])]  # the last one read late
    got = list(tp.window_batches(recs, T0, T0 + 60_000, 15_000, 4, ENTITY_OF_TYPE, chunk=3))
    assert [(b.batch_id, b.processing_time_ms, b.events.num_rows) for b in got] == [
        (0, T0 + 15_000, 6), (1, T0 + 30_000, 3), (2, T0 + 45_000, 4), (3, T0 + 60_000, 0)]
    assert all(b.ticks is None and b.query_id == tp.TOPIC_QUERY for b in got)
    one = got[2].events  # a record older than its window (T0 + 4 s, read late) goes into it; the bad one nowhere
    assert sorted(one.column("seq").to_pylist()) == [0, 9, 10, 11]
    for b in set(one.column("bucket").to_pylist()):  # each bucket's rows numbered in the order they came
        sub = one.filter(pa.compute.equal(one.column("bucket"), b))
        assert sub.column("bucket_row").to_pylist() == list(range(sub.num_rows))
    assert one.schema == st_rows.ARCHIVE_SCHEMA
    assert tp.windows(T0, T0 + 60_001, 15_000) == 5 and tp.windows(T0, T0, 15_000) == 1


def run_cli(argv, records, first_ms=None, published=()):
    out, err = io.StringIO(), io.StringIO()

    def read_records(kafka, topic, start_ms, end_ms):
        assert kafka["bootstrap.servers"] == "b:9" and topic == "kafka-monitor.events"
        return iter([r for r in records if start_ms <= r[0] <= end_ms]), first_ms

    rc = command.run(cli._parser().parse_args(command.relative_times(["replay", *argv])), stdout=out, stderr=err,
                     read_published=lambda kafka, topic, since_ms: list(published), now_s=T0 / 1000 + 3600,
                     read_records=read_records)
    return rc, out.getvalue(), err.getvalue()


def test_a_replay_from_the_events_topic_says_it_is_approximate(tmp_path):
    recs = lag_records()
    rc, out, err = run_cli(["--source", "events-topic", "--from", "2025-11-29T21:05Z", "--to", "2025-11-29T21:30Z",
                            "--bootstrap-servers", "b:9", "--out", str(tmp_path / "r.json"),
                            "--html", str(tmp_path / "r.html"), "--no-progress"], recs, first_ms=T0 + 1000)
    assert rc == 0, err
    assert "APPROXIMATE" in out and "note: replaying from the events topic" in err
    assert "note: the warm-up is not covered for cluster (all)" in err  # the topic starts at T0, the warm-up before
    rep = json.loads((tmp_path / "r.json").read_text())
    assert (rep["source"], rep["exact"]) == ("events-topic", False)
    assert rep["replay"]["batches"] == (30 - 5 + 120) * 60 // 5  # 5 s batches from the warm-up (2 h) to --to
    lag = rep["differences"]["ConsumerLagHigh"]["added"]  # the job's side was empty here
    assert [((e["start"] - T0) / MIN, (e["end"] - T0) / MIN) for e in lag] == [(11.0, 16.0)]
    assert "Approximate:" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("records, first_ms, message", [
    ([], None, "the events topic 'kafka-monitor.events' has no records between"),
    (lag_records(1), T0 + 2 * 3600_000, "keeps records from 2025-11-29T23:00:00.000Z only, after the range"),
])
def test_a_topic_without_the_range_is_refused(tmp_path, records, first_ms, message):
    rc, out, err = run_cli(["--source", "events-topic", "--from", "2025-11-29T21:00Z", "--to", "2025-11-29T21:30Z",
                            "--bootstrap-servers", "b:9", "--no-compare", "--out", str(tmp_path / "r.json")],
                           records, first_ms)
    assert rc == 2 and message in err and not (tmp_path / "r.json").exists()


def test_the_topic_needs_its_cluster():
    rc, out, err = run_cli(["--source", "events-topic", "--from", "-1h", "--no-compare"], [])
    assert rc == 2 and "--bootstrap-servers: required to read the events topic" in err
