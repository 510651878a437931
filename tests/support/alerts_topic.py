"""Reading the alerts topic back (every transition the job published), used by many e2e and
integration tests, and stopping a job started in its own process group (its JVM and Python
workers with it)."""

from __future__ import annotations

import os
import signal

from streaming.sinks.alerts import read_published


def read_alerts(bootstrap: str, topic: str) -> list[dict]:
    """Every transition on the alerts topic (the product's reader, which replay uses too)."""
    return read_published({"bootstrap.servers": bootstrap}, topic, timeout_s=60)


def kill_group(proc, sig=signal.SIGKILL):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(60)
