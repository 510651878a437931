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


class LogDirWatcher:
    """DescribeLogDirs of every broker every ``interval_s``, on a thread of its own (a hung or
    failing call costs that thread, never the probe's cycle); ``take()`` hands the newest answer
    over once, as ``LogDirState`` rows.  ``admin_factory()`` makes the client (default:
    kafka-python's ``KafkaAdminClient`` from the probe's librdkafka settings)."""

    def __init__(self, conf: dict[str, Any], interval_s: float, timeout_s: float,
                 admin_factory: Optional[Any] = None):
        import threading

        from monitor.quorum import admin_kwargs, kafka_python_conf

        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._kp_conf = kafka_python_conf(conf)
        if admin_factory is None:
            admin_kwargs(self._kp_conf, timeout_s, "kafka-monitor-logdirs")  # refused at start
        self._factory = admin_factory or self._kafka_python_admin
        self._admin: Any = None
        self._held: dict[tuple[int, str], tuple[int, Optional[int], list[str]]] = {}
        self._lock = threading.Lock()
        self._latest: Optional[tuple[int, list[LogDirState]]] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.failures = 0
        self.last_error: Optional[str] = None

    def _kafka_python_admin(self) -> Any:
        import logging

        from kafka import KafkaAdminClient

        from monitor.quorum import admin_kwargs

        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        return KafkaAdminClient(**admin_kwargs(self._kp_conf, self.timeout_s, "kafka-monitor-logdirs"))

    def ask(self, now_ms: int) -> Optional[list[LogDirState]]:
        """One DescribeLogDirs of every broker; None when it failed (a new client next time)."""
        try:
            if self._admin is None:
                self._admin = self._factory()
            states = log_dir_states(self._admin.describe_log_dirs(), self._held)
        except Exception as e:  # noqa: BLE001 - reported, asked again
            self.failures += 1
            self.last_error = f"{type(e).__name__}: {e}"[:1024]
            admin, self._admin = self._admin, None
            if admin is not None:
                try:
                    admin.close()
                except Exception:  # noqa: BLE001
                    pass
            return None
        with self._lock:
            self._latest = (now_ms, states)
        return states

    def take(self) -> Optional[tuple[int, list[LogDirState]]]:
        with self._lock:
            latest, self._latest = self._latest, None
        return latest

    def _run(self) -> None:
        import time

        while not self._stop.is_set():
            started = time.monotonic()
            self.ask(int(time.time() * 1000))
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> "LogDirWatcher":
        import threading

        self._thread = threading.Thread(target=self._run, name="logdirs", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        admin, self._admin = self._admin, None
        if admin is not None:
            try:
                admin.close()
            except Exception:  # noqa: BLE001
                pass
