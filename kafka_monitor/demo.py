"""The embedded default: everything on one machine, no Docker.

A Tansu broker on a free loopback port, the topics, a small workload, the probe, and the
Spark job in local mode with the exporter on 127.0.0.1.  Ctrl-C (or SIGTERM) stops it all:
query, Spark, probe, workload, broker — nothing is left running.

With ``real_cluster`` (``kafka-monitor demo --real-cluster``) the workload runs on a real
Apache Kafka cluster (kafka_monitor.local.kafka_cluster: a KRaft controller and 3 brokers on
loopback), the probe (its own process) watches that cluster, and ``FaultCycle`` injects a fault every
``fault_every_s``: a paused follower, a stopped broker (then a preferred leader election), two
stopped brokers (``kafka_monitor.demo_faults``).  The cluster and its faults run in a process of
their own (the cluster runner, ``kafka_monitor.demo_cluster``); the monitor's events and alerts
topics stay on Tansu.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Optional

from kafka_monitor.demo_cluster import REAL_MIN_ISR, _cluster_runner, _kafka_setup, _start_runner, _stop_runner
from kafka_monitor.demo_faults import FAULT_EVERY_S, ONE_DOWN_S, PAUSE_S, TWO_DOWN_S
from kafka_monitor.local import workload
from kafka_monitor.local.broker import TansuBroker, create_topics

#: how the demo runs the probe and the job (tests/e2e/test_quiet_when_healthy.py runs the same)
PROBE_INTERVAL_S = 2.0
TRIGGER_S = 2.0
#: the alerts the demo's workload raises on purpose -> why; any other alert is unexpected
#: (tests/e2e/test_quiet_when_healthy.py allows exactly these)
ON_PURPOSE: dict[str, str] = {}  # the consumer's pauses (8 s every 30 s) are OK by the lag rules

# -- the real-cluster demo (--real-cluster) ------------------------------------------------------

#: the alerts the real-cluster demo's faults raise on purpose -> when; the plain demo's
#: ON_PURPOSE above does not apply (its consumer does not pause here)
REAL_CLUSTER_ON_PURPOSE = {
    "IsrShrink": ("every fault: the paused or stopped broker(s) leave the ISR of the demo.orders partitions "
                  "they replicate; resolved when they are back in it"),
    "UnderReplicated": "with every IsrShrink (ISR smaller than the replicas); resolved with it",
    "AtMinIsr": (f"faults 1 and 2 (one broker away): ISR 2 = min.insync.replicas {REAL_MIN_ISR}; resolved when "
                 "the broker is back in the ISR"),
    "UnderMinIsr": ("fault 3 (two brokers stopped, critical): ISR 1 < min.insync.replicas, acks=all writes fail "
                    "and the producer retries; resolved when they are back in the ISR"),
    "LeaderChanged": ("info, faults 2 and 3: leaders move off the stopped broker(s), and the preferred leader "
                      "election after the recovery moves them back; it resolves after 5 quiet minutes, so while "
                      "faults keep coming it mostly stays open"),
    "ConsumerLagStatus": (f"may open (WARN) on partitions of {workload.GROUP} for some seconds around a fault: its "
                          "fetches or its group coordinator wait on a paused or stopped broker, so its lag rises; "
                          "resolved when it has caught up"),
}


def _wait_first_metric(url: str, stop: threading.Event, t_start: float,
                       ready: Optional[threading.Event] = None) -> None:
    """Tell the person when the first partition metric is on /metrics."""
    while not stop.is_set():
        try:
            body = urllib.request.urlopen(url, timeout=2).read().decode()
            if "kafka_monitor_partition_high_watermark{" in body and "kafka_monitor_group_partition_lag{" in body:
                print(f"[demo] first metrics after {time.monotonic() - t_start:.1f}s: partition HW, group lag, ISR "
                      f"are live on {url}", flush=True)
                if ready is not None:
                    ready.set()
                return
        except OSError:
            pass
        stop.wait(1.0)


def run_demo(metrics_port: int = 9465, duration_s: float = 0, probe_interval_s: float = PROBE_INTERVAL_S,
             trigger_s: float = TRIGGER_S, real_cluster: bool = False, fault_every_s: float = FAULT_EVERY_S) -> int:
    """The demo; with ``real_cluster`` on a real Apache Kafka cluster with a fault every
    ``fault_every_s`` seconds (0: none).  Raises
    ``kafka_monitor.local.kafka_install.KafkaSetupError`` when Java or Maven is missing or Kafka
    cannot be fetched."""
    from monitor.probe import Probe
    from monitor.probe_config import ProbeConfig
    from streaming.job import JobConfig, run

    if real_cluster:
        _kafka_setup()  # before anything starts: a missing Java or Maven is reported at once

    t_start = time.monotonic()
    stop = threading.Event()

    def on_signal(signum, _frame):
        what = "query, Spark, probe, workload, Kafka cluster, broker" if real_cluster else \
            "query, Spark, probe, workload, broker"
        print(f"\n[demo] {signal.Signals(signum).name}: stopping ({what})...", flush=True)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    workdir = tempfile.mkdtemp(prefix="kafka-monitor-demo-")
    broker = TansuBroker(log=open(f"{workdir}/tansu.log", "wb")).start()
    print(f"[demo] Tansu broker on {broker.bootstrap} (pid {broker.proc.pid if broker.proc else '?'})"
          + (" for the monitor's events and alerts topics" if real_cluster else ""), flush=True)
    threads: list[threading.Thread] = []
    probe = None
    timer = None
    runner = None
    ready = threading.Event()
    try:
        if real_cluster:
            # The monitor's own topics stay on Tansu, as in the plain demo: the faults take one or
            # two of the real cluster's brokers away, and an events topic there would lose writes
            # (or its leader) exactly when the probe reports the fault.  The probe watches the
            # real cluster and writes its events to Tansu (--events-bootstrap-servers).
            create_topics(broker.bootstrap, {"kafka-monitor.events": 3, "kafka-monitor.alerts": 1})
            runner, watched = _start_runner(workdir, fault_every_s, stop)
            if runner is None:
                return 0 if stop.is_set() else 1
            # a steady consumer (the faults are the show); no client logs of refused connections
            # to the brokers the faults stop
            produce_kw = {"conf": {"log_level": 0}}
            consume_kw = {"pause_s": 0.0, "conf": {"log_level": 0}}
        else:
            create_topics(broker.bootstrap, {"kafka-monitor.events": 3, "kafka-monitor.alerts": 1, workload.TOPIC: 3})
            watched = broker.bootstrap
            produce_kw, consume_kw = {}, {}
        for target, kw in ((workload.produce_loop, produce_kw), (workload.consume_loop, consume_kw)):
            t = threading.Thread(target=target, args=(watched, stop), kwargs=kw, name=target.__name__, daemon=True)
            t.start()
            threads.append(t)
        if real_cluster:
            # On the real cluster the probe runs as its own process, as deployed, and is started
            # again when it exits: librdkafka (2.16) can crash a client whose broker goes away
            # mid-request, and these faults take brokers away (its coordinator requests run in a
            # child of its own: monitor/coordinator.py).
            t = threading.Thread(target=_supervise_probe, name="probe", daemon=True, args=(
                ["--bootstrap-servers", watched, "--events-bootstrap-servers", broker.bootstrap,
                 "--interval", f"{probe_interval_s:g}", "--offsets-via", "list_offsets",
                 "--cluster", "local-kafka", "--source", "demo-probe",
                 "-X", "log_level=2"], stop))  # not librdkafka's logs of the brokers the faults take away
        else:
            probe = Probe(ProbeConfig(bootstrap_servers=broker.bootstrap, interval_s=probe_interval_s,
                                      offsets_via="fetch", cluster="local", source="demo-probe",
                                      quorum_interval_s=0, elr_interval_s=0,
                                      log_dirs_interval_s=0, transactions_interval_s=0))
            # Tansu: no KRaft quorum, no ELR, no log dirs, no ListTransactions
            t = threading.Thread(target=probe.run, args=(stop,), name="probe", daemon=True)
        t.start()
        threads.append(t)
        print(f"[demo] workload: producer -> {workload.TOPIC}, consumer group {workload.GROUP}; "
              f"probe every {probe_interval_s:g}s; starting the Spark job (about 30 s to the first metrics)...", flush=True)
        if real_cluster:
            if fault_every_s > 0:
                print(f"[demo] faults, one every {fault_every_s:g} s from {min(30.0, fault_every_s):g} s after the "
                      f"first metrics, in turn: (1) a follower paused {PAUSE_S:g} s, (2) a broker stopped "
                      f"{ONE_DOWN_S:g} s, then a preferred leader election, (3) two brokers stopped {TWO_DOWN_S:g} s",
                      flush=True)
            print("[demo] alerts the faults raise on purpose (kafka_monitor_alert_active on /metrics and the "
                  "kafka-monitor.alerts topic; the shipped Prometheus rules wait 1-5 minutes before firing):",
                  flush=True)
            for name, why in REAL_CLUSTER_ON_PURPOSE.items():
                print(f"[demo]   {name}: {why}", flush=True)
        else:
            if ON_PURPOSE:
                print("[demo] alerts on purpose (anything else is unexpected):", flush=True)
            else:
                print(f"[demo] no alert is expected: {workload.GROUP} pauses {workload.PAUSE_S:g} s every "
                      f"{workload.PAUSE_EVERY_S:g} s and catches up, which the lag rules call OK; any alert "
                      "on /metrics is unexpected", flush=True)
            for name, why in ON_PURPOSE.items():
                print(f"[demo]   {name}: {why}", flush=True)
        if runner is not None:
            def tell_ready():  # the runner starts the fault schedule once metrics are live
                while not ready.wait(1.0):
                    if stop.is_set():
                        return
                with contextlib.suppress(OSError, ValueError):
                    runner.stdin.write(b"ready\n")
                    runner.stdin.flush()
            threading.Thread(target=tell_ready, name="tell-ready", daemon=True).start()
        if duration_s:
            timer = threading.Timer(duration_s, stop.set)
            timer.daemon = True
            timer.start()

        def on_started(port: int) -> None:
            url = f"http://127.0.0.1:{port}/metrics"
            print(f"[demo] Spark job running; metrics at {url}  (Ctrl-C stops everything)", flush=True)
            threading.Thread(target=_wait_first_metric, args=(url, stop, t_start, ready), daemon=True).start()

        run(JobConfig(bootstrap_servers=broker.bootstrap, checkpoint_dir=f"{workdir}/checkpoint",
                      trigger_s=trigger_s, metrics_port=metrics_port), stop_event=stop, on_started=on_started)
        return 0
    finally:
        stop.set()
        if timer is not None:
            timer.cancel()  # Ctrl-C before the duration: nothing may keep the process alive
        for t in threads:
            t.join(10)
        if probe is not None:
            probe.close(flush_timeout=2)
        _stop_spark()
        if runner is not None:
            _stop_runner(runner)
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        print("[demo] stopped.", flush=True)


def _supervise_probe(args: list, stop: threading.Event) -> None:
    """Run ``kafka-monitor probe <args>`` until ``stop``, started again when it crashes
    (``kafka_monitor.supervise``); stopped by PID (SIGTERM: it flushes and exits)."""
    from kafka_monitor.supervise import CHILD_ENV, supervise

    env = {**os.environ, CHILD_ENV: "1",
           "KAFKA_MONITOR_PROBE_REQUEST_TIMEOUT_S": "5", "KAFKA_MONITOR_PROBE_REFRESH_BACKOFF_S": "0.5"}
    cmd = [sys.executable, "-m", "kafka_monitor.cli", "--log-level", "WARNING", "probe", *args]
    supervise(cmd, stop, name="the probe", env=env, stop_timeout_s=10,
              on_start=lambda pid: print(f"[demo] probe running as its own process, pid {pid}", flush=True))


def _stop_spark() -> None:
    from streaming.job import stop_active_spark

    stop_active_spark()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cluster-runner"]:  # the real-cluster demo's Kafka cluster (see _cluster_runner)
        import argparse
        ap = argparse.ArgumentParser(prog="kafka_monitor.demo --cluster-runner")
        ap.add_argument("--cluster-runner", action="store_true")
        ap.add_argument("--work-dir", required=True)
        ap.add_argument("--fault-every", type=float, default=FAULT_EVERY_S)
        a = ap.parse_args()
        sys.exit(_cluster_runner(a.work_dir, a.fault_every))
    sys.exit(run_demo())
