"""A job that cannot make progress fails loudly (issue 19): real queries over Tansu whose state
function blocks (the batch never completes, as when the task-result-getter died of
OutOfMemoryError) or fails.  ``run()`` sets kafka_monitor_job_up to 0 and raises; the command
line exits with status 3 (stalled) and says why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_monitor.local.broker import create_topics, free_port
from monitor.contract import Event, Heartbeat
from streaming import job
from streaming.state import function as state
from streaming.sinks.exporter import Exporter
from streaming.job import JobConfig, JobFailed, JobStalled
from tests.conftest import unique, wait_for
from tests.support import stall_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # over 20 s (docs/tests.md)

ROOT = Path(__file__).resolve().parents[2]
STALL_S = 12  # a healthy no-data batch takes ~1 s, and a few on a loaded machine


def produce(bootstrap: str, topic: str, source: str, seq: int) -> None:
    """One heartbeat from ``source``, then a single-record pad (Tansu lists the end of a
    partition only up to its last batch)."""
    p = Producer({"bootstrap.servers": bootstrap})
    e = Event.of(Heartbeat(interval_ms=600_000, events_sent=seq, events_dropped=0), cluster="wd", source=source,
                 seq=seq, observed_at=int(time.time() * 1000))
    p.produce(topic, key=e.key().encode(), value=e.to_json())
    p.flush(10)
    p.produce(topic, key=b"pad", value=b"pad")
    p.flush(10)


def sample(exporter: Exporter, name: str) -> float:
    return exporter.registry.get_sample_value(name) or 0.0


def run_in_thread(cfg: JobConfig, exporter: Exporter, stop: threading.Event) -> tuple[threading.Thread, list]:
    errors: list = []

    def target() -> None:
        try:
            job.run(cfg, stop_event=stop, exporter=exporter)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    t = threading.Thread(target=target, name="job-run", daemon=True)
    t.start()
    return t, errors


def job_cfg(tansu, tmp_path, topic: str) -> JobConfig:
    return JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(tmp_path / "ckpt"), events_topic=topic,
                     trigger_s=1, buckets=2, stall_timeout_s=STALL_S, alerts_topic="", metrics_port=free_port())


def test_a_stalled_query_sets_job_up_to_0_and_run_raises(tansu, spark, tmp_path, monkeypatch):
    topic = unique("wd-stall")
    create_topics(tansu.bootstrap, {topic: 1})
    release = tmp_path / "release"
    monkeypatch.setattr(state, "make_state_function", stall_job.blocking_state(str(release)))
    cfg = job_cfg(tansu, tmp_path, topic)
    exporter, stop = Exporter(), threading.Event()
    produce(tansu.bootstrap, topic, "probe-ok", 0)
    t, errors = run_in_thread(cfg, exporter, stop)
    try:
        wait_for(lambda: errors or sample(exporter, "kafka_monitor_job_batches_total") >= 1, timeout=240,
                 what="the first batch")
        # healthy and idle for longer than the stall timeout: batches keep completing (the state's
        # processing-time timeout makes Spark run one every trigger), the watchdog stays quiet
        idle_from, first = time.monotonic(), sample(exporter, "kafka_monitor_job_batches_total")

        def idle_long_enough():
            assert not errors, errors
            assert sample(exporter, "kafka_monitor_job_up") == 1
            return time.monotonic() - idle_from > STALL_S + 2

        wait_for(idle_long_enough, timeout=60, what="an idle job outliving the stall timeout")
        assert sample(exporter, "kafka_monitor_job_batches_total") - first >= 2  # one a trigger (1 s) when not loaded

        produce(tansu.bootstrap, topic, stall_job.MARKER, 1)  # its bucket's task blocks from now on
        t_block = time.monotonic()
        wait_for(lambda: errors, timeout=STALL_S + 120, what="run() to give up on the stalled query")
        took = time.monotonic() - t_block
        err = errors[0]
        assert isinstance(err, JobStalled), repr(err)
        assert f"no micro-batch completed for {STALL_S}s" in str(err)
        assert sample(exporter, "kafka_monitor_job_up") == 0
        # the watchdog counts from the last completed batch, which may have ended up to a trigger
        # (1 s) before the marker was produced: seen at 11.8 s with STALL_S 12
        assert STALL_S - 2 <= took <= STALL_S + 90, took
        t.join(60)
        assert not t.is_alive()
        assert not [q for q in spark.streams.active if q.name == "kafka-monitor"]  # run() stopped it
    finally:
        release.touch()
        stop.set()
        t.join(60)
    print(f"\nstalled query detected and stopped {took:.1f}s after its batch blocked (stall timeout {STALL_S}s)")


def test_a_failed_query_sets_job_up_to_0_and_run_raises(tansu, spark, tmp_path, monkeypatch):
    topic = unique("wd-fail")
    create_topics(tansu.bootstrap, {topic: 1})
    monkeypatch.setattr(state, "make_state_function", stall_job.blocking_state(str(tmp_path / "r"), fail=True))
    cfg = job_cfg(tansu, tmp_path, topic)
    exporter, stop = Exporter(), threading.Event()
    produce(tansu.bootstrap, topic, stall_job.MARKER, 0)
    t, errors = run_in_thread(cfg, exporter, stop)
    try:
        wait_for(lambda: errors, timeout=240, what="run() to report the failed query")
        assert isinstance(errors[0], JobFailed) and not isinstance(errors[0], JobStalled), repr(errors[0])
        assert "the test's state function failed on purpose" in str(errors[0])
        assert sample(exporter, "kafka_monitor_job_up") == 0
    finally:
        stop.set()
        t.join(60)


def test_the_command_line_exits_with_status_3_when_the_query_stalls(tansu, tmp_path):
    topic = unique("wd-cli")
    create_topics(tansu.bootstrap, {topic: 1})
    produce(tansu.bootstrap, topic, "probe-ok", 0)
    port = free_port()
    log_path = tmp_path / "job.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.stall_job", "job", "--bootstrap-servers", tansu.bootstrap,
             "--checkpoint", str(tmp_path / "ckpt"), "--events-topic", topic, "--alerts-topic", "", "--trigger", "1",
             "--buckets", "2", "--stall-timeout", str(STALL_S), "--metrics-port", str(port)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # its group: JVM and workers
    try:
        def batches():
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                return None
            line = [x for x in body.splitlines() if x.startswith("kafka_monitor_job_batches_total ")]
            return line and float(line[0].split()[1]) >= 2

        wait_for(batches, timeout=240, interval=0.5, what="the job's first batches")
        produce(tansu.bootstrap, topic, stall_job.MARKER, 1)
        t_block = time.monotonic()
        wait_for(lambda: proc.poll() is not None, timeout=STALL_S + 150, what="the stalled job to exit")
        took = time.monotonic() - t_block
        out = log_path.read_text(errors="replace")
        assert proc.returncode == 3, out[-3000:]
        assert f"error: job stalled: no micro-batch completed for {STALL_S}s" in out, out[-3000:]
        assert "kafka_monitor_job_up is 0" in out
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left (a blocked Python worker)
        except ProcessLookupError:
            pass
        proc.wait(30)
    print(f"\nkafka-monitor job exited with status 3, {took:.1f}s after its batch blocked (stall timeout {STALL_S}s)")
