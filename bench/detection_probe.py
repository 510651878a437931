"""The probe as its own process, for ``bench/detection_bench.py``: ``monitor.probe.Probe`` with
the ``ProbeConfig`` given as JSON in argv[1], until SIGTERM.

The bench runs the probe in a child process, as a deployment does (``kafka-monitor probe``),
because librdkafka can take the whole process down (SIGSEGV / SIGABRT in coordinator-targeted
admin requests when a broker stops); the bench's supervisor then records the exit and starts it
again, as systemd or Kubernetes would."""

from __future__ import annotations

import json
import logging
import pathlib
import signal
import sys
import threading

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from monitor.probe import Probe  # noqa: E402
from monitor.probe_config import ProbeConfig  # noqa: E402


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    cfg = ProbeConfig(**json.loads(sys.argv[1]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    probe = Probe(cfg)
    try:
        probe.run(stop)
    finally:
        probe.close(flush_timeout=2)
        print(json.dumps({"cycles": probe.cycles, "warnings": probe.warnings}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
