"""A hanging transaction: recall and time to ``/metrics`` (issue 48).

The whole monitor on a real cluster (the launcher's: one controller, three brokers): the probe
every second, its transactions every ``--interval`` seconds, events and alerts on a Tansu broker
(so the watched cluster's transactions are the only ones the monitor sees), the Spark job
local[2] with a 1 s trigger, ``[job.rules.transactions] hanging_after_ms`` = ``--hanging-ms`` and
lag rules small enough to open within a repeat (ConsumerLagHigh past 10 records for 3 s,
ConsumerLagStatus STALL after 3 s, STOP after 10 s), otherwise the job's defaults.

Each repeat, on a topic of its own with 3 partitions (tests/support/txn_producer.py): plain
records to every partition every 0.5 s; a read_committed consumer and a read_uncommitted one,
each in its own group, committing; then a transactional producer (transaction.timeout.ms 10 min)
writes 3 records to partitions 0 and 1 and is SIGSTOPped, and a burst of 20 plain records to each
partition moves the high watermarks past its first ones.  It stays paused until
HangingTransaction and the read_committed group's ConsumerLagHigh on both partitions are on
``/metrics`` (or ``--limit``), then it is resumed and commits.

Timed from the moment its records are written (its ``OPEN`` line): the first probe event that
lists the transaction (its ``observed_at``, read from the events topic); HangingTransaction on
``/metrics`` (``kafka_monitor_alert_active``), also counted from the moment the hanging setting
elapsed; the read_committed group's ConsumerLagHigh and ConsumerLagStatus on both held partitions
on ``/metrics``; and, from the commit, each gone from ``/metrics``.  Whether the lag alerts blame
the transaction is read from their records on the alerts topic (evidence ``cause``
open_transaction, ``transaction`` naming it).  Recall: repeats whose HangingTransaction and lag
alerts reach ``/metrics`` within ``--limit`` seconds with that evidence.  False alerts: alerts
opened for the read_uncommitted group, or for the read_committed group's partition that the
transaction leaves alone.  At the end of a repeat the writes stop first and both groups catch up
before their consumers close (a group left behind with records waiting would rightly alert
during the next repeat).

    python bench/txn_bench.py                    # 3 repeats (~2 min on 2 cores)

Prints each repeat's figures and the medians, and writes bench/results/transactions.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402  (bench/report.py)

CLUSTER = "txn-bench"
HELD, FREE = (0, 1), 2  # the transaction's partitions, and one it leaves alone
LAG_RULES = {"lag_high_offsets": 10, "lag_high_seconds": None, "lag_high_for_ms": 3_000, "stall_after_ms": 3_000,
             "stop_after_ms": 10_000}


def listed(tail: Any, tid: str) -> Optional[tuple[int, Any]]:
    """The first transactions event of the tail (tests.support.kraft_stack.Tail) that lists
    ``tid``: (observed_at, its OpenTransaction)."""
    for e in list(tail.events):
        for t in e.data.transactions:
            if t.transactional_id == tid:
                return e.observed_at, t
    return None


class Stack:
    """The cluster, the events broker, the probe, the job and its exporter; ``with`` stops
    everything (by PID, through the parts' own stop methods) even on failure."""

    def __init__(self, spark: Any, tmp: Path, version: Optional[str], interval: float, hanging_ms: int):
        self.spark, self.tmp, self.version, self.interval, self.hanging_ms = spark, tmp, version, interval, hanging_ms
        self._stack = ExitStack()

    def __enter__(self) -> "Stack":
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def _start(self) -> None:
        from kafka_monitor.local.kafka_cluster import KafkaCluster
        from tests.support.kraft_stack import Tail, start_monitor

        s = self._stack
        self.cluster = c = KafkaCluster(version=self.version)
        s.callback(c.stop)
        c.start()
        m = start_monitor(s, self.spark, self.tmp, c, {
            "transactions_interval_s": self.interval, "quorum_interval_s": 0, "log_dirs_interval_s": 0,
            "elr_interval_s": 0, "topics_include": r"^txnb\.", "groups_include": "^txnb-", "cluster": CLUSTER,
            "source": "probe-txn-bench"}, rules={"transactions": {"hanging_after_ms": self.hanging_ms},
                                                 "lag": dict(LAG_RULES)}, query_name="txn-bench")
        self.probe_thread, self.query, self.url = m.probe_thread, m.query, m.url
        self.tail = Tail(m.events_broker.bootstrap, m.events, ("transactions",), others=(m.alerts,), name="txn-bench")
        self.tail.start()
        s.callback(self.tail.stop)

    def samples(self) -> list[tuple[str, dict, float]]:
        from tests.support.kraft_stack import metric_samples

        return metric_samples(self.url)

    def active(self, samples: list, alert: str, **labels: Any) -> bool:
        return any(n == "kafka_monitor_alert_active" and lab.get("alert") == alert and lab.get("cluster") == CLUSTER
                   and all(lab.get(k) == str(v) for k, v in labels.items()) for n, lab, _ in samples)

    def value(self, name: str, **labels: Any) -> Optional[float]:
        for n, lab, v in self.samples():
            if n == name and lab.get("cluster") == CLUSTER and all(lab.get(k) == str(x) for k, x in labels.items()):
                return v
        return None

    def alive(self) -> bool:
        return self.query.isActive and self.probe_thread.is_alive()


def one_repeat(stack: Stack, r: int, limit: float, hanging_ms: int) -> dict:
    from tests.conftest import wait_for
    from tests.support.txn_producer import GroupReader, PlainWriter, TxnProcess

    c = stack.cluster
    topic, tid, rc, ru = f"txnb.t{r}", f"txnb-tx{r}", f"txnb-rc{r}", f"txnb-ru{r}"
    c.create_topic(topic, partitions=3)
    writer = PlainWriter(c.bootstrap_servers, topic, 3)
    readers = [GroupReader(c.bootstrap_servers, topic, rc, "read_committed"),
               GroupReader(c.bootstrap_servers, topic, ru, "read_uncommitted")]
    txn: Optional[TxnProcess] = None
    got: dict[str, Any] = {"repeat": r}
    seen_alerts = len(stack.tail.records)
    try:
        writer.start()
        for x in readers:
            x.start()

        def ready() -> bool:
            s = stack.samples()
            lags = {(lab.get("group"), lab.get("partition")) for n, lab, _ in s
                    if n == "kafka_monitor_group_partition_lag"}
            return ({(g, str(p)) for g in (rc, ru) for p in range(3)} <= lags
                    and not stack.active(s, "HangingTransaction"))
        wait_for(ready, timeout=240, interval=0.5, what="both groups' lag on /metrics, no HangingTransaction")
        txn = TxnProcess(c.bootstrap_servers, topic, tid, HELD)
        opened = txn.opened()
        t0, open_ms = time.monotonic(), int(time.time() * 1000)
        writer.burst(20)
        txn.pause()
        first = {int(tp.rsplit("-", 1)[1]): off for tp, off in opened["first_offsets"].items()}
        got["first_offsets"] = first
        times: dict[str, float] = {}
        deadline = t0 + hanging_ms / 1000 + limit
        while time.monotonic() < deadline:
            s = stack.samples()
            now = round(time.monotonic() - t0, 2)
            if stack.active(s, "HangingTransaction"):
                times.setdefault("hanging_on_metrics_s", now)
            for alert, key in (("ConsumerLagHigh", "lag_high_on_metrics_s"),
                               ("ConsumerLagStatus", "lag_status_on_metrics_s")):
                if all(stack.active(s, alert, group=rc, partition=p) for p in HELD):
                    times.setdefault(key, now)
            if len(times) == 3:
                break
            time.sleep(0.25)
        got.update(times)
        if "hanging_on_metrics_s" in times:
            got["hanging_after_setting_s"] = round(times["hanging_on_metrics_s"] - hanging_ms / 1000, 2)
        seen = listed(stack.tail, tid)
        got["event_listed_s"] = None if seen is None else round((seen[0] - open_ms) / 1000, 2)
        pid = None if seen is None else seen[1].producer_id
        got["paused_s"] = round(time.monotonic() - t0, 1)
        txn.commit()
        t1 = time.monotonic()

        def gone(alert: str, **labels: Any) -> bool:
            return not stack.active(stack.samples(), alert, **labels)
        for key, cond in (("hanging_resolved_s", lambda: gone("HangingTransaction")),
                          ("lag_resolved_s", lambda: all(gone(a, group=rc) for a in ("ConsumerLagHigh",
                                                                                      "ConsumerLagStatus")))):
            try:
                wait_for(cond, timeout=limit, interval=0.25, what=key)
                got[key] = round(time.monotonic() - t1, 2)
            except AssertionError:
                got[key] = None
        # the alerts topic: the lag alerts' evidence, and anything opened where nothing is held
        time.sleep(3)  # the job's last batch published (trigger 1 s)
        mine = [a for a in stack.tail.records[seen_alerts:] if a.get("labels", {}).get("cluster") == CLUSTER]
        lag_opens = [a for a in mine if a["action"] == "open" and a["labels"].get("group") == rc
                     and a["alert"] in ("ConsumerLagHigh", "ConsumerLagStatus")]
        got["lag_opens"] = [[a["alert"], a["labels"].get("partition"), a["evidence"].get("status"),
                             a["evidence"].get("cause"), a["evidence"].get("transaction")] for a in lag_opens]
        want = {"transactional_id": tid, "producer_id": pid}
        got["lag_with_transaction"] = bool(lag_opens) and all(
            a["evidence"].get("cause") == "open_transaction" and a["evidence"].get("read_committed") == "inferred"
            and a["evidence"].get("transaction") == want for a in lag_opens)
        hang = [a for a in mine if a["alert"] == "HangingTransaction" and a["action"] == "open"]
        named = [t for a in hang for t in a["evidence"].get("transactions", []) if t.get("transactional_id") == tid]
        got["hanging_names"] = bool(named) and all(
            t["producer_id"] == pid and t["partitions"] == [f"{topic}-{p}" for p in HELD] for t in named)
        got["false_alerts"] = sorted({(a["alert"], a["labels"].get("group"), a["labels"].get("partition"))
                                      for a in mine if a["action"] == "open" and (
                                          a["labels"].get("group") == ru
                                          or (a["labels"].get("group") == rc and a["labels"].get("partition") == FREE))})
        got["detected"] = bool(len(times) == 3 and got["lag_with_transaction"] and got["hanging_names"])
        got["alive"] = stack.alive()
        # the writes stop before the consumers do, which then leave their groups caught up: a group
        # left behind with records waiting would rightly alert during the next repeat
        writer.stop()
        try:
            wait_for(lambda: all(stack.value("kafka_monitor_group_partition_lag", group=g, partition=p) == 0.0
                                 for g in (rc, ru) for p in range(3)), timeout=30, interval=0.5,
                     what="both groups caught up on /metrics")
        except AssertionError as e:
            got["left_behind"] = str(e)
        return got
    finally:
        if txn is not None:
            txn.kill()
        for x in readers:
            x.stop()
        writer.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="hanging transactions made (default 3)")
    ap.add_argument("--interval", type=float, default=2.0, help="the probe's transactions_interval_s (default 2)")
    ap.add_argument("--hanging-ms", type=int, default=10_000, help="the job's hanging_after_ms (default 10000)")
    ap.add_argument("--version", default=None, help="Kafka version (default: the launcher's, 4.1.1)")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds past the hanging setting the alerts may "
                    "take to reach /metrics, and to leave it after the commit, before they count as missed "
                    "(default 60)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "transactions.json"), help="results file")
    args = ap.parse_args()

    from kafka_monitor.spark_cluster import ensure_spark_kafka
    from streaming.job import JobConfig, spark_session, stop_spark

    if "--jars" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(str(j) for j in ensure_spark_kafka())} pyspark-shell"
    machine = report.machine_info()
    tmp = Path(tempfile.mkdtemp(prefix="km-txn-bench-"))
    spark = spark_session(JobConfig(bootstrap_servers="unused:9092", checkpoint_dir=str(tmp / "spark"),
                                    master="local[2]", shuffle_partitions=2), app_name="kafka-monitor-txn-bench")
    runs: list[dict] = []
    t_start = time.monotonic()
    version = None
    try:
        with Stack(spark, tmp, args.version, args.interval, args.hanging_ms) as stack:
            version = stack.cluster.version
            print(f"[bench] Kafka {version}; stack up in {time.monotonic() - t_start:.0f} s", flush=True)
            for r in range(args.repeats):
                t0 = time.monotonic()
                try:
                    got = one_repeat(stack, r, args.limit, args.hanging_ms)
                except AssertionError as e:  # the setting up: the stack is in doubt
                    got = {"repeat": r, "detected": None, "why": str(e)}
                got["seconds"] = round(time.monotonic() - t0, 1)
                runs.append(got)
                print(f"[bench] {got}", flush=True)
                if got["detected"] is None:
                    break
    finally:
        try:
            stop_spark(spark)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def med(key: str):
        xs = [g[key] for g in runs if g.get("detected") and g.get(key) is not None]
        return round(statistics.median(xs), 2) if xs else None

    made = [g for g in runs if g.get("detected") is not None]
    detected = sum(bool(g["detected"]) for g in made)
    keys = ("event_listed_s", "hanging_on_metrics_s", "hanging_after_setting_s", "lag_high_on_metrics_s",
            "lag_status_on_metrics_s", "hanging_resolved_s", "lag_resolved_s")
    summary = {"repeats": len(runs), "made": len(made), "detected": detected,
               "recall": detected / len(made) if made else None,
               "false_alerts": sum(len(g.get("false_alerts") or []) for g in made),
               **{f"median_{k}": med(k) for k in keys}}
    print(f"\nhanging transaction: {detected}/{len(made)} seen on /metrics with the lag alerts blaming it "
          f"(recall {summary['recall']}); medians from the transaction's records written: probe event "
          f"{summary['median_event_listed_s']} s, HangingTransaction on /metrics {summary['median_hanging_on_metrics_s']} s "
          f"({summary['median_hanging_after_setting_s']} s after the {args.hanging_ms / 1000:.0f} s setting), "
          f"ConsumerLagHigh {summary['median_lag_high_on_metrics_s']} s, ConsumerLagStatus "
          f"{summary['median_lag_status_on_metrics_s']} s; after the commit HangingTransaction gone in "
          f"{summary['median_hanging_resolved_s']} s, the lag alerts in {summary['median_lag_resolved_s']} s; "
          f"false alerts {summary['false_alerts']}")
    report.write(args.out, "transactions", machine={**machine, "kafka": version}, repeats=args.repeats,
                 limit_s=args.limit, transactions_interval_s=args.interval, hanging_after_ms=args.hanging_ms,
                 lag_rules=LAG_RULES, summary=summary, runs=runs, seconds=round(time.monotonic() - t_start))
    return 0 if summary["recall"] == 1.0 and len(made) == len(runs) and not summary["false_alerts"] else 1


if __name__ == "__main__":
    sys.exit(main())
