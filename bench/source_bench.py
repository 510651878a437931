"""Source benchmark: do records come back faster as Arrow batches than as tuples from the Python
Kafka data source (streaming/read/source.py), and by how much?

PySpark's Python data source API lets ``read()`` yield either tuples/Rows or
``pyarrow.RecordBatch`` objects.  The job's source (format ``kafka-monitor-kafka``) builds Arrow
batches column-wise (``streaming.read.source.read_range``).  This benchmark starts a Tansu broker,
writes N events of the job's real mix (``bench/job_bench.py``: cycle_events + produce, lz4,
~340-byte JSON values) into a 6-partition topic and reads them back two ways:

(a) in-process, no Spark, one consumer over all partitions; per record:

    consume        the read loop with consume() and its offset/EOF bookkeeping, no conversion
    arrow          streaming.read.source.read_range as is (Arrow batches of 20,000 rows)
    tuples         the same loop yielding one tuple per record (defined here, mirrors read_range)
    tuples+spark   tuples fed through PySpark's own tuples -> Arrow conversion
                   (pyspark.sql.worker.plan_data_source_read.records_to_arrow_batches, 10,000
                   rows per batch): what Spark's Python worker adds when read() yields tuples

(b) through Spark (local[2], shuffle partitions 2, UI off; streaming.job.spark_session): a
    streaming query over the same records, spark.readStream with trigger(availableNow=True) and a
    foreachBatch sink that runs agg(count, sum(length(value)), sum(length(key)), ...) so every
    column reaches the JVM; ``maxTasks`` = the default parallelism, as the job sets it.  (The
    Python source does not implement Trigger.AvailableNow, so Spark falls back to one batch of
    everything available, as Trigger.Once does: the whole topic is one micro-batch.)

        arrow          format kafka-monitor-kafka (the real source)
        tuples         a subclass whose reader's read() yields tuples (defined here)

    Timed end to end (query start() -> awaitTermination()), and Spark's own addBatch time (the
    read + the aggregation) of the one data batch; plus the CPU time the JVM and the Python
    workers (where read() runs) spent during the query, read from /proc (less sensitive to the
    load of other processes than wall time).

The in-process wall time also waits for the broker (librdkafka fetches in its own threads while
the loop converts), so the process's CPU time per record is given too: the variants differ only
in the conversion, and CPU time shows that difference even when the fetches hide it.

Each run starts a new consumer / a new query (fresh checkpoint).  After one discarded warm-up
run of every variant, the variants are run ``--runs`` times interleaved (the order reversed on
every other run), so that load from other processes hits all of them; the figures are min /
median / max, and the ratios are of the medians measured within this one invocation.

    python bench/source_bench.py                        # 200,000 records, 5 runs
    python bench/source_bench.py --records 50000 --runs 3 --skip-spark

Prints a table and writes bench/results/source.json.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402  (bench/report.py)
import job_bench  # noqa: E402  (bench/job_bench.py: cycle_events, produce, end_offsets)
from kafka_monitor.local.broker import TansuBroker, create_topics  # noqa: E402
from streaming.read.source import (  # noqa: E402
    ARROW_SCHEMA, FORMAT, KafkaEventSource, KafkaSourcePartition, KafkaStreamReader, messages_in_range, read_range,
)

TOPIC = "kafka-monitor.events"
TUPLES_FORMAT = FORMAT + "-tuples"
#: spark.sql.execution.arrow.maxRecordsPerBatch's default: the batch size Spark's worker uses
#: when it converts the tuples read() yields to Arrow
SPARK_ARROW_BATCH = 10_000


# -- the tuple variants (the same range loop as streaming.read.source.read_range) ---------------------

def read_range_tuples(part: KafkaSourcePartition, idle_timeout_s: float = 120.0) -> Iterator[tuple]:
    """read_range, yielding one (key, value, topic, partition, offset, timestamp) tuple per
    record instead of appending to columns."""
    topic = part.topic
    for m in messages_in_range(part, idle_timeout_s):
        k, v = m.key(), m.value()
        yield (k.decode("utf-8", "replace") if k is not None else None,
               v.decode("utf-8", "replace") if v is not None else None,
               topic, m.partition(), m.offset(), m.timestamp()[1])


def consume_only(part: KafkaSourcePartition, idle_timeout_s: float = 120.0) -> int:
    """The range loop without building anything: consume() plus the offset/EOF bookkeeping.
    Returns the number of records in range."""
    return sum(1 for _ in messages_in_range(part, idle_timeout_s))


class TupleStreamReader(KafkaStreamReader):
    """The real stream reader (offsets, planning) whose read() yields tuples."""

    def read(self, partition: KafkaSourcePartition) -> Iterator[tuple]:
        return read_range_tuples(partition)


class TupleEventSource(KafkaEventSource):
    @classmethod
    def name(cls) -> str:
        return TUPLES_FORMAT

    def streamReader(self, schema: Any) -> TupleStreamReader:
        return TupleStreamReader(self.options)


# -- (a) in-process ------------------------------------------------------------------------------

def _spark_struct():
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType
    types = {"string": StringType(), "int32": IntegerType(), "int64": LongType()}
    return StructType([StructField(f.name, types[str(f.type)]) for f in ARROW_SCHEMA])


def inprocess_variants(part: KafkaSourcePartition) -> dict[str, Callable[[], tuple[int, int, int]]]:
    """name -> fn() returning (records, sum of offsets, sum of value lengths) for checking."""
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

    struct = _spark_struct()
    source = KafkaEventSource({})

    def consume():
        return consume_only(part), None, None

    def arrow():
        n = 0
        for b in read_range(part):
            n += b.num_rows
        return n, None, None

    def tuples():
        n = 0
        for _ in read_range_tuples(part):
            n += 1
        return n, None, None

    def tuples_spark():
        n = 0
        for b in records_to_arrow_batches(read_range_tuples(part), SPARK_ARROW_BATCH, struct, source):
            n += b.num_rows
        return n, None, None

    return {"consume": consume, "arrow": arrow, "tuples": tuples, "tuples+spark": tuples_spark}


def check_same_records(part: KafkaSourcePartition, expected: int) -> None:
    """The arrow and tuple readers return the same records (count, offsets, value bytes)."""
    import pyarrow.compute as pc
    a_n = a_off = a_len = 0
    for b in read_range(part):
        a_n += b.num_rows
        a_off += pc.sum(b.column("offset")).as_py()
        a_len += pc.sum(pc.utf8_length(b.column("value"))).as_py()
    t_n = t_off = t_len = 0
    for t in read_range_tuples(part):
        t_n += 1
        t_off += t[4]
        t_len += len(t[1])
    if (a_n, a_off, a_len) != (t_n, t_off, t_len) or a_n != expected:
        raise AssertionError(f"readers disagree: arrow {(a_n, a_off, a_len)} tuples {(t_n, t_off, t_len)} "
                             f"expected {expected} records")


def run_inprocess(part: KafkaSourcePartition, n_records: int, runs: int) -> dict:
    variants = inprocess_variants(part)
    names = list(variants)
    out: dict[str, dict[str, list[float]]] = {n: {"wall_s": [], "cpu_s": [], "thread_cpu_s": []} for n in names}
    for r in range(runs + 1):  # run 0: warm-up, discarded
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
            got = variants[name]()[0]
            wall, cpu, tcpu = time.perf_counter() - w0, time.process_time() - c0, time.thread_time() - t0
            if got != n_records:
                raise AssertionError(f"{name}: read {got} records, expected {n_records}")
            label = "warm-up" if r == 0 else f"run {r}/{runs}"
            print(f"[bench] in-process {label} {name:>12}: {wall:6.2f} s wall, "
                  f"{wall / n_records * 1e6:6.2f} us/record, cpu {cpu / n_records * 1e6:6.2f} us/record "
                  f"(main thread {tcpu / n_records * 1e6:6.2f})",
                  file=sys.stderr, flush=True)
            if r > 0:
                out[name]["wall_s"].append(wall)
                out[name]["cpu_s"].append(cpu)
                out[name]["thread_cpu_s"].append(tcpu)
    result = {}
    for name in names:
        w = out[name]["wall_s"]
        c = out[name]["cpu_s"]
        t = out[name]["thread_cpu_s"]
        result[name] = {
            "runs_wall_s": w, "runs_cpu_s": c, "runs_thread_cpu_s": t,
            "us_per_record_min": min(w) / n_records * 1e6,
            "us_per_record_median": statistics.median(w) / n_records * 1e6,
            "us_per_record_max": max(w) / n_records * 1e6,
            "cpu_us_per_record_median": statistics.median(c) / n_records * 1e6,
            "thread_cpu_us_per_record_median": statistics.median(t) / n_records * 1e6,
        }
    return result


# -- (b) Spark -----------------------------------------------------------------------------------

def _cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime + stime, cutime + cstime) of a process, in clock ticks; (0, 0) if it is gone."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0, 0
    return int(f[11]) + int(f[12]), int(f[13]) + int(f[14])


def spark_cpu_s() -> tuple[float, float]:
    """CPU seconds so far of (the JVM, the Python processes below it: the daemons and the
    reused Python workers that run read()).  A worker that exited and was reaped is in its
    daemon's cutime.  Not counted: the Python processes the JVM starts and reaps itself (the
    per-query streaming source runner, ~1 s of CPU each, mostly imports): they are reaped at no
    fixed time, often after the query has returned, and would land in the next query's figure."""
    from pyspark import SparkContext
    jvm = SparkContext._gateway.proc.pid
    hz = os.sysconf("SC_CLK_TCK")
    own, _ = _cpu_ticks(jvm)
    py = sum(sum(_cpu_ticks(p)) for p in job_bench.descendants(jvm))
    return own / hz, py / hz


