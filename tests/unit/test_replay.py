"""kafka-monitor replay (issue 34, part 2): the job's state function run again over the event
archive.  An archive is made by driving the state function and the job's own sink the way Spark
does (tests/support/archive_job.py), over two queries (a new checkpoint between them), with
buckets woken by their timeouts; the replay must then make exactly the transitions the job
published, record for record."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from kafka_monitor import cli
from kafka_monitor.replay import command
from streaming.job import JobConfig, state_config
from streaming.replay.engine import FRAME_COLUMNS, replay, state_frame
from streaming.replay.group_state import GroupStateError, ReplayGroupState
from streaming.replay.source import ArchiveReader, ArchivedFile, Batch, bucket_frames, coverage, order_batches
from streaming.sinks.archive import HOUR_MS, ArchiveFiles
from streaming.state import function as st
from streaming.state import rows as st_rows
from tests.support.archive_job import MIN, SILENT, T0, Job, run_batches, scenario
from tests.support.state_fakes import pmd, poff, rows

FIRST, SECOND = "zz-first-query", "aa-second-query"  # their names sort against their order
NEW_CHECKPOINT = T0 + 25 * MIN
END = T0 + 41 * MIN


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Two queries of the job over one archive: the first until minute 25 (stopped for 90 s at
    minute 23: its next batch reads the backlog), then a new checkpoint (empty state, batch ids
    from 0).  Returns (archive dir, every record the job published, the jobs)."""
    d = str(tmp_path_factory.mktemp("replay") / "archive")
    events = scenario()
    cfg = st.StateConfig(run_id="job-run", archive=True)
    first = Job(cfg, ArchiveFiles(d, query_id=FIRST, retention_h=0))
    run_batches(first, events, T0, NEW_CHECKPOINT, trigger_ms=30_000, down=(T0 + 23 * MIN, T0 + 24.5 * MIN))
    second = Job(cfg, ArchiveFiles(d, query_id=SECOND, retention_h=0))
    run_batches(second, [e for e in events if e[0] >= NEW_CHECKPOINT], NEW_CHECKPOINT, END, trigger_ms=30_000)
    return d, first.alerts.records() + second.alerts.records(), (first, second)


def without_query(records):
    return [{k: v for k, v in r.items() if k != "query_id"} for r in records]


# --- the GroupState stand-in -----------------------------------------------------------------

def test_the_stand_in_keeps_what_spark_documents_for_processing_time_timeouts():
    s = ReplayGroupState()
    s.begin()
    assert not s.exists and s.getOption is None and not s.hasTimedOut
    with pytest.raises(GroupStateError, match="STATE_NOT_EXISTS"):
        assert s.get
    with pytest.raises(GroupStateError, match="CANNOT_BE_NONE"):
        s.update(None)
    for bad in (0, -5, 1.5, "30000", True):
        with pytest.raises(GroupStateError):
            s.setTimeoutDuration(bad)
    with pytest.raises(GroupStateError, match="not recorded"):
        s.getCurrentProcessingTimeMs()  # a call with rows: the archive does not have it
    with pytest.raises(GroupStateError):
        s.getCurrentWatermarkMs()
    with pytest.raises(GroupStateError):
        s.setTimeoutTimestamp(1)
    s.setTimeoutDuration(30_000)
    s.end()
    assert not s.armed  # a timeout without state: the key has nothing to time out
    with pytest.raises(GroupStateError, match="cannot time out"):
        s.begin(timed_out=True, processing_time_ms=5)

    s.begin()
    s.update((b"v",))
    s.setTimeoutDuration(30_000)
    s.end()
    assert s.armed and s.get == (b"v",) and s.timeout_ms == 30_000
    s.begin()  # the next call must set it again
    assert s.timeout_ms is None
    s.end()
    assert not s.armed and s.exists  # state kept, no timeout

    s.begin()
    s.setTimeoutDuration(10)
    s.end()
    s.begin(timed_out=True, processing_time_ms=1234)
    assert s.hasTimedOut and s.getCurrentProcessingTimeMs() == 1234
    s.remove()
    s.setTimeoutDuration(10)
    s.end()
    assert not s.exists and not s.armed  # a removed state takes its timeout with it
    with pytest.raises(GroupStateError, match="processing time"):
        ReplayGroupState((b"v",)).begin(timed_out=True)


