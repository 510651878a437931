"""Read stage of each source (issue 30): why Spark's kafka source makes a steady batch longer.

One probe cycle at 100,000 partitions and 10,000 group partitions (~128k events, the scale-out
bench's steady batch) sits in a 6-partition events topic; each source reads all of it as one
micro-batch (trigger availableNow, a new checkpoint each time) and a foreachBatch counts it:
"read" is the source alone, "parse" adds the job's parse(). The figure is the batch's addBatch
(the tasks plus the count), median of ``--runs``, sources interleaved in one sitting.

    python bench/source_read_bench.py                   # Tansu, then the 3-broker Apache Kafka cluster
    python bench/source_read_bench.py --brokers tansu   # Tansu only

``--fetch`` adds two settings of the Java client's fetch sizes for Spark's source (256 KiB and
32 MiB per partition) to see whether the gap is the network's or the CPU's.

Prints a table and writes bench/results/source-read.json.
"""

from __future__ import annotations

import argparse
import os
import pathlib
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
from kafka_monitor.spark_cluster import ensure_spark_kafka  # noqa: E402
from streaming import job  # noqa: E402

TOPIC = "kafka-monitor.events"
FETCH = {"default": {}, "fetch-256k": {"max.partition.fetch.bytes": str(256 << 10)},
         "fetch-32m": {"max.partition.fetch.bytes": str(32 << 20), "fetch.max.bytes": str(128 << 20)}}


def one(spark, cfg: job.JobConfig, stage: str, tmp: str) -> tuple[int, float]:
    d = job.read_events(spark, cfg)
    if stage == "parse":
        d = job.parse(d, cfg)
    q = (d.writeStream.foreachBatch(lambda df, _: df.count()).trigger(availableNow=True)
         .option("checkpointLocation", f"{tmp}/ck-{uuid.uuid4().hex}").start())
    q.awaitTermination()
    p = [x for x in q.recentProgress if x["numInputRows"]][0]
    return p["numInputRows"], p["durationMs"]["addBatch"] / 1000


def sitting(broker_kind: str, args, results: list) -> None:
    if broker_kind == "kafka":
        from kafka_monitor.local.kafka_cluster import KafkaCluster
        broker = KafkaCluster().start()
        bootstrap, stop = broker.bootstrap_servers, broker.stop
        broker.create_topic(TOPIC, replica_assignment=[[1], [2], [3], [1], [2], [3]])
    else:
        tansu = TansuBroker().start()
        bootstrap, stop = tansu.bootstrap, tansu.stop
        create_topics(bootstrap, {TOPIC: 6})
    tmp = tempfile.mkdtemp(prefix="km-source-bench-")
    cells = [("python", "default", s) for s in ("read", "parse")] + [("spark-kafka", "default", s) for s in ("read", "parse")]
    if args.fetch:
        cells += [("spark-kafka", f, "read") for f in ("fetch-256k", "fetch-32m")]
    times: dict[tuple, list[float]] = {c: [] for c in cells}
    rows = 0
    try:
        events = jb.cycle_events(100_000, 10_000, 1, int(time.time() * 1000))
        jb.produce(bootstrap, TOPIC, jb.serialize(events))
        cfg = lambda src, fetch: job.JobConfig(bootstrap_servers=bootstrap, checkpoint_dir=tmp, events_topic=TOPIC,  # noqa: E731
                                              source=src, shuffle_partitions=2, kafka=dict(FETCH[fetch]))
        spark = job.spark_session(cfg("python", "default"))
        for cell in cells:  # a first batch per cell pays the Python workers' start: not counted
            one(spark, cfg(cell[0], cell[1]), cell[2], tmp)
        for r in range(args.runs):
            for cell in cells:
                rows, s = one(spark, cfg(cell[0], cell[1]), cell[2], tmp)
                times[cell].append(s)
            print(f"[source-bench] {broker_kind} run {r + 1}/{args.runs}: "
                  + ", ".join(f"{'/'.join(c)} {t[-1]:.2f}s" for c, t in times.items()), file=sys.stderr, flush=True)
    finally:
        stop()
    results += [{"broker": broker_kind, "source": c[0], "fetch": c[1], "stage": c[2], "rows": rows,
                 "median_s": statistics.median(t), "runs_s": [round(x, 3) for x in t]} for c, t in times.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", nargs="+", choices=("tansu", "kafka"), default=["tansu", "kafka"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--fetch", action="store_true", help="also Spark's source with other fetch sizes")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "source-read.json"))
    args = ap.parse_args()
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(map(str, ensure_spark_kafka()))} pyspark-shell"
    results: list = []
    for b in args.brokers:  # one session for all: its settings do not depend on the broker
        sitting(b, args, results)
    print(f"{'broker':<6} {'source':<12} {'fetch':<11} {'stage':<6} {'rows':>7} {'median s':>8} {'us/row':>7}")
    for m in results:
        print(f"{m['broker']:<6} {m['source']:<12} {m['fetch']:<11} {m['stage']:<6} {m['rows']:>7} "
              f"{m['median_s']:>8.2f} {m['median_s'] / m['rows'] * 1e6:>7.1f}")
    report.write(args.out, "source-read", args=vars(args), results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
