"""Keep a command running: start it again when it crashes.

``kafka-monitor probe`` runs its probe as a child of itself through :func:`supervise`, because
librdkafka (2.16) can abort or crash the process whose admin client has a group-coordinator
request in flight when the coordinator's broker goes away (assertion ``eonce->refcnt > 0`` or a
segfault, librdkafka issues #3663, #4605, #5040) -- which is exactly when the monitor must keep
watching.  A crash (a signal, or status 1: an unhandled exception) is followed by a restart
after a backoff that doubles from ``BACKOFF_S`` to ``BACKOFF_MAX_S`` and starts over once a
child has run ``HEALTHY_AFTER_S``; any other status (0: stopped; 2: a setting or credentials
refused, which a restart cannot fix) ends supervision with that status.  The child dies with
the supervisor (``setpriv --pdeathsig``), so no probe outlives a killed parent.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from typing import Callable, Optional

from kafka_monitor.local.broker import popen_dying_with_parent, stop_process

log = logging.getLogger(__name__)

#: environment variable set in a supervised child (the child runs the command itself)
CHILD_ENV = "KAFKA_MONITOR_SUPERVISED"
BACKOFF_S = 1.0
BACKOFF_MAX_S = 60.0
HEALTHY_AFTER_S = 300.0
#: statuses after which the command is started again (1: an unhandled exception)
RESTART_STATUSES = (1,)


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"status {rc}"


def supervise(cmd: list[str], stop: threading.Event, *, name: str, env: Optional[dict] = None,
              stop_timeout_s: float = 15.0, on_start: Optional[Callable[[int], None]] = None) -> int:
    """Run ``cmd`` until ``stop`` is set or it exits for good; returns the status to exit with.

    ``stop`` set: the child gets SIGTERM (SIGKILL after ``stop_timeout_s``) and 0 is returned."""
    backoff = BACKOFF_S
    restarts = 0
    while not stop.is_set():
        started = time.monotonic()
        proc = popen_dying_with_parent(cmd, stdin=subprocess.DEVNULL, env=env)
        if on_start is not None:
            on_start(proc.pid)
        log.info("%s running as pid %d%s", name, proc.pid, f" (restart {restarts})" if restarts else "")
        while proc.poll() is None and not stop.wait(0.5):
            pass
        if stop.is_set():
            stop_process(proc, stop_timeout_s)
            return 0
        rc = proc.returncode
        if rc >= 0 and rc not in RESTART_STATUSES:
            if rc:
                log.error("%s (pid %d) exited with %s; not starting it again", name, proc.pid, describe_exit(rc))
            return rc
        if time.monotonic() - started >= HEALTHY_AFTER_S:
            backoff = BACKOFF_S
        restarts += 1
        hint = (" (librdkafka's crash when a group coordinator goes away mid-request, its issue #4605)"
                if rc in (-signal.SIGABRT, -signal.SIGSEGV) else "")
        log.error("%s (pid %d) exited with %s%s; starting it again in %.0f s (restart %d)",
                  name, proc.pid, describe_exit(rc), hint, backoff, restarts)
        stop.wait(backoff)
        backoff = min(BACKOFF_MAX_S, backoff * 2)
    return 0
