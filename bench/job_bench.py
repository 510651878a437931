"""Streaming job benchmark: drain rate and steady-state batch latency against tracked entities.

For each size (partitions, group/partition pairs) it starts a Tansu broker, writes a backlog of
observation cycles (per cycle: one partition_offsets per partition, a partition_metadata where
the probe would send one (see ``--metadata``), one group_offsets per group/partition pair, one
heartbeat) into the events topic, then runs the
real job (Python Kafka source -> parse -> state -> exporter) in local[2]:

- drain: a new query over the whole backlog.  Two figures: events/s from start() until every
  record is processed (includes the query's start-up and the first batch's Python worker
  start, ~15-25 s), and events/s over the batches after the first one (the rate a running job
  catches up at);
- steady: while the query runs (trigger ``--trigger-s``, the job's default 5 s), one new cycle
  every ``--cycle-s`` seconds (the probe's default interval, 10 s); the per-batch wall times
  Spark reports (triggerExecution) → p50 / p95, and the median of each phase (addBatch =
  read + parse + gate + state + sink; latestOffset; queryPlanning; walCommit; commitOffsets);
- ``--active``: the share of partitions (and group partitions) whose offsets move each cycle
  (1.0 = all of them, the worst case);
- ``--idle-groups``: the share of group partitions whose consumer sits at the HW of a
  partition nobody writes to (0 by default: every consumer lags and commits each cycle, the
  worst case; at rest, in columns, after ten such cycles: ``streaming/state/idle_groups.py``);
- ``--metadata``: partition metadata as the probe sends it (on change, and a snapshot of each
  partition every ``metadata_snapshot_s``, 60 s = 6 cycles: at 100,000 partitions a cycle is
  about 100k offsets + 17k metadata + the group offsets) or ``every-cycle`` (every partition's
  metadata in every cycle, as the probe sent it before);
- memory: peak RSS (VmHWM) of the JVM and of the Python worker processes;
- ``--state noop``: the framework's floor.  The same query (source, parse + quality gate, the
  shuffle into buckets, ``applyInPandasWithState``, the sink) with a state function that takes
  its input as pandas frames, as the real one does, then emits nothing and stores nothing: what
  the job could reach at best on this machine if its rules and its sink cost nothing.
- ``--state carry``: the floor plus the state's round trip: each bucket's real value (its first
  call runs the job's function) read and stored again unchanged every batch, nothing emitted;
- ``breakdown``: where a steady batch's time goes (the state store, the state function, the
  driver's sink) and what the driver got per batch (``<kind>_rows_per_batch``);
- ``--archive both``: each size with the event archive (``job.archive_dir``), then without it:
  its cost per batch, in the batch times, the state function's time (it packs the rows) and
  ``archive_write_s`` (the driver's write), with its rows, files and bytes per batch;
- ``--encoding``: ``rows`` (the default), the cycles as the probe sends them since contract v3 (a topic's offsets
  and metadata, a group's offsets of one topic, in one record); the figures count events, not
  records (from the producer's delivery reports), and a batch takes about as many events as
  with ``v1`` (one record each, as before v3).

    python bench/job_bench.py                         # the issue's sizes, 3 runs each
    python bench/job_bench.py --sizes 1000:1000 --runs 1
    python bench/job_bench.py --sizes 10000:10000 --runs 1 --archive both   # bench/results/job-archive.json

Prints a table and writes bench/results/job.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Optional
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

import report  # noqa: E402  (bench/report.py)
from kafka_monitor.local.broker import TansuBroker, create_topics  # noqa: E402
from monitor.contract import Event, GroupOffsets, Heartbeat, PartitionMetadata, PartitionOffsets  # noqa: E402

EVENTS_PARTITIONS = 6
EVENTS_TOPIC = "kafka-monitor.events"
PARTS_PER_TOPIC = 100


#: partition i's ISR is short in the cycles where (i + cycle) is a multiple of this (and full
#: again the cycle after): a partition in 97 shrinks, and one grows back, each cycle
ISR_EVERY = 97


def isr_of(i: int, cycle: int, every: int = ISR_EVERY) -> list[int]:
    """Partition i's ISR in ``cycle``; ``every`` 0: never short."""
    return [1, 2] if every and (i + cycle) % every == 0 else [1, 2, 3]


