"""Jobs disturbed under a live stream, next to an uninterrupted job on the same input: one
SIGKILLed at random moments (issue 19.1), one on a Spark standalone cluster losing an executor,
a worker and its driver (issue 30).  One stream and one reference job serve both (they were two
modules, each with its own stream and reference, for the same proof).

    real cluster (a topic with writes, a consumer group falling behind, broker 3 stopped and
    started: ISR shrink, under-replicated, at min ISR, then recovery)
      -> probe (every second) -> events topic (on the same cluster, on brokers 1 and 2)
      -> job A: local[*], runs throughout                         -> alerts topic A, /metrics A
      -> job B: local, SIGKILLed (driver, JVM, workers) at KAFKA_MONITOR_KILLS random moments
                (default 3), restarted on its checkpoint each time -> alerts topic B, /metrics B
      -> job C: on a master and 2 workers (tests/support/spark_cluster.py), Spark's own kafka
                source, the RocksDB state store; submitted with spark-submit as docs/settings.md
                says, one executor SIGKILLed mid-task, a whole worker lost and replaced, then the
                driver SIGKILLed and the job started again on its checkpoint in client mode
                (kafka-monitor job --master spark://...)       -> alerts topic C, /metrics C

When the stream ends and every job has read every event (their checkpoints' committed offsets
equal the topic's end offsets), B and C must each have published every transition A published,
none twice, and serve the same open alerts and the same partition and lag gauges (lag windows
included: lag_seconds is read from them) on /metrics.  KAFKA_MONITOR_KILL_SEED replays B's
moments.  What Spark did about the lost executor is printed (and kept in the test's directory)
from C's driver log.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

import pytest

import kafka_monitor.cli
from kafka_monitor.local.broker import free_port
from kafka_monitor.spark_cluster import SparkCluster, ensure_spark_kafka, spark_home
from tests.conftest import reconnect_storms, wait_for
from tests.support.ab_stream import Job, Stream, end_offsets, outcome
from tests.support.alerts_topic import read_alerts
from tests.support.jvm import LEAN_JVM, submit_args
from tests.support.spark_cluster import spark_cluster  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

#: 3: a kill before, during and after broker 3's absence; each restart is a Spark JVM's start, the
#: CPU this test shares with the rest of the suite (5 took it past 1,200 s beside the compose tier)
KILLS = int(os.environ.get("KAFKA_MONITOR_KILLS", "3"))
#: B's first batch after a start: at the first, three jobs' JVMs, their first batches and job C's
#: executors start at once; at the later ones C's executors and worker are killed and replaced,
#: on 2 cores beside the other worker's tests (113 s alone on an idle machine at the first; CI
#: passed 240 s at the first start once and at the second once, load average ~30)
FIRST_BATCH_S = 480

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
                   "--driver-java-options", LEAN_JVM, "--conf", f"spark.executor.extraJavaOptions={LEAN_JVM}",
                   "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.ui.enabled=true",
                   "--conf", f"spark.ui.port={self.ui_port}", "--jars", self.jars, kafka_monitor.cli.__file__, *job]
        else:  # client mode from our CLI: PySpark starts the JVM with these arguments
            env["PYSPARK_SUBMIT_ARGS"] = submit_args("--jars", self.jars, "--conf", "spark.sql.shuffle.partitions=2",
                                                     "--conf", f"spark.executor.extraJavaOptions={LEAN_JVM}")
            cmd = [sys.executable, "-m", "kafka_monitor.cli", *job, "--master", self.cluster.master_url]
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)


def kill_at_random_moments(b: Job, rnd: random.Random, faults: dict, moments: list,
                           others: Callable[[], dict]) -> None:
    """Job B: KILLS times, wait for a batch after its start, SIGKILL it at a random moment of
    its run (mid-batch or between), start it again; ``faults[k]`` runs after the k-th kill.
    ``others()``: every job's committed batches, for a failure's message."""
    for k in range(1, KILLS + 1):
        done = b.committed_batches()
        try:
            wait_for(lambda done=done: not b.alive() or b.committed_batches() > done, timeout=FIRST_BATCH_S,
                     interval=0.2,
                     what=f"job B's first batch after start {b.starts}")
        except AssertionError as e:
            raise AssertionError(f"{e}; jobs' committed batches: {others()}; job B's log ends:\n{b.tail()}") from None
        time.sleep(rnd.uniform(0, 4))
        assert b.alive(), f"job B exited by itself (status {b.proc.returncode}); its log ends:\n{b.tail()}"
        moments.append(b.committed_batches())
        b.kill()
        b.start()
        if k in faults:
            faults[k]()
    done = b.committed_batches()
    wait_for(lambda: b.committed_batches() > done + 3, timeout=240, interval=0.5, what="job B running again")


def disturb_on_the_cluster(c: "ClusterJob", spark_cluster: SparkCluster) -> "int | None":  # noqa: F811
    """Job C: an executor killed mid-task, a worker lost and replaced, the driver killed and the
    job started again in client mode; C commits batches after each.  The killed executor's PID."""
    def c_runs(more: int, what: str) -> None:
        done = c.committed_batches()
        wait_for(lambda: c.committed_batches() >= done + more or not c.alive(), timeout=300, interval=0.5,
                 what=f"job C {what}")
        assert c.alive(), f"job C exited (status {c.proc.returncode}): see {c.log.name}"

    c_runs(2, "committing its first batches on the cluster")
    lost = None
    if spark_cluster.managed:  # an external master's processes are not ours to kill
        lost = kill_mid_task(spark_cluster, c)
    c_runs(3, f"going on after executor pid {lost} was killed")
    if spark_cluster.managed:
        spark_cluster.kill_worker(1)  # a machine lost: the worker and its executors at once
        c_runs(2, "going on with one worker")
        spark_cluster.start_worker(1)  # and replaced
        wait_for(lambda: len(spark_cluster.executors()) == 2, timeout=120, what="an executor on the new worker")
        c_runs(2, "with the replacement worker's executor")
    c.kill()  # the driver: spark-submit, its JVM and Python; the master removes its executors
    c.start()
    c_runs(4, "running again in client mode on its checkpoint")
    return lost


