"""The embedded demo stopped the way a user stops it: a signal to its whole process group (a
Ctrl-C in the terminal does that), which reaches Spark's JVM too.  It must still stop its
broker and remove its work directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.support.prometheus import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_a_signal_to_the_demos_process_group_stops_it_cleanly(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its work directory goes here
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kafka_monitor.cli", "demo", "--metrics-port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_for(lambda: any("first metrics after" in x for x in lines) or proc.poll() is not None, timeout=180,
                 what="the demo's first metrics")
        assert proc.poll() is None, "".join(lines[-40:])
        assert list(tmp_path.glob("kafka-monitor-demo-*")), "the demo's work directory"
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    reader.join(10)
    out = "".join(lines)
    assert "[demo] stopped." in out, out[-4000:]
    assert not list(tmp_path.glob("kafka-monitor-demo-*")), out[-4000:]
