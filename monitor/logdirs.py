"""Every broker's log dirs as the probe asks them: DescribeLogDirs (issue 48, work in progress:
not wired into the probe yet).

librdkafka has no DescribeLogDirs; kafka-python 3.x has (``describe_log_dirs``).  Measured on
Kafka 4.1.1 (a broker with two dirs, the second a 4 MiB tmpfs filled by writes): within ~4 s the
broker reports that dir with error code 56 (KAFKA_STORAGE_ERROR), ``usable_bytes`` -1 and no
topics, stays registered, and the replicas it held leave their ISRs (their leadership moves).  So
the partitions an offline dir held come from the last answer in which it was online: the watcher
keeps them (``held``), bounded.
"""

from __future__ import annotations

from typing import Any, Optional

from monitor.contract import LogDirState

#: partition names kept per dir (the largest first): an alert names them, a count says the rest
MAX_NAMED = 100
_ERRORS = {56: "KAFKA_STORAGE_ERROR", 57: "LOG_DIR_NOT_FOUND"}


def _size(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and v >= 0 else None


def log_dir_states(answer: list[dict], held: dict[tuple[int, str], tuple[int, Optional[int], list[str]]]
                   ) -> list[LogDirState]:
    """A ``describe_log_dirs()`` answer (kafka-python: per broker its dirs, each with error_code,
    topics, total_bytes, usable_bytes) as one ``LogDirState`` per dir.  ``held`` (mutated): per
    (broker, dir), what it held when last online — (replicas, their bytes, named partitions)."""
    out = []
    for b in answer:
        broker = int(b["broker"])
        for d in b.get("log_dirs") or []:
            path, code = d["log_dir"], int(d.get("error_code") or 0)
            key = (broker, path)
            if code == 0:
                sizes = [(p.get("partition_size") or 0, f"{t['name']}-{p['partition_index']}", bool(p.get("is_future_key")))
                         for t in d.get("topics") or [] for p in t.get("partitions") or []]
                current = [s for s in sizes if not s[2]]
                current.sort(key=lambda s: (-s[0], s[1]))
                held[key] = (len(current), sum(s[0] for s in current), [s[1] for s in current[:MAX_NAMED]])
                out.append(LogDirState(broker=broker, log_dir=path, online=True, total_bytes=_size(d.get("total_bytes")),
                                       usable_bytes=_size(d.get("usable_bytes")), held_replicas=held[key][0],
                                       held_bytes=held[key][1], held_partitions=held[key][2],
                                       moving_replicas=sum(1 for s in sizes if s[2])))
            else:
                n, size, names = held.get(key, (0, None, []))
                out.append(LogDirState(broker=broker, log_dir=path, online=False, error=_ERRORS.get(code, f"error {code}"),
                                       held_replicas=n, held_bytes=size, held_partitions=names))
    return out
