"""Fixture ``spark_cluster``: a Spark standalone master and two workers (1 core, 1 GiB each) on
loopback (kafka_monitor.spark_cluster), for the tests that need executors on other JVMs;
stopped at the end of the module even when tests fail.

With ``KAFKA_MONITOR_TEST_SPARK_MASTER=spark://host:port`` the tests use that master instead
(``managed`` is False: tests leave out the process faults, and the fault methods skip).  ``KAFKA_MONITOR_KEEP_SPARK=1`` keeps
the cluster's directory (master, worker and executor logs) after the run."""

from __future__ import annotations

import os

import pytest

from kafka_monitor.spark_cluster import SparkCluster


class ExternalSpark(SparkCluster):
    """Handle on a master this test run did not start."""

    managed = False

    def __init__(self, url: str):
        super().__init__(workers=0)
        self.url = url

    @property
    def master_url(self) -> str:
        return self.url

    def start(self, timeout: float = 0) -> "ExternalSpark":
        return self

    def _require_managed(self, what: str) -> None:
        pytest.skip(f"{what} needs the Spark cluster the tests start; KAFKA_MONITOR_TEST_SPARK_MASTER "
                    f"points at {self.url}")

    def kill_executor(self, executor_id: str) -> int:
        self._require_managed("killing an executor")
        return 0

    def kill_worker(self, i: int) -> None:
        self._require_managed("killing a worker")

    def start_worker(self, i: int, wait: bool = True, timeout: float = 120.0) -> None:
        self._require_managed("starting a worker")


@pytest.fixture(scope="module")
def spark_cluster():
    external = os.environ.get("KAFKA_MONITOR_TEST_SPARK_MASTER")
    cluster = ExternalSpark(external) if external else SparkCluster(workers=2, cores=1, memory="1g")
    try:
        yield cluster.start()
    finally:
        cluster.stop()