def cycle_events(n_parts: int, n_pairs: int, cycle: int, t_ms: int, active: float = 1.0,
                 snapshot_cycles: int = 6, idle_groups: float = 0.0, isr_every: int = ISR_EVERY) -> list[Event]:
    """One observation cycle as the probe sends it: a partition's metadata on the first cycle,
    when it changed, and as a snapshot every ``snapshot_cycles`` cycles (spread: partition i's
    comes in the cycles where cycle = i mod snapshot_cycles); ``snapshot_cycles`` = 1 sends
    every partition's metadata every cycle (the probe before it sent changes only).
    ``idle_groups``: the share of group partitions whose consumer sits at the HW of a partition
    nobody writes to (the others lag by 1,000-1,500 records and commit every cycle)."""
    evs: list[Event] = []
    seq = cycle * (2 * n_parts + n_pairs + 1)

    def ev(data):
        nonlocal seq
        seq += 1
        return Event.of(data, cluster="bench", source="bench-probe", seq=seq, observed_at=t_ms)

    for i in range(n_parts):
        topic, part = f"t{i // PARTS_PER_TOPIC}", i % PARTS_PER_TOPIC
        isr = isr_of(i, cycle, isr_every)
        if cycle == 0 or isr != isr_of(i, cycle - 1, isr_every) or (cycle - i) % snapshot_cycles == 0:
            evs.append(ev(PartitionMetadata(topic=topic, partition=part, leader=1, leader_epoch=3, replicas=[1, 2, 3],
                                            isr=isr, metadata_version=cycle + 1, min_insync_replicas=2)))
        moving = (i % 1000) < active * 1000
        evs.append(ev(PartitionOffsets(topic=topic, partition=part,
                                       high_watermark=(1000 * (cycle + 1) if moving else 1000) + i,
                                       log_start_offset=0, via="list_offsets", metadata_at=t_ms)))
    for j in range(n_pairs):
        topic, part = f"t{(j % max(n_parts, 1)) // PARTS_PER_TOPIC}", j % PARTS_PER_TOPIC
        moving = (j % 1000) < active * 1000
        c = cycle if moving else 0
        committed, hw = 1000 * c + j % 500, 1000 * (c + 1) + j
        if (j % 1000) < idle_groups * 1000:
            committed = hw = 1000 + j
        evs.append(ev(GroupOffsets(group=f"g{j // 1000}", topic=topic, partition=part,
                                   committed_offset=committed, high_watermark=hw, hw_observed_at=t_ms)))
    evs.append(ev(Heartbeat(interval_ms=10_000, events_sent=seq, events_dropped=0)))
    return evs


def serialize(events: list[Event]) -> list[tuple[bytes, bytes]]:
    """(key, value) records, made before they are produced so that making them does not compete
    with the job under test."""
    return [(e.key().encode(), e.to_json()) for e in events]


def serialize_rows(events: list[Event]) -> list[tuple[bytes, bytes, int]]:
    """Contract v3: a cycle's events of one type and topic (and group) in one record, ``rows``
    listing what differs (the partitions and their offsets), with the events it stands for."""
    runs: dict[tuple, list[Event]] = {}
    for e in events:
        runs.setdefault((e.type, getattr(e.data, "topic", None), getattr(e.data, "group", None)), []).append(e)
    out = []
    for run in runs.values():
        for k in range(0, len(run), 10_000):
            part = run[k:k + 10_000]
            rec = Event.batch([x.data for x in part], cluster=part[0].cluster, source=part[0].source,
                              seq=part[0].seq, observed_at=part[0].observed_at)
            out.append((rec.key().encode(), rec.to_json(), len(part)))
    return out


class EventCounts:
    """Events per record of the events topic, by (partition, offset), from the producer's delivery
    reports: the events a batch read, from its start and end offsets (v3 records stand for many)."""

    def __init__(self) -> None:
        self.by_offset: dict[int, dict[int, int]] = {}

    def between(self, progress: dict) -> int:
        total = 0
        for part, (begin, end) in batch_spans(progress).items():
            got = self.by_offset.get(part, {})
            total += sum(got.get(o, 1) for o in range(begin, end))
        return total


def batch_spans(progress: dict) -> dict[int, tuple[int, int]]:
    """A batch's offsets read, partition -> (start, end), from its progress (either source's form)."""
    from streaming.sinks.progress import source_offsets
    src = progress["sources"][0]
    begin, end = (source_offsets(json.loads(x) if isinstance(x, str) else x) if x else {}
                  for x in (src["startOffset"], src["endOffset"]))
    return {int(part): (begin.get((topic, part), 0), hi) for (topic, part), hi in end.items()}


