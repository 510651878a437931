"""The event archive (issue 34, part 1): the state function packs what it received, the sink writes
it to Parquet partitioned by cluster and hour, a batch written again replaces its own files, and
the retention deletes the hours past it (``streaming.sinks.archive``; docs/archive.md)."""

from __future__ import annotations

import json
import threading
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kafka_monitor import cli
from kafka_monitor.config import ConfigError, build, read_file
from streaming.job import JobConfig
from streaming.sinks import archive as ar
from streaming.sinks import batch
from streaming.sinks.archive import ArchiveFiles
from streaming.state import function as st
from streaming.state import rows as st_rows
from tests.support.state_fakes import FakeState, pmd, poff, rows

H = 3_600_000
T0 = 1_764_450_000_000  # 2025-11-29T21:00Z
QID = "0f0e0d0c-0000-4000-8000-000000000001"


def archived(*dicts) -> pa.Table:
    """Rows as the state function would pack them."""
    packed = st_rows.pack_archive([rows(*dicts)], 0)
    assert packed is not None
    return st_rows.unpack_archive(packed["block"])


def seqs(t: pa.Table) -> list[tuple]:
    return sorted(zip(t.column("cluster").to_pylist(), t.column("seq").to_pylist(), t.column("batch_id").to_pylist()))


def on(cluster: str, d: dict) -> dict:
    return {**d, "cluster": cluster}


# --- the pure parts ---------------------------------------------------------------------------

def test_hours_label_and_parse_back():
    h = T0 // H
    assert ar.hour_label(h) == "2025-11-29T21"
    assert ar.parse_hour("2025-11-29T21") == h
    assert ar.parse_hour("2025-11-29") is None and ar.parse_hour("x") is None
    assert ar.hour_label(0) == "1970-01-01T00"


def test_a_partition_is_one_path_segment_per_key_whatever_the_cluster_is_called():
    assert ar.partition_dir("prod-eu", 0) == "cluster=prod-eu/hour=1970-01-01T00"
    assert ar.partition_dir("a/b=c d%", 0) == "cluster=a%2Fb%3Dc%20d%25/hour=1970-01-01T00"
    assert ar.partition_dir(None, 0) == "cluster=__HIVE_DEFAULT_PARTITION__/hour=1970-01-01T00"
    assert ar.unquote_cluster("cluster=a%2Fb%3Dc%20d%25") == "a/b=c d%"
    assert ar.file_name(42, QID) == f"batch-000000000042-{QID}.parquet"


def test_rows_split_by_cluster_and_hour_of_event_time_keep_their_order():
    t = archived(poff(1, T0 + 5, 10), on("j", poff(2, T0 + H, 11)), poff(3, T0 + H - 1, 12), poff(4, T0 + H + 2, 13),
                 poff(5, T0 + 1, 14))
    parts = ar.split_partitions(t)
    assert [(d, p.column("seq").to_pylist()) for d, p in parts] == [
        ("cluster=j/hour=2025-11-29T22", [2]),
        ("cluster=k/hour=2025-11-29T21", [1, 3, 5]),
        ("cluster=k/hour=2025-11-29T22", [4]),
    ]
    assert ar.split_partitions(st_rows.ARCHIVE_SCHEMA.empty_table()) == []


