"""The cluster's open transactions as the probe asks them: ListTransactions of each broker,
DescribeTransactions of the open ones, DescribeProducers of their partitions (KIP-664).

An open transaction pins the last stable offset (LSO) of every partition it has written to:
read_committed consumers stop there while the high watermark moves on.  Its coordinator aborts
it after its ``transaction.timeout.ms``; one that outlives it, or a producer whose transaction a
partition's leader holds open without its coordinator knowing of it, is a hanging transaction.

librdkafka has no ListTransactions; kafka-python 3.x has (``list_transactions``,
``describe_transactions``, ``describe_producers``).  What its source (3.0.12) does, and what this
watcher does about it:

- ``list_transactions`` asks the brokers in turn and one that fails fails the whole call: each
  broker is asked on its own (``broker_ids=[b]``), with the open states as filter; a broker that
  fails is named in ``unlisted_brokers``.  Kafka lists only the transactional ids the user may
  DESCRIBE, silently: without that ACL the list is empty, not refused.
- ``describe_transactions`` and ``describe_producers`` raise on the first per-id or per-partition
  error code, losing the rest of the answer: a chunk that fails so is split in halves until the
  one at fault is alone (a bounded number of calls a round).  A transaction whose description
  fails is still sent with what ListTransactions said (``described`` false).
- kafka-python keeps each transactional id's coordinator for the client's life: after a
  NOT_COORDINATOR (or any failure that smells of a moved leader or a broker gone) the next round
  makes a new client.
- ``describe_producers`` finds the leaders through a metadata request of its own: a topic the
  user may not DESCRIBE, or one deleted since, comes back as UnknownTopicOrPartitionError.

The ages are the coordinator's start time read against the probe's clock when the descriptions
came back.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from typing import Any, Callable, Iterable, Optional

from monitor.contract import HeldPartition, OpenTransaction, OpenTransactions
from monitor.quorum import WatcherThread, admin_kwargs, error_kind, kafka_python_admin, kafka_python_conf

log = logging.getLogger(__name__)

#: the states of a transaction that holds its partitions' LSO (ListTransactions' filter)
OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")
#: transactions described (and sent) per round, the oldest first
MAX_TRANSACTIONS = 1000
#: partition names sent per transaction (its count says the rest)
MAX_NAMES = 100
#: partitions asked with DescribeProducers per round (those of the oldest transactions first),
#: and held partitions sent
MAX_PRODUCER_PARTITIONS = 1000
MAX_HELD = 1000
#: ids per DescribeTransactions, partitions per DescribeProducers
CHUNK = 100
#: calls a round may spend splitting failed chunks to find the id or partition at fault
SPLIT_CALLS = 50
#: the event's data is cut (the newest transactions first) to stay under this; the job refuses
#: a record over its max_event_bytes (64 KiB)
MAX_DATA_BYTES = 60_000
#: errors after which the client's cached coordinators or leaders may be wrong: a new client
_STALE = frozenset({"NotCoordinatorError", "CoordinatorNotAvailableError", "CoordinatorLoadInProgressError",
                    "NotLeaderOrFollowerError", "LeaderNotAvailableError", "UnknownBrokerIdError",
                    "UnknownTopicOrPartitionError"})
#: a transactional id its coordinator no longer has (expired since it was listed): not open
_GONE = "TransactionalIdNotFoundError"


def _state(v: Any) -> str:
    """kafka-python's TransactionState (a str Enum) or a plain string, as the wire's name."""
    return str(getattr(v, "value", v))


def _name(tp: Any) -> str:
    return f"{tp[0]}-{tp[1]}"


def _size(obj: Any) -> int:
    return len(json.dumps(dataclasses.asdict(obj), separators=(",", ":"), ensure_ascii=False).encode("utf-8")) + 1


def open_transactions(listed: dict[str, tuple[int, int, str]], described: dict[str, Any], now_ms: int
                      ) -> list[OpenTransaction]:
    """The open transactions, the oldest first (those not described last, by producer id).

    ``listed``: transactional id -> (coordinator, producer id, state) from ListTransactions;
    ``described``: id -> kafka-python's ``TransactionDescription`` for those described.  One
    whose description says it is no longer open (it ended since it was listed) is left out."""
    return [t for _, t in _ordered(listed, described, now_ms)]


def _ordered(listed: dict[str, tuple[int, int, str]], described: dict[str, Any], now_ms: int
             ) -> list[tuple[str, OpenTransaction]]:
    """``open_transactions`` with each one's whole transactional id (the event's is cut)."""
    out: list[tuple[tuple, str, OpenTransaction]] = []
    for tid, (coordinator, pid, state) in listed.items():
        d = described.get(tid)
        if d is None:
            out.append(((1, 0, pid, tid), tid, OpenTransaction(transactional_id=tid[:1024], producer_id=pid, state=state,
                                                          coordinator=coordinator, described=False)))
            continue
        state = _state(d.state)
        if state not in OPEN_STATES:
            continue
        start = d.transaction_start_time_ms if isinstance(d.transaction_start_time_ms, int) else -1
        parts = sorted((tp[0], tp[1]) for tp in d.topic_partitions or ())
        timeout = d.transaction_timeout_ms if isinstance(d.transaction_timeout_ms, int) and \
            d.transaction_timeout_ms >= 0 else None
        out.append(((0 if start >= 0 else 1, start, d.producer_id, tid), tid, OpenTransaction(
            transactional_id=tid[:1024], producer_id=int(d.producer_id), state=state,
            coordinator=int(d.coordinator_id), producer_epoch=int(d.producer_epoch),
            started_ms_ago=max(0, now_ms - start) if start >= 0 else None, timeout_ms=timeout,
            partitions=[_name(tp) for tp in parts[:MAX_NAMES]], partitions_count=len(parts))))
    out.sort(key=lambda x: x[0])
    return [(tid, t) for _, tid, t in out]


def held_partitions(asked: Iterable[tuple[str, int]], answers: dict[Any, Any]) -> list[HeldPartition]:
    """The producers with a transaction open on each partition asked (in the order asked), from
    kafka-python's ``describe_producers`` answer (TopicPartition -> PartitionProducerState);
    a producer without one (current_transaction_start_offset -1) is left out."""
    by_tp = {(tp[0], tp[1]): v for tp, v in answers.items()}
    out = []
    for tp in asked:
        state = by_tp.get(tp)
        for p in getattr(state, "active_producers", None) or ():
            first = p.current_transaction_start_offset
            if isinstance(first, int) and first >= 0:
                out.append(HeldPartition(topic=tp[0], partition=tp[1], producer_id=int(p.producer_id),
                                         producer_epoch=int(p.producer_epoch), first_offset=first))
    return out


def with_offsets(event: OpenTransactions, offsets: dict[tuple[str, int], tuple]) -> OpenTransactions:
    """The event with each held partition's LSO and HW from the probe's latest observation of
    its offsets (``(topic, partition) -> (log start, HW, LSO)``); unwatched ones stay null."""
    if not event.held_partitions or not offsets:
        return event
    held = []
    for h in event.held_partitions:
        o = offsets.get((h.topic, h.partition))
        held.append(h if o is None else dataclasses.replace(h, high_watermark=o[1], last_stable_offset=o[2]))
    return fit(dataclasses.replace(event, held_partitions=held))  # the offsets add ~40 bytes a partition


def fit(event: OpenTransactions, budget: int = MAX_DATA_BYTES) -> OpenTransactions:
    """The event with its lists cut at their tail (the newest) so that its data stays within
    ``budget`` bytes; the held partitions get at most a third of the room the transactions leave."""
    txns, held = event.transactions[:MAX_TRANSACTIONS], event.held_partitions[:MAX_HELD]
    room = budget - _size(dataclasses.replace(event, transactions=[], held_partitions=[]))
    t_sizes, h_sizes = [_size(t) for t in txns], [_size(h) for h in held]
    held_room = min(sum(h_sizes), max(0, room) // 3)

    def prefix(sizes: list[int], limit: int) -> int:
        n = used = 0
        for s in sizes:
            if used + s > limit:
                break
            used, n = used + s, n + 1
        return n
    n_t = prefix(t_sizes, room - held_room)
    n_h = prefix(h_sizes, room - sum(t_sizes[:n_t]))
    if n_t == len(event.transactions) and n_h == len(event.held_partitions):
        return event
    return dataclasses.replace(event, transactions=txns[:n_t], held_partitions=held[:n_h])


class TransactionWatcher(WatcherThread):
    """ListTransactions of each broker, DescribeTransactions of the open ones and
    DescribeProducers of their partitions every ``interval_s``, on a thread of its own (a hung
    or failing call costs that thread, never the probe's cycle); ``take()`` hands the newest
    answer over once.  ``admin_factory()`` makes the client (default: kafka-python's
    ``KafkaAdminClient`` from the probe's librdkafka settings); tests pass a fake with
    ``describe_cluster()``, ``list_transactions(broker_ids=, state_filters=)``,
    ``describe_transactions(ids)`` and ``describe_producers(partitions)``."""

    thread_name = "transactions"

    def __init__(self, conf: dict[str, Any], interval_s: float, timeout_s: float, cluster_name: str = "",
                 admin_factory: Optional[Callable[[], Any]] = None, clock: Callable[[], float] = time.time,
                 held_back: Callable[[], Iterable[tuple[str, int]]] = tuple):
        self.interval_s, self.timeout_s, self._name, self._clock = interval_s, timeout_s, cluster_name, clock
        #: the watched partitions whose last stable offset is below their HW (the probe's last observation)
        self.held_back = held_back
        self._kp_conf = kafka_python_conf(conf, "ListTransactions, DescribeTransactions and DescribeProducers",
                                          "--transactions-interval 0")
        if admin_factory is None:
            admin_kwargs(self._kp_conf, timeout_s, "kafka-monitor-transactions")  # refused at start
        self._factory = admin_factory or (lambda: kafka_python_admin(self._kp_conf, self.timeout_s,
                                                                     "kafka-monitor-transactions"))
        self._admin: Any = None
        self._renew = False
        #: transactional id -> its start (epoch ms) when last described open: described first next round
        self._started: dict[str, int] = {}
        self._lock = threading.Lock()
        self._latest: Optional[tuple[int, OpenTransactions]] = None
        #: (topic, partition) -> first offset -> (transactional id or None, producer id): the open
        #: transactions of the last answer that listed any, by the partitions they hold (``holder``)
        self._holders: dict[tuple[str, int], dict[int, tuple[Optional[str], int]]] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.failures = 0
        self.last_error: Optional[str] = None
        self.permission_said = False
        #: False once the cluster has said it has no ListTransactions (Tansu, Kafka before 3.0): no more asking
        self.available: Optional[bool] = None

    # -- one round ---------------------------------------------------------------------------

    def ask(self) -> Optional[tuple[int, OpenTransactions]]:
        """One round; the answer stamped with the time the descriptions came back, or None when
        the cluster has no ListTransactions (said once, not asked again)."""
        interval_ms = int(self.interval_s * 1000)
        try:
            if self._admin is None:
                self._admin = self._factory()
            listed_brokers = (self._admin.describe_cluster() or {}).get("brokers") or []
            brokers = sorted(int(b["broker_id"]) for b in listed_brokers if not b.get("is_fenced"))
        except Exception as e:  # noqa: BLE001 - reported, asked again
            return self._refused(e, interval_ms, "DescribeCluster")
        listed: dict[str, tuple[int, int, str]] = {}
        unlisted, last_error = [], None
        for b in brokers:
            try:
                answer = self._admin.list_transactions(broker_ids=[b], state_filters=list(OPEN_STATES))
            except Exception as e:  # noqa: BLE001 - that broker only
                if error_kind(e) == "unsupported" and self.available is not True:
                    return self._refused(e, interval_ms, "ListTransactions")
                self._failed(e, "ListTransactions")
                unlisted.append(b)
                last_error = e
                continue
            for coordinator, rows in (answer or {}).items():
                for tid, pid, state in rows or ():
                    if _state(state) in OPEN_STATES:
                        listed.setdefault(str(tid), (int(coordinator), int(pid), _state(state)))
        if brokers and len(unlisted) == len(brokers) and last_error is not None:
            return self._refused(last_error, interval_ms, "ListTransactions", counted=True)
        self.available = True
        # the ones already seen open, the oldest first, then the rest by producer id
        order = sorted(listed, key=lambda t: (0, self._started[t], t) if t in self._started
                       else (1, listed[t][1], t))
        described, gone = self._chunked(self._describe, order[:MAX_TRANSACTIONS], "DescribeTransactions")
        for tid in gone:
            listed.pop(tid, None)
        now_ms = int(self._clock() * 1000)
        ordered = _ordered(listed, described, now_ms)
        txns = [t for _, t in ordered]
        self._started = {tid: now_ms - t.started_ms_ago for tid, t in ordered if t.started_ms_ago is not None}
        partitions: list[tuple[str, int]] = []
        seen: set[tuple[str, int]] = set()
        for tid in (tid for tid, t in ordered if t.described):
            for tp in sorted((tp[0], tp[1]) for tp in described[tid].topic_partitions or ()):
                if tp not in seen:
                    seen.add(tp)
                    partitions.append(tp)
        # then the watched partitions whose LSO lags their HW that no listed transaction writes to:
        # a producer there is unknown to its coordinator (KIP-664's hanging transaction), or its
        # transactional id is one the probe may not DESCRIBE
        partitions += sorted(tp for tp in self.held_back() if tp not in seen)
        asked = partitions[:MAX_PRODUCER_PARTITIONS]
        answers, _ = self._chunked(self._producers, asked, "DescribeProducers")
        held = held_partitions(asked, answers)
        tid_of = {pid: tid for tid, (_, pid, _) in listed.items()}
        holders: dict[tuple[str, int], dict[int, tuple[Optional[str], int]]] = {}
        for h in held:
            holders.setdefault((h.topic, h.partition), {})[h.first_offset] = (tid_of.get(h.producer_id),
                                                                               h.producer_id)
        self._holders = holders
        answered = {(tp[0], tp[1]) for tp in answers}
        event = fit(OpenTransactions(
            ok=True, interval_ms=interval_ms, transactions=txns, transactions_count=len(txns),
            held_partitions=held, held_partitions_count=len(held),
            unasked_partitions=len(partitions) - sum(1 for tp in asked if tp in answered),
            unlisted_brokers=unlisted))
        if self._renew:
            self._close_admin()
        with self._lock:
            self._latest = (now_ms, event)
        return now_ms, event

    def _describe(self, ids: list) -> dict:
        return dict(self._admin.describe_transactions(ids) or {})

    def _producers(self, tps: list) -> dict:
        from kafka.structs import TopicPartition

        return dict(self._admin.describe_producers([TopicPartition(t, p) for t, p in tps]) or {})

    def _chunked(self, call: Callable[[list], dict], items: list, what: str) -> tuple[dict, list]:
        """``call`` on chunks of ``items``; a chunk that fails with a broker's answer (not for
        want of one) is split in halves, within SPLIT_CALLS a round, until the item at fault is
        alone; it is left out.  After a call that found no broker the rest is not asked this
        round.  Returns the answers and the transactional ids found gone."""
        out: dict = {}
        gone: list = []
        budget = [SPLIT_CALLS]
        stop = [False]

        def go(part: list) -> None:
            if stop[0]:
                return
            try:
                out.update(call(part))
            except Exception as e:  # noqa: BLE001 - that part only
                kind = error_kind(e)
                if len(part) == 1 and type(e).__name__ == _GONE:
                    gone.extend(part)
                    return
                if len(part) > 1 and kind in ("error", "permission") and budget[0] >= 2:
                    budget[0] -= 2
                    go(part[:len(part) // 2])
                    go(part[len(part) // 2:])
                    return
                self._failed(e, what)
                stop[0] = kind == "no_answer"
        for i in range(0, len(items), CHUNK):
            go(items[i:i + CHUNK])
        return out, gone

    # -- failures ----------------------------------------------------------------------------

    def _refused(self, e: BaseException, interval_ms: int, what: str,
                 counted: bool = False) -> Optional[tuple[int, OpenTransactions]]:
        """Nothing listed: an ok=False answer (None, and no more asking, when unsupported)."""
        if not counted:
            self._failed(e, what)
        self._close_admin()
        if self.available is False:
            return None
        now_ms = int(self._clock() * 1000)
        event = OpenTransactions(ok=False, interval_ms=interval_ms, error=f"{type(e).__name__}: {e}"[:1024],
                                 error_kind=error_kind(e))
        with self._lock:
            self._latest = (now_ms, event)
        return now_ms, event

    def _failed(self, e: BaseException, what: str) -> None:
        """Said in the log: the first, 10th, 100th and every 1000th failure; a cluster without
        ListTransactions (Tansu, Kafka before 3.0) once, and then it is not asked again; a refusal
        once, with the ACLs that are missing."""
        self.failures += 1
        self.last_error = f"{what}: {type(e).__name__}: {e}"[:1024]
        kind = error_kind(e)
        if kind == "no_answer" or type(e).__name__ in _STALE:
            self._renew = True
        if kind == "unsupported" and what in ("ListTransactions", "DescribeCluster") and self.available is not True:
            self.available = False
            log.warning("transactions not watched on cluster %s: no %s (%s); not asked again "
                        "(--transactions-interval 0 stops asking)", self._name or "?", what, e)
        elif kind == "permission" and not self.permission_said:
            self.permission_said = True
            log.warning("%s refused on cluster %s (%s): the probe's user needs DESCRIBE on the transactional ids "
                        "(ListTransactions lists only those, DescribeTransactions) and READ on their topics "
                        "(DescribeProducers)", what, self._name or "?", e)
        elif self.failures in (1, 10, 100) or self.failures % 1000 == 0:
            hint = ("; a topic the probe's user may not DESCRIBE reads so too" if what == "DescribeProducers"
                    and type(e).__name__ == "UnknownTopicOrPartitionError" else "")
            log.warning("%s failed on cluster %s (%s, %d so far): %s%s", what, self._name or "?", kind,
                        self.failures, e, hint)

    def _close_admin(self) -> None:
        self._renew = False
        super()._close_admin()

    # -- the thread --------------------------------------------------------------------------

    def holder(self, topic: str, partition: int, offset: int) -> Optional[tuple[Optional[str], int]]:
        """The open transaction (transactional id, None when not listed; producer id) whose first
        record on the partition is at ``offset`` in the last answer that listed transactions."""
        by_offset = self._holders.get((topic, partition))
        return None if by_offset is None else by_offset.get(offset)

    def take(self) -> Optional[tuple[int, OpenTransactions]]:
        """The newest answer not handed over yet (epoch ms, event)."""
        return self._take_latest()

    def _run(self) -> None:
        self._every_interval(self._round)

    def _round(self) -> None:
        try:
            self.ask()
        except Exception as e:  # noqa: BLE001 - a bug here must not end the thread silently
            log.exception("transactions round failed on cluster %s: %s", self._name or "?", e)
            self._close_admin()