def spark_one_query(spark, fmt: str, bootstrap: str, ckpt: str, max_tasks: int) -> dict:
    from pyspark.sql import functions as F

    df = (spark.readStream.format(fmt)
          .option("subscribe", TOPIC)
          .option("startingOffsets", "earliest")
          .option("maxTasks", str(max_tasks))
          .option("kafka.bootstrap.servers", bootstrap)
          .load())
    seen: list[dict] = []

    def sink(batch_df, batch_id):
        row = batch_df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("value_chars"),
                           F.sum(F.length("key")).alias("key_chars"), F.sum(F.length("topic")).alias("topic_chars"),
                           F.sum("partition").alias("partitions"), F.sum("offset").alias("offsets"),
                           F.max("timestamp").alias("ts")).collect()[0]
        seen.append(row.asDict())

    jvm0, py0 = spark_cpu_s()
    t0 = time.perf_counter()
    q = (df.writeStream.queryName(f"source-bench-{uuid.uuid4().hex[:6]}").foreachBatch(sink)
         .trigger(availableNow=True).option("checkpointLocation", ckpt).start())
    q.awaitTermination()
    wall = time.perf_counter() - t0
    jvm1, py1 = spark_cpu_s()
    if q.exception() is not None:
        raise RuntimeError(q.exception())
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    return {
        "wall_s": wall,
        "rows": sum(r["n"] for r in seen),
        "value_chars": sum(r["value_chars"] or 0 for r in seen),
        "offsets": sum(r["offsets"] or 0 for r in seen),
        "batches": len(batches),
        "add_batch_s": sum(p["durationMs"].get("addBatch", 0) for p in batches) / 1000.0,
        "jvm_cpu_s": jvm1 - jvm0,
        "python_cpu_s": py1 - py0,
    }


