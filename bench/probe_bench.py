"""Probe benchmark: events per second and CPU time per 1,000 partitions per observation cycle.

Runs the probe against librdkafka's mock cluster (3 brokers, in this process) with 1,000 and
10,000 partitions, a consumer group that committed on every partition, and the events topic on
the same mock cluster.  Each cycle is one metadata refresh + committed offsets + watermarks +
events; the figures are the medians over the cycles of a run, and the medians over runs.

    python bench/probe_bench.py                 # 1,000 and 10,000 partitions, 3 runs x 5 cycles
    python bench/probe_bench.py --partitions 1000 --runs 5

Prints a table and writes bench/results/probe.json.  CPU time is the whole process's
(Python + librdkafka threads; the mock brokers run in-process too, so it is an upper bound).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

import report  # noqa: E402  (bench/report.py)
from monitor.probe import Probe, ProbeConfig  # noqa: E402
from tests.support.mock_cluster import MockCluster  # noqa: E402

TOPIC_PARTITIONS = 100  # partitions per topic: 1,000 partitions = 10 topics


def one_run(n_partitions: int, cycles: int) -> dict:
    with MockCluster(brokers=3) as mc:
        topics = [f"bench-{i}" for i in range(max(1, n_partitions // TOPIC_PARTITIONS))]
        for t in topics:
            mc.create_topic(t, TOPIC_PARTITIONS, 3)
        mc.create_topic("kafka-monitor.events", 6, 3)
        c = Consumer({"bootstrap.servers": mc.bootstrap, "group.id": "bench-group", "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(t, p, 0) for t in topics for p in range(TOPIC_PARTITIONS)],
                 asynchronous=False)
        c.close()
        probe = Probe(ProbeConfig(bootstrap_servers=mc.bootstrap, interval_s=3600, source="bench",
                                  cluster="bench", topics_include="^bench-", request_timeout_s=60))
        walls, cpus, evs = [], [], []
        try:
            probe.cycle()  # warm-up: connections, first metadata
            probe.emitter.flush(60)
            for _ in range(cycles):
                seq0 = probe.emitter._seq
                w0, c0 = time.perf_counter(), time.process_time()
                probe.cycle()
                probe.emitter.flush(60)
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
                evs.append(probe.emitter._seq - seq0)
        finally:
            probe.close()
    n = len(topics) * TOPIC_PARTITIONS
    return {
        "partitions": n,
        "events_per_cycle": statistics.median(evs),
        "cycle_wall_s": statistics.median(walls),
        "events_per_s": statistics.median(e / w for e, w in zip(evs, walls)),
        "cpu_s_per_1000_partitions_per_cycle": statistics.median(c / (n / 1000) for c in cpus),
        "dropped": probe.emitter.dropped,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "probe.json"))
    args = ap.parse_args()
    results = []
    for n in args.partitions:
        runs = []
        for r in range(args.runs):
            print(f"[bench] {n} partitions, run {r + 1}/{args.runs} ...", file=sys.stderr, flush=True)
            runs.append(one_run(n, args.cycles))
        med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        med["runs"] = runs
        results.append(med)
    print(f"{'partitions':>10} {'events/cycle':>12} {'cycle s':>8} {'events/s':>9} {'CPU s/1k part/cycle':>20}")
    for m in results:
        print(f"{m['partitions']:>10} {m['events_per_cycle']:>12.0f} {m['cycle_wall_s']:>8.3f} "
              f"{m['events_per_s']:>9.0f} {m['cpu_s_per_1000_partitions_per_cycle']:>20.4f}")
    report.write(args.out, "probe", runs=args.runs, cycles=args.cycles, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
