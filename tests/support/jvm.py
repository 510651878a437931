"""The JVM options of the Spark JVMs the tests start (the shared session, the jobs they run as
processes): C1 only and the serial collector, as the tests' own Kafka cluster runs
(kafka_monitor.local.kafka_cluster.DEFAULT_JVM_OPTS).  The compose tier's containers get the JIT
part only (tests/support/docker_engine.py).

A job's start to its second commit took 34.1 CPU-s with Spark's defaults and 22.6 with these
(medians of 3, idle machine); the suite runs three workers on 2 cores (docs/tests.md).  For the
tests' CPU only: nothing they check depends on them, and users' jobs keep Spark's defaults."""

from __future__ import annotations

import shlex

#: the JIT part alone (a JVM given two collectors refuses to start)
LEAN_JIT = "-XX:TieredStopAtLevel=1"
LEAN_JVM = f"{LEAN_JIT} -XX:+UseSerialGC"


def submit_args(*args: str) -> str:
    """PYSPARK_SUBMIT_ARGS for a Spark JVM the tests start: the driver with LEAN_JVM, then ``args``."""
    return shlex.join(["--driver-java-options", LEAN_JVM, *args, "pyspark-shell"])
