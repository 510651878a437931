"""The embedded default: everything on one machine, no Docker.

A Tansu broker on a free loopback port, the topics, a small workload, the probe, and the
Spark job in local mode with the exporter on 127.0.0.1.  Ctrl-C (or SIGTERM) stops it all:
query, Spark, probe, workload, broker — nothing is left running.
"""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request

from kafka_monitor import workload
from kafka_monitor.broker import TansuBroker, create_topics

log = logging.getLogger(__name__)

#: how the demo runs the probe and the job (tests/e2e/test_quiet_when_healthy.py runs the same)
PROBE_INTERVAL_S = 2.0
TRIGGER_S = 2.0
#: the alerts the demo's workload raises on purpose -> why; any other alert is unexpected
#: (tests/e2e/test_quiet_when_healthy.py allows exactly these)
ON_PURPOSE = {
    "ConsumerLagStatus": (f"the job's WARN on the partitions of {workload.GROUP}: its consumer pauses "
                          f"{workload.PAUSE_S:g} s every {workload.PAUSE_EVERY_S:g} s, so its lag rises; "
                          "resolved when it catches up"),
    "KafkaConsumerLagGrowing": ("pending in Prometheus during those pauses; it fires only after 15 minutes of "
                                "WARN, so never on the demo"),
}


def _wait_first_metric(url: str, stop: threading.Event, t_start: float) -> None:
    """Tell the person when the first partition metric is on /metrics."""
    while not stop.is_set():
        try:
            body = urllib.request.urlopen(url, timeout=2).read().decode()
            if "kafka_monitor_partition_high_watermark{" in body and "kafka_monitor_group_partition_lag{" in body:
                print(f"[demo] first metrics after {time.monotonic() - t_start:.1f}s: partition HW, group lag, ISR "
                      f"are live on {url}", flush=True)
                return
        except OSError:
            pass
        stop.wait(1.0)


def run_demo(metrics_port: int = 9465, duration_s: float = 0, probe_interval_s: float = PROBE_INTERVAL_S,
             trigger_s: float = TRIGGER_S) -> int:
    from monitor.probe import Probe, ProbeConfig
    from streaming.job import JobConfig, run

    t_start = time.monotonic()
    stop = threading.Event()

    def on_signal(signum, _frame):
        print(f"\n[demo] {signal.Signals(signum).name}: stopping (query, Spark, probe, workload, broker)...", flush=True)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    workdir = tempfile.mkdtemp(prefix="kafka-monitor-demo-")
    broker = TansuBroker(log=open(f"{workdir}/tansu.log", "wb")).start()
    print(f"[demo] Tansu broker on {broker.bootstrap} (pid {broker.proc.pid})", flush=True)
    threads: list[threading.Thread] = []
    probe = None
    timer = None
    try:
        create_topics(broker.bootstrap, {"kafka-monitor.events": 3, "kafka-monitor.alerts": 1, workload.TOPIC: 3})
        for target in (workload.produce_loop, workload.consume_loop):
            t = threading.Thread(target=target, args=(broker.bootstrap, stop), name=target.__name__, daemon=True)
            t.start()
            threads.append(t)
        probe = Probe(ProbeConfig(bootstrap_servers=broker.bootstrap, interval_s=probe_interval_s,
                                  offsets_via="fetch", cluster="local", source="demo-probe"))
        t = threading.Thread(target=probe.run, args=(stop,), name="probe", daemon=True)
        t.start()
        threads.append(t)
        print(f"[demo] workload: producer -> {workload.TOPIC}, consumer group {workload.GROUP}; "
              f"probe every {probe_interval_s:g}s; starting the Spark job (about 30 s to the first metrics)...", flush=True)
        print("[demo] alerts on purpose (anything else is unexpected):", flush=True)
        for name, why in ON_PURPOSE.items():
            print(f"[demo]   {name}: {why}", flush=True)
        if duration_s:
            timer = threading.Timer(duration_s, stop.set)
            timer.daemon = True
            timer.start()

        def on_started(port: int) -> None:
            url = f"http://127.0.0.1:{port}/metrics"
            print(f"[demo] Spark job running; metrics at {url}  (Ctrl-C stops everything)", flush=True)
            threading.Thread(target=_wait_first_metric, args=(url, stop, t_start), daemon=True).start()

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
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        print("[demo] stopped.", flush=True)


def _stop_spark() -> None:
    from pyspark.sql import SparkSession

    from streaming.job import stop_spark

    spark = SparkSession.getActiveSession()
    if spark is not None:
        stop_spark(spark)


if __name__ == "__main__":
    sys.exit(run_demo())
