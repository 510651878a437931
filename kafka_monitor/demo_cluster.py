"""The real-cluster demo's Kafka cluster, in a process of its own.

The Kafka cluster and its faults run in a process of their own (``python -m
kafka_monitor.demo --cluster-runner``), started before Spark: restarting a broker forks with
kafka_monitor.local.kafka_cluster's preexec_fn, which in the Spark driver's process would reset
its Py4J connections (see kafka_monitor.local.broker.popen_dying_with_parent).  The runner
starts the cluster, creates the workload topic, writes ``cluster.json`` (bootstrap servers)
into its work directory, and runs the faults from its main thread (brokers it starts die with
that thread) once the demo writes "ready" to its stdin (the first metrics are live).  SIGTERM
or the end of its stdin (the demo exited) stops it: a paused broker is resumed and the cluster
stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from kafka_monitor.demo_faults import FaultCycle
from kafka_monitor.local import workload

#: min.insync.replicas of the workload topic (replication factor 3): one broker away is
#: AtMinIsr, two are UnderMinIsr
REAL_MIN_ISR = 2
#: the workload topic's replica lists on brokers 1, 2, 3: the first replica is the preferred
#: leader; broker 3 leads nothing, so pausing it is a follower's fault only
REAL_ASSIGNMENT = [[1, 2, 3], [2, 1, 3], [1, 2, 3]]
#: the real-cluster demo's broker.session.timeout.ms: a paused broker is fenced after it
_SESSION_TIMEOUT_MS = 8000


def _popen(cmd: list, **kw):
    from kafka_monitor.local.broker import popen_dying_with_parent

    return popen_dying_with_parent(cmd, **kw)


def _kafka_setup() -> None:
    """Java 17+ and the Kafka jars (fetched with Maven on the first run)."""
    from kafka_monitor.local.kafka_install import default_version, ensure_kafka, java_bin, kafka_home

    java_bin()
    home = kafka_home()
    if not (home / ".complete").exists():
        print(f"[demo] first run: fetching Apache Kafka {default_version()} from Maven Central with mvn into {home} "
              "(about 55 MB; a minute or two, once)...", flush=True)
    ensure_kafka()


def _start_runner(workdir: str, fault_every_s: float, stop: threading.Event):
    """Start the cluster runner; return ``(process, bootstrap servers)`` once its cluster is up,
    or ``(None, None)`` when it failed or the demo was stopped meanwhile (the runner stopped)."""
    import json
    import subprocess

    info = f"{workdir}/kafka/cluster.json"
    runner = _popen([sys.executable, "-m", "kafka_monitor.demo", "--cluster-runner", "--work-dir", f"{workdir}/kafka",
                     "--fault-every", f"{fault_every_s:g}"], stdin=subprocess.PIPE)
    while not stop.is_set():
        if os.path.exists(info):
            with open(info) as f:
                return runner, json.load(f)["bootstrap_servers"]
        if runner.poll() is not None:
            print(f"[demo] error: the Kafka cluster did not start (its runner exited with {runner.returncode}; "
                  "see above)", flush=True)
            return None, None
        stop.wait(0.5)
    _stop_runner(runner)
    return None, None


def _stop_runner(runner, timeout: float = 60.0) -> None:
    """Ask the runner to stop (end of stdin, SIGTERM), wait for it by PID, SIGKILL after ``timeout``
    (its brokers then die with it: their parent-death signal)."""
    import subprocess

    with contextlib.suppress(OSError, ValueError):
        runner.stdin.close()
    if runner.poll() is None:
        print(f"[demo] stopping the Kafka cluster (runner pid {runner.pid})...", flush=True)
        runner.terminate()
    try:
        runner.wait(timeout)
    except subprocess.TimeoutExpired:
        runner.kill()
        runner.wait()


def _cluster_runner(work_dir: str, fault_every_s: float) -> int:
    import json

    from kafka_monitor.local.kafka_cluster import KafkaCluster

    stop, ready = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def read_stdin():  # "ready": the demo's metrics are live; end of input: the demo is gone
        for line in sys.stdin:
            if line.strip() == "ready":
                ready.set()
        stop.set()
    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()

    os.makedirs(work_dir, exist_ok=True)
    cluster = KafkaCluster(work_dir=work_dir, broker_session_timeout_ms=_SESSION_TIMEOUT_MS)
    try:
        _start_cluster(cluster, stop)
        cluster.create_topic(workload.TOPIC, replica_assignment=REAL_ASSIGNMENT,
                             config={"min.insync.replicas": REAL_MIN_ISR})
        print(f"[demo] topic {workload.TOPIC}: 3 partitions, replication factor 3, min.insync.replicas "
              f"{REAL_MIN_ISR}, replicas {REAL_ASSIGNMENT} (first = preferred leader)", flush=True)
        tmp = f"{work_dir}/cluster.json.tmp"
        with open(tmp, "w") as f:
            json.dump({"bootstrap_servers": cluster.bootstrap_servers}, f)
        os.rename(tmp, f"{work_dir}/cluster.json")
        if fault_every_s > 0:
            FaultCycle(cluster, workload.TOPIC, stop, fenced_after_s=_SESSION_TIMEOUT_MS / 1000).run(
                fault_every_s, first_after_s=min(30.0, fault_every_s), ready=ready)
        stop.wait()
        return 0
    except Exception as e:
        if not stop.is_set():
            print(f"[demo] error: the Kafka cluster: {e}", file=sys.stderr, flush=True)
            return 1
        return 0
    finally:
        cluster.stop()  # resumes a paused broker first


def _start_cluster(cluster, stop: threading.Event) -> None:
    print(f"[demo] starting Apache Kafka {cluster.version} on 127.0.0.1: a KRaft controller and {len(cluster.broker_ids)} "
          f"brokers, one JVM each (about 20-60 s)...", flush=True)
    t0 = time.monotonic()
    started = threading.Event()

    def ticker():
        while not started.wait(15) and not stop.is_set():
            print(f"[demo]   ... the Kafka cluster is still starting ({time.monotonic() - t0:.0f} s)", flush=True)
    threading.Thread(target=ticker, daemon=True).start()
    try:
        cluster.start()
    finally:
        started.set()
    pids = ", ".join(f"{b}: pid {cluster.pid(b)}" for b in cluster.broker_ids)
    print(f"[demo] Kafka cluster up in {time.monotonic() - t0:.1f}s: bootstrap {cluster.bootstrap_servers} "
          f"(brokers {pids}; controller pid {cluster.pid(cluster.controller_id)})", flush=True)

