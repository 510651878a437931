"""The job fails loudly instead of hanging (issue 19).

A micro-batch that never completes (a task-result-getter thread that died of
``OutOfMemoryError``, a wedged Python worker, a JVM lost in garbage collection) stops the query
without failing it: Spark reports nothing, ``exception()`` stays None, and the process would
serve stale gauges with ``kafka_monitor_job_up`` at 1 forever.  The watchdog notices that no
batch has completed for ``timeout_s``; the job then sets ``kafka_monitor_job_up`` to 0, says
why, and exits non-zero, so that its supervisor restarts it from the checkpoint.

Batches complete even when no event arrives: the state's processing-time timeout makes Spark
run a batch every trigger, so a healthy job completes one every ``trigger_s`` (a few seconds
at most when idle) and silence means a stuck batch, not a quiet topic.  The first batch after a
start (Python workers and the quality gate to build, state to load, a backlog to read) gets
``max(timeout_s, FIRST_BATCH_S)``: five minutes, as the KafkaMonitorJobFallingBehind rule gives
a starting job.

The watchdog is a daemon thread that reads only Python state (the time of the last completed
batch, set by the sink): it fires even when calls into the JVM do not return.  If the process
has not gone within ``exit_after_s`` of firing (a main thread stuck in such a call), it calls
``hard_exit``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

log = logging.getLogger(__name__)

#: the least time the first batch after a start is given
FIRST_BATCH_S = 300.0


class Watchdog:
    def __init__(self, timeout_s: float, on_stall: Callable[[str], None], *,
                 hard_exit: Optional[Callable[[], None]] = None, exit_after_s: float = 60.0,
                 first_batch_s: Optional[float] = None, clock: Callable[[], float] = time.monotonic,
                 poll_s: Optional[float] = None):
        self.timeout_s = timeout_s
        self.first_batch_s = FIRST_BATCH_S if first_batch_s is None else first_batch_s
        self.on_stall = on_stall
        self.hard_exit = hard_exit
        self.exit_after_s = exit_after_s
        self.clock = clock
        self.poll_s = poll_s if poll_s is not None else min(5.0, max(0.1, timeout_s / 20))
        self.batches = 0
        self.message: Optional[str] = None
        self.fired = threading.Event()
        self._last = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-monitor-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        """Start watching (the clock starts now: the first batch, start-up included, must
        complete within the timeout too).  A timeout of 0 watches nothing."""
        self._last = self.clock()
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def batch_done(self) -> None:
        self._last = self.clock()
        self.batches += 1

    def check(self) -> Optional[str]:
        """The stall message once no batch has completed for the timeout, else None."""
        idle = self.clock() - self._last
        limit = self.timeout_s if self.batches else max(self.timeout_s, self.first_batch_s)
        if self.timeout_s <= 0 or idle <= limit:
            return None
        last = f"the last one {idle:.0f}s ago" if self.batches else "none since the query started"
        return (f"no micro-batch completed for {limit:g}s ({self.batches} completed, {last}): "
                f"the query is stuck; kafka_monitor_job_up is 0 and the job exits so that it is restarted "
                f"from its checkpoint (raise job.stall_timeout_s if batches legitimately take this long)")

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            msg = self.check()
            if msg is None:
                continue
            self.message = msg
            self.fired.set()
            try:
                self.on_stall(msg)
            except Exception:  # never let the watchdog die before it exits
                log.exception("watchdog: on_stall failed")
            if self.hard_exit is not None and not self._stop.wait(self.exit_after_s):
                log.error("watchdog: the job did not exit within %.0fs of the stall; exiting now", self.exit_after_s)
                for h in logging.getLogger().handlers:
                    h.flush()
                self.hard_exit()
            return
