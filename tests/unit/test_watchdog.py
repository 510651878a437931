"""streaming.watchdog's timing with a fake clock (its real use, a stalled query, is in
tests/integration/test_watchdog.py)."""

from __future__ import annotations

import threading

from streaming.watchdog import Watchdog


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_first_batch_gets_the_start_up_allowance_then_each_batch_the_timeout():
    clock = Clock()
    w = Watchdog(60, lambda m: None, first_batch_s=300, clock=clock).start()
    clock.t += 299
    assert w.check() is None  # starting: five minutes
    clock.t += 2
    assert "no micro-batch completed for 300s (0 completed, none since the query started)" in w.check()
    w.batch_done()
    clock.t += 60
    assert w.check() is None
    clock.t += 1
    msg = w.check()
    assert "no micro-batch completed for 60s (1 completed, the last one 61s ago)" in msg
    assert "kafka_monitor_job_up is 0" in msg and "stall_timeout_s" in msg
    w.batch_done()
    assert w.check() is None
    w.stop()


def test_a_long_timeout_applies_to_the_first_batch_too_and_0_turns_it_off():
    clock = Clock()
    w = Watchdog(900, lambda m: None, first_batch_s=300, clock=clock)
    clock.t += 901
    assert "900s" in w.check()
    off = Watchdog(0, lambda m: None, clock=clock).start()
    clock.t += 10 ** 6
    assert off.check() is None and not off._thread.is_alive()


def test_it_fires_once_then_exits_hard_unless_stopped():
    clock = Clock()
    fired, exited = [], threading.Event()
    w = Watchdog(5, fired.append, first_batch_s=0, clock=clock, poll_s=0.01, exit_after_s=0.05,
                 hard_exit=exited.set).start()
    clock.t += 6
    assert exited.wait(10)
    assert w.fired.is_set() and len(fired) == 1 and fired[0] == w.message
    # stopped in time (the process exits by itself): no hard exit
    exited2 = threading.Event()
    w2 = Watchdog(5, lambda m: None, first_batch_s=0, clock=clock, poll_s=0.01, exit_after_s=30,
                  hard_exit=exited2.set).start()
    clock.t += 6
    assert w2.fired.wait(10)
    w2.stop()
    w2._thread.join(10)
    assert not w2._thread.is_alive() and not exited2.is_set()
