"""Session fixture ``kafka_cluster``: one real Apache Kafka cluster (KRaft, a dedicated controller
plus 3 brokers, kafka_monitor.local.kafka_cluster) per test run, stopped at the end even when tests fail.
``second_kafka_cluster``: another, separate one (its own cluster id, ports and directory; one
node that is broker and controller), started only when a test asks for it (the tests that
watch two clusters), stopped by PID at the end of the run.

With ``KAFKA_MONITOR_TEST_KAFKA=<bootstrap servers>`` the tests use that existing cluster
instead; process faults (pause/stop/kill/restart) then skip the test.  Set
``KAFKA_MONITOR_KEEP_KAFKA=1`` to keep the cluster's directory (logs) after the run."""

from __future__ import annotations

import os
import warnings

import pytest

from kafka_monitor.local.kafka_cluster import KafkaCluster


class ExternalKafka(KafkaCluster):
    """Handle on a cluster this test run did not start."""

    def _require_managed(self, what: str) -> None:
        pytest.skip(f"{what}() needs the cluster the tests start themselves; KAFKA_MONITOR_TEST_KAFKA "
                    f"points at an external cluster ({self.bootstrap_servers})")


def in_sync(cluster, topic: str) -> bool:
    """Every partition of ``topic`` has a leader and all 3 replicas in its ISR (False while the
    cluster does not answer)."""
    try:
        parts = cluster.partitions(topic)
    except Exception:  # noqa: BLE001 - not answering yet
        return False
    return bool(parts) and all(leader >= 0 and len(isr) == len(replicas) == 3
                               for leader, replicas, isr in parts.values())


@pytest.fixture(scope="session")
def kafka_cluster():
    external = os.environ.get("KAFKA_MONITOR_TEST_KAFKA")
    if external:
        handle = ExternalKafka.attach(external)
        try:
            yield handle
        finally:
            handle.stop()  # only removes its temporary tool-log directory
        return
    cluster = KafkaCluster(keep_work_dir=bool(os.environ.get("KAFKA_MONITOR_KEEP_KAFKA")))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def kafka_cluster_whole(request):
    """Before each test on the run's cluster: every node running, resumed and every broker
    registered.  A test that failed midway can leave a broker stopped, and a loaded machine can
    see one fenced (its heartbeats late past the session timeout); the next tests would fail for
    it.  What was found is a warning in the run's summary."""
    if "kafka_cluster" in request.fixturenames:
        kc = request.getfixturevalue("kafka_cluster")
        if kc.managed:
            found = kc.restore(timeout=180)
            if found:
                warnings.warn(f"the run's Kafka cluster was not whole before {request.node.nodeid}: "
                              + "; ".join(found), stacklevel=1)
    yield


@pytest.fixture(scope="session")
def second_kafka_cluster():
    cluster = KafkaCluster(broker_ids=(1,), combined=True, keep_work_dir=bool(os.environ.get("KAFKA_MONITOR_KEEP_KAFKA")))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
