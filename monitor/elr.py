"""Eligible leader replicas (KIP-966) as the probe asks them: DescribeTopicPartitions.

On a cluster whose ``eligible.leader.replicas.version`` feature is finalized (on by default for
clusters formatted by Kafka 4.1+), a replica that leaves the ISR while the ISR is below
``min.insync.replicas`` stays an *eligible leader replica*: it holds every committed record and may
still be elected without data loss.  The Metadata response librdkafka sends has no ELR; the
DescribeTopicPartitions request (Kafka 3.7+) has, and ``kafka-python`` 3.x sends it.

``ElrWatcher`` asks on a thread of its own:

- a *sweep* every ``interval_s``: the finalized features (is the ELR on?), then every topic's
  partitions, ``page`` partitions a request (the broker's cursor paging).  It keeps only the
  partitions that are not fully in sync or have an ELR or last-known ELR: a healthy cluster's
  answer leaves nothing behind.
- a *look* at named topics as soon as the probe asks (``wake``): the probe's metadata shows an
  ISR the last answer did not, for a partition without a full ISR.  One request for those topics,
  at most every ``min_gap_s``; this is what makes the ELR follow a fault within a refresh or two
  while the sweep's cost is paid once an interval.

``elr_of`` gives a partition's (ELR, last-known ELR) only when the answer's ISR and leader are the
ones the metadata shows (the two requests see the same state); otherwise None ("not known for
this view") and the probe wakes a look.  Where the feature is off, or the cluster has no
DescribeTopicPartitions (Kafka before 3.7, Tansu), that is said once in the log and every
partition's ELR stays None ("not available").
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from monitor.quorum import WatcherThread, admin_kwargs, error_kind, kafka_python_admin, kafka_python_conf

log = logging.getLogger(__name__)

ELR_FEATURE = "eligible.leader.replicas.version"
#: an answer's (ISR, leader, ELR, last-known ELR, offline replicas) for a partition not fully in sync
Entry = tuple[tuple[int, ...], int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]
_EMPTY: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())


class ElrWatcher(WatcherThread):
    """DescribeTopicPartitions sweeps every ``interval_s`` and looks on demand, on a thread.

    ``admin_factory()`` makes the client (default: kafka-python's ``KafkaAdminClient`` from
    ``conf``, the probe's librdkafka settings); tests pass a fake with ``describe_features()``
    and ``describe_topic_partitions(topics, response_partition_limit, cursor)``."""

    thread_name = "elr"

    def __init__(self, conf: dict[str, Any], interval_s: float, timeout_s: float, cluster_name: str = "",
                 watched: Callable[[str], bool] = lambda t: True, page: int = 2000, min_gap_s: float = 1.0,
                 admin_factory: Optional[Callable[[], Any]] = None):
        self.interval_s, self.timeout_s, self.page, self.min_gap_s = interval_s, timeout_s, page, min_gap_s
        self._watched, self._name = watched, cluster_name
        self._kp_conf = kafka_python_conf(conf)
        if admin_factory is None:
            admin_kwargs(self._kp_conf, timeout_s, "kafka-monitor-elr")  # refused at start, not per request
        self._factory = admin_factory or self._kafka_python_admin
        self._admin: Any = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._asked: set[str] = set()  # topics a look is wanted for
        #: wakes so far, and the last wake a finished look or sweep had taken (wait_answer)
        self._wake_seq = self._answered_seq = 0
        self._answered = threading.Condition(self._lock)
        #: True: the feature is finalized; False: off or unsupported; None: not known yet
        self.available: Optional[bool] = None
        self._entries: dict[tuple[str, int], Entry] = {}
        self.said_off = False
        #: the last sweep: partitions kept, requests, topics, seconds, and CPU seconds of the thread that
        #: swept (kafka-python's I/O thread not counted: ~88 % of a sweep's CPU at 100k, bench/elr_bench.py)
        self.last_sweep: Optional[dict[str, float]] = None
        self.sweeps = self.looks = self.failures = 0
        self._in_a_row = 0  # failures since the last answer

    def _kafka_python_admin(self) -> Any:
        return kafka_python_admin(self._kp_conf, self.timeout_s, "kafka-monitor-elr")

    # -- what the probe reads -------------------------------------------------------------------

    def elr_of(self, topic: str, partition: int, leader: int, isr: Any, replicas: Any
               ) -> Optional[tuple[tuple[int, ...], tuple[int, ...]]]:
        """(ELR, last-known ELR) of a partition as the metadata shows it (leader, ISR, replicas),
        or None: the feature is not available, or the last answer saw another ISR or leader."""
        if self.available is not True:
            return None
        if len(isr) == len(replicas):  # every replica in sync: none left to be eligible, whatever an
            return _EMPTY              # older answer (or one from a broker still catching up) says
        e = self._entries.get((topic, partition))
        if e is None:  # the answer saw it fully in sync: not this view
            return None
        if e[1] != leader or set(e[0]) != set(isr):
            return None
        return e[2], e[3]

    def offline_of(self, topic: str, partition: int, leader: int, isr: Any) -> tuple[int, ...]:
        """The replicas the controller has offline (on an offline log dir, or on a stopped broker)
        as the last answer gave them, when it saw this leader and ISR; () otherwise.  The
        Metadata response librdkafka reads has them too but librdkafka drops them."""
        e = self._entries.get((topic, partition)) if self.available is True else None
        if e is None or e[1] != leader or set(e[0]) != set(isr):
            return ()
        return e[4]

    def wake(self, topics: set[str]) -> Optional[int]:
        """Look at ``topics`` again soon: the metadata shows something the last answer did not.
        Returns the wake's number for ``wait_answer`` (None: nothing will be asked)."""
        if not topics or self.available is not True:
            return None
        with self._lock:
            self._asked |= topics
            self._wake_seq += 1
            seq = self._wake_seq
        self._wake.set()
        return seq

    def wait_answer(self, seq: Optional[int], timeout: float) -> bool:
        """Wait at most ``timeout`` s for the look (or sweep) that takes wake ``seq`` to end,
        answered or failed; whether it did."""
        if seq is None:
            return False
        with self._answered:
            return self._answered.wait_for(lambda: self._answered_seq >= seq, timeout)

    def _answered_up_to(self, seq: int) -> None:
        with self._answered:
            self._answered_seq = max(self._answered_seq, seq)
            self._answered.notify_all()

    # -- asking -----------------------------------------------------------------------------------

    def _feature_on(self) -> bool:
        """Whether the ELR feature is finalized at level 1 or more.  kafka-python 3.0.12 answers
        ``{feature: {"supported": (lo, hi), "finalized": (lo, hi), "finalized_epoch": n}}`` (its
        docstring describes another shape, ``finalized_features``: both are read)."""
        feats = self._admin.describe_features() or {}
        if "finalized_features" in feats:
            level = (feats.get("finalized_features") or {}).get(ELR_FEATURE)
        else:
            level = (feats.get(ELR_FEATURE) or {}).get("finalized")
        return level is not None and int(level[1]) >= 1

    def _describe(self, topics: list[str]) -> tuple[dict[tuple[str, int], Entry], int, set[str]]:
        """Every partition of ``topics`` (all topics when empty), paged: the entries of those not fully
        in sync, the number of requests, and the topics answered."""
        entries: dict[tuple[str, int], Entry] = {}
        cursor, requests, seen = None, 0, set()
        while True:
            resp = self._admin.describe_topic_partitions(topics, response_partition_limit=self.page, cursor=cursor)
            requests += 1
            for t in resp.get("topics") or []:
                name = t.get("name")
                if t.get("error_code") or not name or not self._watched(name):
                    continue
                seen.add(name)
                for p in t.get("partitions") or []:
                    if p.get("error_code"):
                        continue
                    isr = tuple(p.get("isr_nodes") or ())
                    elr = tuple(sorted(p.get("eligible_leader_replicas") or ()))
                    lk = tuple(sorted(p.get("last_known_elr") or ()))
                    if elr or lk or len(isr) != len(p.get("replica_nodes") or ()):
                        entries[(name, int(p["partition_index"]))] = (isr, int(p.get("leader_id", -1)), elr, lk,
                                                                      tuple(sorted(p.get("offline_replicas") or ())))
            cursor = resp.get("next_cursor")
            if not cursor or requests >= 100_000:
                return entries, requests, seen

    def sweep(self) -> None:
        """The feature, then every topic: the whole answer replaces the last one."""
        t0, c0 = time.monotonic(), time.thread_time()
        try:
            if self._admin is None:
                self._admin = self._factory()
            on = self._feature_on()
            if not on:
                self._set_off(f"the cluster's {ELR_FEATURE} is not finalized (Kafka before 4.1, or turned off)")
                return
            entries, requests, seen = self._describe([])
        except Exception as e:  # noqa: BLE001 - a failed sweep keeps the last answer
            self._failed(e)
            return
        with self._lock:
            self._entries = entries
            self.available = True
        self.sweeps, self._in_a_row = self.sweeps + 1, 0
        self.last_sweep = {"partitions_listed": float(len(entries)), "requests": float(requests),
                           "topics": float(len(seen)), "seconds": time.monotonic() - t0,
                           "cpu_seconds": time.thread_time() - c0}

    def look(self, topics: set[str]) -> None:
        """One request for ``topics``: their entries replace the last answer's."""
        try:
            if self._admin is None:
                self._admin = self._factory()
            entries, _, seen = self._describe(sorted(topics))
        except Exception as e:  # noqa: BLE001
            self._failed(e)
            return
        with self._lock:
            kept = {k: v for k, v in self._entries.items() if k[0] not in seen}
            kept.update(entries)
            self._entries = kept
        self.looks, self._in_a_row = self.looks + 1, 0

    def _set_off(self, why: str) -> None:
        with self._lock:
            self.available, self._entries = False, {}
        if not self.said_off:
            self.said_off = True
            log.warning("eligible leader replicas not available on cluster %s: %s; partitions are reported "
                        "without them (--elr-interval 0 stops asking)", self._name or "?", why)

    def _failed(self, e: BaseException) -> None:
        self.failures += 1
        self._in_a_row += 1
        kind = error_kind(e)
        # A request that timed out (a paused broker: its connection stays up, nothing answers)
        # keeps the client: kafka-python closes that connection and sends the next request over
        # an idle established one, a live broker's.  A new client would pick a node at random
        # again (seen on 4.4.0: with 2 of 3 brokers paused, 90 s of timeouts and no answer).
        # Anything else, or 3 timeouts in a row, and the next request has a new client.
        if kind != "no_answer" or self._in_a_row >= 3:
            self._close_admin()
        if kind == "unsupported":
            self._set_off(f"no DescribeTopicPartitions ({e})")
        elif self.failures in (1, 10, 100) or self.failures % 1000 == 0:
            log.warning("DescribeTopicPartitions failed (%s, %d so far): %s", kind, self.failures, e)

    # -- the thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        next_sweep = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_sweep:
                with self._lock:
                    seq = self._wake_seq
                self.sweep()
                next_sweep = time.monotonic() + self.interval_s
                with self._lock:
                    if self._wake_seq == seq:
                        self._asked.clear()  # the sweep answered them; not those asked while it ran
                        self._wake.clear()
                self._answered_up_to(seq)
            else:
                with self._lock:
                    asked, self._asked = self._asked, set()
                    seq = self._wake_seq
                    self._wake.clear()
                if asked:
                    self.look(asked)
                    self._answered_up_to(seq)
                    self._stop.wait(self.min_gap_s)
                    continue
            self._wake.wait(max(0.0, next_sweep - time.monotonic()))

    def stop(self, timeout: float = 5.0) -> None:
        self._wake.set()  # out of its wait for a wake or the next sweep
        super().stop(timeout)
