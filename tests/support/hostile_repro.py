"""Reproduce issue 19 as the user saw it: a Tansu broker, the job run as ``kafka-monitor job``
(its own JVM, Spark's default 1 GB heap shared by driver and executors in local mode), 10,000
hostile records of 12 kinds, then the 6,000 with complete envelopes (500 of them valid events
carrying an extra 300 KB field).  Prints what /metrics says every few seconds and what the
job's log says at the end.

    .venv/bin/python -m tests.support.hostile_repro [--watch 240] [--quarantined-blobs 1000]
                                                   [--gc-log /tmp/gc.log] [--extra-job-args "..."]

What it showed before the fix (commit 15d01a5): every quarantined record kept its whole text
(``raw``), all of a batch's went to the one quarantine bucket (one task, one pandas frame) and
came back to the driver as ``quarantine_event`` rows through the sink's ``toArrow()``.  The
10,000 put 158 MB of text in one batch (batch-0 quarantine file: 157,849,042 bytes) and the
JVM heap went to a Full GC at 990 of 1,024 MB; with 1,000 more refused records of 300 KB in
the next batch, ``collectAsArrowToPython`` failed to allocate 512 MB (OutOfMemoryException in
the result task; in the user's run the task-result-getter thread died and the query hung).
The 500 valid events with a 300 KB field were not the cause: unknown fields are dropped while
decoding and good rows drop their text (that batch's quarantine file was 1.9 MB).  After the
fix: the same records, every one quarantined with its reason, 3 MB of quarantine files, heap
peak 192 MB.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from kafka_monitor.local.broker import TansuBroker, create_topics, free_port
from tests.support import hostile


def metrics(port: int) -> dict:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.name.startswith("kafka_monitor_job") or s.name.startswith("kafka_monitor_events_quarantined"):
                out[(s.name, s.labels.get("reason", ""))] = s.value
    return out


def summary(m: dict) -> str:
    q = {r: int(v) for (n, r), v in m.items() if n == "kafka_monitor_events_quarantined_total" and v}
    return (f"up={m.get(('kafka_monitor_job_up', ''))} batches={m.get(('kafka_monitor_job_batches_total', ''))} "
            f"behind={m.get(('kafka_monitor_job_events_behind', ''))} quarantined={sum(q.values())} {q}")


def produce(bootstrap: str, topic: str, records) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "message.max.bytes": 1_000_000})
    for *_, key, value in records:
        p.produce(topic, key=key, value=value)
        p.poll(0)
    assert p.flush(60) == 0
    for part in range(3):  # Tansu: a single-record last batch makes ListOffsets "latest" exact
        p.produce(topic, key=b"pad", value=b"pad", partition=part)
        p.flush(10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--watch", type=float, default=240, help="seconds to watch after the 6,000 (default 240)")
    ap.add_argument("--extra-job-args", default="")
    ap.add_argument("--quarantined-blobs", type=int, default=0,
                    help="also write this many hostile records (ISR outside the replicas) carrying a 300 KB field")
    ap.add_argument("--gc-log", help="write the job JVM's GC log here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hostile-repro-")
    broker = TansuBroker(log=open(os.path.join(work, "tansu.log"), "wb")).start()
    job = None
    try:
        create_topics(broker.bootstrap, {"kafka-monitor.events": 3})
        now = int(time.time() * 1000)
        produce(broker.bootstrap, "kafka-monitor.events", hostile.garbage(10_000, now))
        port = free_port()
        log_path = os.path.join(work, "job.log")
        env = dict(os.environ)
        if args.gc_log:
            env["PYSPARK_SUBMIT_ARGS"] = f"--driver-java-options -Xlog:gc:file={args.gc_log} pyspark-shell"
        job = subprocess.Popen([sys.executable, "-m", "kafka_monitor.cli", "job", "--bootstrap-servers",
                                broker.bootstrap, "--checkpoint", os.path.join(work, "ckpt"), "--alerts-topic", "",
                                "--trigger", "2", "--metrics-port", str(port), *shlex.split(args.extra_job_args)],
                               stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, start_new_session=True, env=env)
        print(f"job pid {job.pid}, log {log_path}, metrics :{port}", flush=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 180 and job.poll() is None:
            m = metrics(port)
            print(f"[{time.monotonic() - t0:5.0f}s] {summary(m)}", flush=True)
            if sum(v for (n, _), v in m.items() if n == "kafka_monitor_events_quarantined_total") >= 10_003:
                break
            time.sleep(3)
        print("--- writing the 6,000", flush=True)
        now = int(time.time() * 1000)
        produce(broker.bootstrap, "kafka-monitor.events",
                hostile.well_formed(6_000, now) + hostile.quarantined_blobs(args.quarantined_blobs, now))
        t1 = time.monotonic()
        while time.monotonic() - t1 < args.watch and job.poll() is None:
            print(f"[{time.monotonic() - t1:5.0f}s] {summary(metrics(port))}", flush=True)
            time.sleep(5)
        print(f"job exit code: {job.poll()}", flush=True)
        log = open(log_path, errors="replace").read()
        for line in log.splitlines():
            if any(w in line for w in ("OutOfMemory", "ERROR", "Exception", "error", "stall")):
                print("LOG:", line[:300])
        return 0
    finally:
        if job is not None and job.poll() is None:
            os.killpg(job.pid, 15)
            try:
                job.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, 9)
                job.wait(10)
        broker.stop()
        print(f"work dir {work}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
