"""Where the job's time goes, stage by stage (issue 50): µs per event for the read, decode +
gate, the shuffle into buckets, the state function (no-op, then the rules) and the sink.

Per size (partitions; group partitions = a tenth of them, as the issue's 300k + 30k) a Tansu
events topic holds ``--cycles`` observation cycles as the probe sends them
(``job_bench.cycle_events``). Each stage is a query of its own that drains the whole topic from
a new checkpoint, at most the largest cycle's events per micro-batch (the first cycle, with
every partition's metadata; ``maxOffsetsPerTrigger``, batches back to back), each
stage being the one before it plus one step:

    read         the job's source; the rows written to Spark's ``noop`` sink (every column, no pruning)
    parse        + decode, the quality gate, and the rows the state takes packed per bucket (``mapInArrow``)
    shuffle      + the packed rows shuffled into Spark's partitions by bucket
    state-noop   + ``applyInPandasWithState`` with a state function that takes its frames and
                 emits and stores nothing (the framework's floor, as ``job_bench.py --state noop``)
    state-rules  the same with the job's state function
    sink         + the job's foreachBatch sink (the exporter and the quarantine; no alerts topic)

The figure is the batches' ``triggerExecution`` summed over the events they read, the first batch
left out (it pays the state's creation and the workers' start); a stage's own cost is its figure
minus the one before.  Beside it, over the whole query: the machine's CPU-µs per event (every
process: broker, JVM, Python workers) and the share of the cores busy.  Each size is measured
with the events as one record each (``v1``) and as contract v3's ``rows`` (``--encoding``).
Stages are interleaved in each run; the table gives the median of ``--runs``; events/s is
10^6 / µs per event. Beside the parse stage: decode + gate alone on one steady cycle's records
in this process (no Spark, nothing crosses).

    python bench/stage_bench.py                          # 100k and 300k partitions, both encodings, 3 runs
    python bench/stage_bench.py --sizes 10000 --runs 1   # a quick look

Prints a table and writes bench/results/stages.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import job_bench as jb  # noqa: E402
import report  # noqa: E402
from kafka_monitor.local.broker import TansuBroker, create_topics  # noqa: E402
from streaming import job  # noqa: E402
from streaming.state import function as state_function  # noqa: E402

TOPIC = jb.EVENTS_TOPIC
STAGES = ("read", "parse", "shuffle", "state-noop", "state-rules", "sink")


def _noop_write(df, _batch_id) -> None:
    df.write.format("noop").mode("overwrite").save()


def drain(spark, cfg: job.JobConfig, stage: str, work: str, ends: dict[str, int],
          counts: "jb.EventCounts | None" = None) -> dict:
    """One stage's query over the whole topic; its batches' figures."""
    from streaming.sinks.batch import ExporterSink
    from streaming.sinks.exporter import Exporter
    from streaming.sinks.quarantine import QuarantineFiles

    cfg = dataclasses.replace(cfg, checkpoint_dir=f"{work}/ckpt-{uuid.uuid4().hex[:8]}")
    d = job.read_events(spark, cfg)
    if stage != "read":
        d = job.packed(d, cfg)
    if stage == "shuffle":
        d = d.repartition(int(spark.conf.get("spark.sql.shuffle.partitions")), "bucket")
    elif stage in ("state-noop", "state-rules", "sink"):
        real = state_function.make_state_function
        if stage == "state-noop":
            state_function.make_state_function = jb.noop_state_function
        try:
            d = job.stateful(d, cfg)
        finally:
            state_function.make_state_function = real
    exporter = None
    target = _noop_write
    if stage == "sink":
        exporter = Exporter(max_series=10_000_000)
        exporter.set_notify_holds(cfg.rule_configs()["notify"].holds_s())
        target = ExporterSink(exporter, None, QuarantineFiles(f"{cfg.checkpoint_dir}-quarantine", 256 << 20), None)
    w = d.writeStream.foreachBatch(target).option("checkpointLocation", cfg.checkpoint_dir)
    if stage.startswith("state") or stage == "sink":
        w = w.outputMode("update")
    # (availableNow would read it all in one batch: the source's read limit is not applied then)
    busy0, t0 = _busy_s(), time.monotonic()
    q = job.start_query(lambda: w.trigger(processingTime="0 seconds").start())
    try:
        jb.wait_processed(q, ends)
        busy, wall = _busy_s() - busy0, time.monotonic() - t0
        batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    finally:
        job.stop_query(q)  # between batches: a stop within one only logs Spark's interrupted broadcast
        if exporter is not None:
            exporter.shutdown()
    later = batches[1:]
    rows = sum(counts.between(p) if counts is not None else p["numInputRows"] for p in later)
    secs = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000.0
    add = sum(p["durationMs"].get("addBatch", 0) for p in later) / 1000.0
    every = sum(counts.between(p) if counts is not None else p["numInputRows"] for p in batches)
    return {"batches": len(batches), "rows": rows, "s": secs, "us_per_event": secs / rows * 1e6 if rows else None,
            "add_batch_us_per_event": add / rows * 1e6 if rows else None,
            # the whole query, first batch included: the machine's CPU, and its share of the cores
            "cpu_us_per_event": busy / every * 1e6 if every else None, "cores_busy": busy / wall / os.cpu_count()}


def _busy_s() -> float:
    """The machine's busy CPU seconds so far (every process: the broker, the JVM, its Python workers)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def parse_in_python(records: list, events: int, runs: int = 3) -> float:
    """µs per event of decode + gate alone, in this process (no Spark, no crossing): the Python
    share of the parse stage.  Arrow batches of 10,000 rows (Spark's maxRecordsPerBatch), as
    ``mapInArrow`` hands them over."""
    import pyarrow as pa

    from streaming.ingest import parsing, quality

    quality.warm_up()
    now = int(time.time() * 1000)
    batches = [pa.RecordBatch.from_arrays([pa.array([r[1].decode() for r in records[i:i + 10_000]], pa.string()),
                                           pa.array([now] * len(records[i:i + 10_000]), pa.int64())],
                                          names=["value", "timestamp"]) for i in range(0, len(records), 10_000)]
    took = []
    for _ in range(runs):
        c = time.process_time()
        for _b in parsing.parse_batches(iter(batches)):
            pass
        took.append(time.process_time() - c)
    return statistics.median(took) / events * 1e6


