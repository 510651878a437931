"""End-to-end benchmark: the probe and the job together at scale (issue 18.5).

    librdkafka's mock cluster (3 brokers, its own process; topics of 100 partitions, every
    partition also in a consumer group, as bench/probe_bench.py sets them up; ``--group-share``
    for fewer)
      -> the probe (its own process, ``Probe.run()`` at ``--interval``)
      -> the events topic on the mock cluster
      -> the job (this process: Spark local[2], the default trigger of 5 s) -> its exporter

After ``--warmup`` seconds (the probe's bootstrap cycles, the job's first batches), for
``--measure`` seconds:

- the probe's rate: events the job read per second (counted by reading the batches' records
  back: a contract v3 record stands for many), and the probe's cycle duration (its
  heartbeats' ``cycle_duration_ms``, as ``kafka_monitor_source_cycle_duration_seconds`` shows);
- the job's batch times (``triggerExecution`` of each batch with input) and how far behind the
  events topic it is at each batch (``kafka_monitor_job_events_behind``);
- the delay from observation to ``/metrics``: for every heartbeat, from its event time (the
  probe makes it right after the cycle's observations) to the moment the exporter serves it
  (``kafka_monitor_source_last_heartbeat_timestamp_seconds`` changes; polled every 0.1 s); and
  the same from the cycle's start (+ its ``cycle_duration_ms``): the first observations' age;
  and how fast that delay grows (its least-squares slope, s per minute: level when the path
  keeps up; give ``--measure 300`` or more to tell).

Everything runs on this machine's 2 cores at once: the figures are the system's, contention
included.  Results: ``bench/results/e2e.json``.

    python bench/e2e_bench.py                       # 100,000 partitions, 1 run
    python bench/e2e_bench.py --partitions 10000 --runs 3
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402  (bench/report.py)
from probe_bench import (EVENTS_TOPIC, GROUP_TOPICS, TOPIC_PARTITIONS, MockClusterProcess,  # noqa: E402
                         _groups, answer_groups, commit_groups)


def probe_child(bootstrap: str, n_group_topics: int, interval_s: float) -> int:
    """The probe as ``kafka-monitor probe`` runs it, with the group listing the mock lacks
    answered as bench/probe_bench.py does; stops on SIGTERM."""
    from monitor.probe import Probe
    from monitor.probe_config import ProbeConfig
    probe = Probe(ProbeConfig(bootstrap_servers=bootstrap, interval_s=interval_s, source="e2e-probe",
                              cluster="bench", topics_include="^bench-", request_timeout_s=120))
    answer_groups(probe, _groups(n_group_topics, GROUP_TOPICS))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        probe.run(stop)
    finally:
        probe.close(flush_timeout=5)
    return 0


def events_read(bootstrap: str, batches: list[dict], timeout_s: float = 300.0) -> int:
    """The events in the records ``batches`` read (the probe sends a topic's offsets as one contract
    v3 record: it stands for its ``rows``), counted by reading those records back."""
    import json

    from confluent_kafka import Consumer, TopicPartition

    from job_bench import batch_spans
    from monitor.contract import SCHEMA_V3

    spans: dict[int, tuple[int, int]] = {}
    for p in batches:
        for part, (lo, hi) in batch_spans(p).items():
            a, b = spans.get(part, (lo, hi))
            spans[part] = (min(a, lo), max(b, hi))
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e-bench-count", "enable.auto.commit": False})
    total, deadline = 0, time.monotonic() + timeout_s
    try:
        for part, (lo, hi) in sorted(spans.items()):
            c.assign([TopicPartition(EVENTS_TOPIC, part, lo)])
            at = lo
            while at < hi:
                assert time.monotonic() < deadline, f"{EVENTS_TOPIC}/{part}: could not read back to {hi}"
                for m in c.consume(1000, timeout=2):
                    if m.error():
                        continue
                    if m.offset() >= hi:
                        at = hi
                        break
                    v = json.loads(m.value())
                    rows = v.get("rows") if v.get("schema") == SCHEMA_V3 else None
                    total += len(next(iter(rows.values()))) if rows else 1
                    at = m.offset() + 1
    finally:
        c.close()
    return total


def trend_per_min(at_s: list[float], ys: list[float]) -> float | None:
    """The least-squares slope of ``ys`` over their times ``at_s`` (s), per minute: how fast the
    delay grows (a path that keeps up holds it level)."""
    if len(ys) < 3:
        return None
    try:
        return 60 * statistics.linear_regression(at_s, ys).slope
    except statistics.StatisticsError:  # all at one time
        return None


def quantile(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else None


def one_run(spark, n_partitions: int, interval_s: float, warmup_s: float, measure_s: float,
            group_share: float = 1.0) -> dict:
    from streaming.sinks.exporter import Exporter
    from streaming.job import JobConfig, start, stop_query

    n_topics = max(1, n_partitions // TOPIC_PARTITIONS)
    n_group_topics = max(1, round(n_topics * group_share))  # the first ones: groups of GROUP_TOPICS topics
    mc = MockClusterProcess(n_topics, TOPIC_PARTITIONS)
    work = tempfile.mkdtemp(prefix="km-e2e-")
    child = q = exporter = None
    try:
        groups = commit_groups(mc.bootstrap, n_group_topics, GROUP_TOPICS)
        child = subprocess.Popen([sys.executable, __file__, "--probe-child", mc.bootstrap, str(n_group_topics),
                                  str(interval_s)])
        cfg = JobConfig(bootstrap_servers=mc.bootstrap, checkpoint_dir=f"{work}/ckpt", events_topic=EVENTS_TOPIC,
                        alerts_topic="", metrics_port=0)
        exporter = Exporter(max_series=10_000_000)
        q = start(spark, cfg, exporter, query_name=f"e2e-{n_partitions}")
        # not registry.get_sample_value: it collects every partition's series (~4 CPU-s at 300,000
        # partitions), and polled every 0.1 s it took a core and the driver's GIL from the job
        get = exporter.sample
        labels = {"cluster": "bench", "source": "e2e-probe"}
        t_end_warm = time.monotonic() + warmup_s
        while time.monotonic() < t_end_warm:
            assert q.exception() is None, q.exception()
            assert child.poll() is None, f"the probe exited ({child.returncode})"
            time.sleep(0.5)
        first_batch = max((p["batchId"] for p in q.recentProgress), default=-1)
        delays, seen_at, cycles, behind = [], [], [], []
        last_hb = get("kafka_monitor_source_last_heartbeat_timestamp_seconds", labels)
        t_end = time.monotonic() + measure_s
        while time.monotonic() < t_end:
            hb = get("kafka_monitor_source_last_heartbeat_timestamp_seconds", labels)
            if hb is not None and hb != last_hb:
                delays.append(time.time() - hb)
                seen_at.append(time.monotonic())
                cycles.append(get("kafka_monitor_source_cycle_duration_seconds", labels))
                behind.append(get("kafka_monitor_job_events_behind", {}))
                last_hb = hb
            time.sleep(0.1)
        assert q.exception() is None, q.exception()
        batches = [p for p in q.recentProgress if p["batchId"] > first_batch and p["numInputRows"] > 0]
        events = events_read(mc.bootstrap, batches)
    finally:
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
        if q is not None:
            stop_query(q)
        if exporter is not None:
            exporter.shutdown()
        mc.stop()
        shutil.rmtree(work, ignore_errors=True)  # the job's checkpoint: ~150 MB at 300,000 partitions
    durations = [p["durationMs"]["triggerExecution"] / 1000.0 for p in batches]
    records = sum(p["numInputRows"] for p in batches)
    span = sum(durations)
    cyc = [c for c in cycles if c is not None]
    starts = [d + c for d, c in zip(delays, cycles) if c is not None]
    return {
        "partitions": n_topics * TOPIC_PARTITIONS,
        "group_partitions": sum(len(v) for v in groups.values()),
        "interval_s": interval_s,
        "heartbeats_measured": len(delays),
        "probe_cycle_s_p50": statistics.median(cyc) if cyc else None,
        "probe_cycle_s_max": max(cyc) if cyc else None,
        "events_read_per_s": events / measure_s,
        "records_read_per_s": records / measure_s,
        "job_batches": len(durations),
        "job_batch_s_p50": statistics.median(durations) if durations else None,
        "job_batch_s_p95": quantile(durations, 0.95),
        "job_records_per_batch_p50": statistics.median(p["numInputRows"] for p in batches) if batches else None,
        "job_events_per_batch_mean": events / len(batches) if batches else None,
        "job_busy_share": span / measure_s,
        "job_events_behind_max": max((b for b in behind if b is not None), default=None),
        "delay_s_p50": statistics.median(delays) if delays else None,
        "delay_s_p95": quantile(delays, 0.95),
        "delay_s_max": max(delays) if delays else None,
        # > 0: the delay grows, the path falls behind (watch it over --measure 300 or more)
        "delay_trend_s_per_min": trend_per_min(seen_at, delays),
        # from the cycle's start (its first observations) instead: + the cycle's duration
        "delay_from_cycle_start_s_p50": statistics.median(starts) if starts else None,
        "delay_from_cycle_start_s_p95": quantile(starts, 0.95),
        "delays_s": delays,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--probe-child":
        return probe_child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[100_000])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--interval", type=float, default=10.0, help="the probe's interval_s (default 10, its default)")
    ap.add_argument("--warmup", type=float, default=90.0, help="seconds before measuring (default 90)")
    ap.add_argument("--measure", type=float, default=180.0, help="seconds measured (default 180)")
    ap.add_argument("--group-share", type=float, default=1.0,
                    help="share of the topics a consumer group commits on (default 1: every partition is "
                         "a group partition too; 0.1 is the issue 50 sizing, 300,000 + 30,000)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "e2e.json"))
    args = ap.parse_args()
    from streaming.job import JobConfig, spark_session, stop_spark
    spark = spark_session(JobConfig(bootstrap_servers="-", checkpoint_dir="-", master="local[2]", shuffle_partitions=2),
                          app_name="kafka-monitor-e2e-bench")
    results = []
    try:
        for n in args.partitions:
            runs = []
            for r in range(args.runs):
                print(f"[bench] {n} partitions: run {r + 1}/{args.runs}", file=sys.stderr, flush=True)
                res = one_run(spark, n, args.interval, args.warmup, args.measure, args.group_share)
                runs.append(res)
                print(f"[bench]   { {k: v for k, v in res.items() if k != 'delays_s'} }", file=sys.stderr, flush=True)
            keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and k != "delays_s"]
            med = {k: statistics.median(x[k] for x in runs if x[k] is not None) for k in keys}
            med["runs"] = runs
            results.append(med)
    finally:
        stop_spark(spark)
    for m in results:
        print(f"{m['partitions']:>8.0f} partitions: probe cycle p50 {m.get('probe_cycle_s_p50', 0):.1f} s, "
              f"{m['events_read_per_s']:.0f} events/s read; job batch p50 {m['job_batch_s_p50']:.1f} s "
              f"(p95 {m['job_batch_s_p95']:.1f}); observation -> /metrics p50 {m['delay_s_p50']:.1f} s, "
              f"p95 {m['delay_s_p95']:.1f} s, trend {m.get('delay_trend_s_per_min', float('nan')):+.2f} s/min")
    report.write(args.out, "e2e", args=vars(args), results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
