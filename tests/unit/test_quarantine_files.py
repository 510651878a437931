"""The quarantine directory is bounded (issue 31): ``streaming.sinks.quarantine.QuarantineFiles`` deletes the
oldest batches' files past ``job.quarantine_max_mb``, never the newest, and keeps a running total
that a restarted job rebuilds from the files on disk."""

from __future__ import annotations

import json
import logging
import os

import pytest

from kafka_monitor import cli
from kafka_monitor.config import ConfigError, build, read_file
from streaming import job
from streaming.job import JobConfig
from streaming.sinks import batch
from streaming.sinks.quarantine import QuarantineFiles


def rows(n: int = 1, chars: int = 200) -> list[dict]:
    """``n`` refused events as the state emits them (quarantine_event rows), each ``chars`` long."""
    return [{"kind": "quarantine_event", "alert": "malformed_json", "at": 1_700_000_000_000, "evidence": "x" * chars,
             "count": chars} for _ in range(n)]


def size_of(n: int = 1, chars: int = 200, batch_id: int = 0) -> int:
    """Bytes of the file ``rows(n, chars)`` makes for a batch of ``batch_id``'s number of digits."""
    line = json.dumps({"batch_id": batch_id, "reason": "malformed_json", "observed_at": 1_700_000_000_000,
                       "raw": "x" * chars, "raw_bytes": chars}, ensure_ascii=False) + "\n"
    return n * len(line.encode())


def on_disk(d) -> dict[int, int]:
    """batch id -> bytes of the quarantine files in ``d``."""
    return {int(p.name[6:-6]): p.stat().st_size for p in d.iterdir() if p.name.endswith(".jsonl")}


