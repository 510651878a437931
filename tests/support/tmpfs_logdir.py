"""A log dir that fails for real (issue 48): a broker's second log dir on a small tmpfs, filled by
writes until the broker reports it offline (tests/integration/test_logdirs.py, bench/logdir_bench.py).

The tmpfs is mounted on the dir before the cluster is formatted, so the format writes the dir's
``meta.properties`` into it and the broker starts on it as on any dir (the same as stopping the
broker, mounting the tmpfs and copying the dir's contents back, without the broker's restart).
Mounting needs root.  Everything is undone in ``TmpfsCluster.close()``: the cluster stopped by PID,
the tmpfs unmounted (lazily when it is still busy), the work dir removed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

from confluent_kafka import Producer

from kafka_monitor.local.kafka_cluster import KafkaCluster

#: the broker whose second dir is the tmpfs
BROKER = 1
TMPFS_SIZE = "4m"
RECORD = os.urandom(1024)  # ~1 KB, incompressible (and the producer compresses nothing anyway)
_OFFLINE_LOG = re.compile(r"Logs for partitions (\S*) are offline")


def why_not_root() -> Optional[str]:
    return None if os.geteuid() == 0 else "mounts a tmpfs as a broker's log dir: needs root"


def mount_tmpfs(path: Path, size: str = TMPFS_SIZE) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True,
                   capture_output=True, text=True)


def umount(path: Path) -> None:
    """Unmount; lazily (``-l``) when it is still busy; nothing when it is not mounted."""
    if not os.path.ismount(path):
        return
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


class TmpfsCluster:
    """A 1-controller, 3-broker KafkaCluster with two log dirs per broker, broker ``BROKER``'s
    second one a ``size`` tmpfs.  ``start()`` it; ``close()`` in a ``finally`` (safe at any point,
    and more than once)."""

    def __init__(self, size: str = TMPFS_SIZE, **cluster_kwargs):
        self.cluster = KafkaCluster(log_dirs=2, keep_work_dir=True, **cluster_kwargs)
        self.tmpfs = self.cluster.log_dirs_of(BROKER)[1]
        self.size = size

    def mount(self) -> "TmpfsCluster":
        """The tmpfs on the dir, before the cluster starts (when something else starts it)."""
        mount_tmpfs(self.tmpfs, self.size)
        return self

    def start(self) -> "TmpfsCluster":
        self.mount()
        self.cluster.start()
        return self

    def repair(self, timeout: float = 120.0) -> None:
        """The failed dir replaced by an empty one of the same id: the broker stopped, the tmpfs
        mounted again empty but for the dir's ``meta.properties``, the broker started (it fetches
        its replicas there back from their leaders)."""
        meta = (self.tmpfs / "meta.properties").read_bytes()
        self.cluster.stop_broker(BROKER)
        umount(self.tmpfs)
        mount_tmpfs(self.tmpfs, self.size)
        (self.tmpfs / "meta.properties").write_bytes(meta)
        self.cluster.start_broker(BROKER, timeout)

    def close(self) -> None:
        try:
            self.cluster.stop()
        finally:
            umount(self.tmpfs)
            shutil.rmtree(self.cluster.work_dir, ignore_errors=True)

    def partitions_on_tmpfs(self, topic: str) -> set[str]:
        """The topic's replicas (``topic-N``) in the tmpfs dir, from the broker's files."""
        return {p.name for p in self.tmpfs.glob(f"{topic}-*") if p.is_dir()}

    def partitions_on_disk(self, topic: str) -> set[str]:
        return {p.name for p in self.cluster.log_dirs_of(BROKER)[0].glob(f"{topic}-*") if p.is_dir()}

    def placed(self, topic: str, count: int) -> Optional[tuple[set[str], set[str]]]:
        """(on the tmpfs, on the other dir) once the broker holds all ``count`` replicas of the
        topic (a replica's directory appears a moment after the topic is created), else None."""
        tmpfs, disk = self.partitions_on_tmpfs(topic), self.partitions_on_disk(topic)
        return (tmpfs, disk) if len(tmpfs | disk) == count else None

    def offline_logged(self) -> list[str]:
        """The partitions the broker's server.log says are offline ("Logs for partitions ... are offline")."""
        return [p for _, names in self.offline_lines() for p in names]

    def offline_lines(self) -> list[tuple[float, list[str]]]:
        """Each "Logs for partitions ... are offline" line of the broker's server.log: its time
        (epoch seconds, from the line's local-time stamp) and the partitions it names."""
        try:
            text = (self.cluster.node_dir(BROKER) / "server.log").read_text(errors="replace")
        except OSError:
            return []
        out = []
        for m in _OFFLINE_LOG.finditer(text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            stamp = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]", text[line_start:])
            at = (time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000
                  if stamp else float("nan"))
            out.append((at, [p for p in m.group(1).split(",") if p]))
        return out


def fill(bootstrap: str, topic: str, partitions: list[int], done: Callable[[], object], timeout: float = 60.0,
         max_bytes: int = 24 << 20) -> tuple[object, int]:
    """Produce ~1 KB records (acks=1) round-robin to ``partitions`` until ``done()`` returns
    something truthy (returned, with the bytes the brokers acknowledged by then); stop producing
    after ``max_bytes`` and keep polling ``done``.  The producer queues at most 1 MiB ahead.
    AssertionError after ``timeout`` seconds."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "batch.size": 262144,
                  "queue.buffering.max.kbytes": 1024, "compression.type": "none", "message.timeout.ms": 20000,
                  "log_level": 0})
    sent, acked = 0, [0]

    def delivered(err, msg) -> None:
        if err is None:
            acked[0] += len(msg.value())
    deadline = time.monotonic() + timeout
    try:
        while True:
            got = done()
            if got:
                return got, acked[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no offline dir within {timeout:.0f}s of filling ({acked[0]} bytes acknowledged)")
            if sent >= max_bytes:
                p.poll(0.2)
                continue
            for _ in range(64):
                try:
                    p.produce(topic, RECORD, partition=partitions[(sent // len(RECORD)) % len(partitions)],
                              on_delivery=delivered)
                    sent += len(RECORD)
                except BufferError:
                    break
            p.poll(0.01)
    finally:
        p.purge()  # what is still queued for the dir's old leader does not matter
        p.flush(1)
