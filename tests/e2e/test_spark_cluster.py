"""The job on a Spark standalone cluster (issue 30), next to the local job on the same input.

    real Kafka cluster (writes, a group falling behind, broker 3 stopped and started)
      -> probe (every second) -> events topic
      -> job A: local[*], the python source, the HDFS-backed state store -> alerts A, /metrics A
      -> job B: on a master and 2 workers (tests/support/spark_cluster.py), Spark's own kafka
                source, the RocksDB state store; submitted with spark-submit as docs/settings.md says,
                one executor SIGKILLed mid-task, a whole worker lost and replaced, then the driver
                SIGKILLed and the job started again on its checkpoint in client mode
                (kafka-monitor job --master spark://...)
                -> alerts B, /metrics B

When both have read every event, B must have published every transition A published, none
twice, and serve the same open alerts and partition and lag gauges.  What Spark did about the
lost executor is printed (and kept in the test's directory) from the driver's log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest

import kafka_monitor.cli
from kafka_monitor.local.broker import free_port
from kafka_monitor.spark_cluster import SparkCluster, ensure_spark_kafka, spark_home
from tests.conftest import wait_for
from tests.support.ab_stream import Job, Stream, end_offsets, outcome
from tests.support.alerts_topic import read_alerts
from tests.support.spark_cluster import spark_cluster  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

#: what the driver's log says Spark did about a lost executor
_SPARK_SAID = re.compile(r"(Lost executor|Removing executor|Executor lost|Lost task|Resubmitting|"
                         r"Executor added|Granted executor|is now (?:EXITED|LOST|FAILED))")


def busy_executor(ui_port: int) -> str | None:
    """The id of an executor running a task now, from the driver's REST API."""
    try:
        base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
        app = json.loads(urllib.request.urlopen(base, timeout=2).read())[0]["id"]
        for e in json.loads(urllib.request.urlopen(f"{base}/{app}/executors", timeout=2).read()):
            if e["id"] != "driver" and e.get("activeTasks", 0) > 0:
                return e["id"]
    except (OSError, ValueError, IndexError, KeyError):
        pass
    return None


def kill_mid_task(cluster: SparkCluster, job: "ClusterJob", attempts: int = 4) -> int:
    """SIGKILL an executor the driver's REST API says runs a task, until the driver's log shows a
    task lost with it (the API lags the tasks: a short task may end before the kill lands; then
    the next try waits for the replacement executor).  The killed executor's PID."""
    log = Path(job.log.name)

    def said(what: str) -> int:
        return log.read_text(errors="replace").count(what)
    for _ in range(attempts):
        lost_before, failed_before = said("Lost executor"), said("ExecutorLostFailure")
        busy = wait_for(lambda: busy_executor(job.ui_port), timeout=120, interval=0.02, what="an executor with a task")
        pid = cluster.kill_executor(busy)
        wait_for(lambda n=lost_before: said("Lost executor") > n, timeout=60, what=f"the driver to lose executor {busy}")
        try:  # logged right after the loss, by the task set that ran on it
            wait_for(lambda n=failed_before: said("ExecutorLostFailure") > n, timeout=5, what="a task lost")
            return pid
        except AssertionError:
            pass
        wait_for(lambda: len(cluster.executors()) == cluster.n_workers, timeout=120, what="the replacement executor")
    raise AssertionError(f"no executor kill landed mid-task in {attempts} attempts; see {log}")


class ClusterJob(Job):
    """Job B: submitted to ``cluster`` with spark-submit on its first start, then in client mode."""

    def __init__(self, *a, cluster: SparkCluster, jars: str, **kw):
        super().__init__(*a, **kw)
        self.cluster, self.jars = cluster, jars

    def start(self) -> None:
        self.port = free_port()
        self.starts += 1
        self.log.write(f"\n===== start {self.starts} =====\n".encode())
        self.log.flush()
        job = ["job", "--bootstrap-servers", self.bootstrap, "--checkpoint", str(self.ckpt),
               "--events-topic", self.events, "--alerts-topic", self.alerts, "--trigger", "1",
               "--max-offsets-per-trigger", "300", "--buckets", "4", "--metrics-port", str(self.port),
               "--source", "spark-kafka", "--state-store", "rocksdb"]
        env = self.cluster.env()
        if self.starts == 1:  # docs/settings.md's recipe; the UI's REST API says which executor runs a task
            env.pop("PYSPARK_SUBMIT_ARGS", None)
            self.ui_port = free_port()
            cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.cluster.master_url,
                   "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.ui.enabled=true",
                   "--conf", f"spark.ui.port={self.ui_port}", "--jars", self.jars, kafka_monitor.cli.__file__, *job]
        else:  # client mode from our CLI: PySpark starts the JVM with these arguments
            env["PYSPARK_SUBMIT_ARGS"] = f"--jars {self.jars} --conf spark.sql.shuffle.partitions=2 pyspark-shell"
            cmd = [sys.executable, "-m", "kafka_monitor.cli", *job, "--master", self.cluster.master_url]
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)


