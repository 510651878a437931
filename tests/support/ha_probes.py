"""Probes of an HA group as processes of their own (the member itself, no supervisor: a SIGKILL is
a host lost), for tests/e2e/test_ha_group.py and bench/ha_bench.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from kafka_monitor.supervise import CHILD_ENV


class ProbeProcess:
    """``kafka-monitor probe --ha-group GROUP --source NAME`` on ``bootstrap``, every second, its
    log in ``log_dir/NAME.log``; ``extra``: more CLI arguments."""

    def __init__(self, name: str, bootstrap: str, events: str, group: str, shards: int, topics: str, groups: str,
                 cluster: str, log_dir: Path, extra: Sequence[str] = ()):
        self.name = name
        self.log = open(log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kafka_monitor.cli", "--log-format", "json", "probe",
             "--bootstrap-servers", bootstrap, "--events-topic", events, "--cluster", cluster, "--source", name,
             "--interval", "1", "--topics", topics, "--groups", groups, "--ha-group", group, "--shards", str(shards),
             *extra],
            stdout=subprocess.DEVNULL, stderr=self.log, env={**os.environ, CHILD_ENV: "1"})

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, should it be paused), SIGKILL if it has not stopped in 20 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