def produce(bootstrap: str, topic: str, records: list, counts: Optional[EventCounts] = None) -> None:
    """``records``: (key, value) or (key, value, events it stands for); ``counts`` learns the
    last from the delivery reports."""
    def delivered(n):
        def cb(err, msg):
            if err is None and counts is not None:
                counts.by_offset.setdefault(msg.partition(), {})[msg.offset()] = n
        return cb

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                  "queue.buffering.max.messages": 1_000_000, "compression.type": "lz4"})
    for rec in records:
        k, v = rec[0], rec[1]
        while True:
            try:
                if counts is None:
                    p.produce(topic, key=k, value=v)
                else:
                    p.produce(topic, key=k, value=v, on_delivery=delivered(rec[2] if len(rec) > 2 else 1))
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)
    # Tansu lists "latest" as the base offset of the last batch + 1: one single-record batch
    # per partition after the flush makes the listed end exact (a Tansu-only workaround)
    for part in range(EVENTS_PARTITIONS):
        p.produce(topic, key=b"pad", value=b"{}", partition=part)
        p.flush(30)


def end_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ends"})
    try:
        return {str(p): c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(EVENTS_PARTITIONS)}
    finally:
        c.close()


def wait_processed(q, target: dict[str, int], timeout_s: float = 1800) -> None:
    """Until the last batch's end offsets reach ``target``.  (processAllAvailable never returns
    here: with processing-time timeouts Spark keeps running no-data batches.)"""
    from streaming.sinks.progress import source_offsets
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if q.exception() is not None:
            raise RuntimeError(q.exception())
        p = q.lastProgress
        if p:
            end = p["sources"][0]["endOffset"]
            end = source_offsets(json.loads(end) if isinstance(end, str) else end)  # either source's form
            if end and all(end.get((EVENTS_TOPIC, k), -1) >= v for k, v in target.items()):
                return
        time.sleep(0.1)
    raise TimeoutError(f"the job did not reach {target} in {timeout_s}s")


