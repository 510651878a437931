"""kafka_monitor.supervise: a crashed child is started again, a final status is not, stop stops it."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from kafka_monitor import supervise as sv
from tests.conftest import wait_for

# The child: counts its starts in a file, then behaves as its start number says.
CHILD = r"""
import os, pathlib, signal, sys, time
f = pathlib.Path(sys.argv[1]); n = int(f.read_text() or 0) + 1 if f.exists() else 1
f.write_text(str(n))
plan = sys.argv[2].split(",")
what = plan[min(n, len(plan)) - 1]
if what == "abort": os.abort()
if what == "raise": raise RuntimeError("boom")
if what.startswith("exit"): sys.exit(int(what[4:]))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True: time.sleep(0.1)
"""


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(sv, "BACKOFF_S", 0.05)


def run(tmp_path, plan: str, stop: threading.Event = None):
    counter = tmp_path / "starts"
    stop = stop or threading.Event()
    pids: list[int] = []
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(rc=sv.supervise(
        [sys.executable, "-c", CHILD, str(counter), plan], stop, name="child", on_start=pids.append)))
    t.start()
    return t, stop, pids, result, counter


def test_a_crashed_child_is_started_again_until_it_stays_up(tmp_path, caplog):
    t, stop, pids, result, counter = run(tmp_path, "abort,raise,run")
    try:
        wait_for(lambda: counter.exists() and counter.read_text() == "3", timeout=20, what="the third start")
        time.sleep(0.3)
        assert t.is_alive()  # the third one runs
    finally:
        stop.set()
        t.join(20)
    assert result["rc"] == 0
    assert len(pids) == 3 and len(set(pids)) == 3
    crashes = [r.getMessage() for r in caplog.records if "starting it again" in r.getMessage()]
    assert len(crashes) == 2
    assert "signal SIGABRT" in crashes[0] and "#4605" in crashes[0]
    assert "status 1" in crashes[1]
    with pytest.raises(ProcessLookupError):  # stopped by PID, not left behind
        os.kill(pids[-1], 0)


@pytest.mark.parametrize("status", [0, 2])
def test_a_final_status_ends_supervision_with_that_status(tmp_path, status):
    t, stop, pids, result, counter = run(tmp_path, f"exit{status}")
    t.join(20)
    assert not t.is_alive()
    assert result["rc"] == status
    assert counter.read_text() == "1"  # not started again


def test_backoff_doubles_up_to_its_maximum(tmp_path, monkeypatch):
    waits: list[float] = []
    stop = threading.Event()
    real_wait = stop.wait

    def wait(timeout=None):
        if timeout is not None and timeout != 0.5:  # not the poll loop's
            waits.append(timeout)
            if len(waits) == 4:
                stop.set()
        return real_wait(0 if timeout != 0.5 else 0.05)
    monkeypatch.setattr(stop, "wait", wait)
    monkeypatch.setattr(sv, "BACKOFF_MAX_S", 0.3)
    rc = sv.supervise([sys.executable, "-c", "import os; os.abort()"], stop, name="child")
    assert rc == 0
    assert waits == [0.05, 0.1, 0.2, 0.3]