def test_retention_deletes_the_hours_that_ended_more_than_its_hours_ago():
    now = T0 / 1000 + 1800  # 21:30
    dirs = [(f"p{h}", ar.hour_label(T0 // H - h)) for h in range(0, 6)] + [("x", "not-an-hour")]
    # 3 hours: 18:xx ended at 19:00, 2.5 hours ago: kept; 17:xx and 16:xx ended 3.5 and 4.5 hours ago
    assert ar.expired(dirs, now, 3) == ["p5", "p4"]
    assert ar.expired(dirs, T0 / 1000, 3) == ["p5", "p4"]  # at 21:00 sharp 17:xx ended 3 hours ago: gone
    assert ar.expired(dirs, T0 / 1000 - 1, 3) == ["p5"]
    assert ar.expired(dirs, now, 0) == []  # kept for ever
    assert ar.expired(dirs, now, 1000) == []


def test_the_state_function_archives_what_a_bucket_received_and_nothing_when_off():
    df = rows(pmd(1, T0, [1, 2, 3]), poff(2, T0 + 1, 100), poff(3, T0 + 2, 110, part=1))
    on_fn = st.make_state_function(st.StateConfig(run_id="r", archive=True))
    out = pd.concat(list(on_fn((0,), iter([df]), FakeState())), ignore_index=True)
    blocks = out[out.kind == "archive_block"]
    assert len(blocks) == 1 and int(blocks["count"].iloc[0]) == 3
    t = st_rows.unpack_archive(blocks["block"].iloc[0])
    assert t.schema == st_rows.ARCHIVE_SCHEMA
    assert "reason" not in t.column_names
    got = t.to_pylist()
    assert [(r["bucket"], r["bucket_row"]) for r in got] == [(0, 0), (0, 1), (0, 2)]  # the key and the order given
    assert [(r["type"], r["seq"], r["observed_at"], r["high_watermark"]) for r in got] == [
        ("partition_metadata", 1, T0, None), ("partition_offsets", 2, T0 + 1, 100), ("partition_offsets", 3, T0 + 2, 110)]
    assert got[0]["isr"] == [1, 2, 3] and got[0]["entity"] == "partition|k/t/0"
    off_fn = st.make_state_function(st.StateConfig(run_id="r"))
    assert "archive_block" not in set(pd.concat(list(off_fn((0,), iter([df]), FakeState()))).kind)


def test_a_timeout_emits_its_moment_for_the_archive_and_nothing_when_off():
    """A bucket woken by its timeout has no rows: the moment it was evaluated at (the processing
    time) is what a replay needs, as an ``archive_ticks`` row."""
    fn = st.make_state_function(st.StateConfig(run_id="r", archive=True))
    s = FakeState()
    list(fn((3,), iter([rows(pmd(1, T0, [1, 2, 3]))]), s))
    s.hasTimedOut, s.processing_time_ms = True, T0 + 30_000
    out = pd.concat(list(fn((3,), iter([]), s)), ignore_index=True)
    ticks = out[out.kind == "archive_ticks"]
    assert len(ticks) == 1 and "archive_block" not in set(out.kind)
    assert st_rows.unpack_archive(ticks["block"].iloc[0]).to_pylist() == [{"bucket": 3, "at": T0 + 30_000}]
    assert st_rows.unpack_archive(ticks["block"].iloc[0]).schema == st_rows.TICKS_SCHEMA
    off = st.make_state_function(st.StateConfig(run_id="r"))
    assert "archive_ticks" not in set(pd.concat(list(off((3,), iter([]), s))).kind)


def test_a_batchs_ticks_land_in_their_hidden_subtree_once_and_expire_with_the_events(tmp_path):
    now = [T0 / 1000 + 5.5 * 3600]  # 02:30: 21:xx ended 4.5 hours ago, 22:xx 3.5
    a = ArchiveFiles(str(tmp_path), retention_h=4, query_id=QID, clock=lambda: now[0])
    ticks = pa.table({"bucket": [1, 2], "at": [T0 + 10, T0 + H + 10]}, schema=st_rows.TICKS_SCHEMA)
    done = a.write(3, st_rows.ARCHIVE_SCHEMA.empty_table(), ticks)  # a batch of timeouts only
    name = ar.file_name(3, QID)
    assert done.files == 2 and done.rows == 0
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.parquet")) == [
        f"_ticks/hour=2025-11-29T21/{name}", f"_ticks/hour=2025-11-29T22/{name}"]
    assert ar.read_archive(str(tmp_path)).num_rows == 0  # not taken for events
    assert json.loads((tmp_path / "_batches" / f"{QID}.json").read_text())["files"] == [
        f"_ticks/hour=2025-11-29T21/{name}", f"_ticks/hour=2025-11-29T22/{name}"]
    # written again after a crash with one tick fewer: the other is the earlier attempt's, deleted
    again = ArchiveFiles(str(tmp_path), retention_h=4, query_id=QID, clock=lambda: now[0])
    assert again.write(3, st_rows.ARCHIVE_SCHEMA.empty_table(), ticks.slice(0, 1)).stale_removed == 1
    assert ar.parse_file_name(name) == (3, QID) and ar.parse_file_name("x.parquet") is None
    assert a.expire() == 1
    assert not (tmp_path / "_ticks" / "hour=2025-11-29T21").exists()
    assert (tmp_path / "_ticks" / "hour=2025-11-29T22").exists()


def test_spark_like_frames_pack_too():
    """Spark hands the function nullable longs as float64 with NaN and arrays as numpy arrays."""
    import numpy as np
    df = rows(pmd(1, T0, [1, 2]), poff(2, T0 + 1, 100))
    df["high_watermark"] = df["high_watermark"].astype("float64")
    df["isr"] = [np.array(v, dtype=np.int64) if isinstance(v, list) else None for v in df["isr"]]
    t = st_rows.unpack_archive(st_rows.pack_archive([df], 5)["block"])
    assert t.column("high_watermark").to_pylist() == [None, 100]
    assert t.column("isr").to_pylist() == [[1, 2], None]


# --- the files ------------------------------------------------------------------------------

def test_a_batch_lands_partitioned_and_reads_back_equal(tmp_path):
    a = ArchiveFiles(str(tmp_path / "arch"), query_id=QID)
    t = archived(poff(1, T0, 10), on("j", poff(2, T0 + H, 11)), poff(3, T0 + 5, 12))
    done = a.write(7, t)
    assert (done.rows, done.files) == (3, 2) and done.bytes > 0 and done.seconds >= 0
    name = ar.file_name(7, QID)
    assert sorted(str(p.relative_to(tmp_path / "arch")) for p in (tmp_path / "arch").rglob("*.parquet")) == [
        f"cluster=j/hour=2025-11-29T22/{name}", f"cluster=k/hour=2025-11-29T21/{name}"]
    back = ar.read_archive(str(tmp_path / "arch"))
    assert seqs(back) == [("j", 2, 7), ("k", 1, 7), ("k", 3, 7)]
    assert sorted(set(back.column("hour").to_pylist())) == ["2025-11-29T21", "2025-11-29T22"]
    one = pq.read_table(tmp_path / "arch" / f"cluster=k/hour=2025-11-29T21/{name}")  # a file alone is whole
    assert one.column("cluster").to_pylist() == ["k", "k"] and one.column("batch_id").to_pylist() == [7, 7]
    assert not list((tmp_path / "arch").rglob("*.tmp"))
    assert ar._temporary("/a/b/f.parquet") == "/a/b/.f.parquet.tmp"
    assert (a.rows, a.files) == (3, 2)


def test_an_empty_batch_writes_nothing(tmp_path):
    a = ArchiveFiles(str(tmp_path), query_id=QID)
    assert a.write(0, st_rows.ARCHIVE_SCHEMA.empty_table()).files == 0
    assert not list(tmp_path.rglob("*.parquet")) and not (tmp_path / "_batches").exists()


def test_a_batch_written_again_replaces_its_files_and_its_earlier_attempts_others_go(tmp_path):
    d = str(tmp_path)
    first = ArchiveFiles(d, query_id=QID)
    first.write(4, archived(poff(1, T0, 10)))
    first.write(5, archived(poff(2, T0, 11), on("j", poff(3, T0, 12)), poff(4, T0 + H, 13)))  # not committed: a crash
    # the next process runs batch 5 again; record 3 was deleted by retention meanwhile, 4 is read again
    again = ArchiveFiles(d, query_id=QID)
    left = tmp_path / "cluster=k" / "hour=2025-11-29T22" / f".{ar.file_name(5, QID)}.tmp"
    left.write_bytes(b"a write cut short")  # hidden: readers skip it; rewritten and renamed again
    done = again.write(5, archived(poff(2, T0, 11), poff(4, T0 + H, 13)))
    assert done.stale_removed == 1 and not left.exists()
    listed = json.loads((tmp_path / "_batches" / f"{QID}.json").read_text())["files"]
    assert f"cluster=j/hour=2025-11-29T21/{ar.file_name(5, QID)}" in listed  # until a later batch: for a crash now
    again.write(6, archived(poff(5, T0 + H, 14)))
    assert seqs(ar.read_archive(d)) == [("k", 1, 4), ("k", 2, 5), ("k", 4, 5), ("k", 5, 6)]
    assert not (tmp_path / "cluster=j" / "hour=2025-11-29T21").exists() or \
        not list((tmp_path / "cluster=j").rglob("*.parquet"))


def test_a_batch_written_again_with_no_rows_left_removes_its_earlier_attempts_files(tmp_path):
    ArchiveFiles(str(tmp_path), query_id=QID).write(3, archived(poff(1, T0, 10)))
    assert ArchiveFiles(str(tmp_path), query_id=QID).write(3, st_rows.ARCHIVE_SCHEMA.empty_table()).stale_removed == 1
    assert ar.read_archive(str(tmp_path)).num_rows == 0


def test_a_new_checkpoint_does_not_overwrite_the_old_ones_batches(tmp_path):
    ArchiveFiles(str(tmp_path), query_id=QID).write(0, archived(poff(1, T0, 10)))
    ArchiveFiles(str(tmp_path), query_id="another").write(0, archived(poff(2, T0, 11)))
    assert seqs(ar.read_archive(str(tmp_path))) == [("k", 1, 0), ("k", 2, 0)]


def test_a_write_waits_for_the_query_id(tmp_path):
    a = ArchiveFiles(str(tmp_path))
    with pytest.raises(RuntimeError, match="query's id never came"):
        a.write(0, archived(poff(1, T0, 10)), timeout_s=0.05)
    threading.Timer(0.1, lambda: setattr(a, "query_id", QID)).start()
    assert a.write(0, archived(poff(1, T0, 10)), timeout_s=10).files == 1


def test_retention_deletes_old_hours_in_a_thread_and_counts_them(tmp_path):
    now = [T0 / 1000 + 10 * 3600]  # 07:00 the next day
    a = ArchiveFiles(str(tmp_path), retention_h=4, query_id=QID, clock=lambda: now[0])
    for h in range(0, 12):  # 21:00 .. 08:00
        a.write(h, archived(poff(h, T0 + h * H, h), on("j", poff(h, T0 + h * H, h))))
    (tmp_path / "cluster=k" / "not-ours").mkdir()
    assert a.maybe_expire() is True
    a.join()
    assert a.maybe_expire() is False  # not due again for expire_every_s
    assert a.removed == 2 * 6  # 21:xx .. 02:xx (both clusters) ended at 03:00 or before: 4 hours ago or more
    assert sorted({p.name for p in tmp_path.glob("cluster=k/*")}) == [
        "hour=2025-11-30T03", "hour=2025-11-30T04", "hour=2025-11-30T05", "hour=2025-11-30T06", "hour=2025-11-30T07",
        "hour=2025-11-30T08", "not-ours"]
    assert ArchiveFiles(str(tmp_path), retention_h=0, query_id=QID).maybe_expire() is False


def test_a_retention_below_zero_is_refused(tmp_path):
    with pytest.raises(ValueError, match=">= 0 hours"):
        ArchiveFiles(str(tmp_path), retention_h=-1)


def test_uris(tmp_path):
    fs, root = ar.filesystem(str(tmp_path))
    assert fs.type_name == "local" and root == str(tmp_path)
    fs, root = ar.filesystem(f"file://{tmp_path}/x")
    assert fs.type_name == "local" and root == f"{tmp_path}/x"


# --- the sink and the settings -------------------------------------------------------------------

class FakeExporter:
    def __init__(self):
        self.applied: list[dict] = []
        self.archive: list[tuple] = []

    def apply(self, rows, batch_id=None):
        self.applied += rows
        return len(rows)

    def batch_done(self, n, duration_s, finished_at):
        pass

    def set_archive(self, rows, files, bytes_written, duration_s, removed=0):
        self.archive.append((rows, files, bytes_written > 0, removed))


class Batch:
    def __init__(self, rows):
        self.rows = rows

    def toArrow(self):
        return self.rows


def test_the_sink_archives_the_blocks_and_the_exporter_never_sees_them(tmp_path, monkeypatch):
    monkeypatch.setattr(batch, "sink_rows", lambda rows: rows)
    e = FakeExporter()
    sink = batch.ExporterSink(e, archive=ArchiveFiles(str(tmp_path), retention_h=0, query_id=QID))  # T0: 2025
    b1 = st_rows.pack_archive([rows(poff(1, T0, 10), poff(2, T0, 11))], 0)
    b2 = st_rows.pack_archive([rows(poff(3, T0 + H, 12))], 1)
    tick = st_rows.pack_ticks(2, T0 + 30_000)
    sink(Batch([b1, {"kind": "alert"}, b2, tick]), 0)
    sink(Batch([{"kind": "alert"}]), 1)
    assert [r["kind"] for r in e.applied] == ["alert", "alert"]
    assert e.archive == [(3, 3, True, 0), (0, 0, False, 0)]
    assert seqs(ar.read_archive(str(tmp_path))) == [("k", 1, 0), ("k", 2, 0), ("k", 3, 0)]
    assert pq.read_table(tmp_path / "_ticks").to_pylist() == [
        {"bucket": 2, "at": T0 + 30_000, "batch_id": 0, "hour": "2025-11-29T21"}]


BASE = {"bootstrap_servers": "b:1", "checkpoint_dir": "/c"}


def test_the_archive_is_off_by_default_and_set_like_the_other_settings(tmp_path):
    cfg = build(JobConfig, "job", env={}, flags=BASE)
    assert (cfg.archive_dir, cfg.archive_retention_h) == (None, 168)
    f = tmp_path / "km.toml"
    f.write_text('[job]\narchive_dir = "/a"\narchive_retention_h = 24\n')
    cfg = build(JobConfig, "job", file_data=read_file(str(f)), env={"KAFKA_MONITOR_JOB_ARCHIVE_RETENTION_H": "48"},
                flags=BASE)
    assert (cfg.archive_dir, cfg.archive_retention_h) == ("/a", 48)
    cfg = build(JobConfig, "job", env={}, flags={**BASE, "archive_dir": ""})
    assert cfg.archive_dir is None
    with pytest.raises(ConfigError, match="job.archive_retention_h: must be >= 0"):
        build(JobConfig, "job", env={"KAFKA_MONITOR_JOB_ARCHIVE_RETENTION_H": "-1"}, flags=BASE)


def test_the_flags_and_the_docs(capsys):
    args = cli._parser().parse_args(["job", "--archive-dir", "s3://b/a", "--archive-retention", "24"])
    assert (args.archive_dir, args.archive_retention_h) == ("s3://b/a", 24)
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["job", "--help"])
    out = capsys.readouterr().out
    assert "--archive-dir" in out and "--archive-retention" in out
    import pathlib
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs"
    settings = (docs / "settings.md").read_text()
    assert "| `archive_dir` | `--archive-dir` |" in settings
    assert "| `archive_retention_h` | `--archive-retention` | 168 |" in settings
    assert (docs / "archive.md").is_file()


def test_timing_is_cheap_for_a_batch_of_partitions(tmp_path):
    """Not a benchmark: a guard that a 10,000-row batch is written in well under a trigger."""
    t = archived(*[poff(i, T0 + i, i, part=i) for i in range(10_000)])
    a = ArchiveFiles(str(tmp_path), query_id=QID)
    t0 = time.monotonic()
    a.write(0, t)
    assert time.monotonic() - t0 < 5.0


def test_the_exporter_counts_the_archive():
    from streaming.sinks.exporter import Exporter

    e = Exporter()
    v = lambda name: e.registry.get_sample_value("kafka_monitor_" + name)  # noqa: E731
    assert (v("archive_rows_written_total"), v("archive_partitions_removed_total")) == (0, 0)  # served from the start
    e.set_archive(100, 2, 4096, 0.25)
    e.set_archive(50, 1, 1024, 0.125, partitions_removed=3)
    assert (v("archive_rows_written_total"), v("archive_files_written_total"), v("archive_bytes_written_total"),
            v("archive_last_write_duration_seconds"), v("archive_partitions_removed_total")) == (150, 3, 5120, 0.125, 3)


def test_a_crash_while_an_earlier_attempts_files_are_deleted_leaves_them_listed_for_the_next(tmp_path):
    d = str(tmp_path)
    ArchiveFiles(d, query_id=QID).write(5, archived(poff(1, T0, 10), on("j", poff(2, T0, 11))))
    second = ArchiveFiles(d, query_id=QID)

    def crash(path):
        raise RuntimeError("killed")
    real = second.fs

    class Crashing:
        def __getattr__(self, name):
            return crash if name == "delete_file" else getattr(real, name)
    second.fs = Crashing()
    with pytest.raises(RuntimeError, match="killed"):
        second.write(5, archived(poff(1, T0, 10)))
    assert ArchiveFiles(d, query_id=QID).write(5, archived(poff(1, T0, 10))).stale_removed == 1
    assert seqs(ar.read_archive(d)) == [("k", 1, 5)]
