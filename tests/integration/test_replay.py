"""kafka-monitor replay through the real job (issue 34, part 2): the job runs in the shared
SparkSession on a Tansu broker with ``archive_dir`` set, over scripted contract events that make
alert transitions of several kinds (an ISR shrink and its expansion: IsrShrink, UnderReplicated;
two consumer-lag episodes: ConsumerLagHigh; then a source and a partition gone silent long enough
for the state's processing-time timeouts to fire: SourceSilent and PartitionUnobserved, opened by
ticks).  Mid-stream the job is stopped and its last batch run again (its commit removed, as a kill
between the sink and the commit leaves it), then restarted on its checkpoint.  Later a second
query runs on a fresh checkpoint over more events, on the same topics and archive.

It proves, through Spark and a real alerts topic (the unit tests drive the state function the
way Spark does, ``tests/unit/test_replay.py``): ``kafka-monitor replay`` with the job's own config
file reproduces every record the job published, field for field (alert ids, times, evidence,
batch ids, places in their batch, query ids), using the recorded timeouts' moments, across the
batch run again and across a new checkpoint; a changed lag threshold shows the episode removed
and the one shifted by the amount the scripted events make; a range with nothing archived is
refused with exit status 2, naming what is archived.

Run time: about 90 s on 2 cores (estimated; not yet measured), a third of it waiting out the
state's 30 s tick (``tick_ms`` is not a job setting) so that the timeouts fire; one job run (two
queries) shared by the module's tests.  ``pytest tests/integration/test_replay.py -s``
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_monitor import cli
from kafka_monitor.config import build, read_file
from kafka_monitor.local.broker import create_topics
from kafka_monitor.replay.command import load_config
from monitor.contract import Event, GroupOffsets, Heartbeat, PartitionMetadata, PartitionOffsets
from streaming.job import JobConfig, start, state_config, stop_query
from streaming.replay.engine import replay
from streaming.replay.source import ArchiveReader
from streaming.sinks.archive import HOUR_MS, hour_label, parse_file_name
from streaming.sinks.exporter import Exporter
from tests.conftest import unique, wait_for
from tests.integration.test_archive import PARTITIONS, archived_ids, commits, forget, produce
from tests.support.alerts_topic import read_alerts

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # over 20 s (docs/tests.md)

CLUSTER, SOURCE = "k", "p"
#: the scripted probe's cycle: one observation of each entity every 10 s of event time
CYCLE_MS = 10_000
CYCLES = 36
#: cycles at which the group g's lag on t/0 is 5,000 (episode A) and 20,000 (episode B); else 100
LAG_A = range(6, 11)
LAG_B = range(18, 24)
#: cycles at which replica 3 is out of t/0's ISR
ISR_OUT = range(13, 16)
#: the job's rules (its config file): ConsumerLagHigh over 2,000 offsets held 10 s, so A opens
#: at cycle 7 and B at cycle 19; a source silent 3 intervals + 10 s; a partition unobserved 20 s
LAG_OFFSETS, LAG_FOR_MS = 2_000, 10_000
GRACE_MS, UNOBSERVED_MS = 10_000, 20_000
#: the changed threshold of test 3: A (5,000) never trips; B opens at cycle 21, 20 s later
CHANGED_OFFSETS, CHANGED_FOR_MS = 8_000, 30_000
WARMUP, WARMUP_MS = "5m", 300_000
#: opened only by the state's timeouts, after the last event (ticks at the processing time)
TICKED = {"SourceSilent", "PartitionUnobserved"}
#: the second query's events: t/0's ISR per observation, 1 s apart
SECOND_ISR = ([1, 2, 3], [1, 2, 3], [1, 2], [1, 2], [1, 2, 3], [1, 2, 3])


def at(start_ms: int, cycle: int) -> int:
    return start_ms + cycle * CYCLE_MS


def scripted(start_ms: int) -> list[Event]:
    """Every cycle: t/0's metadata and offsets (HW +25,000 a cycle), group g's commit on it, and
    the probe's heartbeat.  The commit always moves forward (no rewind, no stall): only the lag
    changes."""
    out = []
    for i in range(CYCLES):
        t, hw = at(start_ms, i), 1_000_000 + 25_000 * i
        lag = 5_000 if i in LAG_A else 20_000 if i in LAG_B else 100
        isr = [1, 2] if i in ISR_OUT else [1, 2, 3]
        payloads: list[Any] = [
            PartitionMetadata(topic="t", partition=0, leader=1, replicas=[1, 2, 3], isr=isr, metadata_version=i + 1),
            PartitionOffsets(topic="t", partition=0, high_watermark=hw, via="fetch", log_start_offset=0),
            GroupOffsets(group="g", topic="t", partition=0, committed_offset=hw - lag, high_watermark=hw),
            Heartbeat(interval_ms=CYCLE_MS, events_sent=4 * i, events_dropped=0, started_at=start_ms - 60_000)]
        for k, data in enumerate(payloads):
            out.append(Event.of(data, cluster=CLUSTER, source=SOURCE, seq=4 * i + k, observed_at=t))
    return out


def second_events(base_ms: int) -> list[Event]:
    out = []
    for j, isr in enumerate(SECOND_ISR):
        t, seq = base_ms + 1000 * j, 4 * CYCLES + 2 * j
        out.append(Event.of(PartitionMetadata(topic="t", partition=0, leader=1, replicas=[1, 2, 3], isr=list(isr),
                                              metadata_version=CYCLES + j + 1),
                            cluster=CLUSTER, source=SOURCE, seq=seq, observed_at=t))
        out.append(Event.of(PartitionOffsets(topic="t", partition=0, high_watermark=2_000_000 + 100 * j, via="fetch",
                                             log_start_offset=0),
                            cluster=CLUSTER, source=SOURCE, seq=seq + 1, observed_at=t))
    return out


def write_config(path: Path, **job: Any) -> str:
    """The job's config file, as ``kafka-monitor job --config`` reads it (TOML strings and
    numbers are written as JSON writes them)."""
    lines = ["[job]", *(f"{k} = {json.dumps(v)}" for k, v in job.items()),
             "", "[job.rules.lag]", f"lag_high_offsets = {LAG_OFFSETS}", f"lag_high_for_ms = {LAG_FOR_MS}",
             'lag_high_seconds = "none"',
             "", "[job.rules.source]", f"silence_grace_ms = {GRACE_MS}",
             "", "[job.rules.partition]", f"unobserved_after_ms = {UNOBSERVED_MS}", ""]
    path.write_text("\n".join(lines))
    return str(path)


def job_config(path: str, **over: Any) -> JobConfig:
    """The config file read by the job's own loader (file, then KAFKA_MONITOR_JOB_*, as the
    replay reads it), with ``over`` as flags."""
    return build(JobConfig, "job", file_data=read_file(path), flags=over or None)


def batch_files(root: str, query_id: str) -> dict[int, list[Path]]:
    """batch id -> the archive's files (events and timeouts' moments) of ``query_id``."""
    out: dict[int, list[Path]] = {}
    for p in Path(root).rglob("batch-*.parquet"):
        got = parse_file_name(p.name)
        if got is not None and got[1] == query_id:
            out.setdefault(got[0], []).append(p)
    return out


def opened_after(bootstrap: str, topic: str, after_ms: int) -> set[str]:
    return {r["alert"] for r in read_alerts(bootstrap, topic) if r["action"] == "open" and r["at"] > after_ms}


def iso_s(ms: int) -> str:
    assert ms % 1000 == 0
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms // 1000))


def ordered(records: list[dict]) -> list[dict]:
    return sorted(records, key=lambda r: (r.get("query_id") or "", r["batch_id"], r["index"]))


@dataclass
class Run:
    config: str          # the job's config file
    archive: str
    bootstrap: str
    events_topic: str
    alerts_topic: str
    start_ms: int        # the first event: --from
    last_event_ms: int   # the last event of the first query
    end_ms: int          # after the first query stopped, before the second's events: --to
    query_id: str
    rerun: int           # the batch run again after the restart
    ckpt: Path


@dataclass
class Second:
    query_id: str
    end_ms: int          # after the second query stopped
    event_ids: set[str]


@pytest.fixture(scope="module")
def first(spark, tansu, tmp_path_factory) -> Run:
    """The first query: the scripted events, the job stopped after 3 batches, its last batch
    forgotten by the checkpoint and run again, then every event and the timeouts' alerts."""
    d = tmp_path_factory.mktemp("replay")
    topic, alerts = unique("replay-events"), unique("replay-alerts")
    create_topics(tansu.bootstrap, {topic: PARTITIONS, alerts: 1})
    ckpt, root = d / "ckpt-1", str(d / "archive")
    config = write_config(d / "job.toml", bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(ckpt),
                          events_topic=topic, alerts_topic=alerts, archive_dir=root, trigger_s=1, buckets=4,
                          max_offsets_per_trigger=16, max_clock_skew_s=0)
    cfg = job_config(config)
    # the last cycle 20 s ago: the timeouts (30 s after a bucket's last rows) find the source and
    # the partition silent past their limits (40 s and 20 s) at the first tick
    start_ms = int(time.time()) * 1000 - (CYCLES - 1) * CYCLE_MS - 20_000
    evs = scripted(start_ms)
    produce(tansu.bootstrap, topic, evs)  # 146 records at 16 a batch

    q = start(spark, cfg, Exporter(), query_name=unique("replay-1"))
    qid = str(q.id)
    try:
        wait_for(lambda: len(commits(ckpt)) >= 3, 180, what="three batches committed")
    finally:
        stop_query(q)
    seen = set(archived_ids(root))
    assert 0 < len(seen) < len(evs), f"not mid-stream: {len(seen)} of {len(evs)} archived"
    # run the last batch that left anything (archive files, published records) again, as a kill
    # between its sink and its commit leaves it: its commit removed, and the batches planned
    # after it (none with rows or timeouts: they left nothing) forgotten
    published_batches = {r["batch_id"] for r in read_alerts(tansu.bootstrap, alerts) if r.get("query_id") == qid}
    rerun = max(set(batch_files(root, qid)) | published_batches)
    for b in sorted(int(f) for f in os.listdir(ckpt / "offsets") if f.isdigit()):
        if b > rerun:
            forget(ckpt / "offsets", b)
            forget(ckpt / "commits", b)
    forget(ckpt / "commits", rerun)
    print(f"\nfirst run: batches {commits(ckpt)} kept, {len(seen)} of {len(evs)} events archived; batch {rerun} to "
          f"be run again ({len(batch_files(root, qid).get(rerun, []))} files)")

    last_event = at(start_ms, CYCLES - 1)
    q = start(spark, cfg, Exporter(), query_name=unique("replay-1b"))
    try:
        assert str(q.id) == qid, "a restart on the checkpoint keeps its query id"
        wait_for(lambda: set(archived_ids(root)) >= {e.event_id for e in evs}, 240, what="every event archived")
        wait_for(lambda: opened_after(tansu.bootstrap, alerts, last_event) >= TICKED, 240, interval=1.0,
                 what=f"{sorted(TICKED)} opened by the state's timeouts")
    finally:
        stop_query(q)
    assert list(Path(root, "_ticks").rglob("batch-*.parquet")), "no timeout's moment archived"
    return Run(config=config, archive=root, bootstrap=tansu.bootstrap, events_topic=topic, alerts_topic=alerts,
               start_ms=start_ms, last_event_ms=last_event, end_ms=(int(time.time()) + 2) * 1000, query_id=qid,
               rerun=rerun, ckpt=ckpt)


