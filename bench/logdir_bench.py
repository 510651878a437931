"""A log dir that fails: recall and time to ``/metrics`` (issue 48).

The whole monitor (``tests/support/kraft_stack.py``: the probe every second, its log dirs every
``--interval`` seconds, events on a Tansu broker, the Spark job local[2] with a 1 s trigger,
otherwise the job's defaults) on a cluster of its own: one controller, three brokers with two log
dirs each, broker 1's second dir a 4 MiB tmpfs (``tests/support/tmpfs_logdir.py``; needs root).
Each repeat: a topic on replicas [1, 2, 3] with 4 partitions (some of broker 1's replicas on the
tmpfs), ~1 KB records (acks=1) to the tmpfs partitions until broker 1's server.log says their logs
are offline (the fault caused: ground truth from the broker itself); then the dir repaired
(broker 1 stopped, the tmpfs mounted again empty with the dir's meta.properties, the broker
started, after the topic was deleted: its replicas would fill the dir again) and LogDirOffline
resolved on ``/metrics``.

Timed from the start of the fill: the broker's own "Logs for partitions ... are offline" line
(its timestamp), the first probe event saying the dir is offline (its ``observed_at``, read from
the events topic), LogDirOffline on ``/metrics`` (``kafka_monitor_alert_active``) and the dir's
``kafka_monitor_log_dir_online`` 0.  Recall: faults caused whose LogDirOffline and online 0 both
reach ``/metrics`` within ``--limit`` seconds.

    python bench/logdir_bench.py                 # 3 repeats (~2.5 min on 2 cores), as root

Prints each repeat's figures and the medians, and writes bench/results/logdirs.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402  (bench/report.py)


def first_seen(tail: Any, broker: int, log_dir: str, online: bool, since_ms: int) -> Optional[int]:
    """When a log_dirs event of the tail (tests.support.kraft_stack.Tail) first showed ``log_dir``
    of ``broker`` online (or offline) at or after ``since_ms``."""
    hits = [e.observed_at for e in list(tail.events) if e.data.broker == broker and e.observed_at >= since_ms
            and {d.log_dir: d.online for d in e.data.dirs}.get(log_dir) is online]
    return min(hits) if hits else None


def one_fault(stack: Any, tc: Any, events: Any, r: int, limit: float) -> dict:
    from tests.conftest import wait_for
    from tests.support.kraft_stack import CLUSTER
    from tests.support.tmpfs_logdir import BROKER, fill

    c, tmpfs = stack.cluster, str(tc.tmpfs)
    topic = f"kraft.logdirs-{r}"
    c.create_topic(topic, config={"min.insync.replicas": 2}, replica_assignment=[[1, 2, 3]] * 4)
    on_tmpfs, _ = wait_for(lambda: tc.placed(topic, 4), timeout=30, what="broker 1's 4 replicas in its dirs")
    if not on_tmpfs:
        raise AssertionError(f"none of {topic}'s replicas on broker 1's tmpfs")
    lab = {"cluster": CLUSTER, "broker": BROKER, "log_dir": tmpfs}

    def offline_active() -> bool:
        return any(n == "kafka_monitor_alert_active" and x.get("alert") == "LogDirOffline" and x.get("cluster") == CLUSTER
                   and x.get("broker") == str(BROKER) for n, x, _ in stack.samples())
    t_ready = time.time() * 1000
    wait_for(lambda: first_seen(events, BROKER, tmpfs, True, int(t_ready)) and not offline_active()
             and stack.value("kafka_monitor_log_dir_online", **lab) == 1.0, timeout=120, interval=0.5,
             what="broker 1's tmpfs dir online in an event and on /metrics, no LogDirOffline")
    logged = len(tc.offline_lines())
    fill_ms, t0 = int(time.time() * 1000), time.monotonic()
    got: dict[str, Any] = {"repeat": r, "tmpfs_partitions": sorted(on_tmpfs)}
    try:
        (at, names), acked = fill(c.bootstrap_servers, topic, sorted(int(p.rsplit("-", 1)[1]) for p in on_tmpfs),
                                  lambda: (lambda lines: lines[logged] if len(lines) > logged else None)(tc.offline_lines()),
                                  timeout=limit)
    except AssertionError as e:
        got.update(caused=False, why=str(e))
        return got
    got.update(caused=True, broker_offline_s=round(at - fill_ms / 1000, 2), acked_mb=round(acked / 1e6, 1),
               logged_offline=sorted(set(names) & on_tmpfs) == sorted(on_tmpfs))
    try:
        wait_for(offline_active, limit, interval=0.25, what="LogDirOffline on /metrics")
        got["alert_on_metrics_s"] = round(time.monotonic() - t0, 2)
        wait_for(lambda: stack.value("kafka_monitor_log_dir_online", **lab) == 0.0, limit, interval=0.25,
                 what="kafka_monitor_log_dir_online 0 on /metrics")
        got["online_0_on_metrics_s"] = round(time.monotonic() - t0, 2)
        got["detected"] = True
    except AssertionError as e:
        got.update(detected=False, why=str(e))
    ev = first_seen(events, BROKER, tmpfs, False, fill_ms)
    got["event_offline_s"] = None if ev is None else round((ev - fill_ms) / 1000, 2)
    # the topic goes first: its replicas, several MB on the new leaders by now, would fill the
    # repaired dir again as broker 1 fetched them back
    c.admin().delete_topics([topic], request_timeout=30)[topic].result(30)
    wait_for(lambda: topic not in c.metadata().topics, timeout=30, what=f"{topic} deleted")
    t1 = time.monotonic()
    tc.repair()
    got["repair_s"] = round(time.monotonic() - t1, 1)
    wait_for(lambda: not offline_active() and stack.value("kafka_monitor_log_dir_online", **lab) == 1.0, limit + 60,
             interval=0.25, what="LogDirOffline resolved on /metrics after the repair")
    got["resolved_after_repair_s"] = round(time.monotonic() - t1, 1)
    got["alive"] = stack.alive()
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="log dirs filled until offline (default 3)")
    ap.add_argument("--interval", type=float, default=2.0, help="the probe's log_dirs_interval_s (default 2)")
    ap.add_argument("--version", default=None, help="Kafka version (default: the launcher's, 4.1.1)")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds the fault may take to be caused, and its "
                    "alert to reach /metrics, before it counts as missed (default 60)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "logdirs.json"), help="results file")
    args = ap.parse_args()

    from tests.support.tmpfs_logdir import TMPFS_SIZE, TmpfsCluster, why_not_root

    why = why_not_root()
    if why:
        print(f"[bench] {why}", file=sys.stderr)
        return 2
    from kafka_monitor.spark_cluster import ensure_spark_kafka
    from streaming.job import JobConfig, spark_session, stop_spark
    from tests.support.kraft_stack import KraftStack, Tail

    if "--jars" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(str(j) for j in ensure_spark_kafka())} pyspark-shell"
    machine = report.machine_info()
    tmp = Path(tempfile.mkdtemp(prefix="km-logdir-bench-"))
    spark = spark_session(JobConfig(bootstrap_servers="unused:9092", checkpoint_dir=str(tmp / "spark"),
                                    master="local[2]", shuffle_partitions=2), app_name="kafka-monitor-logdir-bench")
    runs: list[dict] = []
    t_start = time.monotonic()
    tc = TmpfsCluster(version=args.version)
    try:
        tc.mount()
        with KraftStack(spark, tmp, cluster=tc.cluster, probe_settings={"log_dirs_interval_s": args.interval}) as stack:
            version = stack.cluster.version
            print(f"[bench] Kafka {version}, broker 1's {tc.tmpfs.name} a {TMPFS_SIZE} tmpfs; stack up in "
                  f"{time.monotonic() - t_start:.0f} s", flush=True)
            events = Tail(stack.events_broker.bootstrap, stack.events, ("log_dirs",), name="logdir-bench")
            events.start()
            try:
                for r in range(args.repeats):
                    t0 = time.monotonic()
                    try:
                        got = one_fault(stack, tc, events, r, args.limit)
                    except AssertionError as e:  # the setting up or the repair: the stack is in doubt
                        got = {"repeat": r, "caused": None, "why": str(e)}
                    got["seconds"] = round(time.monotonic() - t0, 1)
                    runs.append(got)
                    print(f"[bench] {got}", flush=True)
                    if got["caused"] is None:
                        break
            finally:
                events.stop()
    finally:
        try:
            stop_spark(spark)
        finally:
            tc.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def med(key: str):
        xs = [g[key] for g in runs if g.get("detected") and g.get(key) is not None]
        return round(statistics.median(xs), 2) if xs else None

    caused = [g for g in runs if g.get("caused")]
    summary = {"repeats": len(runs), "caused": len(caused), "detected": sum(bool(g.get("detected")) for g in caused),
               "recall": sum(bool(g.get("detected")) for g in caused) / len(caused) if caused else None,
               **{f"median_{k}": med(k) for k in ("broker_offline_s", "event_offline_s", "alert_on_metrics_s",
                                                  "online_0_on_metrics_s", "resolved_after_repair_s")}}
    print(f"\nlog dir offline: {summary['detected']}/{summary['caused']} caused seen on /metrics "
          f"(recall {summary['recall']}); medians from the fill's start: broker's log "
          f"{summary['median_broker_offline_s']} s, probe event {summary['median_event_offline_s']} s, "
          f"LogDirOffline on /metrics {summary['median_alert_on_metrics_s']} s, log_dir_online 0 "
          f"{summary['median_online_0_on_metrics_s']} s; resolved {summary['median_resolved_after_repair_s']} s "
          f"after the repair began")
    report.write(args.out, "logdirs", machine={**machine, "kafka": version}, repeats=args.repeats,
                 limit_s=args.limit, log_dirs_interval_s=args.interval, tmpfs=TMPFS_SIZE, summary=summary, runs=runs,
                 seconds=round(time.monotonic() - t_start))
    return 0 if summary["recall"] == 1.0 and len(caused) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