def _spark_state(value, now, timed_out):
    """pyspark's own GroupState as Spark builds it for one call (no JVM needed)."""
    from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
    from pyspark.sql.types import BinaryType, Row, StructField, StructType

    return GroupState(optionalValue=None if value is None else Row(*value), batchProcessingTimeMs=now,
                      eventTimeWatermarkMs=-1, timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
                      hasTimedOut=timed_out, watermarkPresent=False, defined=value is not None, updated=False,
                      removed=False, timeoutTimestamp=-1, keyAsUnsafe=b"",
                      valueSchema=StructType([StructField("entities", BinaryType())]))


def test_the_state_function_does_the_same_with_the_stand_in_as_with_pysparks_group_state():
    fn = st.make_state_function(st.StateConfig(run_id="r", entity_ttl_ms=60_000))
    calls = [(1000, rows(pmd(1, 1000, [1, 2, 3]), poff(2, 1000, 10))), (2000, rows(pmd(3, 2000, [1, 2]))),
             (40_000, None), (50_000, rows(poff(4, 50_000, 20))), (200_000, None)]  # the last one evicts everything
    spark_value, stand_in = None, ReplayGroupState()
    for now, df in calls:
        timed_out = df is None
        sp = _spark_state(spark_value, now, timed_out)
        frames = [] if timed_out else [df]
        a = pd.concat(list(fn((7,), iter(frames), sp)), ignore_index=True)
        stand_in.begin(timed_out=timed_out, processing_time_ms=now if timed_out else None)
        b = pd.concat(list(fn((7,), iter(frames), stand_in)), ignore_index=True)
        stand_in.end()
        spark_value = sp.getOption
        assert a.drop(columns="block").equals(b.drop(columns="block"))
        assert stand_in.value == spark_value
        assert stand_in.armed == (spark_value is not None and sp._timeout_timestamp != -1)
    assert stand_in.value is None and not stand_in.armed


# --- reading the archive back ---------------------------------------------------------------------

def test_a_bucket_gets_its_rows_back_in_the_order_it_received_them():
    t = st_rows.unpack_archive(st_rows.pack_archive([rows(poff(3, 30, 1), poff(1, 10, 2)),
                                                     rows(poff(2, 10, 3))], 4)["block"])
    other = st_rows.unpack_archive(st_rows.pack_archive([rows(poff(9, 5, 4))], 1)["block"])
    shuffled = pa.concat_tables([t.slice(2), other, t.slice(0, 2)])  # as files of several hours come back
    got = [(b, r.column("seq").to_pylist()) for b, r in bucket_frames(shuffled)]
    assert got == [(1, [9]), (4, [3, 1, 2])]
    frame = state_frame(t)
    assert list(frame.columns) == FRAME_COLUMNS and frame["reason"].isna().all()
    assert frame["high_watermark"].dtype == "int64" and list(frame["bucket"]) == [4, 4, 4]
    assert frame["leader"].dtype == "float64"  # nullable longs as Spark hands them: NaN for null