def end_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    """Each partition's end (exact on Tansu: ``produce`` ends every partition with a one-record
    batch), as job.starting_offsets takes it."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("ends"), "enable.auto.commit": False})
    try:
        return {str(p): c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
    finally:
        c.close()


@pytest.fixture(scope="module")
def second(first, spark, tmp_path_factory) -> Second:
    """A second query on a fresh checkpoint (a new query id, batch ids from 0), from the end of
    the events topic, over an ISR shrink and expansion after the first query's range."""
    ends = end_offsets(first.bootstrap, first.events_topic)
    evs = second_events(first.end_ms + 1000)
    produce(first.bootstrap, first.events_topic, evs)
    cfg = job_config(first.config, checkpoint_dir=str(tmp_path_factory.mktemp("replay-2") / "ckpt"),
                     starting_offsets=json.dumps(ends))
    ids = {e.event_id for e in evs}
    q = start(spark, cfg, Exporter(), query_name=unique("replay-2"))
    qid = str(q.id)
    try:
        assert qid != first.query_id
        wait_for(lambda: set(archived_ids(first.archive)) >= ids, 180, what="the second query's events archived")
        wait_for(lambda: {("IsrShrink", "open"), ("IsrShrink", "resolve")} <= {
            (r["alert"], r["action"]) for r in read_alerts(first.bootstrap, first.alerts_topic)
            if r.get("query_id") == qid}, 120, interval=1.0, what="the second query's IsrShrink published")
    finally:
        stop_query(q)
    last = max(e.observed_at for e in evs)
    return Second(query_id=qid, end_ms=(max(int(time.time()), last // 1000) + 2) * 1000, event_ids=ids)


def run_replay(capsys, run: Run, tmp_path: Path, to_ms: int, *extra: str, name: str = "replay"):
    """``kafka-monitor replay`` as an engineer runs it: the job's config file, the archive, the
    range, the alerts topic to compare with.  Returns (exit status, the JSON report or None,
    stdout, stderr, the page's path)."""
    out, page = tmp_path / f"{name}.json", tmp_path / f"{name}.html"
    rc = cli.main(["replay", "--archive", run.archive, "--config", run.config, "--from", iso_s(run.start_ms),
                   "--to", iso_s(to_ms), "--warmup", WARMUP, "--bootstrap-servers", run.bootstrap,
                   "--alerts-topic", run.alerts_topic, "--out", str(out), "--html", str(page), "--no-progress", *extra])
    got = capsys.readouterr()
    print(got.out)
    return rc, json.loads(out.read_text()) if out.exists() else None, got.out, got.err, page


def job_side(run: Run, to_ms: int) -> list[dict]:
    """What the job published over the replay's range (the comparison's own bounds)."""
    return [r for r in read_alerts(run.bootstrap, run.alerts_topic)
            if run.start_ms - WARMUP_MS <= r["at"] <= to_ms and r["labels"].get("cluster") == CLUSTER]


def test_replaying_with_the_jobs_own_config_reproduces_every_published_record(first, tmp_path, capsys):
    published = job_side(first, first.end_ms)
    mine = [r for r in published if r.get("query_id") == first.query_id]
    assert mine == published, "every record carries the query's id"
    keys = [(r["query_id"], r["batch_id"], r["index"]) for r in published]
    assert len(set(keys)) == len(keys), "a record published twice (the batch run again)"
    assert first.rerun in commits(first.ckpt), "the batch run again did not commit"

    # the scripted transitions, as the job published them
    def times(alert, action):
        return sorted(r["at"] for r in published if r["alert"] == alert and r["action"] == action)

    t = lambda cycle: at(first.start_ms, cycle)  # noqa: E731
    assert times("ConsumerLagHigh", "open") == [t(LAG_A[1]), t(LAG_B[1])]
    assert times("ConsumerLagHigh", "resolve") == [t(LAG_A[-1] + 1), t(LAG_B[-1] + 1)]
    assert times("IsrShrink", "open") == [t(ISR_OUT[0])] and times("IsrShrink", "resolve") == [t(ISR_OUT[-1] + 1)]
    assert times("UnderReplicated", "open") == [t(ISR_OUT[0])]
    assert {r["alert"] for r in published if r["action"] == "open" and r["at"] > first.last_event_ms} >= TICKED

    rc, rep, out, err, page = run_replay(capsys, first, tmp_path, first.end_ms)
    assert rc == 0, err
    assert rep["exact"] is True and rep["compared"] is True
    assert rep["identical"] is True, json.dumps(rep.get("differences"), indent=1)
    assert "identical: the replay raises exactly the episodes the job published" in out
    assert rep["alerts_topic"]["records_compared"] == len(published)
    # record for record: alert, action, alert_id, severity, at, labels, evidence, batch_id, index,
    # sequence, query_id
    assert ordered(rep["transitions"]) == ordered(published)
    assert rep["replay"]["ticks"] > 0 and rep["replay"]["ticks_skipped"] == 0, rep["replay"]
    assert rep["replay"]["queries"][0]["query_id"] == first.query_id and rep["replay"]["incomplete"] == 0
    assert page.is_file()

    # not a tautology: without the recorded timeouts' moments nothing after the last event is raised
    copy = tmp_path / "no-ticks"
    shutil.copytree(first.archive, copy, ignore=shutil.ignore_patterns("_ticks"))
    reader = ArchiveReader(str(copy))
    res = replay(reader, reader.batches(first.start_ms - WARMUP_MS, first.end_ms),
                 state_config(load_config(first.config, None), run_id="replay"))
    assert res.ticks == 0
    assert not [r for r in res.transitions if r["query_id"] == first.query_id and r["at"] > first.last_event_ms]


def test_a_changed_lag_threshold_shows_the_episode_removed_and_the_one_shifted(first, tmp_path, capsys):
    rc, rep, out, err, page = run_replay(capsys, first, tmp_path, first.end_ms,
                                         "--rule", f"lag.lag_high_offsets={CHANGED_OFFSETS}",
                                         "--rule", f"lag.lag_high_for_ms={CHANGED_FOR_MS}", name="changed")
    assert rc == 0, err
    assert rep["rules_changed"]["lag.lag_high_offsets"] == CHANGED_OFFSETS
    assert rep["rules_changed"]["lag.lag_high_for_ms"] == CHANGED_FOR_MS
    assert rep["identical"] is False
    assert rep["summary"]["ConsumerLagHigh"] == {"same": 0, "added": 0, "removed": 1, "shifted": 1}
    t = lambda cycle: at(first.start_ms, cycle)  # noqa: E731
    lag = rep["differences"]["ConsumerLagHigh"]
    # A (5,000 offsets) no longer trips 8,000: missed
    assert [(e["start"], e["end"]) for e in lag["removed"]] == [(t(LAG_A[1]), t(LAG_A[-1] + 1))]
    # B (20,000) trips both, but is held 30 s instead of 10: opens 2 cycles later, resolves alike
    [shift] = lag["shifted"]
    assert (shift["job"]["start"], shift["replay"]["start"]) == (t(LAG_B[1]), t(LAG_B[3]))
    assert (shift["start_shift_s"], shift["end_shift_s"]) == ((CHANGED_FOR_MS - LAG_FOR_MS) / 1000, 0.0)
    assert lag["added"] == []
    assert shift["job"]["entity"] == {"cluster": CLUSTER, "topic": "t", "partition": "0", "group": "g"}
    others = {a: c for a, c in rep["summary"].items() if a != "ConsumerLagHigh"}
    assert others and all(c["added"] == c["removed"] == c["shifted"] == 0 for c in others.values()), others
    assert "- ConsumerLagHigh" in out and "~ ConsumerLagHigh" in out

    html = page.read_text()
    assert not re.findall(r"""(?:src|href)\s*=\s*["']?\s*https?://""", html, re.I), "the page fetches something"
    assert "ConsumerLagHigh · cluster k topic t partition 0 group g" in html
    assert html.count("<svg") == 1


def test_a_new_checkpoint_publishes_from_its_batch_0_and_both_queries_are_reproduced(first, second, tmp_path,
                                                                                      capsys):
    published = job_side(first, second.end_ms)
    q1 = [r for r in published if r.get("query_id") == first.query_id]
    q2 = [r for r in published if r.get("query_id") == second.query_id]
    assert len(q1) + len(q2) == len(published)
    assert {(r["alert"], r["action"]) for r in q2} >= {("IsrShrink", "open"), ("IsrShrink", "resolve"),
                                                        ("UnderReplicated", "open"), ("UnderReplicated", "resolve")}
    # the second query's batch ids start again at 0: below the first's, whose records its sink
    # reads back at its start (and must not take for its own)
    assert min(r["batch_id"] for r in q2) < max(r["batch_id"] for r in q1)
    got = {str(p): pq.read_table(str(p), columns=["event_id"], partitioning=None).column("event_id").to_pylist()
           for b in batch_files(first.archive, second.query_id).values() for p in b if "_ticks" not in p.parts}
    assert {i for ids in got.values() for i in ids} == second.event_ids, "the second query read other events"

    rc, rep, out, err, page = run_replay(capsys, first, tmp_path, second.end_ms, name="both")
    assert rc == 0, err
    assert rep["identical"] is True, json.dumps(rep.get("differences"), indent=1)
    assert [q["query_id"] for q in rep["replay"]["queries"]] == [first.query_id, second.query_id]
    assert ordered(rep["transitions"]) == ordered(published)


def test_a_range_with_nothing_archived_is_refused_naming_what_is_archived(first, tmp_path, capsys):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    rc = cli.main(["replay", "--archive", first.archive, "--from", "2001-01-01T00:00:00Z",
                   "--to", "2001-01-01T01:00:00Z", "--no-compare", "--no-progress", "--out", str(out),
                   "--html", str(page)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert (f"error: nothing archived between 2001-01-01T00:00:00.000Z and 2001-01-01T01:00:00.000Z for {CLUSTER}; "
            f"the archive has: cluster {CLUSTER}: {hour_label(first.start_ms // HOUR_MS)} .. ") in err
    assert not out.exists() and not page.exists()