def size(spark, n_parts: int, args, out: list) -> None:
    for encoding in args.encoding:
        one_encoding(spark, n_parts, encoding, args, out)


def one_encoding(spark, n_parts: int, encoding: str, args, out: list) -> None:
    n_pairs = n_parts // 10
    work = tempfile.mkdtemp(prefix="km-stage-bench-")
    with TansuBroker() as broker:
        create_topics(broker.bootstrap, {TOPIC: jb.EVENTS_PARTITIONS})
        t0 = int(time.time() * 1000) - args.cycles * 10_000
        per_cycle = 0
        python_parse = 0.0
        counts = jb.EventCounts() if encoding == "rows" else None
        for c in range(args.cycles):
            events = jb.cycle_events(n_parts, n_pairs, c, t0 + c * 10_000)
            records = jb.serialize_rows(events) if counts is not None else jb.serialize(events)
            if c == 1:  # a steady cycle, as the measured batches are
                python_parse = parse_in_python(records, len(events))
            per_cycle = max(per_cycle, len(records))
            jb.produce(broker.bootstrap, TOPIC, records, counts)
            print(f"[stage-bench] {n_parts:,} partitions: cycle {c + 1}/{args.cycles} written "
                  f"({len(events):,} events in {len(records):,} records)", file=sys.stderr, flush=True)
        cfg = job.JobConfig(bootstrap_servers=broker.bootstrap, checkpoint_dir=work, events_topic=TOPIC,
                            alerts_topic="", max_offsets_per_trigger=per_cycle, metrics_port=0)
        ends = jb.end_offsets(broker.bootstrap, TOPIC)
        drain(spark, cfg, "read", work, ends, counts)  # the session's first query: its workers' start, not counted
        runs: dict[str, list[dict]] = {s: [] for s in args.stages}
        for r in range(args.runs):
            for s in args.stages:
                runs[s].append(drain(spark, cfg, s, work, ends, counts))
            print(f"[stage-bench] {n_parts:,} partitions ({encoding}), run {r + 1}/{args.runs}: "
                  + ", ".join(f"{s} {m[-1]['us_per_event']:.1f} ({m[-1]['cpu_us_per_event']:.1f} CPU, "
                              f"{m[-1]['cores_busy']:.0%} busy)" for s, m in runs.items()) + " µs/event",
                  file=sys.stderr, flush=True)
    shutil.rmtree(work, ignore_errors=True)
    before = None
    for s in args.stages:
        us = statistics.median(m["us_per_event"] for m in runs[s])
        out.append({"partitions": n_parts, "group_partitions": n_pairs, "encoding": encoding,
                    "records_per_cycle": per_cycle, "stage": s,
                    "us_per_event": round(us, 2), "stage_us_per_event": round(us - before, 2) if before is not None
                    else round(us, 2), "events_per_s": round(1e6 / us),
                    "add_batch_us_per_event": round(statistics.median(m["add_batch_us_per_event"] for m in runs[s]), 2),
                    "runs_us_per_event": [round(m["us_per_event"], 2) for m in runs[s]],
                    "cpu_us_per_event": round(statistics.median(m["cpu_us_per_event"] for m in runs[s]), 2),
                    "cores_busy": round(statistics.median(m["cores_busy"] for m in runs[s]), 2),
                    "measured_rows": runs[s][0]["rows"], "batches": runs[s][0]["batches"],
                    **({"python_only_us_per_event": round(python_parse, 2)} if s == "parse" else {})})
        before = us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000], help="partitions (default: %(default)s)")
    ap.add_argument("--cycles", type=int, default=3, help="cycles in the topic; the first batch is not counted "
                                                          "(default: %(default)s)")
    ap.add_argument("--runs", type=int, default=3, help="runs of every stage, interleaved (default: %(default)s)")
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    ap.add_argument("--encoding", nargs="+", choices=["v1", "rows"], default=["v1", "rows"],
                    help="the events as records: one each (v1/v2), or contract v3's rows, a cycle's events of one "
                         "type and topic in one record (job_bench.py --encoding); each in turn (default: %(default)s)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "stages.json"))
    args = ap.parse_args()
    spark = job.spark_session(job.JobConfig(bootstrap_servers="unused:9092", checkpoint_dir=tempfile.gettempdir()))
    results: list = []
    try:
        for n in args.sizes:
            size(spark, n, args, results)
    finally:
        job.stop_spark(spark)
    print(f"{'partitions':>10} {'encoding':<8} {'stage':<12} {'µs/event':>9} {'stage µs':>9} {'events/s':>9} "
          f"{'CPU-µs':>7} {'busy':>5} {'runs µs/event'}")
    for m in results:
        print(f"{m['partitions']:>10,} {m['encoding']:<8} {m['stage']:<12} {m['us_per_event']:>9.1f} "
              f"{m['stage_us_per_event']:>9.1f} {m['events_per_s']:>9,} {m['cpu_us_per_event']:>7.1f} "
              f"{m['cores_busy']:>5.0%} {m['runs_us_per_event']}")
        if "python_only_us_per_event" in m:
            print(f"{'':>10} {'(decode + gate in this process, no Spark)':<42} {m['python_only_us_per_event']:.1f} µs/event")
    report.write(args.out, "stages", args=vars(args), results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