def run_spark(bootstrap: str, n_records: int, runs: int, max_tasks: int | None) -> dict:
    from streaming.job import JobConfig, spark_session, stop_spark

    work = tempfile.mkdtemp(prefix="km-source-bench-")
    spark = spark_session(JobConfig(bootstrap_servers=bootstrap, checkpoint_dir=f"{work}/unused", master="local[2]",
                                    shuffle_partitions=2), app_name="kafka-monitor-source-bench")
    try:
        spark.sparkContext.setLogLevel("ERROR")  # not one "does not support Trigger.AvailableNow" per query
        spark.dataSource.register(KafkaEventSource)
        spark.dataSource.register(TupleEventSource)
        tasks = max_tasks or spark.sparkContext.defaultParallelism
        variants = {"arrow": FORMAT, "tuples": TUPLES_FORMAT}
        names = list(variants)
        out: dict[str, list[dict]] = {n: [] for n in names}
        check = None
        for r in range(runs + 1):  # run 0: warm-up (JVM JIT, Python workers), discarded
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                res = spark_one_query(spark, variants[name], bootstrap, f"{work}/ckpt-{name}-{r}", tasks)
                shutil.rmtree(f"{work}/ckpt-{name}-{r}", ignore_errors=True)
                if res["rows"] != n_records:
                    raise AssertionError(f"spark {name}: {res['rows']} rows, expected {n_records}")
                key = (res["rows"], res["value_chars"], res["offsets"])
                if check is None:
                    check = key
                elif key != check:
                    raise AssertionError(f"spark {name}: read {key}, another run read {check}")
                label = "warm-up" if r == 0 else f"run {r}/{runs}"
                print(f"[bench] spark {label} {name:>6}: {res['wall_s']:6.2f} s end to end, "
                      f"addBatch {res['add_batch_s']:6.2f} s, {res['batches']} batch(es), "
                      f"{res['rows'] / res['wall_s']:8.0f} records/s, cpu: JVM {res['jvm_cpu_s']:5.2f} s, "
                      f"Python {res['python_cpu_s']:5.2f} s", file=sys.stderr, flush=True)
                if r > 0:
                    out[name].append(res)
        result: dict[str, Any] = {"max_tasks": tasks,
                                  "mean_value_bytes": check[1] / check[0] if check and check[0] else None}
        for name in names:
            w = [x["wall_s"] for x in out[name]]
            a = [x["add_batch_s"] for x in out[name]]
            result[name] = {
                "runs": out[name],
                "wall_s_min": min(w), "wall_s_median": statistics.median(w), "wall_s_max": max(w),
                "records_per_s_median": n_records / statistics.median(w),
                "add_batch_s_min": min(a), "add_batch_s_median": statistics.median(a), "add_batch_s_max": max(a),
                "add_batch_records_per_s_median": n_records / statistics.median(a),
                "jvm_cpu_s_median": statistics.median(x["jvm_cpu_s"] for x in out[name]),
                "python_cpu_s_median": statistics.median(x["python_cpu_s"] for x in out[name]),
                "python_cpu_us_per_record_median":
                    statistics.median(x["python_cpu_s"] for x in out[name]) / n_records * 1e6,
            }
        return result
    finally:
        stop_spark(spark)
        shutil.rmtree(work, ignore_errors=True)