def vm_hwm_kb(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline").read()
    except OSError:  # exited meanwhile (Spark retires idle Python workers)
        return ""


def descendants(pid: int) -> list[int]:
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                kids.append(int(d))
    return kids + [g for k in kids for g in descendants(k)]


def batch_rows(q, seen: set) -> list[dict]:
    out = []
    for p in q.recentProgress:
        if p["batchId"] not in seen and p["numInputRows"] > 0:
            seen.add(p["batchId"])
            out.append(p)
    return out


def noop_state_function(cfg, compact_partitions=True):
    """``--state noop``: a state function that consumes its input frames (Spark's Arrow ->
    pandas conversion happens as they are taken) and emits and stores nothing."""
    def update_bucket(key, pdfs, state):
        for _ in pdfs:
            pass
        return iter(())
    return update_bucket


def _timing(f, into: list):
    def g(*a, **kw):
        t = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            into.append(time.perf_counter() - t)
    return g


#: where the state function's calls log their wall time (``timed_state_function``)
TIMES_ENV = "KM_BENCH_STATE_TIMES"
#: where each state function call's cProfile stats go (``--profile-state``)
PROFILE_ENV = "KM_BENCH_STATE_PROFILE"


def silent_state_function(make):
    """``--state silent``: the job's state function, its output dropped (a diagnosis: what the
    output rows cost between the workers and the driver's sink)."""
    def wrapped(cfg, compact_partitions=True):
        fn = make(cfg, compact_partitions)

        def update_bucket(key, pdfs, state):
            for _ in fn(key, pdfs, state):
                pass
            return iter(())
        return update_bucket
    return wrapped


def carry_state_function(make):
    """``--state carry``: a bucket's first call runs the job's state function (its stored value
    is then the real one, at the size the job's would be); every later call consumes its input
    frames, stores that value again unchanged and emits nothing.  The floor plus the state's
    round trip (JVM -> worker -> JVM -> checkpoint each batch): what no rule can go below while
    the whole bucket is one ``applyInPandasWithState`` value."""
    def wrapped(cfg, compact_partitions=True):
        fn = make(cfg, compact_partitions)

        def update_bucket(key, pdfs, state):
            if not state.exists:
                return fn(key, pdfs, state)
            for _ in pdfs:
                pass
            state.update(state.get)
            state.setTimeoutDuration(cfg.tick_ms)
            return iter(())
        return update_bucket
    return wrapped


def timed_state_function(make):
    """The job's state function, each call's wall time (in the Python worker, output frames
    included) appended to the file named by ``$KM_BENCH_STATE_TIMES``: (end time, seconds)."""
    def wrapped(cfg, compact_partitions=True):
        fn = make(cfg, compact_partitions)
        path = os.environ.get(TIMES_ENV)

        profile_dir = os.environ.get(PROFILE_ENV)

        def update_bucket(key, pdfs, state):
            t = time.perf_counter()
            frames = list(pdfs)  # Spark's Arrow -> pandas conversion happens as they are taken
            t1, c1 = time.perf_counter(), time.thread_time()
            if profile_dir:
                import cProfile
                prof = cProfile.Profile()
                out = prof.runcall(lambda: list(fn(key, iter(frames), state)))
                prof.dump_stats(os.path.join(profile_dir, f"{os.getpid()}-{time.time_ns()}.prof"))
            else:
                out = list(fn(key, iter(frames), state))
            if path:
                with open(path, "a") as f:
                    f.write(f"{time.time()} {time.perf_counter() - t1} {t1 - t} {time.thread_time() - c1}\n")
            return iter(out)
        return update_bucket
    return wrapped


class Scraper:
    """GETs /metrics ``rate`` times a second (gzip accepted, as Prometheus asks) while ``on`` is
    set, keeping each scrape's latency."""

    def __init__(self, url: str, rate: float):
        import threading
        self.url, self.period = url, 1.0 / rate
        self.on, self._stop = threading.Event(), threading.Event()
        self.latencies: list[float] = []
        self._t = threading.Thread(target=self._run, name="bench-scraper", daemon=True)
        self._t.start()

    def _run(self) -> None:
        import urllib.request
        while not self._stop.is_set():
            if not self.on.wait(0.1):
                continue
            t = time.perf_counter()
            req = urllib.request.Request(self.url, headers={"Accept-Encoding": "gzip"})
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
            took = time.perf_counter() - t
            self.latencies.append(took)
            time.sleep(max(0.0, self.period - took))

    def stop(self) -> None:
        self._stop.set()
        self._t.join(70)


def one_run(spark, n_parts: int, n_pairs: int, backlog_cycles: int, steady_cycles: int, cycle_s: float,
            trigger_s: float, active: float, snapshot_cycles: int, scrape_rate: float = 0.0,
            source: str = "python", cluster=None, archive: bool = False, encoding: str = "rows",
            idle_groups: float = 0.0, isr_every: int = ISR_EVERY) -> dict:
    from streaming.sinks.exporter import Exporter
    from streaming.job import JobConfig, start, stop_query

    work = tempfile.mkdtemp(prefix="km-bench-")
    with TansuBroker() as broker:
        create_topics(broker.bootstrap, {"kafka-monitor.events": EVENTS_PARTITIONS, "kafka-monitor.alerts": 1})
        t0 = int(time.time() * 1000) - backlog_cycles * 10_000
        ser = serialize_rows if encoding == "rows" else serialize
        counts = EventCounts()
        backlog = [r for c in range(backlog_cycles)
                   for r in ser(cycle_events(n_parts, n_pairs, c, t0 + c * 10_000, active, snapshot_cycles, idle_groups,
                                      isr_every))]
        backlog_events = sum(r[2] if len(r) > 2 else 1 for r in backlog)
        learn = counts if encoding == "rows" else None  # v1: a record is an event
        produce(broker.bootstrap, "kafka-monitor.events", backlog, learn)
        # the steady cycles are made now, before the query starts (event times: where the
        # cycles will be produced, roughly), so that making them does not compete with the job
        t1 = int(time.time() * 1000) + 30_000
        cycles = [ser(cycle_events(n_parts, n_pairs, c, t1 + int(k * cycle_s * 1000), active, snapshot_cycles,
                                   idle_groups, isr_every))
                  for k, c in enumerate(range(backlog_cycles, backlog_cycles + steady_cycles))]
        cfg = JobConfig(bootstrap_servers=broker.bootstrap, checkpoint_dir=f"{work}/ckpt", trigger_s=trigger_s,
                        # about as many events a batch whatever the encoding
                        max_offsets_per_trigger=max(1, 250_000 * len(backlog) // backlog_events),
                        metrics_port=0, source=source,
                        archive_dir=f"{work}/archive" if archive else None)
        exporter = Exporter(max_series=10_000_000)
        # the archive's writes: (finished at, seconds, rows, files, bytes)
        archived: list[tuple[float, float, int, int, int]] = []
        set_archive = exporter.set_archive

        def archive_done(rows: int, files: int, bytes_written: int, duration_s: float, removed: int = 0) -> None:
            archived.append((time.time(), duration_s, rows, files, bytes_written))
            set_archive(rows, files, bytes_written, duration_s, removed)
        exporter.set_archive = archive_done  # type: ignore[method-assign]
        scraper = Scraper(f"http://127.0.0.1:{exporter.serve(0)}/metrics", scrape_rate) if scrape_rate else None
        scraped_batches: set = set()
        sinks: list[tuple[float, float, int]] = []
        done = exporter.batch_done
        def batch_done(rows: int, duration_s: float, finished_at: float) -> None:
            sinks.append((finished_at, duration_s, rows))
            done(rows, duration_s, finished_at)
        exporter.batch_done = batch_done  # type: ignore[method-assign]
        # the driver's share of the sink (after the batch's rows are collected): time in these
        spent: dict[str, list[float]] = {"sink_rows": [], "exporter_apply": [], "alerts_publish": []}
        from streaming.sinks import alerts as alerts_module
        from streaming.sinks import batch as batch_module
        restore = [(batch_module, "sink_rows", batch_module.sink_rows), (exporter, "apply", exporter.apply),
                   (alerts_module.AlertsTopicSink, "publish", alerts_module.AlertsTopicSink.publish)]
        for obj, name, f in restore:
            setattr(obj, name, _timing(f, spent[{"sink_rows": "sink_rows", "apply": "exporter_apply",
                                                  "publish": "alerts_publish"}[name]]))
        # what each batch's sink got: alert transitions, and gauge rows by kind
        kinds: list[Counter] = []
        timed_sink_rows = batch_module.sink_rows

        def counted_sink_rows(t):
            rows = timed_sink_rows(t)
            kinds.append(Counter(r["kind"] for r in rows))
            return rows
        batch_module.sink_rows = counted_sink_rows
        times = os.environ.get(TIMES_ENV)
        if times:
            open(times, "w").close()
        # the driver's garbage collections: (end time, seconds, generation)
        collections: list[tuple[float, float, int]] = []
        gc_started = [0.0]

        def on_gc(phase, info):
            if phase == "start":
                gc_started[0] = time.perf_counter()
            else:
                collections.append((time.time(), time.perf_counter() - gc_started[0], info["generation"]))
        gc.callbacks.append(on_gc)
        started = time.perf_counter()
        q = start(spark, cfg, exporter, query_name=f"bench-{n_parts}-{n_pairs}")
        try:
            wait_processed(q, end_offsets(broker.bootstrap, "kafka-monitor.events"))
            drain_s = time.perf_counter() - started
            seen: set = set()
            drained = batch_rows(q, seen)
            # the rate after the first batch (which pays the query's and the workers' start-up)
            later = [p for p in drained if p["batchId"] > 0]
            later_rows = sum(counts.between(p) for p in later)
            later_s = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000.0
            steady = []
            steady_from = time.time()
            for k, records in enumerate(cycles):
                # with --scrape-rate: every other cycle scraped, so both kinds share the run's state
                scraping = scraper is not None and k % 2 == 1
                if scraping:
                    scraper.on.set()
                t_cycle = time.perf_counter()
                produce(broker.bootstrap, "kafka-monitor.events", records, learn)
                wait_processed(q, end_offsets(broker.bootstrap, "kafka-monitor.events"))
                got = batch_rows(q, seen)
                steady += got
                if scraping:
                    scraped_batches.update(p["batchId"] for p in got)
                time.sleep(max(0.0, cycle_s - (time.perf_counter() - t_cycle)))
                if scraper is not None:
                    scraper.on.clear()
            assert q.exception() is None, q.exception()
        finally:
            if scraper is not None:
                scraper.stop()
            stop_query(q)
            exporter.shutdown()
            for obj, name, f in restore:
                setattr(obj, name, f)
            gc.callbacks.remove(on_gc)
        from pyspark import SparkContext
        jvm = SparkContext._gateway.proc.pid
        executors = cluster.executor_pids() if cluster is not None else []
        py_workers = [p for j in [jvm, *executors] for p in descendants(j) if "python" in cmdline(p)]
    shutil.rmtree(work, ignore_errors=True)
    durations = sorted(p["durationMs"]["triggerExecution"] / 1000.0 for p in steady)
    p95 = durations[min(len(durations) - 1, int(round(0.95 * (len(durations) - 1))))] if durations else None
    phases = {k: statistics.median(p["durationMs"].get(k, 0) / 1000.0 for p in steady)
              for k in ("addBatch", "latestOffset", "queryPlanning", "walCommit", "commitOffsets")} if steady else {}
    scrape = {}
    if scraper is not None:
        lat = sorted(scraper.latencies)
        with_s = [p["durationMs"]["triggerExecution"] / 1000.0 for p in steady if p["batchId"] in scraped_batches]
        without = [p["durationMs"]["triggerExecution"] / 1000.0 for p in steady if p["batchId"] not in scraped_batches]
        scrape = {"scrape_rate": scrape_rate, "scrapes": len(lat),
                  "scrape_p50_s": statistics.median(lat) if lat else None,
                  "scrape_p95_s": lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))] if lat else None,
                  "batch_p50_s_scraped": statistics.median(with_s) if with_s else None,
                  "batch_p50_s_unscraped": statistics.median(without) if without else None,
                  "series": exporter.render().count(b"\n") - exporter.render().count(b"\n#")}
    # where a steady batch's time goes: the state store (Spark's stateOperators), the state
    # function in the workers (per batch, both cores' time summed), the driver's sink
    ops = [p["stateOperators"][0] for p in steady if p.get("stateOperators")]
    breakdown = {k: statistics.median(o.get(k, 0) for o in ops) / 1000.0 for k in ("allUpdatesTimeMs", "commitTimeMs")} \
        if ops else {}
    if ops:
        breakdown["state_memory_mb"] = statistics.median(o.get("memoryUsedBytes", 0) for o in ops) / 1e6
    # the steady batches with rows (Spark also runs no-data batches, for the state's timeouts);
    # each sink call times its parts once, in the same order
    steady_sinks = [i for i, (at, d, n) in enumerate(sinks) if at >= steady_from and n]
    if steady_sinks:
        breakdown["collect_and_sink_s"] = statistics.median(sinks[i][1] for i in steady_sinks)
        for name, got in spent.items():
            if len(got) == len(sinks):
                breakdown[f"{name}_s"] = statistics.median(got[i] for i in steady_sinks)
        if len(kinds) == len(sinks):
            for kind in sorted({k for c in kinds for k in c}):
                breakdown[f"{kind}_rows_per_batch"] = statistics.median(kinds[i].get(kind, 0) for i in steady_sinks)
    steady_archive = [a for a in archived if a[0] >= steady_from and a[2]]
    if steady_archive:  # the driver's write of the archive (in collect_and_sink_s)
        breakdown["archive_write_s"] = statistics.median(a[1] for a in steady_archive)
        breakdown["archive_rows_per_batch"] = statistics.median(a[2] for a in steady_archive)
        breakdown["archive_files_per_batch"] = statistics.median(a[3] for a in steady_archive)
        breakdown["archive_bytes_per_batch"] = statistics.median(a[4] for a in steady_archive)
    if steady:
        later_gc = [c for c in collections if c[0] >= steady_from]
        breakdown["driver_gc_s_per_batch"] = sum(c[1] for c in later_gc) / len(steady)
        breakdown["driver_gen2_gcs_per_batch"] = sum(c[2] == 2 for c in later_gc) / len(steady)
    if times and steady:
        with open(times) as f:
            calls = [tuple(map(float, line.split())) for line in f if line.strip()]
        later = [c for c in calls if c[0] >= steady_from]
        # summed over both cores' tasks: the function's wall time, the input frames' conversion
        # before it (the floor pays that too), the function's CPU time (its thread's)
        for i, name in enumerate(("state_function", "input_frames", "state_function_thread_cpu"), 1):
            breakdown[f"{name}_s_per_batch"] = sum(c[i] for c in later if len(c) > i) / len(steady)
    return {
        **scrape,
        "breakdown": breakdown,
        "partitions": n_parts, "group_partitions": n_pairs, "active": active, "snapshot_cycles": snapshot_cycles,
        "idle_groups": idle_groups, "isr_every": isr_every,
        "archive": archive,
        "encoding": encoding, "backlog_records": len(backlog), "backlog_events": backlog_events,
        "drain_s": drain_s, "drain_events_per_s": backlog_events / drain_s,
        "drain_after_first_batch_events_per_s": later_rows / later_s if later_s else None,
        "steady_batches": len(durations), "steady_rows_per_batch": statistics.median(counts.between(p) for p in steady)
        if steady else None,
        "batch_p50_s": statistics.median(durations) if durations else None, "batch_p95_s": p95,
        "phase_median_s": phases,
        "jvm_peak_rss_mb": vm_hwm_kb(jvm) / 1024,
        "executors_peak_rss_mb": sum(vm_hwm_kb(p) for p in executors) / 1024,
        "python_workers_peak_rss_mb": sum(vm_hwm_kb(p) for p in py_workers) / 1024,
        "python_workers": len(py_workers),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["1000:1000", "10000:10000", "100000:10000", "300000:10000"],
                    help="partitions:group_partitions (default: the issue's sizes)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backlog-cycles", type=int, default=3)
    ap.add_argument("--steady-cycles", type=int, default=6)
    ap.add_argument("--cycle-s", type=float, default=10.0, help="seconds between observation cycles (the probe's "
                    "default interval_s)")
    ap.add_argument("--trigger-s", type=float, default=5.0, help="the job's trigger (its default trigger_s)")
    ap.add_argument("--active", type=float, default=1.0, help="share of partitions whose offsets move each cycle")
    ap.add_argument("--idle-groups", type=float, default=0.0,
                    help="share of group partitions whose consumer sits at the HW of a partition nobody writes to "
                         "(held in columns after the lag rules' window of such cycles: give --backlog-cycles 11 "
                         "or more; default 0: every consumer lags and commits each cycle)")
    ap.add_argument("--isr-every", type=int, default=ISR_EVERY,
                    help="one partition in this many has its ISR shrink each cycle, and the one that shrank the "
                         "cycle before grows back (each change opens or resolves alerts; 0: no ISR changes, a "
                         "calm cluster; default %(default)s: ~1%% of the partitions, a busy day's worst)")
    ap.add_argument("--metadata", choices=["changes", "every-cycle"], default="changes",
                    help="partition metadata as the probe sends it: on change and as a snapshot every "
                         "metadata_snapshot_s (default), or every partition every cycle (what the probe sent before it sent changes only)")
    ap.add_argument("--state", choices=["rules", "noop", "silent", "carry"], default="rules",
                    help="the job's state function (default), or one that does nothing: the framework's floor "
                         "(silent: the job's, its output dropped; carry: the floor plus storing each bucket's "
                         "real value again every batch)")
    ap.add_argument("--scrape-rate", type=float, default=0.0,
                    help="scrapes of /metrics per second during every other steady cycle (0: none): the "
                         "job's batch time with and without scrapes, and scrape latency, in one run")
    ap.add_argument("--profile-state", default=None, metavar="DIR",
                    help="a diagnosis: write a cProfile of every state function call into DIR (read them "
                         "together with pstats; the profiler slows the job, so its figures are not comparable)")
    ap.add_argument("--master", choices=["local", "cluster"], default="local",
                    help="local: local[2] in this process (default); cluster: a standalone master and 2 workers of "
                         "1 core and 1 GiB each started here (kafka_monitor/spark_cluster.py), this process the "
                         "driver in client mode")
    ap.add_argument("--source", choices=["python", "spark-kafka"], default="python",
                    help="the job's Kafka reader (spark-kafka: Spark's own, jars from kafka-monitor spark-jars)")
    ap.add_argument("--state-store", choices=["hdfs", "rocksdb"], default="hdfs")
    ap.add_argument("--encoding", choices=["v1", "rows"], default="rows",
                    help="the events as records: contract v3's rows, as the probe sends them (one record per type "
                         "and topic of a cycle), or one each (v1/v2, as before v3); rates count events either way "
                         "(default: %(default)s)")
    ap.add_argument("--archive", choices=["off", "on", "both"], default="off",
                    help="the event archive (job.archive_dir, in the run's temporary directory): off (default), on, "
                         "or both: each size's runs with it, then without it, in one sitting (its cost per batch; "
                         "with it first, a warmer JVM favours the runs without it)")
    ap.add_argument("--out", default=None, help="results file (default: bench/results/job.json; "
                                                 "job-<state>-state.json with another --state; job-archive.json "
                                                 "with --archive on or both)")
    args = ap.parse_args()
    if args.out is None:
        args.out = str(ROOT / "bench" / "results" / ("job-archive.json" if args.archive != "off" else
                                                     "job.json" if args.state == "rules" else f"job-{args.state}-state.json"))
    from streaming.state import function as state
    made_times = None  # the state times file this run made (removed at the end)
    if args.state == "noop":
        state.make_state_function = noop_state_function
    elif args.state == "carry":
        state.make_state_function = carry_state_function(state.make_state_function)
    else:
        if TIMES_ENV not in os.environ:
            os.environ[TIMES_ENV] = made_times = tempfile.mktemp(prefix="km-bench-state-times-")
        if args.profile_state:
            os.makedirs(args.profile_state, exist_ok=True)
            os.environ[PROFILE_ENV] = os.path.abspath(args.profile_state)
        state.make_state_function = timed_state_function(state.make_state_function)
        if args.state == "silent":
            state.make_state_function = silent_state_function(state.make_state_function)
    from monitor.probe_config import ProbeConfig
    snapshot_cycles = (1 if args.metadata == "every-cycle"
                       else max(1, round(ProbeConfig(bootstrap_servers="-").metadata_snapshot_s / args.cycle_s)))

    from streaming.job import JobConfig, spark_session, stop_spark
    cluster = None
    if args.source == "spark-kafka":
        from kafka_monitor.spark_cluster import ensure_spark_kafka
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(map(str, ensure_spark_kafka()))} pyspark-shell"
    if args.master == "cluster":  # started after the environment above is set: executors inherit it
        from kafka_monitor.spark_cluster import SparkCluster
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        cluster = SparkCluster(workers=2, cores=1, memory="1g").start()
    master = cluster.master_url if cluster is not None else "local[2]"
    spark = spark_session(JobConfig(bootstrap_servers="-", checkpoint_dir="-", master=master, shuffle_partitions=2,
                                    state_store=args.state_store), app_name="kafka-monitor-bench")
    results = []
    try:
        for size, archive in [(z, a) for z in args.sizes
                              for a in ([True, False] if args.archive == "both" else [args.archive == "on"])]:
            n_parts, n_pairs = (int(x) for x in size.split(":"))
            runs = []
            for r in range(args.runs):
                print(f"[bench] {n_parts} partitions, {n_pairs} group/partitions{', archive on' if archive else ''}: "
                      f"run {r + 1}/{args.runs}", file=sys.stderr, flush=True)
                runs.append(one_run(spark, n_parts, n_pairs, args.backlog_cycles, args.steady_cycles, args.cycle_s,
                                   args.trigger_s, args.active, snapshot_cycles, args.scrape_rate,
                                   source=args.source, cluster=cluster, archive=archive, encoding=args.encoding,
                                   idle_groups=args.idle_groups, isr_every=args.isr_every))
                print(f"[bench]   {runs[-1]}", file=sys.stderr, flush=True)
            med = {k: (statistics.median(x[k] for x in runs)
                       if all(isinstance(x[k], (int, float)) for x in runs) else None)
                   for k in runs[0]}
            med["phase_median_s"] = {k: statistics.median(x["phase_median_s"].get(k, 0) for x in runs)
                                     for k in runs[0]["phase_median_s"]}
            med["breakdown"] = {k: statistics.median(x["breakdown"].get(k, 0) for x in runs)
                                for k in runs[0]["breakdown"]}
            med["archive"] = archive
            med["runs"] = runs
            results.append(med)
    finally:
        stop_spark(spark)
        if cluster is not None:
            cluster.stop()
        if made_times:
            pathlib.Path(made_times).unlink(missing_ok=True)
    print(f"{'partitions':>10} {'grp/parts':>9} {'archive':>7} {'drain ev/s':>10} {'(running)':>10} {'rows/bat':>8} {'p50 s':>6} "
          f"{'p95 s':>6} {'JVM MB':>7} {'py MB':>7}")
    for m in results:
        f = lambda v, fmt: format(v, fmt) if v is not None else "-"  # noqa: E731
        print(f"{m['partitions']:>10} {m['group_partitions']:>9} {'on' if m['archive'] else 'off':>7} "
              f"{f(m['drain_events_per_s'], '>10.0f')} "
              f"{f(m['drain_after_first_batch_events_per_s'], '>10.0f')} {f(m['steady_rows_per_batch'], '>8.0f')} "
              f"{f(m['batch_p50_s'], '>6.2f')} {f(m['batch_p95_s'], '>6.2f')} {f(m['jvm_peak_rss_mb'], '>7.0f')} "
              f"{f(m['python_workers_peak_rss_mb'], '>7.0f')}")
    report.write(args.out, "job", args=vars(args), results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
