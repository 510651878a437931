"""A transactional producer that leaves its transaction open until told (issue 48: hanging
transactions), run as a process of its own so that a test can SIGSTOP and SIGCONT it:

    python -m tests.support.txn_producer --bootstrap HOST:PORT --topic T --transactional-id ID \\
        [--timeout-ms 600000] [--partitions 0,1] [--records 3]

It makes a confluent-kafka Producer with ``transactional.id`` and a long
``transaction.timeout.ms`` (the broker's ``transaction.max.timeout.ms`` is 15 min by default, so at
most 900000), calls init_transactions and begin_transaction, writes ``--records`` records to each
of ``--partitions``, flushes, and prints one line to stdout::

    OPEN {"transactional_id": ..., "topic": ..., "first_offsets": {"T-0": 12, ...},
          "last_offsets": {...}, "records": 6, "timeout_ms": 600000}

(the offsets the brokers gave the records: the first is where the partition's last stable offset
stays while the transaction is open).  Then it reads stdin: a line ``commit`` commits, ``abort``
aborts; it prints ``COMMITTED`` or ``ABORTED`` and exits 0.  End of input aborts too (the test
went away: the transaction would otherwise hold the partitions until its timeout).  Anything
that fails prints ``FAILED <why>`` and exits 1.  librdkafka's own log goes to stderr.

For the tests and bench/txn_bench.py, beside it: ``TxnProcess`` (this script as a child process,
paused, resumed, told to commit, killed), ``PlainWriter`` (non-transactional records that move the
high watermarks on) and ``GroupReader`` (a consumer in a group, read_committed or not, that
commits as it goes).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--transactional-id", required=True)
    ap.add_argument("--timeout-ms", type=int, default=600_000, help="transaction.timeout.ms (default 600000)")
    ap.add_argument("--partitions", default="0", help="comma-separated partitions written to (default 0)")
    ap.add_argument("--records", type=int, default=3, help="records written to each partition (default 3)")
    args = ap.parse_args(argv)

    from confluent_kafka import KafkaException, Producer

    partitions = [int(p) for p in args.partitions.split(",") if p.strip()]
    producer = Producer({"bootstrap.servers": args.bootstrap, "client.id": "txn-producer",
                         "transactional.id": args.transactional_id,
                         "transaction.timeout.ms": args.timeout_ms, "linger.ms": 0, "log_level": 3})
    offsets: dict[str, list[int]] = {}
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            offsets.setdefault(f"{msg.topic()}-{msg.partition()}", []).append(msg.offset())

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    try:
        producer.init_transactions(60)
        producer.begin_transaction()
        for i in range(args.records):
            for p in partitions:
                producer.produce(args.topic, key=f"txn-{p}".encode(), value=f"in transaction, {i}".encode(),
                                 partition=p, on_delivery=delivered)
        left = producer.flush(60)
        if left or errors or sum(len(v) for v in offsets.values()) != args.records * len(partitions):
            raise RuntimeError(f"not all records written: {left} left, errors {errors[:3]}, offsets {offsets}")
        say("OPEN " + json.dumps({
            "transactional_id": args.transactional_id, "topic": args.topic,
            "first_offsets": {tp: min(v) for tp, v in sorted(offsets.items())},
            "last_offsets": {tp: max(v) for tp, v in sorted(offsets.items())},
            "records": args.records * len(partitions), "timeout_ms": args.timeout_ms}))
        for line in sys.stdin:
            word = line.strip().lower()
            if word == "commit":
                producer.commit_transaction(60)
                say("COMMITTED")
                return 0
            if word == "abort":
                break
            if word:
                sys.stderr.write(f"txn_producer: unknown command {word!r} (commit or abort)\n")
        producer.abort_transaction(60)
        say("ABORTED")
        return 0
    except (KafkaException, RuntimeError) as e:
        say(f"FAILED {type(e).__name__}: {e}")
        return 1


class TxnProcess:
    """This script as a child process (``python -m tests.support.txn_producer``), its stdout
    read on a thread; ``kill()`` in a ``finally``: it is never left paused or alive."""

    def __init__(self, bootstrap: str, topic: str, tid: str, partitions: tuple[int, ...], records: int = 3,
                 timeout_ms: int = 600_000):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.txn_producer", "--bootstrap", bootstrap, "--topic", topic,
             "--transactional-id", tid, "--timeout-ms", str(timeout_ms),
             "--partitions", ",".join(map(str, partitions)), "--records", str(records)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
        self.lines: queue.Queue = queue.Queue()
        self.said: list[str] = []
        threading.Thread(target=self._read, name="txn-producer-stdout", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.said.append(line.rstrip())
            self.lines.put(line.rstrip())

    def expect(self, word: str, timeout: float) -> str:
        """The rest of the first line that starts with ``word``; AssertionError on FAILED or
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the transactional producer did not say {word} within {timeout:.0f} s "
                                     f"(said {self.said}, exit {self.proc.poll()})") from None
            if line.startswith(word):
                return line[len(word):].strip()
            assert not line.startswith("FAILED"), line

    def opened(self, timeout: float = 60.0) -> dict:
        """The OPEN line's JSON: the transaction is open and its records written."""
        return json.loads(self.expect("OPEN", timeout))

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def tell(self, word: str) -> None:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def commit(self, timeout: float = 30.0) -> None:
        """Resumed and told to commit; returns once it says COMMITTED and has exited 0."""
        self.resume()
        self.tell("commit")
        self.expect("COMMITTED", timeout)
        assert self.proc.wait(10) == 0, self.proc.returncode

    def kill(self) -> None:
        """SIGCONT and an abort asked for (a second at most), then SIGKILL."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.tell("abort")
                self.proc.wait(1)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class GroupReader(threading.Thread):
    """A consumer of ``topic`` in ``group`` (``isolation``: read_committed or read_uncommitted;
    auto commit every 0.5 s) that polls until stopped, then closes itself; ``read`` counts the
    records it got."""

    def __init__(self, bootstrap: str, topic: str, group: str, isolation: str):
        from confluent_kafka import Consumer

        super().__init__(name=f"reader-{isolation}", daemon=True)
        self.topic, self.read = topic, 0
        self._c = Consumer({"bootstrap.servers": bootstrap, "client.id": f"txn-reader-{isolation}", "group.id": group,
                            "isolation.level": isolation,
                            "auto.offset.reset": "earliest", "enable.auto.commit": True,
                            "auto.commit.interval.ms": 500, "log_level": 3})
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            self._c.subscribe([self.topic])
            while not self._halt.is_set():
                m = self._c.poll(0.2)
                if m is not None and not m.error():
                    self.read += 1
        finally:
            self._c.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class PlainWriter(threading.Thread):
    """Plain (non-transactional, acks=all) records to every partition of ``topic`` every
    ``every`` seconds, and ``n`` more to each on ``burst(n)`` (returns once they are written)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, every: float = 0.5):
        from confluent_kafka import Producer

        super().__init__(name="plain-writer", daemon=True)
        self.topic, self.partitions, self.every = topic, partitions, every
        self._p = Producer({"bootstrap.servers": bootstrap, "client.id": "txn-plain-writer", "acks": "all", "linger.ms": 0,
                            "log_level": 3})
        self._halt = threading.Event()
        self._bursts: queue.Queue = queue.Queue()
        self.written = 0

    def burst(self, n: int, timeout: float = 30.0) -> None:
        done = threading.Event()
        self._bursts.put((n, done))
        assert done.wait(timeout), "the plain burst not written"

    def _write(self, n: int) -> None:
        for _ in range(n):
            for p in range(self.partitions):
                self._p.produce(self.topic, value=b"plain", partition=p)
        self._p.flush(20)
        self.written += n * self.partitions

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                try:
                    n, done = self._bursts.get(timeout=self.every)
                except queue.Empty:
                    self._write(1)
                    continue
                self._write(n)
                done.set()
        finally:
            self._p.flush(10)
            self._p = None  # its connections go now, not when the test's cluster stops

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


if __name__ == "__main__":
    sys.exit(main())
