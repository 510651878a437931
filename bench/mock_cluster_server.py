"""librdkafka's mock cluster in a process of its own, for benchmarks that must not count the
brokers' CPU as the client's.

    python bench/mock_cluster_server.py --brokers 3 --topic bench-0:100:3 --topic kafka-monitor.events:6:3
    python bench/mock_cluster_server.py --topics bench- 300 100 3     # bench-0 .. bench-299, 100 partitions each

Creates the topics, prints one line ``BOOTSTRAP <host:port,...>`` on stdout, then stays up until
it is killed (SIGTERM/SIGINT) or its stdin is closed (so it goes away with the benchmark that
started it even if that one dies).  The brokers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import signal
import sys
import threading

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.mock_cluster import MockCluster  # noqa: E402


def stop_when_stdin_closes(stop: threading.Event) -> None:
    """Set ``stop`` once standard input closes: the parent went away (SIGKILLed, say)."""
    def watch() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        stop.set()
    threading.Thread(target=watch, daemon=True).start()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--topic", action="append", default=[], metavar="NAME:PARTITIONS:RF",
                    help="a topic to create (repeatable)")
    ap.add_argument("--topics", nargs=4, action="append", default=[], metavar=("PREFIX", "COUNT", "PARTITIONS", "RF"),
                    help="COUNT topics PREFIX0.. with PARTITIONS partitions each (repeatable)")
    ap.add_argument("--no-stdin-watch", action="store_true", help="do not exit when stdin closes")
    args = ap.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    topics = [(name, int(parts), int(rf)) for name, parts, rf in (spec.rsplit(":", 2) for spec in args.topic)]
    topics += [(f"{prefix}{i}", int(parts), int(rf)) for prefix, count, parts, rf in args.topics
               for i in range(int(count))]
    with MockCluster(brokers=args.brokers) as mc:
        # Each creation is a request to the mock's thread, answered at once -- or at its next 1-s
        # poll timeout when that thread misses the wake-up: measured (librdkafka 2.16, 100
        # partitions a topic), none in the first ~1,860 topics, then one every ~4 requests, so
        # 3,000 topics one by one took many minutes.  Requests from many threads wait out one
        # such second together (3,000 topics: 110 s with 16 threads, 25 s with 64).
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            for f in [pool.submit(mc.create_topic, *t) for t in topics]:
                f.result()
        print(f"BOOTSTRAP {mc.bootstrap}", flush=True)
        if not args.no_stdin_watch:
            stop_when_stdin_closes(stop)
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