# 1,058-1,187 s with 5 kills in the last three full runs on 2 cores (3 jobs, a Spark cluster and
# the shared Kafka cluster beside the compose tier's image builds): a bound, not a goal
@pytest.mark.timeout(1500)
def test_jobs_killed_or_on_a_spark_cluster_end_as_an_uninterrupted_one(kafka_cluster, spark_cluster, tmp_path,  # noqa: F811
                                                                      capfd):
    kc = kafka_cluster
    seed = int(os.environ.get("KAFKA_MONITOR_KILL_SEED") or random.randrange(10**6))
    rnd = random.Random(seed)
    print(f"\nKAFKA_MONITOR_KILL_SEED={seed}, {KILLS} kills")
    jars = ",".join(str(j) for j in ensure_spark_kafka())
    said: list[str] = []
    with ExitStack() as cleanup:
        stream = Stream(kc, cleanup, "dist", jobs=("a", "b", "c"))
        boot, events, cluster = stream.boot, stream.events, stream.cluster
        a = Job("a", boot, events, stream.alerts["a"], tmp_path)
        b = Job("b", boot, events, stream.alerts["b"], tmp_path)
        c = ClusterJob("c", boot, events, stream.alerts["c"], tmp_path, cluster=spark_cluster, jars=jars)
        for j in (a, b, c):
            cleanup.callback(j.close)
            j.start()
        # C's faults on a thread of their own, beside B's kills; the watched cluster's faults
        # (broker 3 stops after B's first kill, returns after its third) disturb both
        c_result: dict = {}

        def c_side():
            try:
                c_result["lost"] = disturb_on_the_cluster(c, spark_cluster)
            except BaseException as e:  # noqa: BLE001 - raised again by the test
                c_result["error"] = e
        c_thread = threading.Thread(target=c_side, name="job-c-faults", daemon=True)
        c_thread.start()
        moments: list = []
        kill_at_random_moments(b, rnd, {1: lambda: kc.stop_broker(3), 3: lambda: kc.start_broker(3)}, moments,
                               lambda: {j.name: j.committed_batches() for j in (a, b, c)})
        c_thread.join(1100)
        if "error" in c_result:
            raise c_result["error"]
        assert not c_thread.is_alive(), "job C's faults did not finish"
        assert a.alive(), f"job A exited (status {a.proc.returncode}): see {a.log.name}"
        stream.stop()

        end = end_offsets(boot, events)
        produced = sum(end.values())
        for j in (a, b, c):
            wait_for(lambda j=j: j.alive() and j.committed_offsets() == end, timeout=240, interval=0.5,
                     what=f"job {j.name} to commit every event ({end}; at {j.committed_offsets()})")
        # the probe is stopped: each job, idle, finds it silent at the same moment of event time
        # (its last heartbeat + the limit).  Waiting for that in all three makes the comparison
        # independent of how long each took to drain (one still busy past that moment had opened
        # it, one already read had not)
        for j in (a, b, c):
            wait_for(lambda j=j: any(r["alert"] == "SourceSilent" and r["action"] == "open"
                                     and r["labels"].get("source") == stream.source
                                     for r in read_alerts(boot, j.alerts)),
                     timeout=120, interval=1, what=f"job {j.name} to find the stopped probe silent")
        # a last batch's transitions are published before its commit; the exporter applies its rows
        # before the commit too.  What falls due later than SourceSilent (seen in CI: two alerts 27 s
        # after it, in A only) opens at each job's own next tick (30 s processing-time timeout),
        # stamped with the moment it fell due: the three agree once each has ticked past it.  Poll
        # for that agreement; without it the assertions below report the last reading
        key = lambda r: (r["alert_id"], r["action"], r["at"])  # noqa: E731
        deadline = time.monotonic() + 150
        while True:
            published = {j.name: [r for r in read_alerts(boot, j.alerts) if r["labels"].get("cluster") == cluster]
                         for j in (a, b, c)}
            served = {j.name: outcome(j.metrics(), cluster) for j in (a, b, c)}
            keys = {n: sorted(key(r) for r in t) for n, t in published.items()}
            if (all(keys[n] == keys["a"] and served[n] == served["a"] for n in ("b", "c"))
                    or time.monotonic() > deadline):
                break
            time.sleep(2)
        c.log.flush()
        said = [x for x in Path(c.log.name).read_text(errors="replace").splitlines() if _SPARK_SAID.search(x)]
        if spark_cluster.managed:
            said += [x for x in (spark_cluster.dir / "master.log").read_text(errors="replace").splitlines()
                     if "executor" in x and "Start scheduling" not in x]

    (tmp_path / "outcome.json").write_text(json.dumps(  # for a failure's post-mortem
        {"published": published, "metrics": {n: sorted(map(list, m.items())) for n, m in served.items()},
         "spark_said": said}, indent=1, default=str))
    ta, ma = published["a"], served["a"]
    print(f"{produced} events; job B killed after commits {moments} and started {b.starts} times; executor "
          f"{c_result.get('lost')} of job C killed; transitions: "
          + ", ".join(f"{n} {len(t)}" for n, t in published.items()) + f"; {len(ma)} series on /metrics A\n"
          "Spark said:\n  " + "\n  ".join(x[:200] for x in said[:40]))
    assert {"IsrShrink", "UnderReplicated", "AtMinIsr"} <= {r["alert"] for r in ta}, \
        "the stream raised less than the scenario should: the comparison proves little"
    assert any(n.startswith("kafka_monitor_group_partition_lag_seconds") for n, _ in ma)
    for name in ("b", "c"):
        kx = [key(r) for r in published[name]]
        assert len(kx) == len(set(kx)), f"job {name.upper()} published a transition twice"
        assert sorted(kx) == sorted(key(r) for r in ta), f"job {name.upper()}'s transitions differ from A's"
        assert served[name] == ma, f"job {name.upper()}'s /metrics differ from A's"
    assert not spark_cluster.managed or any("Lost task" in x and "ExecutorLostFailure" in x for x in said), \
        "the driver's log shows no task lost with the executor: the kill did not land mid-task"
    assert os.path.isdir(c.ckpt / "state")
    # the probe's clients in this process, while broker 3 was down (one once tried 3,400 times a second)
    err = capfd.readouterr().err
    sys.stderr.write(err)  # kept in the report
    assert not reconnect_storms(err), reconnect_storms(err)
