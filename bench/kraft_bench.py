"""Controller failover and eligible leader replicas: recall and time to ``/metrics`` (issue 47).

The whole monitor on a KRaft cluster with three controllers (``tests/support/kraft_stack.py``:
3 controllers and 3 brokers from the launcher, the probe every second with DescribeQuorum every
second and its ELR watcher, events on a Tansu broker, the Spark job local[2] with a 1 s trigger,
otherwise the job's defaults).  Each repeat, in sequence:

- ``kill``: the active controller SIGKILLed, started again once the job has seen it;
- ``pause``: the active controller SIGSTOPped (past the 1 s election timeout), resumed after;
- ``elr``: broker 2 paused (the ELR topic's ISR [1, 3], at min.insync.replicas 2), then broker 3
  (ISR [1]: 3 is an eligible leader replica), both resumed after.

Ground truth is the fault itself (the controllers) and the cluster's own metadata polled every
0.25 s (the ISR below min).  A condition is detected when ``/metrics`` shows it within
``--limit`` seconds: the new leader (``kafka_monitor_quorum_leader``), QuorumVoterLagging
(``kafka_monitor_alert_active``; the job holds it ``voter_lag_ms``, 15 s), the ELR
(``kafka_monitor_partition_eligible_leader_replicas``).  False alerts: partition and group alerts
and QuorumUnavailable opened during a controller fault (``kafka_monitor_alert_transitions_total``).

    python bench/kraft_bench.py                  # 3 repeats (~6 min on 2 cores)
    python bench/kraft_bench.py --repeats 1 --version 4.4.0

Prints each fault's figures and the medians, and writes bench/results/kraft.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402  (bench/report.py)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="times each fault is made (default 3)")
    ap.add_argument("--version", default=None, help="Kafka version (default: the launcher's, 4.1.1)")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds a condition may take to reach /metrics "
                    "before it counts as missed (default 120)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "kraft.json"), help="results file")
    args = ap.parse_args()

    from kafka_monitor.spark_cluster import ensure_spark_kafka
    from streaming.job import JobConfig, spark_session, stop_spark
    from tests.support.kraft_stack import Faults, KraftStack

    if "--jars" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(str(j) for j in ensure_spark_kafka())} pyspark-shell"
    tmp = Path(tempfile.mkdtemp(prefix="km-kraft-bench-"))
    spark = spark_session(JobConfig(bootstrap_servers="unused:9092", checkpoint_dir=str(tmp / "spark"),
                                    master="local[2]", shuffle_partitions=2), app_name="kafka-monitor-kraft-bench")
    runs: list[dict] = []
    t_start = time.monotonic()
    try:
        with KraftStack(spark, tmp, version=args.version) as stack:
            version = stack.cluster.version
            print(f"[bench] Kafka {version}, 3 controllers; stack up in {time.monotonic() - t_start:.0f} s", flush=True)
            faults = Faults(stack)
            for r in range(args.repeats):
                for name in ("kill", "pause", "elr"):
                    t0 = time.monotonic()
                    try:
                        got = faults.elr(args.limit) if name == "elr" else faults.controller(name, args.limit)
                        got["detected"] = True
                    except AssertionError as e:
                        got = {"fault": name, "detected": False, "why": str(e)}
                    got.update(repeat=r, seconds=round(time.monotonic() - t0, 1))
                    runs.append(got)
                    print(f"[bench] {got}", flush=True)
    finally:
        stop_spark(spark)

    def med(fault: str, key: str):
        xs = [g[key] for g in runs if g["fault"] == fault and g.get("detected") and key in g]
        return round(statistics.median(xs), 1) if xs else None

    summary = {}
    for fault, keys in (("kill", ("leader_on_metrics_s", "alert_on_metrics_s", "resolved_after_return_s")),
                        ("pause", ("leader_on_metrics_s", "alert_on_metrics_s", "resolved_after_return_s")),
                        ("elr", ("elr_on_metrics_s", "elr_on_metrics_after_isr_s", "gone_after_resume_s"))):
        mine = [g for g in runs if g["fault"] == fault]
        summary[fault] = {"trials": len(mine), "recall": sum(g["detected"] for g in mine) / len(mine) if mine else None,
                          **{f"median_{k}": med(fault, k) for k in keys},
                          **({"false_alerts": sum(sum(g.get("partition_or_group_alerts", {}).values())
                                                  + g.get("quorum_unavailable", 0) for g in mine)}
                             if fault != "elr" else {})}
    print("\nfault  trials recall  medians (s)")
    for fault, s in summary.items():
        meds = ", ".join(f"{k[7:]} {v}" for k, v in s.items() if k.startswith("median_"))
        extra = f", false alerts {s['false_alerts']}" if "false_alerts" in s else ""
        print(f"{fault:6} {s['trials']:6} {s['recall']:.2f}    {meds}{extra}")
    report.write(args.out, "kraft", machine={"kafka": version}, repeats=args.repeats, limit_s=args.limit,
                 summary=summary, runs=runs, seconds=round(time.monotonic() - t_start))
    return 0 if all(s["recall"] == 1.0 for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
