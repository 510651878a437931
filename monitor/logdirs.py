"""Every broker's log dirs as the probe asks them: DescribeLogDirs, one broker at a time.

librdkafka has no DescribeLogDirs; kafka-python 3.x has (``describe_log_dirs``).  Measured on
Kafka 4.1.1 (a broker with two dirs, the second a 4 MiB tmpfs filled by writes): within ~4 s the
broker reports that dir with error code 56 (KAFKA_STORAGE_ERROR), ``usable_bytes`` -1 and no
topics, stays registered, and the replicas it held leave their ISRs (their leadership moves).  So
the partitions an offline dir held come from the last answer in which it was online: the watcher
keeps them (``held``), a bounded number of names per dir.

Each broker is asked on its own (kafka-python asks them in turn and one that does not answer
fails the whole call): a stopped broker costs its own answer only.  A broker that answers with no
dirs at all is not sent: Kafka answers so when the probe's user lacks DESCRIBE on the cluster
(the request's top-level error, which kafka-python does not return); that is said once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from monitor.contract import BrokerLogDirs, LogDir
from monitor.quorum import WatcherThread, admin_kwargs, error_kind, kafka_python_admin, kafka_python_conf

log = logging.getLogger(__name__)

#: partition names kept per dir (the largest first): an alert names them, a count says the rest
MAX_NAMED = 20
#: dirs sent per broker (a JBOD broker has a few)
MAX_DIRS = 64
_ERRORS = {56: "KAFKA_STORAGE_ERROR", 57: "LOG_DIR_NOT_FOUND"}
#: per (broker, dir): what it held when last online (replicas, their bytes, named partitions)
Held = dict[tuple[int, str], tuple[int, Optional[int], list[str]]]


def _size(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and v >= 0 else None


def broker_log_dirs(broker: int, dirs: list[dict], held: Held, interval_ms: int) -> BrokerLogDirs:
    """One broker's ``describe_log_dirs`` answer (kafka-python: per dir error_code, log_dir,
    topics, total_bytes, usable_bytes) as a ``BrokerLogDirs``.  ``held`` (mutated) keeps what each
    dir held when last online, for when it is not."""
    out = []
    for d in dirs[:MAX_DIRS]:
        path, code = str(d["log_dir"]), int(d.get("error_code") or 0)
        key = (broker, path)
        if code == 0:
            sizes = [(p.get("partition_size") or 0, f"{t['name']}-{p['partition_index']}", bool(p.get("is_future_key")))
                     for t in d.get("topics") or [] for p in t.get("partitions") or []]
            current = sorted((s for s in sizes if not s[2]), key=lambda s: (-s[0], s[1]))
            held[key] = (len(current), sum(s[0] for s in current), [s[1] for s in current[:MAX_NAMED]])
            out.append(LogDir(log_dir=path, online=True, total_bytes=_size(d.get("total_bytes")),
                              usable_bytes=_size(d.get("usable_bytes")), held_replicas=held[key][0],
                              held_bytes=held[key][1], held_partitions=held[key][2],
                              moving_replicas=sum(1 for s in sizes if s[2])))
        else:
            n, size, names = held.get(key, (0, None, []))
            out.append(LogDir(log_dir=path, online=False, error=_ERRORS.get(code, f"error {code}"),
                              held_replicas=n, held_bytes=size, held_partitions=names))
    return BrokerLogDirs(broker=broker, interval_ms=interval_ms, dirs=out)


class LogDirWatcher(WatcherThread):
    """DescribeLogDirs of every broker every ``interval_s``, on a thread of its own (a hung or
    failing call costs that thread, never the probe's cycle); ``take()`` hands the newest answers
    over once.  ``admin_factory()`` makes the client (default: kafka-python's
    ``KafkaAdminClient`` from the probe's librdkafka settings); tests pass a fake with
    ``describe_cluster()`` and ``describe_log_dirs(brokers=[id])``."""

    thread_name = "logdirs"

    def __init__(self, conf: dict[str, Any], interval_s: float, timeout_s: float, cluster_name: str = "",
                 admin_factory: Optional[Callable[[], Any]] = None):
        self.interval_s, self.timeout_s, self._name = interval_s, timeout_s, cluster_name
        self._kp_conf = kafka_python_conf(conf, "DescribeLogDirs", "--log-dirs-interval 0")
        if admin_factory is None:
            admin_kwargs(self._kp_conf, timeout_s, "kafka-monitor-logdirs")  # refused at start
        self._factory = admin_factory or (lambda: kafka_python_admin(self._kp_conf, self.timeout_s,
                                                                     "kafka-monitor-logdirs"))
        self._admin: Any = None
        self._held: Held = {}
        self._lock = threading.Lock()
        self._latest: Optional[tuple[int, list[BrokerLogDirs]]] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._said_empty: set[int] = set()
        self.failures = 0
        self.last_error: Optional[str] = None
        #: False once the cluster has said it has no DescribeLogDirs (Tansu): no more asking
        self.available: Optional[bool] = None

    def ask(self, now_ms: int) -> Optional[list[BrokerLogDirs]]:
        """One DescribeLogDirs of each broker; None when the brokers could not be listed (a new
        client next time).  A broker that fails is left out and counted."""
        try:
            if self._admin is None:
                self._admin = self._factory()
            listed = (self._admin.describe_cluster() or {}).get("brokers") or []
            brokers = sorted(int(b["broker_id"]) for b in listed if not b.get("is_fenced"))  # fenced: not serving
        except Exception as e:  # noqa: BLE001 - reported, asked again
            self._failed(e)
            self._close_admin()
            return None
        out, stale = [], False
        for b in brokers:
            try:
                answer = self._admin.describe_log_dirs(brokers=[b])
            except Exception as e:  # noqa: BLE001 - that broker only
                self._failed(e)
                if self.available is False:
                    return None
                # listed by the cluster, unknown to the client: it was down when kafka-python last
                # read the metadata, which it reads again only every 5 minutes: a new client next time
                stale = stale or type(e).__name__ == "UnknownBrokerIdError"
                continue
            dirs = [d for a in answer or [] if int(a.get("broker", b)) == b for d in a.get("log_dirs") or []]
            if not dirs:
                if b not in self._said_empty:
                    self._said_empty.add(b)
                    log.info("broker %d of %s answered DescribeLogDirs with no log dirs: the probe's user may lack "
                             "DESCRIBE on the cluster; its dirs are not watched", b, self._name or "the cluster")
                continue
            self._said_empty.discard(b)
            self.available = True
            out.append(broker_log_dirs(b, dirs, self._held, int(self.interval_s * 1000)))
        if stale:
            self._close_admin()
        with self._lock:
            self._latest = (now_ms, out)
        return out

    def _failed(self, e: BaseException) -> None:
        """Said in the log: the first, 10th, 100th and every 1000th failure; a cluster without the
        request (Tansu, ZooKeeper-era brokers before 1.0) once, and then it is not asked again."""
        self.failures += 1
        self.last_error = f"{type(e).__name__}: {e}"[:1024]
        kind = error_kind(e)
        if kind == "unsupported" and self.available is not True:
            self.available = False
            log.warning("log dirs not available on cluster %s: no DescribeLogDirs (%s); not asked again "
                        "(--log-dirs-interval 0 stops asking)", self._name or "?", e)
        elif self.failures in (1, 10, 100) or self.failures % 1000 == 0:
            hint = "; the probe's user needs DESCRIBE on the cluster" if kind == "permission" else ""
            log.warning("DescribeLogDirs failed on cluster %s (%s, %d so far): %s%s", self._name or "?", kind,
                        self.failures, e, hint)

    def take(self) -> Optional[tuple[int, list[BrokerLogDirs]]]:
        return self._take_latest()

    def _run(self) -> None:
        self._every_interval(lambda: self.ask(int(time.time() * 1000)))