def test_batches_come_in_the_order_the_job_ran_them():
    f = lambda q, b, at: ArchivedFile(f"{q}-{b}", q, b, at // HOUR_MS, "k")  # noqa: E731
    first = {"q-late": 5_000, "q-early": 1_000}
    batches = [Batch("q-late", 1, [f("q-late", 1, 6_000)]), Batch("q-early", 3, [f("q-early", 3, 3_000)]),
               Batch("q-late", 0, [f("q-late", 0, 5_000)]), Batch("q-early", 2, [f("q-early", 2, 1_000)])]
    moments = {fl.path: at for b in batches for fl in b.files for at in [first.get(b.query_id, 0) + b.batch_id]}
    got = order_batches(batches, lambda fl: moments[fl.path])
    assert [(b.query_id, b.batch_id) for b in got] == [("q-early", 2), ("q-early", 3), ("q-late", 0), ("q-late", 1)]


# --- the replay -------------------------------------------------------------------------------------

def test_replaying_with_the_jobs_config_reproduces_every_published_record(made):
    d, published, (first, second) = made
    reader = ArchiveReader(d)
    batches = reader.batches(T0, END)
    res = replay(reader, batches, state_config(JobConfig("-", "-"), run_id="replay"))
    assert without_query(res.transitions) == published  # alert ids, times, evidence, batch ids and indexes
    assert {r["alert"] for r in published} >= {"ConsumerLagHigh", "IsrShrink", "SourceSilent", "PartitionUnobserved"}
    assert [q["query_id"] for q in res.queries] == [FIRST, SECOND]
    assert res.ticks == first.ticks + second.ticks > 0 and res.ticks_skipped == 0
    assert res.rows == sum(1 for _ in scenario())


def test_without_the_timeouts_moments_the_replay_would_differ(made, tmp_path):
    """Not a tautology: a bucket woken by its timeout (cluster j's silent source) raises its alert
    in that batch; without the recorded moments the replay raises it only with the next rows."""
    d, published, _ = made
    copy = tmp_path / "archive"
    shutil.copytree(d, copy, ignore=shutil.ignore_patterns("_ticks"))
    reader = ArchiveReader(str(copy))
    res = replay(reader, reader.batches(T0, END), state_config(JobConfig("-", "-"), run_id="replay"))
    silent = lambda recs: [(r["action"], r["batch_id"]) for r in recs if r["alert"] == "SourceSilent"]  # noqa: E731
    assert silent(without_query(res.transitions)) != silent(published)
    assert [r["at"] for r in published if r["alert"] == "SourceSilent"][0] < T0 + SILENT[1] * MIN


def run_cli(argv, published, now_s=T0 / 1000 + 3600):
    out, err = io.StringIO(), io.StringIO()
    calls = []

    def reader(kafka, topic, since_ms):
        calls.append((kafka, topic, since_ms))
        if isinstance(published, Exception):
            raise published
        return published

    rc = command.run(cli._parser().parse_args(command.relative_times(["replay", *argv])), stdout=out, stderr=err,
                     read_published=reader,
                     now_s=now_s)
    return rc, out.getvalue(), err.getvalue(), calls


def test_the_command_with_the_jobs_config_says_identical(made, tmp_path):
    d, published, _ = made
    rc, out, err, calls = run_cli(["--archive", d, "--from", "2025-11-29T21:05:00Z", "--to", "2025-11-29T21:41Z",
                                   "--warmup", "5m", "--bootstrap-servers", "b:9", "-X", "security.protocol=SSL",
                                   "--out", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"),
                                   "--no-progress"], published)
    assert rc == 0, err
    assert "identical: the replay raises exactly the episodes the job published" in out
    assert calls == [({"bootstrap.servers": "b:9", "security.protocol": "SSL"}, "kafka-monitor.alerts",
                      T0 - command.ALERTS_SLACK_MS)]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["identical"] is True and rep["coverage"]["complete"] is True
    assert rep["summary"]["IsrShrink"] == {"same": 1, "added": 0, "removed": 0, "shifted": 0}
    assert without_query(rep["transitions"]) == [r for r in published if r["at"] >= T0]
    page = (tmp_path / "r.html").read_text()
    assert "Identical" in page and "<svg" not in page and "http" not in page.lower().replace("http-equiv", "")


def test_a_changed_threshold_shows_what_it_would_have_paged_and_missed(made, tmp_path):
    d, published, _ = made
    toml = tmp_path / "job.toml"
    toml.write_text('[job]\nbootstrap_servers = "b:9"\ncheckpoint_dir = "/c"\n'
                    '[job.rules.lag]\nlag_high_offsets = 13000\nlag_high_for_ms = 30000\n')
    rc, out, err, _ = run_cli(["--archive", d, "--from", "2025-11-29T21:00:00Z", "--to", "2025-11-29T21:41Z",
                               "--config", str(toml), "--rule", "lag.lag_high_offsets=9000", "--rows", "1",
                               "--out", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")], published)
    assert rc == 0, err
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["rules_changed"] == {"lag.lag_high_offsets": 9000, "lag.lag_high_for_ms": 30000}
    lag = rep["differences"]["ConsumerLagHigh"]
    # the 12,000-offset episode (26-30) and the 15,000 one (20-21.5) open 30 s sooner (for 30 s, not 60)
    assert sorted((s["start_shift_s"], s["end_shift_s"]) for s in lag["shifted"]) == [(-30.0, 0.0)] * 3
    assert lag["added"] == [] and lag["removed"] == []
    assert rep["summary"]["IsrShrink"]["same"] == 1 and "IsrShrink" not in rep["differences"]
    assert "... 2 more (the JSON file has them all)" in out and "~ ConsumerLagHigh" in out
    page = (tmp_path / "r.html").read_text()
    assert page.count("<svg") == 1 and "ConsumerLagHigh · cluster k topic t partition 0 group g" in page

    rc, out, err, _ = run_cli(["--archive", d, "--from", "2025-11-29T21:00:00Z", "--to", "2025-11-29T21:41Z",
                               "--rule", "lag.lag_high_offsets=5000", "--rule", "lag.lag_high_seconds=none",
                               "--bootstrap-servers", "b:9", "--out", str(tmp_path / "r2.json"), "--html", ""],
                              published)
    lag = json.loads((tmp_path / "r2.json").read_text())["differences"]["ConsumerLagHigh"]
    assert [(e["start"] - T0) / MIN for e in lag["added"]] == [13.0]  # the 8,000-offset lag (12-15) pages now
    assert lag["removed"] == [] and not (tmp_path / "r2.html").exists()

    rc, out, err, _ = run_cli(["--archive", d, "--from", "2025-11-29T21:00:00Z", "--to", "2025-11-29T21:41Z",
                               "--rule", "lag.lag_high_offsets=16000", "--bootstrap-servers", "b:9",
                               "--out", str(tmp_path / "r3.json"), "--html", ""], published)
    lag = json.loads((tmp_path / "r3.json").read_text())["differences"]["ConsumerLagHigh"]
    assert sorted((e["start"] - T0) / MIN for e in lag["removed"]) == [21.0, 27.0]  # 15,000 and 12,000: missed


# --- coverage, and what the command refuses -----------------------------------------------------------

H0 = T0 // HOUR_MS


def test_coverage_names_what_the_archive_does_not_cover():
    hours = {"k": [H0, H0 + 1, H0 + 3], "j": [H0 + 1]}
    start, end = T0 + 30 * MIN, T0 + 5 * HOUR_MS
    got = [(s.cluster, (s.start_ms - T0) / MIN, (s.end_ms - T0) / MIN, s.why.split(",")[0].split(" (")[0])
           for s in coverage(hours, start, end, ["k", "j", "x"], first_ms={"k": T0 + 40 * MIN})]
    assert got == [
        ("k", 30, 40, "before the cluster's first archived event"),
        ("k", 120, 180, "hours missing from the archive"),
        ("k", 240, 300, "after the cluster's last archived hour"),
        ("j", 30, 60, "before the cluster's first archived event"),
        ("j", 120, 300, "after the cluster's last archived hour"),
        ("x", 30, 300, "nothing archived for this cluster")]
    assert coverage(hours, T0 + HOUR_MS, T0 + 2 * HOUR_MS - 1, ["k"]) == []


@pytest.fixture
def small(tmp_path):
    """A few batches of cluster k in the hour from T0, and one of cluster j an hour later."""
    a = ArchiveFiles(str(tmp_path / "small"), query_id="q", retention_h=0)
    for i in range(4):
        t = st_rows.unpack_archive(st_rows.pack_archive([rows(pmd(2 * i, T0 + i * MIN, [1, 2, 3]),
                                                              poff(2 * i + 1, T0 + i * MIN, 10 * i))], 1)["block"])
        a.write(i, t)
    j = st_rows.unpack_archive(st_rows.pack_archive([rows({**poff(1, T0 + 70 * MIN, 5), "cluster": "j",
                                                           "entity": "partition|j/t/0"})], 2)["block"])
    a.write(4, j)
    return str(tmp_path / "small")


def test_a_range_only_partly_archived_is_replayed_with_a_warning_naming_the_gaps(small, tmp_path):
    rc, out, err, calls = run_cli(["--archive", small, "--from", "2025-11-29T20:30Z", "--to", "2025-11-29T22:30Z",
                                   "--no-compare", "--cluster", "k", "--out", str(tmp_path / "r.json"),
                                   "--html", str(tmp_path / "r.html")], [])
    assert rc == 0 and calls == []
    assert "warning: not covered by the archive: cluster k 2025-11-29T18:30:00.000Z → 2025-11-29T21:00:00.000Z" in err
    assert "cluster k 2025-11-29T22:00:00.000Z → 2025-11-29T22:30:00.000Z: after the cluster's last archived hour" \
        in err
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["compared"] is False and rep["coverage"]["complete"] is False
    assert [u["cluster"] for u in rep["coverage"]["uncovered"]] == ["k", "k"]
    assert rep["replay"]["batches"] == 5 and rep["clusters"] == ["k"]  # j's batch replayed, not reported
    assert all(t["labels"]["cluster"] == "k" for t in rep["transitions"])
    assert "Not covered by the archive" in (tmp_path / "r.html").read_text()
    assert "warning: not covered" in out and "not compared" not in out


def test_an_alerts_topic_that_cannot_be_read_still_writes_the_replay(small, tmp_path):
    rc, out, err, _ = run_cli(["--archive", small, "--from", "2025-11-29T21:00Z", "--to", "2025-11-29T21:30Z",
                               "--cluster", "k", "--bootstrap-servers", "b:9", "--out", str(tmp_path / "r.json"),
                               "--html", str(tmp_path / "r.html")], RuntimeError("broker down"))
    assert rc == 1 and "reading the alerts topic 'kafka-monitor.alerts' on b:9: broker down" in err
    # the range starts at the archive's first event: only the warm-up before it is missing
    assert "note: the warm-up is not covered for cluster k 2025-11-29T19:00:00.000Z → 2025-11-29T21:00:00.000Z: " \
           "before the cluster's first archived event, at 2025-11-29T21:00:00.000Z" in err and "warning" not in err
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["coverage"]["complete"] is True and [u["in_range"] for u in rep["coverage"]["uncovered"]] == [False]
    assert rep["compared"] is False and "broker down" in rep["compare_error"]
    assert "not compared: reading the alerts topic" in out


@pytest.mark.parametrize("argv, message", [
    (["--from", "2025-11-29T23:00Z", "--to", "2025-11-30T01:00Z", "--no-compare"],
     "nothing archived between 2025-11-29T23:00:00.000Z and 2025-11-30T01:00:00.000Z for j, k; the archive has: "
     "cluster j: 2025-11-29T22 .. 2025-11-29T22 (1 hours); cluster k: 2025-11-29T21 .. 2025-11-29T21 (1 hours)"),
    (["--from", "-1h", "--cluster", "nope", "--no-compare"], "--cluster: nothing archived for nope; the archive has: cluster j"),
    (["--from", "2025-11-29T22:00Z", "--to", "2025-11-29T21:00Z"], "--to (2025-11-29T21:00:00.000Z) must be after"),
    (["--from", "yesterday"], "--from: 'yesterday' is not a time (now, -7d, -2h, Unix seconds"),
    (["--from", "-1h", "--warmup", "soon", "--no-compare"], "--warmup: 'soon' is not a duration"),
    (["--from", "-1h", "--rule", "lag.nope=1"], "--rule lag.nope: unknown setting"),
    (["--from", "-1h", "--rule", "lag.lag_high_offsets=many"], "--rule lag.lag_high_offsets: must be an integer"),
    (["--from", "-1h", "--rule", "lag_high_offsets=1"], "--rule: expects FAMILY.NAME=VALUE"),
    (["--from", "-1h", "--rows", "0"], "--rows: must be at least 1"),
    (["--from", "-1h"], "--bootstrap-servers: required to read the alerts topic"),
    (["--from", "-1h", "--bootstrap-servers", "b:1", "--alerts-topic", ""], "--alerts-topic: the job publishes no"),
])
def test_what_the_command_refuses_exits_2_and_writes_nothing(small, tmp_path, argv, message):
    rc, out, err, calls = run_cli(["--archive", small, "--out", str(tmp_path / "r.json"),
                                   "--html", str(tmp_path / "r.html"), *argv], [], now_s=T0 / 1000 + 2 * 3600)
    assert rc == 2 and message in err, err
    assert out == "" and calls == [] and not list(tmp_path.glob("r.*"))


def test_an_archive_that_is_not_one_is_refused(tmp_path):
    for where, message in ((tmp_path / "missing", "does not exist"), (tmp_path, "holds no archived events")):
        rc, _, err, _ = run_cli(["--archive", str(where), "--from", "-1h", "--no-compare",
                                 "--out", str(tmp_path / "r.json")], [])
        assert rc == 2 and message in err
    rc, _, err, _ = run_cli(["--from", "-1h", "--no-compare"], [])
    assert rc == 2 and "--archive: required (or job.archive_dir in --config)" in err


def test_times_read_as_an_sre_writes_them():
    now = T0 / 1000
    assert command.parse_when("-2h", "--from", now) == T0 - 2 * HOUR_MS
    assert command.parse_when("-90m", "--from", now) == T0 - 90 * MIN
    assert command.parse_when("now", "--to", now) == T0
    assert command.parse_when("2025-11-29T21:00:00Z", "--from", now) == T0
    assert command.parse_when("2025-11-29T21:00", "--from", now) == T0  # no zone: UTC
    assert command.parse_when("2025-11-29T22:00:00+01:00", "--from", now) == T0
    assert command.parse_when(str(T0 // 1000), "--from", now) == T0
    assert command.relative_times(["replay", "--from", "-7d", "--to", "-1h", "--rule", "-x", "--out", "-2h"]) == [
        "replay", "--from=-7d", "--to=-1h", "--rule", "-x", "--out", "-2h"]  # argparse would take -7d for a flag


def test_the_config_is_the_jobs_and_its_archive_dir_is_the_default(small, tmp_path):
    toml = tmp_path / "job.toml"
    toml.write_text(f'[job]\narchive_dir = "{small}"\nentity_ttl_s = 600\n[job.rules.partition]\nhw_stall_ms = 60000\n'
                    '[job.rules.notify]\n')
    cfg = command.load_config(str(toml), ["partition.unobserved_after_ms=120000"], env={})
    assert cfg.archive_dir == small and cfg.bootstrap_servers == "(not used by replay)"
    assert command.rules_changed(cfg) == {"partition.hw_stall_ms": 60000, "partition.unobserved_after_ms": 120000,
                                          "entity_ttl_s": 600.0}
    env = {"KAFKA_MONITOR_JOB_RULES_LAG_LAG_HIGH_SECONDS": "120"}  # as the job reads its environment
    assert command.rules_changed(command.load_config(None, None, env=env)) == {"lag.lag_high_seconds": 120.0}
    rc, out, err, _ = run_cli(["--config", str(toml), "--from", "2025-11-29T21:00Z", "--to", "2025-11-29T21:30Z",
                               "--no-compare", "--out", str(tmp_path / "r.json"), "--html", ""], [])
    assert rc == 0, err
    assert "rules changed from the defaults: partition.hw_stall_ms=60000, entity_ttl_s=600.0" in out


def test_progress_says_how_far_how_fast_and_how_long_is_left():
    from streaming.replay.engine import Progress

    now = [0.0]
    out = io.StringIO()
    p = command.ProgressLine(out, every_s=5, after_s=2, clock=lambda: now[0])
    p(Progress(1, 100, 1_000, 1.0))  # too soon to say anything
    now[0] = 3.0
    p(Progress(10, 100, 30_000, 3.0))
    now[0] = 4.0
    p(Progress(12, 100, 36_000, 4.0))  # within 5 s of the last line
    now[0] = 9.0
    p(Progress(100, 100, 300_000, 9.0))
    assert out.getvalue().splitlines() == [
        "replay: 10/100 batches (10%), 10,000 events/s, about 27s left",
        "replay: 100/100 batches (100%), 33,333 events/s, done in 9s"]


def test_the_subcommand_is_listed_and_explains_itself(capsys):
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["replay", "--help"])
    text = capsys.readouterr().out
    for flag in ("--archive", "--from", "--to", "--config", "--rule", "--cluster", "--warmup", "--no-compare", "--out",
                 "--html", "--bootstrap-servers", "--alerts-topic"):
        assert flag in text
    assert "evaluated at the\nrecorded moments" in text or "recorded moments" in text
    assert (Path(__file__).resolve().parents[2] / "docs" / "replay.md").is_file()


def test_a_batch_of_late_events_between_the_ranges_batches_is_replayed_and_a_lost_file_is_named(tmp_path):
    """Batch 1 holds only events of three hours before (a partition of the events topic that was
    unreadable, read late): it ran between batches 0 and 2, so it is replayed with them.  Batch 2's
    bucket 1 received rows of two hours; one hour's file deleted leaves a gap in ``bucket_row``."""
    d = str(tmp_path / "a")
    a = ArchiveFiles(d, query_id="q", retention_h=0)

    def packed(*dicts, bucket=1):
        return st_rows.unpack_archive(st_rows.pack_archive([rows(*dicts)], bucket)["block"])

    a.write(0, packed(pmd(1, T0, [1, 2, 3])))
    a.write(1, packed(poff(2, T0 - 3 * HOUR_MS, 5, part=1)))
    a.write(2, packed(poff(3, T0 - HOUR_MS - 5, 6, part=2), poff(4, T0 + 10, 7), poff(5, T0 - HOUR_MS - 4, 8, part=2)))
    reader = ArchiveReader(d)
    got = reader.batches(T0, T0 + MIN)
    assert [(b.batch_id, sorted(f.hour - H0 for f in b.files)) for b in got] == [(0, [0]), (1, [-3]), (2, [-2, 0])]
    cfg = state_config(JobConfig("-", "-"), run_id="r")
    assert replay(reader, got, cfg).incomplete == 0
    (Path(d) / "cluster=k" / "hour=2025-11-29T19").joinpath("batch-000000000002-q.parquet").unlink()
    res = replay(reader, reader.batches(T0, T0 + MIN), cfg)
    assert (res.incomplete, res.incomplete_examples) == (1, [("q", 2, 1)])


def test_the_command_line_takes_relative_times(small, tmp_path, monkeypatch, capsys):
    """``kafka-monitor replay --from -2h`` through ``cli.main``: argparse alone would take -2h for
    a flag."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(command.time, "time", lambda: T0 / 1000 + 1800)
    assert cli.main(["replay", "--archive", small, "--from", "-30m", "--to", "-1m", "--no-compare",
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "kafka-monitor replay  2025-11-29T21:00:00.000Z → 2025-11-29T21:29:00.000Z" in out
    assert (tmp_path / "replay.json").is_file() and (tmp_path / "replay.html").is_file()  # the defaults