# -- main ----------------------------------------------------------------------------------------

def make_events(n: int) -> list:
    """n events of the job's mix: cycles of 1,000 partitions and 1,000 group/partition pairs."""
    evs: list = []
    t0 = int(time.time() * 1000) - 3_600_000
    c = 0
    while len(evs) < n:
        evs.extend(job_bench.cycle_events(1000, 1000, c, t0 + c * 10_000))
        c += 1
    return evs[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000, help="events to write and read back (default 200,000)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs of every variant, after one warm-up (default 5)")
    ap.add_argument("--max-tasks", type=int, default=None,
                    help="the source's maxTasks option in the Spark part (default: Spark's default parallelism, "
                         "as the job sets it)")
    ap.add_argument("--skip-spark", action="store_true", help="only the in-process part")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "source.json"))
    args = ap.parse_args()
    if args.records <= 0 or args.runs <= 0:
        ap.error("--records and --runs must be > 0")

    started = time.perf_counter()
    load_before = os.getloadavg()
    with TansuBroker() as broker:
        create_topics(broker.bootstrap, {TOPIC: job_bench.EVENTS_PARTITIONS})
        print(f"[bench] writing {args.records} events to {TOPIC} on {broker.bootstrap}", file=sys.stderr, flush=True)
        t = time.perf_counter()
        events = make_events(args.records)
        # produce() takes (key, value) records from serialize() (it took the events themselves
        # before job_bench.py had serialize())
        job_bench.produce(broker.bootstrap, TOPIC,
                          job_bench.serialize(events) if hasattr(job_bench, "serialize") else events)
        del events
        ends = job_bench.end_offsets(broker.bootstrap, TOPIC)
        n_read = sum(ends.values())  # the events + produce()'s one pad record per partition
        print(f"[bench] written in {time.perf_counter() - t:.1f} s; end offsets {ends} ({n_read} records)",
              file=sys.stderr, flush=True)
        part = KafkaSourcePartition(TOPIC, sorted((int(p), 0, e) for p, e in ends.items()),
                                    {"bootstrap.servers": broker.bootstrap}, True)
        check_same_records(part, n_read)
        inproc = run_inprocess(part, n_read, args.runs)
        spark = None if args.skip_spark else run_spark(broker.bootstrap, n_read, args.runs, args.max_tasks)
    load_after = os.getloadavg()

    def ratio(a, b):
        return a / b if b else None

    ratios = {
        "inprocess_tuples_over_arrow": ratio(inproc["tuples"]["us_per_record_median"],
                                             inproc["arrow"]["us_per_record_median"]),
        "inprocess_tuples_spark_over_arrow": ratio(inproc["tuples+spark"]["us_per_record_median"],
                                                   inproc["arrow"]["us_per_record_median"]),
        "inprocess_tuples_over_arrow_cpu": ratio(inproc["tuples"]["cpu_us_per_record_median"],
                                                 inproc["arrow"]["cpu_us_per_record_median"]),
        "inprocess_tuples_over_arrow_thread_cpu": ratio(inproc["tuples"]["thread_cpu_us_per_record_median"],
                                                        inproc["arrow"]["thread_cpu_us_per_record_median"]),
        "inprocess_tuples_spark_over_arrow_thread_cpu": ratio(
            inproc["tuples+spark"]["thread_cpu_us_per_record_median"],
            inproc["arrow"]["thread_cpu_us_per_record_median"]),
        "inprocess_tuples_spark_over_arrow_cpu": ratio(inproc["tuples+spark"]["cpu_us_per_record_median"],
                                                       inproc["arrow"]["cpu_us_per_record_median"]),
        # the conversion alone: what each variant costs on top of the bare consume loop, in the
        # main thread's CPU time (wall time also waits for the broker's fetches, and process CPU
        # time includes librdkafka's fetch threads, which vary from run to run)
        "inprocess_conversion_thread_cpu_tuples_over_arrow": ratio(
            inproc["tuples"]["thread_cpu_us_per_record_median"] - inproc["consume"]["thread_cpu_us_per_record_median"],
            inproc["arrow"]["thread_cpu_us_per_record_median"] - inproc["consume"]["thread_cpu_us_per_record_median"]),
        "inprocess_conversion_thread_cpu_tuples_spark_over_arrow": ratio(
            inproc["tuples+spark"]["thread_cpu_us_per_record_median"]
            - inproc["consume"]["thread_cpu_us_per_record_median"],
            inproc["arrow"]["thread_cpu_us_per_record_median"] - inproc["consume"]["thread_cpu_us_per_record_median"]),
    }
    if spark:
        ratios["spark_wall_tuples_over_arrow"] = ratio(spark["tuples"]["wall_s_median"], spark["arrow"]["wall_s_median"])
        ratios["spark_add_batch_tuples_over_arrow"] = ratio(spark["tuples"]["add_batch_s_median"],
                                                            spark["arrow"]["add_batch_s_median"])
        ratios["spark_python_cpu_tuples_over_arrow"] = ratio(spark["tuples"]["python_cpu_s_median"],
                                                             spark["arrow"]["python_cpu_s_median"])
        ratios["spark_jvm_cpu_tuples_over_arrow"] = ratio(spark["tuples"]["jvm_cpu_s_median"],
                                                          spark["arrow"]["jvm_cpu_s_median"])

    print()
    print(f"records read: {n_read} ({args.records} events + {n_read - args.records} pad records), "
          f"{args.runs} runs after a warm-up; load average {load_before[0]:.1f} -> {load_after[0]:.1f} "
          f"on {os.cpu_count()} cpus")
    print()
    f = lambda v: f"{v:.2f}x" if v is not None else "-"  # noqa: E731
    print("(a) in-process, us per record        wall: min  median     max | cpu median: process  main thread")
    for name, m in inproc.items():
        print(f"    {name:<30} {m['us_per_record_min']:7.2f} {m['us_per_record_median']:7.2f} "
              f"{m['us_per_record_max']:7.2f} |             {m['cpu_us_per_record_median']:7.2f}      "
              f"{m['thread_cpu_us_per_record_median']:7.2f}")
    print(f"    median ratio tuples / arrow:        wall {f(ratios['inprocess_tuples_over_arrow'])}, "
          f"process cpu {f(ratios['inprocess_tuples_over_arrow_cpu'])}, "
          f"main thread cpu {f(ratios['inprocess_tuples_over_arrow_thread_cpu'])}")
    print(f"    median ratio tuples+spark / arrow:  wall {f(ratios['inprocess_tuples_spark_over_arrow'])}, "
          f"process cpu {f(ratios['inprocess_tuples_spark_over_arrow_cpu'])}, "
          f"main thread cpu {f(ratios['inprocess_tuples_spark_over_arrow_thread_cpu'])}")
    print(f"    conversion alone (main thread cpu minus consume's): tuples / arrow "
          f"{f(ratios['inprocess_conversion_thread_cpu_tuples_over_arrow'])}, tuples+spark / arrow "
          f"{f(ratios['inprocess_conversion_thread_cpu_tuples_spark_over_arrow'])}")
    if spark:
        print()
        print(f"(b) Spark local[2], streaming (availableNow -> one batch), maxTasks={spark['max_tasks']}, "
              f"mean value {spark['mean_value_bytes']:.0f} bytes")
        print("    end to end s: min  median     max  records/s | addBatch s: min  median     max  records/s"
              " | cpu s median: JVM  Python workers (us/rec)")
        for name in ("arrow", "tuples"):
            m = spark[name]
            print(f"    {name:<7} {m['wall_s_min']:7.2f} {m['wall_s_median']:7.2f} {m['wall_s_max']:7.2f} "
                  f"{m['records_per_s_median']:10.0f} |          {m['add_batch_s_min']:7.2f} "
                  f"{m['add_batch_s_median']:7.2f} {m['add_batch_s_max']:7.2f} {m['add_batch_records_per_s_median']:10.0f}"
                  f" |              {m['jvm_cpu_s_median']:6.2f} {m['python_cpu_s_median']:6.2f} "
                  f"({m['python_cpu_us_per_record_median']:.2f})")
        print(f"    median ratio tuples / arrow: end to end {f(ratios['spark_wall_tuples_over_arrow'])}, "
              f"addBatch {f(ratios['spark_add_batch_tuples_over_arrow'])}, "
              f"Python workers cpu {f(ratios['spark_python_cpu_tuples_over_arrow'])}, "
              f"JVM cpu {f(ratios['spark_jvm_cpu_tuples_over_arrow'])}")

    import confluent_kafka
    import pyarrow
    import pyspark
    report.write(args.out, "source",
                 machine={"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__,
                          "confluent_kafka": confluent_kafka.__version__, "librdkafka": confluent_kafka.libversion()[0],
                          "loadavg_1m_before": load_before[0], "loadavg_1m_after": load_after[0]},
                 args=vars(args), events=args.records, records_read=n_read, inprocess=inproc, spark=spark,
                 ratios=ratios, total_s=time.perf_counter() - started)
    print(f"[bench] {time.perf_counter() - started:.0f} s in all", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