def test_the_bound_holds_and_the_oldest_go_first(tmp_path):
    d = tmp_path / "q"
    one = size_of()
    q = QuarantineFiles(str(d), max_bytes=3 * one + one // 2)  # room for 3 files
    for b in range(10):
        path = q.write(b, rows())
        assert os.path.basename(path) == f"batch-{b:012d}.jsonl"
        assert q.bytes <= q.max_bytes
        assert q.files == list(range(max(0, b - 2), b + 1))  # the newest three, oldest first
        assert on_disk(d) == dict.fromkeys(q.files, one)   # the total is the disk's
        assert q.bytes == sum(on_disk(d).values())
        assert q.removed == max(0, b - 2)
    # a bigger batch makes room for itself from the oldest, as many as it takes
    q.write(10, rows(2))
    assert q.files == [9, 10] and q.removed == 9 and q.bytes == one + size_of(2, batch_id=10)


def test_a_restart_picks_up_the_files_on_disk(tmp_path):
    d = tmp_path / "q"
    one = size_of()
    q = QuarantineFiles(str(d), max_bytes=5 * one)
    for b in range(4):
        q.write(b, rows())
    (d / "notes.txt").write_text("not ours")  # left alone, not counted
    (d / "batch-000000000004.jsonl.tmp").write_text("a write a crash cut short")

    again = QuarantineFiles(str(d), max_bytes=5 * one)
    assert (again.files, again.bytes, again.removed) == ([0, 1, 2, 3], 4 * one, 0)
    assert not (d / "batch-000000000004.jsonl.tmp").exists()
    assert (d / "notes.txt").exists()
    again.write(4, rows())
    again.write(5, rows())  # over the bound: the previous run's oldest goes
    assert again.files == [1, 2, 3, 4, 5] and again.removed == 1
    assert sorted(on_disk(d)) == [1, 2, 3, 4, 5]

    # a lower bound applies at the start, to the files already there
    smaller = QuarantineFiles(str(d), max_bytes=2 * one)
    assert (smaller.files, smaller.bytes, smaller.removed) == ([4, 5], 2 * one, 3)
    assert sorted(on_disk(d)) == [4, 5]


def test_on_disk_the_oldest_is_the_earliest_written_not_the_lowest_batch_id(tmp_path):
    """A new checkpoint with the same quarantine directory starts its batch ids at 0 again."""
    d = tmp_path / "q"
    one = size_of()
    old = QuarantineFiles(str(d), max_bytes=10 * one)
    for b in (500, 501):
        old.write(b, rows())
    new = QuarantineFiles(str(d), max_bytes=10 * one)
    new.write(0, rows())
    for b, t in ((500, 1_000), (501, 2_000), (0, 3_000)):
        os.utime(d / f"batch-{b:012d}.jsonl", (t, t))
    restarted = QuarantineFiles(str(d), max_bytes=2 * size_of(batch_id=500))  # room for two
    assert restarted.files == [501, 0] and restarted.removed == 1


def test_a_file_alone_larger_than_the_bound_is_kept_and_reported(tmp_path, caplog):
    d = tmp_path / "q"
    one = size_of()
    q = QuarantineFiles(str(d), max_bytes=3 * one)
    q.write(0, rows())
    q.write(1, rows())
    with caplog.at_level(logging.WARNING, logger="streaming.job"):
        q.write(2, rows(5))  # 5 files' worth: the others go, it stays
    assert q.files == [2] and q.removed == 2
    assert q.bytes == 5 * one > q.max_bytes
    assert on_disk(d) == {2: 5 * one}
    assert "the file of batch 2 alone is" in caplog.text and "kept, as the newest" in caplog.text
    q.write(3, rows())  # the next batch's file replaces it
    assert q.files == [3] and q.bytes == one and q.removed == 3
    # and a restart keeps such a file too (it is the newest there)
    q.write(4, rows(5))
    assert QuarantineFiles(str(d), max_bytes=one).files == [4]


def test_a_replayed_batch_is_counted_once(tmp_path):
    d = tmp_path / "q"
    one = size_of()
    q = QuarantineFiles(str(d), max_bytes=10 * one)
    q.write(0, rows())
    q.write(1, rows())
    q.write(1, rows())  # the same batch again (a restart replays its last batch)
    assert q.files == [0, 1] and q.bytes == 2 * one and q.removed == 0
    q.write(1, rows(3))  # rewritten whole: its new size replaces the old
    assert q.bytes == 4 * one == sum(on_disk(d).values())
    q.write(0, rows())  # a replayed batch is the newest: the bound deletes 1 first
    assert q.files == [1, 0]
    q.max_bytes = 2 * one
    q.write(0, rows())
    assert q.files == [0] and q.bytes == one and q.removed == 1


def test_a_file_deleted_by_someone_else_leaves_the_total(tmp_path):
    d = tmp_path / "q"
    one = size_of()
    q = QuarantineFiles(str(d), max_bytes=2 * one)
    q.write(0, rows())
    q.write(1, rows())
    os.remove(d / "batch-000000000000.jsonl")
    q.write(2, rows())
    assert q.files == [1, 2] and q.bytes == 2 * one
    assert q.removed == 0  # the bound deleted nothing


def test_no_directory_yet_and_a_bound_of_zero(tmp_path):
    q = QuarantineFiles(str(tmp_path / "not" / "yet"), max_bytes=1)
    assert (q.files, q.bytes, q.removed) == ([], 0, 0)
    q.write(7, rows())
    assert q.files == [7]
    with pytest.raises(ValueError, match="must be > 0"):
        QuarantineFiles(str(tmp_path), max_bytes=0)


class FakeExporter:
    def __init__(self):
        self.quarantine: list[tuple[int, int]] = []

    def apply(self, rows, batch_id=None):
        return len(rows)

    def batch_done(self, n, duration_s, finished_at):
        pass

    def set_quarantine(self, bytes_kept: int, files_removed: int) -> None:
        self.quarantine.append((bytes_kept, files_removed))


class Batch:
    def __init__(self, rows):
        self.rows = rows

    def toArrow(self):
        return self.rows


def test_the_sink_writes_and_reports_bytes_kept_and_files_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(batch, "sink_rows", lambda rows: rows)
    d = tmp_path / "q"
    one = size_of()
    QuarantineFiles(str(d), max_bytes=10 * one).write(0, rows())  # a previous run's file
    e = FakeExporter()
    sink = batch.ExporterSink(e, None, QuarantineFiles(str(d), max_bytes=2 * one))
    assert e.quarantine == [(one, 0)]  # at the start: what the restarted job found
    sink(Batch(rows()), 1)
    sink(Batch([{"kind": "alert"}]), 2)  # no refused event: no file, nothing to report
    sink(Batch(rows()), 3)
    sink(Batch(rows(2)), 4)
    assert e.quarantine == [(one, 0), (2 * one, 0), (2 * one, 1), (2 * one, 2)]  # removed: deltas
    assert sorted(on_disk(d)) == [4]


def test_the_sink_runs_without_a_quarantine_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(batch, "sink_rows", lambda rows: rows)
    e = FakeExporter()
    batch.ExporterSink(e)(Batch(rows()), 0)
    assert e.quarantine == [] and not any(tmp_path.iterdir())


BASE = {"bootstrap_servers": "b:1", "checkpoint_dir": "/c"}


def test_the_setting_defaults_to_256_and_layers(tmp_path):
    assert build(JobConfig, "job", env={}, flags=BASE).quarantine_max_mb == 256
    f = tmp_path / "km.toml"
    f.write_text("[job]\nquarantine_max_mb = 64\n")
    assert build(JobConfig, "job", file_data=read_file(str(f)), env={}, flags=BASE).quarantine_max_mb == 64
    cfg = build(JobConfig, "job", file_data=read_file(str(f)), env={"KAFKA_MONITOR_JOB_QUARANTINE_MAX_MB": "32"},
                flags=BASE)
    assert cfg.quarantine_max_mb == 32  # env beats file
    cfg = build(JobConfig, "job", env={"KAFKA_MONITOR_JOB_QUARANTINE_MAX_MB": "32"},
                flags={**BASE, "quarantine_max_mb": 16})
    assert cfg.quarantine_max_mb == 16  # flag beats env


@pytest.mark.parametrize("toml, env, message", [
    ("quarantine_max_mb = 0", {}, "job.quarantine_max_mb: must be > 0 (MiB of quarantine files kept; past it the "
                                  "oldest are deleted), got 0"),
    ("quarantine_max_mb = -5", {}, "job.quarantine_max_mb: must be > 0"),
    ("quarantine_max_mb = 1.5", {}, "job.quarantine_max_mb: must be an integer, got 1.5"),
    ("quarantine_max_mb = '256MB'", {}, "job.quarantine_max_mb: must be an integer, got '256MB'"),
    ("", {"KAFKA_MONITOR_JOB_QUARANTINE_MAX_MB": "0"}, "job.quarantine_max_mb: must be > 0"),
    ("", {"KAFKA_MONITOR_JOB_QUARANTINE_MAX_MB": "lots"}, "job.quarantine_max_mb: must be an integer, got 'lots'"),
])
def test_a_bad_setting_names_itself_and_what_to_give(tmp_path, toml, env, message):
    f = tmp_path / "km.toml"
    f.write_text(f"[job]\n{toml}\n")
    with pytest.raises(ConfigError) as e:
        build(JobConfig, "job", file_data=read_file(str(f)), env=env, flags=BASE)
    assert message in str(e.value)


def test_the_flag_reaches_the_config(monkeypatch):
    import signal

    seen = {}
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's handlers
    monkeypatch.setattr(job, "run", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    assert cli.main(["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c", "--quarantine-max-mb", "64"]) == 0
    assert seen["cfg"].quarantine_max_mb == 64


@pytest.mark.parametrize("value, message", [
    ("0", "error: job.quarantine_max_mb: must be > 0"),
    ("-1", "error: job.quarantine_max_mb: must be > 0"),
    ("1.5", "argument --quarantine-max-mb: invalid int value: '1.5'"),
])
def test_a_bad_flag_exits_2_with_the_setting_named(monkeypatch, capsys, value, message):
    monkeypatch.setattr(job, "run", lambda cfg, **kw: pytest.fail("must not run"))
    try:
        code = cli.main(["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c", "--quarantine-max-mb", value])
    except SystemExit as e:  # argparse
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_help_explains_the_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["job", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--quarantine-max-mb" in out and "oldest batches' files are deleted" in out