def test_the_job_on_a_spark_cluster_ends_as_the_local_one(kafka_cluster, spark_cluster, tmp_path):  # noqa: F811
    c = kafka_cluster
    jars = ",".join(str(j) for j in ensure_spark_kafka())
    said: list[str] = []
    with ExitStack() as cleanup:
        stream = Stream(c, cleanup, "sc")
        boot, events, cluster = stream.boot, stream.events, stream.cluster
        a = Job("a", boot, events, stream.alerts_a, tmp_path)
        b = ClusterJob("b", boot, events, stream.alerts_b, tmp_path, cluster=spark_cluster, jars=jars)
        cleanup.callback(a.close)
        cleanup.callback(b.close)
        a.start()
        b.start()

        def b_runs(more: int, what: str) -> None:
            done = b.committed_batches()
            wait_for(lambda: b.committed_batches() >= done + more or not b.alive(), timeout=300, interval=0.5,
                     what=f"job B {what}")
            assert b.alive(), f"job B exited (status {b.proc.returncode}): see {b.log.name}"

        b_runs(2, "committing its first batches on the cluster")
        lost = None
        if spark_cluster.managed:  # an external master's processes are not ours to kill
            lost = kill_mid_task(spark_cluster, b)
        c.stop_broker(3)
        b_runs(3, f"going on after executor pid {lost} was killed")
        if spark_cluster.managed:
            spark_cluster.kill_worker(1)  # a machine lost: the worker and its executors at once
            b_runs(2, "going on with one worker")
            spark_cluster.start_worker(1)  # and replaced
            wait_for(lambda: len(spark_cluster.executors()) == 2, timeout=120, what="an executor on the new worker")
            b_runs(2, "with the replacement worker's executor")
        b.kill()  # the driver: spark-submit, its JVM and Python; the master removes its executors
        b.start()
        c.start_broker(3)
        b_runs(4, "running again in client mode on its checkpoint")
        assert a.alive(), f"job A exited (status {a.proc.returncode}): see {a.log.name}"
        stream.stop()

        end = end_offsets(boot, events)
        for j in (a, b):
            wait_for(lambda j=j: j.alive() and j.committed_offsets() == end, timeout=240, interval=0.5,
                     what=f"job {j.name} to commit every event ({end}; at {j.committed_offsets()})")
        ta = [r for r in read_alerts(boot, a.alerts) if r["labels"].get("cluster") == cluster]
        tb = [r for r in read_alerts(boot, b.alerts) if r["labels"].get("cluster") == cluster]
        ma, mb = outcome(a.metrics(), cluster), outcome(b.metrics(), cluster)
        b.log.flush()
        said = [x for x in Path(b.log.name).read_text(errors="replace").splitlines() if _SPARK_SAID.search(x)]
        if spark_cluster.managed:
            said += [x for x in (spark_cluster.dir / "master.log").read_text(errors="replace").splitlines()
                     if "executor" in x and "Start scheduling" not in x]

    (tmp_path / "outcome.json").write_text(json.dumps(
        {"a": ta, "b": tb, "metrics_a": sorted(map(list, ma.items())), "metrics_b": sorted(map(list, mb.items())),
         "spark_said": said}, indent=1, default=str))
    print(f"\n{len(ta)} transitions from A, {len(tb)} from B; {len(ma)} series; executor {lost} killed; "
          f"Spark said:\n  " + "\n  ".join(x[:200] for x in said[:40]))
    key = lambda r: (r["alert_id"], r["action"], r["at"])  # noqa: E731
    kb = [key(r) for r in tb]
    assert len(kb) == len(set(kb)), "job B published a transition twice"
    assert {"IsrShrink", "UnderReplicated"} <= {r["alert"] for r in ta}, \
        "the stream raised less than the scenario should: the comparison proves little"
    assert sorted(kb) == sorted(key(r) for r in ta)
    assert any(n.startswith("kafka_monitor_group_partition_lag_seconds") for n, _ in ma)
    assert mb == ma
    assert not spark_cluster.managed or any("Lost task" in x and "ExecutorLostFailure" in x for x in said), \
        "the driver's log shows no task lost with the executor: the kill did not land mid-task"
    assert os.path.isdir(b.ckpt / "state")
